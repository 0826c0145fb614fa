"""The local agent's `task` tool end to end: real host → SDK server → LocalAgentRunner → scripted model server.

The subagent runs on a fresh context (asserted on the model request bodies), with its type's tools only, and is
recorded by the host as a child run of the parent run; cancellation and the deadline of the parent reach it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.subagents import SUBAGENT_RULES
from agenthost.runners.local_agent.testing import FakeProviderServer, Reply, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

READER = {
    "name": "reader",
    "description": "Reads files.",
    "instructions": "You read files and report what they say.",
    "tools": ["read_file", "list_files"],
    "max_turns": 3,
}


def cfg(server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": "vllm/m",
        "base_url": server.url + "/v1",
        "context_window": 32_000,
        "max_retries": 0,
        "subagents": [READER],
        **extra,
    }


def body(server: FakeProviderServer, n: int) -> dict[str, Any]:
    return server.model_requests[n].json()


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


async def run_and_child(h: HostHarness, r: Any) -> tuple[hpb.RunInfo, hpb.RunInfo]:
    parent = await h.client.call("GetRun", hpb.RunRequestById(run_id=r.run.run_id))
    assert len(parent.child_run_ids) == 1, parent
    child = await h.client.call("GetRun", hpb.RunRequestById(run_id=parent.child_run_ids[0]))
    return parent, child


async def test_task_runs_a_subagent_on_its_own_context_recorded_as_a_child_run(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            server.push(
                openai_tool_calls([("w1", "write_file", {"path": "notes.txt", "content": "the key is 42"})]),
                openai_tool_calls(
                    [("t1", "task", {"description": "read notes", "prompt": "What is in notes.txt?"})],
                    text="Delegating.",
                ),
                # the subagent: one tool call, then its answer
                openai_tool_calls([("s1", "read_file", {"path": "notes.txt"})], usage=(40, 4)),
                openai_text("notes.txt says the key is 42.", usage=(50, 6)),
                # the parent again
                openai_text("The key is 42."),
            )
            r = await h.send("what is the key? ask a subagent", conversation_id="conv")
            assert r.run.status == "completed", r.run.error_message
            assert r.text.endswith("The key is 42.")

            sub1, sub2, parent2 = body(server, 2), body(server, 3), body(server, 4)
            # The subagent saw only its own instructions and the prompt; tools: the general set, never `task`.
            assert [m["role"] for m in sub1["messages"]] == ["system", "user"]
            assert sub1["messages"][0]["content"].startswith(SUBAGENT_RULES)
            assert sub1["messages"][1]["content"] == "What is in notes.txt?"
            assert "task" not in tool_names(sub1) and "read_file" in tool_names(sub1)
            assert "memory" not in tool_names(sub1) and "todo_write" not in tool_names(sub1)
            assert "the key is 42" not in json.dumps(sub1)  # nothing of the parent's context
            assert "the key is 42" in sub2["messages"][-1]["content"]  # its own tool result
            # The parent got only the final answer, as the task call's result; nothing of the subagent's steps.
            tool_msgs = [m for m in parent2["messages"] if m["role"] == "tool"]
            assert tool_msgs[-1]["tool_call_id"] == "t1"
            assert tool_msgs[-1]["content"] == "notes.txt says the key is 42."
            assert "s1" not in json.dumps(parent2)
            assert (
                "task" in tool_names(body(server, 0))
                and "reader: Reads files." in body(server, 0)["messages"][0]["content"]
            )

            started = [e.subagent_started for e in r.events if e.WhichOneof("kind") == "subagent_started"]
            assert len(started) == 1 and started[0].tool_call_id == "t1" and started[0].subagent_type == "general"
            parent, child = await run_and_child(h, r)
            assert child.run_id == started[0].child_run_id
            assert child.parent_run_id == parent.run_id and child.status == "completed"
            assert child.text == "notes.txt says the key is 42."
            assert child.usage.input_tokens == 90 and parent.usage.input_tokens == 100 * 3 + 90
            evs = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=child.run_id))
            kinds = [e.WhichOneof("kind") for e in evs.events]
            assert kinds == ["usage", "tool_started", "tool_finished", "usage", "message", "completed"]
            assert "the key is 42" in evs.events[2].tool_finished.result
            # The conversation's transcript: the parent's turns only.
            history = await h.client.call(
                "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="conv", limit=100, direction=pb.FORWARD)
            )
            assert [i.tool_call_id for i in history.items if i.item_type == "tool_call"] == ["w1", "t1"]

            # The next run's context holds the task call and its answer, not the subagent's steps.
            server.push(openai_text("Still 42."))
            r2 = await h.send("and now?", conversation_id="conv")
            assert r2.run.status == "completed"
            assert "s1" not in json.dumps(body(server, 5))


async def test_subagent_tool_subset_is_enforced(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            server.push(
                openai_tool_calls(
                    [("t1", "task", {"description": "d", "prompt": "run ls", "subagent_type": "reader"})]
                ),
                openai_tool_calls([("s1", "shell", {"command": "ls"})]),
                openai_text("I could not run shell."),
                openai_text("ok"),
            )
            r = await h.send("go", conversation_id="sub")
            assert r.run.status == "completed", r.run.error_message
            sub1 = body(server, 1)
            assert sorted(tool_names(sub1)) == ["list_files", "read_file"]
            assert sub1["messages"][0]["content"].startswith("You read files")
            results = [m for m in body(server, 2)["messages"] if m["role"] == "tool"]
            assert results[-1]["content"].startswith("error: unknown tool 'shell'")
            _, child = await run_and_child(h, r)
            evs = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=child.run_id))
            finished = [e.tool_finished for e in evs.events if e.WhichOneof("kind") == "tool_finished"]
            assert finished[0].is_error and child.status == "completed"
            # An unknown type is an error result for the parent's model, not a failed run.
            server.push(
                openai_tool_calls([("t2", "task", {"description": "d", "prompt": "p", "subagent_type": "nope"})]),
                openai_text("fine"),
            )
            r = await h.send("again", conversation_id="sub")
            assert r.run.status == "completed"
            finished = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert finished[-1].is_error and "unknown subagent_type 'nope'" in finished[-1].result


def slow_text() -> Reply:
    reply = openai_text("z" * 4000, piece=4)
    reply.delay = 0.05
    return reply


async def _until(predicate: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_cancel_parent_mid_subagent_cancels_the_child_and_its_model_request(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            server.push(openai_tool_calls([("t1", "task", {"description": "d", "prompt": "take long"})]), slow_text())
            server.default = openai_text("should not be asked")
            request = hpb.SendMessageRequest(bot=h.bot, text="go", conversation_id="x", source="api")
            run_id, child_id, finished = "", "", None
            async for reply in h.client.stream(request, timeout=30):
                kind = reply.WhichOneof("kind")
                if kind == "run_started":
                    run_id = reply.run_started.run_id
                elif kind == "events":
                    for ev in reply.events.events:
                        if ev.WhichOneof("kind") == "subagent_started":
                            child_id = ev.subagent_started.child_run_id
                            # the subagent's model request is under way
                            await _until(lambda: len(server.model_requests) == 2)
                            await h.client.call("CancelRun", hpb.RunRequestById(run_id=run_id))
                elif kind == "run_finished":
                    finished = reply.run_finished
                    break
            assert finished is not None and finished.status == "cancelled" and child_id
            child = await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))
            assert child.status == "cancelled" and child.parent_run_id == run_id
            assert child.finished_at <= finished.finished_at
            # The subagent's streaming model request was aborted: its connection is gone long before the reply ends.
            await _until(lambda: not server._handlers)
            assert len(server.model_requests) == 2


async def test_parent_deadline_bounds_the_subagent(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            await h.bind("test/local-agent", cfg(server), conversation_pattern="d", priority=5, timeout_seconds=2)
            server.push(openai_tool_calls([("t1", "task", {"description": "d", "prompt": "hang"})]), Reply(hang=True))
            began = time.time()
            r = await h.send("go", conversation_id="d")
            assert r.run.status == "timed_out"
            assert time.time() - began < 10
            _, child = await run_and_child(h, r)
            assert child.status == "timed_out" and child.deadline_at <= r.run.deadline_at


def test_bind_time_checks_of_subagent_types(tmp_path: Path) -> None:
    runner = LocalAgentRunner(tmp_path, env={})
    assert runner.validate_config({"subagents": [READER]}) == []
    problems = runner.validate_config({"subagents": [{**READER, "tools": ["read_file", "task", "memory"]}]})
    assert len(problems) == 1 and "['memory', 'task'] cannot be given to a subagent" in problems[0]
    assert runner.validate_config({"subagents": [READER, READER]})[0].startswith("subagents: subagent names must")
    assert (
        "subagents.reader.model: unknown provider"
        in runner.validate_config({"subagents": [{**READER, "model": "nope/m"}]})[0]
    )
