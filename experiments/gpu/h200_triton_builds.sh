#!/usr/bin/env bash
# Triton builds on CPU workers, on the H200 (issue 40). PARTS picks what runs (default: tests evals):
#   tests   the CPU-side Triton build tests with this machine's Triton (3.6: the GPU's), and the GPU sandbox and
#           overlap tests
#   evals   experiments/triton_builds.py evals: each TriMul seed's evaluation with the worker's own JIT, with
#           a build made beforehand on this machine's CPUs and the driver helper compiled ahead, and the same
#           candidate once more (VARIANTS_E, default jit,helper,again), alternating, in one warm evaluator
#           (--isolation require)
#   fi_evals  the same for each FlashInfer task's default seed (VARIANTS_E, default jit,helper,again; its feedback set):
#           issue 40 asks for its goal within a factor of two there
#   search  offline TriMul searches as a user runs them (Ray, width 4, one evaluator, ROUNDS rounds), one per
#           entry of VARIANTS (default "off screen"): off: cluster.triton_builds, evaluation.triton_helper_ahead
#           and evaluation.screen all off (the defaults before 2026-12-05); on: builds and helper, no screening;
#           screen: the defaults (builds, helper, each new candidate timed to 1 % in at most 20 calls a workload;
#           a would-be best is measured again by the full rule); overlap: the defaults and evaluation.overlap (two
#           evaluations per evaluator, the next one's worker started while one is timed); idle: the defaults and
#           search.tune_when_idle (an evaluator that would idle tunes the fastest passed candidates); nowarm: the
#           defaults without cluster.warm_builders (the first build starts no other build worker's sandbox); behind:
#           the defaults without cluster.build_ahead (the seed's build starts after the baselines, not beside them); then
#           experiments/triton_builds.py search over them. VARIANTS="screen overlap" compares the last two.
#   judge   experiments/judge_cost.py: the judge's reference and comparison (full and short path) per TriMul workload
#   profile experiments/profile_once.py --beside baseline: with overlap, how long a profile of triton_fused stalls
#           the evaluations that come after it
# Outputs under $OUT (tarred by the caller's command).
#   PARTS="tests evals" SITE=.gpubundle_s bash experiments/gpu/h200_triton_builds.sh
set -uo pipefail
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p /tmp/site && for b in "${SITE:-.gpubundle_s}"/*.tar.xz; do tar xJf "$b" -C /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; bash experiments/gpu/source_hash.sh
  python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"; } | tee "$OUT/machine.txt"
stamp() { date -u +"%H:%M:%S $*" | tee -a "$OUT/times.txt"; }
for part in ${PARTS:-tests evals}; do
  stamp "$part"
  case $part in
    tests)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_triton_builds.py -k "not pools" 2>&1 | tail -15 | tee "$OUT/tests.log"
      timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sandbox_gpu.py tests/test_overlap.py 2>&1 | tail -4 | tee -a "$OUT/tests.log" ;;
    evals)
      timeout "${EVAL_S:-400}" python3 experiments/triton_builds.py evals --task trimul --solutions "${SOLUTIONS:-triton_seed,triton_fused}" \
        --variants "${VARIANTS_E:-jit,helper,again}" --repeats "${REPEATS:-3}" --isolation require --out "$OUT/evals.json" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/evals.log" | tail -12 ;;
    fi_evals)
      for t in gqa_paged_decode_h32_kv4_d128_ps1 mla_paged_decode_h16_ckv512_kpe64_ps1 \
               mla_paged_prefill_causal_h16_ckv512_kpe64_ps1 moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048; do
        seed=$(python3 -c "from ksearch_ray.taskspec.task import find_task; print(find_task('$t').definition.default_seed)")
        timeout "${EVAL_S:-400}" python3 experiments/triton_builds.py evals --task "$t" --solutions "$seed" \
          --variants "${VARIANTS_E:-jit,helper,again}" --repeats "${REPEATS:-2}" --isolation require --out "$OUT/evals_$t.json" 2>&1 \
          | grep -v "Warning\|warn_once" | tee "$OUT/evals_$t.log" | tail -5
      done ;;
    search)
      printf 'cluster:\n  triton_builds: false\nevaluation:\n  triton_helper_ahead: false\n  screen: null\n' > /tmp/off.yaml
      printf 'evaluation:\n  screen: null\n' > /tmp/on.yaml
      printf 'evaluation:\n  overlap: true\n' > /tmp/overlap.yaml
      printf 'search:\n  tune_when_idle: true\n' > /tmp/idle.yaml
      printf 'cluster:\n  warm_builders: false\n' > /tmp/nowarm.yaml
      printf 'cluster:\n  build_ahead: false\n' > /tmp/behind.yaml
      for v in ${VARIANTS:-off screen}; do
        rm -rf "/tmp/run_$v" "/tmp/xdg_$v"; extra=""; [ "$v" != screen ] && extra="--config /tmp/$v.yaml"
        # The run's own wall budget ends it (with its final re-timing); the timeout only guards it. Each variant has
        # a cache folder of its own (the node's build cache is under it): the offline policy writes many of the
        # same candidates in every run, and a later variant once found their builds made by an earlier one.
        ( cd /tmp && mkdir -m 700 "/tmp/xdg_$v" && export XDG_CACHE_HOME="/tmp/xdg_$v" && timeout "$(( ${SEARCH_S:-270} + 60 ))" python3 -m ksearch_ray run --task trimul --width 4 \
            --rounds "${ROUNDS:-32}" --max-wall-s "${SEARCH_S:-270}" --confirm-repeats 1 --evaluators 1 --isolation require \
            --run-dir "/tmp/run_$v" --no-progress $extra ) > "$OUT/run_$v.out" 2> "$OUT/run_$v.err"
        echo "run $v exit $?"; tail -4 "$OUT/run_$v.out"
      done
      runs=(); for v in ${VARIANTS:-off screen}; do runs+=("/tmp/run_$v"); done
      python3 experiments/triton_builds.py search "${runs[@]}" | tee "$OUT/search.txt"
      for v in ${VARIANTS:-off screen}; do cp "/tmp/run_$v/events.jsonl" "$OUT/events_$v.jsonl" 2>/dev/null; done ;;
    judge)
      python3 experiments/judge_cost.py --task trimul --device cuda --repeats "${REPEATS:-5}" --json | tee "$OUT/judge.txt" ;;
    profile)
      python3 experiments/profile_once.py --task trimul --solutions triton_fused --workloads benchmarks --beside baseline \
        --beside-count 4 --out "$OUT/profile_once.json" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/profile.txt" | tail -8 ;;
  esac
done
stamp end
