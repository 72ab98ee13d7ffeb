#!/usr/bin/env bash
# Sandbox and measurement integrity on the lent H200 (issue 11), in one go (a few minutes):
#   1. the GPU-marked tests of the sandbox (isolation with the GPU inside the namespaces, the
#      CUDA stopwatch, the H200's physical floor, CUDA-graph re-timing, hostile candidates) and
#      the evaluator's own GPU tests (side streams, CUDA faults);
#   2. per-candidate overhead, isolation on vs off, side by side (goal: under 0.5 s added);
#   3. the TF32-switching TriMul kernel of tests/data/candidates, fresh and reuse (smoke set),
#      isolation required;
#   4. optionally a candidate file given as $1 (e.g. the published K-Search TriMul kernel), fresh
#      and reuse on the benchmarks set, plus an independent re-timing of it (smoke set).
# Typically 6 to 8 minutes; every step has its own time limit (13 min in the worst case).
# Everything lands in $OUT: gpu.txt, pytest.txt, overhead.json, tf32_{fresh,reuse}.json,
# candidate_{fresh,reuse}.json, candidate_retime.json, summary.txt.
#
#   [EVALS_ONLY=1] bash experiments/gpu/h200_integrity.sh [CANDIDATE.py]
set -uo pipefail
mkdir -p /tmp/site && tar xJf .gpubundle/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CANDIDATE=${1:-}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  uname -r; id -u; ls -l /dev/nvidia* 2>&1 | head -8
  cat /proc/sys/user/max_user_namespaces 2>&1
  date -u
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if [ -z "${EVALS_ONLY:-}" ]; then  # EVALS_ONLY=1: steps 3 and 4 alone
timeout 240 python3 -m pytest -q -m gpu tests/test_sandbox_gpu.py tests/test_evaluator.py -p no:cacheprovider \
  > "$OUT/pytest.txt" 2>&1
tail -15 "$OUT/pytest.txt"

timeout 90 python3 experiments/sandbox_overhead.py --device cuda --n 20 > "$OUT/overhead.json" 2> "$OUT/overhead.err"
cat "$OUT/overhead.json"
fi

K="python3 -m ksearch_ray"
for mode in fresh reuse; do
  timeout 60 $K eval --task trimul tests/data/candidates/trimul_tf32.py --workloads smoke --mode $mode \
    --isolation require --json > "$OUT/tf32_$mode.json" 2>> "$OUT/eval.err"
done

if [ -n "$CANDIDATE" ]; then
  for mode in fresh reuse; do
    timeout 120 $K eval --task trimul "$CANDIDATE" --mode $mode --isolation require \
      --json > "$OUT/candidate_$mode.json" 2>> "$OUT/eval.err"
  done
  timeout 90 python3 - "$CANDIDATE" > "$OUT/candidate_retime.json" 2>> "$OUT/eval.err" <<'EOF'
import json, sys
from pathlib import Path
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.taskspec.task import find_task, solution_from_file
task = find_task("trimul")
sol = solution_from_file(Path(sys.argv[1]), task)
with Evaluator("cuda", isolation=Isolation.REQUIRE) as ev:
    primary = ev.evaluate(task, sol, workload_set="smoke")
    check = ev.retime(task, sol, primary)
print(json.dumps({"primary_status": primary.status.value, "primary_message": primary.message,
                  "retime": check.model_dump(mode="json")}, indent=2))
EOF
fi

python3 - "$OUT" > "$OUT/summary.txt" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    try:
        data = json.loads(f.read_text())
    except ValueError:
        print(f"{f.name}: no JSON (see eval.err)")
        continue
    if "result" in data:
        r = data["result"]
        print(f"{f.name}: {r['status']} score={r.get('score')} speedup={data.get('speedup')} {r.get('message', '')[:200]}")
    elif "retime" in data:
        print(f"{f.name}: primary {data['primary_status']}; retime agreed={data['retime']['agreed']} "
              + "; ".join(f"{w['workload']}: {w['primary_ms']:.4g} vs {w['retimed_ms']:.4g} ms ({w['method']})"
                          for w in data["retime"]["workloads"]))
    else:
        print(f"{f.name}: {json.dumps(data)}")
EOF
cat "$OUT/summary.txt"
