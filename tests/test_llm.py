"""The LLM layer through litellm's real HTTP client, against a scripted server on loopback.

Also covers reply parsing and prompt rendering, which need no server.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_llm_server import Completion, FakeLLMServer, HTTPError, Malformed, RateLimited, always

from ksearch_ray.config import LLMConfig
from ksearch_ray.policies.llm.litellm_client import LiteLLMClient
from ksearch_ray.policies.llm.parsing import ParseError, extract_code, extract_ops
from ksearch_ray.policies.llm.prompting import CALL_KINDS, PromptError, format_sources, render
from ksearch_ray.policies.llm.reply_cache import ResponseCache
from ksearch_ray.policies.llm_call import LLMError

MESSAGES = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Write one."}]
KEY_ENV = "KSEARCH_TEST_LLM_KEY"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-dummy")


def config_for(server: FakeLLMServer | str, **overrides: Any) -> LLMConfig:
    api_base = server if isinstance(server, str) else server.api_base
    settings: dict[str, Any] = {
        "model": "openai/fake-model",
        "api_base": api_base,
        "api_key_env": KEY_ENV,
        # Generous: a loopback reply is instant, but a loaded 2-worker CI machine once took more than 5 s to
        # make the first call (litellm's first use), and the retry found no scripted reply left.
        "timeout_s": 30.0,
        "max_retries": 3,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
    }
    return LLMConfig(**(settings | overrides))


def complete(client: LiteLLMClient, messages: list[dict[str, Any]] = MESSAGES, kind: str = "test"):
    return asyncio.run(client.complete(kind, messages))


def complete_error(client: LiteLLMClient, messages: list[dict[str, Any]] = MESSAGES) -> LLMError:
    with pytest.raises(LLMError) as caught:
        complete(client, messages)
    return caught.value


# --- replies and retries ---------------------------------------------------------------------


def test_normal_reply_records_text_and_usage_tokens() -> None:
    with FakeLLMServer([Completion("hello kernel", prompt_tokens=11, completion_tokens=7)]) as server:
        reply = complete(LiteLLMClient(config_for(server)), kind="generate_from_spec")

    assert reply.text == "hello kernel"
    call = reply.call
    assert (call.kind, call.model) == ("generate_from_spec", "openai/fake-model")
    assert (call.prompt_tokens, call.completion_tokens) == (11, 7)
    assert (call.attempts, call.cached, call.error, call.finish_reason) == (1, False, None, "stop")
    assert (call.cost_usd, call.cost_known) == (0.0, False)  # no price for an unknown model
    assert len(call.request_hash) == 64
    [request] = server.chat_requests
    assert request.body["model"] == "fake-model"
    assert request.body["messages"] == MESSAGES
    assert request.headers["authorization"] == "Bearer sk-test-dummy"


def test_known_model_is_priced_from_the_local_cost_map() -> None:
    with FakeLLMServer([Completion("x", prompt_tokens=1000, completion_tokens=1000)]) as server:
        reply = complete(LiteLLMClient(config_for(server, model="openai/gpt-4o")))
    assert reply.call.cost_known and reply.call.cost_usd > 0


def test_rate_limit_then_success_is_retried_with_backoff() -> None:
    with FakeLLMServer([RateLimited(retry_after_s=0), Completion("ok")]) as server:
        started = time.monotonic()
        reply = complete(LiteLLMClient(config_for(server, backoff_base_s=0.1, backoff_max_s=1.0)))
        elapsed = time.monotonic() - started

    assert reply.text == "ok"
    assert reply.call.attempts == 2 == len(server.chat_requests)
    assert elapsed >= 0.05  # the jittered first wait is at least half of backoff_base_s


def test_retry_after_header_is_honoured_up_to_the_backoff_cap() -> None:
    with FakeLLMServer([RateLimited(retry_after_s=0.3), Completion("ok")]) as server:
        reply = complete(LiteLLMClient(config_for(server, backoff_base_s=0.01, backoff_max_s=1.0)))
    first, second = server.chat_requests
    assert reply.call.attempts == 2
    assert second.received_at - first.received_at >= 0.28


def test_two_server_errors_then_success_takes_three_attempts() -> None:
    with FakeLLMServer([HTTPError(500), HTTPError(503), Completion("third time")]) as server:
        reply = complete(LiteLLMClient(config_for(server)))
    assert reply.text == "third time"
    assert reply.call.attempts == 3 == len(server.chat_requests)


def test_persistent_server_error_gives_up_after_max_retries(tmp_path: Path) -> None:
    with FakeLLMServer(always(HTTPError(500, "overloaded"))) as server:
        error = complete_error(LiteLLMClient(config_for(server, max_retries=2)))

    assert error.retryable and error.kind == "server" and error.status_code == 500
    assert len(server.chat_requests) == 3  # one try + max_retries
    assert error.call is not None and error.call.attempts == 3
    assert (
        error.call.error is not None
        and error.call.error.startswith("server:")
        and "\n" not in error.call.error
    )
    assert error.call.error_kind == "server"


def test_unauthorized_is_not_retried() -> None:
    with FakeLLMServer(always(HTTPError(401, "invalid api key"))) as server:
        error = complete_error(LiteLLMClient(config_for(server)))
    assert not error.retryable and error.kind == "auth" and error.status_code == 401
    assert len(server.chat_requests) == 1


def test_bad_request_is_not_retried() -> None:
    with FakeLLMServer(always(HTTPError(400, "context too long"))) as server:
        error = complete_error(LiteLLMClient(config_for(server)))
    assert not error.retryable and error.kind == "bad_request"
    assert len(server.chat_requests) == 1


def test_slow_reply_times_out_after_the_timeout_not_the_sleep() -> None:
    with FakeLLMServer([Completion("too late", delay_s=10)]) as server:
        client = LiteLLMClient(config_for(server, timeout_s=0.5, max_retries=0))
        started = time.monotonic()
        error = complete_error(client)
        elapsed = time.monotonic() - started

    assert error.kind == "timeout" and error.retryable
    assert 0.45 <= elapsed < 2.0
    assert error.call is not None and error.call.attempts == 1


def test_malformed_body_is_an_unusable_reply_not_retried() -> None:
    # The provider answered, in a way that cannot be read: one failed call, not an outage to wait out.
    with FakeLLMServer([Malformed(), Completion("fine")]) as server:
        error = complete_error(LiteLLMClient(config_for(server, stream=False)))
    assert error.kind == "malformed_response" and not error.retryable and len(server.chat_requests) == 1


def test_refused_connection_is_retryable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = complete_error(LiteLLMClient(config_for(f"http://127.0.0.1:{port}/v1", max_retries=1)))
    assert error.kind == "connection" and error.retryable
    assert error.call is not None and error.call.attempts == 2


def test_unset_key_variable_fails_before_any_request() -> None:
    with FakeLLMServer([Completion("never")]) as server:
        error = complete_error(LiteLLMClient(config_for(server, api_key_env="KSEARCH_TEST_UNSET_VARIABLE")))
    assert error.kind == "auth" and not error.retryable and "KSEARCH_TEST_UNSET_VARIABLE" in error.message
    assert server.chat_requests == [] and error.call is not None and error.call.attempts == 0


def test_missing_provider_key_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    # litellm itself would report this as InternalServerError(500), which looks retryable.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeLLMServer([Completion("never")]) as server:
        error = complete_error(LiteLLMClient(config_for(server, api_key_env=None)))
    assert error.kind == "auth" and not error.retryable and "OPENAI_API_KEY" in error.message
    assert server.chat_requests == []


def test_local_server_provider_needs_no_key() -> None:
    with FakeLLMServer([Completion("local")]) as server:
        reply = complete(
            LiteLLMClient(config_for(server, model="hosted_vllm/Qwen/Qwen3-8B", api_key_env=None))
        )
    assert reply.text == "local" and not reply.call.cost_known


def test_reasoning_effort_is_sent_only_to_models_that_take_it() -> None:
    with FakeLLMServer(always(Completion("ok"))) as server:
        complete(LiteLLMClient(config_for(server, model="openai/gpt-4o", reasoning_effort="high")))
        complete(
            LiteLLMClient(config_for(server, model="hosted_vllm/Qwen/Qwen3-8B", reasoning_effort="high"))
        )
    gpt4o, vllm = (request.body for request in server.chat_requests)
    assert "reasoning_effort" not in gpt4o
    assert vllm["reasoning_effort"] == "high"


def test_concurrency_is_bounded_by_the_semaphore() -> None:
    async def five_at_once(client: LiteLLMClient) -> None:
        await asyncio.gather(*(client.complete("test", MESSAGES) for _ in range(5)))

    with FakeLLMServer(always(Completion("ok", delay_s=0.2))) as server:
        started = time.monotonic()
        asyncio.run(five_at_once(LiteLLMClient(config_for(server, concurrency=2))))
        elapsed = time.monotonic() - started
    assert len(server.chat_requests) == 5
    assert elapsed >= 0.55  # three waves of 0.2 s, not one


def test_fake_server_lists_models_and_serves_chat_without_the_v1_prefix() -> None:
    with FakeLLMServer([Completion("no prefix")]) as server:
        with urllib.request.urlopen(f"{server.api_base}/models", timeout=5) as response:
            assert json.load(response)["data"][0]["id"] == "fake-model"
        reply = complete(LiteLLMClient(config_for(f"http://127.0.0.1:{server.port}")))
    assert reply.text == "no prefix"
    assert [r.path for r in server.requests] == ["/v1/models", "/chat/completions"]


# --- response cache --------------------------------------------------------------------------


def test_cache_hit_makes_no_request_and_replays_identical_text(tmp_path: Path) -> None:
    with FakeLLMServer([Completion("the kernel", prompt_tokens=500, completion_tokens=800)]) as server:
        config = config_for(server, model="openai/gpt-4o")
        first = complete(LiteLLMClient(config, cache=ResponseCache(tmp_path / "cache")))
        assert len(server.chat_requests) == 1

        # A fresh client, as in a replayed run: same directory, new process state.
        replay = complete(LiteLLMClient(config, cache=ResponseCache(tmp_path / "cache")))
        assert len(server.chat_requests) == 1

    assert replay.text == first.text == "the kernel"
    assert replay.call.cached and replay.call.attempts == 0
    assert replay.call.cost_usd == 0.0 and replay.call.original_cost_usd == first.call.cost_usd > 0
    assert (replay.call.prompt_tokens, replay.call.completion_tokens) == (500, 800)
    assert replay.call.request_hash == first.call.request_hash


def test_repeating_a_request_draws_a_new_sample_and_replays_in_order(tmp_path: Path) -> None:
    with FakeLLMServer([Completion("sample A"), Completion("sample B")]) as server:
        client = LiteLLMClient(config_for(server), cache=ResponseCache(tmp_path))
        texts = [complete(client).text, complete(client).text]
        replayer = LiteLLMClient(config_for(server), cache=ResponseCache(tmp_path))
        replayed = [complete(replayer), complete(replayer)]
        assert len(server.chat_requests) == 2

    assert texts == ["sample A", "sample B"]
    assert [r.text for r in replayed] == texts
    assert [r.call.sample for r in replayed] == [0, 1]


def test_cache_key_includes_parameters_that_change_the_reply(tmp_path: Path) -> None:
    with FakeLLMServer(always(Completion("ok"))) as server:
        complete(LiteLLMClient(config_for(server, temperature=0.2), cache=ResponseCache(tmp_path)))
        complete(LiteLLMClient(config_for(server, temperature=0.9), cache=ResponseCache(tmp_path)))
        # Timeouts and retry settings do not change the reply, so they share an entry.
        complete(
            LiteLLMClient(config_for(server, temperature=0.2, timeout_s=9), cache=ResponseCache(tmp_path))
        )
    assert len(server.chat_requests) == 2


def test_failed_calls_are_not_cached(tmp_path: Path) -> None:
    with FakeLLMServer([HTTPError(400), Completion("ok")]) as server:
        complete_error(LiteLLMClient(config_for(server), cache=ResponseCache(tmp_path)))
        reply = complete(LiteLLMClient(config_for(server), cache=ResponseCache(tmp_path)))
    assert reply.text == "ok" and not reply.call.cached


# --- parsing code ------------------------------------------------------------------------------


def test_extract_code_takes_the_python_block_after_prose_with_crlf() -> None:
    reply = "Here is my plan.\r\nIt tiles the loop.\r\n\r\n```python\r\nimport torch\r\n\r\ndef run(x):\r\n    return x\r\n```\r\nDone."
    assert extract_code(reply, "python") == {"kernel.py": "import torch\n\ndef run(x):\n    return x\n"}


def test_extract_code_accepts_an_untagged_block_and_a_default_name() -> None:
    reply = "Sure:\n```\nimport triton\n```\n"
    assert extract_code(reply, "triton", default_name="solution.py") == {"solution.py": "import triton\n"}


def test_extract_code_skips_a_trailing_usage_snippet_but_prefers_a_revision() -> None:
    module = "import torch\n" + "x = 1\n" * 20
    revised = "import torch\n" + "y = 2\n" * 18
    reply = f"```python\n{module}```\nBetter:\n```python\n{revised}```\nUsage:\n```python\nrun(x)\n```\n"
    assert extract_code(reply, "python") == {"kernel.py": revised}


def test_extract_code_reads_multi_file_cuda_with_several_marker_styles() -> None:
    reply = (
        "Two files.\n\n### file: kernel.cu\n```cuda\n__global__ void k() {}\n```\n\n"
        "// file: binding.cpp\n```cpp\n#include <torch/extension.h>\n```\n\n"
        "```cuda\n// file: util.cuh\n#pragma once\n```\n"
        "```cu helpers.cu\nint h;\n```\n"
    )
    files = extract_code(reply, "cuda")
    assert files == {
        "kernel.cu": "__global__ void k() {}\n",
        "binding.cpp": "#include <torch/extension.h>\n",
        "util.cuh": "// file: util.cuh\n#pragma once\n",
        "helpers.cu": "int h;\n",
    }


def test_extract_code_round_trips_format_sources() -> None:
    sources = {"kernel.cu": 'const char* s = "```";\n', "main.cpp": "int main() {}\n"}
    assert extract_code(format_sources(sources), "cuda") == sources


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            "I think tiling would help here, but I am not sure.",
            "no ```python block in the reply (got 50 chars of prose)",
        ),
        ("```json\n[]\n```", "no ```python block in the reply (got 14 chars with 1 fenced block(s): json)"),
        ("```python\nimport torch\ndef run(x):\n", "unclosed"),
        ("### file: ../evil.py\n```python\nimport os\n```", "not a flat relative name"),
        ("```python\n\n```", "no ```python block"),
    ],
)
def test_extract_code_refuses_unusable_replies_with_a_one_line_reason(reply: str, reason: str) -> None:
    with pytest.raises(ParseError) as caught:
        extract_code(reply, "python")
    assert reason in str(caught.value) and "\n" not in str(caught.value)


# --- parsing ops -------------------------------------------------------------------------------

INSERT = {
    "op": "insert",
    "parent": "root",
    "title": "Tile",
    "difficulty": 2,
    "score": 0.5,
    "expected_speedup": 1.2,
}


def test_extract_ops_reads_the_last_json_block() -> None:
    reply = f"Draft:\n```json\n[]\n```\nFinal:\n```json\n{json.dumps([INSERT])}\n```\n"
    assert extract_ops(reply) == [INSERT]


def test_extract_ops_accepts_a_bare_array_and_an_ops_object() -> None:
    assert extract_ops(f"My edits: {json.dumps([INSERT])} -- that is all [1].") == [INSERT]
    assert extract_ops("```json\n" + json.dumps({"ops": [INSERT]}) + "\n```") == [INSERT]
    assert extract_ops("No change needed: []") == []


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            '```json\n[{"op": "insert",}]\n```',
            "not valid JSON: Expecting property name enclosed in double quotes at line 1",
        ),
        ('```json\n[{"parent": "root"}]\n```', 'op #0 is not an object with a string "op" field'),
        ('```json\n{"verdict": "fine"}\n```', "expected a JSON array of ops"),
        ("I would add tiling.", "no ```json block and no JSON array of ops"),
        ('```json\n[{"op": "insert", "parent": "ro', "unclosed"),
    ],
)
def test_extract_ops_refuses_unusable_replies_with_a_one_line_reason(reply: str, reason: str) -> None:
    with pytest.raises(ParseError) as caught:
        extract_ops(reply)
    assert reason in str(caught.value) and "\n" not in str(caught.value)


# --- prompts -----------------------------------------------------------------------------------

ALL_FIELDS = {
    "task": "TASK-SPEC",
    "hardware": "H200",
    "language": "triton",
    "seed": "none",
    "max_actions": 4,
    "tree": "TREE-VIEW",
    "node": "NODE-VIEW",
    "outcome": "predicted 1.3x, measured 1.1x",
    "code": format_sources({"kernel.py": "import triton\n"}),
    "attempts": "attempt 1: COMPILE_ERROR",
    "action": "Tile the loop",
    "interface": "custom_kernel(data) in kernel.py",
    "inspirations": "INSPIRATIONS",
    "base_code": format_sources({"kernel.py": "import torch\n"}),
    "base_result": "1.0 ms",
    "status": "INCORRECT_NUMERICAL",
    "log": "max abs error 0.3",
    "result": "0.8 ms",
    "history": "attempt 1: PASSED 1.1x",
    "kind": "refine",
    "noise": "±3%",
    "world_model": "WORLD-MODEL-VIEW",
    "measurement": "MEASUREMENT-FACTS",
    "remarks": "",
    "profile": "",
    "failure": "FAILED-ATTEMPT",
    "failure_section": "",
    "passed_code": format_sources({"kernel.py": "import torch  # passed\n"}),
    "reference": "REFERENCE-CODE",
    "knowledge": "KERNEL-SUMMARY",
    "evidence": "attempt 1: COMPILE_ERROR",
}
PLANNER_KINDS = {"initialize_tree", "propose_actions", "refine", "too_hard"}


@pytest.mark.parametrize("kind", CALL_KINDS)
def test_every_call_kind_renders_and_states_its_output_format(kind: str) -> None:
    messages = render(kind, **ALL_FIELDS)
    assert [m["role"] for m in messages] == ["system", "user"]
    text = "\n".join(m["content"] for m in messages)
    assert "TASK-SPEC" in text
    placeholders = "|".join([*ALL_FIELDS, "ops_format", "code_format"])
    assert not re.search(rf"\$(?:{placeholders})\b", text)
    assert "<!--" not in text  # the template's documentation header is not sent
    if kind in PLANNER_KINDS:
        assert "```json" in text and '"op": "insert"' in text
    else:
        assert "```python" in text


def test_cuda_prompts_ask_for_file_headers() -> None:
    text = render("generate_from_spec", **(ALL_FIELDS | {"language": "cuda"}))[1]["content"]
    assert "### file: kernel.cu" in text


def test_the_ops_example_in_the_prompt_parses() -> None:
    user = render("too_hard", **ALL_FIELDS)[1]["content"]
    ops = extract_ops(user)
    assert [op["op"] for op in ops] == ["insert", "insert", "add_hypothesis"] and ops[1]["parent"] == "$tiles"


def test_missing_field_names_the_field() -> None:
    fields = {k: v for k, v in ALL_FIELDS.items() if k != "interface"}
    with pytest.raises(PromptError, match=r"debug\.md needs field\(s\) interface"):
        render("debug", **fields)


def test_unknown_kind_is_a_prompt_error() -> None:
    with pytest.raises(PromptError, match="no prompt template 'nonsense.md'"):
        render("nonsense", **ALL_FIELDS)


def test_override_directory_wins_for_same_named_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "debug.md").write_text(
        "<!-- system -->\nCustom system.\n<!-- user -->\nFix $action; it costs $$5.\n$code_format\n"
    )
    (tmp_path / "_code_format_python.md").write_text("ONE PYTHON BLOCK PLEASE")
    messages = render("debug", prompts_dir=tmp_path, **ALL_FIELDS)
    assert messages == [
        {"role": "system", "content": "Custom system.\n"},
        {"role": "user", "content": "Fix Tile the loop; it costs $5.\nONE PYTHON BLOCK PLEASE\n"},
    ]
    # Through the environment variable, and only for the files the directory has.
    monkeypatch.setenv("KSEARCH_PROMPTS_DIR", str(tmp_path))
    assert render("debug", **ALL_FIELDS)[0]["content"] == "Custom system.\n"
    assert "planner" in render("refine", **ALL_FIELDS)[0]["content"]


# --- planner replies through the policy ----------------------------------------------------------


def _plan_request():  # type: ignore[no-untyped-def]
    from ksearch_ray.policies.contract import PlanRequest
    from ksearch_ray.taskspec.task import find_task
    from ksearch_ray.worldmodel.tree import new_tree

    task = find_task("toy_axpy", [str(Path(__file__).parent / "data")])
    return PlanRequest(kind="initialize_tree", task=task.definition, tree=new_tree("toy_axpy"), hardware="cpu",
                       language="triton", node_id="root")


def test_structured_output_is_asked_for_and_a_provider_refusing_it_is_asked_again_without() -> None:
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy
    from ksearch_ray.policies.llm_call import fatal_error

    ops = [{"op": "add_question", "text": "which tunable matters?"}]
    script = [HTTPError(400, "response_format json_schema is not supported by this model"),
              Completion(json.dumps({"ops": ops}))]
    with FakeLLMServer(script) as server:
        policy = LLMPolicy(config_for(server, structured_output="on"))
        reply = asyncio.run(policy.plan(_plan_request()))
        first, second = (r.body for r in server.chat_requests)
    assert first["response_format"]["type"] == "json_schema" and "response_format" not in second
    assert reply.ops == ops and reply.error is None
    # One call of two requests, the refused parameter dropped for the model and said in the record.
    [call] = reply.calls
    assert call.attempts == 2 and call.dropped_params == ["response_format"] and not fatal_error(call)


def test_an_unusable_planner_reply_is_asked_again_once_with_the_reasons() -> None:
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy

    script = [Completion('```json\n[{"op": "update", "node": "n99", "score": 0.5}]\n```'),
              Completion('```json\n[{"op": "add_question", "text": "q"}]\n```')]
    with FakeLLMServer(script) as server:
        reply = asyncio.run(LLMPolicy(config_for(server, structured_output="off")).plan(_plan_request()))
        followup = server.chat_requests[1].body["messages"]
    assert reply.ops == [{"op": "add_question", "text": "q"}] and len(reply.calls) == 2
    assert followup[-2]["role"] == "assistant" and "no node n99 in the tree" in followup[-1]["content"]
    assert any("asked again" in note for note in reply.notes)


# --- providers as they are ------------------------------------------------------------------------


def test_replies_stream_and_the_usage_of_the_stream_is_counted() -> None:
    with FakeLLMServer([Completion("streamed kernel", prompt_tokens=21, completion_tokens=9)]) as server:
        reply = complete(LiteLLMClient(config_for(server)))
    [request] = server.chat_requests
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}
    assert reply.text == "streamed kernel" and reply.call.streamed
    assert (reply.call.prompt_tokens, reply.call.completion_tokens, reply.call.tokens_estimated) == (21, 9, False)


def test_without_streaming_the_reply_comes_whole() -> None:
    with FakeLLMServer([Completion("whole")]) as server:
        reply = complete(LiteLLMClient(config_for(server, stream=False)))
    assert "stream" not in server.chat_requests[0].body and reply.text == "whole" and not reply.call.streamed


@pytest.mark.parametrize("stream", [True, False])
def test_a_reply_with_content_null_is_read_from_its_reasoning(stream: bool) -> None:
    step = Completion(None, reasoning="Thinking... the answer:\n```python\ndef run(x):\n    return x\n```")
    with FakeLLMServer([step]) as server:
        reply = complete(LiteLLMClient(config_for(server, stream=stream)))
    assert "def run(x)" in reply.text and reply.call.answer_from == "reasoning" and reply.call.reasoning_chars > 0


def test_with_content_the_reasoning_is_kept_apart() -> None:
    with FakeLLMServer([Completion("the answer", reasoning="long thoughts")]) as server:
        reply = complete(LiteLLMClient(config_for(server)))
    assert reply.text == "the answer" and reply.call.answer_from == "content" and reply.call.reasoning_chars == 13


@pytest.mark.parametrize("stream", [True, False])
def test_a_reply_that_is_only_a_tool_call_is_read_from_its_arguments(stream: bool) -> None:
    arguments = json.dumps({"explanation": "fused", "code": "def run(x):\n    return x\n"})
    with FakeLLMServer([Completion(None, tool_arguments=arguments)]) as server:
        reply = complete(LiteLLMClient(config_for(server, stream=stream)))
    assert reply.call.answer_from == "tool_call"
    assert extract_code(reply.text, "python") == {"kernel.py": "def run(x):\n    return x\n"}


def test_a_stream_cut_part_way_is_asked_again_unstreamed_and_what_it_delivered_is_billed() -> None:
    script = [Completion("a long reply that never ends", cut_after_chunks=3), Completion("ok", prompt_tokens=4,
                                                                                       completion_tokens=1)]
    with FakeLLMServer(script) as server:
        reply = complete(LiteLLMClient(config_for(server)))
    assert reply.text == "ok" and reply.call.attempts == 2 and len(server.chat_requests) == 2
    assert "stream" not in server.chat_requests[1].body and reply.call.stream_fallback is not None
    # The cut attempt's prompt and the characters it delivered are estimated into the same record.
    assert reply.call.tokens_estimated and reply.call.prompt_tokens > 4 and reply.call.completion_tokens > 1


def test_a_temperature_the_model_refuses_is_dropped_for_that_model_and_the_call_sent_again() -> None:
    refusal = HTTPError(400, "Unsupported value: 'temperature' does not support 0.2 with this model. "
                             "Only the default (1) value is supported.")
    with FakeLLMServer([refusal, Completion("first"), Completion("second")]) as server:
        client = LiteLLMClient(config_for(server, temperature=0.2))
        first, second = complete(client), complete(client)
    bodies = [r.body for r in server.chat_requests]
    assert bodies[0]["temperature"] == 0.2 and "temperature" not in bodies[1] and "temperature" not in bodies[2]
    assert first.text == "first" and first.call.attempts == 2 and first.call.dropped_params == ["temperature"]
    assert second.call.attempts == 1 and second.call.dropped_params == []


def test_a_refused_max_tokens_is_sent_as_max_completion_tokens() -> None:
    refusal = HTTPError(400, "Unsupported parameter: 'max_tokens' is not supported with this model. "
                             "Use 'max_completion_tokens' instead.")
    with FakeLLMServer([refusal, Completion("ok")]) as server:
        reply = complete(LiteLLMClient(config_for(server, model="hosted_vllm/reasoner", max_tokens=900)))
    first, second = (r.body for r in server.chat_requests)
    assert first["max_tokens"] == 900 and "max_tokens" not in second and second["max_completion_tokens"] == 900
    assert reply.text == "ok"


@pytest.mark.parametrize(("step", "kind"), [
    (HTTPError(400, "Your request was rejected as a result of our safety system."), "content_policy"),
    (HTTPError(400, "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens."),
     "context_window"),
    (HTTPError(429, "You exceeded your current quota, please check your plan and billing details."), "quota"),
    (HTTPError(404, "The model `nope` does not exist."), "not_found"),
    (HTTPError(422, "messages.0: field required"), "bad_request"),
])
def test_refusals_are_sorted_by_what_they_refuse_and_none_is_retried(step: HTTPError, kind: str) -> None:
    from ksearch_ray.policies.llm_call import error_class

    with FakeLLMServer(always(step)) as server:
        error = complete_error(LiteLLMClient(config_for(server)))
    assert error.kind == kind and not error.retryable and len(server.chat_requests) == 1
    assert error_class(kind) == ("fatal" if kind in ("quota", "not_found") else "rejected")


def test_concurrent_calls_that_all_meet_a_refused_parameter_each_send_it_again_without() -> None:
    refusal = HTTPError(400, "Unsupported value: 'temperature' does not support 0.2 with this model.")

    def script(request):  # type: ignore[no-untyped-def]
        return refusal if "temperature" in request.body else Completion("ok", delay_s=0.05)

    async def four(client: LiteLLMClient) -> list:  # type: ignore[type-arg]
        return await asyncio.gather(*(client.complete("test", [{"role": "user", "content": f"q{i}"}]) for i in range(4)))

    with FakeLLMServer(script) as server:
        replies = asyncio.run(four(LiteLLMClient(config_for(server, temperature=0.2))))
    assert [r.text for r in replies] == ["ok"] * 4
    assert all(r.call.dropped_params == ["temperature"] for r in replies if r.call.attempts == 2)


def test_a_400_on_a_structured_call_falls_back_for_that_call_only() -> None:
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy

    ops = [{"op": "add_question", "text": "q"}]
    script = [HTTPError(400, "invalid request"), Completion(json.dumps({"ops": ops})),
              Completion(json.dumps({"ops": ops}))]
    with FakeLLMServer(script) as server:
        policy = LLMPolicy(config_for(server, structured_output="on"))
        first = asyncio.run(policy.plan(_plan_request()))
        second = asyncio.run(policy.plan(_plan_request()))
        bodies = [r.body for r in server.chat_requests]
    assert first.ops == ops and second.ops == ops
    assert "response_format" in bodies[0] and "response_format" not in bodies[1]
    assert "response_format" in bodies[2]  # the next call asks for the schema again


def test_an_empty_reply_is_asked_again_without_an_empty_assistant_message() -> None:
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy

    script = [Completion(""), Completion('```json\n{"ops": [{"op": "add_question", "text": "q"}]}\n```')]
    with FakeLLMServer(script) as server:
        reply = asyncio.run(LLMPolicy(config_for(server, structured_output="off")).plan(_plan_request()))
        followup = server.chat_requests[1].body["messages"]
    assert reply.ops == [{"op": "add_question", "text": "q"}]
    assert all(m["content"] for m in followup) and followup[-1]["role"] == "user"
    assert "Your reply was empty" in followup[-1]["content"]


def test_coder_prompts_keep_the_budget_by_giving_way_in_order() -> None:
    from ksearch_ray.models import Solution
    from ksearch_ray.policies.contract import Attempt, CodeRequest
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy
    from ksearch_ray.policies.llm_call import LLMCall, LLMReply
    from ksearch_ray.taskspec.task import find_task
    from ksearch_ray.worldmodel.tree import new_tree

    class Recorder:
        messages: list = []  # type: ignore[type-arg]

        async def complete(self, kind, messages, *, response_format=None):  # type: ignore[no-untyped-def]
            Recorder.messages = messages
            return LLMReply(text="```python\ndef run(x, a, b):\n    return a * x + b\n```",
                            call=LLMCall(kind=kind, model="m", request_hash="h"))

        def context_tokens(self):  # type: ignore[no-untyped-def]
            return None

    task = find_task("toy_axpy", [str(Path(__file__).parent / "data")])
    big = Solution(name="big", task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
                   sources={"k.py": "def run(x, a, b):\n    return a * x + b\n" + "# filler\n" * 3000})
    history = [Attempt(round=i, kind="improve", error="no code " + "x" * 200) for i in range(1, 40)]
    request = CodeRequest(kind="improve", task=task.definition, tree=new_tree("toy_axpy"), node_id="root", hardware="cpu",
                          language="triton", current=big, base=big, history=history, prompt_budget_tokens=3_000)
    asyncio.run(LLMPolicy(LLMConfig(model="hosted_vllm/m"), client=Recorder()).code(request))
    text = "".join(m["content"] for m in Recorder.messages)
    assert len(text) <= 3_000 * 3 + 500, len(text)  # within the budget, give or take the floors
    assert "def run(x, a, b)" in text and "characters cut to fit the prompt budget" in text
