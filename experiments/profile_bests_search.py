"""A search with --profile-bests against the LLM stand-in, keeping the prompts it was sent.

    python experiments/profile_bests_search.py --run-dir /tmp/run --out out/ -- --task trimul --rounds 4 ...

Starts the stand-in (policies/standin) in this process on a free loopback port, runs `ksearch run
--model hosted_vllm/standin --api-base ... --profile-bests --no-progress ARGS` as a subprocess, then
writes every prompt the stand-in got (`prompts.jsonl`: call kind and text), the run's output, and a
summary of its profiles (seconds each) to --out. The run directory stays where --run-dir says.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from ksearch_ray.events import Profile, ProfilerNote
from ksearch_ray.policies.standin.server import StandIn
from ksearch_ray.store import RunStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: more `ksearch run` options")
    opts = parser.parse_args()
    extra = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    opts.out.mkdir(parents=True, exist_ok=True)
    with_standin = StandIn(0).start()
    command = [sys.executable, "-m", "ksearch_ray", "run", "--model", "hosted_vllm/standin", "--api-base",
               with_standin.api_base, "--profile-bests", "--no-progress", "--run-dir", str(opts.run_dir), *extra]
    t0 = time.monotonic()
    with open(opts.out / "run.out", "w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    with_standin.stop()
    with open(opts.out / "prompts.jsonl", "w") as f:
        for exchange in with_standin.exchanges:
            text = exchange.prompt
            kind = next((line[6:].strip() for line in text.splitlines() if line.startswith("Call: ")), "?")
            f.write(json.dumps({"kind": kind, "status": exchange.status, "prompt": text}) + "\n")
    events = RunStore.open(opts.run_dir).read_events()
    notes = [e.model_dump(mode="json") for e in events if isinstance(e, ProfilerNote)]
    profiles = [{"seq": e.seq, "solution_id": e.solution_id, "status": e.result.status, "seconds": round(e.result.seconds, 2),
                 "workload": e.result.workload, "kernels": e.result.kernel_count, "message": e.result.message}
                for e in events if isinstance(e, Profile)]
    with_profile = sum("# Profile (Nsight Compute)" in json.loads(line)["prompt"]
                       for line in (opts.out / "prompts.jsonl").read_text().splitlines())
    summary = {"exit": code, "wall_s": round(wall, 1), "profiler": notes, "profiles": profiles,
               "prompts": len(with_standin.exchanges), "prompts_with_a_profile": with_profile}
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
