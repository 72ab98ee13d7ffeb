"""A search against a loopback server of each HTTP habit (issue 38), one after another, and a table of what each did.

One stand-in (`ksearch_ray.policies.standin`, following every format: the habits measured here are the wire's)
answers the prompts; in front of it, one `standin.wire.WireHabitServer` per habit changes only how the answer
travels (a plain JSON body whatever `stream` asks, an event stream without `[DONE]`, a 200 whose body is an
error, ...). Each habit gets `python -m ksearch_ray run --task TASK --model hosted_vllm/standin --api-base
http://127.0.0.1:PORT/v1 --width W --rounds R --max-wall-s S` in a subprocess, on one Ray cluster this script
starts once and every run attaches to (`--no-ray`: each run in its own process instead), without the final re-timing or profiles (`--confirm-repeats 0
--no-profile-bests`: the wall budget goes to the search). It writes, under --out:
`llm_habits.md` (a row per habit: rounds, evaluations, passed, exit status, the output's key lines), the same as
`llm_habits.json`, and each run's stdout, stderr and run directory.

On the H200 (the lead's call; ray, pydantic, litellm and tenacity on PYTHONPATH; nothing is installed):
    python experiments/llm_habits.py --out "$OUT"       # TriMul, width 4, Ray, 8 habits, 45 s each: ~8 min
On the CPU (reduced workloads, Triton's interpreter):
    python experiments/llm_habits.py --device cpu --workloads smoke --rounds 3 --max-wall-s 240 --habits ignores_stream
    python experiments/llm_habits.py --task toy_axpy --task-dir tests/data --device cpu --width 2 --rounds 3 \
        --max-wall-s 120                                  # every habit, quickly
A habit "works" when its row shows evaluations > 0 and exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ksearch_ray.events import RunView  # noqa: E402  (the repository on the path first)
from ksearch_ray.policies.standin.habits import Habits  # noqa: E402
from ksearch_ray.policies.standin.server import StandIn  # noqa: E402
from ksearch_ray.policies.standin.wire import HABITS, WireHabitServer  # noqa: E402
from ksearch_ray.store import RunStore  # noqa: E402

QUIET = Habits(other_shape=0, prose_only=0, broken_json=0, coder_prose_only=0, code_drift=0, broken_code=0,
               breakage_actions=0, risky_changes=0, missing_fields=0, rate_limit_every=0)
"""The stand-in as a model that follows every format: what each row shows is the wire habit's doing."""
KEY_MARKS = ("no candidate evaluated", "does not stream", "the LLM provider is failing", "could not be read",
             "refuses", "error:")


def key_lines(stdout: str, stderr: str) -> list[str]:
    """The outcome's first line, then the output's lines that say what happened on the LLM path (each kind once)."""
    first = stdout.strip().splitlines()[0].strip()[:200] if stdout.strip() else "(no outcome on stdout)"
    said: list[str] = [first]
    for line in stderr.splitlines():
        text = (line.split("] ", 1)[-1] if line.startswith("[") else line).strip()[:200]
        mark = next((m for m in KEY_MARKS if m in text), None)
        if mark is not None and not any(mark in s for s in said[1:]):
            said.append(text)
    return said[:5]


def run_one(habit: str, standin: StandIn, args: argparse.Namespace, ray_address: str | None) -> dict[str, object]:
    out = Path(args.out) / habit
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    with WireHabitServer(standin.api_base, habit) as server:
        command = [sys.executable, "-m", "ksearch_ray", "run", "--task", args.task, "--model", "hosted_vllm/standin",
                   "--api-base", server.api_base, "--width", str(args.width), "--rounds", str(args.rounds),
                   "--max-wall-s", str(args.max_wall_s), "--outage-s", str(args.outage_s), "--no-progress",
                   "--run-dir", str(run_dir), "--confirm-repeats", "0", "--no-profile-bests"]
        command += ["--task-dir", str(Path(args.task_dir).resolve())] if args.task_dir else []
        command += ["--device", args.device] if args.device else []
        command += ["--workloads", args.workloads] if args.workloads else []
        command += ["--ray-address", ray_address] if ray_address else [] if args.ray else ["--no-ray"]
        command += args.extra
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=args.max_wall_s + 240,
                                  env=os.environ | {"PYTHONPATH": os.pathsep.join(
                                      p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)})
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code = -1
            stdout = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
            stderr = exc.stderr if isinstance(exc.stderr, str) else (exc.stderr or b"").decode(errors="replace")
        wall = time.monotonic() - started
        requests = len(server.requests)
    (out / "stdout.txt").write_text(stdout)
    (out / "stderr.txt").write_text(stderr)
    row: dict[str, object] = {"habit": habit, "exit": code, "wall_s": round(wall, 1), "requests": requests,
                              "rounds": 0, "evaluations": 0, "passed": 0, "llm_calls": 0, "failed_calls": 0,
                              "no_stream": None, "key": key_lines(stdout, stderr)}
    if (run_dir / "manifest.json").exists():
        view = RunView.of(RunStore.open(run_dir).read_events())
        row.update(rounds=view.rounds_used, evaluations=view.evaluations,
                   passed=view.status_counts().get("PASSED", 0), llm_calls=len(view.llm_calls),
                   failed_calls=view.llm_failed_calls, no_stream=view.no_stream)
    return row


def table(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    head = (f"# LLM habits: {args.task}, width {args.width}, {'Ray' if args.ray else 'no Ray'}, rounds {args.rounds}, "
            f"max wall {args.max_wall_s} s, device {args.device or 'default'}, workloads {args.workloads or 'default'}\n\n"
            "| habit | rounds | evaluations | passed | exit | wall s | LLM calls (failed) | HTTP requests | "
            "the output's key lines |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['habit']} | {r['rounds']} | {r['evaluations']} | {r['passed']} | {r['exit']} | {r['wall_s']} | "
        f"{r['llm_calls']} ({r['failed_calls']}) | {r['requests']} | "
        f"{'<br>'.join(str(k).replace('|', '/') for k in r['key'])} |\n"  # type: ignore[attr-defined]
        for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--habits", default=",".join(HABITS), help=f"Comma-separated, of: {', '.join(HABITS)}.")
    parser.add_argument("--task", default="trimul")
    parser.add_argument("--task-dir", default=None, help="A folder of tasks besides the bundled ones (tests/data: toy_axpy).")
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-wall-s", type=float, default=45.0, help="Each run's wall budget (its set-up included).")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="No habit is started after this many seconds from the start (the device call's limit).")
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: ksearch's choice).")
    parser.add_argument("--workloads", default=None, help="A workload set, e.g. smoke.")
    parser.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True,
                        help="One Ray cluster for all the runs (default), or --no-ray: each run in its own process.")
    parser.add_argument("--out", default=os.environ.get("OUT") or "/tmp/llm-habits")
    parser.add_argument("extra", nargs="*", help="More `ksearch run` options, after --.")
    args = parser.parse_args()
    habits = [h.strip() for h in args.habits.split(",") if h.strip()]
    unknown = [h for h in habits if h not in HABITS]
    if unknown:
        parser.error(f"unknown habit(s) {', '.join(unknown)}: of {', '.join(HABITS)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    ray_address = None
    if args.ray:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        context = ray.init(address="local", include_dashboard=False, log_to_driver=False)
        ray_address = context.address_info["gcs_address"]
        print(f"one Ray cluster for every run: {ray_address} ({ray.cluster_resources()})", flush=True)
    rows = []
    try:
        with StandIn(habits=QUIET) as standin:
            for habit in habits:
                if time.monotonic() - began > args.budget_s:
                    print(f"{habit}: not run (--budget-s {args.budget_s:g} spent)", flush=True)
                    continue
                row = run_one(habit, standin, args, ray_address)
                rows.append(row)
                print(f"{habit}: rounds {row['rounds']}, evaluations {row['evaluations']}, passed {row['passed']}, "
                      f"exit {row['exit']}, {row['wall_s']} s; {' / '.join(map(str, row['key']))}",  # type: ignore[call-overload]
                      flush=True)
                (Path(args.out) / "llm_habits.md").write_text(table(rows, args))
                (Path(args.out) / "llm_habits.json").write_text(json.dumps(rows, indent=1))
    finally:
        if args.ray:
            import ray

            ray.shutdown()
    print(table(rows, args))
    return 0 if all(r["evaluations"] and r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
