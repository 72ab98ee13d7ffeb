#!/usr/bin/env bash
# The experiments of issue 10 on the lent 2xH200 machine (device tool, kind nvidia-h200-x2), about 8 minutes:
#   1. search width 1, 2, 4, 8 (offline policy, one seed, 35 s of search per run): TriMul on GPU 0 and the
#      FlashInfer GQA paged-decode task on GPU 1, side by side;
#   2. the comparison of methods (ksearch, evolve, refine; offline policy, 35 s per run) on TriMul on both
#      GPUs, then each run's best checked on TriMul's `benchmarks` set beside the baseline.
# Carry only .gpubundle/site.tar.xz (ray, pydantic): that machine has no polars, so the scripts stop after
# the runs (--no-report) and everything lands in $OUT/experiments.tar.gz. Tables and plots come from it on
# any machine with the project installed (the analysis reads run directories only):
#   mkdir -p /tmp/h200x2 && tar xzf experiments.tar.gz -C /tmp/h200x2
#   python experiments/width_study.py --report-only --out /tmp/h200x2/width_trimul
#   python experiments/width_study.py --report-only --out /tmp/h200x2/width_gqa
#   python experiments/reproduce.py --report-only --out /tmp/h200x2/reproduce
# and copy each folder's *.md, *.png and *.parquet to docs/results/.
set -uo pipefail
mkdir -p /tmp/site && tar xJf .gpubundle/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
export RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/ksearch_experiments; rm -rf "$W"; mkdir -p "$W"
WALL=${WALL:-35}  # seconds of search per run (a budget of each run, beside its rounds)
{ nvidia-smi -L; nproc; date -u; python3 -c "import torch, triton, ray; print(torch.__version__, triton.__version__, ray.__version__)"; } \
  | tee "$OUT/machine.txt"
printf 'settings:\n  max_wall_s: %s\n' "$WALL" > "$W/budget.yaml"
COMMON=(--config "$W/budget.yaml" --device cuda --seeds 1 --rounds 200 --no-report)

CUDA_VISIBLE_DEVICES=0 timeout 300 python3 experiments/width_study.py --task trimul --workloads smoke --widths 1 2 4 8 \
  "${COMMON[@]}" --out "$W/width_trimul" > "$OUT/width_trimul.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 300 python3 experiments/width_study.py --task gqa_paged_decode_h32_kv4_d128_ps1 --widths 1 2 4 8 \
  "${COMMON[@]}" --out "$W/width_gqa" > "$OUT/width_gqa.log" 2>&1 &
wait
tail -3 "$OUT/width_trimul.log" "$OUT/width_gqa.log"

timeout 210 python3 experiments/reproduce.py --task trimul --workloads smoke --methods ksearch evolve refine \
  --check-workloads benchmarks "${COMMON[@]}" --out "$W/reproduce" > "$OUT/reproduce.log" 2>&1
tail -3 "$OUT/reproduce.log"

# Run directories without the evaluators' work folders (Triton caches) and the LLM cache (empty offline).
tar czf "$OUT/experiments.tar.gz" -C "$W" --exclude=sandbox --exclude=llm_cache --exclude=budget.yaml .
ls -la "$OUT"
date -u
