#!/usr/bin/env bash
# TriMul kernels on the lent H200 (issue 21), in one call: the evaluator's verdicts and scores for
# SOLUTIONS side by side (SETS; --isolation require), a per-kernel profile of PROFILE, then (unless
# SWEEP=0) a coordinate sweep of PROFILE's tunables (SWEEP_GROUPS) and, with EVAL_BEST=1, the
# evaluator's verdict on the sweep's best beside SOLUTIONS (PROFILE_BEST=1: its per-kernel
# profile). Results land in $OUT as one tarball.
# Needs the ray+pydantic bundle carried: .gpubundle/site.tar.xz.
#   SOLUTIONS=triton_fused,triton_seed,baseline SETS=tests:fresh,tests:reuse,benchmarks:fresh \
#   bash experiments/gpu/h200_trimul_kernels.sh
set -uo pipefail
mkdir -p /tmp/site && tar xJf .gpubundle/site.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=/tmp/trimul-kernels; mkdir -p "$OUT" "$R"
SOLUTIONS=${SOLUTIONS:-triton_fused,triton_seed,baseline}
SETS=${SETS:-tests:fresh,tests:reuse,benchmarks:fresh}
PROFILE=${PROFILE:-triton_fused}
S=experiments/trimul_kernels.py
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  echo "sources $(bash experiments/gpu/source_hash.sh) (experiments/gpu/source_hash.sh)"; date -u; } > "$R/gpu.txt" 2>&1
cat "$R/gpu.txt"
if [ "${EVAL:-1}" = 1 ]; then
  ( time timeout "${EVAL_S:-240}" python3 $S eval --solutions "$SOLUTIONS" --sets "$SETS" --out "$R/eval.json" ) 2>&1 | tee "$R/eval.log" | grep -v "^ *$"
fi
timeout 90 python3 $S profile --solution "$PROFILE" --out "$R/profile.json" 2>&1 | tee "$R/profile.log"
if [ "${SWEEP:-1}" = 1 ]; then
  # SWEEP_GROUPS: the sweep's groups, separated by "|" (each group: "NAME=v1,v2;NAME=v1,v2").
  SWEEP_GROUPS=${SWEEP_GROUPS:-"LN_BLOCK_M=4,8,16;LN_WARPS=4,8|PROJ_BLOCK_M=64,128;PROJ_BLOCK_H=64,128;PROJ_BLOCK_K=32,64,128|PROJ_WARPS=4,8;PROJ_STAGES=2,3,4|BLOCK_M=64,128;BLOCK_N=64,128,256;BLOCK_K=32,64|NUM_WARPS=4,8;NUM_STAGES=3,4,5|OUT_BLOCK_M=32,64,128;OUT_BLOCK_D=64,128;OUT_WARPS=4,8"}
  args=(); IFS='|' read -ra parts <<< "$SWEEP_GROUPS"; for g in "${parts[@]}"; do args+=(--group "$g"); done
  timeout "${SWEEP_S:-300}" python3 $S sweep --solution "$PROFILE" --out "$R/sweep.json" --best-out "$R/best.py" "${args[@]}" 2>&1 | tee "$R/sweep.log"
fi
if [ "${PROFILE_BEST:-0}" = 1 ] && [ -f "$R/best.py" ]; then  # the sweep's best, kernel by kernel
  timeout 90 python3 $S profile --solution "$R/best.py" --out "$R/profile_best.json" 2>&1 | tee "$R/profile_best.log"
fi
if [ "${EVAL_BEST:-0}" = 1 ] && [ -f "$R/best.py" ]; then  # the sweep's best, judged beside SOLUTIONS
  ( time timeout "${EVAL_S:-240}" python3 $S eval --solutions "$R/best.py,$SOLUTIONS" --sets "$SETS" --out "$R/eval_best.json" ) 2>&1 | tee "$R/eval_best.log" | grep -v "^ *$"
fi
tar czf "$OUT/trimul-kernels.tgz" -C /tmp trimul-kernels
