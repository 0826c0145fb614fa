"""The OpenAI-compatible adapter against recorded quirk streams served over loopback HTTP."""

from __future__ import annotations

import json
import ssl

import pytest

from agenthost.runners.local_agent.errors import ErrorKind, ProviderError
from agenthost.runners.local_agent.messages import AssistantMessage, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.base import Final, ModelRequest, TextChunk, ToolSpec
from agenthost.runners.local_agent.providers.openai import OpenAICompatProvider
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    Reply,
    openai_error,
    openai_stream,
    openai_text,
    openai_tool_calls,
    sse,
)

KEY = "sk-test-SECRET-0123456789abcdef"
TOOLS = [ToolSpec("read_file", "read", {"type": "object", "properties": {"path": {"type": "string"}}})]


def req(*msgs) -> ModelRequest:  # type: ignore[no-untyped-def]
    return ModelRequest(system="sys", messages=list(msgs) or [UserMessage("hi")], tools=TOOLS)


async def run_stream(
    server: FakeProviderServer, reply: Reply, flavor: str = "openai", model: str = "m"
) -> tuple[str, Final]:
    server.push(reply)
    p = OpenAICompatProvider("openai", model, base_url=server.url + "/v1", api_key=KEY, timeout=5, flavor=flavor)
    try:
        text, final = "", None
        async for ev in p.stream(req()):
            if isinstance(ev, TextChunk):
                text += ev.text
            else:
                final = ev
        assert final is not None
        return text, final
    finally:
        await p.aclose()


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_text_stream_usage_and_request_shape() -> None:
    async with FakeProviderServer() as server:
        text, final = await run_stream(server, openai_text("Hello, world!", usage=(812, 41)))
        assert text == "Hello, world!" and final.finish_reason == "stop"
        assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (812, 41)
        sent = server.model_requests[0]
        assert sent.path == "/v1/chat/completions"
        assert sent.headers["authorization"] == f"Bearer {KEY}"
        body = sent.json()
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["messages"][0] == {"role": "system", "content": "sys"}
        assert body["tools"][0]["function"]["name"] == "read_file" and body["tool_choice"] == "auto"


async def test_split_arguments_openai_style() -> None:
    async with FakeProviderServer() as server:
        _, final = await run_stream(
            server,
            openai_tool_calls([("call_1", "read_file", {"path": "a.py"}), ("call_2", "read_file", {"path": "b.py"})]),
        )
        assert final.finish_reason == "tool_calls"
        assert [(c.id, json.loads(c.arguments)) for c in final.message.tool_calls] == [
            ("call_1", {"path": "a.py"}),
            ("call_2", {"path": "b.py"}),
        ]


async def test_ollama_whole_call_in_one_chunk_with_object_arguments_and_stop() -> None:
    chunks = [
        chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_x", "function": {"name": "read_file", "arguments": {"path": "z"}}}],
            }
        ),
        chunk({}, "stop"),  # wrong finish_reason with tool calls
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks), flavor="ollama")
        assert final.finish_reason == "tool_calls"
        assert [(c.id, c.name, json.loads(c.arguments)) for c in final.message.tool_calls] == [
            ("call_x", "read_file", {"path": "z"})
        ]


async def test_parallel_calls_all_index_zero_with_distinct_ids() -> None:
    chunks = [
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "read_file", "arguments": '{"path":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"1"}'}}]}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "b", "function": {"name": "read_file", "arguments": '{"path":"2"}'}}]}
        ),
        chunk({}, "tool_calls"),
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks))
        assert [(c.id, json.loads(c.arguments)["path"]) for c in final.message.tool_calls] == [("a", "1"), ("b", "2")]


async def test_missing_index_and_no_ids_and_merged_arguments() -> None:
    chunks = [
        chunk({"tool_calls": [{"function": {"name": "read_file", "arguments": '{"path":"a"}{"path":"b"}'}}]}),
        chunk({}, "tool_calls"),
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks))
        calls = final.message.tool_calls
        assert [json.loads(c.arguments)["path"] for c in calls] == ["a", "b"]
        assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


async def test_repeated_names_and_broken_json_are_repaired() -> None:
    chunks = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read_file", "arguments": '{"path": "x",'}}]}
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "read_file", "arguments": ' "n": [1, 2'}}]}),
        chunk({}, "tool_calls"),
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks))
        (c,) = final.message.tool_calls
        assert c.name == "read_file" and json.loads(c.arguments) == {"path": "x", "n": [1, 2]}


async def test_unrepairable_arguments_are_kept_for_the_loop_to_report() -> None:
    chunks = [
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read file!", "arguments": "path=x"}}]}),
        chunk({}, "length"),
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks))
        (c,) = final.message.tool_calls
        assert c.name == "read_file_" and c.arguments == "path=x" and final.finish_reason == "length"
        with pytest.raises(ValueError):
            c.parsed_arguments()


async def test_reasoning_content_captured_and_echoed_only_to_same_model() -> None:
    chunks = [
        chunk({"reasoning_content": "think "}),
        chunk({"reasoning_content": "more"}),
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read_file", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    ]
    async with FakeProviderServer() as server:
        _, final = await run_stream(server, openai_stream(chunks))
        assert final.message.reasoning == "think more" and final.message.model == "openai/m"
        same = OpenAICompatProvider("openai", "m", base_url=server.url, api_key=None, timeout=5)
        other = OpenAICompatProvider("openai", "other", base_url=server.url, api_key=None, timeout=5)
        history = [UserMessage("q"), final.message, ToolResult("c", "read_file", "r")]
        echoed = same.build_messages(ModelRequest("s", history))[2]
        assert echoed["reasoning_content"] == "think more" and echoed["content"] is None
        assert "reasoning_content" not in other.build_messages(ModelRequest("s", history))[2]
        assert other.build_messages(ModelRequest("s", history))[3] == {
            "role": "tool",
            "tool_call_id": "c",
            "content": "r",
        }
        await same.aclose()
        await other.aclose()


async def test_invalid_arguments_replay_as_empty_object() -> None:
    p = OpenAICompatProvider("openai", "m", base_url="http://127.0.0.1:9", api_key=None, timeout=1)
    msgs = p.build_messages(ModelRequest("", [AssistantMessage("", [ToolCall("c", "t", "garbage")])]))
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    await p.aclose()


async def test_non_streamed_json_body() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "plain",
                    "tool_calls": [
                        {"id": "q", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"p"}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    async with FakeProviderServer() as server:
        text, final = await run_stream(
            server, Reply(chunks=[json.dumps(body).encode()], content_type="application/json")
        )
        assert (
            text == "plain" and final.message.tool_calls[0].id == "q" and final.usage and final.usage.input_tokens == 5
        )


async def test_error_inside_200_stream_is_classified() -> None:
    reply = Reply(chunks=[sse({"error": {"message": "Overloaded", "type": "overloaded_error"}})])
    async with FakeProviderServer() as server:
        with pytest.raises(ProviderError) as ei:
            await run_stream(server, reply)
        assert ei.value.kind == ErrorKind.OVERLOADED and ei.value.retryable


async def test_stream_without_end_is_broken() -> None:
    async with FakeProviderServer() as server:
        with pytest.raises(ProviderError) as ei:
            await run_stream(server, openai_stream([chunk({"content": "par"})], done=False))
        assert ei.value.kind == ErrorKind.STREAM_BROKEN


async def test_dropped_connection_is_retryable_stream_error() -> None:
    reply = openai_text("abcdefghijklmnop", piece=2)
    reply.drop_after = 3
    async with FakeProviderServer() as server:
        with pytest.raises(ProviderError) as ei:
            await run_stream(server, reply)
        assert ei.value.retryable


async def test_http_errors_classified_and_key_redacted() -> None:
    async with FakeProviderServer() as server:
        with pytest.raises(ProviderError) as ei:
            await run_stream(server, openai_error(401, f"Incorrect API key provided: {KEY}"))
        assert ei.value.kind == ErrorKind.AUTH and KEY not in str(ei.value) and "[REDACTED]" in str(ei.value)
        with pytest.raises(ProviderError) as ei:
            await run_stream(server, openai_error(429, "rate", headers={"retry-after": "2"}))
        assert ei.value.kind == ErrorKind.RATE_LIMIT and ei.value.retry_after == 2


async def test_stream_options_rejected_then_dropped() -> None:
    async with FakeProviderServer() as server:
        server.push(openai_error(400, "Unrecognized request argument supplied: stream_options"))
        text, _ = await run_stream(server, openai_text("ok"))
        assert text == "ok"
        first, second = (r.json() for r in server.model_requests)
        assert "stream_options" in first and "stream_options" not in second


async def test_complete_consumes_the_same_stream() -> None:
    async with FakeProviderServer() as server:
        server.push(openai_text("whole answer"))
        p = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor="vllm")
        final = await p.complete(req())
        assert final.message.content == "whole answer"
        assert "authorization" not in server.model_requests[0].headers
        await p.aclose()


@pytest.mark.parametrize(
    ("flavor", "routes", "window"),
    [
        ("vllm", {"GET /v1/models": {"data": [{"id": "m", "max_model_len": 32768}]}}, 32768),
        (
            "llamacpp",
            {"GET /v1/models": {"data": [{"id": "m"}]}, "GET /props": {"default_generation_settings": {"n_ctx": 8192}}},
            8192,
        ),
        (
            "lmstudio",
            {
                "GET /v1/models": {"data": [{"id": "m"}]},
                "GET /api/v0/models/m": {"loaded_context_length": 16384, "max_context_length": 131072},
            },
            16384,
        ),
        (
            "ollama",
            {
                "GET /v1/models": {"data": [{"id": "m"}]},
                "GET /api/ps": {"models": [{"name": "m:latest", "context_length": 12288}]},
            },
            12288,
        ),
        (
            "ollama",
            {
                "GET /v1/models": {"data": [{"id": "m"}]},
                "GET /api/ps": {"models": []},
                "POST /api/show": {"parameters": "num_ctx 24576\nstop x"},
            },
            24576,
        ),
        (
            "ollama",
            {
                "GET /v1/models": {"data": [{"id": "m"}]},
                "GET /api/ps": {"models": []},
                "POST /api/show": {"parameters": ""},
            },
            None,
        ),
    ],
)
async def test_probe_reports_real_context_window(flavor: str, routes: dict, window: int | None) -> None:
    async with FakeProviderServer() as server:
        for route, body in routes.items():
            server.routes[route] = Reply(chunks=[json.dumps(body).encode()], content_type="application/json")
        p = OpenAICompatProvider(flavor, "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor=flavor)
        result = await p.probe()
        assert result.context_window == window
        if window is None:
            assert "num_ctx" in result.detail
        await p.aclose()


async def test_probe_auth_failure() -> None:
    async with FakeProviderServer() as server:
        server.routes["GET /v1/models"] = openai_error(401, "bad key")
        p = OpenAICompatProvider("openai", "gpt-4o", base_url=server.url + "/v1", api_key=KEY, timeout=5)
        with pytest.raises(ProviderError) as ei:
            await p.probe()
        assert ei.value.kind == ErrorKind.AUTH
        await p.aclose()


async def test_connection_is_reused_across_calls() -> None:
    async with FakeProviderServer() as server:
        server.push(openai_text("one"), openai_text("two"), openai_text("three"))
        p = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor="vllm")
        for _ in range(3):
            await p.complete(req())
        assert server.connections == 1
        await p.aclose()


def _trust(p: OpenAICompatProvider) -> tuple[int, ssl.VerifyMode, bool]:
    ctx = p._client._transport._pool._ssl_context  # type: ignore[attr-defined]  # httpx's pool, httpcore's context
    return ctx.cert_store_stats()["x509_ca"], ctx.verify_mode, ctx.check_hostname


async def test_a_plain_http_server_loads_no_trust_store_and_an_https_api_keeps_httpx_verification() -> None:
    """A local model server over http never opens TLS: its client loads no CA roots (~1 MiB a runner process holds,
    issue 26), and the context it has would refuse any certificate. An https API verifies against httpx's roots."""
    async with FakeProviderServer() as server:
        server.push(openai_text("over http"))
        local = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor="vllm")
        remote = OpenAICompatProvider("openai", "m", base_url="https://api.example.com/v1", api_key=KEY, timeout=5)
        try:
            assert (await local.complete(req())).message.content == "over http"
            assert _trust(local) == (0, ssl.CERT_REQUIRED, True)
            roots, mode, hostname = _trust(remote)
            assert roots > 0 and mode == ssl.CERT_REQUIRED and hostname
        finally:
            await local.aclose()
            await remote.aclose()


# Raw wire recordings (shape as captured from the servers; ids and text shortened). Kept as bytes so the SSE
# framing itself — CRLF endings, `data:` without a space, comment keep-alives — is what gets parsed.
LLAMACPP_RAW = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],'
    b'"created":1,"id":"chatcmpl-x","model":"qwen","object":"chat.completion.chunk"}\r\n\r\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"Need the file."}}]}\r\n\r\n'
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"abc",'
    b'"type":"function","function":{"name":"read_file","arguments":"{\\"pa"}}]}}]}\r\n\r\n'
    b": keep-alive comment\r\n\r\n"
    b'data:{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":"th\\": \\"x.md\\"}"}}]}}]}\r\n\r\n'
    b'data: {"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"usage":{"completion_tokens":9,'
    b'"prompt_tokens":311,"total_tokens":320},"timings":{"prompt_n":311,"predicted_n":9}}\r\n\r\n'
    b"data: [DONE]\r\n\r\n"
)
LMSTUDIO_RAW = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":"Hel"},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"},'
    b'"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
    b'"logprobs":null,"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


async def test_recorded_llamacpp_stream_with_crlf_and_reasoning() -> None:
    async with FakeProviderServer() as server:
        text, final = await run_stream(
            server, Reply(chunks=[LLAMACPP_RAW[i : i + 97] for i in range(0, len(LLAMACPP_RAW), 97)]), flavor="llamacpp"
        )
        assert text == "" and final.message.reasoning == "Need the file."
        (c,) = final.message.tool_calls
        assert (c.id, c.name, json.loads(c.arguments)) == ("abc", "read_file", {"path": "x.md"})
        assert final.usage is not None and final.usage.input_tokens == 311


async def test_recorded_lmstudio_stream_without_usage() -> None:
    async with FakeProviderServer() as server:
        text, final = await run_stream(server, Reply(chunks=[LMSTUDIO_RAW]), flavor="lmstudio")
        assert text == "Hello" and final.finish_reason == "stop" and final.usage is None


async def test_max_tokens_parameter_per_server_and_learned_from_rejection() -> None:
    async with FakeProviderServer() as server:
        server.push(
            openai_error(400, "Unsupported parameter: 'max_completion_tokens' is not supported with this model."),
            openai_text("ok"),
            openai_text("again"),
        )
        cloud = OpenAICompatProvider("openai", "gpt-4o", base_url=server.url + "/v1", api_key=KEY, timeout=5)
        await cloud.complete(req())
        await cloud.complete(req())
        first, second, third = (r.json() for r in server.model_requests)
        assert "max_completion_tokens" in first and "max_tokens" not in first
        assert "max_tokens" in second and "max_tokens" in third  # learned once, kept
        local = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5)
        assert "max_tokens" in local.build_payload(req())
        await cloud.aclose()
        await local.aclose()


async def test_unanswered_request_times_out_as_retryable() -> None:
    async with FakeProviderServer() as server:
        server.push(Reply(hang=True))
        p = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=0.3, flavor="vllm")
        with pytest.raises(ProviderError) as ei:
            await p.complete(req())
        assert ei.value.kind == ErrorKind.TIMEOUT and ei.value.retryable
        await p.aclose()
