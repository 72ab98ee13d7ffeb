#!/usr/bin/env bash
# Foundation measurements on the lent H200 (device tool, kind nvidia-h200):
# evaluator tests incl. the GPU-only integrity check, TriMul baseline and Triton seed in both
# timing modes side by side, and the sandbox's per-candidate overhead.
set -euo pipefail
mkdir -p /tmp/site && tar xJf .gpubundle/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
export RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
python3 -m pytest tests/test_evaluator.py -q 2>&1 | tail -40 > "$OUT/pytest_evaluator.txt" || true; tail -3 "$OUT/pytest_evaluator.txt"
K="python3 -m ksearch_ray"
for sol in baseline triton_seed; do
  $K eval --task trimul $sol --workloads tests --json > "$OUT/${sol}_tests.json" || true
done
$K eval --task trimul triton_seed --mode fresh --baseline --json > "$OUT/seed_fresh.json" || true
$K eval --task trimul triton_seed --mode reuse --baseline --json > "$OUT/seed_reuse.json" || true
python3 experiments/sandbox_overhead.py --device cuda --n 20 | tee "$OUT/overhead.json"
python3 experiments/summarize_eval.py "$OUT"/*.json | tee "$OUT/summary.txt"
