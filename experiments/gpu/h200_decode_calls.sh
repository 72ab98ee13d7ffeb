#!/usr/bin/env bash
# Decode kernels as calls on the H200 (issue 45): host work per call side by side (decode_kernels.py
# host), then the evaluator's two figures against FlashInfer's kernel through `ksearch eval` as a user
# types it, then the GPU correctness tests of the seeds. Outputs under $OUT (tarred by the caller).
# TASKS may name moe (its seed against the task's PyTorch reference, `--baseline`); HOST=0 skips the host step.
#   OLD_GQA=old.py OLD_MLA=old.py OLD_PREFILL=old.py TASKS="gqa mla_decode mla_prefill" SITE=.gpubundle_s FI=.gpubundle_f bash experiments/gpu/h200_decode_calls.sh
set -uo pipefail
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/ficache
mkdir -p /tmp/site && for b in "${SITE:-.gpubundle_s}"/*.tar.xz "${FI:-.gpubundle_f}"/*.tar.xz; do tar xJf "$b" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
declare -A TASK=([gqa]=gqa_paged_decode_h32_kv4_d128_ps1 [mla_decode]=mla_paged_decode_h16_ckv512_kpe64_ps1
                 [mla_prefill]=mla_paged_prefill_causal_h16_ckv512_kpe64_ps1
                 [moe]=moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048)
declare -A SEED=([gqa]=triton_splitkv [mla_decode]=triton_splitkv [mla_prefill]=triton_flash [moe]=triton_grouped)
declare -A AGAINST=([gqa]="--against flashinfer_kernel" [mla_decode]="--against flashinfer_kernel"
                    [mla_prefill]="--against flashinfer_kernel" [moe]="--baseline")
declare -A OLD=([gqa]="${OLD_GQA:-}" [mla_decode]="${OLD_MLA:-}" [mla_prefill]="${OLD_PREFILL:-}")
stamp() { date -u +"%H:%M:%S $*" | tee -a "$OUT/times.txt"; }
for t in ${TASKS:-gqa mla_decode}; do
  [ "${HOST:-1}" = 0 ] && continue
  stamp "host $t"
  sols=${SEED[$t]}; [ -n "${OLD[$t]}" ] && sols="$sols,${OLD[$t]}:${SEED[$t]}"
  timeout 150 python3 experiments/decode_kernels.py --task "$t" host --solutions "$sols,flashinfer_kernel" \
    --workloads "${HOST_SET:-feedback}" --top 8 --out "$OUT/host_$t.json" 2>&1 | grep -v "Warning\|INFO" | tee "$OUT/host_$t.log"
done
for t in ${TASKS:-gqa mla_decode}; do
  for set in ${SETS:-feedback all}; do
    stamp "eval $t $set"
    ( cd /tmp && timeout "${EVAL_S:-150}" python3 -m ksearch_ray eval --task "${TASK[$t]}" "${SEED[$t]}" \
        ${AGAINST[$t]} --workloads "$set" --isolation require ) > "$OUT/eval_${t}_$set.txt" 2>&1
    grep -v "^  [0-9a-f]\{8\}" "$OUT/eval_${t}_$set.txt" | tail -12
  done
done
if [ -n "${TESTS:-}" ]; then  # TESTS: pytest files; TESTS_K: its -k expression (-rA: a passed test's printout too, e.g. the reproduction check's pooled figure)
  stamp tests
  ( time timeout "${TESTS_S:-240}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu $TESTS -k "${TESTS_K:-}" ) > "$OUT/tests.log" 2>&1
  tail -8 "$OUT/tests.log"
fi
stamp end
