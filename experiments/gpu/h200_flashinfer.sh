#!/usr/bin/env bash
# FlashInfer tasks on the lent H200: every seed against the reference, on the feedback and all
# workload sets, side by side in one evaluator per command (--baseline). One GPU.
set -uo pipefail
mkdir -p /tmp/site && for b in .gpubundle/site.tar.xz .gpubundle/cutlass.tar.xz; do tar xJf $b -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
date -u
python3 -m pytest tests/test_evaluator.py -q -k side_stream 2>&1 | tail -1
K="python3 -m ksearch_ray eval"
for T in gqa_paged_decode_h32_kv4_d128_ps1 mla_paged_decode_h16_ckv512_kpe64_ps1 \
         mla_paged_prefill_causal_h16_ckv512_kpe64_ps1 moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048; do
  S=${T%%_*}_$(echo $T | cut -d_ -f2,3)
  SOLS="triton_seed"; [ -d tasks/flashinfer/$T/solutions/cuda_cute ] && SOLS="triton_seed cuda_cute"
  for sol in $SOLS; do
    if [ -z "${SKIP_FEEDBACK:-}" ]; then
      timeout 170 $K --task $T $sol --workloads feedback --baseline --json > "$OUT/${S}_${sol}_feedback.json" 2> "$OUT/${S}_${sol}_feedback.err"
      echo "$T $sol feedback rc=$? $(date -u +%T)"
    fi
    timeout 170 $K --task $T $sol --workloads all --baseline --max-calls 10 --json > "$OUT/${S}_${sol}_all.json" 2> "$OUT/${S}_${sol}_all.err"
    echo "$T $sol all rc=$? $(date -u +%T)"
  done
done
python3 experiments/summarize_eval.py "$OUT"/*.json > "$OUT/summary.txt"
grep -E "^==|score" "$OUT/summary.txt"
mkdir -p /tmp/raw && mv "$OUT"/*.json "$OUT"/*.err /tmp/raw/ && tar czf "$OUT/raw.tgz" -C /tmp/raw .
