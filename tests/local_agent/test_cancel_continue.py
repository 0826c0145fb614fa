"""A run cancelled in the middle of a tool call, then the next message to the same runner object.

The session stays in the runner's memory across the two runs (nothing is reloaded from disk), so the only thing
between the dangling call and the provider is the pairing repair the loop runs before every model request. The
request the fake provider receives is checked against the rules the real APIs enforce (OpenAI answers 400 "An
assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'";
Anthropic 400 "tool_use ids were found without tool_result blocks immediately after").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    Reply,
    anthropic_text,
    anthropic_tool_use,
    make_run,
    openai_text,
    openai_tool_calls,
)

from .helpers import kinds, new_runner, send, server_config, terminal

pytestmark = pytest.mark.timeout(60)
MARKER = "tool-started.marker"
SLOW = {"command": f"echo started > {MARKER}; sleep 30"}
ANTHROPIC_KEY = "sk-ant-test-0000000000000000000000"


def openai_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What OpenAI's chat completions endpoint would refuse in this message list (the tool-pairing rules)."""
    problems: list[str] = []
    open_calls: list[str] = []  # ids of the latest assistant tool_calls still waiting for their tool messages
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            problems.append(f"message {i}: unknown role {role!r}")
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in open_calls:
                problems.append(f"message {i}: tool result {cid!r} does not answer a call of the preceding turn")
            else:
                open_calls.remove(cid)
            continue
        if open_calls:
            problems.append(f"message {i} ({role}) follows tool calls {open_calls} that have no result")
            open_calls = []
        if role == "assistant":
            open_calls = [c["id"] for c in m.get("tool_calls") or []]
            if len(set(open_calls)) != len(open_calls):
                problems.append(f"message {i}: duplicate tool call ids {open_calls}")
    if open_calls:
        problems.append(f"the request ends on tool calls {open_calls} with no result")
    return problems


def anthropic_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What Anthropic's Messages API would refuse: every tool_use answered by a tool_result at the start of the very
    next (user) message, and no tool_result without its tool_use in the assistant turn just before."""
    problems: list[str] = []

    def blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
        content = m.get("content")
        return content if isinstance(content, list) else [{"type": "text", "text": content}]

    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            problems.append(f"message {i}: role {m.get('role')!r} is not allowed in messages")
        uses = [b["id"] for b in blocks(m) if b.get("type") == "tool_use"] if m.get("role") == "assistant" else []
        before = messages[i - 1] if i else None
        wanted = (
            [b["id"] for b in blocks(before) if b.get("type") == "tool_use"]
            if before and before.get("role") == "assistant"
            else []
        )
        if m.get("role") == "user":
            results = [b.get("tool_use_id") for b in blocks(m) if b.get("type") == "tool_result"]
            leading = []
            for b in blocks(m):
                if b.get("type") != "tool_result":
                    break
                leading.append(b.get("tool_use_id"))
            if sorted(leading) != sorted(wanted):
                problems.append(f"message {i}: tool_use ids {wanted} answered by leading tool_results {leading}")
            if sorted(results) != sorted(leading):
                problems.append(f"message {i}: tool_result blocks after other content: {results}")
        if uses and (i + 1 >= len(messages) or messages[i + 1].get("role") != "user"):
            problems.append(f"message {i}: tool_use ids {uses} are not followed by a user turn with their results")
    return problems


def test_the_validators_refuse_what_the_apis_refuse() -> None:
    """The checks below mean something only if they reject the broken shapes."""
    dangling = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "user", "content": "b"},
    ]
    assert openai_problems(dangling)
    orphan = [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}]
    assert openai_problems(orphan)
    fixed = [*dangling[:3], {"role": "tool", "tool_call_id": "c1", "content": "interrupted"}, dangling[3]]
    assert openai_problems(fixed) == []
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shell", "input": {}}]}
    assert anthropic_problems([{"role": "user", "content": "a"}, use, {"role": "user", "content": "b"}])
    answered = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}, {"type": "text"}]}
    assert anthropic_problems([{"role": "user", "content": "a"}, use, answered]) == []


async def _cancel_mid_tool(runner: Any, api: FakeRunAPI, config: dict[str, Any], tmp_path: Path) -> list[pb.RunEvent]:
    """Starts a run, waits until the slow tool's command is really running, then cancels the run (what the SDK
    server does when the host cancels it). Returns the events the host would have seen."""
    api.add_user("run the slow thing", event_id="e1")
    run = make_run(api, "run the slow thing", config=config, event_id="e1")
    seen: list[pb.RunEvent] = []

    async def consume() -> None:
        async for ev in runner.run(run):
            seen.append(ev)

    task = asyncio.create_task(consume())
    async with asyncio.timeout(20):
        while not list(tmp_path.rglob(MARKER)):  # noqa: ASYNC110 — the command's own file says it runs
            assert not task.done(), kinds(seen)
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    finished = [e.tool_finished.tool_name for e in seen if e.WhichOneof("kind") == "tool_finished"]
    assert "shell" not in finished, "the slow call finished before it was cancelled"
    api.project(seen)
    return seen


CASES: dict[str, tuple[str, Callable[[FakeProviderServer], list[Reply]], int]] = {
    # name: (wire, the first model reply, how many calls the cancelled turn made)
    "openai, the only call": ("openai", lambda s: [openai_tool_calls([("c1", "shell", SLOW)])], 1),
    "openai, second call of two": (
        "openai",
        lambda s: [openai_tool_calls([("c1", "list_files", {}), ("c2", "shell", SLOW)])],
        2,
    ),
    "anthropic, the only call": ("anthropic", lambda s: [anthropic_tool_use("toolu_1", "shell", SLOW)], 1),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.e2e
async def test_cancel_mid_tool_then_next_message_is_well_paired(tmp_path: Path, case: str) -> None:
    wire, first_reply, n_calls = CASES[case]
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        if wire == "openai":
            runner = new_runner(tmp_path)
            config = server_config(server)
            answer = openai_text("It was interrupted; shall I run it again?")
        else:
            runner = new_runner(tmp_path, env={"ANTHROPIC_API_KEY": ANTHROPIC_KEY})
            config = {"model": "anthropic/claude-test", "base_url": server.url, "context_window": 32_000}
            server.routes["GET /v1/models/claude-test"] = Reply(chunks=[b"{}"], content_type="application/json")
            answer = anthropic_text("It was interrupted; shall I run it again?")
        try:
            server.push(*first_reply(server))
            await _cancel_mid_tool(runner, api, config, tmp_path)
            server.push(answer)
            events = await send(runner, api, "did it finish?", config)  # the same runner object, same session
            assert terminal(events).WhichOneof("kind") == "completed"
            assert not [e for e in events if e.WhichOneof("kind") == "progress" and "healed" in e.progress.message]
            body = server.model_requests[-1].json()
        finally:
            await runner.close()
    messages = body["messages"]
    problems = openai_problems(messages) if wire == "openai" else anthropic_problems(messages)
    assert problems == [], (problems, messages)
    # The trigger is the last thing the model sees, once; and every call of the cancelled turn is still there,
    # the dangling one closed with an error saying it was interrupted (calls are never dropped: an Anthropic turn
    # must be replayed whole).
    if wire == "openai":
        assert (messages[-1]["role"], messages[-1]["content"]) == ("user", "did it finish?")
        assert sum(m.get("content") == "did it finish?" for m in messages) == 1
        calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
        assert len(calls) == n_calls and set(results) == set(calls)
        assert "interrupted" in results[calls[-1]]
        if n_calls == 2:
            assert "interrupted" not in results[calls[0]]  # the call that finished keeps its real result
    else:
        results = [b for m in messages if m["role"] == "user" for b in m["content"] if isinstance(b, dict)]
        tool_results = [b for b in results if b.get("type") == "tool_result"]
        assert [b["tool_use_id"] for b in tool_results] == ["toolu_1"]
        assert tool_results[0].get("is_error") is True and "interrupted" in str(tool_results[0]["content"])
