"""Prompt-cache friendliness, end to end through the real host: every request of a conversation repeats the
previous request byte for byte at its start (between compactions), Anthropic gets its cache breakpoints, an
OpenAI-compatible server a per-conversation prompt_cache_key, and cache token counts reach the run's usage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agenthost.runners.local_agent.messages import AssistantMessage, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.anthropic import AnthropicProvider
from agenthost.runners.local_agent.providers.base import ModelRequest, ToolSpec, canonical_json
from agenthost.runners.local_agent.providers.openai import OpenAICompatProvider
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    anthropic_error,
    anthropic_stream,
    anthropic_text,
    cache_script,
    cacheable_prefix,
    openai_error,
    openai_stream,
    openai_text,
    openai_tool_calls,
    prefix_shares,
)
from agenthost.runners.sdk.testing import HostHarness
from tests.local_agent.helpers import new_runner, send, server_config

pytestmark = pytest.mark.timeout(120)

TARGET = 0.95


def config_for(provider: str, server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    if provider == "openai":
        base = {"model": "vllm/m", "base_url": server.url + "/v1"}
    else:
        base = {"model": "anthropic/claude-test", "base_url": server.url, "api_key": "sk-test"}
    return {**base, "context_window": 200_000, "max_retries": 0, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_twenty_turns_keep_a_byte_stable_prefix(tmp_path: Path, provider: str) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config_for(provider, server)) as h:
            for text, replies in cache_script(provider):  # type: ignore[arg-type]
                server.push(*replies)
                r = await h.send(text, conversation_id="cache")
                assert r.run.status == "completed", r.run.error_message
                finished = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
                assert not [f.result for f in finished if f.is_error]  # the tool turns really changed state
                assert not [e for e in r.events if e.WhichOneof("kind") == "compaction"]
        bodies = [q.json() for q in server.model_requests]
        # Canonical on the wire (sorted keys, fixed separators) and the tools in name order.
        assert all(q.body == canonical_json(q.json()) for q in server.model_requests)
    names = [t["name"] if provider == "anthropic" else t["function"]["name"] for t in bodies[0]["tools"]]
    assert names == sorted(names) and len(names) > 10
    assert len(bodies) == 20 + 8  # 20 answers + 8 tool steps
    shares = prefix_shares(bodies)
    assert min(shares) >= TARGET, [round(s, 4) for s in shares]
    # Append-only in fact, not just above the bar: memory and todo edits did not touch the system prompt.
    assert min(shares) == 1.0
    if provider == "anthropic":
        for body in bodies:
            marked = json.dumps(body).count('"cache_control"')
            assert marked == (4 if len(body["messages"]) >= 3 else 3)
            assert "cache_control" in body["tools"][-1] and "cache_control" in body["system"][-1]
            assert "cache_control" in body["messages"][-1]["content"][-1]
            if len(body["messages"]) >= 3:
                assert body["messages"][-3]["role"] == "user" and "cache_control" in body["messages"][-3]["content"][-1]
    else:
        keys = {body["prompt_cache_key"] for body in bodies}
        assert len(keys) == 1 and "cache" not in next(iter(keys)) and len(next(iter(keys))) == 32


def test_prefix_share_measures_the_first_difference() -> None:
    base = {"tools": [{"name": "a"}], "system": "s", "messages": [{"role": "user", "content": "hello"}]}
    grown = {**base, "messages": [*base["messages"], {"role": "assistant", "content": "hi"}]}
    assert prefix_shares([base, grown]) == [1.0]
    changed = {**grown, "system": "S"}  # a rewritten system prompt invalidates everything after the tools
    [share] = prefix_shares([grown, changed])
    assert share < 0.5
    moved_marker = {**base, "messages": [{"role": "user", "content": "hello", "cache_control": {"type": "x"}}]}
    assert cacheable_prefix(moved_marker) == cacheable_prefix(base)


async def test_anthropic_breakpoints_and_opt_out() -> None:
    tools = [ToolSpec("b_tool", "B", {"type": "object"}), ToolSpec("a_tool", "A", {"type": "object"})]
    messages: list[Any] = [
        UserMessage("hi"),
        AssistantMessage(content="", tool_calls=[ToolCall("t1", "a_tool", "{}")], model="anthropic/claude-test"),
        ToolResult("t1", "a_tool", "result"),
    ]
    provider = AnthropicProvider("anthropic", "claude-test", base_url="http://127.0.0.1:9", api_key=None, timeout=5)
    payload = provider.build_payload(ModelRequest(system="sys", messages=messages, tools=tools))
    assert payload["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in payload["tools"][0]
    assert payload["system"] == [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
    assert payload["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert payload["messages"][-3]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in json.dumps(payload["messages"][1])  # never on the assistant turn
    assert json.dumps(payload).count("cache_control") == 4
    # The tool specs the provider was given are not marked (the marker is per request, not per session).
    assert all("cache_control" not in t.parameters for t in tools)
    off = provider.build_payload(ModelRequest(system="sys", messages=messages, tools=tools, prompt_cache=False))
    assert "cache_control" not in json.dumps(off)
    await provider.aclose()


async def test_servers_rejecting_the_cache_fields_get_requests_without_them() -> None:
    request = ModelRequest(system="sys", messages=[UserMessage("hi")], cache_key="k" * 32)
    async with FakeProviderServer() as server:
        server.push(openai_error(400, "Unrecognized request argument supplied: prompt_cache_key"), openai_text("ok"))
        p = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor="vllm")
        assert (await p.complete(request)).message.content == "ok"
        first, second = (q.json() for q in server.model_requests)
        assert first["prompt_cache_key"] == "k" * 32 and "prompt_cache_key" not in second
        server.push(openai_text("again"))
        await p.complete(request)  # learned: not sent again
        assert "prompt_cache_key" not in server.model_requests[-1].json()
        await p.aclose()
    async with FakeProviderServer() as server:
        server.push(
            anthropic_error(400, "system.0.cache_control: Extra inputs are not permitted"), anthropic_text("ok")
        )
        a = AnthropicProvider("anthropic", "claude-test", base_url=server.url, api_key=None, timeout=5)
        assert (await a.complete(request)).message.content == "ok"
        first, second = (q.json() for q in server.model_requests)
        assert "cache_control" in json.dumps(first) and "cache_control" not in json.dumps(second)
        await a.aclose()
    async with FakeProviderServer() as server:
        # A 400 about something else is not retried.
        server.push(openai_error(400, "messages: bad role"))
        p = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5, flavor="vllm")
        with pytest.raises(Exception, match="bad role"):
            await p.complete(request)
        assert len(server.model_requests) == 1
        await p.aclose()


def test_cache_key_is_a_digest_per_conversation(tmp_path: Path) -> None:
    from agenthost.runners.local_agent.runner import prompt_cache_key
    from agenthost.runners.local_agent.testing import make_run

    api = FakeRunAPI()
    one = prompt_cache_key(make_run(api, "x", conversation_id="conv-secret", bot_id="bot-secret"))
    again = prompt_cache_key(make_run(api, "y", conversation_id="conv-secret", bot_id="bot-secret"))
    other_bot = prompt_cache_key(make_run(api, "x", conversation_id="conv-secret", bot_id="bot-2"))
    other_conv = prompt_cache_key(make_run(api, "x", conversation_id="conv-2", bot_id="bot-secret"))
    assert one == again and len({one, other_bot, other_conv}) == 3
    assert "secret" not in one and one != hashlib.sha256(b"conv-secret").hexdigest()[:32]


async def test_prompt_cache_false_sends_no_cache_fields(tmp_path: Path) -> None:
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        runner = new_runner(tmp_path)
        server.push(openai_text("hi"))
        await send(runner, api, "hello", server_config(server, prompt_cache=False))
        assert "prompt_cache_key" not in server.model_requests[-1].json()
        server.push(openai_text("hi"))
        await send(runner, api, "hello", server_config(server))
        assert len(server.model_requests[-1].json()["prompt_cache_key"]) == 32
        await runner.close()


async def test_cache_tokens_reach_the_run_usage(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config_for("openai", server)) as h:
            usage = {"prompt_tokens": 900, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 768}}
            server.push(
                openai_stream(
                    [
                        {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
                        {"choices": [], "usage": usage},
                    ]
                )
            )
            r = await h.send("hi", conversation_id="u")
            assert r.run.status == "completed", r.run.error_message
            # Cached tokens are part of the prompt (OpenAI counts them inside prompt_tokens).
            assert (r.run.usage.input_tokens, r.run.usage.cache_read_tokens) == (900, 768)
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path / "a", runners=[LocalAgentRunner], config=config_for("anthropic", server)) as h:
            start = {
                "message": {
                    "id": "m",
                    "role": "assistant",
                    "content": [],
                    "usage": {"input_tokens": 40, "cache_read_input_tokens": 1200, "cache_creation_input_tokens": 300},
                }
            }
            server.push(
                anthropic_stream(
                    [
                        ("message_start", start),
                        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
                        ("content_block_stop", {"index": 0}),
                        ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
                        ("message_stop", {}),
                    ]
                )
            )
            r = await h.send("hi", conversation_id="u")
            assert r.run.status == "completed", r.run.error_message
            u = r.run.usage
            # Anthropic reports the uncached part alone; the prompt is all three.
            assert (u.input_tokens, u.cache_read_tokens, u.cache_write_tokens) == (1540, 1200, 300)


async def test_system_prompt_frozen_per_session_refreshed_by_compaction(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = config_for("openai", server, context_window=32_000)
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            server.push(
                openai_tool_calls([("m1", "memory", {"action": "add", "target": "notes", "content": "Likes tea"})]),
                openai_text("Saved. " + "background " * 300),
            )
            assert (await h.send("remember I like tea", conversation_id="f")).run.status == "completed"
            server.push(
                openai_tool_calls([("k1", "compact", {})]),
                openai_text("SUMMARY: the user likes tea.", usage=None),  # the summary call
                openai_text("Compacted."),
            )
            r = await h.send("tidy up", conversation_id="f")
            assert r.run.status == "completed", r.run.error_message
            assert [e for e in r.events if e.WhichOneof("kind") == "compaction"]
        systems = [q.json()["messages"][0]["content"] for q in server.model_requests]
        # Requests 0-2 (before the compaction) share the start-of-session prompt; the summary call has its own;
        # the request after the compaction carries the re-rendered prompt with the memory saved meanwhile.
        assert systems[0] == systems[1] == systems[2] and "Likes tea" not in systems[0]
        assert "Likes tea" in systems[4] and systems[4] != systems[0]


async def test_frozen_prompt_survives_a_restart_and_follows_config_edits(tmp_path: Path) -> None:
    api = FakeRunAPI()
    await api.state_set("conversation", "local_agent.todos", [{"content": "first", "status": "in_progress"}])
    async with FakeProviderServer() as server:
        runner = new_runner(tmp_path)
        server.push(openai_text("one"))
        state = {"conversation": {"local_agent.todos": [{"content": "first", "status": "in_progress"}]}}
        await send(runner, api, "a", server_config(server), state=state)
        first = server.model_requests[-1].json()["messages"][0]["content"]
        await runner.close()
        # A new runner process, state changed meanwhile: the session file's prompt is sent again, byte for byte.
        runner = new_runner(tmp_path)
        server.push(openai_text("two"))
        changed = {"conversation": {"local_agent.todos": [{"content": "second", "status": "in_progress"}]}}
        await send(runner, api, "b", server_config(server), state=changed)
        assert server.model_requests[-1].json()["messages"][0]["content"] == first
        # A binding edit is not state: the prompt is rendered again.
        server.push(openai_text("three"))
        await send(runner, api, "c", server_config(server, system_prompt="You are terse."), state=changed)
        edited = server.model_requests[-1].json()["messages"][0]["content"]
        assert edited.startswith("You are terse.") and "second" in edited
        await runner.close()


async def test_a_shared_conversation_never_shows_one_actors_memory_to_another(tmp_path: Path) -> None:
    """Freezing must not outlive the actor: memory is per person, and in a group conversation the prompt frozen
    for one member would otherwise carry their profile into runs answering the others."""
    from agenthost.protos import common_pb2 as pb

    ada = pb.Actor(actor_type="user", actor_id="ada")
    bob = pb.Actor(actor_type="user", actor_id="bob")
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config_for("openai", server)) as h:
            server.push(
                openai_tool_calls([("m1", "memory", {"action": "add", "target": "profile", "content": "Ada, nurse"})]),
                openai_text("Saved."),
            )
            r = await h.send("I am Ada, a nurse", conversation_id="ada-private", actor=ada)
            assert r.run.status == "completed", r.run.error_message
            server.push(openai_text("Hello Ada."), openai_text("Hello Bob."), openai_text("Hello again Ada."))
            for text, actor in [("hi all", ada), ("hi, I'm Bob", bob), ("back", ada)]:
                r = await h.send(text, conversation_id="group", actor=actor)
                assert r.run.status == "completed", r.run.error_message
        systems = [q.json()["messages"][0]["content"] for q in server.model_requests[2:]]
    assert "Ada, nurse" in systems[0]  # the group session started with Ada's prompt…
    assert "Ada, nurse" not in systems[1], "Bob's run was shown Ada's profile"  # …which Bob's run must not reuse
    assert "Ada, nurse" in systems[2]
