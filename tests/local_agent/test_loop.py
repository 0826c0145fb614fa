"""The agent loop end to end inside one process: runner + FakeRunAPI + scripted provider over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agenthost.runners.local_agent import loop as loop_mod
from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.compaction import Compactor
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.loop import AgentLoop
from agenthost.runners.local_agent.messages import ToolResult, UserMessage
from agenthost.runners.local_agent.providers.openai import OpenAICompatProvider
from agenthost.runners.local_agent.session import Session
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    Reply,
    openai_error,
    openai_text,
    openai_tool_calls,
)
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolRegistry

from .helpers import kinds, new_runner, send, server_config, session_key, streamed_text, terminal


async def test_multi_turn_with_tool_call(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        cfg = server_config(server)
        ws = runner._workspace(LocalAgentConfig.parse(cfg), session_key(api))
        (ws / "notes.txt").write_text("the answer is 42\n")
        server.push(
            openai_tool_calls([("call_1", "read_file", {"path": "notes.txt"})], text="Checking."),
            openai_text("It says 42."),
        )
        evs = await send(runner, api, "what is in notes.txt?", cfg)
        assert kinds(evs) == [
            "text_delta",
            "usage",
            "message",
            "tool_started",
            "tool_finished",
            *["text_delta"] * 2,
            "usage",
            "message",
            "completed",
        ]
        finished = next(e.tool_finished for e in evs if e.WhichOneof("kind") == "tool_finished")
        assert "the answer is 42" in finished.result and not finished.is_error
        assert streamed_text(evs) == "Checking.It says 42."
        second = server.model_requests[1].json()["messages"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
        assert second[2]["tool_calls"][0]["id"] == "call_1" and second[3]["tool_call_id"] == "call_1"

        server.push(openai_text("You asked about notes."))
        evs = await send(runner, api, "what did I ask?", cfg)
        assert terminal(evs).completed.finish_reason == "stop"
        third = server.model_requests[2].json()["messages"]
        assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "user"]
    await runner.close()


async def test_failing_tool_is_information_not_failure(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(
            openai_tool_calls([("c1", "read_file", {"path": "../../etc/passwd"})]),
            openai_text("That path is outside my workspace."),
        )
        evs = await send(runner, api, "read /etc/passwd", server_config(server))
        finished = next(e.tool_finished for e in evs if e.WhichOneof("kind") == "tool_finished")
        assert finished.is_error and "outside the workspace" in finished.result
        assert terminal(evs).WhichOneof("kind") == "completed"
        tool_msg = server.model_requests[1].json()["messages"][-1]
        assert tool_msg["role"] == "tool" and "outside the workspace" in tool_msg["content"]
    await runner.close()


async def test_iteration_budget_ends_with_an_answer(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        for i in range(3):
            server.push(openai_tool_calls([(f"c{i}", "list_files", {})]))
        evs = await send(runner, api, "loop forever", server_config(server, max_iterations=2))
        reqs = [r.json() for r in server.model_requests]
        assert len(reqs) == 3
        assert [r["tool_choice"] for r in reqs] == ["auto", "auto", "none"]
        # The note follows the history; the system prompt (the head of the cached prefix) is unchanged.
        assert reqs[2]["messages"][0] == reqs[1]["messages"][0] and "tools are disabled" not in str(
            reqs[2]["messages"][0]
        )
        assert reqs[2]["messages"][-1]["role"] == "user" and "tools are disabled" in reqs[2]["messages"][-1]["content"]
        assert reqs[2]["messages"][:-1] == reqs[1]["messages"] + reqs[2]["messages"][len(reqs[1]["messages"]) : -1]
        assert terminal(evs).completed.finish_reason == "max_iterations"
        assert "stopped after 2" in [e.message.text for e in evs if e.WhichOneof("kind") == "message"][-1]
        # Even the ignored final call was closed with a result: history stays paired.
        session, _ = Session.load(tmp_path, session_key(api))
        assert session is not None
        pairing.check(session.messages)

        server.push(openai_text("Here is what I found."))
        evs = await send(runner, api, "ok", server_config(server, max_iterations=2))
        assert terminal(evs).completed.finish_reason == "stop"
    await runner.close()


async def test_retries_with_backoff_then_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    delays: list[float] = []
    monkeypatch.setattr(loop_mod, "backoff_delay", lambda attempt, ra=None: delays.append(ra or 0) or 0.01)
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(
            openai_error(429, "slow down", headers={"retry-after": "7"}),
            openai_error(503, "upstream"),
            Reply(chunks=[b"data: {not json"], content_type="text/event-stream"),
            openai_text("finally"),
        )
        evs = await send(runner, api, "hi", server_config(server))
        retries = [e.retry for e in evs if e.WhichOneof("kind") == "retry"]
        assert [r.attempt for r in retries] == [1, 2, 3]
        assert "rate_limit" in retries[0].reason and "server_error" in retries[1].reason
        assert delays[0] == 7  # Retry-After passed to the backoff
        assert streamed_text(evs) == "finally" and terminal(evs).WhichOneof("kind") == "completed"
    await runner.close()


async def test_retries_exhausted_and_auth_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_mod, "backoff_delay", lambda attempt, ra=None: 0.0)
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.default = openai_error(503, "down")
        evs = await send(runner, api, "hi", server_config(server, max_retries=2))
        t = terminal(evs).failed
        assert t.code == "provider_unavailable" and t.retryable and len(server.model_requests) == 3
        server.default = None
        server.push(openai_error(401, "bad key"))
        evs = await send(runner, api, "hi", server_config(server, max_retries=2))
        assert terminal(evs).failed.code == "provider_auth" and len(server.model_requests) == 4
        assert "retry" not in kinds(evs)
    await runner.close()


async def test_no_retry_once_text_was_emitted(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        broken = openai_text("partial answer that breaks", piece=4)
        broken.drop_after = 3
        server.push(broken, openai_text("should never be requested"))
        evs = await send(runner, api, "hi", server_config(server))
        failed = terminal(evs).failed
        assert failed.code == "provider_stream_interrupted" and failed.retryable
        assert len(server.model_requests) == 1 and "retry" not in kinds(evs)
        assert streamed_text(evs).startswith("part")
    await runner.close()


async def test_context_overflow_compacts_and_retries_once(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    overflow = openai_error(400, "This model's maximum context length is 32000 tokens", code="context_length_exceeded")
    async with FakeProviderServer() as server:
        cfg = server_config(server)
        for i in range(4):
            server.push(openai_text(f"answer {i} " + "w" * 2000))
            await send(runner, api, f"question {i} " + "q" * 2000, cfg)
        server.push(overflow, openai_text("summary of it all"), openai_text("after compaction"))
        evs = await send(runner, api, "one more", cfg)
        assert "compaction" in kinds(evs) and streamed_text(evs) == "after compaction"
        last = server.model_requests[-1].json()["messages"]
        assert "CONTEXT SUMMARY" in last[1]["content"] and last[-1]["content"] == "one more"
        server.push(overflow, openai_text("summary"), overflow)
        evs = await send(runner, api, "and again", cfg)
        assert terminal(evs).failed.code == "context_overflow"
    await runner.close()


async def test_cancellation_mid_stream_stops_at_once(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        slow = openai_text("x" * 400, piece=4)
        slow.delay = 0.05
        server.push(slow)
        server.default = openai_text("must not be requested")
        from agenthost.runners.local_agent.testing import make_run

        api.add_user("talk slowly", event_id="e1")
        run = make_run(api, "talk slowly", config=server_config(server), event_id="e1")
        got: list[Any] = []

        async def consume() -> None:
            async for ev in runner.run(run):
                got.append(ev)

        task = asyncio.create_task(consume())
        while not got:  # noqa: ASYNC110 — polling the consumer's list; pytest-timeout bounds it
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 0.5
        await asyncio.sleep(0.2)
        assert len(server.model_requests) == 1
        assert all(e.WhichOneof("kind") == "text_delta" for e in got)
        session, _ = Session.load(tmp_path, session_key(api))
        assert session is not None and [m.role for m in session.messages] == ["user"]
    await runner.close()


@pytest.mark.e2e
async def test_large_tool_result_becomes_an_artifact(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(openai_tool_calls([("c1", "shell", {"command": "seq 1 5000"})]), openai_text("done"))
        evs = await send(runner, api, "count", server_config(server, tool_result_max_chars=1000))
        created = [e.artifact_created.artifact for e in evs if e.WhichOneof("kind") == "artifact_created"]
        finished = next(e.tool_finished for e in evs if e.WhichOneof("kind") == "tool_finished")
        assert len(created) == 1 and finished.artifact_id == created[0].artifact_id
        full = api.artifacts[finished.artifact_id][0].decode()
        assert full.splitlines()[-1] == "5000" and len(full) > 20_000
        assert len(finished.result) < 1300 and finished.artifact_id in finished.result
        sent = server.model_requests[1].json()["messages"][-1]["content"]
        assert sent == finished.result
    await runner.close()


class Slow(Tool):
    name = "slow"
    description = "sleeps"
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"s": {"type": "number"}}}
    read_only = True
    running = 0
    peak = 0

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        Slow.running += 1
        Slow.peak = max(Slow.peak, Slow.running)
        await asyncio.sleep(args["s"])
        Slow.running -= 1
        return f"slept {args['s']}"


class Mark(Tool):
    name = "mark"
    description = "not read-only"
    parameters: ClassVar[dict[str, Any]] = {"type": "object"}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        assert Slow.running == 0  # never concurrent with anything
        return "marked"


async def test_read_only_calls_run_concurrently_results_in_declared_order(tmp_path: Path) -> None:
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(
            openai_tool_calls(
                [("a", "slow", {"s": 0.3}), ("b", "slow", {"s": 0.1}), ("c", "mark", {}), ("d", "slow", {"s": 0.05})]
            ),
            openai_text("ok"),
        )
        config = LocalAgentConfig(model="vllm/m", base_url=server.url + "/v1", context_window=32000)
        provider = OpenAICompatProvider("vllm", "m", base_url=server.url + "/v1", api_key=None, timeout=5)
        session = Session.create(tmp_path, "c1")
        ctx = ToolContext(workspace=tmp_path, api=api, conversation_id="c1", run_id="r", config=config)
        loop = AgentLoop(
            provider=provider,
            registry=ToolRegistry([Slow(), Mark()]),
            config=config,
            session=session,
            tool_ctx=ctx,
            system_prompt="s",
            compactor=Compactor(window=32000, watermark=0.7, keep_fraction=0.25, max_output_tokens=4096),
        )
        evs = [e async for e in loop.run(UserMessage("go"))]
        # a and b ran at once (the peak); no wall-clock bound: run one after the other they take 0.45 s, so a bound
        # proved no more than the peak does, and it failed on a loaded machine (0.77 s at load 20)
        assert Slow.peak == 2
        seq = [
            (e.WhichOneof("kind"), getattr(e, e.WhichOneof("kind")).tool_call_id)
            for e in evs
            if e.WhichOneof("kind") in ("tool_started", "tool_finished")
        ]
        assert seq == [
            ("tool_started", "a"),
            ("tool_started", "b"),
            ("tool_finished", "a"),
            ("tool_finished", "b"),
            ("tool_started", "c"),
            ("tool_finished", "c"),
            ("tool_started", "d"),
            ("tool_finished", "d"),
        ]
        assert [m.tool_call_id for m in session.messages if isinstance(m, ToolResult)] == ["a", "b", "c", "d"]
        sent = [m["tool_call_id"] for m in server.model_requests[1].json()["messages"] if m["role"] == "tool"]
        assert sent == ["a", "b", "c", "d"]
        await provider.aclose()


async def test_repeated_tool_call_ids_are_made_unique(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(
            openai_tool_calls([("call_0", "list_files", {})]),
            openai_tool_calls([("call_0", "list_files", {})]),
            openai_text("done"),
        )
        evs = await send(runner, api, "hi", server_config(server))
        ids = [e.tool_started.tool_call_id for e in evs if e.WhichOneof("kind") == "tool_started"]
        assert ids[0] == "call_0" and ids[1] != "call_0"
        last = server.model_requests[-1].json()["messages"]
        assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ids
    await runner.close()


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.e2e
async def test_key_never_leaks(tmp_path: Path) -> None:
    key = "sk-live-THIS-IS-SECRET-1234567890"
    runner = new_runner(tmp_path, env={"MY_PROVIDER_KEY": key})
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        cfg = server_config(server, api_key_env="MY_PROVIDER_KEY", tool_result_max_chars=500)
        server.push(
            openai_tool_calls([("c1", "shell", {"command": "env; echo $MY_PROVIDER_KEY; seq 1 300"})]),
            openai_text("ok"),
            openai_error(401, f"Incorrect API key provided: {key}"),
        )
        evs = await send(runner, api, "show env", cfg)
        evs += await send(runner, api, "again", cfg)
        assert server.model_requests[0].headers["authorization"] == f"Bearer {key}"
        assert evs[-1].failed.code == "provider_auth"
        blob = b"".join(e.SerializeToString() for e in evs)
        assert key.encode() not in blob
        assert all(key.encode() not in data for data, _ in api.artifacts.values())
        assert await asyncio.to_thread(files_containing, tmp_path, key.encode()) == []
        assert key not in repr(runner._providers)
    await runner.close()


async def test_non_streaming_delivery_gets_whole_messages_and_can_retry_a_broken_stream(tmp_path: Path) -> None:
    from agenthost.runners.local_agent.testing import make_run

    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        broken = openai_text("partial answer that breaks", piece=4)
        broken.drop_after = 3
        server.push(broken, openai_text("complete answer"))
        api.add_user("hi", event_id="e1")
        run = make_run(api, "hi", config=server_config(server), event_id="e1", streaming=False)
        with_retry = [ev async for ev in runner.run(run)]
        assert "text_delta" not in kinds(with_retry)
        assert [e.message.text for e in with_retry if e.WhichOneof("kind") == "message"] == ["complete answer"]
        assert kinds(with_retry).count("retry") == 1 and terminal(with_retry).WhichOneof("kind") == "completed"
    await runner.close()


async def test_empty_response_is_retried_once_then_reported(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(openai_text(""), openai_text("there you go"))
        evs = await send(runner, api, "hi", server_config(server))
        assert kinds(evs).count("retry") == 1 and streamed_text(evs) == "there you go"
        server.push(openai_text(""), openai_text(""))
        evs = await send(runner, api, "hi again", server_config(server))
        assert terminal(evs).completed.finish_reason == "empty_response"
        # Two empty answers are one retry, announced once (main printed "retry 1" twice).
        assert [e.retry.attempt for e in evs if e.WhichOneof("kind") == "retry"] == [1]
        assert "empty response" in [e.message.text for e in evs if e.WhichOneof("kind") == "message"][0]
        # Nothing empty was stored: the next request holds only real turns.
        server.push(openai_text("ok"))
        await send(runner, api, "third", server_config(server))
        msgs = server.model_requests[-1].json()["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "user"]
    await runner.close()


async def test_anthropic_tool_loop_replays_thinking_to_the_same_model(tmp_path: Path) -> None:
    from agenthost.runners.local_agent.testing import anthropic_text, anthropic_tool_use

    runner = new_runner(tmp_path, env={"ANTHROPIC_API_KEY": "sk-ant-test-0000000000000000000000"})
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        config = {"model": "anthropic/claude-test", "base_url": server.url, "thinking_budget": 2048}
        server.routes["GET /v1/models/claude-test"] = Reply(chunks=[b"{}"], content_type="application/json")
        server.push(
            anthropic_tool_use("toolu_1", "list_files", {}, text="Looking.", thinking=("plan", "SIG-1")),
            anthropic_text("Empty.", thinking=("done", "SIG-2")),
        )
        evs = await send(runner, api, "what is here?", config)
        assert terminal(evs).WhichOneof("kind") == "completed" and streamed_text(evs) == "Looking.Empty."
        second = server.model_requests[1].json()
        assert second["messages"][1]["content"][0] == {"type": "thinking", "thinking": "plan", "signature": "SIG-1"}
        assert second["messages"][2]["content"][0]["type"] == "tool_result"
        # A later switch to another model drops the signed blocks instead of failing the request.
        server.push(openai_text("switched"))
        await send(runner, api, "now you", server_config(server))
        msgs = server.model_requests[-1].json()["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert all("thinking" not in json.dumps(m) for m in msgs[2:])
    await runner.close()


async def test_answer_cut_by_the_output_limit_is_marked(tmp_path: Path) -> None:
    from agenthost.runners.local_agent.testing import openai_stream

    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        server.push(
            openai_stream(
                [
                    {"choices": [{"index": 0, "delta": {"content": "The first three steps are: one, two, thr"}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                ]
            )
        )
        cfg = server_config(server, max_output_tokens=64)
        evs = await send(runner, api, "list the steps", cfg)
        assert terminal(evs).completed.finish_reason == "length"  # the flag
        text = streamed_text(evs)
        assert text.startswith("The first three steps are: one, two, thr") and "cut off" in text and "64" in text
        (message,) = [e.message.text for e in evs if e.WhichOneof("kind") == "message"]
        assert message == text  # the recorded answer carries the notice too
        # The model's context keeps its own words only.
        server.push(openai_text("three."))
        await send(runner, api, "continue", cfg)
        msgs = server.model_requests[-1].json()["messages"]
        assert msgs[2] == {"role": "assistant", "content": "The first three steps are: one, two, thr"}
    await runner.close()


async def test_a_run_that_fails_before_any_reply_leaves_its_message_for_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_mod, "backoff_delay", lambda attempt, ra=None: 0.0)
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        cfg = server_config(server, max_retries=0)
        server.push(openai_text("hello there"))
        await send(runner, api, "hi", cfg)
        server.push(openai_error(503, "down"))
        evs = await send(runner, api, "what is 2+2?", cfg)
        failed = terminal(evs).failed
        assert failed.code == "provider_unavailable" and "not answered" in failed.message
        server.push(openai_text("4, and hello again"))
        await send(runner, api, "are you back?", cfg)
        msgs = server.model_requests[-1].json()["messages"]
        # Exactly once, in order: the unanswered message is in the next run's context, not dropped or doubled.
        assert [m["content"] for m in msgs if m["role"] == "user"] == ["hi", "what is 2+2?", "are you back?"]
    await runner.close()
