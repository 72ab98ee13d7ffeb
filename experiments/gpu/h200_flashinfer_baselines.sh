#!/usr/bin/env bash
# Kernel against kernel on the lent H200 (issue 19), in one call of under 9 minutes: FlashInfer's
# library baselines (kernel alone, and plan plus kernel) for the three attention tasks under the
# sandbox with isolation required, every seed against both, and the destination-passing CUDA
# solution in FlashInfer-Bench's format. See experiments/flashinfer_baselines.py for what it runs.
# Carry the bundles site, flashinfer and cutlass-headers (BUNDLES: where they are; default .gpubundle).
#   bash experiments/gpu/h200_flashinfer_baselines.sh
set -uo pipefail
START=$(date +%s)
BUNDLES=${BUNDLES:-.gpubundle}
mkdir -p /tmp/site
for b in site flashinfer cutlass-headers; do tar xJf "$BUNDLES/$b.tar.xz" -C /tmp/site & done; wait
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# One JIT cache for the warm-up and every sandboxed worker (outside the carried copy, which the next
# call replaces). The sandbox mounts it read-only; each worker mirrors it into a workspace of its own.
export FLASHINFER_WORKSPACE_BASE=/tmp/ficache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; cat GITREV 2>/dev/null || echo "sources $(bash experiments/gpu/source_hash.sh)"; which ninja nvcc; ninja --version
  python3 -c "import flashinfer, torch, triton; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
echo "unpacked in $(( $(date +%s) - START )) s"
python3 experiments/flashinfer_baselines.py --out /tmp/fi_results/results --deadline $(( START + ${BUDGET_S:-500} )) 2>&1 \
  | tee "$OUT/baselines.log"
# What FlashInfer left in the shared cache (a worker that wrote there would have failed: read-only).
find /tmp/ficache -maxdepth 5 -type d -name cached_ops -exec ls {} \; > "$OUT/ficache_modules.txt" 2>&1
tar czf "$OUT/results.tgz" -C /tmp/fi_results results  # JSON of every evaluation and the warm-up logs
echo "total $(( $(date +%s) - START )) s"
