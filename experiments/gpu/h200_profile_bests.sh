#!/usr/bin/env bash
# Profiler evidence on one H200 (issue 26, part 3), in one call: what this ncu offers, a profile of the
# TriMul seed through the sandbox (its raw log is the parser's fixture), the GPU tests (a known kernel's
# profile; a hostile candidate under the profiler, with isolation and without), a TriMul search with
# --profile-bests against the LLM stand-in (its prompts kept), and whether ncu works in a network namespace
# whose loopback is down (as the sandbox's is).
# Each step has its own time limit and its output goes to $OUT/log.txt; $OUT/results.tgz is rewritten
# after every step, so a call cut short still brings back what was done.
#   ROUNDS (default 3), AUTOTUNE (default 3), WALL (seconds, default 200) bound the search.
set -uo pipefail
OUT=${OUT:-/tmp/profile-bests}
ROUNDS=${ROUNDS:-3}
AUTOTUNE=${AUTOTUNE:-3}
WALL=${WALL:-200}
WORK=/tmp/profile-bests-work
mkdir -p "$OUT" "$WORK"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
pack() { tar czf "$OUT/results.tgz" -C "$WORK" . 2>/dev/null; }
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

STEPS=${STEPS:-facts,fixture,tests,search,loopback}
has() { [[ ",$STEPS," == *",$1,"* ]]; }

if has facts; then
step "facts"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
which ncu; ncu --version | tail -1
grep -i -E "profil|RmProfilingAdminOnly" /proc/driver/nvidia/params || echo "(no profiling parameter in /proc/driver/nvidia/params)"
timeout 60 ncu --query-metrics --chip gh100 > "$WORK/query_metrics.txt" 2>&1
grep -E "^(gpu__time_duration|gpu__dram_throughput|dram__throughput|dram__bytes |sm__throughput|gpu__compute_memory_throughput|sm__warps_active|sm__maximum_warps_per_active_cycle_pct|launch__registers_per_thread)" "$WORK/query_metrics.txt" | cut -c1-110
grep -c "^smsp__average_warps_issue_stalled_" "$WORK/query_metrics.txt"
grep -o "^smsp__average_warps_issue_stalled_[a-z_]*_per_issue_active" "$WORK/query_metrics.txt" | sort -u | tr '\n' ' '; echo
pack
fi

if has fixture; then
step "the TriMul seed profiled through the sandbox (the fixture)"
SECONDS=0
timeout 150 python3 experiments/profile_once.py --task trimul \
    --solutions triton_fused --workloads smoke --out "$WORK/profile_once.json" --logs "$WORK/logs"
echo "profile_once: exit $?, ${SECONDS} s"
pack
fi

if has tests; then
step "GPU tests"
KSEARCH_PROFILE_LOGS="$WORK/logs" timeout 180 python3 -m pytest -q -m gpu tests/test_profile_gpu.py \
    -p no:cacheprovider --durations=5 2>&1 | tail -40
pack
fi

if has search; then
step "a TriMul search with --profile-bests (stand-in LLM, in this process)"
timeout $((WALL + 120)) python3 experiments/profile_bests_search.py --run-dir "$WORK/run" --out "$WORK/search" -- \
    --task trimul --no-ray --from-solution triton_seed --workloads smoke --rounds "$ROUNDS" --autotune "$AUTOTUNE" \
    --max-wall-s "$WALL" --confirm-repeats 2
grep -E "profil|WARNING|new best|re-timed" "$WORK/search/run.out" | cut -c1-300
pack
fi

if has loopback; then
step "ncu in a network namespace of its own, loopback down, as in the sandbox (root: unshare -n)"
cat > "$WORK/tiny.py" <<'PY'
import torch
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
print("sum", (x * 2).sum().item())
PY
timeout 90 unshare -n ncu --csv --page raw --metrics gpu__time_duration.sum --clock-control none python3 "$WORK/tiny.py" \
    > "$WORK/unshare_n.txt" 2>&1; echo "ncu in a namespace without a loopback: exit $?"
tail -5 "$WORK/unshare_n.txt" | cut -c1-200
pack
fi
echo "done $(date -u +%H:%M:%S)"
