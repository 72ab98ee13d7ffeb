"""The LLM path end to end: real Ray actors, litellm's real HTTP client, a scripted server on
loopback, real sandboxed evaluations of the kernels it returns."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fake_llm_server import Completion, FakeLLMServer, HTTPError, Malformed, RateLimited, RecordedRequest
from local_backends import settings

from ksearch_ray.models import Status
from ksearch_ray.session import start
from ksearch_ray.store import RunStore
from ksearch_ray.worldmodel.tree import NodeStatus

DATA = Path(__file__).parent / "data"

GOOD = "```python\ndef run(x, a, b):\n    return a * x + b\n```"
GOOD_FUSED = "```python\nimport torch\n\ndef run(x, a, b):\n    return torch.addcmul(torch.full_like(x, b), a, x)\n```"
SYNTAX = "```python\ndef run(x, a, b)\n    return a * x + b\n```"
WRONG = "```python\ndef run(x, a, b):\n    return a * x - b\n```"
CRASH = "```python\nimport os\n\ndef run(x, a, b):\n    os.abort()\n```"
HANG = "```python\ndef run(x, a, b):\n    while True:\n        pass\n```"
PROSE = "I would fuse the multiply and the add, but I will not show the code."

PLAN_INIT = """Three ideas.
```json
[
 {"op": "insert", "parent": "root", "title": "fuse multiply-add", "description": "use addcmul", "difficulty": 1, "score": 0.9, "expected_speedup": 1.2, "rationale": "one kernel", "ref": "a"},
 {"op": "insert", "parent": "root", "title": "vectorize", "description": "wider loads", "difficulty": 2, "score": 0.7, "expected_speedup": 1.1, "rationale": "bandwidth"},
 {"op": "insert", "parent": "root", "title": "bad op", "difficulty": 9, "score": 2, "expected_speedup": 1.1},
 {"op": "insert", "parent": "$a", "title": "in-place output", "description": "reuse buffer", "difficulty": 2, "score": 0.5, "expected_speedup": 1.05, "rationale": "fewer allocs"}
]
```"""


class Script:
    """Planner calls get ops; coder calls take the next scripted reply (a 500 once exhausted).

    After the first plan the planner adds nothing, except when asked for more actions: then it
    proposes one. Which cycle draws which scripted coder reply depends on timing, and so does
    whether both first actions end too hard before the budget is spent; an empty answer there
    would end the run early (rightly: ksearch.NO_MORE_ACTIONS), and this test is about the round budget.
    """

    def __init__(self, coder_steps):
        self.coder_steps = list(coder_steps)
        self.lock = threading.Lock()
        self.planner_calls = 0
        self.extra = 0

    def __call__(self, request: RecordedRequest):
        text = " ".join(m["content"] for m in request.body["messages"])
        with self.lock:
            if "Output format: edit ops" in text:
                self.planner_calls += 1
                if self.planner_calls == 1:
                    reply = PLAN_INIT
                elif "Call: propose_actions" in text:
                    reply = ('One more idea.\n```json\n[{"op": "insert", "parent": "root", "title": "another try '
                             f'{self.planner_calls}", "description": "again", "difficulty": 1, "score": 0.5, '
                             '"expected_speedup": 1.05, "rationale": "more rounds"}]\n```')
                else:
                    reply = "Nothing to add.\n```json\n[]\n```"
                return Completion(reply, prompt_tokens=100, completion_tokens=40)
            if self.coder_steps:
                return self.coder_steps.pop(0)
            self.extra += 1  # the script's steps are spent: more working code, each reply its own
            return Completion(GOOD.replace("def run", f"# reply {self.extra}\ndef run"), prompt_tokens=200,
                              completion_tokens=30)


@pytest.mark.slow
def test_llm_search_survives_buggy_kernels_llm_errors_and_malformed_replies(ray_session, tmp_path, capsys):
    script = Script([
        RateLimited(retry_after_s=0), Completion(GOOD, prompt_tokens=200, completion_tokens=30),
        HTTPError(500), Completion(SYNTAX, prompt_tokens=200, completion_tokens=30),
        Completion(PROSE, prompt_tokens=200, completion_tokens=20),
        Completion(WRONG, prompt_tokens=200, completion_tokens=30),
        Completion(CRASH, prompt_tokens=200, completion_tokens=30),
        Completion(HANG, prompt_tokens=200, completion_tokens=30),
        Malformed(),
        Completion(GOOD_FUSED, prompt_tokens=200, completion_tokens=30, delay_s=1.5),
    ])
    with FakeLLMServer(script) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/fake-coder", api_base=server.api_base,
            width=2, rounds=9, stagnation_window=3, device="cpu", evaluator_gpus=True,
            max_retries=0, backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=20, limits={"idle": 3},
            run_dir=str(tmp_path / "run"), progress=False,
        )
        search = start(config, progress=False)
        run_dir, state = search.store.root, search.view
        http_requests = len(server.chat_requests)

    assert state.finished == "rounds"
    assert state.rounds_used == 9
    # The actors' own log lines go to the run directory (coder.log), never into the output; the output says
    # in one plain line that the provider failed and the run waited (no Ray worker prefix, no colour codes).
    output = capsys.readouterr()
    assert (run_dir / "coder.log").is_file() and (run_dir / "planner.log").is_file()
    assert "(PolicyActor pid=" not in output.out + output.err and "\x1b[" not in output.err
    assert "Traceback" not in output.err
    assert any(line.count("the LLM provider is failing (rate_limit") == 1 for line in output.err.splitlines())
    assert output.err.count("the LLM endpoint does not stream") == 1
    events = RunStore(run_dir).read_events()
    evaluations = [e for e in events if e.kind == "evaluation"]
    statuses = {Status(e.result.status) for e in evaluations}
    assert {Status.PASSED, Status.COMPILE_ERROR, Status.INCORRECT_NUMERICAL, Status.CRASHED, Status.TIMEOUT} <= statuses
    candidates = [e for e in events if e.kind == "candidate"]
    assert len(candidates) == 9
    errors = [c.error for c in candidates if c.error]
    assert any("unparseable coder reply" in e for e in errors)  # the prose reply: a round, the model's answer
    # The 429 and the 500 were the provider's failures: in the ledger, asked again, no round.
    assert not any("LLM call failed" in e for e in errors)
    failed = {e.call.error_kind for e in events if e.kind == "llm_call" and e.call.error}
    assert {"rate_limit", "server"} <= failed
    # The body that did not parse came to a streaming request: read as a server that does not stream, asked
    # again unstreamed at once (no round, no outage), and said once.
    assert [e.kind for e in events].count("no_stream") == 1
    assert any(e.call.stream_fallback for e in events if e.kind == "llm_call" and e.call.error is None)
    # Each candidate's round number is counted once.
    assert sorted(c.round for c in candidates) == list(range(1, 10))

    # The tree: the invalid planner op was rejected, the rest applied; every done node holds a
    # passing solution and every too-hard node says why.
    assert state.tree is not None
    titles = {n.title for n in state.tree.nodes.values()}
    assert {"fuse multiply-add", "vectorize", "in-place output"} <= titles and "bad op" not in titles
    for node in state.tree.nodes.values():
        if node.status is NodeStatus.DONE:
            assert node.solution is not None and node.solution.evaluation.status is Status.PASSED
        if node.status is NodeStatus.TOO_HARD:
            assert node.notes and "no passing attempt" in node.notes[-1].text

    # The ledger adds up: every HTTP request is an attempt of some logged call, and the tokens
    # logged are exactly those the server reported for the replies that came back.
    calls = [e.call for e in events if e.kind == "llm_call"]
    assert sum(c.attempts for c in calls) == http_requests
    coder_ok = [c for c in calls if c.error is None and c.kind not in ("initialize_tree", "propose_actions", "refine", "too_hard")]
    assert sum(c.prompt_tokens for c in coder_ok) == 200 * len(coder_ok)
    assert state.llm_call_count == len(calls) and not state.llm_calls  # (the live view counts; the log holds them)
    assert sum(row["calls"] for row in state.llm_ledger.values()) == len(calls)
    assert all(c.cost_usd == 0.0 and not c.cost_known for c in calls)  # a local model has no price
    best = json.loads((run_dir / "best.json").read_text()) if state.best else None
    if best:
        assert best["policy"] == "llm: hosted_vllm/fake-coder"
    # `ksearch show` reads the same log: the ledger per call kind adds up to the calls made.
    from rich.console import Console

    from ksearch_ray.report.console import print_run
    from ksearch_ray.report.run_tables import Run

    console = Console(record=True, width=200)
    print_run(console, Run.load(run_dir))
    shown = console.export_text()
    assert "LLM ledger" in shown and "initialize_tree" in shown and "llm: hosted_vllm/fake-coder" in shown
    table = shown[shown.index("LLM ledger"):]
    counts = [int(line.split("│")[3]) for line in table.splitlines() if line.count("│") >= 7 and line.split("│")[3].strip().isdigit()]
    assert sum(counts) == len(calls)
