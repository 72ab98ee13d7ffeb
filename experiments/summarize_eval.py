"""Print a compact table from `ksearch eval --json` outputs (files given on the command line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(name: str, payload: dict) -> list[str]:
    res = payload["result"]
    base = payload.get("baseline")
    base_by = {w["workload"]: w for w in base["workloads"]} if base else {}
    out = [f"== {name}: {res['solution_name']} {res['workload_set']} mode={res['mode']} status={res['status']} "
           f"on {res['device_name']} {res['message']}"]
    if base:
        out.append(f"  against {base['solution_name']}: status={base['status']} {base['message']}".rstrip())
    for w in res["workloads"]:
        t = w.get("timing")
        line = f"  {w['workload']:<36} {w['status']:<20} max_abs_err={w.get('max_abs_error') or 0:.2e}"
        if t:
            line += f" mean={t['mean_ms']:.4f} median={t['median_ms']:.4f} min={t['min_ms']:.4f} n={t['count']}"
            b = base_by.get(w["workload"])
            if b and b.get("timing"):
                line += f" | baseline mean={b['timing']['mean_ms']:.4f} ratio={b['timing']['mean_ms'] / t['mean_ms']:.3f}x"
        out.append(line)
    if res.get("score"):
        out.append(f"  score {res['score']:.4f} ({res['score_kind']})" + (f", baseline {base['score']:.4f}, speedup {payload['speedup']:.3f}x" if base and payload.get("speedup") else ""))
    out.append(f"  evaluation {res['seconds']:.1f} s, sandbox overhead {res['overhead_seconds']:.2f} s")
    return out


def main() -> None:
    for arg in sys.argv[1:]:
        try:
            payload = json.loads(Path(arg).read_text())
        except (OSError, ValueError):
            continue
        if "result" in payload:
            print("\n".join(rows(Path(arg).stem, payload)))


if __name__ == "__main__":
    main()
