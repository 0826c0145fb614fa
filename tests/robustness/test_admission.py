"""Overload is admission, not failure: past limits.RUNS_MAX_ACTIVE runs wait in `queued` (no task, no runner RPC),
past the queue's bounds they are refused with RESOURCE_EXHAUSTED and a retry hint before anything is recorded, and
no client ever sees gRPC's bare CANCELLED. The caps are lowered with monkeypatch (runs.py reads them at check time)
so a handful of runs exercises what thousands do in benchmarks/bench_load.py."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest

from agenthost.host import limits
from agenthost.host.api.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import accepted_run
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [pytest.mark.timeout(120)]


class Gate(Runner):
    """Records the order runs reach the runner and how many run at once. `hold*` runs wait for `release`;
    `tick*` runs stream a delta every few milliseconds until then; the rest end at once."""

    manifest = RunnerManifest(name="gate")
    started: asyncio.Queue[str]
    release: asyncio.Event
    order: list[str]
    running = 0
    peak = 0

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        Gate.running += 1
        Gate.peak = max(Gate.peak, Gate.running)
        Gate.order.append(run.text)
        await Gate.started.put(run.text)
        try:
            if run.text.startswith("tick"):
                while not Gate.release.is_set():
                    yield events.text(".")
                    await asyncio.sleep(0.005)  # the runner's own pace, not a wait in the test
            elif run.text.startswith("hold"):
                await Gate.release.wait()
            yield events.text(f"done {run.text}")
        finally:
            Gate.running -= 1


@pytest.fixture
async def host(tmp_path, monkeypatch, host_database) -> AsyncIterator[HostHarness]:
    Gate.started = asyncio.Queue()
    Gate.release = asyncio.Event()
    Gate.order = []
    Gate.running = Gate.peak = 0
    async with HostHarness(tmp_path, runners=[Gate], host_options=host_database) as h:
        try:
            yield h
        finally:
            Gate.release.set()


def _request(h: HostHarness, text: str, conversation: str, bot: str | None = None) -> hpb.SendMessageRequest:
    return hpb.SendMessageRequest(bot=bot or h.bot, text=text, conversation_id=conversation)


async def _open(client: HostClient, request: hpb.SendMessageRequest) -> tuple[hpb.RunInfo, AsyncIterator]:
    """Starts a run and waits for the host's first answer, so the order of arrival is the order of these calls."""
    stream = client.stream(request, timeout=60)
    first = await asyncio.wait_for(anext(stream), 30)
    return accepted_run(first), stream


async def _finish(stream: AsyncIterator) -> hpb.RunInfo:
    async for reply in stream:
        if reply.WhichOneof("kind") == "run_finished":
            return reply.run_finished
    raise AssertionError("the stream ended without run_finished")


def _counts(h: HostHarness) -> tuple[int, int, int]:
    db = h.host.db
    return tuple(db.query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in ("runs", "events", "transcript"))  # type: ignore[return-value]


async def test_burst_beyond_admitted_runs_queues_and_runs_in_order(host: HostHarness, monkeypatch) -> None:
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 2)
    Gate.release.clear()
    admission = host.host.runs.admission
    # The order the host hands out slots. Gate.order is when each runner call arrives, which two runs started in
    # the same loop turn may reach in either order.
    admitted: list[str] = []
    next_to_start = admission.next_to_start

    def recording_next_to_start():
        st = next_to_start()
        if st is not None:
            admitted.append(st.info.run_id)
        return st

    monkeypatch.setattr(admission, "next_to_start", recording_next_to_start)
    streams, infos = {}, {}
    for i in range(4):
        for conv in ("a", "b", "c"):
            text = f"hold {conv}{i}"
            infos[text], streams[text] = await _open(host.client, _request(host, text, conv))
            assert infos[text].status == ("running" if text in ("hold a0", "hold b0") else "queued")
    # Two slots: the heads of a and b run; c's head waits for a slot although its conversation is idle.
    assert {await asyncio.wait_for(Gate.started.get(), 10) for _ in range(2)} == {"hold a0", "hold b0"}
    assert (admission.running, admission.queued) == (2, 10)
    waiting = [st for st in host.host.runs._live.values() if st.info.status == "queued"]
    assert len(waiting) == 10
    assert all(st.task is None and st.active is None for st in waiting)  # no task, no grant, no runner RPC
    assert Gate.started.empty() and Gate.running == 2
    queued_run = waiting[0].info.run_id
    assert (await host.client.call("GetRun", hpb.RunRequestById(run_id=queued_run))).status == "queued"

    Gate.release.set()
    finished = await asyncio.wait_for(asyncio.gather(*(_finish(s) for s in streams.values())), 60)
    assert [f.status for f in finished] == ["completed"] * 12, [f.error_message for f in finished]
    assert Gate.peak == 2
    for conv in ("a", "b", "c"):
        assert [t for t in Gate.order if t.startswith(f"hold {conv}")] == [f"hold {conv}{i}" for i in range(4)]
    # Ready conversations of one bot are served first come, first served: c0 was waiting before a1 and b1 were.
    texts = {info.run_id: text for text, info in infos.items()}
    assert [texts[r] for r in admitted[:3]] == ["hold a0", "hold b0", "hold c0"], [texts[r] for r in admitted]
    assert (admission.running, admission.queued) == (0, 0)
    assert not admission._conversations and not admission._ready


async def test_a_waiting_run_hears_queued_with_its_place_then_run_started(host: HostHarness, monkeypatch) -> None:
    """Issue 26: a send that must wait is told so at once (`queued`, its place in line), not left silent until a
    slot frees; `run_started` follows when it starts. One slot, three sends: the first starts, the others are
    queued at positions 1 and 2 and start in that order, each stream saying run_started exactly once."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    Gate.release.clear()
    streams = [host.client.stream(_request(host, f"hold {i}", f"c{i}"), timeout=60) for i in range(3)]
    firsts = [await asyncio.wait_for(anext(s), 30) for s in streams]  # before any run ends
    assert [f.WhichOneof("kind") for f in firsts] == ["run_started", "queued", "queued"]
    assert firsts[0].run_started.status == "running" and firsts[0].run_started.started_at > 0
    assert [(f.queued.waiting_on, f.queued.position, f.queued.bots_waiting) for f in firsts[1:]] == [
        ("host", 1, 1),
        ("host", 2, 1),
    ]
    assert all(f.queued.run.status == "queued" and f.queued.run.run_id for f in firsts[1:])
    # The queued runs are recorded before the client hears of them: a reconnecting client reads the same fact.
    recorded = await host.client.call("GetRun", hpb.RunRequestById(run_id=firsts[2].queued.run.run_id))
    assert recorded.status == "queued"
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold 0"

    started_at: dict[int, float] = {}

    async def rest(i: int) -> list[str]:
        kinds = []
        async for reply in streams[i]:
            kind = reply.WhichOneof("kind")
            kinds.append(kind)
            if kind == "run_started":
                assert reply.run_started.run_id == firsts[i].queued.run.run_id
                started_at[i] = reply.run_started.started_at
        return kinds

    Gate.release.set()
    kinds = await asyncio.wait_for(asyncio.gather(*(rest(i) for i in (1, 2))), 60)
    for k in kinds:
        assert k[0] == "run_started" and k.count("run_started") == 1 and k[-1] == "run_finished", k
    assert started_at[1] < started_at[2]
    assert [t for t in Gate.order] == ["hold 0", "hold 1", "hold 2"]


async def test_a_run_waiting_on_its_conversation_says_so(host: HostHarness, monkeypatch) -> None:
    Gate.release.clear()
    streams = [host.client.stream(_request(host, f"hold {i}", "same"), timeout=60) for i in range(3)]
    firsts = [await asyncio.wait_for(anext(s), 30) for s in streams]
    assert firsts[0].WhichOneof("kind") == "run_started"
    assert [(f.queued.waiting_on, f.queued.position) for f in firsts[1:]] == [("conversation", 1), ("conversation", 2)]
    Gate.release.set()
    for s in streams:
        assert [r.WhichOneof("kind") async for r in s][-1] == "run_finished"


async def test_slots_go_round_robin_across_bots(host: HostHarness, monkeypatch) -> None:
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    await host.client.call("CreateBot", hpb.CreateBotRequest(name="other"))
    await host.client.bind("other", "test/gate")
    Gate.release.clear()
    _, hold = await _open(host.client, _request(host, "hold", "h"))
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
    streams = [hold]
    for i in range(5):  # a busy bot queues five runs first
        streams.append((await _open(host.client, _request(host, f"busy {i}", f"busy{i}")))[1])
    streams.append((await _open(host.client, _request(host, "quiet", "q", bot="other")))[1])
    Gate.release.set()
    finished = await asyncio.wait_for(asyncio.gather(*(_finish(s) for s in streams)), 60)
    assert all(f.status == "completed" for f in finished)
    # The other bot's single run gets the second free slot, not the sixth.
    assert Gate.order == ["hold", "busy 0", "quiet", "busy 1", "busy 2", "busy 3", "busy 4"]


@pytest.mark.parametrize("bound", ["host", "bot", "conversation", "input_bytes"])
async def test_beyond_the_queue_bound_is_refused_with_a_retry_hint_and_nothing_recorded(
    host: HostHarness, monkeypatch, bound: str
) -> None:
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    if bound == "host":
        monkeypatch.setattr(limits, "RUNS_MAX_QUEUED", 3)
    elif bound == "bot":
        monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_PER_BOT", 3)
        await host.client.call("CreateBot", hpb.CreateBotRequest(name="other"))
        await host.client.bind("other", "test/gate")
    elif bound == "conversation":
        monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_PER_CONVERSATION", 3)
    else:
        monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_INPUT_BYTES", 3 * 102)  # three queued runs: 100 + len("{}")
    Gate.release.clear()
    ticker, ticks = await _open(host.client, _request(host, "tick", "t"))
    assert await asyncio.wait_for(Gate.started.get(), 10) == "tick"
    same = bound == "conversation"
    queued = [
        (await _open(host.client, _request(host, f"q{i}" + "." * 98, "q" if same else f"q{i}")))[1] for i in range(3)
    ]
    before = _counts(host)

    seen: list[float] = []
    streaming = asyncio.Event()

    async def watch() -> None:
        async for reply in ticks:
            if reply.WhichOneof("kind") == "events":
                seen.append(asyncio.get_running_loop().time())
                if len(seen) >= 3:
                    streaming.set()
            elif reply.WhichOneof("kind") == "run_finished":
                seen.append(-1.0)
                return

    watcher = asyncio.ensure_future(watch())
    await asyncio.wait_for(streaming.wait(), 10)

    async def refused(i: int) -> tuple[grpc.StatusCode, str, str]:
        call = host.client.stub.SendMessage(_request(host, "x" * 100, "q" if same else f"x{i}"), timeout=30)
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            trailing = dict(exc.trailing_metadata() or ())
            return exc.code(), exc.details() or "", trailing.get(errors.RETRY_AFTER_KEY, "")
        return grpc.StatusCode.OK, "", ""

    burst_start = asyncio.get_running_loop().time()
    ticks_before = len(seen)
    answers = await asyncio.wait_for(asyncio.gather(*(refused(i) for i in range(300))), 60)
    burst_end = asyncio.get_running_loop().time()
    codes = {code for code, _, _ in answers}
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    cap = {
        "host": "RUNS_MAX_QUEUED = 3",
        "bot": "RUNS_MAX_QUEUED_PER_BOT = 3",
        "conversation": "RUNS_MAX_QUEUED_PER_CONVERSATION = 3",
        "input_bytes": "RUNS_MAX_QUEUED_INPUT_BYTES = 306",
    }[bound]
    for _, details, hint in answers:
        assert cap in details and "retry in" in details, details
        assert limits.RUNS_RETRY_MIN_MS <= int(hint) <= limits.RUNS_RETRY_MAX_MS
        assert f"retry in {hint} ms" in details
    # The typed client error carries the hint too.
    with pytest.raises(errors.ResourceExhausted) as caught:
        await host.client.send(host.bot, "x" * 100, conversation_id="q" if same else "typed")
    assert caught.value.retry_after_ms >= limits.RUNS_RETRY_MIN_MS
    # Refused runs never existed: no run, no event, no transcript item.
    assert _counts(host) == before
    # The admitted run streamed on through the burst.
    during = len([t for t in seen[ticks_before:] if burst_start <= t <= burst_end])
    print(f"\n{bound}: 300 refusals in {burst_end - burst_start:.2f}s, {during} stream messages meanwhile")
    assert during >= 3, (len(seen), ticks_before)
    if bound == "bot":  # the cap is per bot: another bot still gets in
        info, other = await _open(host.client, _request(host, "other", "o", bot="other"))
        assert info.status == "queued"
        queued.append(other)
    Gate.release.set()
    finished = await asyncio.wait_for(asyncio.gather(*(_finish(s) for s in queued)), 30)
    assert all(f.status == "completed" for f in finished)
    await asyncio.wait_for(watcher, 10)
    assert seen[-1] == -1.0
    assert (host.host.runs.admission.queued, host.host.runs.admission.queued_input_bytes) == (0, 0)


async def test_a_queued_run_can_be_cancelled_and_the_conversation_goes_on(host: HostHarness, monkeypatch) -> None:
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    Gate.release.clear()
    _, hold = await _open(host.client, _request(host, "hold", "a"))
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
    victim, victim_stream = await _open(host.client, _request(host, "victim", "a"))
    _, after_stream = await _open(host.client, _request(host, "after", "a"))
    cancelled = await host.client.call("CancelRun", hpb.RunRequestById(run_id=victim.run_id))
    assert cancelled.status == "cancelled" and "queued" in cancelled.error_message
    assert (await asyncio.wait_for(_finish(victim_stream), 10)).status == "cancelled"
    with pytest.raises(errors.FailedPrecondition):
        await host.client.call("CancelRun", hpb.RunRequestById(run_id=victim.run_id))
    Gate.release.set()
    assert (await asyncio.wait_for(_finish(hold), 10)).status == "completed"
    assert (await asyncio.wait_for(_finish(after_stream), 10)).status == "completed"
    assert Gate.order == ["hold", "after"]  # the cancelled run never reached the runner
    assert host.host.runs.admission.queued == 0 and host.host.runs.admission.running == 0


async def test_queued_runs_stay_queued_for_the_next_host_when_the_host_stops(tmp_path, monkeypatch) -> None:
    """A stop interrupts what runs; what waits was accepted and is left `queued` for the next host (restart or
    standby: tests/test_standby.py runs them), and its senders are told so, not that it ended."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    Gate.started = asyncio.Queue()
    Gate.release = asyncio.Event()
    Gate.order = []
    h = HostHarness(tmp_path, runners=[Gate])
    await h.__aenter__()
    try:
        _, hold = await _open(h.client, _request(h, "hold", "a"))
        assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
        waiting = [await _open(h.client, _request(h, f"w{i}", f"w{i}")) for i in range(3)]
        outcomes = asyncio.ensure_future(
            asyncio.gather(*(_finish(s) for _, s in waiting), _finish(hold), return_exceptions=True)
        )
        await h.host.runs.shutdown()  # what Host.stop does first
        ended = await asyncio.wait_for(outcomes, 10)
        rows = [h.host.run_store.get(info.run_id) for info, _ in waiting]
    finally:
        Gate.release.set()
        await h.__aexit__(None, None, None)
    held = ended[-1]
    assert isinstance(held, hpb.RunInfo) and (held.status, held.error_code) == ("interrupted", "host_shutdown")
    for (info, _), told, row in zip(waiting, ended[:-1], rows, strict=True):
        assert isinstance(told, errors.Unavailable) and "stays queued" in told.message and info.run_id in told.message
        assert row is not None and row.status == "queued"
    assert Gate.order == ["hold"]


@pytest.mark.slow
async def test_a_burst_far_past_the_queue_gets_only_typed_answers(host: HostHarness, monkeypatch) -> None:
    """1500 sends at once with room for 4 running and 200 queued: each either completes or is refused with a
    retry hint. Nothing ends with gRPC's bare CANCELLED, nothing with any other error."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 4)
    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED", 200)

    async def one(i: int) -> str:
        try:
            result = await host.client.send(host.bot, f"quick {i}", conversation_id=f"c{i % 700}", timeout=90)
        except errors.ResourceExhausted as exc:
            return "refused" if exc.retry_after_ms > 0 else f"refused without a hint: {exc}"
        except errors.AgentHostError as exc:
            return f"{type(exc).__name__}: {exc}"
        return result.run.status

    outcomes = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(1500))), 110)
    tally: dict[str, int] = {}
    for outcome in outcomes:
        tally[outcome] = tally.get(outcome, 0) + 1
    assert set(tally) == {"completed", "refused"}, tally
    assert tally["completed"] >= 204 and tally["refused"] > 0, tally
    completed = host.host.db.query("SELECT COUNT(*) FROM runs WHERE status = 'completed'")[0][0]
    assert completed == tally["completed"] == host.host.db.query("SELECT COUNT(*) FROM runs")[0][0]


async def test_a_run_cancelled_between_admission_and_its_first_step_still_ends(host: HostHarness, monkeypatch) -> None:
    """CancelRun can land after a queued run was given its slot (its task created) but before that task first ran:
    a task cancelled then never runs its body. The run must still end, be written, and give its slot back."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 0)  # admit nothing until the test says so
    victim, victim_stream = await _open(host.client, _request(host, "victim", "a"))
    _, next_stream = await _open(host.client, _request(host, "next", "a"))
    runs = host.host.runs
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    runs._pump()  # the victim gets the slot: its task exists and has not run a step
    st = runs._live[victim.run_id]
    assert st.task is not None and runs.admission.running == 1
    # What CancelRun does before its first await, with no await between: the task is cancelled before it starts.
    st.cancel_reason = "cancelled by request"
    st.task.cancel()
    assert (await asyncio.wait_for(_finish(victim_stream), 10)).status == "cancelled"
    assert (await host.client.call("GetRun", hpb.RunRequestById(run_id=victim.run_id))).status == "cancelled"
    assert (await asyncio.wait_for(_finish(next_stream), 10)).status == "completed"
    assert Gate.order == ["next"]
    assert (runs.admission.running, runs.admission.queued) == (0, 0)


async def test_one_tenants_backlog_fills_its_own_share_and_other_bots_still_queue(
    host: HostHarness, monkeypatch
) -> None:
    """Issue 25 item 13: a key whose large messages queue behind a slow run used to take the whole host's queued
    input bytes, and every other bot got RESOURCE_EXHAUSTED. Now each sender (credential) and each bot has a share:
    past it that tenant alone is refused, with the cap named, and the others still queue and run."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_INPUT_BYTES", 400_000)
    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT", 90_000)
    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER", 50_000)
    await host.client.call("CreateBot", hpb.CreateBotRequest(name="other"))
    await host.client.bind("other", "test/gate")
    keys = {}
    for name in ("k1", "k2"):
        created = await host.client.call(
            "CreateCredential", hpb.CreateCredentialRequest(name=name, scope="send", bots=["testbot"])
        )
        keys[name] = HostClient(host.host.admin_address, token=created.token)
    Gate.release.clear()
    _, hold = await _open(host.client, _request(host, "hold", "slow"))  # the slow run everything queues behind
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
    streams = [hold]
    big = "x" * 20_000  # with "{}" of event data: 20,002 bytes of queued input each
    refusals: dict[str, str] = {}
    try:
        for name, client in keys.items():
            for i in range(3):
                try:
                    info, stream = await _open(client, _request(host, big, f"{name}-{i}"))
                except errors.ResourceExhausted as exc:
                    refusals[name] = exc.message
                    assert exc.retry_after_ms >= limits.RUNS_RETRY_MIN_MS
                    break
                assert info.status == "queued"
                streams.append(stream)
        admission = host.host.runs.admission
        print(
            f"\nqueued input bytes: host {admission.queued_input_bytes}, by bot {admission._bytes_by_bot}, "
            f"by sender {admission._bytes_by_sender}; refusals: {refusals}"
        )
        # k1 filled its own share; k2 (same bot) got in until the bot's share was full.
        assert "RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER = 50000" in refusals["k1"], refusals
        assert "RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT = 90000" in refusals["k2"], refusals
        assert len(streams) == 1 + 4
        # Another bot still gets in, with as large a message, far below the host-wide cap.
        info, other = await _open(host.client, _request(host, big, "o", bot="other"))
        assert info.status == "queued"
        assert "admin" not in admission._bytes_by_sender  # an admin credential (the operator) has no sender share
        streams.append(other)
        Gate.release.set()
        finished = await asyncio.wait_for(asyncio.gather(*(_finish(s) for s in streams)), 60)
        assert [f.status for f in finished] == ["completed"] * 6
        assert (admission.queued, admission.queued_input_bytes) == (0, 0)
        assert not admission._bytes_by_bot and not admission._bytes_by_sender and not admission._queued_by_sender
    finally:
        Gate.release.set()
        for client in keys.values():
            await client.close()


@pytest.mark.slow
async def test_the_cli_says_a_send_is_queued_and_when_it_starts(host: HostHarness, monkeypatch) -> None:
    """`agenthost send` (the real CLI process) prints the `queued` line with the run's place at once, then a
    started line, then the reply: a person at a terminal is never left waiting in silence."""
    from tests.cli_process import acli

    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    Gate.release.clear()
    _, hold = await _open(host.client, _request(host, "hold", "h"))
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
    sent = asyncio.ensure_future(acli(host.data_dir / "host", "send", host.bot, "waiting", "--conversation", "w"))
    admission = host.host.runs.admission
    for _ in range(3000):  # until the CLI's message is recorded and waiting (a bounded wait on a condition)
        if admission.queued == 1 or sent.done():
            break
        await asyncio.sleep(0.02)
    assert admission.queued == 1, await sent
    Gate.release.set()
    code, out, err = await asyncio.wait_for(sent, 90)
    assert code == 0, err
    [queued, started, reply] = out.splitlines()
    run_id = queued.split()[1]
    assert queued == (f"[run {run_id} queued: every host slot is busy (position 1 among this bot's waiting runs)]"), out
    assert started == f"[run {run_id} started]" and reply == "done waiting", out
    await _finish(hold)


async def test_a_send_retried_with_its_idempotency_key_gets_its_first_run(host: HostHarness) -> None:
    """A client that lost a send's answer sends it again with the same key: one run, whatever the timing (while
    the first waits, runs, or after it ended; two attempts at once). Keys are per sender: another sender's same
    key is its own message. On both backends."""
    h = host

    def keyed(text: str, key: str, conversation: str = "k") -> hpb.SendMessageRequest:
        request = _request(h, text, conversation)
        request.idempotency_key = key
        return request

    first, stream = await _open(h.client, keyed("hold", "m-1"))
    assert await asyncio.wait_for(Gate.started.get(), 10) == "hold"
    again, again_stream = await _open(h.client, keyed("hold", "m-1"))  # while it runs: followed
    assert again.run_id == first.run_id
    queued, _ = await _open(h.client, keyed("w", "m-2"))  # behind it in the conversation: queued
    racing = await asyncio.gather(*(_open(h.client, keyed("w", "m-2")) for _ in range(5)))
    assert {info.run_id for info, _ in racing} == {queued.run_id}
    raced = await asyncio.gather(*(_open(h.client, keyed("r", "m-3", "other")) for _ in range(5)))
    assert len({info.run_id for info, _ in raced}) == 1  # five at once, none recorded before: one run
    Gate.release.set()
    assert (await asyncio.wait_for(_finish(stream), 10)).status == "completed"
    assert (await asyncio.wait_for(_finish(again_stream), 10)).run_id == first.run_id
    outcome = await asyncio.wait_for(_finish(h.client.stream(keyed("hold", "m-1"), timeout=60)), 10)
    assert (outcome.run_id, outcome.status) == (first.run_id, "completed")  # after it ended: its outcome
    _, token = h.host.credentials.create("app", "send", [h.host.registry.bot(h.bot).bot_id])
    async with HostClient(h.host.admin_address, token=token) as app:
        own, own_stream = await _open(app, keyed("w", "m-1", "app-1"))
        assert own.run_id != first.run_id
        assert (await asyncio.wait_for(_finish(own_stream), 10)).status == "completed"
    runs = await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot, limit=100))
    assert len(runs.runs) == 4  # m-1, m-2, m-3 of the admin, m-1 of the app
    with pytest.raises(errors.InvalidArgument):
        await _open(h.client, keyed("x", "a key with spaces"))


async def test_an_idempotency_key_reused_for_another_message_is_refused(host: HostHarness) -> None:
    """A key names one message: sent again with other text, or into another conversation, it is the client's
    mistake, refused saying so, never answered with the first message's run as if it were this one's (nor recorded
    as a second run)."""
    h = host
    first = _request(h, "pay invoice 7", "keys")
    first.idempotency_key = "inv-7"
    done = await asyncio.wait_for(_finish(h.client.stream(first, timeout=60)), 30)
    assert done.status == "completed"
    other = _request(h, "pay invoice 8", "keys")
    other.idempotency_key = "inv-7"
    with pytest.raises(errors.InvalidArgument, match="already used for another message"):
        await _open(h.client, other)
    elsewhere = _request(h, "pay invoice 7", "other-keys")  # the same text in another conversation
    elsewhere.idempotency_key = "inv-7"
    with pytest.raises(errors.InvalidArgument, match="already used for another message"):
        await _open(h.client, elsewhere)
    again = await asyncio.wait_for(_finish(h.client.stream(first, timeout=60)), 30)
    assert again.run_id == done.run_id
    runs = await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot, limit=100))
    assert [r.run_id for r in runs.runs] == [done.run_id]


async def test_a_burst_of_sends_is_taken_up_by_the_extra_requests_behind_the_same_walls(host: HostHarness) -> None:
    """grpc.aio asks grpc-core for one SendMessage call at a time; the host keeps PREFETCH_SENDS more requests
    outstanding (agenthost.protos.prefetch) so that a burst is taken up at once. The calls they take up run the
    same handler behind the same admin interceptor: a send with a wrong key is refused whichever request takes
    it, and the others complete with their whole stream."""
    extra = host.host.prefetch
    assert extra is not None, "this grpc's private API is not the one agenthost.protos.prefetch knows"
    intruder = HostClient(host.host.admin_address, token="not-the-admin-token")
    try:

        async def one(i: int) -> str:
            client = intruder if i % 4 == 0 else host.client
            try:
                result = await client.send(host.bot, f"quick {i}", conversation_id=f"p{i}", timeout=60)
            except errors.AgentHostError as exc:
                return type(exc).__name__
            return result.run.status

        outcomes = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(80))), 90)
    finally:
        await intruder.close()
    assert outcomes == ["Unauthenticated" if i % 4 == 0 else "completed" for i in range(80)], outcomes
    assert extra.taken >= 20, extra.taken  # most of the burst went through the extra requests
    assert host.host.db.query("SELECT COUNT(*) FROM runs")[0][0] == 60


async def test_without_the_private_api_it_knows_the_host_takes_calls_up_as_grpc_does(tmp_path, monkeypatch) -> None:
    """A grpc whose internals are not the ones prefetch knows (here: it expects another signature): no extra
    requests, a warning, and sends work as before."""
    from agenthost.protos import prefetch

    monkeypatch.setitem(prefetch._SHAPES, "_handle_rpc", ("method_name", "resolver"))
    async with HostHarness(tmp_path, runners=[Gate]) as h:
        assert h.host.prefetch is None
        result = await h.client.send(h.bot, "quick", conversation_id="c", timeout=60)
        assert result.run.status == "completed"


async def test_a_held_queued_run_keeps_no_copy_of_what_its_recording_needed(host: HostHarness, monkeypatch) -> None:
    """Issue 22: a queued run is held for as long as its client waits, thousands at once. What taking it needed
    (the frozen grant, the plugin row, the recording closure's cells) is let go once it is recorded, its
    subscriber's wait holds no deque until it waits, and runs queued on one binding share its bot and binding
    records instead of each holding a copy read for its send. Counted per held run between 10 and 40 held."""
    monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 1)
    Gate.release.clear()
    streams = [host.client.stream(_request(host, "hold", "busy"), timeout=60)]
    assert (await asyncio.wait_for(anext(streams[0]), 30)).WhichOneof("kind") == "run_started"

    async def held(n: int) -> dict[str, int]:
        while len(streams) - 1 < n:
            stream = host.client.stream(_request(host, "quick", f"held{len(streams)}"), timeout=60)
            assert (await asyncio.wait_for(anext(stream), 30)).WhichOneof("kind") == "queued"
            streams.append(stream)
        gc.collect()
        return Counter(type(o).__name__ for o in gc.get_objects())

    low, high = await held(10), await held(40)
    per_run = {kind: (high[kind] - low[kind]) / 30 for kind in ("Grant", "deque", "cell", "PluginRecord")}
    assert max(per_run["Grant"], per_run["deque"], per_run["PluginRecord"]) < 0.5, per_run  # 1.0 each before
    assert per_run["cell"] < 5, per_run  # 20 a run while the send's generator held its recording closure
    queued = [st.start for st in host.host.runs._live.values() if st.start is not None]
    assert len(queued) == 40
    assert len({id(start.binding) for start in queued}) == len({id(start.bot) for start in queued}) == 1
    Gate.release.set()
    for stream in streams:
        await asyncio.wait_for(_finish(stream), 60)
