"""Every rejection path of AgentRunAPIProxy, driven with raw gRPC stubs (not the SDK) against a real host.

Each case asserts the status code, that the audit log recorded the refusal, and that nothing changed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc
from agenthost.protos.errors import PermissionDenied
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.testing import HostHarness

SC = grpc.StatusCode


class Probe(Runner):
    """Parks each run until released, handing its RunContext to the test."""

    manifest = RunnerManifest(name="probe", permissions=RunnerPermissions(cross_conversation=True))
    live: asyncio.Queue[RunContext]
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await Probe.live.put(run)
        await Probe.release.wait()
        yield events.text("released")


@contextlib.asynccontextmanager
async def parked_runs(tmp_path, host_database):  # noqa: ANN001, ANN201
    """A host with two Probe runs parked (conversations c1 and c2): (harness, stub, run of c1, run of c2)."""
    Probe.live = asyncio.Queue()
    Probe.release = asyncio.Event()
    async with HostHarness(tmp_path, runners=[Probe], host_options=host_database) as h:
        channel = grpc.aio.insecure_channel(h.host.api_address)
        stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
        sends = [asyncio.create_task(h.send(f"hello from {c}", conversation_id=c)) for c in ("c1", "c2")]
        runs = {}
        for _ in sends:
            run = await asyncio.wait_for(Probe.live.get(), 10)
            runs[run.conversation_id] = run
        yield h, stub, runs["c1"], runs["c2"]
        Probe.release.set()
        await asyncio.gather(*sends)
        await channel.close()


@pytest.fixture
async def world(tmp_path, host_database):
    async with parked_runs(tmp_path, host_database) as parked:
        yield parked


def md(run: RunContext, token: str | None = None, secret: str | None = None) -> tuple[tuple[str, str], ...]:
    out = []
    if token != "":
        out.append(("authorization", f"Bearer {token or run.api.run_token}"))
    out.append(("x-agenthost-plugin", secret or run.api.plugin_secret))
    return tuple(out)


async def status_of(coro) -> SC:
    try:
        await coro
    except grpc.RpcError as exc:
        return exc.code()
    return SC.OK


async def test_token_and_run_checks(world):
    h, stub, r1, r2 = world

    def get(run_id, metadata):
        return stub.StateGet(api.StateGetRequest(run_id=run_id, scope=pb.CONVERSATION, key="k"), metadata=metadata)

    assert await status_of(get(r1.run_id, md(r1))) == SC.OK
    assert await status_of(get(r1.run_id, md(r1, token=""))) == SC.UNAUTHENTICATED
    assert await status_of(get(r1.run_id, md(r1, token="rt_forged"))) == SC.UNAUTHENTICATED
    assert await status_of(get(r2.run_id, md(r1))) == SC.PERMISSION_DENIED  # r1's token on r2
    assert await status_of(get("run_doesnotexist", md(r1))) == SC.NOT_FOUND
    assert await status_of(get("", md(r1))) == SC.INVALID_ARGUMENT
    assert await status_of(get(r1.run_id, md(r1, secret=r2.api.plugin_secret + "x"))) == SC.PERMISSION_DENIED
    # expired and finished runs whose token is not yet revoked
    active = h.host.grants.get(r1.run_id)
    active.deadline_at = time.time() - 1
    assert await status_of(get(r1.run_id, md(r1))) == SC.FAILED_PRECONDITION
    active.deadline_at = time.time() + 60
    active.finished = True
    assert await status_of(get(r1.run_id, md(r1))) == SC.FAILED_PRECONDITION
    active.finished = False
    h.host.audit.flush()
    await h.host.db.flush()
    outcomes = [row["outcome"] for row in h.host.audit.rows()]
    for code in ("UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION"):
        assert code in outcomes


async def test_replayed_token_after_run_ends(world):
    h, stub, r1, _ = world
    Probe.release.set()
    for _ in range(100):
        if h.host.grants.get(r1.run_id) is None:
            break
        await asyncio.sleep(0.02)
    req = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
    assert await status_of(stub.StateGet(req, metadata=md(r1))) == SC.UNAUTHENTICATED


async def test_scope_conversation_and_artifact_isolation(world):
    h, stub, r1, r2 = world
    m1 = md(r1)
    # cross-conversation: not granted by the binding → denied; granted by a binding → allowed (see below)
    page = api.HistoryPageRequest(run_id=r1.run_id, conversation_id="c2")
    assert await status_of(stub.HistoryPage(page, metadata=m1)) == SC.PERMISSION_DENIED
    # another conversation's cursor on my conversation
    other = await stub.HistoryPage(api.HistoryPageRequest(run_id=r2.run_id, limit=1), metadata=md(r2))
    assert other.items
    stolen = api.HistoryPageRequest(run_id=r1.run_id, cursor=other.items[0].cursor)
    assert await status_of(stub.HistoryPage(stolen, metadata=m1)) == SC.INVALID_ARGUMENT
    assert (
        await status_of(stub.HistoryPage(api.HistoryPageRequest(run_id=r1.run_id, cursor="garbage!"), metadata=m1))
        == SC.INVALID_ARGUMENT
    )
    # another conversation's artifact and event
    art = await r2.api.artifact_create(b"secret of c2", name="s.txt")
    req = api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=art.artifact_id)
    assert await status_of(stub.ArtifactReadRange(req, metadata=m1)) == SC.PERMISSION_DENIED
    ev = api.EventGetRequest(run_id=r1.run_id, event_id=r2.context.event.event_id)
    assert await status_of(stub.EventGet(ev, metadata=m1)) == SC.PERMISSION_DENIED
    unknown = api.ArtifactMetadataRequest(run_id=r1.run_id, artifact_id="art_nope")
    assert await status_of(stub.ArtifactMetadata(unknown, metadata=m1)) == SC.NOT_FOUND
    # state is per conversation: r2 cannot see r1's value
    await r1.api.state_set("conversation", "mine", {"v": 1})
    assert await r2.api.state_get("conversation", "mine") is None
    assert (
        await status_of(stub.StateGet(api.StateGetRequest(run_id=r1.run_id, scope=99, key="k"), metadata=m1))
        == SC.INVALID_ARGUMENT
    )


async def test_caps_and_bad_arguments_change_nothing(world):
    h, stub, r1, _ = world
    m1 = md(r1)
    assert (
        await status_of(stub.HistoryPage(api.HistoryPageRequest(run_id=r1.run_id, limit=1000), metadata=m1))
        == SC.OUT_OF_RANGE
    )
    assert (
        await status_of(stub.HistoryPage(api.HistoryPageRequest(run_id=r1.run_id, direction=7), metadata=m1))
        == SC.INVALID_ARGUMENT
    )
    assert (
        await status_of(
            stub.HistorySearch(api.HistorySearchRequest(run_id=r1.run_id, query="x", top_k=500), metadata=m1)
        )
        == SC.OUT_OF_RANGE
    )
    await r1.api.state_set("conversation", "k", "original")
    big = api.StateSetRequest(
        run_id=r1.run_id, scope=pb.CONVERSATION, key="k", value_json='"' + "x" * (300 * 1024) + '"'
    )
    assert await status_of(stub.StateSet(big, metadata=m1)) == SC.RESOURCE_EXHAUSTED
    bad_json = api.StateSetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k", value_json="{nope")
    assert await status_of(stub.StateSet(bad_json, metadata=m1)) == SC.INVALID_ARGUMENT
    for key in ("", "../etc/passwd\x00", "a\nb", "x" * 300):
        req = api.StateSetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key=key, value_json="1")
        assert await status_of(stub.StateSet(req, metadata=m1)) == SC.INVALID_ARGUMENT, key
    stale = api.StateSetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k", value_json='"new"', if_version=99)
    assert await status_of(stub.StateSet(stale, metadata=m1)) == SC.ABORTED
    assert await r1.api.state_get("conversation", "k") == "original"  # nothing changed
    art = await r1.api.artifact_create(b"abc", name="a")
    too_long = api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=art.artifact_id, length=2 * 1024 * 1024)
    assert await status_of(stub.ArtifactReadRange(too_long, metadata=m1)) == SC.OUT_OF_RANGE
    past_end = api.ArtifactReadRangeRequest(run_id=r1.run_id, artifact_id=art.artifact_id, offset=10)
    assert await status_of(stub.ArtifactReadRange(past_end, metadata=m1)) == SC.OUT_OF_RANGE
    huge = api.HistorySearchRequest(run_id=r1.run_id, query="x" * (9 * 1024 * 1024))
    assert await status_of(stub.HistorySearch(huge, metadata=m1)) == SC.RESOURCE_EXHAUSTED
    # the channel still works after an oversize message
    assert (
        await status_of(
            stub.StateGet(api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k"), metadata=m1)
        )
        == SC.OK
    )


async def test_grant_narrowing_and_cross_conversation(tmp_path):
    Probe.live = asyncio.Queue()
    Probe.release = asyncio.Event()
    async with HostHarness(tmp_path, runners=[Probe]) as h:
        # A higher-priority binding that narrows the grant wins over the harness's default one.
        await h.bind(
            "test/probe",
            priority=10,
            apis=["history.page", "state.read"],
            state_scopes=[pb.RUN],
            cross_conversation=["shared-*"],
        )
        seed = asyncio.create_task(h.send("shared fact", conversation_id="shared-1"))
        (await asyncio.wait_for(Probe.live.get(), 10))
        Probe.release.set()
        await seed
        Probe.release.clear()
        task = asyncio.create_task(h.send("hi", conversation_id="mine"))
        run = await asyncio.wait_for(Probe.live.get(), 10)
        page = await run.api.history_page(conversation_id="shared-1")
        assert [item.text for item in page.items if item.role == "user"] == ["shared fact"]
        with pytest.raises(PermissionDenied):
            await run.api.history_page(conversation_id="private-1")
        with pytest.raises(PermissionDenied):
            await run.api.state_set("run", "k", 1)  # state.write not granted
        with pytest.raises(PermissionDenied):
            await run.api.state_get("conversation", "k")  # scope not granted
        assert await run.api.state_get("run", "k") is None
        Probe.release.set()
        result = await task
        assert result.run.status == "completed"


async def test_token_revoked_after_the_gate_is_refused(world, monkeypatch):
    """The gate reads the token before the request; the method reuses what it read (the metadata is not converted
    and hashed twice) but still looks the token up: a run revoked in between is refused, not served."""
    h, stub, r1, _ = world
    registry = h.host.grants
    gated = asyncio.Event()
    reads = 0
    token_run = registry.token_run

    def counting(metadata):
        nonlocal reads
        reads += 1
        result = token_run(metadata)
        gated.set()
        return result

    monkeypatch.setattr(registry, "token_run", counting)
    # Served normally: the token is read from the metadata once per call, by the gate.
    req = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
    assert await status_of(stub.StateGet(req, metadata=md(r1))) == SC.OK
    assert reads == 1
    # An upload's header comes after the gate has let the call in; the run is revoked in between.
    gated.clear()
    call = stub.ArtifactCreate(metadata=md(r1), timeout=30)
    await asyncio.wait_for(gated.wait(), 30)
    registry.revoke(r1.run_id)
    header = api.ArtifactHeader(run_id=r1.run_id, name="x.txt", mime_type="text/plain", metadata_json="{}")
    with pytest.raises(grpc.RpcError) as refused:
        await call.write(api.ArtifactUpload(header=header))
        await call.done_writing()
        await call
    assert refused.value.code() == SC.UNAUTHENTICATED


async def child_run_code(stub, metadata, run_id: str) -> SC:
    """A ChildRun as a runner opens one: the header, then a wait for the host's answer."""
    call = stub.ChildRun(metadata=metadata, timeout=30)
    try:
        await call.wait_for_connection()
        # A client slower than the host (a loaded machine): its header is written after the gate has decided
        time.sleep(0.05)  # noqa: ASYNC251 - on purpose, so grpc.aio cannot see the refusal before the write
        await call.write(api.ChildRunRequest(header=api.ChildRunHeader(run_id=run_id, description="sub")))
        await call.read()
        return await call.code()
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        call.cancel()


async def upload_code(stub, metadata, run_id: str) -> SC:
    """An ArtifactCreate as a runner makes one: the header and every chunk written, then half-closed."""
    call = stub.ArtifactCreate(metadata=metadata, timeout=30)
    header = api.ArtifactHeader(run_id=run_id, name="x.bin", mime_type="application/octet-stream")
    try:
        await call.wait_for_connection()
        time.sleep(0.05)  # noqa: ASYNC251 - as in child_run_code
        await call.write(api.ArtifactUpload(header=header))
        for _ in range(8):
            await call.write(api.ArtifactUpload(data=b"x" * 65536))
        await call.done_writing()
        await call
    except grpc.RpcError as exc:
        return exc.code()
    return SC.OK


async def test_a_streaming_call_whose_token_is_gone_is_told_unauthenticated(world):
    """The gate refuses a call on its metadata; a client-streaming call's client may be writing by then, and
    grpc.aio puts a bare INTERNAL in place of the host's status when that write is cut short (a ChildRun in CI,
    after its run ended). The refusal reads what such a client sends before it waits, so each is told."""
    h, stub, r1, _ = world
    revoked = md(r1)
    h.host.grants.revoke(r1.run_id)
    codes = []
    for _ in range(4):  # one at a time: each client is slower than the host
        codes += [await child_run_code(stub, revoked, r1.run_id), await upload_code(stub, revoked, r1.run_id)]
    assert {code.name: codes.count(code) for code in set(codes)} == {"UNAUTHENTICATED": 8}


async def test_refused_streams_are_read_only_a_few_at_a_time(world, monkeypatch):
    """Callers without a token that open streams and never write hold at most REFUSED_STREAMS_READ refusals, each
    for a few seconds; every refusal past those ends at once, unread."""
    from agenthost.host import limits

    h, stub, r1, _ = world
    monkeypatch.setattr(limits, "REFUSED_STREAMS_READ", 2)
    forged = md(r1, token="rt_forged")
    idle = [stub.ChildRun(metadata=forged, timeout=30) for _ in range(2)]
    for call in idle:
        await call.wait_for_connection()
    for _ in range(3000):  # audited first: then both refusals wait for a header that never comes
        if len(await refusals(h)) == 2:
            break
        await asyncio.sleep(0.01)
    started = time.monotonic()
    third = stub.ChildRun(metadata=forged, timeout=30)
    assert await third.code() == SC.UNAUTHENTICATED
    assert time.monotonic() - started < 4  # not read: the two held refusals wait 5 s each
    for call in idle:  # and those end on their own, told too
        assert await call.code() == SC.UNAUTHENTICATED
    assert len(await refusals(h)) == 3


async def test_one_plugins_callers_without_a_token_cannot_use_up_anothers_refusals(world, monkeypatch):
    """REFUSED_STREAMS_READ was host-wide: callers without a token on one plugin's socket held every refusal that
    reads, and then another plugin's client whose token expired was refused unread (told INTERNAL, not why, when it
    was writing). Now each listener has its own: a refusal on another socket is still read (for its 5 s)."""
    from agenthost.host import limits

    h, stub, r1, _ = world
    monkeypatch.setattr(limits, "REFUSED_STREAMS_READ", 2)
    forged = md(r1, token="rt_forged")
    intruder = grpc.aio.insecure_channel(await h.host.plugin_sockets.open("intruder"))
    try:
        theirs = run_api_pb2_grpc.AgentRunAPIProxyStub(intruder)
        idle = [theirs.ChildRun(metadata=forged, timeout=30) for _ in range(2)]
        for call in idle:
            await call.wait_for_connection()
        for _ in range(3000):  # both of that socket's refusals now wait for a header that never comes
            if len(await refusals(h)) == 2:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        ours = stub.ChildRun(metadata=forged, timeout=30)  # on the host's other listener
        assert await ours.code() == SC.UNAUTHENTICATED
        assert time.monotonic() - started >= 4.5  # read for its 5 s, not refused unread
        for call in idle:
            assert await call.code() == SC.UNAUTHENTICATED
    finally:
        await intruder.close()


async def test_a_caller_without_a_token_cannot_make_the_host_read_its_upload(world):
    """A refused upload is read only so that a client whose token is gone is told why (see the test above), and at
    most REFUSED_STREAM_READ_BYTES of it: a caller without a token writing without end had the host read it at full
    speed for 5 s (~400 MiB a call, 64 calls at once), taking the host's loop from every run."""
    from agenthost.host import limits

    h, stub, r1, _ = world
    chunk, total = b"x" * (256 * 1024), 96 * 1024 * 1024
    call = stub.ArtifactCreate(metadata=md(r1, token="rt_forged"), timeout=60)
    sent = 0
    with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
        await call.write(api.ArtifactUpload(header=api.ArtifactHeader(run_id=r1.run_id, name="x.bin")))
        while sent < total:
            await call.write(api.ArtifactUpload(data=chunk))
            sent += len(chunk)
        await call.done_writing()
    assert await call.code() in (SC.UNAUTHENTICATED, SC.INTERNAL)
    # What the client could write is what the host read plus HTTP/2's flow-control windows (a few MiB).
    assert sent < limits.REFUSED_STREAM_READ_BYTES + 32 * 1024 * 1024, f"the host read {sent >> 20} MiB"


@pytest.mark.e2e
async def test_a_runner_cannot_make_the_host_hold_requests_it_never_finishes_sending(
    tmp_path, host_database, monkeypatch
):
    """grpc-core keeps a message it is reading until its last byte arrives. A runner with its run's token opened
    calls that each declared an 8 MiB request and sent all of it but a byte: the host held 8 MiB a call (1.6 GiB of
    host memory for 200 calls on one connection, up to 4,096 calls a listener). Now a listener reads at most
    RUN_API_READS requests at once, each for RUN_API_READ_SECONDS; the other calls wait without asking for their
    message, so grpc-core lets in only their streams' initial windows."""
    import json
    import sys
    from pathlib import Path

    from agenthost.host import limits

    monkeypatch.setattr(limits, "RUN_API_READS", 2)
    calls = 24
    async with parked_runs(tmp_path, host_database) as (h, stub, r1, _):
        get = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
        for method in ("StateSet", "ChildRun"):  # a unary request; a stream's first message (ChildRun's header)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).parent / "half_sent.py"), h.host.api_address.removeprefix("unix:"),
                f"/agenthost.v1.AgentRunAPIProxy/{method}", json.dumps(md(r1)), str(calls), "3", "60",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            sent = json.loads(out.splitlines()[-1])["sent"]
            # RUN_API_READS requests read (and refused when they never end), plus each waiting call's window.
            bound = limits.RUN_API_READS * 8 * 1024 * 1024 + calls * 256 * 1024
            assert sent < bound, f"{method}: the host took in {sent >> 20} MiB of {calls} half-sent requests"
            assert (await stub.StateGet(get, metadata=md(r1))).found is False  # the runner's own calls go through


@pytest.mark.e2e
async def test_requests_that_never_end_give_their_turn_back(tmp_path, host_database, monkeypatch):
    """The calls reading their request at once are few (RUN_API_READS): ones whose request never ends are refused
    after RUN_API_READ_SECONDS, so the socket's other calls get their turn while the sender still holds them."""
    import json
    import sys
    from pathlib import Path

    from agenthost.host import limits

    monkeypatch.setattr(limits, "RUN_API_READS", 2)
    monkeypatch.setattr(limits, "RUN_API_READ_SECONDS", 1.0)
    async with parked_runs(tmp_path, host_database) as (h, stub, r1, _):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).parent / "half_sent.py"), h.host.api_address.removeprefix("unix:"),
            "/agenthost.v1.AgentRunAPIProxy/StateSet", json.dumps(md(r1)), "4", "120", "120",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            assert "held" in json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            get = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
            assert (await stub.StateGet(get, metadata=md(r1), timeout=20)).found is False
            assert proc.returncode is None  # answered while the half-sent calls were still held open
        finally:
            proc.kill()
            await proc.wait()


async def refusals(h: HostHarness) -> list:
    h.host.audit.flush()
    await h.host.db.flush()
    return [r for r in h.host.audit.rows() if r["method"] == "ChildRun" and r["outcome"] == "UNAUTHENTICATED"]


async def test_a_host_bug_a_runner_can_call_again_and_again_does_not_flood_the_hosts_log(world, monkeypatch, caplog):
    """An unexpected exception in a run API method (a host bug) is answered INTERNAL and logged with its traceback.
    A runner that found one could call it in a loop, a traceback a call; now a few a minute, then counted."""
    import logging

    from agenthost.host.ops import logs
    from agenthost.host.store.state import StateStore

    h, stub, r1, _ = world

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the host")

    monkeypatch.setattr(StateStore, "get", broken)
    caplog.set_level(logging.ERROR, logger="agenthost.host.api.run_api")
    request = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
    for _ in range(100):
        assert await status_of(stub.StateGet(request, metadata=md(r1))) == SC.INTERNAL
    lines = [r for r in caplog.records if r.name == "agenthost.host.api.run_api"]
    assert 0 < len(lines) <= logs.REFUSALS_PER_WINDOW + 1, f"{len(lines)} tracebacks for 100 calls"
    assert lines[0].exc_info is not None  # the first ones keep their traceback


async def test_a_plugin_calling_in_a_loop_cannot_grow_the_audit_log_without_bound(world, monkeypatch):
    """Every run-API call is an audit row, refused ones too (a forged token costs the caller microseconds): the table
    grew without bound, until the disk was full. It now keeps the newest AUDIT_MAX_ROWS."""
    from agenthost.host import limits

    h, stub, r1, _ = world
    monkeypatch.setattr(limits, "AUDIT_MAX_ROWS", 50)
    forged = (("authorization", "Bearer rt_" + "A" * 43),)
    request = api.StateGetRequest(run_id=r1.run_id, scope=pb.CONVERSATION, key="k")
    for _ in range(300):
        assert await status_of(stub.StateGet(request, metadata=forged)) == SC.UNAUTHENTICATED
    h.host.audit.flush()
    await h.host.db.flush()
    rows = h.host.audit.rows()
    assert len(rows) <= 50, f"{len(rows)} audit rows kept"
    assert rows[-1]["outcome"] == "UNAUTHENTICATED"  # the newest are the ones kept
