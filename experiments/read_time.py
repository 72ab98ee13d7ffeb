"""How long `ksearch show` and `ksearch report` take on run directories, each in a fresh process as a user runs
them (interpreter start and imports included), the best of --repeat; wall and CPU seconds side by side.

    python experiments/wm_soak.py --width 1024 --rounds 10000 --out /tmp/soak   # a 10,000-round run
    python experiments/read_time.py /tmp/soak/w1024
    PYTHONPATH=<checkout> python experiments/read_time.py DIR    # that checkout's code

CPU seconds are the child's own (user + system), so a busy machine inflates the wall figure more than them.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], cwd: str) -> tuple[float, float]:
    """(wall s, CPU s) of one child process, run in `cwd` (not a checkout: `-m` would import the code there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import ksearch_ray  # as the children will find it: PYTHONPATH, then the installed package

    load = os.getloadavg()[0]
    print(f"machine: {platform.node()} ({os.cpu_count()} CPUs, load {load:.1f}), Python {platform.python_version()}, "
          f"ksearch_ray from {Path(ksearch_ray.__file__).parent}")
    print("| run | events | show wall s | show CPU s | report wall s | report CPU s |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for run in (p.resolve() for p in args.run_dirs):
            events = sum(1 for _ in (run / "events.jsonl").open("rb"))
            best: dict[str, tuple[float, float]] = {}
            for _ in range(args.repeat):
                for command, extra in (("show", []), ("report", ["--out", str(Path(tmp) / "r.html")])):
                    wall, cpu = timed([sys.executable, "-m", "ksearch_ray", command, str(run), *extra], tmp)
                    old = best.get(command)
                    best[command] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
            print(f"| {run} | {events} | {best['show'][0]:.2f} | {best['show'][1]:.2f} | {best['report'][0]:.2f} | "
                  f"{best['report'][1]:.2f} |")


if __name__ == "__main__":
    main()
