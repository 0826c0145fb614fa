"""The Anthropic Messages adapter against recorded SSE streams served over loopback HTTP."""

from __future__ import annotations

import json

import pytest

from agenthost.runners.local_agent.errors import ErrorKind, ProviderError
from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.anthropic import AnthropicProvider
from agenthost.runners.local_agent.providers.base import Final, ModelRequest, TextChunk, ToolSpec
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    Reply,
    anthropic_stream,
    anthropic_text,
    anthropic_tool_use,
    openai_error,
    sse,
)

KEY = "sk-ant-test-SECRET-abcdefghijklmnop"
TOOLS = [ToolSpec("read_file", "read", {"type": "object", "properties": {"path": {"type": "string"}}})]


def provider(server: FakeProviderServer, model: str = "claude-test", **kw) -> AnthropicProvider:  # type: ignore[no-untyped-def]
    return AnthropicProvider("anthropic", model, base_url=server.url, api_key=KEY, timeout=5, **kw)


async def consume(p: AnthropicProvider, request: ModelRequest) -> tuple[str, Final]:
    text, final = "", None
    async for ev in p.stream(request):
        if isinstance(ev, TextChunk):
            text += ev.text
        else:
            final = ev
    assert final is not None
    return text, final


async def test_text_with_thinking_and_request_shape() -> None:
    async with FakeProviderServer() as server:
        server.push(anthropic_text("Hi there", input_tokens=50, thinking=("let me think", "SIG123")))
        p = provider(server, thinking_budget=2048)
        text, final = await consume(p, ModelRequest("be nice", [UserMessage("hello")], tools=TOOLS))
        assert text == "Hi there" and final.finish_reason == "stop"
        assert final.message.thinking == [{"type": "thinking", "thinking": "let me think", "signature": "SIG123"}]
        sent = server.model_requests[0]
        assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == KEY
        assert sent.headers["anthropic-version"] == "2023-06-01"
        body = sent.json()
        assert body["system"][0]["text"] == "be nice"
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048} and body["max_tokens"] > 2048
        assert "temperature" not in body
        assert body["tools"][0]["input_schema"]["type"] == "object" and body["tool_choice"] == {"type": "auto"}
        await p.aclose()


async def test_tool_use_with_partial_json_and_usage_including_cache() -> None:
    async with FakeProviderServer() as server:
        server.push(anthropic_tool_use("toolu_1", "read_file", {"path": "a.py"}, text="Let me look"))
        p = provider(server)
        text, final = await consume(p, ModelRequest("", [UserMessage("x")], tools=TOOLS))
        assert text == "Let me look" and final.finish_reason == "tool_calls"
        (c,) = final.message.tool_calls
        assert (c.id, c.name, json.loads(c.arguments)) == ("toolu_1", "read_file", {"path": "a.py"})
        assert final.usage and final.usage.input_tokens == 120 and final.usage.output_tokens == 20
        await p.aclose()


async def test_error_event_inside_200_stream() -> None:
    events = [
        ("message_start", {"message": {"usage": {"input_tokens": 1}}}),
        ("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]
    async with FakeProviderServer() as server:
        server.push(anthropic_stream(events))
        p = provider(server)
        with pytest.raises(ProviderError) as ei:
            await consume(p, ModelRequest("", [UserMessage("x")]))
        assert ei.value.kind == ErrorKind.OVERLOADED and ei.value.retryable
        await p.aclose()


async def test_ping_and_missing_message_stop() -> None:
    async with FakeProviderServer() as server:
        reply = anthropic_text("abc")
        reply.chunks.insert(1, sse({"type": "ping"}, event="ping"))
        reply.chunks = reply.chunks[:-1]  # no message_stop: the stream was cut
        server.push(reply)
        p = provider(server)
        with pytest.raises(ProviderError) as ei:
            await consume(p, ModelRequest("", [UserMessage("x")]))
        assert ei.value.kind == ErrorKind.STREAM_BROKEN
        await p.aclose()


async def test_http_errors() -> None:
    async with FakeProviderServer() as server:
        server.push(openai_error(401, f"invalid x-api-key {KEY}", code="authentication_error"))
        server.push(
            Reply(
                status=400,
                content_type="application/json",
                chunks=[
                    json.dumps(
                        {
                            "type": "error",
                            "error": {
                                "type": "invalid_request_error",
                                "message": "prompt is too long: 250000 tokens > 200000 maximum",
                            },
                        }
                    ).encode()
                ],
            )
        )
        p = provider(server)
        with pytest.raises(ProviderError) as ei:
            await consume(p, ModelRequest("", [UserMessage("x")]))
        assert ei.value.kind == ErrorKind.AUTH and KEY not in str(ei.value)
        with pytest.raises(ProviderError) as ei:
            await consume(p, ModelRequest("", [UserMessage("x")]))
        assert ei.value.kind == ErrorKind.CONTEXT_OVERFLOW
        await p.aclose()


def test_thinking_replayed_verbatim_for_same_model_and_dropped_for_another() -> None:
    thinking = [{"type": "thinking", "thinking": "t", "signature": "S"}, {"type": "redacted_thinking", "data": "R"}]
    turn = AssistantMessage(
        "", [ToolCall("toolu_1", "read_file", '{"path":"a"}')], model="anthropic/claude-a", thinking=thinking
    )
    history = [UserMessage("q"), turn, ToolResult("toolu_1", "read_file", "body", is_error=True), UserMessage("more")]
    same = AnthropicProvider("anthropic", "claude-a", base_url="http://127.0.0.1:9", api_key=None, timeout=1)
    other = AnthropicProvider("anthropic", "claude-b", base_url="http://127.0.0.1:9", api_key=None, timeout=1)
    msgs = same.build_messages(ModelRequest("", history))
    assert msgs[1]["content"][:2] == thinking
    assert msgs[1]["content"][2] == {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
    # Tool result and the following user text share one user turn, results first.
    assert [b["type"] for b in msgs[2]["content"]] == ["tool_result", "text"]
    assert msgs[2]["content"][0]["is_error"] is True
    other_msgs = other.build_messages(ModelRequest("", history))
    assert [b["type"] for b in other_msgs[1]["content"]] == ["tool_use"]


def test_summary_first_and_leading_assistant_get_a_user_turn() -> None:
    p = AnthropicProvider("anthropic", "claude-a", base_url="http://127.0.0.1:9", api_key=None, timeout=1)
    msgs = p.build_messages(ModelRequest("", [Summary("earlier stuff"), UserMessage("next")]))
    assert len(msgs) == 1 and msgs[0]["role"] == "user" and "earlier stuff" in msgs[0]["content"][0]["text"]
    msgs = p.build_messages(ModelRequest("", [AssistantMessage("hello")]))
    assert msgs[0]["role"] == "user" and msgs[1]["role"] == "assistant"


async def test_probe_uses_published_window_for_claude() -> None:
    async with FakeProviderServer() as server:
        server.routes["GET /v1/models/claude-x"] = Reply(chunks=[b'{"id":"claude-x"}'], content_type="application/json")
        p = provider(server, model="claude-x")
        assert (await p.probe()).context_window == 200_000
        await p.aclose()


async def test_connection_is_reused_across_calls() -> None:
    async with FakeProviderServer() as server:
        server.push(anthropic_text("one"), anthropic_text("two"))
        p = provider(server)
        for _ in range(2):
            await p.complete(ModelRequest("", [UserMessage("x")]))
        assert server.connections == 1
        await p.aclose()
