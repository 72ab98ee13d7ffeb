"""Servers' HTTP habits, through litellm's real HTTP client against loopback servers that know only HTTP.

Each habit server (`standin.wire`) gets its answers from an answer source upstream (a scripted server here;
the stand-in in the end-to-end runs) and changes only how they travel: a plain JSON body whatever `stream`
asks, an event stream without `[DONE]`, a 200 whose body is an error, a stream of reasoning that stops, a
cut stream, a refused `stream_options`, code fenced as `py`/`triton`/untagged, an unasked tool call. Each
test is one call (or two) through the LLM client, and says what the client must make of the habit.

At the end, two short searches of the toy task through the CLI, in a subprocess, on the CPU without Ray:
one against the worst habit (a server that ignores `stream`) evaluates candidates, and one against a server
whose every reply is unusable ends saying so, with its own exit status.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fake_llm_server import Completion, FakeLLMServer, always

from ksearch_ray.config import LLMConfig
from ksearch_ray.events import NoStream, RunView
from ksearch_ray.policies.llm.litellm_client import LiteLLMClient
from ksearch_ray.policies.llm.parsing import extract_code, read_plan
from ksearch_ray.policies.llm_call import LLMError, error_class
from ksearch_ray.policies.standin.wire import WireHabitServer
from ksearch_ray.store import RunStore

MESSAGES = [{"role": "user", "content": "Write the kernel."}]
CODE = "import torch\n\n\ndef run(x, y, alpha):\n    return alpha * x + y\n"
ANSWER = f"Fused it.\n\n```python\n{CODE}```\n"
REPO = Path(__file__).resolve().parent.parent


def config_for(api_base: str, **overrides: Any) -> LLMConfig:
    settings: dict[str, Any] = {"model": "hosted_vllm/habit", "api_base": api_base, "timeout_s": 10.0, "max_retries": 2,
                                "backoff_base_s": 0.01, "backoff_max_s": 0.05}
    return LLMConfig(**(settings | overrides))


def through(habit: str, *, calls: int = 1, text: str = ANSWER, **overrides: Any
            ) -> tuple[list[Any], LiteLLMClient, WireHabitServer]:
    """`calls` calls of one client through a habit server in front of a scripted answer source."""
    with FakeLLMServer(always(Completion(text, prompt_tokens=30, completion_tokens=20))) as upstream, \
            WireHabitServer(upstream.api_base, habit) as server:
        client = LiteLLMClient(config_for(server.api_base, **overrides))

        async def go() -> list[Any]:
            return [await client.complete("implement", MESSAGES) for _ in range(calls)]

        return asyncio.run(go()), client, server


def test_a_server_that_ignores_stream_is_read_once_unstreamed_and_streamed_to_no_more() -> None:
    replies, client, server = through("ignores_stream", calls=3)
    assert all(extract_code(r.text, "python") == {"kernel.py": CODE} for r in replies)
    first = replies[0].call
    # The plain JSON body: litellm reads it as a stream with no content; the same request goes once unstreamed.
    assert first.error is None and first.attempts == 2 and first.stream_fallback is not None
    assert "application/json" in first.stream_fallback
    assert first.prompt_tokens == 60  # both requests billed their prompt: the body's usage counted
    assert [bool(b.get("stream")) for b in server.requests] == [True, False, False, False]
    assert client.stream_off is not None
    assert [r.call.attempts for r in replies[1:]] == [1, 1] and not any(r.call.stream_fallback for r in replies[1:])


def test_an_event_stream_that_never_sends_done_is_read_to_its_finish_not_its_timeout() -> None:
    started = time.monotonic()
    [reply], client, _ = through("no_done", timeout_s=30.0)
    assert time.monotonic() - started < 8  # the server holds the stream open 30 s; the call ends at its finish
    assert reply.text == ANSWER and reply.call.streamed and reply.call.error is None
    # litellm keeps a stream's usage until the stream ends, which this one never does: the tokens are estimated.
    assert reply.call.tokens_estimated and reply.call.completion_tokens > 0 and client.stream_off is None


@pytest.mark.parametrize("stream", [True, False])
def test_an_http_200_whose_body_is_an_overloaded_error_is_an_outage_retried(stream: bool) -> None:
    [reply], _, server = through("error_200", stream=stream)
    assert reply.text == ANSWER and reply.call.attempts == 2 and len(server.requests) == 2
    # Not retried, it says what it was: the provider overloaded (litellm calls it a broken stream, or a 200 body
    # it cannot read).
    with FakeLLMServer(always(Completion(ANSWER))) as upstream, \
            WireHabitServer(upstream.api_base, "error_200") as server, pytest.raises(LLMError) as caught:
        asyncio.run(LiteLLMClient(config_for(server.api_base, stream=stream, max_retries=0)).complete("k", MESSAGES))
    assert caught.value.kind == "server" and error_class(caught.value.kind) == "transient"
    assert "overloaded" in caught.value.message


@pytest.mark.parametrize("stream", [True, False])
def test_an_http_200_whose_body_is_another_error_is_not_an_outage(stream: bool) -> None:
    body = {"error": {"message": "Invalid request: the prompt could not be tokenized", "code": 400}}
    with FakeLLMServer(always(Completion(ANSWER))) as upstream, \
            WireHabitServer(upstream.api_base, "error_200", error_body=body) as server, \
            pytest.raises(LLMError) as caught:
        asyncio.run(LiteLLMClient(config_for(server.api_base, stream=stream)).complete("implement", MESSAGES))
    assert error_class(caught.value.kind) != "transient" and caught.value.call is not None
    assert "tokenized" in caught.value.message and len(server.requests) == 1


def test_a_stream_of_reasoning_that_stops_without_a_finish_is_asked_again_and_read_from_the_reasoning() -> None:
    [reply], client, server = through("reasoning_only")
    assert extract_code(reply.text, "python") == {"kernel.py": CODE}
    assert reply.call.answer_from == "reasoning" and reply.call.error is None
    assert reply.call.stream_fallback is not None and "finish" in reply.call.stream_fallback
    assert [bool(b.get("stream")) for b in server.requests] == [True, False] and client.stream_off is not None


def test_a_stream_cut_mid_reply_is_not_an_outage_and_the_reply_comes_unstreamed() -> None:
    [reply], _, server = through("cut_stream")
    assert extract_code(reply.text, "python") == {"kernel.py": CODE}
    assert reply.call.stream_fallback is not None and reply.call.attempts == 2
    assert [bool(b.get("stream")) for b in server.requests] == [True, False]
    assert reply.call.tokens_estimated  # what the cut stream delivered is billed, estimated


def test_a_server_that_rejects_stream_options_is_sent_none_and_still_streams() -> None:
    replies, client, server = through("rejects_stream_options", calls=2)
    assert all(r.text == ANSWER for r in replies)
    assert replies[0].call.dropped_params == ["stream_options"] and client.refused == {"stream_options"}
    assert ["stream_options" in b for b in server.requests] == [True, False, False]
    assert all(b.get("stream") for b in server.requests) and client.stream_off is None


def test_code_fenced_as_py_triton_or_untagged_is_read() -> None:
    replies, _, server = through("fences", calls=3)
    fences = [r.text.split("\n")[2] for r in replies]
    assert fences == ["```py", "```triton", "```"]
    assert all(extract_code(r.text, "python") == {"kernel.py": CODE} for r in replies)


@pytest.mark.parametrize("stream", [True, False])
def test_an_unasked_tool_call_after_a_line_of_prose_is_read_as_the_reply(stream: bool) -> None:
    [reply], _, _ = through("tool_calls", stream=stream)
    assert reply.call.answer_from == "tool_call"
    assert extract_code(reply.text, "python") == {"kernel.py": CODE}
    plan = '```json\n{"ops": [{"op": "add_question", "text": "q"}]}\n```'
    [planned], _, _ = through("tool_calls", stream=stream, text=plan)
    assert read_plan(planned.text)[0] == [{"op": "add_question", "text": "q"}]


def test_a_body_that_does_not_parse_is_an_unusable_reply_not_an_outage() -> None:
    from fake_llm_server import Malformed

    with FakeLLMServer(always(Malformed())) as server, pytest.raises(LLMError) as caught:
        asyncio.run(LiteLLMClient(config_for(server.api_base, stream=False)).complete("implement", MESSAGES))
    assert caught.value.kind == "malformed_response" and error_class(caught.value.kind) == "unusable"
    assert len(server.chat_requests) == 1  # not retried as if the provider were down


# --- whole searches, through the CLI --------------------------------------------------------------------


def ksearch_run(api_base: str, run_dir: Path, *extra: str) -> Any:
    """`ksearch run` of the toy task on the CPU without Ray, in this process (typer's runner)."""
    from cli_runner import ksearch

    return ksearch(REPO, "run", "--task", "toy_axpy", "--task-dir", str(REPO / "tests" / "data"), "--device", "cpu",
                   "--no-ray", "--no-progress", "--model", "hosted_vllm/standin", "--api-base", api_base,
                   "--run-dir", str(run_dir), "--width", "1", "--rounds", "2", "--max-wall-s", "120",
                   "--outage-s", "20", "--noise-repeats", "1", "--confirm-repeats", "0", *extra)


@pytest.fixture
def quiet_standin():  # type: ignore[no-untyped-def]
    from ksearch_ray.policies.standin.habits import Habits
    from ksearch_ray.policies.standin.server import StandIn

    quiet = Habits(other_shape=0, prose_only=0, broken_json=0, coder_prose_only=0, code_drift=0, broken_code=0,
                   breakage_actions=0, risky_changes=0, missing_fields=0, rate_limit_every=0)
    with StandIn(habits=quiet) as standin:
        yield standin


def test_a_search_against_a_server_that_ignores_stream_evaluates_candidates_and_remembers_it(
        quiet_standin: Any, tmp_path: Path) -> None:
    from cli_runner import ksearch

    with WireHabitServer(quiet_standin.api_base, "ignores_stream") as server:
        done = ksearch_run(server.api_base, tmp_path / "run")
        assert done.returncode == 0, done.stderr[-2000:]
        view = RunView.of(RunStore.open(tmp_path / "run").read_events())
        assert view.evaluations >= 1 and view.rounds_used == 2
        assert sum(isinstance(e, NoStream) for e in view.events) == 1 and view.no_stream is not None
        assert (done.stdout + done.stderr).count("does not stream") == 1
        assert "the LLM provider is failing" not in done.stderr
        # A resumed run remembers it: not one streaming request, and nothing to learn again.
        before = len(server.requests)
        resumed = ksearch(REPO, "resume", str(tmp_path / "run"), "--rounds", "3", "--no-progress")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert len(server.requests) > before and not any(b.get("stream") for b in server.requests[before:])
        assert "does not stream" not in resumed.stderr


def test_a_search_whose_every_reply_is_unusable_ends_saying_so_with_its_own_exit_status(tmp_path: Path) -> None:
    from fake_llm_server import Malformed

    with FakeLLMServer(always(Malformed())) as server:
        done = ksearch_run(server.api_base, tmp_path / "run", "--from-solution", "triton_seed", "--no-stream")
        assert server.chat_requests and not any("stream" in r.body for r in server.chat_requests)  # --no-stream
    assert done.returncode == 4, (done.stdout[-1500:], done.stderr[-1500:])
    assert done.stdout.startswith("no candidate evaluated")  # the outcome's first line says why
    line = done.stdout.splitlines()[0]
    assert "none had usable code" in line and "could not be read" in line
    assert "the LLM provider is failing" not in done.stderr  # the endpoint answered: never called down
    events = RunStore.open(tmp_path / "run").read_events()
    kinds = {e.call.error_kind for e in events if e.kind == "llm_call"}  # type: ignore[union-attr]
    assert kinds == {"malformed_response"}
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["config"]["llm"]["stream"] is False
