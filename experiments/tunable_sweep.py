"""Coordinate descent over groups of a solution's tunables, for the kernel experiment scripts
(trimul_kernels.py, decode_kernels.py): each group ("NAME=v1,v2;NAME=v1,v2") is swept as the product
of its choices, starting from the best values so far, and its best combination is kept for the next
group. The caller's `measure` times one combination (None when it fails or is wrong: skipped)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from ksearch_ray.taskspec.tunables import value_from_text


def coordinate_sweep(groups: list[str], start: dict[str, Any], measure: Callable[[dict[str, Any]], float | None],
                     *, deadline: float = math.inf, skip_best: bool = False, digits: int = 4,
                     start_note: str = "") -> dict[str, Any]:
    """{start_ms, best, best_ms, log}. `deadline` (epoch seconds): no combination is started within
    20 s of it. `skip_best`: a combination equal to the best so far is not measured again."""
    best = dict(start)
    base = best_ms = measure(best)
    print(f"start {best}: {base} ms{start_note}", flush=True)
    log: list[dict[str, Any]] = [{"values": dict(best), "ms": base}]
    for group in groups:
        axes = [(k, [value_from_text(v) for v in vs.split(",")])
                for k, vs in (part.split("=") for part in group.split(";"))]
        scored = [(best_ms, best)] if best_ms is not None else []
        for combo in itertools.product(*[vs for _, vs in axes]):
            if time.time() > deadline - 20:
                print("sweep stopped: no time left", flush=True)
                break
            values = {**best, **{k: v for (k, _), v in zip(axes, combo, strict=True)}}
            if skip_best and values == best and best_ms is not None:
                continue
            ms = measure(values)
            log.append({"values": values, "ms": ms})
            if ms is not None:
                scored.append((ms, values))
                print(f"  {dict(zip([k for k, _ in axes], combo, strict=True))}: {ms:.{digits}f} ms", flush=True)
        if scored:  # the best so far stays unless a combination beats it
            best_ms, best = min(scored, key=lambda s: s[0])
            print(f"best after {group}: {best_ms:.{digits}f} ms {best}", flush=True)
    return {"start_ms": base, "best": best, "best_ms": best_ms, "log": log}
