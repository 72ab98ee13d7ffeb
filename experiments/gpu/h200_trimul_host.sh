#!/usr/bin/env bash
# Issue 44 on the lent H200, in one call: the host work per TriMul call of SOLUTIONS side by side
# (experiments/trimul_kernels.py host: host µs per call, the call as GPUMode times it, a cProfile),
# then the evaluator's verdicts with both figures (kernel: graph replay; call) for EVAL_SOLUTIONS
# on SETS under --isolation require. Carry .gpubundle_s/site.tar.xz (ray+pydantic) and, for
# K-Search's published kernel, .external/ksearch_best.py. Results land in $OUT as one tarball.
#   bash experiments/gpu/h200_trimul_host.sh
set -uo pipefail
mkdir -p /tmp/site && tar xJf "${BUNDLES:-.gpubundle_s}/site.tar.xz" -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=/tmp/trimul-host; mkdir -p "$OUT" "$R"
SOLUTIONS=${SOLUTIONS:-triton_fused,triton_fused:DIRECT_LAUNCH=false}
EVAL_SOLUTIONS=${EVAL_SOLUTIONS:-triton_fused}
SETS=${SETS:-tests:fresh,benchmarks:fresh}
S=experiments/trimul_kernels.py
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  echo "sources $(bash experiments/gpu/source_hash.sh) (experiments/gpu/source_hash.sh)"; date -u; } > "$R/gpu.txt" 2>&1
cat "$R/gpu.txt"
timeout "${HOST_S:-150}" python3 $S host --solutions "$SOLUTIONS" --out "$R/host.json" 2>&1 | tee "$R/host.log"
if [ "${EVAL:-1}" = 1 ]; then
  ( time timeout "${EVAL_S:-300}" python3 $S eval --solutions "$EVAL_SOLUTIONS" --sets "$SETS" --isolation "${ISOLATION:-require}" --out "$R/eval.json" ) 2>&1 \
    | tee "$R/eval.log" | grep -v "^ *$"
fi
tar czf "$OUT/trimul-host.tgz" -C /tmp trimul-host
