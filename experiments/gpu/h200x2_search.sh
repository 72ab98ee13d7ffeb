#!/usr/bin/env bash
# Search-engine measurements on the lent 2xH200 machine (device tool, kind nvidia-h200-x2).
set -uo pipefail
mkdir -p /tmp/site && tar xJf .gpubundle/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
export RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi -L; nproc; date -u; python3 -c "import torch, triton, ray; print(torch.__version__, triton.__version__, ray.__version__)"; } | tee "$OUT/machine.txt"
python3 -m pytest tests/test_evaluator.py -q -k side_stream 2>&1 | tail -3
ROUNDS=${ROUNDS:-16}
python3 experiments/search_scaling.py --gpus 1 2 --rounds "$ROUNDS" --width 4 --workloads smoke --out /tmp/scal_w4 2>&1 \
  | grep -v "pid=" | tee "$OUT/scaling_w4.txt"
python3 experiments/search_scaling.py --gpus 1 --rounds "$ROUNDS" --width-per-gpu 2 --workloads smoke --out /tmp/scal_w2 --no-compare 2>&1 \
  | grep -v "pid=" | tee "$OUT/scaling_w2.txt"
for d in /tmp/scal_w4/gpus1 /tmp/scal_w4/gpus2 /tmp/scal_w2/gpus1; do
  t="$OUT/$(basename $(dirname $d))_$(basename $d)"; mkdir -p "$t"; cp "$d"/{events.jsonl,manifest.json,best.json} "$t"/ 2>/dev/null
done
cp /tmp/scal_w4/scaling.json "$OUT/scaling_w4.json" 2>/dev/null; cp /tmp/scal_w2/scaling.json "$OUT/scaling_w2.json" 2>/dev/null
date -u
