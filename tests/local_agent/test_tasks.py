"""The task graph: its rules through the tool registry (FakeRunAPI), and end to end through the real host, where the
graph lives in conversation state and is still there after a compaction and after the runner loses its disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.messages import ToolCall, ToolResult
from agenthost.runners.local_agent.testing import FakeProviderServer, FakeRunAPI, openai_text, openai_tool_calls
from agenthost.runners.local_agent.tools import build_registry
from agenthost.runners.local_agent.tools.base import ToolContext
from agenthost.runners.local_agent.tools.tasks import MAX_TASKS, STATE_KEY
from agenthost.runners.sdk.testing import HostHarness

from .test_e2e import Forgetful


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        workspace=tmp_path, api=FakeRunAPI(), conversation_id="c1", run_id="r1", config=LocalAgentConfig()
    )


async def call(ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    registry = build_registry(ctx.config)
    return await registry.run(ToolCall(id=f"t-{name}", name=name, arguments=json.dumps(args)), ctx)


def stored(ctx: ToolContext) -> dict[str, Any]:
    return json.loads(ctx.api.state[("conversation", STATE_KEY)][0])  # type: ignore[attr-defined]


async def test_dependencies_block_and_completion_unblocks(ctx: ToolContext) -> None:
    assert "created [ ] #1 design" in (await call(ctx, "task_create", title="design")).content
    await call(ctx, "task_create", title="build", blockedBy=["1"])
    await call(ctx, "task_create", title="ship", blockedBy=["#2"], description="tag and upload")
    listing = (await call(ctx, "task_list")).content
    assert "[ ] #2 build (blocked by #1)" in listing and "[ ] #3 ship (blocked by #2)" in listing
    r = await call(ctx, "task_update", id="2", status="in_progress")
    assert r.is_error and "blocked by #1 'design' (pending)" in r.content
    r = await call(ctx, "task_update", id="2", status="completed")
    assert r.is_error and "blocked" in r.content
    assert (await call(ctx, "task_update", id="1", status="in_progress")).content.startswith("updated [>] #1")
    r = await call(ctx, "task_update", id="1", status="completed")
    assert not r.is_error and "#2 'build' is now unblocked" in r.content and "#3" not in r.content
    detail = (await call(ctx, "task_get", id="2")).content
    assert (
        "blockedBy: #1 (completed)" in detail
        and "blocks: #3 (pending)" in detail
        and "blocked" not in detail.split("\n")[1]
    )
    assert "tag and upload" in (await call(ctx, "task_get", id="3")).content
    doc = stored(ctx)
    assert [(t["id"], t["status"], t["blockedBy"]) for t in doc["tasks"]] == [
        ("1", "completed", []),
        ("2", "pending", ["1"]),
        ("3", "pending", ["2"]),
    ]
    assert ctx.pending_events and ctx.pending_events[-1].state_updated.key == STATE_KEY


async def test_one_task_in_progress_at_a_time(ctx: ToolContext) -> None:
    await call(ctx, "task_create", title="a")
    await call(ctx, "task_create", title="b")
    await call(ctx, "task_update", id="1", status="in_progress")
    before = stored(ctx)
    r = await call(ctx, "task_update", id="2", status="in_progress")
    assert r.is_error and "only one task may be in_progress" in r.content and "#1 'a'" in r.content
    assert stored(ctx) == before  # refused before anything was written
    await call(ctx, "task_update", id="1", status="pending")
    assert not (await call(ctx, "task_update", id="2", status="in_progress")).is_error


async def test_cycles_are_refused(ctx: ToolContext) -> None:
    for title in ("a", "b", "c"):
        await call(ctx, "task_create", title=title)
    await call(ctx, "task_update", id="2", addBlockedBy=["1"])
    await call(ctx, "task_update", id="3", addBlockedBy=["2"])
    before = stored(ctx)
    r = await call(ctx, "task_update", id="1", addBlockedBy=["3"])
    assert r.is_error and "cycle" in r.content and "#3 -> #2 -> #1" in r.content
    r = await call(ctx, "task_update", id="1", addBlockedBy=["1"])
    assert r.is_error and "itself" in r.content
    # Through `blocks` on creation too: #4 blockedBy #3 and #1 blockedBy #4 would make 1 -> 4 -> 3 -> 2 -> 1.
    r = await call(ctx, "task_create", title="d", blockedBy=["3"], blocks=["1"])
    assert r.is_error and "cycle" in r.content
    assert stored(ctx) == before
    r = await call(ctx, "task_update", id="9", status="completed")
    assert r.is_error and "no task #9" in r.content


async def test_cancelling_a_blocker_unblocks_with_a_warning(ctx: ToolContext) -> None:
    await call(ctx, "task_create", title="a")
    await call(ctx, "task_create", title="b", blockedBy=["1"])
    r = await call(ctx, "task_update", id="1", status="cancelled")
    assert "#2 'b' is now unblocked" in r.content and "depended on this cancelled task" in r.content
    assert "[-] #1 a" in (await call(ctx, "task_list")).content


async def test_full_graph_prunes_finished_tasks_never_open_ones(ctx: ToolContext) -> None:
    api: FakeRunAPI = ctx.api  # type: ignore[assignment]
    tasks = [
        {
            "id": str(i),
            "title": f"t{i}",
            "status": "completed" if i == 5 else "pending",
            "blockedBy": [],
            "updated_at": float(i),
        }
        for i in range(1, MAX_TASKS + 1)
    ]
    await api.state_set("conversation", STATE_KEY, {"next_id": MAX_TASKS + 1, "tasks": tasks})
    r = await call(ctx, "task_create", title="one more")
    assert not r.is_error and "pruned finished task #5" in r.content
    r = await call(ctx, "task_create", title="and another")
    assert r.is_error and "full" in r.content


async def test_concurrent_write_is_reapplied_not_overwritten(ctx: ToolContext) -> None:
    api: FakeRunAPI = ctx.api  # type: ignore[assignment]
    await call(ctx, "task_create", title="mine")
    real_set = api.state_set
    raced = False

    async def racing_set(scope: str, key: str, value: Any, *, if_version: int | None = None) -> int:
        nonlocal raced
        if not raced:
            raced = True  # another run adds a task between this call's read and its write
            doc = json.loads(api.state[(scope, key)][0])
            doc["tasks"].append({"id": "2", "title": "theirs", "status": "in_progress", "blockedBy": []})
            doc["next_id"] = 3
            await real_set(scope, key, doc)
        return await real_set(scope, key, value, if_version=if_version)

    api.state_set = racing_set  # type: ignore[method-assign]
    r = await call(ctx, "task_update", id="1", status="in_progress")
    # Re-read after the conflict: the other run's task is kept, and it is the one in progress.
    assert r.is_error and "#2 'theirs'" in r.content
    assert [t["title"] for t in stored(ctx)["tasks"]] == ["mine", "theirs"]


async def test_state_unavailable_is_a_tool_error(ctx: ToolContext) -> None:
    ctx.api.denied.add("state_get")  # type: ignore[attr-defined]
    r = await call(ctx, "task_list")
    assert r.is_error and "unavailable" in r.content and "PermissionDenied" in r.content


def tool_results(messages: list[dict[str, Any]], name_prefix: str) -> list[str]:
    ids = {
        tc["id"]
        for m in messages
        if m["role"] == "assistant"
        for tc in m.get("tool_calls") or []
        if tc["function"]["name"].startswith(name_prefix)
    }
    return [m["content"] for m in messages if m["role"] == "tool" and m["tool_call_id"] in ids]


async def test_e2e_tasks_live_in_host_state_and_survive_compaction(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 0}
        Forgetful.instances.clear()
        async with HostHarness(tmp_path, runners=[Forgetful], config=config) as h:
            server.push(
                openai_tool_calls(
                    [
                        ("a", "task_create", {"title": "Write the parser"}),
                        ("b", "task_create", {"title": "Write the tests", "blockedBy": ["1"]}),
                        ("c", "task_create", {"title": "Release v2", "blockedBy": ["2"]}),
                    ]
                ),
                openai_tool_calls([("d", "task_update", {"id": "1", "status": "in_progress"})]),
                openai_tool_calls([("e", "task_update", {"id": "2", "status": "in_progress"})]),
                openai_text("Planned three tasks; the parser is under way. " + "detail " * 300),
            )
            r = await h.send("plan the release", conversation_id="t")
            assert r.run.status == "completed", r.run.error_message
            finished = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert finished[-1].is_error and "task #2 is blocked by #1" in finished[-1].result
            assert any(e.WhichOneof("kind") == "state_updated" for e in r.events)

            # Next request: the model compacts, then pulls the graph back from the host.
            server.push(
                openai_tool_calls([("k", "compact", {"focus": "the release plan"})]),
                openai_text("SUMMARY: the user planned a release.", usage=None),  # the summary call
                openai_tool_calls([("l", "task_list", {})]),
                openai_text("Still three tasks."),
            )
            r = await h.send("where are we?", conversation_id="t")
            assert r.run.status == "completed", r.run.error_message
            assert [e.compaction.artifact_id != "" for e in r.events if e.WhichOneof("kind") == "compaction"] == [True]
            after = server.model_requests[-1].json()["messages"]  # the request that held the task_list result
            assert "CONTEXT SUMMARY" in after[1]["content"]
            assert tool_results(after, "task_create") == []  # the creating calls were compacted away…
            [listing] = tool_results(after, "task_list")  # …and the graph came back from the host
            assert "[>] #1 Write the parser" in listing
            assert "[ ] #2 Write the tests (blocked by #1)" in listing
            assert "[ ] #3 Release v2 (blocked by #2)" in listing

            # The runner loses its disk: the graph is the host's, so it is all still there, and the system prompt
            # points at it.
            Forgetful.lose_disk()
            server.push(
                openai_tool_calls([("m", "task_update", {"id": "1", "status": "completed"})]),
                openai_tool_calls([("n", "task_get", {"id": "2"})]),
                openai_text("The tests are next."),
            )
            r = await h.send("the parser is done", conversation_id="t")
            assert r.run.status == "completed", r.run.error_message
            system = server.model_requests[-3].json()["messages"][0]["content"]
            assert "3 open task(s)" in system and "in progress: #1 Write the parser" in system
            results = [e.tool_finished.result for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert "#2 'Write the tests' is now unblocked" in results[0]
            assert "blockedBy: #1 (completed)" in results[1] and "blocks: #3 (pending)" in results[1]
