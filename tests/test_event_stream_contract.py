"""The run event contract under every batch shape, through a real host: the runner's batches are numbered in
place (or as bytes, when they are plain text deltas), forwarded to the client without a copy, cut where a client
message would be too large, and written to SQLite by one coalesced job per run, consecutive text deltas as one row.
Whatever the shapes, what a client streamed is exactly what ListRunEvents and the run_events rows hold (event for
event, every page boundary seq-exact even inside a delta-run row), seq is dense from 1, created_at is set, nothing
after the terminal event counts, and the run's text is the deltas it streamed."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.host import limits
from agenthost.host.runs.writer import RunWriter
from agenthost.host.store import runs as runs_store
from agenthost.host.store import text_deltas
from agenthost.host.store.conversations import Conversations
from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database
from agenthost.host.store.runs import DELTA_RUN, RunStore, row_events
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk import server as sdk_server
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(180)


class Shapes(Runner):
    """Plays the JSON script in the message text. `pause` hands the loop over, so the SDK sends what piled up so
    far: together with the patched batch limits, that is what shapes the batches."""

    manifest = RunnerManifest(name="shapes")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        for op, arg in json.loads(run.text):
            if op == "text":
                yield events.text(arg)
            elif op == "str":  # the same delta as a plain str: the SDK's and the host's fast path
                yield arg
            elif op == "pause":
                await asyncio.sleep(0)
            elif op == "tool":
                yield events.tool_started(f"c{arg}", "lookup", {"q": arg})
                yield events.tool_finished(f"c{arg}", "lookup", f"result {arg}")
            elif op == "usage":
                yield events.usage(arg, 1, model="m")
            elif op == "completed":
                yield events.completed()
            elif op == "failed":
                yield events.failed("scripted", f"failure {arg}")


def _script(rng: random.Random) -> list[tuple[str, object]]:
    steps: list[tuple[str, object]] = []
    for i in range(rng.randint(1, 400)):
        roll = rng.random()
        if roll < 0.35:
            steps.append(("text", f"d{i} " + "x" * rng.randint(0, 60)))
        elif roll < 0.70:  # some over the fast path's 123 bytes, some multi-byte, an empty one now and then
            steps.append(("str", rng.choice(["", "é", f"s{i} " + "ü" * rng.randint(0, 70)])))
        elif roll < 0.80:
            steps.append(("pause", 0))
        elif roll < 0.84:
            steps.append(("tool", i))
        elif roll < 0.87:
            steps.append(("usage", i))
        elif roll < 0.89:
            steps.append(("text", "big " + "y" * rng.randint(3_000, 20_000)))
        elif roll < 0.895:
            steps.append((rng.choice(["completed", "failed"]), i))
    return steps


def _expected(script: list[tuple[str, object]]) -> list[pb.RunEvent]:
    """The events the script makes, up to and including its terminal one (the SDK's `completed` if none)."""
    out: list[pb.RunEvent] = []
    for op, arg in script:
        if op in ("text", "str"):
            out.append(events.text(str(arg)))
        elif op == "tool":
            out += [
                events.tool_started(f"c{arg}", "lookup", {"q": arg}),
                events.tool_finished(f"c{arg}", "lookup", f"result {arg}"),
            ]
        elif op == "usage":
            out.append(events.usage(int(arg), 1, model="m"))  # type: ignore[call-overload]
        elif op == "completed":
            return [*out, events.completed()]
        elif op == "failed":
            return [*out, events.failed("scripted", f"failure {arg}")]
    return [*out, events.completed()]


def _stored(db: Database, run_id: str) -> list[pb.RunEvent]:
    """The run's events as its rows hold them, checking each row's shape: a plain row is one event of its kind
    keyed by its seq; a delta-run row is two or more consecutive text deltas keyed by the last one's seq."""
    out: list[pb.RunEvent] = []
    for r in db.query("SELECT seq, kind, payload FROM run_events WHERE run_id = ? ORDER BY seq", (run_id,)):
        held = row_events(r["kind"], r["payload"])
        assert held and held[-1].seq == r["seq"]
        if r["kind"] == DELTA_RUN:
            assert len(held) >= 2 and all(e.HasField("text_delta") for e in held)
            assert [e.seq for e in held] == list(range(held[0].seq, r["seq"] + 1))
        else:
            assert len(held) == 1 and held[0].WhichOneof("kind") == r["kind"]
        out += held
    return out


def _assert_pages_are_seq_exact(store: RunStore, run_id: str, streamed: list[pb.RunEvent], rng: random.Random) -> None:
    """Every after_seq (inside a row or at its edge) with a few page sizes gives exactly the next events."""
    for after in range(len(streamed) + 1):
        limit = rng.choice([1, 2, 3, 64, 5000])
        page, more = store.events(run_id, after, limit)
        assert page == streamed[after : after + limit], (after, limit)
        assert more == (after + limit < len(streamed)), (after, limit)


async def _listed(h: HostHarness, run_id: str) -> list[pb.RunEvent]:
    listed: list[pb.RunEvent] = []
    while True:
        after = listed[-1].seq if listed else 0
        page = await h.client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=run_id, after_seq=after, limit=97))
        listed.extend(page.events)
        if not page.has_more:
            return listed


@pytest.mark.slow
async def test_streamed_events_are_persisted_exactly_for_random_batch_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delta_runs = fast = 0
    number = text_deltas.number

    def counted(data: bytes, first_seq: int, created_at: float) -> text_deltas.TextDeltas | None:
        nonlocal fast
        numbered = number(data, first_seq, created_at)
        fast += numbered is not None
        return numbered

    monkeypatch.setattr(text_deltas, "number", counted)
    async with HostHarness(tmp_path, runners=[Shapes]) as h:
        for seed in range(16):
            rng = random.Random(seed)
            # Runner batches of 1 to 64 events, some cut by bytes; client messages sometimes cut by the host.
            monkeypatch.setattr(sdk_server, "MAX_BATCH", rng.choice([1, 2, 7, 64, 256]))
            monkeypatch.setattr(sdk_server, "MAX_BATCH_BYTES", rng.choice([4 * 1024 * 1024, 4_000]))
            monkeypatch.setattr(limits, "CLIENT_BATCH_BYTES", rng.choice([4 * 1024 * 1024, 6_000]))
            script = _script(rng)
            expected = _expected(script)
            result = await asyncio.wait_for(h.send(json.dumps(script), conversation_id=f"s{seed}"), 60)
            streamed = result.events
            why = f"seed {seed}"

            assert [e.seq for e in streamed] == list(range(1, len(expected) + 1)), why
            assert all(e.created_at > 0 for e in streamed), why
            bare = []
            for e in streamed:
                copy = pb.RunEvent()
                copy.CopyFrom(e)
                copy.ClearField("seq")
                copy.ClearField("created_at")
                bare.append(copy)
            assert bare == expected, why
            terminal = expected[-1]
            assert result.run.status == ("completed" if terminal.HasField("completed") else "failed"), why

            assert await _listed(h, result.run.run_id) == streamed, why
            await h.host.db.flush()
            assert _stored(h.host.db, result.run.run_id) == streamed, why
            _assert_pages_are_seq_exact(h.host.run_store, result.run.run_id, streamed, rng)
            delta_runs += h.host.db.query_one(
                "SELECT COUNT(*) AS n FROM run_events WHERE run_id = ? AND kind = ?", (result.run.run_id, DELTA_RUN)
            )["n"]
            if not any(op in ("tool",) for op, _ in script):
                deltas = "".join(e.text_delta.text for e in streamed if e.HasField("text_delta"))
                assert result.run.text == deltas, why
        assert h.host.db.pending_bytes == 0 and h.host.db.pending_jobs == 0
    assert delta_runs > 16  # the shapes did store streamed deltas as delta-run rows
    assert fast > 16  # and many runner messages took the fast path, the others the general one


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.integers(0, 20_000), min_size=1, max_size=80),
    max_batch=st.sampled_from([1, 2, 7, 256]),
    max_bytes=st.sampled_from([200, 4_000, 4 * 1024 * 1024]),
)
def test_encoded_batches_parse_back_to_the_events_within_both_caps(
    texts: list[int], max_batch: int, max_bytes: int
) -> None:
    """The SDK encodes each event once and sends batches as concatenations (no protobuf batch message): each one
    must parse as a RunEventBatch holding exactly the next events, lengths of one, two and three varint bytes
    alike, within MAX_BATCH events and MAX_BATCH_BYTES bytes (one event over the byte cap travels alone)."""
    sent = [events.text("x" * n) if n % 3 else events.usage(n, 1, model="m" * (n % 200)) for n in texts]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sdk_server, "MAX_BATCH", max_batch)
        mp.setattr(sdk_server, "MAX_BATCH_BYTES", max_bytes)
        batches = list(sdk_server._batches([sdk_server._encoded(e) for e in sent]))
    received: list[pb.RunEvent] = []
    for data in batches:
        batch = pb.RunEventBatch.FromString(data)
        assert 1 <= len(batch.events) <= max_batch
        assert len(data) <= max_bytes or len(batch.events) == 1
        received.extend(batch.events)
    assert received == sent


async def test_a_run_writer_coalesces_what_arrives_while_the_writer_is_busy(store_target: Path | str) -> None:
    db = Database(store_target)
    await db.open()
    try:
        gate = threading.Event()
        db.enqueue(lambda conn: gate.wait(10))  # holds the writer thread
        writer = RunWriter(
            Conversations(db, CursorCodec(b"k" * 32)), run_id="run_x", bot_id="b", conversation_id="c", event_id="e"
        )
        seq = 0
        for size in (3, 1, 70, 129):  # crosses the 64-, 32-, ... row statements
            part = []
            for _ in range(size):
                seq += 1
                part.append(pb.RunEvent(seq=seq, created_at=1.0, text_delta=pb.TextDelta(text=f"t{seq}")))
            writer.add(part, [], weight=100 * size)
        assert db.pending_jobs == 2  # the gate and ONE job for the four batches
        assert db.pending_bytes == 100 * (3 + 1 + 70 + 129)
        gate.set()
        await db.flush()
        stored = _stored(db, "run_x")
        assert [e.seq for e in stored] == list(range(1, seq + 1))
        assert all(e.text_delta.text == f"t{e.seq}" for e in stored)
        assert db.query_one("SELECT COUNT(*) AS n FROM run_events")["n"] == 1  # one job of deltas: one row
        assert db.pending_bytes == 0 and db.pending_jobs == 0
        # Once written, the next batch queues a new job (nothing is left waiting on a job that already ran).
        writer.add([pb.RunEvent(seq=seq + 1, text_delta=pb.TextDelta(text="late"))], [], weight=1)
        await db.flush()
        assert [e.seq for e in _stored(db, "run_x")] == list(range(1, seq + 2))
    finally:
        await db.close()


async def test_events_after_the_terminal_one_in_the_same_batch_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A runner that does not stop at its terminal event (the SDK does; a hostile or buggy runner may not): what
    # follows it in the same batch is neither streamed nor persisted.
    monkeypatch.setattr(sdk_server.events, "is_terminal", lambda event: False)
    async with HostHarness(tmp_path, runners=[Shapes]) as h:
        script = [("text", "a"), ("completed", 0), ("text", "after"), ("failed", 1)]
        result = await asyncio.wait_for(h.send(json.dumps(script)), 30)
        assert [e.WhichOneof("kind") for e in result.events] == ["text_delta", "completed"]
        assert result.run.status == "completed" and result.run.text == "a"
        assert await _listed(h, result.run.run_id) == result.events
        await h.host.db.flush()
        assert [e.seq for e in _stored(h.host.db, result.run.run_id)] == [1, 2]


async def test_a_message_that_is_not_a_run_event_batch_fails_the_run_and_the_next_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A runner's message must parse as a RunEventBatch: here two deltas each hold half of "é" (each string field
    # must be valid UTF-8 on its own), and then bytes that are no protobuf at all. The run fails with a code that
    # says whose fault it is, what was accepted before stays, and the runner's next run is served.
    async with HostHarness(tmp_path, runners=[Shapes]) as h:
        ok = await asyncio.wait_for(h.send(json.dumps([("str", "fine")]), conversation_id="first"), 30)
        assert ok.run.status == "completed"
        for garbage in (b"".join(bytes((0x0A, 5, 0x0A, 3, 0x0A, 1, b)) for b in "é".encode()), b"\xff\xff\xff"):
            with monkeypatch.context() as mp:
                mp.setattr(sdk_server, "_text_entry", lambda text, sent=garbage: sent)
                bad = await asyncio.wait_for(h.send(json.dumps([("str", "x")]), conversation_id="bad"), 30)
            assert bad.run.status == "failed" and bad.run.error_code == "runner_protocol", bad.run
            assert "malformed RunEventBatch" in bad.run.error_message
            assert [e.WhichOneof("kind") for e in bad.events] == ["failed"]
            assert await _listed(h, bad.run.run_id) == bad.events
        again = await asyncio.wait_for(h.send(json.dumps([("str", "again")]), conversation_id="first"), 30)
        assert again.run.status == "completed" and again.run.text == "again"


def _numbered(start: int, *events: pb.RunEvent) -> list[pb.RunEvent]:
    for i, e in enumerate(events, start=start):
        e.seq = i
        e.created_at = 1.0
    return list(events)


def _delta(text: str) -> pb.RunEvent:
    return pb.RunEvent(text_delta=pb.TextDelta(text=text))


async def test_mixed_batches_become_delta_runs_and_single_rows_and_page_seq_exactly(
    store_target: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(store_target)
    await db.open()
    try:
        writer = RunWriter(
            Conversations(db, CursorCodec(b"k" * 32)), run_id="r", bot_id="b", conversation_id="c", event_id="e"
        )
        whole = pb.RunEventBatch(events=_numbered(1, *(_delta(f"w{i}") for i in range(5))))
        writer.add(whole.events, [], 1, whole)  # deltas only, handed over whole
        mixed = _numbered(
            6,
            _delta("m6"),
            _delta("m7"),
            pb.RunEvent(tool_started=pb.ToolStarted(tool_call_id="c", tool_name="t", arguments_json="{}")),
            _delta("m9"),  # a lone delta between two other events: a plain row
            pb.RunEvent(usage=pb.Usage(input_tokens=3, output_tokens=4, model="m")),
            _delta("m11"),
            _delta("m12"),
        )
        writer.add(mixed, [], 1)
        tail = pb.RunEventBatch(events=_numbered(13, _delta("t13"), _delta("t14")))
        writer.add(tail.events, [], 1, tail)  # continues the open delta run of the mixed batch
        writer.add(_numbered(15, pb.RunEvent(completed=pb.Completed())), [], 1)
        await db.flush()
        expected = [*whole.events, *mixed, *tail.events, pb.RunEvent(seq=15, created_at=1.0, completed=pb.Completed())]
        assert _stored(db, "r") == expected
        shape = [(r["kind"], r["seq"]) for r in db.query("SELECT kind, seq FROM run_events WHERE run_id = 'r'")]
        assert shape == [
            (DELTA_RUN, 7),
            ("tool_started", 8),
            ("text_delta", 9),
            ("usage", 10),
            (DELTA_RUN, 14),
            ("completed", 15),
        ]
        store = RunStore(db)
        for after in range(16):
            for limit in (1, 2, 4, 100):
                page, more = store.events("r", after, limit)
                assert page == expected[after : after + limit] and more == (after + limit < 15), (after, limit)
        # A byte-capped page ends inside a delta run and the next page picks up at the following seq.
        monkeypatch.setattr(limits, "RUN_EVENTS_PAGE_BYTES", 3 * (expected[0].ByteSize() + 8))
        paged: list[pb.RunEvent] = []
        more = True
        while more:
            page, more = store.events("r", paged[-1].seq if paged else 0, 100)
            assert 1 <= len(page) <= 3
            paged += page
        assert paged == expected
    finally:
        await db.close()


async def test_delta_runs_close_at_their_byte_cap_and_rows_of_older_hosts_read_the_same(
    store_target: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deltas = _numbered(1, *(_delta("x" * 20) for _ in range(10)))
    monkeypatch.setattr(runs_store, "DELTA_RUN_MAX_BYTES", 3 * (deltas[0].ByteSize() + 2))  # 2: its framing
    db = Database(store_target)
    await db.open()
    try:
        writer = RunWriter(
            Conversations(db, CursorCodec(b"k" * 32)), run_id="new", bot_id="b", conversation_id="c", event_id="e"
        )
        writer.add(deltas, [], 1)
        await db.flush()
        assert _stored(db, "new") == deltas
        counts = [len(row_events(r["kind"], r["payload"])) for r in db.query("SELECT kind, payload FROM run_events")]
        assert counts == [3, 3, 3, 1]  # three to a row under the cap; the lone last one is a plain row
        # One row per event, as hosts before delta runs wrote them: read exactly as before.
        await db.write(
            lambda conn: conn.executemany(
                "INSERT INTO run_events(run_id, seq, kind, payload) VALUES ('old', ?, ?, ?)",
                [(e.seq, e.WhichOneof("kind"), e.SerializeToString()) for e in deltas],
            )
        )
        store = RunStore(db)
        for after in range(11):
            assert store.events("old", after, 4) == store.events("new", after, 4)
            assert store.events("old", after, 4)[0] == deltas[after : after + 4]
    finally:
        await db.close()
