#!/usr/bin/env bash
# Decode kernels' host work per call on the H200 (issue 45): each task's kernel against FlashInfer's,
# host microseconds, call figure and a cProfile, side by side in one process per task; then, if
# TESTS is set, those pytest files. Outputs under $OUT (tarred by the caller's command).
#   SITE=.gpubundle_s FI=.gpubundle_f SOLUTIONS=triton_splitkv,flashinfer_kernel bash experiments/gpu/h200_decode_host.sh
set -uo pipefail
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p /tmp/site && for b in "${SITE:-.gpubundle_s}"/*.tar.xz "${FI:-.gpubundle_f}"/*.tar.xz; do tar xJf "$b" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
git log -1 --format='%H %s' 2>/dev/null | tee "$OUT/commit.txt"
for task in ${TASKS:-gqa mla_decode}; do
  date -u +"%H:%M:%S start $task" | tee -a "$OUT/times.txt"
  timeout "${HOST_S:-200}" python3 experiments/decode_kernels.py --task "$task" host \
    --solutions "${SOLUTIONS:-triton_splitkv,flashinfer_kernel}" --workloads "${SET:-feedback}" \
    --out "$OUT/host_$task.json" 2>&1 | grep -v Warning | tee "$OUT/host_$task.log"
done
if [ -n "${TESTS:-}" ]; then
  date -u +"%H:%M:%S start tests" | tee -a "$OUT/times.txt"
  ( time timeout "${TESTS_S:-300}" python3 -m pytest -q -rfE -p no:cacheprovider -m gpu $TESTS ) > "$OUT/tests.log" 2>&1
  tail -15 "$OUT/tests.log"
fi
date -u +"%H:%M:%S end" | tee -a "$OUT/times.txt"
