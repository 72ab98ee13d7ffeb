#!/usr/bin/env bash
# CUDA candidates on the lent 2xH200 machine (device kind nvidia-h200-x2): the same offline-policy
# search over the GQA decode task's CUDA seed (cuda_cute, its tunables kTileN and kMinBlocksPerSm),
# once with CUDA builds on CPU build tasks ahead of the evaluators (build_pool: true) and once
# with each candidate compiled inside its evaluation on the evaluator's GPU (build_pool: false).
# Then the cost of a build-cache hit on this machine. Needs .gpubundle/site.tar.xz (ray, pydantic)
# and .gpubundle/cutlass.tar.xz (nvidia-cutlass headers); writes everything under $OUT.
#   bash ../shared/tools/gpu-bundle.sh && BUNDLE=cutlass bash ../shared/tools/gpu-bundle.sh nvidia-cutlass==4.2.0.0
set -uo pipefail
mkdir -p /tmp/site && for b in .gpubundle/site.tar.xz .gpubundle/cutlass.tar.xz; do tar xJf "$b" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WALL=${WALL:-140}     # wall budget per run, set-up included (candidates in flight at the end still finish)
WIDTH=${WIDTH:-12}    # cycles in parallel: enough candidates to cover a build's latency on 2 GPUs
GQA=gqa_paged_decode_h32_kv4_d128_ps1
{ nvidia-smi -L; nproc; free -g | head -2; date -u; nvcc --version | tail -2
  python3 -c "import torch, triton, ray, cutlass_library; print(torch.__version__, triton.__version__, ray.__version__)"
  echo "sources $(bash experiments/gpu/source_hash.sh)"; } 2>&1 | tee "$OUT/machine.txt"

# The task with its CUDA seed only (and the reference baseline), so that every candidate is CUDA:
# the offline policy would otherwise also switch to the Triton seed.
rm -rf /tmp/cuda_tasks && mkdir -p /tmp/cuda_tasks && cp -r tasks/flashinfer/$GQA /tmp/cuda_tasks/
rm -rf /tmp/cuda_tasks/$GQA/solutions/{triton_seed,flashinfer}

search() {  # search NAME BUILD_POOL
  rm -rf /tmp/runs/$1 /tmp/scratch-$1
  # One baseline per GPU and no re-timing at the end: the device time goes to the search itself.
  printf "build_pool: %s\nbuild_cpus: 2\nscratch_dir: /tmp/scratch-%s\nstagnation_window: 3\nnoise_repeats: 1\nconfirm_repeats: 0\n" \
    "$2" "$1" > /tmp/$1.yaml
  echo "== $1 (build_pool: $2) $(date -u +%T)"
  timeout $((WALL + 90)) python3 -m ksearch_ray run --task $GQA --task-dir /tmp/cuda_tasks --from-solution cuda_cute \
    --language cuda --evaluators 2 --width "$WIDTH" --rounds 60 --max-wall-s "$WALL" --workloads feedback \
    --run-dir /tmp/runs/$1 --no-progress --config /tmp/$1.yaml 2>&1 | grep -v "pid=" | tail -5
  echo "rc=${PIPESTATUS[0]} $(date -u +%T)"
  mkdir -p "$OUT/$1" && cp /tmp/runs/$1/{events.jsonl,manifest.json,best.json} "$OUT/$1"/ 2>/dev/null
}
search pool true 2>&1 | tee -a "$OUT/log.txt"
search nopool false 2>&1 | tee -a "$OUT/log.txt"

python3 experiments/cuda_search_report.py --run pool=/tmp/runs/pool --run nopool=/tmp/runs/nopool \
  --cache /tmp/scratch-pool/build-cache 2>&1 | tee "$OUT/report.txt"
# Cache hits on this machine: the seed, already built by the pool run (same toolchain and target).
timeout 120 python3 experiments/build_cache_hit.py --task $GQA --task-dir /tmp/cuda_tasks --solution cuda_cute \
  --scratch /tmp/scratch-pool --hits 10 2>&1 | grep -v "pid=" | tee "$OUT/cache_hit.json"
date -u | tee -a "$OUT/log.txt"
