#!/usr/bin/env bash
# Paged-attention kernels on the lent H200 (TASK: gqa, issue 22, the default; mla_decode, issue 23;
# or mla_prefill, issue 24, whose kernel is triton_flash where the others' is triton_splitkv), in
# one call of under ten minutes: FlashInfer's JIT module built outside the sandbox, the DRAM
# bandwidth measured, then the evaluator's verdicts for SOLUTIONS side by side in one evaluator with
# isolation required (SETS: both workload sets in both timing modes), with each workload's achieved
# bandwidth against the measured peak; then (unless SWEEP=0) a coordinate sweep of SWEEP_SOLUTION's
# tunables (SWEEP_GROUPS) and, unless EVAL_BEST=0, the sweep's best judged beside its defaults and
# FlashInfer on BEST_SETS, while time is left (BUDGET_S from the start). Before the evaluator,
# unless GRAPHS=0, the same solutions (or GRAPH_SOLUTIONS; `file.py:solution` for a variant's
# source) timed in process as CUDA-graph replays with FlashInfer's plan untimed, on each set of
# GRAPH_SETS (default feedback): kernel against kernel. With NCU=1, Nsight Compute's DRAM throughput
# and occupancy of the main kernel (NCU_KERNEL) on the largest feedback workload (NCU_WORKLOAD). See
# experiments/decode_kernels.py for each step. Carry the bundles site and flashinfer (BUNDLES: where
# they are; default .gpubundle), not the whole folder (llm.tar.xz would take the call past 64 MiB).
# Results land in $OUT as one tarball.
#   bash experiments/gpu/h200_decode_kernels.sh
#   TASK=mla_decode bash experiments/gpu/h200_decode_kernels.sh
#   TASK=mla_prefill bash experiments/gpu/h200_decode_kernels.sh
#   TASK=moe bash experiments/gpu/h200_decode_kernels.sh   # issue 25: triton_grouped, scored against the reference
# For TASK=moe the last solution (BASELINE) is the task's PyTorch reference (the task has no
# flashinfer_kernel), FlashInfer's JIT warm-up is skipped (WARMUP=1 builds the fused MoE, minutes), and
# the graphs step times triton_grouped alone: the seed and the reference copy to the host mid-call and
# cannot be captured, so that step checks that the kernel is capturable and gives its graph-replay time.
set -uo pipefail
START=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - START) )); }
BUNDLES=${BUNDLES:-.gpubundle}
mkdir -p /tmp/site
for b in site flashinfer; do tar xJf "$BUNDLES/$b.tar.xz" -C /tmp/site & done; wait
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# One JIT cache for the warm-up and every sandboxed worker (mounted read-only in each worker).
export FLASHINFER_WORKSPACE_BASE=/tmp/ficache
TASK=${TASK:-gqa}
KERNEL=triton_splitkv; NCU_KERNEL=${NCU_KERNEL:-_split_kernel}
case $TASK in
  gqa) NCU_WORKLOAD=${NCU_WORKLOAD:-f46ddc2e}
       DEFAULT_GROUPS="BLOCK_KV=16,32,64,128;NUM_STAGES=2,3,5|PROGRAMS_PER_SM=1,2,4,8,16;MIN_PIECE_TILES=1,2,4|NUM_WARPS=2,4,8;PV_PRECISION=fp16,tf32|MERGE_BLOCK=16,32,64;MERGE_WARPS=1,2,4" ;;
  mla_decode) NCU_WORKLOAD=${NCU_WORKLOAD:-939f995a}
       DEFAULT_GROUPS="BLOCK_KV=16,32,64;NUM_STAGES=1,2,3|PROGRAMS_PER_SM=1,2,4,8;MIN_PIECE_TILES=1,2,4|NUM_WARPS=4,8;PV_PRECISION=fp16,tf32|MERGE_DIM=64,128,256,512;MERGE_WARPS=1,2,4" ;;
  mla_prefill) NCU_WORKLOAD=${NCU_WORKLOAD:-77737de2}; KERNEL=triton_flash; NCU_KERNEL=${NCU_KERNEL:-_attend_kernel}
       # both tilings: the small one's knobs, where the large one starts, the large one's knobs
       DEFAULT_GROUPS="BLOCK_Q=1,2,4;NUM_WARPS=4,8|BLOCK_N=16,32,64;NUM_STAGES=1,2,3|LARGE_FROM_Q=256,512,1024,2048|LARGE_BLOCK_Q=4,8;LARGE_NUM_WARPS=4,8|LARGE_BLOCK_N=16,32;LARGE_NUM_STAGES=1,2|PV_PRECISION=fp16,tf32,bf16x2;LARGE_PV_PRECISION=fp16,bf16x2|PROGRAMS_PER_SM=1,2,4;MAX_SPLITS=1,4,8,16|MIN_SPLIT_TILES=2,4,8|MERGE_DIM=128,256,512;MERGE_WARPS=2,4,8" ;;
  moe) NCU_WORKLOAD=${NCU_WORKLOAD:-6230e838}; KERNEL=triton_grouped; NCU_KERNEL=${NCU_KERNEL:-_gemm}  # both GEMMs
       BASELINE=reference; WARMUP=${WARMUP:-0}; GRAPH_SOLUTIONS=${GRAPH_SOLUTIONS:-triton_grouped}
       DEFAULT_GROUPS="BLOCK_M=16,32,64;BLOCK_N=32,64,128|SPLIT_K1=1,2,4,8;SPLIT_K2=1,2,4|NUM_WARPS=4,8;NUM_STAGES=2,3|BLOCK_K=64,128;SWAP_AB=True,False" ;;
  *) echo "TASK must be gqa, mla_decode, mla_prefill or moe, not $TASK"; exit 2 ;;
esac
BASELINE=${BASELINE:-flashinfer_kernel}
OUT=${OUT:-/tmp/out}; R=/tmp/decode-kernels-$TASK; mkdir -p "$OUT" "$R"
SOLUTIONS=${SOLUTIONS:-$KERNEL,triton_seed,$BASELINE}  # the last is what the others are scored against
SETS=${SETS:-feedback:fresh,all:fresh,feedback:reuse,all:reuse}
SWEEP_SOLUTION=${SWEEP_SOLUTION:-$KERNEL}
S="experiments/decode_kernels.py --task $TASK"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  echo "sources $(bash experiments/gpu/source_hash.sh) (experiments/gpu/source_hash.sh)"
  python3 -c "import flashinfer, torch, triton, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'flashinfer', flashinfer.__version__)"
} 2>&1 | tee "$R/machine.txt"
echo "unpacked in $(( $(date +%s) - START )) s"
if [ "${WARMUP:-1}" = 1 ]; then
  timeout 150 python3 experiments/flashinfer_warmup.py "$TASK" --shipped-only 2>&1 | grep -v Warning | tee "$R/warmup.log" | tail -3
fi
timeout 60 python3 $S peak --out "$R/peak.json" 2>&1 | tee "$R/peak.log"
if [ "${GRAPHS:-1}" = 1 ]; then  # kernel against kernel: every solution a graph replay, FlashInfer's plan untimed
  for set in ${GRAPH_SETS:-feedback}; do
    timeout "${GRAPHS_TIMEOUT:-120}" python3 $S graphs --solutions "${GRAPH_SOLUTIONS:-$SOLUTIONS}" --workloads "$set" \
      --out "$R/graphs-$set.json" 2>&1 | tee "$R/graphs-$set.log"
  done
fi
if [ "${EVAL:-1}" = 1 ]; then
  timeout "$(left)" python3 $S eval --solutions "$SOLUTIONS" --sets "$SETS" --peak "$R/peak.json" \
    --deadline $(( START + ${EVAL_UNTIL_S:-400} )) --out "$R/eval.json" 2>&1 | tee "$R/eval.log"
fi
if [ "${SWEEP:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  # SWEEP_GROUPS: the sweep's groups, separated by "|" (each group: "NAME=v1,v2;NAME=v1,v2"), in order.
  SWEEP_GROUPS=${SWEEP_GROUPS:-$DEFAULT_GROUPS}
  args=(); IFS='|' read -ra parts <<< "$SWEEP_GROUPS"; for g in "${parts[@]}"; do args+=(--group "$g"); done
  timeout "$(left)" python3 $S sweep --solution "$SWEEP_SOLUTION" --deadline $(( START + ${SWEEP_UNTIL_S:-500} )) \
    --out "$R/sweep.json" --best-out "$R/best.py" "${args[@]}" 2>&1 | tee "$R/sweep.log"
fi
if [ "${EVAL_BEST:-1}" = 1 ] && [ -f "$R/best.py" ] && [ "$(left)" -gt 40 ]; then  # the sweep's best, judged
  timeout "$(left)" python3 $S eval --base "$KERNEL" --solutions "$R/best.py,$SWEEP_SOLUTION,$BASELINE" \
    --sets "${BEST_SETS:-feedback:fresh,all:fresh}" --peak "$R/peak.json" --deadline $(( START + ${BUDGET_S:-560} )) \
    --out "$R/eval_best.json" 2>&1 | tee "$R/eval_best.log"
fi
if [ "${NCU:-0}" = 1 ] && [ "$(left)" -gt 60 ]; then  # what limits the main kernel on the largest feedback workload
  timeout "$(left)" ncu --set basic --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    -k "regex:$NCU_KERNEL" -s 2 -c 2 python3 $S once --solution "${NCU_SOLUTION:-$SWEEP_SOLUTION}" --workload "$NCU_WORKLOAD" --calls 4 \
    > "$R/ncu.txt" 2>&1; tail -40 "$R/ncu.txt"
fi
tar czf "$OUT/decode-kernels-$TASK.tgz" -C /tmp "decode-kernels-$TASK"
echo "total $(( $(date +%s) - START )) s"
