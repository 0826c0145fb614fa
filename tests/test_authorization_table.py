"""The "Authorization" table of the docs (docs/security.md), one test per row, through a real host with raw gRPC
stubs (not the SDK).

Each refusal is checked for its exact status, for an audit row naming the method and outcome, and where the call
could have written something, for an unchanged database. The credentials used are the ones a hostile caller can
actually hold: a valid run token of another run, a valid plugin secret of another plugin process, a run's tool
token, a finished run's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc
from agenthost.protos.wire import CHANNEL_OPTIONS
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.server import serve
from agenthost.runners.sdk.testing import HostHarness

SC = grpc.StatusCode
pytestmark = pytest.mark.timeout(90)
OTHER_PLUGIN = "other"


class Gate:
    """Runs park until their conversation is released; each parked run's context is handed to the test."""

    live: asyncio.Queue[RunContext]
    gates: dict[str, asyncio.Event]
    open_all: bool

    @classmethod
    def reset(cls) -> None:
        cls.live, cls.gates, cls.open_all = asyncio.Queue(), {}, False

    @classmethod
    def event(cls, conversation_id: str) -> asyncio.Event:
        ev = cls.gates.setdefault(conversation_id, asyncio.Event())
        if cls.open_all:
            ev.set()
        return ev

    @classmethod
    def release_all(cls) -> None:
        cls.open_all = True
        for ev in cls.gates.values():
            ev.set()


class Probe(Runner):
    manifest = RunnerManifest(name="probe", permissions=RunnerPermissions(cross_conversation=True))

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await Gate.live.put(run)
        await Gate.event(run.conversation_id).wait()
        yield events.text("released")


class NoCross(Probe):
    """Same behaviour; its manifest does not ask for cross-conversation reads."""

    manifest = RunnerManifest(name="nocross")


class Stranger(Probe):
    manifest = RunnerManifest(name="stranger")


class World:
    def __init__(self, h: HostHarness, stub: run_api_pb2_grpc.AgentRunAPIProxyStub, other_secret: str) -> None:
        self.h = h
        self.stub = stub
        self.other_secret = other_secret  # a valid plugin secret, registered with the host for plugin `other`
        self.sends: list[asyncio.Task[Any]] = []
        self.sending: dict[str, asyncio.Task[Any]] = {}  # conversation -> its latest send

    async def start(self, conversation_id: str, text: str = "hello") -> RunContext:
        self.sends.append(asyncio.create_task(self.h.send(text, conversation_id=conversation_id)))
        self.sending[conversation_id] = self.sends[-1]
        run = await asyncio.wait_for(Gate.live.get(), 10)
        assert run.conversation_id == conversation_id
        return run

    async def finish(self, run: RunContext) -> None:
        Gate.event(run.conversation_id).set()
        # Until its send is answered the run's last rows may still be on their way to the database (its grant goes
        # first): a digest taken before then changed under a call that changed nothing, at load 12 with -n 4.
        await asyncio.wait_for(asyncio.shield(self.sending[run.conversation_id]), 60)
        await self.h.host.db.flush()
        for _ in range(500):
            if self.h.host.grants.get(run.run_id) is None:
                Gate.gates.pop(run.conversation_id, None)  # the conversation's next run parks again
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"run {run.run_id} did not end")

    async def audit(self) -> list[sqlite3.Row]:
        self.h.host.audit.flush()
        await self.h.host.db.flush()
        return self.h.host.audit.rows()

    def digest(self) -> str:
        """Every data table but the audit log: equal digests mean a call changed nothing."""
        conn = sqlite3.connect(f"file:{self.h.host.data_dir / 'agenthost.db'}?mode=ro", uri=True)
        try:
            h = hashlib.sha256()
            for table in ("events", "transcript", "runs", "artifacts", "state"):
                for row in sorted(repr(r) for r in conn.execute(f"SELECT * FROM {table}")):
                    h.update(row.encode())
            return h.hexdigest()
        finally:
            conn.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    Gate.reset()
    other_stop, other_ready = asyncio.Event(), asyncio.Event()
    other_task: asyncio.Task[None] | None = None
    async with HostHarness(tmp_path, runners=[Probe, NoCross]) as h:
        # A second, real runner server with its own secret, adopted by the host as plugin `other`: its secret is
        # exactly what a compromised neighbouring plugin process holds.
        other_secret = secrets.token_urlsafe(32)
        address = f"unix:{h.host.runtime_dir / 'other-runner.sock'}"
        other_task = asyncio.create_task(
            serve(
                {"stranger": Stranger},
                plugin_id=OTHER_PLUGIN,
                listen=address,
                host_address=h.host.api_address,
                plugin_secret=other_secret,
                data_dir=tmp_path / "other-data",
                ready=other_ready,
                stop=other_stop,
            )
        )
        await asyncio.wait_for(other_ready.wait(), 10)
        await h.host.supervisor.attach(OTHER_PLUGIN, address, other_secret, {"stranger": Stranger.manifest})
        channel = grpc.aio.insecure_channel(h.host.api_address, options=CHANNEL_OPTIONS)
        w = World(h, run_api_pb2_grpc.AgentRunAPIProxyStub(channel), other_secret)
        try:
            yield w
        finally:
            Gate.release_all()
            await asyncio.wait_for(asyncio.gather(*w.sends, return_exceptions=True), 20)
            await channel.close()
    other_stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(other_task, 10)


def md(token: str | None, secret: str | None) -> tuple[tuple[str, str], ...]:
    out = []
    if token is not None:
        out.append(("authorization", f"Bearer {token}"))
    if secret is not None:
        out.append(("x-agenthost-plugin", secret))
    return tuple(out)


def own(run: RunContext) -> tuple[tuple[str, str], ...]:
    return md(run.api.run_token, run.api.plugin_secret)


async def code_of(call: Any) -> SC:
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except grpc.RpcError as exc:
        return exc.code()
    return SC.OK


def state_get(w: World, run_id: str, metadata: Any, key: str = "k", scope: int = pb.CONVERSATION) -> Any:
    return w.stub.StateGet(api.StateGetRequest(run_id=run_id, scope=scope, key=key), metadata=metadata, timeout=10)


def state_set(w: World, run_id: str, metadata: Any, value: str = '"changed"', **kw: Any) -> Any:
    req = api.StateSetRequest(run_id=run_id, scope=kw.pop("scope", pb.CONVERSATION), key="k", value_json=value, **kw)
    return w.stub.StateSet(req, metadata=metadata, timeout=10)


def calls_for(w: World, run: RunContext, artifact_id: str) -> dict[str, Callable[[Any], Any]]:
    """One well-formed call per run API method, each of which the run could make if its grant allowed it."""
    rid = run.run_id

    def upload(metadata: Any) -> Any:
        parts = [
            api.ArtifactUpload(header=api.ArtifactHeader(run_id=rid, name="n.txt", expected_size=3)),
            api.ArtifactUpload(data=b"new"),
        ]
        return w.stub.ArtifactCreate(iter(parts), metadata=metadata, timeout=10)

    return {
        "HistoryPage": lambda m: w.stub.HistoryPage(api.HistoryPageRequest(run_id=rid), metadata=m, timeout=10),
        "HistorySearch": lambda m: w.stub.HistorySearch(
            api.HistorySearchRequest(run_id=rid, query="hello"), metadata=m, timeout=10
        ),
        "EventGet": lambda m: w.stub.EventGet(
            api.EventGetRequest(run_id=rid, event_id=run.context.event.event_id), metadata=m, timeout=10
        ),
        "EventPage": lambda m: w.stub.EventPage(api.EventPageRequest(run_id=rid), metadata=m, timeout=10),
        "ArtifactMetadata": lambda m: w.stub.ArtifactMetadata(
            api.ArtifactMetadataRequest(run_id=rid, artifact_id=artifact_id), metadata=m, timeout=10
        ),
        "ArtifactReadRange": lambda m: w.stub.ArtifactReadRange(
            api.ArtifactReadRangeRequest(run_id=rid, artifact_id=artifact_id), metadata=m, timeout=10
        ),
        "ArtifactRead": lambda m: w.stub.ArtifactRead(
            api.ArtifactReadRequest(run_id=rid, artifact_id=artifact_id), metadata=m, timeout=10
        ),
        "ArtifactCreate": upload,
        "StateGet": lambda m: state_get(w, rid, m, scope=pb.RUN),
        "StateList": lambda m: w.stub.StateList(api.StateListRequest(run_id=rid, scope=pb.RUN), metadata=m, timeout=10),
        "StateSet": lambda m: state_set(w, rid, m, scope=pb.RUN),
        "StateDelete": lambda m: w.stub.StateDelete(
            api.StateDeleteRequest(run_id=rid, scope=pb.RUN, key="k"), metadata=m, timeout=10
        ),
        "KbSearch": lambda m: w.stub.KbSearch(api.KbSearchRequest(run_id=rid, query="hello"), metadata=m, timeout=10),
        # Nobody answers: it resolves as a timeout almost at once (and OK: the call itself was allowed).
        "RequestApproval": lambda m: w.stub.RequestApproval(
            api.ApprovalRequest(run_id=rid, tool_name="shell", timeout_seconds=0.05), metadata=m, timeout=10
        ),
        "ChildRun": lambda m: child_run(w, rid, m),
    }


async def child_run(w: World, run_id: str, metadata: Any, description: str = "sub") -> None:
    """A whole child run as a runner makes one: the header, the host's `started`, its one terminal event, the
    host's `finished`. Raises the call's error."""
    call = w.stub.ChildRun(metadata=metadata, timeout=10)
    try:
        await call.write(api.ChildRunRequest(header=api.ChildRunHeader(run_id=run_id, description=description)))
        if (await call.read()) is grpc.aio.EOF:  # ended without a reply: its status, as the error it is
            raise grpc.aio.AioRpcError(
                await call.code(), grpc.aio.Metadata(), grpc.aio.Metadata(), await call.details()
            )
        await call.write(api.ChildRunRequest(events=pb.RunEventBatch(events=[pb.RunEvent(completed=pb.Completed())])))
        await call.done_writing()
        assert (await call.read()).finished.status == "completed"
    finally:
        call.cancel()


async def audited(w: World, method: str, outcome: str, run_id: str | None = None) -> bool:
    return any(
        r["method"] == method and r["outcome"] == outcome and (run_id is None or r["run_id"] == run_id)
        for r in await w.audit()
    )


# ---- row: request bytes that do not parse → INVALID_ARGUMENT, audited ----


async def test_row_unparseable_request_is_invalid_argument(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    channel = grpc.aio.insecure_channel(w.h.host.api_address, options=CHANNEL_OPTIONS)
    try:
        raw = channel.unary_unary(
            f"/{api.DESCRIPTOR.services_by_name['AgentRunAPIProxy'].full_name}/StateGet",
            request_serializer=lambda b: b,
            response_deserializer=api.StateValue.FromString,
        )
        # A truncated length-delimited field: not a StateGetRequest.
        assert await code_of(raw(b"\x0a\xff\x01ab", metadata=own(r1), timeout=10)) == SC.INVALID_ARGUMENT
    finally:
        await channel.close()
    assert await audited(w, "StateGet", "INVALID_ARGUMENT")


# ---- row: no token, forged token, token of an ended run → UNAUTHENTICATED ----


async def test_row_missing_forged_or_ended_token_is_unauthenticated(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    ended = await w.start("ended")
    await w.finish(ended)
    assert await code_of(state_get(w, r1.run_id, md(None, r1.api.plugin_secret))) == SC.UNAUTHENTICATED
    assert await code_of(state_get(w, r1.run_id, md("rt_forged", r1.api.plugin_secret))) == SC.UNAUTHENTICATED
    assert await code_of(state_get(w, r1.run_id, (("authorization", r1.api.run_token),))) == SC.UNAUTHENTICATED
    assert await code_of(state_get(w, ended.run_id, own(ended))) == SC.UNAUTHENTICATED
    assert await code_of(state_get(w, ended.run_id, md(ended.tool_token, None))) == SC.UNAUTHENTICATED
    assert await code_of(state_get(w, r1.run_id, own(r1))) == SC.OK
    assert await audited(w, "StateGet", "UNAUTHENTICATED")


# ---- row: empty run id, malformed arguments, bad cursors, bad state keys or JSON → INVALID_ARGUMENT ----


async def test_row_bad_arguments_are_invalid_argument(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    r2 = await w.start("c2")
    m = own(r1)
    await r1.api.state_set("conversation", "k", "original")
    before = w.digest()
    assert await code_of(state_get(w, "", m)) == SC.INVALID_ARGUMENT
    assert await code_of(state_get(w, r1.run_id, m, scope=99)) == SC.INVALID_ARGUMENT
    bad_direction = api.HistoryPageRequest(run_id=r1.run_id, direction=7)
    assert await code_of(w.stub.HistoryPage(bad_direction, metadata=m)) == SC.INVALID_ARGUMENT
    garbage = api.HistoryPageRequest(run_id=r1.run_id, cursor="garbage!")
    assert await code_of(w.stub.HistoryPage(garbage, metadata=m)) == SC.INVALID_ARGUMENT
    theirs = await w.stub.HistoryPage(api.HistoryPageRequest(run_id=r2.run_id, limit=1), metadata=own(r2))
    stolen = api.HistoryPageRequest(run_id=r1.run_id, cursor=theirs.items[0].cursor)
    assert await code_of(w.stub.HistoryPage(stolen, metadata=m)) == SC.INVALID_ARGUMENT
    for key in ("", "a\nb", "../x\x00", "x" * 300):
        assert await code_of(state_get(w, r1.run_id, m, key=key)) == SC.INVALID_ARGUMENT, key
    for value in ("{nope", "NaN", "[" * 5000 + "]" * 5000):
        assert await code_of(state_set(w, r1.run_id, m, value=value)) == SC.INVALID_ARGUMENT, value[:20]
    assert w.digest() == before
    assert await r1.api.state_get("conversation", "k") == "original"
    assert await audited(w, "StateSet", "INVALID_ARGUMENT", r1.run_id)


# ---- row: unknown run id → NOT_FOUND ----


async def test_row_unknown_run_is_not_found(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    assert await code_of(state_get(w, "run_doesnotexist", own(r1))) == SC.NOT_FOUND
    assert await code_of(state_get(w, "run_doesnotexist", md(r1.tool_token, None))) == SC.NOT_FOUND
    assert await audited(w, "StateGet", "NOT_FOUND", "run_doesnotexist")


# ---- row: token of another run; token presented by another plugin process → PERMISSION_DENIED ----


async def test_row_token_of_another_run_is_denied(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    r2 = await w.start("c2")
    await r2.api.state_set("conversation", "k", "r2's")
    before = w.digest()
    # r1's valid credentials aimed at r2, for a read and for a write
    assert await code_of(state_get(w, r2.run_id, own(r1))) == SC.PERMISSION_DENIED
    assert await code_of(state_set(w, r2.run_id, own(r1))) == SC.PERMISSION_DENIED
    # a finished run's id is still another run's
    ended = await w.start("ended")
    await w.finish(ended)
    before = w.digest()
    assert await code_of(state_get(w, ended.run_id, own(r1))) == SC.PERMISSION_DENIED
    assert w.digest() == before
    assert await r2.api.state_get("conversation", "k") == "r2's"
    assert await audited(w, "StateSet", "PERMISSION_DENIED", r2.run_id)


async def test_row_run_token_with_another_plugin_process_secret_is_denied(world: World) -> None:
    """The run token is bound to the plugin process it was issued to: a neighbour that learns the token but holds
    only its own (valid, registered) secret is refused; so are a missing and a made-up secret."""
    w = world
    r1 = await w.start("c1")
    assert OTHER_PLUGIN in {p for p in w.h.host.grants._plugins_by_secret.values()}  # the other secret is live
    await r1.api.state_set("conversation", "k", "original")
    before = w.digest()
    for secret in (w.other_secret, None, "", r1.api.plugin_secret + "x"):
        assert await code_of(state_get(w, r1.run_id, md(r1.api.run_token, secret))) == SC.PERMISSION_DENIED, secret
        assert await code_of(state_set(w, r1.run_id, md(r1.api.run_token, secret))) == SC.PERMISSION_DENIED, secret
    assert w.digest() == before
    assert await code_of(state_get(w, r1.run_id, own(r1))) == SC.OK  # the same token with its own secret
    rows = [r for r in await w.audit() if r["run_id"] == r1.run_id and r["outcome"] == "PERMISSION_DENIED"]
    assert {r["method"] for r in rows} == {"StateGet", "StateSet"} and len(rows) == 8


async def test_row_tool_token_stands_alone_but_only_for_its_run(world: World) -> None:
    """The tool token (held by processes started on the run's behalf, which never see the plugin secret) needs no
    secret — and cannot be turned on another run, with or without a secret."""
    w = world
    ra = await w.start("c1")
    rb = await w.start("c2")
    assert ra.tool_token and ra.tool_token != ra.api.run_token
    await rb.api.state_set("conversation", "k", "b's")
    assert await code_of(state_set(w, ra.run_id, md(ra.tool_token, None), value='"via tool"')) == SC.OK
    assert await ra.api.state_get("conversation", "k") == "via tool"
    before = w.digest()
    for secret in (None, ra.api.plugin_secret, w.other_secret):
        assert await code_of(state_get(w, rb.run_id, md(ra.tool_token, secret))) == SC.PERMISSION_DENIED, secret
        assert await code_of(state_set(w, rb.run_id, md(ra.tool_token, secret))) == SC.PERMISSION_DENIED, secret
    assert w.digest() == before
    assert await rb.api.state_get("conversation", "k") == "b's"
    # and it ends with its run
    await w.finish(ra)
    assert await code_of(state_get(w, ra.run_id, md(ra.tool_token, None))) == SC.UNAUTHENTICATED


# ---- row: run finished or past its deadline → FAILED_PRECONDITION ----


async def test_row_finished_run_is_failed_precondition(world: World) -> None:
    w = world
    run = await w.start("c1")
    active = w.h.host.grants.get(run.run_id)
    assert active is not None
    # The host marks a run finished when it sees the terminal event, and revokes its tokens once its final write
    # committed; in between, this check is what refuses the run's own credentials. Marking the live run finished
    # holds that window open.
    active.finished = True
    before = w.digest()
    assert await code_of(state_get(w, run.run_id, own(run))) == SC.FAILED_PRECONDITION
    assert await code_of(state_set(w, run.run_id, md(run.tool_token, None))) == SC.FAILED_PRECONDITION
    assert w.digest() == before
    assert await audited(w, "StateSet", "FAILED_PRECONDITION", run.run_id)
    active.finished = False
    assert await code_of(state_get(w, run.run_id, own(run))) == SC.OK


async def test_row_run_past_its_deadline_is_failed_precondition(world: World) -> None:
    w = world
    run = await w.start("c1")
    active = w.h.host.grants.get(run.run_id)
    assert active is not None
    # The host cancels a run at its deadline; between that instant and the revocation, the deadline check is what
    # stands. Moving the deadline into the past opens that window for as long as the test needs it.
    active.deadline_at = time.time() - 1
    before = w.digest()
    assert await code_of(state_set(w, run.run_id, own(run))) == SC.FAILED_PRECONDITION
    assert await code_of(state_get(w, run.run_id, md(run.tool_token, None))) == SC.FAILED_PRECONDITION
    assert w.digest() == before
    active.deadline_at = time.time() + 60
    assert await code_of(state_get(w, run.run_id, own(run))) == SC.OK


# ---- row: API, state scope, conversation, event or artifact outside the frozen grant → PERMISSION_DENIED ----


async def test_row_methods_outside_the_grant_are_denied(world: World) -> None:
    """Every method the binding did not grant is refused (not one sample of them), and every granted one works."""
    w = world
    # A full-grant run leaves an artifact and an event in conversation n1, then a narrowing binding takes over n1.
    seed = await w.start("n1", "seed")
    art = await seed.api.artifact_create(b"data of n1", name="a.txt")
    await w.finish(seed)
    await w.h.bind("test/probe", conversation_pattern="n1", priority=5, apis=["history.page", "state.read"])
    run = await w.start("n1")
    assert set(run.context.resources.apis) == {"history.page", "state.read"}
    # RequestApproval is granted to every run (plugins.manifest.ALWAYS_GRANTED_METHODS): asking grants nothing.
    granted = {"HistoryPage", "StateGet", "StateList", "RequestApproval"}
    calls = calls_for(w, run, art.artifact_id)
    assert len(calls) == len(api.DESCRIPTOR.services_by_name["AgentRunAPIProxy"].methods)
    before = w.digest()
    outcomes = {name: await code_of(call(own(run))) for name, call in calls.items()}
    assert outcomes == {name: SC.OK if name in granted else SC.PERMISSION_DENIED for name in calls}
    # the tool token carries the same grant, no wider
    tool = {name: await code_of(call(md(run.tool_token, None))) for name, call in calls.items()}
    assert tool == outcomes
    assert w.digest() == before
    denied = {r["method"] for r in await w.audit() if r["run_id"] == run.run_id and r["outcome"] == "PERMISSION_DENIED"}
    assert denied == set(calls) - granted


async def test_row_state_scope_outside_the_grant_is_denied(world: World) -> None:
    w = world
    await w.h.bind("test/probe", conversation_pattern="s1", priority=5, state_scopes=[pb.RUN])
    run = await w.start("s1")
    before = w.digest()
    for scope in (pb.CONVERSATION, pb.ACTOR, pb.BINDING, pb.RUNNER):
        assert await code_of(state_get(w, run.run_id, own(run), scope=scope)) == SC.PERMISSION_DENIED, scope
        assert await code_of(state_set(w, run.run_id, own(run), scope=scope)) == SC.PERMISSION_DENIED, scope
    assert w.digest() == before
    assert await code_of(state_set(w, run.run_id, own(run), scope=pb.RUN)) == SC.OK


async def test_row_other_conversations_events_and_artifacts_are_denied(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    r2 = await w.start("c2")
    theirs = await r2.api.artifact_create(b"secret of c2", name="s.txt")
    m = own(r1)
    page = api.HistoryPageRequest(run_id=r1.run_id, conversation_id="c2")
    assert await code_of(w.stub.HistoryPage(page, metadata=m)) == SC.PERMISSION_DENIED
    search = api.HistorySearchRequest(run_id=r1.run_id, conversation_id="c2", query="hello")
    assert await code_of(w.stub.HistorySearch(search, metadata=m)) == SC.PERMISSION_DENIED
    events_page = api.EventPageRequest(run_id=r1.run_id, conversation_id="c2")
    assert await code_of(w.stub.EventPage(events_page, metadata=m)) == SC.PERMISSION_DENIED
    event = api.EventGetRequest(run_id=r1.run_id, event_id=r2.context.event.event_id)
    assert await code_of(w.stub.EventGet(event, metadata=m)) == SC.PERMISSION_DENIED
    their_id = theirs.artifact_id
    for call in (
        w.stub.ArtifactMetadata(api.ArtifactMetadataRequest(run_id=r1.run_id, artifact_id=their_id), metadata=m),
        w.stub.ArtifactReadRange(
            api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=theirs.artifact_id), metadata=m
        ),
        w.stub.ArtifactRead(api.ArtifactReadRequest(run_id=r1.run_id, artifact_id=theirs.artifact_id), metadata=m),
    ):
        assert await code_of(call) == SC.PERMISSION_DENIED


async def test_row_cross_conversation_globs_need_the_manifest_to_ask(world: World) -> None:
    """A binding that names cross-conversation globs for a runner whose manifest did not ask for them grants
    nothing across conversations; the same globs on a runner that asked do."""
    w = world
    shared = await w.start("shared-1", "shared fact")
    await w.finish(shared)
    await w.h.bind("test/nocross", conversation_pattern="nc", priority=5, cross_conversation=["shared-*"])
    await w.h.bind("test/probe", conversation_pattern="yc", priority=5, cross_conversation=["shared-*"])
    refused = await w.start("nc")
    allowed = await w.start("yc")
    assert list(refused.context.resources.cross_conversation_patterns) == []
    assert list(allowed.context.resources.cross_conversation_patterns) == ["shared-*"]
    event_id = shared.context.event.event_id
    for run, expected in ((refused, SC.PERMISSION_DENIED), (allowed, SC.OK)):
        m = own(run)
        page = api.HistoryPageRequest(run_id=run.run_id, conversation_id="shared-1")
        assert await code_of(w.stub.HistoryPage(page, metadata=m)) == expected, run.runner_name
        search = api.HistorySearchRequest(run_id=run.run_id, conversation_id="shared-1", query="fact")
        assert await code_of(w.stub.HistorySearch(search, metadata=m)) == expected
        events_page = api.EventPageRequest(run_id=run.run_id, conversation_id="shared-1")
        assert await code_of(w.stub.EventPage(events_page, metadata=m)) == expected
        ev = api.EventGetRequest(run_id=run.run_id, event_id=event_id)
        assert await code_of(w.stub.EventGet(ev, metadata=m)) == expected
        # a conversation outside the glob stays closed to both
        private = api.HistoryPageRequest(run_id=run.run_id, conversation_id="c1")
        assert await code_of(w.stub.HistoryPage(private, metadata=m)) == SC.PERMISSION_DENIED


# ---- row: sizes over the caps, offsets past the end → OUT_OF_RANGE ----


async def test_row_over_caps_are_out_of_range(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    m = own(r1)
    art = await r1.api.artifact_create(b"abc", name="a")
    for call in (
        w.stub.HistoryPage(api.HistoryPageRequest(run_id=r1.run_id, limit=101), metadata=m),
        w.stub.EventPage(api.EventPageRequest(run_id=r1.run_id, limit=101), metadata=m),
        w.stub.HistorySearch(api.HistorySearchRequest(run_id=r1.run_id, query="x", top_k=51), metadata=m),
        w.stub.ArtifactReadRange(
            api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=art.artifact_id, length=1024 * 1024 + 1),
            metadata=m,
        ),
        w.stub.ArtifactReadRange(
            api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=art.artifact_id, offset=4), metadata=m
        ),
    ):
        assert await code_of(call) == SC.OUT_OF_RANGE


# ---- row: value, message, artifact over their limits → RESOURCE_EXHAUSTED ----


async def test_row_over_limits_are_resource_exhausted(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    m = own(r1)
    await r1.api.state_set("conversation", "k", "original")
    before = w.digest()
    assert await code_of(state_set(w, r1.run_id, m, value='"' + "x" * (257 * 1024) + '"')) == SC.RESOURCE_EXHAUSTED
    huge = api.HistorySearchRequest(run_id=r1.run_id, query="x" * (9 * 1024 * 1024))
    assert await code_of(w.stub.HistorySearch(huge, metadata=m)) == SC.RESOURCE_EXHAUSTED
    header = api.ArtifactHeader(run_id=r1.run_id, name="big", expected_size=256 * 1024 * 1024 + 1)
    upload = w.stub.ArtifactCreate(iter([api.ArtifactUpload(header=header)]), metadata=m)
    assert await code_of(upload) == SC.RESOURCE_EXHAUSTED
    assert w.digest() == before


# ---- row: stale if_version → ABORTED ----


async def test_row_stale_version_is_aborted(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    await r1.api.state_set("conversation", "k", "original")
    before = w.digest()
    assert await code_of(state_set(w, r1.run_id, own(r1), if_version=99)) == SC.ABORTED
    assert w.digest() == before


# ---- row: a bug in the host → INTERNAL, logged and audited, never UNKNOWN ----


async def test_row_host_bug_is_internal(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    w = world
    r1 = await w.start("c1")

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("simulated host bug")

    monkeypatch.setattr(w.h.host.state, "get", broken)
    assert await code_of(state_get(w, r1.run_id, own(r1))) == SC.INTERNAL
    assert await audited(w, "StateGet", "INTERNAL", r1.run_id)


# ---- RequestApproval: always granted, but only for the caller's own run, bounded, and validated ----


def approval(w: World, run_id: str, metadata: Any, **kw: Any) -> Any:
    kw.setdefault("tool_name", "shell")
    kw.setdefault("timeout_seconds", 0.05)
    return w.stub.RequestApproval(api.ApprovalRequest(run_id=run_id, **kw), metadata=metadata, timeout=10)


async def test_row_request_approval_for_another_run_is_denied(world: World) -> None:
    """A runner cannot put a prompt into another run's stream: its token and its tool token are refused for any
    run but their own, and nothing is left pending."""
    w = world
    r1 = await w.start("c1")
    r2 = await w.start("c2")
    for metadata in (own(r1), md(r1.tool_token, None), md(r1.api.run_token, w.other_secret)):
        assert await code_of(approval(w, r2.run_id, metadata, timeout_seconds=30)) == SC.PERMISSION_DENIED
    assert await code_of(approval(w, "run_doesnotexist", own(r1))) == SC.NOT_FOUND
    assert w.h.host.runs.approvals.pending_count == 0
    assert await audited(w, "RequestApproval", "PERMISSION_DENIED", r2.run_id)
    # the tool token may ask for its own run (a harness's permission prompt goes through it)
    assert await code_of(approval(w, r1.run_id, md(r1.tool_token, None))) == SC.OK
    ended = await w.start("ended")
    await w.finish(ended)
    assert await code_of(approval(w, ended.run_id, own(ended))) == SC.UNAUTHENTICATED


async def test_row_request_approval_bad_arguments(world: World) -> None:
    w = world
    r1 = await w.start("c1")
    m = own(r1)
    for kw in (
        {"tool_name": ""},
        {"tool_name": "x" * 129},
        {"tool_name": "a\nb"},
        {"arguments_json": "{nope"},
        {"timeout_seconds": -1},
        {"timeout_seconds": float("nan")},
    ):
        assert await code_of(approval(w, r1.run_id, m, **kw)) == SC.INVALID_ARGUMENT, kw
    big = '"' + "x" * (257 * 1024) + '"'
    assert await code_of(approval(w, r1.run_id, m, arguments_json=big)) == SC.RESOURCE_EXHAUSTED
    assert w.h.host.runs.approvals.pending_count == 0
    assert await audited(w, "RequestApproval", "INVALID_ARGUMENT", r1.run_id)


async def test_row_request_approval_hung_up_by_the_runner_is_withdrawn(world: World) -> None:
    """A runner that stops waiting (its call cut by a deadline, its process gone) leaves nothing pending: the
    approval resolves as cancelled and a late decision is refused."""
    w = world
    r1 = await w.start("c1")
    call = approval(w, r1.run_id, own(r1), timeout_seconds=60)
    approvals = w.h.host.runs.approvals
    for _ in range(500):
        if approvals.pending_count:
            break
        await asyncio.sleep(0.01)
    (pending,) = approvals.list(bot_ids=None)
    call.cancel()  # grpc.aio: awaiting a cancelled call raises CancelledError, not an RpcError
    with contextlib.suppress(asyncio.CancelledError):
        await call
    for _ in range(500):
        if not approvals.pending_count:
            break
        await asyncio.sleep(0.01)
    assert approvals.pending_count == 0
    found = approvals.find(pending.approval_id)
    assert found is not None and found.status == "cancelled"
    assert found.resolved.note == "the runner stopped waiting"


# ---- row: ChildRun opens a child only under the caller's own, running run ----


async def test_row_child_run_only_under_the_callers_own_running_run(world: World) -> None:
    """A child run is recorded under the run whose token opens it, and nowhere else: another run's valid token, a
    neighbouring plugin's secret, a forged or a child's id as the parent, a finished run's token are all refused
    before anything is recorded."""
    w = world
    r1 = await w.start("c1")
    r2 = await w.start("c2")
    before = w.digest()
    assert await code_of(child_run(w, r2.run_id, own(r1))) == SC.PERMISSION_DENIED
    assert await code_of(child_run(w, r1.run_id, md(r1.api.run_token, w.other_secret))) == SC.PERMISSION_DENIED
    assert await code_of(child_run(w, "run_forged", own(r1))) == SC.NOT_FOUND
    assert await code_of(child_run(w, r1.run_id, md("rt_forged", r1.api.plugin_secret))) == SC.UNAUTHENTICATED
    assert await code_of(child_run(w, r1.run_id, own(r1), description="")) == SC.INVALID_ARGUMENT
    assert w.digest() == before
    # the run's own token (and its tool token: same grant) records a child of it
    assert await code_of(child_run(w, r1.run_id, own(r1))) == SC.OK
    assert await code_of(child_run(w, r1.run_id, md(r1.tool_token, None))) == SC.OK
    children = w.h.host.run_store.children(r1.run_id)
    assert len(children) == 2 and w.h.host.run_store.children(r2.run_id) == []
    # a child holds no token: naming it as a parent with the parent's token is naming another run
    assert await code_of(child_run(w, children[0], own(r1))) == SC.PERMISSION_DENIED
    ended = await w.start("ended")
    await w.finish(ended)
    assert await code_of(child_run(w, ended.run_id, own(ended))) == SC.UNAUTHENTICATED
    assert w.h.host.run_store.children(ended.run_id) == []
    assert await audited(w, "ChildRun", "PERMISSION_DENIED", r2.run_id)
