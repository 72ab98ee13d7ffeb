#!/usr/bin/env bash
# The FlashInfer library baselines on the lent H200 (carry .gpubundle: site, flashinfer, cutlass).
#   attention: build the three attention modules (experiments/flashinfer_warmup.py), then measure
#              each attention task's `flashinfer` solution against the reference, and the seeds
#              against it, side by side (`ksearch eval --against`).
#   tunables:  every tunable choice of the Triton seeds on the GPU (pass/fail).
#   moe:       build the Hopper fused-MoE module, then measure the MoE baseline. The build is
#              ~245 CUTLASS compilation units; it did not fit in one 10-minute call (see
#              docs/benchmarks.md), so it resumes from .ficache/ while the machine stays warm.
# Nothing else may run beside `attention`: the baselines plan on the host every call, so a busy
# CPU slows them (seen: a compile beside them inverted the tensor-core comparison below).
# Usage: bash experiments/gpu/h200_flashinfer_lib.sh attention|tunables|moe
set -uo pipefail
PHASE=${1:?attention, tunables or moe}
START=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - START) )); }
mkdir -p /tmp/site && for b in .gpubundle/*.tar.xz; do tar xJf $b -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# One JIT cache for the warm-up and every sandboxed worker (the sandbox passes these through).
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRTLLM_DG_CACHE_DIR=$PWD/.ficache/deep_gemm
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/raw
date -u; nvidia-smi -L; python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)"
ev() {  # ev NAME TASK CANDIDATE AGAINST SET [extra args]: one side-by-side evaluation, if time is left
  local name=$1 task=$2 cand=$3 against=$4 set=$5; shift 5
  local t; t=$(left 560); [ "$t" -lt 40 ] && { echo "$name skipped: no time left"; return; }
  [ "$t" -gt 200 ] && t=200
  timeout "$t" python3 -m ksearch_ray eval --task "$task" "$cand" --against "$against" --workloads "$set" --json "$@" \
    > "/tmp/raw/$name.json" 2> "/tmp/raw/$name.err"
  echo "$name rc=$? $(date -u +%T)"
}
GQA=gqa_paged_decode_h32_kv4_d128_ps1; MLAD=mla_paged_decode_h16_ckv512_kpe64_ps1
MLAP=mla_paged_prefill_causal_h16_ckv512_kpe64_ps1; MOE=moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048
case $PHASE in
attention)
  python3 experiments/flashinfer_warmup.py gqa mla_decode mla_prefill 2>&1 | grep -v Warning | tail -8
  # The GQA decode path not shipped, side by side with the shipped one.
  sed 's/^USE_TENSOR_CORES = False/USE_TENSOR_CORES = True/' tasks/flashinfer/$GQA/solutions/flashinfer/main.py \
    > /tmp/flashinfer_tensor_cores.py
  ev gqa_tensorcores_vs_fi_feedback $GQA /tmp/flashinfer_tensor_cores.py flashinfer feedback
  for T in $GQA $MLAD $MLAP; do
    S=${T%%_paged*}_$(echo $T | cut -d_ -f3)
    ev ${S}_fi_vs_ref_feedback $T flashinfer reference feedback
    ev ${S}_seed_vs_fi_feedback $T triton_seed flashinfer feedback
  done
  ev gqa_cute_vs_fi_feedback $GQA cuda_cute flashinfer feedback
  for T in $GQA $MLAD $MLAP; do
    S=${T%%_paged*}_$(echo $T | cut -d_ -f3)
    ev ${S}_seed_vs_fi_all $T triton_seed flashinfer all --max-calls 10
  done ;;
tunables)
  timeout "$(left 580)" python3 -m pytest tests/test_flashinfer_tasks.py -m gpu -k tunable -q -p no:cacheprovider 2>&1 | tail -15 ;;
moe)
  MAX_JOBS=16 timeout "$(left 420)" python3 experiments/flashinfer_warmup.py moe > "$OUT/moe_build.log" 2>&1
  echo "moe build rc=$? objects: $(find .ficache -name '*.o' | wc -l)"; tail -3 "$OUT/moe_build.log"
  ev moe_fi_vs_ref_feedback $MOE flashinfer reference feedback
  ev moe_seed_vs_fi_feedback $MOE triton_seed flashinfer feedback ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
python3 experiments/summarize_eval.py /tmp/raw/*.json > "$OUT/summary_$PHASE.txt" 2>&1
grep -v '^  [0-9a-f]\{8\}-' "$OUT/summary_$PHASE.txt" | head -80
tar czf "$OUT/raw_$PHASE.tgz" -C /tmp/raw .
