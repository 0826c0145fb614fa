"""Child runs (subagents) through a real host: the run API's ChildRun as any runner uses it through the SDK
(`RunContext.child_run`), and as an attacker uses it with raw stubs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.host import limits
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, run_api_pb2_grpc
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos.wire import CHANNEL_OPTIONS
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(60)
SC = grpc.StatusCode
# How long a test waits for something the host or the runner will do: generous, for a 2-core machine under `-n 4`
# (a wait of 10 s failed there). The product's own deadlines stay as they are.
WAIT = 60


class HeldSend:
    """A hook on a client call's core half (grpcio's cython call): its send waits for `go` after it was entered,
    that is after grpcio's own "has the call ended?" check, so the test can end the call with a write in flight.
    `failed` is what core's send raised once let go."""

    def __init__(self, inner: Any, entered: asyncio.Event, go: asyncio.Event) -> None:
        self._inner, self._entered, self._go = inner, entered, go
        self.failed: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send_serialized_message(self, message: bytes) -> None:
        self._entered.set()
        await self._go.wait()
        try:
            await self._inner.send_serialized_message(message)
        except BaseException as exc:
            self.failed = exc
            raise


class Parent(Runner):
    """Behaviour chosen by the message text. Parked runs hand their context to the test."""

    manifest = RunnerManifest(name="parent")
    live: asyncio.Queue[RunContext]
    release: asyncio.Event
    child_open: asyncio.Event
    outcome: dict[str, Any]

    @classmethod
    def reset(cls) -> None:
        cls.live, cls.release, cls.child_open, cls.outcome = asyncio.Queue(), asyncio.Event(), asyncio.Event(), {}

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        text = run.text
        if text == "one child":
            yield events.tool_started("t1", "task", {"prompt": "p"})
            async with run.child_run("find things", subagent_type="explore", tool_call_id="t1") as child:
                await child.emit(events.tool_started("s1", "grep", {"q": "x"}))
                await child.emit(events.tool_finished("s1", "grep", "x found"))
                await child.emit(events.usage(30, 7, model="small"), events.message("the answer"))
            Parent.outcome["result"] = child.result
            yield events.tool_finished("t1", "task", "the answer")
            yield events.usage(100, 10, model="big")
            yield events.text("done")
        elif text == "forge link":
            yield events.text("x")
            yield pb.RunEvent(subagent_started=pb.SubagentStarted(child_run_id="run_forged"))
        elif text == "hang in child":
            try:
                async with run.child_run("waits forever") as child:
                    Parent.outcome["child_id"] = child.run_id
                    Parent.outcome["deadline"] = child.deadline_at
                    Parent.child_open.set()
                    await asyncio.sleep(3600)
            except asyncio.CancelledError:
                Parent.outcome["cancelled"] = True
                raise
            yield events.text("unreachable")
        elif text == "child cut":
            async with run.child_run("cut by the host") as child:
                Parent.outcome["child_id"] = child.run_id
                Parent.child_open.set()
                await Parent.release.wait()
                try:
                    await child.emit(events.text("late"))
                    await asyncio.sleep(0.5)
                    await child.emit(events.text("later"))
                except errors.AgentHostError as exc:
                    Parent.outcome["error"] = exc
                    raise
            yield events.text("unreachable")
        elif text == "write in flight":
            async with run.child_run("its write meets the host's end") as child:
                Parent.outcome["child"], Parent.outcome["child_id"] = child, child.run_id
                Parent.outcome["hook"] = hook = HeldSend(child._call._cython_call, Parent.child_open, Parent.release)
                child._call._cython_call = hook
                try:
                    await child.emit(events.text("in flight"))
                except errors.AgentHostError as exc:
                    Parent.outcome["error"] = exc
                    raise
            yield events.text("unreachable")
        elif text in ("flood child", "flood child timeout"):
            timeout = 0.3 if text.endswith("timeout") else 0.0
            try:
                async with run.child_run("writes back to back", timeout=timeout) as child:
                    Parent.outcome["child_id"] = child.run_id
                    Parent.child_open.set()
                    while True:
                        await child.emit(events.text("x"))
            except errors.AgentHostError as exc:
                Parent.outcome["error"], Parent.outcome["result"] = exc, child.result
            yield events.text("went on")
        elif text == "try a child":
            try:
                async with run.child_run("one more") as child:
                    await child.emit(events.text("in"))
                Parent.outcome[f"try {run.conversation_id}"] = child.result.status
            except errors.AgentHostError as exc:
                Parent.outcome[f"try {run.conversation_id}"] = exc.code.name
            yield events.text("tried")
        elif text == "children fill the quota":
            for i in range(3):
                try:
                    async with run.child_run(f"child {i}") as child:
                        await child.emit(*[events.text("x" * 10) for _ in range(5)])
                    Parent.outcome[i] = (child.result.status, child.result.error_code)
                except errors.AgentHostError as exc:
                    Parent.outcome[i] = ("error", str(exc))
            yield events.text("done")
        else:
            await Parent.live.put(run)
            await Parent.release.wait()
            yield events.text("released")


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[HostHarness]:
    Parent.reset()
    async with HostHarness(tmp_path, runners=[Parent]) as harness:
        yield harness
        Parent.release.set()


@pytest.mark.e2e
async def test_child_run_recorded_with_parent_link_events_and_usage(h: HostHarness) -> None:
    r = await h.send("one child", conversation_id="c")
    assert r.run.status == "completed", r.run.error_message
    started = [e.subagent_started for e in r.events if e.WhichOneof("kind") == "subagent_started"]
    finished = [e.subagent_finished for e in r.events if e.WhichOneof("kind") == "subagent_finished"]
    assert len(started) == 1 and len(finished) == 1
    child_id = started[0].child_run_id
    assert started[0].tool_call_id == "t1" and started[0].subagent_type == "explore"
    assert finished[0].child_run_id == child_id and finished[0].status == "completed"
    assert finished[0].usage.input_tokens == 30
    result = Parent.outcome["result"]
    assert result.child_run_id == child_id and result.status == "completed"

    parent = await h.client.call("GetRun", hpb.RunRequestById(run_id=r.run.run_id))
    assert list(parent.child_run_ids) == [child_id] and parent.parent_run_id == ""
    # The parent's usage counts its child's.
    assert parent.usage.input_tokens == 130 and parent.usage.output_tokens == 17
    child = await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))
    assert child.parent_run_id == r.run.run_id and child.status == "completed"
    assert child.usage.input_tokens == 30 and child.text == "the answer"
    assert child.deadline_at <= parent.deadline_at and child.conversation_id == "c"
    evs = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=child_id))
    assert [e.WhichOneof("kind") for e in evs.events] == [
        "tool_started",
        "tool_finished",
        "usage",
        "message",
        "completed",
    ]
    # The conversation's transcript holds the parent's turns only.
    history = await h.client.call(
        "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="c", limit=100, direction=pb.FORWARD)
    )
    assert [(i.item_type, i.tool_name) for i in history.items] == [
        ("message", ""),
        ("tool_call", "task"),
        ("tool_result", "task"),
        ("message", ""),
    ]
    assert all(i.run_id == r.run.run_id for i in history.items[1:])
    listed = await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot))
    assert {x.run_id: x.parent_run_id for x in listed.runs}[child_id] == r.run.run_id

    # The CLI: `runs show PARENT` lists the children, `runs show CHILD --events` its steps, `runs list` the link.
    shown = json.loads(await cli(h, "runs", "show", r.run.run_id, "--json"))
    assert shown["children"] == [
        {"run_id": child_id, "status": "completed", "error_code": "", "usage": shown["children"][0]["usage"]}
    ]
    assert shown["children"][0]["usage"]["input_tokens"] == 30
    shown = json.loads(await cli(h, "runs", "show", child_id, "--events", "--json"))
    assert shown["parent_run_id"] == r.run.run_id and len(shown["events"]) == 5
    assert f"{child_id} completed" in await cli(h, "runs", "list")
    assert f"(child of {r.run.run_id})" in await cli(h, "runs", "list")


async def cli(h: HostHarness, *args: str) -> str:
    """The real CLI against the harness's host, without blocking the loop it serves on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agenthost.host.cli",
        "--data-dir",
        str(h.host.data_dir),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_runner_cannot_forge_subagent_links(h: HostHarness) -> None:
    r = await h.send("forge link", conversation_id="f")
    assert r.run.status == "completed"
    assert "subagent_started" not in r.kinds()
    evs = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=r.run.run_id))
    assert [e.WhichOneof("kind") for e in evs.events] == ["text_delta", "completed"]


async def _wait_child(h: HostHarness, conversation_id: str, text: str) -> tuple[asyncio.Task[Any], str]:
    task = asyncio.create_task(h.send(text, conversation_id=conversation_id))
    await asyncio.wait_for(Parent.child_open.wait(), WAIT)
    return task, Parent.outcome["child_id"]


async def test_cancelling_the_parent_cancels_the_child(h: HostHarness) -> None:
    task, child_id = await _wait_child(h, "x", "hang in child")
    runs = await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot))
    parent_id = next(r.run_id for r in runs.runs if r.run_id != child_id)
    assert (await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))).status == "running"
    await h.client.call("CancelRun", hpb.RunRequestById(run_id=parent_id))
    r = await asyncio.wait_for(task, WAIT)
    assert r.run.status == "cancelled"
    child = await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))
    assert child.status == "cancelled" and child.error_code == "parent_cancelled", child
    assert child.finished_at <= r.run.finished_at
    for _ in range(WAIT * 100):  # at least WAIT seconds
        if Parent.outcome.get("cancelled"):
            break
        await asyncio.sleep(0.01)
    assert Parent.outcome.get("cancelled")  # the runner's subagent code was cancelled too
    assert h.host.runs.children.get(child_id) is None


async def test_parent_deadline_bounds_the_child(h: HostHarness) -> None:
    binding = await h.bind("test/parent", conversation_pattern="t*", priority=5, timeout_seconds=1.5)
    assert binding.timeout_seconds == 1.5
    began = time.time()
    task, child_id = await _wait_child(h, "t1", "hang in child")
    assert Parent.outcome["deadline"] <= began + 1.6
    r = await asyncio.wait_for(task, WAIT)
    assert r.run.status == "timed_out"
    child = await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))
    assert child.status == "timed_out" and child.deadline_at <= r.run.deadline_at


async def test_cancel_request_on_a_child_ends_it_and_the_runner_sees_why(h: HostHarness) -> None:
    task, child_id = await _wait_child(h, "k", "child cut")
    info = await h.client.call("CancelRun", hpb.RunRequestById(run_id=child_id))
    assert info.status == "cancelled" and info.parent_run_id
    Parent.release.set()
    r = await asyncio.wait_for(task, WAIT)
    assert isinstance(Parent.outcome.get("error"), errors.Cancelled), Parent.outcome
    assert r.run.status == "failed"  # the runner let its subagent's error end the run
    assert (await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))).status == "cancelled"


@pytest.mark.parametrize("how", ["cancel request", "child deadline"])
async def test_host_ending_a_child_mid_write_tells_the_runner_why(h: HostHarness, how: str) -> None:
    # The runner writes back to back, so the host's end races a write in flight: grpcio reports such a write as
    # INTERNAL whatever status the call ended with (grpc/grpc#36066); the host's last reply says why instead.
    task, child_id = await _wait_child(h, "w", "flood child" if how == "cancel request" else "flood child timeout")
    if how == "cancel request":
        await h.client.call("CancelRun", hpb.RunRequestById(run_id=child_id))
    r = await asyncio.wait_for(task, WAIT)
    expected, status = (
        (errors.Cancelled, "cancelled") if how == "cancel request" else (errors.DeadlineExceeded, "timed_out")
    )
    assert isinstance(Parent.outcome.get("error"), expected), Parent.outcome
    assert Parent.outcome["result"].status == status and Parent.outcome["result"].child_run_id == child_id
    assert r.run.status == "completed" and r.kinds()[-2:] == ["text_delta", "completed"]
    assert (await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))).status == status


async def test_a_write_in_flight_when_the_host_ends_the_child_tells_the_runner_why(h: HostHarness) -> None:
    """The race of the flood test above, forced: the runner's write is past grpcio's check and waiting in core's
    send while the host cancels the child and ends the call; the send then fails in core, and grpcio reports it as
    INTERNAL and overwrites the call's status with it (grpc/grpc#36066), so neither the write's error nor the
    call's status can say why. The host's in-band last reply does: the runner sees errors.Cancelled."""
    task, child_id = await _wait_child(h, "f", "write in flight")
    child = Parent.outcome["child"]
    await h.client.call("CancelRun", hpb.RunRequestById(run_id=child_id))
    await asyncio.wait_for(asyncio.shield(child._end), WAIT)  # the host's end reached the runner: its call is over
    Parent.release.set()
    r = await asyncio.wait_for(task, WAIT)
    assert Parent.outcome["hook"].failed is not None  # the write did meet the ended call in core
    assert isinstance(Parent.outcome.get("error"), errors.Cancelled), Parent.outcome
    assert r.run.status == "failed"  # the runner let its subagent's error end the run
    assert (await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))).status == "cancelled"


# ---- attacks, with raw stubs ----


def md(run: RunContext, token: str | None = None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token or run.api.run_token}"), ("x-agenthost-plugin", run.api.plugin_secret))


async def open_raw(
    stub: run_api_pb2_grpc.AgentRunAPIProxyStub, run_id: str, metadata: Any, description: str = "d"
) -> tuple[SC, api.ChildRunReply | None]:
    call = stub.ChildRun(metadata=metadata, timeout=10)
    try:
        await call.write(api.ChildRunRequest(header=api.ChildRunHeader(run_id=run_id, description=description)))
        reply = await call.read()
        if reply is grpc.aio.EOF:
            return await call.code(), None
        return SC.OK, reply
    except grpc.RpcError as exc:
        return exc.code(), None
    finally:
        call.cancel()


async def test_child_run_attacks_are_refused(h: HostHarness) -> None:
    a_task = asyncio.create_task(h.send("park", conversation_id="a"))
    a = await asyncio.wait_for(Parent.live.get(), WAIT)
    b_task = asyncio.create_task(h.send("park", conversation_id="b"))
    b = await asyncio.wait_for(Parent.live.get(), WAIT)
    channel = grpc.aio.insecure_channel(h.host.api_address, options=CHANNEL_OPTIONS)
    stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
    try:
        rows_before = len(h.host.run_store.list(limit=1000))
        # a valid token of another run, naming someone else's run as the parent
        assert (await open_raw(stub, b.run_id, md(a)))[0] == SC.PERMISSION_DENIED
        # a forged parent id, and no parent id
        assert (await open_raw(stub, "run_forged", md(a)))[0] == SC.NOT_FOUND
        assert (await open_raw(stub, "", md(a)))[0] == SC.INVALID_ARGUMENT
        # a forged token; no token
        assert (await open_raw(stub, a.run_id, md(a, token="rt_forged")))[0] == SC.UNAUTHENTICATED
        assert (await open_raw(stub, a.run_id, (("x-agenthost-plugin", a.api.plugin_secret),)))[0] == (
            SC.UNAUTHENTICATED
        )
        # the run's tool token holds the same grant: allowed; a bad header is refused
        assert (await open_raw(stub, a.run_id, md(a), description=""))[0] == SC.INVALID_ARGUMENT
        assert (await open_raw(stub, a.run_id, md(a), description="x" * 201))[0] == SC.INVALID_ARGUMENT
        assert len(h.host.run_store.list(limit=1000)) == rows_before
        # a child's id as a parent: children hold no token, and the parent's token names only the parent
        code, reply = await open_raw(stub, a.run_id, md(a))
        assert code == SC.OK and reply is not None
        child_id = reply.started.child_run_id
        assert (await open_raw(stub, child_id, md(a)))[0] == SC.PERMISSION_DENIED
        # a finished run's token
        Parent.release.set()
        await asyncio.wait_for(asyncio.gather(a_task, b_task), WAIT)
        assert (await open_raw(stub, a.run_id, md(a)))[0] == SC.UNAUTHENTICATED
        child = await h.client.call("GetRun", hpb.RunRequestById(run_id=child_id))
        assert child.status in ("cancelled", "failed") and child.finished_at > 0
    finally:
        await channel.close()
    h.host.audit.flush()
    await h.host.db.flush()
    outcomes = {r["outcome"] for r in h.host.audit.rows() if r["method"] == "ChildRun"}
    assert {"PERMISSION_DENIED", "NOT_FOUND", "INVALID_ARGUMENT", "UNAUTHENTICATED", "OK"} <= outcomes


async def test_children_per_run_are_bounded(h: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "CHILD_RUNS_MAX_CONCURRENT", 2)
    monkeypatch.setattr(limits, "CHILD_RUNS_MAX_PER_RUN", 3)
    task = asyncio.create_task(h.send("park", conversation_id="lim"))
    run = await asyncio.wait_for(Parent.live.get(), WAIT)
    channel = grpc.aio.insecure_channel(h.host.api_address, options=CHANNEL_OPTIONS)
    stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
    calls = []
    try:
        for _ in range(2):
            call = stub.ChildRun(metadata=md(run), timeout=10)
            await call.write(api.ChildRunRequest(header=api.ChildRunHeader(run_id=run.run_id, description="d")))
            assert (await call.read()).WhichOneof("kind") == "started"
            calls.append(call)
        assert (await open_raw(stub, run.run_id, md(run)))[0] == SC.RESOURCE_EXHAUSTED  # two open at once
        # the first child ends; a third may open, a fourth never (three over the run's life)
        await calls[0].write(api.ChildRunRequest(events=pb.RunEventBatch(events=[events.completed()])))
        await calls[0].done_writing()
        assert (await calls[0].read()).finished.status == "completed"
        assert (await open_raw(stub, run.run_id, md(run)))[0] == SC.OK
        assert (await open_raw(stub, run.run_id, md(run)))[0] == SC.RESOURCE_EXHAUSTED
    finally:
        for call in calls:
            call.cancel()
        await channel.close()
        Parent.release.set()
        await asyncio.wait_for(task, WAIT)


async def test_host_stop_interrupts_open_children(tmp_path: Path) -> None:
    Parent.reset()
    async with HostHarness(tmp_path, runners=[Parent]) as h:
        task = asyncio.create_task(h.send("hang in child", conversation_id="s"))
        await asyncio.wait_for(Parent.child_open.wait(), WAIT)
        child_id = Parent.outcome["child_id"]
        db_path = h.host.data_dir / "agenthost.db"
    # The harness stopped the host with the child open: it ended with its parent, written before the host closed.
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), WAIT)
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = dict(conn.execute("SELECT run_id, status || ':' || error_code FROM runs").fetchall())
        parent_id = conn.execute("SELECT parent_run_id FROM runs WHERE run_id = ?", (child_id,)).fetchone()[0]
    finally:
        conn.close()
    assert rows[child_id] == "interrupted:host_shutdown" and rows[parent_id] == "interrupted:host_shutdown"


async def test_children_share_their_parents_event_quota(h: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Events moved into children are still the run's: three children of five events each cannot store three
    times a quota of 12 events; the child that would pass it fails with quota_exceeded."""
    monkeypatch.setattr(limits, "RUN_MAX_EVENTS", 12)
    r = await h.send("children fill the quota", conversation_id="q")
    assert Parent.outcome[0] == ("completed", ""), Parent.outcome
    assert Parent.outcome[1] == ("failed", "quota_exceeded"), Parent.outcome
    runs = await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot))
    stored = 0
    for run in runs.runs:
        stored += len((await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=run.run_id))).events)
    # The quota, plus the one failure event each run (parent, two children) may be ended with past it.
    assert stored <= limits.RUN_MAX_EVENTS + 3, (stored, r.run.status)


async def test_one_bot_cannot_hold_every_child_slot(h: HostHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "CHILD_RUNS_MAX_ACTIVE_PER_BOT", 1)
    task, _ = await _wait_child(h, "holder", "hang in child")
    await h.send("try a child", conversation_id="same-bot")
    assert Parent.outcome["try same-bot"] == "RESOURCE_EXHAUSTED"
    await h.client.call("CreateBot", hpb.CreateBotRequest(name="other"))
    await h.client.bind("other", "test/parent")
    await h.client.send("other", "try a child", conversation_id="other-bot")
    assert Parent.outcome["try other-bot"] == "completed"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
