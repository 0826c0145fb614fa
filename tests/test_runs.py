"""Run orchestration against a real in-process host: routing, projection, ordering, bootstrap, failure modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest

from agenthost.plugins.manifest import ContextNeeds
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, host_pb2_grpc
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness


class Scripted(Runner):
    """Behaviour chosen by the message text."""

    manifest = RunnerManifest(
        name="scripted", config_schema={"type": "object", "properties": {"tag": {"type": "string"}}}
    )
    seen: list[RunContext] = []
    gate: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        Scripted.seen.append(run)
        text = run.text
        if text == "tools":
            yield events.text("let me check")
            yield events.tool_started("c1", "lookup", {"q": "x"})
            yield events.tool_finished("c1", "lookup", "found x")
            yield events.tool_started("c2", "lookup", {"q": "y"})
            yield events.tool_finished("c2", "lookup", "boom", is_error=True)
            yield events.usage(10, 5, model="m")
            yield events.text("done: ")
            yield events.text("x")
        elif text == "raise":
            yield events.text("partial")
            raise RuntimeError("bad things")
        elif text == "after-terminal":
            yield events.text("a")
            yield events.completed()
            yield events.text("ignored")
        elif text == "fail":
            yield events.failed("nope", "the runner declined")
        elif text == "wrong-type":
            yield events.text("before")
            yield b"not an event"  # type: ignore[misc]
        elif text == "wait":
            await Scripted.gate.wait()
            yield events.text("waited")
        elif text == "message":
            yield events.text("draft")
            yield events.message("final answer")
        else:
            yield events.text(f"{run.config.get('tag', '')}{text}")


class Tail(Runner):
    manifest = RunnerManifest(name="tail", context=ContextNeeds(bootstrap="recent_tail", max_inline_events=3))

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        yield events.text(json.dumps([[i.role, i.text] for i in run.bootstrap]))


class Summary(Runner):
    manifest = RunnerManifest(name="summary", context=ContextNeeds(bootstrap="summary_tail", max_inline_events=50))

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        if run.text == "compact":
            yield events.compaction(1000, 100, summary="the user likes tea")
        yield events.text(json.dumps([[i.item_type, i.text] for i in run.bootstrap]))


@pytest.fixture
async def h(tmp_path, host_database):
    Scripted.seen = []
    Scripted.gate = asyncio.Event()
    async with HostHarness(
        tmp_path, runners=[Scripted, Tail, Summary], config={"tag": "#"}, host_options=host_database
    ) as harness:
        yield harness


def history(h: HostHarness, conversation: str = "default") -> list[tuple[str, str, str, str]]:
    bot_id = h.host.registry.bot(h.bot).bot_id
    page = h.host.conversations.page_history(bot_id, conversation, cursor="", forward=True, limit=100)
    return [(i.role, i.item_type, i.text, i.tool_name) for i in page.items]


async def test_projection_keeps_tool_turns_and_usage(h):
    result = await h.send("tools")
    assert result.run.status == "completed"
    assert result.text == "let me check\n\ndone: x"
    assert result.run.usage.input_tokens == 10 and result.run.usage.model == "m"
    assert [e.seq for e in result.events] == list(range(1, len(result.events) + 1))
    assert history(h) == [
        ("user", "message", "tools", ""),
        ("assistant", "message", "let me check", ""),
        ("assistant", "tool_call", "", "lookup"),
        ("tool", "tool_result", "found x", "lookup"),
        ("assistant", "tool_call", "", "lookup"),
        ("tool", "tool_result", "boom", "lookup"),
        ("assistant", "message", "done: x", ""),
    ]
    bot_id = h.host.registry.bot(h.bot).bot_id
    items = h.host.conversations.page_history(bot_id, "default", cursor="", forward=True, limit=100).items
    assert json.loads(items[2].data_json) == {"q": "x"} and items[5].is_error
    persisted, more = h.host.run_store.events(result.run.run_id, 0, 100)
    assert [e.seq for e in persisted] == [e.seq for e in result.events] and not more


async def test_message_supersedes_deltas_and_config_reaches_runner(h):
    assert (await h.send("message")).text == "final answer"
    assert (await h.send("hi")).text == "#hi"
    assert Scripted.seen[-1].config == {"tag": "#"}
    assert Scripted.seen[-1].context.context.has_history_before


async def test_runner_failures_are_typed(h):
    raised = await h.send("raise")
    assert raised.run.status == "failed" and raised.run.error_code == "runner_error"
    assert "bad things" in raised.run.error_message and raised.text == "partial"
    failed = await h.send("fail")
    assert (failed.run.status, failed.run.error_code, failed.run.error_message) == (
        "failed",
        "nope",
        "the runner declined",
    )
    wrong = await h.send("wrong-type")
    assert (wrong.run.status, wrong.run.error_code, wrong.text) == ("failed", "runner_error", "before")
    assert wrong.run.error_message == (
        "TypeError: Scripted.run yielded a bytes; a runner yields RunEvents (made with agenthost.runners.sdk.events)"
        " or a str for a text delta"
    )
    after = await h.send("after-terminal")
    assert after.run.status == "completed" and after.text == "a"
    assert after.kinds() == ["text_delta", "completed"]


async def test_runs_of_one_conversation_queue_in_order(h):
    first = asyncio.create_task(h.send("wait"))
    while not Scripted.seen:  # noqa: ASYNC110 - polling the runner's list; pytest-timeout bounds it
        await asyncio.sleep(0.01)
    second = asyncio.create_task(h.send("second"))
    other = await h.send("elsewhere", conversation_id="other")  # another conversation is not blocked
    assert other.text == "#elsewhere"
    await asyncio.sleep(0.1)
    queued = h.host.run_store.list(status="queued")
    assert len(queued) == 1
    Scripted.gate.set()
    assert (await first).text == "waited"
    assert (await second).text == "#second"
    assert [t for r, k, t, _ in history(h) if r == "user"] == ["wait", "second"]


async def test_routing_priority_ties_and_no_match(h):
    with pytest.raises(errors.AlreadyExists):
        await h.bind("test/scripted")  # same pattern and priority as the harness's binding
    await h.bind("test/tail", conversation_pattern="tail-*", priority=5)
    assert (await h.send("x", conversation_id="plain")).run.runner_id == "test/scripted"
    assert (await h.send("x", conversation_id="tail-1")).run.runner_id == "test/tail"
    with pytest.raises(errors.FailedPrecondition, match="no binding"):
        await h.send("x", event_type="group.member_joined")
    with pytest.raises(errors.InvalidArgument, match="config"):
        await h.bind("test/scripted", {"tag": 5}, priority=9)
    with pytest.raises(errors.NotFound):
        await h.bind("test/missing", priority=9)
    with pytest.raises(errors.NotFound):
        await h.send("x", bot="nobody")
    with pytest.raises(errors.InvalidArgument):
        await h.send("x", conversation_id="bad\x00id")
    with pytest.raises(errors.ResourceExhausted):
        await h.send("x" * (300 * 1024))


async def test_bootstrap_recent_tail_is_bounded(h):
    await h.bind("test/tail", conversation_pattern="t", priority=5)
    for i in range(3):
        await h.send(f"m{i}", conversation_id="t")
    result = await h.send("now", conversation_id="t")
    inlined = json.loads(result.text)
    # the three newest items (max_inline_events=3), oldest first, ending with the current message
    assert [role for role, _ in inlined] == ["user", "assistant", "user"]
    assert inlined[0][1] == "m2" and inlined[-1][1] == "now"
    # A runner whose manifest asks for nothing gets nothing inlined, even with history before its message.
    await h.send("first", conversation_id="plain")
    await h.send("second", conversation_id="plain")
    assert [r.text for r in Scripted.seen] == ["first", "second"]
    assert Scripted.seen[-1].context.context.has_history_before and list(Scripted.seen[-1].bootstrap) == []


async def test_client_disconnect_does_not_lose_the_run(h):
    channel = grpc.aio.insecure_channel(h.host.admin_address)
    stub = host_pb2_grpc.AgentHostStub(channel)
    call = stub.SendMessage(
        hpb.SendMessageRequest(bot=h.bot, text="wait", conversation_id="dc"),
        metadata=(("authorization", f"Bearer {h.host.admin_token}"),),
    )
    started = await call.read()
    run_id = started.run_started.run_id
    call.cancel()
    await channel.close()
    Scripted.gate.set()
    for _ in range(200):
        info = h.host.run_store.get(run_id)
        if info.status == "completed":
            break
        await asyncio.sleep(0.02)
    assert info.status == "completed" and info.text == "waited"
    assert ("assistant", "message", "waited", "") in history(h, "dc")


async def test_bootstrap_summary_tail_starts_at_the_latest_compaction(h):
    await h.bind("test/summary", conversation_pattern="s", priority=5)
    await h.send("early", conversation_id="s")
    await h.send("compact", conversation_id="s")
    inlined = json.loads((await h.send("later", conversation_id="s")).text)
    assert inlined[0] == ["compaction", "the user likes tea"]
    assert ["message", "early"] not in inlined and inlined[-1] == ["message", "later"]


async def test_names_a_message_carries_are_bounded_and_free_of_control_characters(h):
    """A conversation id, an event type and an actor id end up in logs, terminals, state keys and every event row:
    a trailing newline (which `$` let through) or an escape sequence is refused, as is an actor id of megabytes."""
    bad = [
        {"conversation_id": "c1\n"},
        {"event_type": "message.received\n"},
        {"actor": pb.Actor(actor_type="user", actor_id="alice\n")},
        {"actor": pb.Actor(actor_type="user", actor_id="al\x1b[2Jice")},
        {"actor": pb.Actor(actor_type="user", actor_id="a" * 513)},
        {"actor": pb.Actor(actor_type="user\n", actor_id="alice")},
    ]
    for fields in bad:
        fields.setdefault("conversation_id", "c1")
        with pytest.raises(errors.InvalidArgument):
            await h.client.send(h.bot, "hi", **fields)
    assert h.host.run_store.list(bot_id="", conversation_id="", status="", limit=10) == []
    said = await h.client.send(h.bot, "hi", conversation_id="c1", actor=pb.Actor(actor_type="user", actor_id="a" * 512))
    assert said.run.status == "completed"
