#!/usr/bin/env bash
# Evaluation throughput on the lent H200 (issue 18), before and after, in one call:
#   1. the GPU-marked evaluator and sandbox tests of this checkout;
#   2. experiments/eval_throughput.py on this checkout ("after"): TriMul (benchmarks), GQA and MLA
#      paged decode (feedback), baseline and Triton seed, REPEATS evaluations each in two
#      evaluators (noise within and across evaluators), then a Python hang and a spinning Triton
#      kernel on TriMul's smoke set;
#   3. the same script against the old code in $BEFORE ("before", BEFORE_REPEATS evaluations in one
#      evaluator), while the old code's Python hang runs beside it (it needs 180 s of waiting, and
#      no GPU work, so it runs in the background; the old spinning kernel would hold an SM for
#      those 180 s and disturb every other figure, so it is not run).
# Results (JSON, logs) land in $OUT. Needs the ray+pydantic bundle: BUNDLE=path/to/site.tar.xz.
#
#   BEFORE=../wt18-before BUNDLE=../../.gpubundle/site.tar.xz bash experiments/gpu/h200_eval_throughput.sh
set -uo pipefail
mkdir -p /tmp/site && tar xJf "${BUNDLE:-.gpubundle/site.tar.xz}" -C /tmp/site
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NEW=$PWD; OLD=$(cd "${BEFORE:?set BEFORE to the old checkout}" && pwd)
REPEATS=${REPEATS:-3}; BEFORE_REPEATS=${BEFORE_REPEATS:-2}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  nproc; date -u
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
S=experiments/eval_throughput.py

if [ -z "${SKIP_BEFORE:-}" ]; then
  (cd "$OLD" && PYTHONPATH=/tmp/site:$OLD timeout 300 python3 "$NEW/$S" --label before --only-hang \
     --out "$OUT/before_hang.json" > "$OUT/before_hang.log" 2>&1) &
  HANG_PID=$!
fi

if [ -z "${SKIP_TESTS:-}" ]; then
  PYTHONPATH=/tmp/site:$NEW timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -x \
    ${TEST_FILES:-tests/test_sandbox_gpu.py tests/test_evaluator.py tests/test_sandbox_handover.py} > "$OUT/pytest.txt" 2>&1
  tail -15 "$OUT/pytest.txt"
fi

PYTHONPATH=/tmp/site:$NEW timeout ${AFTER_TIMEOUT:-240} python3 $S --label after --repeats "$REPEATS" --cross-evaluator \
  ${AFTER_ARGS:---hangs} --out "$OUT/after.json" 2>&1 | tee "$OUT/after.log" | grep -v "^after .* #[1-9]"

if [ -z "${SKIP_BEFORE:-}" ]; then
  (cd "$OLD" && PYTHONPATH=/tmp/site:$OLD timeout ${BEFORE_TIMEOUT:-200} python3 "$NEW/$S" --label before \
     --repeats "$BEFORE_REPEATS" --out "$OUT/before.json" 2>&1 | tee "$OUT/before.log" | grep -v "^before .* #[1-9]")
  wait $HANG_PID
  cat "$OUT/before_hang.log" | tail -3
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> "$OUT/gpu.txt" 2>&1
