"""Issue 42's simulation as a tool: a search at a width on a simulated Ray cluster of GPUs against a simulated,
rate-limited LLM provider (`ksearch_ray.distributed.simcluster` says what is simulated and what is the product's).

    python experiments/sim_cluster.py --width 16 256 1024 --gpus 128 --nodes 4 --rounds 10000
    python experiments/sim_cluster.py --width 64 --gpus 8 --nodes 2 --rounds 200 --time-factor 0.05

Each width is one run, in a process of its own (its own cluster; max RSS is that run's), its run directory under
--out. Printed per width, as a Markdown row (times in simulated seconds: wall seconds / --time-factor):

    busy        evaluators' share of time measuring, once warmed up (from one longest LLM reply after the first
                round to the last round handed out), sampled every simulated second
    candidates / tuning / idle tuning
                what the evaluators' measured seconds went to, over the whole run: the coder's candidates,
                --autotune's variants, and idle tuning's (--tune-when-idle)
    slots       the width's share at work in that window: coder calls in flight, and candidates with the evaluators
                (waiting for one, or measured), over the width
    cycles      action cycles running, mean in that window and peak
    rounds/s    rounds over the simulated wall time (set-up included)
    driver CPU  the driver process's CPU seconds over its wall seconds (the world-model actor is a process of its
                own: not included)
    RSS         the driver's peak resident memory
    KB/round    the run directory over the rounds
    requests, 429s  what the provider received and refused

With --plot FILE, a PNG of the busy share and the slots at work over time, one line per width (matplotlib).
Every simulated duration scales with --time-factor; on a loaded machine a small factor makes the driver's own
work (not scaled) weigh more than it would.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

ROW = ("| {width} | {gpus} on {nodes} nodes | {rounds} | {busy} | {split} | {slots} | {mean_cycles} / {peak_cycles} | "
       "{rounds_per_sim_s:.2f} | {driver_cpu} | {max_rss_mb:.0f} MB | {run_dir_kb_per_round:.1f} | "
       "{provider_requests} | {provider_429s} | {end} |")


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, nargs="+", default=[1024])
    parser.add_argument("--gpus", type=int, default=128)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--time-factor", type=float, default=1.0, help="scales every simulated duration")
    parser.add_argument("--rpm", type=int, default=3_000, help="the provider's requests per minute")
    parser.add_argument("--tpm", type=int, default=20_000_000, help="the provider's tokens per minute")
    parser.add_argument("--learn-limits", action="store_true", help="do not tell the run the limits: it learns them")
    parser.add_argument("--sequential", action="store_true",
                        help="search.ksearch.max_parallel_attempts 1: every cycle one attempt at a time (before)")
    parser.add_argument("--policy-actors", type=int, default=4)
    parser.add_argument("--autotune", type=int, default=0, help="search.autotune_variants: tuner evaluations per passed candidate")
    parser.add_argument("--tune-when-idle", action="store_true",
                        help="search.tune_when_idle: evaluators that would idle tune the fastest passed candidates")
    parser.add_argument("--repeated-code", action="store_true",
                        help="the stand-in's own changes only (it may write a file again) instead of a file of its own each reply")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("gpus", "nodes", "rounds", "rpm", "tpm", "policy_actors"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.width) < 1:
        parser.error("--width must be at least 1")
    if args.nodes > args.gpus:
        parser.error(f"--nodes {args.nodes} is more than --gpus {args.gpus}: every worker node holds a GPU")
    if args.autotune < 0:
        parser.error("--autotune must be 0 or more")
    if not args.time_factor > 0:
        parser.error("--time-factor must be more than 0")
    out = args.out or Path(tempfile.mkdtemp(prefix="sim_cluster-"))
    if args.one is not None:
        from ksearch_ray.distributed.simcluster import EvalLatency, SimSettings, simulate

        settings = SimSettings(width=args.one, gpus=args.gpus, nodes=args.nodes, rounds=args.rounds,
                               time_factor=args.time_factor, requests_per_min=args.rpm, tokens_per_min=args.tpm,
                               tell_limits=not args.learn_limits, policy_actors=args.policy_actors,
                               max_parallel_attempts=1 if args.sequential else None,
                               distinct_code=not args.repeated_code, autotune_variants=args.autotune,
                               tune_when_idle=args.tune_when_idle,
                               eval_latency=EvalLatency(time_factor=args.time_factor))
        print(json.dumps(simulate(settings, out / f"w{args.one}")))
        return
    print(f"machine: {platform.node()} ({os.cpu_count()} CPUs); run directories under {out}")
    print(f"{args.gpus} simulated GPUs on {args.nodes} nodes, {args.rounds} rounds, time factor {args.time_factor:g}, "
          f"provider {args.rpm} requests and {args.tpm} tokens a minute"
          + (" (learnt)" if args.learn_limits else " (told)") + (", sequential cycles" if args.sequential else "")
          + (", the stand-in's code may repeat" if args.repeated_code else ", a file of its own each reply")
          + (f", {args.autotune} tuner evaluations per passed candidate" if args.autotune else "")
          + (", idle evaluators tune" if args.tune_when_idle else ""))
    print("| width | GPUs | rounds | busy | candidates / tuning / idle tuning | slots | cycles mean / peak | rounds/s | "
          "driver CPU | RSS | KB/round | requests | 429s | end |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    series = {}
    for width in args.width:
        cmd = [sys.executable, __file__, "--one", str(width)] + _without_widths(sys.argv[1:])
        child = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        if child.returncode != 0:
            sys.exit(f"width {width} failed:\n{child.stderr[-3000:]}")
        figures = json.loads(child.stdout.strip().splitlines()[-1])
        series[width] = figures.pop("samples")
        split = " / ".join(pct(figures["measured_shares"].get(k)) for k in ("candidates", "tuning", "idle tuning"))
        print(ROW.format(**figures, busy=pct(figures["busy_share"]), slots=pct(figures["slot_share"]), split=split,
                         mean_cycles=f"{figures['mean_cycles_warm'] or 0:.0f}", driver_cpu=pct(figures["driver_cpu_share"])),
              flush=True)
    if args.plot:
        plot(series, args.gpus, args.plot)


def _without_widths(argv: list[str]) -> list[str]:
    kept, skipping = [], False
    for arg in argv:
        if arg == "--width":
            skipping = True
            continue
        if skipping and not arg.startswith("--"):
            continue
        skipping = False
        kept.append(arg)
    return kept


def plot(series: dict[int, list[dict[str, float]]], gpus: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (busy, slots) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for width, samples in series.items():
        t = [x["t"] for x in samples]
        busy.plot(t, [x["evaluators_busy"] / gpus for x in samples], label=f"width {width}")
        slots.plot(t, [min(x["attempts"], width) / width for x in samples], label=f"width {width}")
    busy.set_ylabel("evaluators busy")
    slots.set_ylabel("width at work")
    slots.set_xlabel("simulated seconds")
    busy.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
