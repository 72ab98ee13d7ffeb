#!/usr/bin/env bash
# The FlashInfer library baselines on the lent H200, in two back-to-back calls of the device tool
# (the MoE module's JIT build, hundreds of CUTLASS instantiations, outlasts one 10-minute call;
# its partial build survives in .ficache/ while the machine stays warm, and ninja resumes it).
#   phase a: start the MoE build in the background; build the attention modules; measure the
#            attention tasks' flashinfer baselines against the reference and the seeds.
#   phase b: resume the MoE build while every tunable choice of the Triton seeds runs on the GPU;
#            then measure the MoE baseline.
# Usage: bash experiments/h200_flashinfer_lib.sh a|b   (carry .gpubundle with site and flashinfer)
set -uo pipefail
PHASE=${1:?phase a or b}
START=$(date +%s)
left() { echo $(( ${2:-560} - ($(date +%s) - START) )); }
mkdir -p /tmp/site && for b in .gpubundle/site.tar.xz .gpubundle/flashinfer.tar.xz; do tar xJf $b -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRTLLM_DG_CACHE_DIR=$PWD/.ficache/deep_gemm
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/raw
date -u; nvidia-smi -L; python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)"
K="python3 -m ksearch_ray eval"
ev() {  # ev NAME TASK CANDIDATE AGAINST SET [extra args]: one side-by-side evaluation, if time is left
  local name=$1 task=$2 cand=$3 against=$4 set=$5; shift 5
  local t; t=$(left x "${EV_END:-520}"); [ "$t" -lt 40 ] && { echo "$name skipped: no time left"; return; }
  [ "$t" -gt 200 ] && t=200
  timeout "$t" $K --task "$task" "$cand" --against "$against" --workloads "$set" --json "$@" \
    > "/tmp/raw/$name.json" 2> "/tmp/raw/$name.err"
  echo "$name rc=$? $(date -u +%T)"
}
moe_build() {  # the MoE module, built by its first call, at low priority beside the other work
  MAX_JOBS=14 nice -n 10 python3 experiments/flashinfer_warmup.py moe >> "$OUT/moe_build.log" 2>&1 &
  echo $! > /tmp/moe_build.pid
}
moe_wait() {  # wait for the MoE build until $1 seconds into the call; report what ninja has done
  local pid; pid=$(cat /tmp/moe_build.pid)
  while kill -0 "$pid" 2>/dev/null && [ "$(left x "$1")" -gt 0 ]; do sleep 5; done
  if kill -0 "$pid" 2>/dev/null; then pkill -INT -x ninja; sleep 5; kill "$pid" 2>/dev/null; echo "moe build: not finished, stopped"; fi
  echo "moe build objects so far: $(find .ficache -name '*.o' 2>/dev/null | wc -l)"; tail -3 "$OUT/moe_build.log"
}
GQA=gqa_paged_decode_h32_kv4_d128_ps1; MLAD=mla_paged_decode_h16_ckv512_kpe64_ps1
MLAP=mla_paged_prefill_causal_h16_ckv512_kpe64_ps1; MOE=moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048
if [ "$PHASE" = a ]; then
  moe_build
  python3 experiments/flashinfer_warmup.py gqa mla_decode mla_prefill 2>&1 | grep -v Warning | tail -8
  sed 's/^USE_TENSOR_CORES = True/USE_TENSOR_CORES = False/' tasks/flashinfer/$GQA/solutions/flashinfer/main.py \
    > /tmp/flashinfer_cuda_cores.py
  ev gqa_cudacores_vs_fi_feedback $GQA /tmp/flashinfer_cuda_cores.py flashinfer feedback
  for T in $GQA $MLAD $MLAP; do
    S=${T%%_paged*}_$(echo $T | cut -d_ -f3)
    ev ${S}_fi_vs_ref_feedback $T flashinfer reference feedback
    ev ${S}_seed_vs_fi_feedback $T triton_seed flashinfer feedback
  done
  ev gqa_cute_vs_fi_feedback $GQA cuda_cute flashinfer feedback
  for T in $GQA $MLAD $MLAP; do
    S=${T%%_paged*}_$(echo $T | cut -d_ -f3)
    ev ${S}_seed_vs_fi_all $T triton_seed flashinfer all --max-calls 10
  done
  moe_wait 575
else
  moe_build
  timeout "$(left x 300)" python3 -m pytest tests/test_flashinfer_tasks.py -m gpu -k tunable -q -p no:cacheprovider 2>&1 | tail -15
  moe_wait 330
  EV_END=585
  ev moe_fi_vs_ref_feedback $MOE flashinfer reference feedback
  ev moe_seed_vs_fi_feedback $MOE triton_seed flashinfer feedback
fi
python3 experiments/summarize_eval.py /tmp/raw/*.json > "$OUT/summary_$PHASE.txt" 2>&1
cat "$OUT/summary_$PHASE.txt" | head -80
for f in /tmp/raw/*.err; do [ -s "$f" ] && { echo "== $f"; tail -3 "$f"; }; done
tar czf "$OUT/raw_$PHASE.tgz" -C /tmp/raw .
