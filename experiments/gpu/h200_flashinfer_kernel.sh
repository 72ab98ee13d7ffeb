#!/usr/bin/env bash
# The kernel-against-kernel score on the lent H200 (issue 13, part 1), GQA paged decode only, in
# about two minutes: FlashInfer's kernel alone (`flashinfer_kernel`: plan() as the trusted untimed
# `prepare` step) against plan-plus-kernel (`flashinfer`), side by side, and the Triton seed
# against the kernel alone. Carry .gpubundle (site, flashinfer). Results under $OUT.
#   bash experiments/gpu/h200_flashinfer_kernel.sh
set -uo pipefail
mkdir -p /tmp/site && for b in .gpubundle/site.tar.xz .gpubundle/flashinfer.tar.xz; do tar xJf $b -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache  # one JIT cache for the warm-up and every sandboxed worker
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GQA=gqa_paged_decode_h32_kv4_d128_ps1
{ date -u; nvidia-smi -L; echo "sources $(bash experiments/gpu/source_hash.sh)"; } | tee "$OUT/machine.txt"
timeout 90 python3 experiments/flashinfer_warmup.py gqa 2>&1 | grep -v Warning | tail -3
for pair in "flashinfer_kernel flashinfer" "triton_seed flashinfer_kernel"; do
  set -- $pair
  timeout 100 python3 -m ksearch_ray eval --task $GQA "$1" --against "$2" --workloads feedback --json \
    > "$OUT/$1_vs_$2.json" 2> "$OUT/$1_vs_$2.err"
  echo "$1 vs $2: rc=$? $(date -u +%T)"
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); r, b = d['result'], d.get('baseline') or {}
print(r['status'], r.get('score'), 'prepared_untimed', r.get('prepared_untimed'), '| against', b.get('status'), b.get('score'),
      'prepared_untimed', b.get('prepared_untimed'), '| speedup', d.get('speedup'))" "$OUT/$1_vs_$2.json" 2>&1 | tail -1
done
