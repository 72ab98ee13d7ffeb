#!/usr/bin/env bash
# Issue 39 on the lent H200, in one call: the GPU tests of both figures (reproduction of a
# GPUMode-style loop, bounded worker memory, hostile kernels under both objectives), then every
# default seed under both objectives against its comparison and the MLA prefill `all` command with
# the worker's peak GPU memory (experiments/two_timings.py). Carry the bundles as for
# h200_flashinfer_baselines.sh, and .external/ksearch_best.py (K-Search's published TriMul kernel).
#   bash experiments/gpu/h200_two_timings.sh
set -uo pipefail
START=$(date +%s)
BUNDLES=${BUNDLES:-.gpubundle}
mkdir -p /tmp/site
for b in site flashinfer cutlass-headers; do [ -f "$BUNDLES/$b.tar.xz" ] && tar xJf "$BUNDLES/$b.tar.xz" -C /tmp/site & done; wait
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export FLASHINFER_WORKSPACE_BASE=/tmp/ficache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; cat GITREV 2>/dev/null || echo "sources $(bash experiments/gpu/source_hash.sh)"; } 2>&1 | tee "$OUT/machine.txt"
python3 -m pytest -q -m gpu tests/test_two_timings_gpu.py tests/test_sandbox_gpu.py -x -s -p no:cacheprovider 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -40
python3 experiments/two_timings.py --out "$OUT/two_timings" --ksearch-best .external/ksearch_best.py 2>&1 \
  | tee "$OUT/two_timings.log"
echo "total $(( $(date +%s) - START )) s"
