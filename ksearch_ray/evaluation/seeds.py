"""Seeds for input generation.

Every evaluation mixes the workload's published seed with a secret drawn once per run (kept in
the run directory, RunStore.seed_secret, and given to every evaluator of the run when it is made;
an evaluator made on its own, as `ksearch eval` makes one, draws its own), so a candidate that
recognises published inputs (and returns cached answers) gains nothing: the inputs it sees are new
every run, and the same on every evaluator of a run, so their figures compare. Per-call seeds in `fresh` timing derive from a
workload's base seed and the call index, so the evaluator can regenerate any call's inputs.
"""

from __future__ import annotations

import hashlib
import secrets

_MASK = (1 << 63) - 1


def new_secret() -> int:
    return secrets.randbits(63)


def derive_seed(secret: int, workload_name: str, workload_seed: int | None, purpose: str) -> int:
    text = f"{secret}:{workload_name}:{workload_seed}:{purpose}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & _MASK


def call_seed(base: int, index: int) -> int:
    if index == 0:
        return base
    return int.from_bytes(hashlib.sha256(f"{base}:{index}".encode()).digest()[:8], "big") & _MASK
