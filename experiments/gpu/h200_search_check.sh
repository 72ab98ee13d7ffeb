#!/usr/bin/env bash
# The refactored search on the H200, as a user runs it: the GPU sandbox tests, the README's first
# command, and a short offline TriMul search through a local Ray (the default path), then the same
# run read back by show --json. One call; outputs under $OUT (tarred by the caller's command).
#   BUNDLE=.gpubundle/site.tar.xz bash experiments/gpu/h200_search_check.sh
set -uo pipefail
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p /tmp/site && tar xJf "${BUNDLE:-.gpubundle/site.tar.xz}" -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; RUN=/tmp/h200-check-run; rm -rf "$RUN"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
( time python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sandbox_gpu.py ) > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
( time python3 -m ksearch_ray eval --task trimul triton_seed --json ) > "$OUT/eval.json" 2> "$OUT/eval.err"
python3 -c "import json; r=json.load(open('$OUT/eval.json'))['result']; print('eval', r['status'], r['score'], r['seconds'])"
( time python3 -m ksearch_ray run --task trimul --width 2 --rounds 4 --run-dir "$RUN" --no-progress ) > "$OUT/run.out" 2> "$OUT/run.err"
echo "run exit $?"; tail -12 "$OUT/run.out"; grep -E "real|one evaluation" "$OUT/run.err"
# The run read back through the read model (the GPU machine has no polars for `show`).
python3 - "$RUN" <<'PY' | tee "$OUT/view.txt"
import sys
from ksearch_ray.events import RunView
from ksearch_ray.store import RunStore
store = RunStore(sys.argv[1])
view = RunView.of(store.read_events(), store.has_solution)
print("finished", view.finished, "rounds", view.rounds_used, "evaluations", view.evaluations,
      "active_s", round(view.active_s, 1), "noise", view.noise())
print("best", view.best)
for gpu, c in view.confirms.items():
    print("confirm", gpu, c.verdict, "cut", c.cut_short, "repeats", len(c.repeats))
print("statuses", view.status_counts())
PY
tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
