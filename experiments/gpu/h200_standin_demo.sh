#!/usr/bin/env bash
# The README's stand-in demo on TriMul on one H200: `ksearch standin` on loopback, then `ksearch run
# --task trimul --model hosted_vllm/standin --api-base ...` against it, in this process (--no-ray, to
# spend the device time on the search, not on starting Ray), on the task's default workloads.
# Prints the figures docs/benchmarks.md quotes and leaves the run directory as $OUT/run.tgz.
#   ROUNDS (default 6) and WALL (seconds, default 180) bound it to the device budget; RAY=1 runs it as the
#   README gives it, on a Ray of its own (without --no-ray).
set -uo pipefail
OUT=${OUT:-/tmp/standin-demo}
ROUNDS=${ROUNDS:-6}
WALL=${WALL:-180}
RUN=/tmp/standin-demo-run
mkdir -p "$OUT"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
python3 -m ksearch_ray standin --port 8000 > "$OUT/standin.log" 2>&1 &
SERVER=$!
python3 - <<'PY'
import time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/v1/models", timeout=1); break
    except OSError:
        time.sleep(0.2)
PY
start=$(date +%s)
python3 -m ksearch_ray run --task trimul --model hosted_vllm/standin --api-base http://127.0.0.1:8000/v1 \
    $([ "${RAY:-0}" = 1 ] || echo --no-ray) --rounds "$ROUNDS" --max-wall-s "$WALL" --no-progress --run-dir "$RUN" > "$OUT/run.out" 2> "$OUT/run.err"
rc=$?
end=$(date +%s)
kill "$SERVER"
echo "ksearch run: exit $rc, $((end - start)) s wall"
python3 - "$RUN" <<'PY'
import sys
from pathlib import Path
from ksearch_ray.events import RunView
from ksearch_ray.store import RunStore
run = RunStore(Path(sys.argv[1]))
view = RunView.of(run.read_events())
rows = view.candidate_rows()
print("rounds", view.rounds_used, "candidate evaluations", view.evaluations, "status", view.status_counts())
print("evaluation seconds (candidates):", round(sum(r.seconds or 0 for r in rows), 1))
print("llm calls", len(view.llm_calls), "failed", view.llm_failed_calls)
best = view.best
print("best", best.solution_id if best else None, best.speedup if best else None, best.node if best else None, best.why if best else None)
seed = view.seed
print("seed speedup", seed.speedup if seed else None)
for gpu, c in view.confirms.items():
    print("confirm", gpu, c.verdict, c.best_speedup, c.over_seed)
print("finished", view.finished, "stopped", view.stopped, "active s", round(view.active_s, 1))
PY
grep -v "^\s*$" "$OUT/run.err" | tail -40
cat "$OUT/run.out"
tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
