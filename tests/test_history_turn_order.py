"""The transcript is read in turn order: each event's message, then its run's output, event after event.

A message is recorded when it arrives and a run's output when the run executes, so in a burst the recording order
(seq) is m1 m2 A1 A2. Every position-sensitive read (pages both ways, from any cursor, with and without a run's
horizon; the newest-item cursor; the inline tail) must give m1 A1 m2 A2 instead, off the transcript_turn index,
with cursors that stay bound to their conversation and tamper-evident. Cursors minted before turn order (a seq
alone) are still honoured at the item they name.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenthost.host.store.conversations import Conversations, NewItem, conversation_scope
from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness
from tests.pg_cluster import open_database

pytestmark = [pytest.mark.timeout(120)]
BOT, CONV, OTHER = "b", "c", "other"
CODEC = CursorCodec(b"k" * 32)


@dataclass
class Transcript:
    """What the test wrote, and in which turn each item belongs."""

    legacy: list[str] = field(default_factory=list)  # items of no known event (event_seq 0)
    turns: dict[int, list[str]] = field(default_factory=dict)  # event seq -> its message, then its run's output
    event_ids: dict[int, str] = field(default_factory=dict)

    def expected(self, through: int | None = None) -> list[str]:
        out = list(self.legacy)
        for seq in sorted(self.turns):
            if through is None or seq <= through:
                out += self.turns[seq]
        return out


async def _message(db: Database, t: Transcript, conversation: str = CONV) -> int:
    text = f"m{len(t.turns)}" if conversation == CONV else "elsewhere"

    def write(conn):  # noqa: ANN001, ANN202
        ev = Conversations.insert_event(
            conn,
            bot_id=BOT,
            conversation_id=conversation,
            event_type="message.received",
            source="test",
            actor=pb.Actor(actor_type="user", actor_id="u"),
            text=text,
            data_json="{}",
        )
        Conversations(db, CODEC).insert_items(
            conn,
            bot_id=BOT,
            conversation_id=conversation,
            run_id="r",
            event_id=ev.event_id,
            items=[NewItem(role="user", item_type="message", text=text)],
        )
        return ev

    ev = await db.write(write)
    if conversation == CONV:
        t.turns[ev.seq] = [text]
        t.event_ids[ev.seq] = ev.event_id
    return ev.seq


async def _output(db: Database, t: Transcript, event_seq: int, n: int) -> None:
    texts = [f"{t.turns[event_seq][0]}.a{len(t.turns[event_seq]) - 1 + i}" for i in range(n)]
    items = [NewItem(role="assistant", item_type="message", text=x) for x in texts]
    await db.write(
        lambda c: Conversations(db, CODEC).insert_items(
            c, bot_id=BOT, conversation_id=CONV, run_id="r", event_id=t.event_ids[event_seq], items=items
        )
    )
    t.turns[event_seq] += texts


async def _legacy(db: Database, t: Transcript) -> None:
    text = f"legacy{len(t.legacy)}"
    items = [NewItem(role="assistant", item_type="message", text=text)]
    await db.write(
        lambda c: Conversations(db, CODEC).insert_items(
            c, bot_id=BOT, conversation_id=CONV, run_id="r", event_id="gone", items=items
        )
    )
    t.legacy.append(text)


def _walk(
    conv: Conversations, *, cursor: str, forward: bool, limit: int, through: int | None
) -> list[pb.TranscriptItem]:
    """Every item from `cursor` on, in page order (oldest first when forward)."""
    out: list[pb.TranscriptItem] = []
    for _ in range(10_000):
        page = conv.page_history(BOT, CONV, cursor=cursor, forward=forward, limit=limit, through_event=through)
        out += page.items
        if not page.has_more:
            return out
        assert page.next_cursor == page.items[-1].cursor
        cursor = page.next_cursor
    raise AssertionError("paging never ended")


def check(conv: Conversations, t: Transcript) -> None:
    for through in (None, *sorted(t.turns)):
        expected = t.expected(through)
        for limit in (1, 2, 3, 100):
            fwd = _walk(conv, cursor="", forward=True, limit=limit, through=through)
            assert [i.text for i in fwd] == expected, (through, limit)
            back = _walk(conv, cursor="", forward=False, limit=limit, through=through)
            assert [i.text for i in reversed(back)] == expected, (through, limit)
        # From any item's cursor, either way: exactly what lies past it in turn order.
        for k, item in enumerate(fwd):
            assert [i.text for i in _walk(conv, cursor=item.cursor, forward=True, limit=2, through=through)] == (
                expected[k + 1 :]
            )
            back = _walk(conv, cursor=item.cursor, forward=False, limit=2, through=through)
            assert [i.text for i in reversed(back)] == expected[:k]
        count, latest = conv.history_stats(BOT, CONV, through)
        assert count == len(expected)
        assert latest == (fwd[-1].cursor if fwd else "")
        for n in (1, 3, 100):
            assert [i.text for i in conv.recent(BOT, CONV, n, through)] == expected[-n:]


# A step: a message arrives; the running run (the oldest unfinished event's) records n items; it finishes and the
# next queued run starts; or a row of no known event is written (as V8 left rows whose event was missing).
STEPS = st.lists(
    st.one_of(
        st.just(("message", 0)),
        st.tuples(st.just("output"), st.integers(1, 3)),
        st.just(("finish", 0)),
        st.just(("legacy", 0)),
        st.just(("elsewhere", 0)),
    ),
    min_size=1,
    max_size=14,
)


async def _play(target: Path | str, root: Path, steps: list[tuple[str, int]]) -> None:
    db = await open_database(target, root)
    try:
        conv = Conversations(db, CODEC)
        t = Transcript()
        running = 0  # index, among this conversation's events, of the run executing now
        for kind, n in steps:
            if kind == "message":
                await _message(db, t)
            elif kind == "elsewhere":
                await _message(db, t, OTHER)  # another conversation's rows interleave in seq, never in pages
            elif kind == "legacy":
                await _legacy(db, t)
            elif running < len(t.turns):
                if kind == "output":
                    await _output(db, t, sorted(t.turns)[running], n)
                else:
                    running += 1
        check(conv, t)
    finally:
        await db.close()


# Each example on a new SQLite file; on PostgreSQL, on the test's database emptied, fewer examples (each costs a few
# round trips per write: the SQL under test is the same, the examples explore the orders).
_EXAMPLES = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
_PG_EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _examples(play: Any, target: Path | str | None, steps: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory(prefix="turnorder-") as tmp:
        asyncio.run(asyncio.wait_for(play(target or Path(tmp) / "t.db", Path(tmp), steps), 60))


@_EXAMPLES
@given(steps=STEPS)
def test_pages_read_turn_order_whatever_the_arrival_order(steps: list[tuple[str, int]]) -> None:
    _examples(_play, None, steps)


@_PG_EXAMPLES
@given(steps=STEPS)
def test_pages_read_turn_order_whatever_the_arrival_order_on_postgresql(
    pg_dsn: str, steps: list[tuple[str, int]]
) -> None:
    _examples(_play, pg_dsn, steps)


async def test_a_burst_reads_message_then_reply(store_target: Path | str, tmp_path: Path) -> None:
    """The case the order exists for: m0 m1 m2 arrive before any run answers."""
    await _play(
        store_target,
        tmp_path,
        [("message", 0)] * 3 + [("output", 2), ("finish", 0), ("output", 1), ("finish", 0), ("output", 1)],
    )


async def _burst(target: Path | str, tmp_path: Path) -> AsyncIterator[tuple[Conversations, Transcript, Database]]:
    db = await open_database(target, tmp_path)
    t = Transcript()
    seqs = [await _message(db, t) for _ in range(3)]
    await _message(db, t, OTHER)
    for seq in seqs:
        await _output(db, t, seq, 2)
    yield Conversations(db, CODEC), t, db
    await db.close()


@pytest.fixture
async def burst(store_target: Path | str, tmp_path: Path):  # noqa: ANN201
    async for made in _burst(store_target, tmp_path):
        yield made


@pytest.fixture
async def sqlite_burst(tmp_path: Path):  # noqa: ANN201
    """The burst on SQLite alone: for the tests of SQLite's query plans."""
    async for made in _burst(tmp_path / "t.db", tmp_path):
        yield made


async def test_cursors_from_before_turn_order_resume_at_their_item(burst) -> None:  # noqa: ANN001
    """A seq-only cursor (minted by an older host, or kept by a runner across an upgrade) is still the MAC'd
    position of one item of this conversation: paging from it continues at that item's place in turn order."""
    conv, t, _ = burst
    scope = conversation_scope(BOT, CONV)
    expected = t.expected()
    items = _walk(conv, cursor="", forward=True, limit=100, through=None)
    for k, item in enumerate(items):
        legacy = conv.cursors.encode("history", scope, item.seq)
        assert legacy != item.cursor
        assert [i.text for i in _walk(conv, cursor=legacy, forward=True, limit=2, through=None)] == expected[k + 1 :]
        back = _walk(conv, cursor=legacy, forward=False, limit=2, through=None)
        assert [i.text for i in reversed(back)] == expected[:k]
    other_seq = conv.db.query_one("SELECT seq FROM transcript WHERE conversation_id = ?", (OTHER,))[0]
    # MAC'd for this conversation but naming a row of another: refused, never paged from another's position.
    with pytest.raises(errors.InvalidArgument, match="page again"):
        conv.page_history(BOT, CONV, cursor=conv.cursors.encode("history", scope, other_seq), forward=True, limit=5)
    # Issued for the other conversation: refused by its MAC, old form or new.
    other_scope = conversation_scope(BOT, OTHER)
    for cursor in (
        conv.cursors.encode("history", other_scope, other_seq),
        conv.cursors.encode("history", other_scope, 1, 1),
    ):
        with pytest.raises(errors.InvalidArgument, match="not issued"):
            conv.page_history(BOT, CONV, cursor=cursor, forward=True, limit=5)


async def test_turn_cursors_are_tamper_evident(burst) -> None:  # noqa: ANN001
    conv, _, _ = burst
    items = _walk(conv, cursor="", forward=True, limit=100, through=None)
    # a reply: its turn (its run's event seq) is not its own seq, so swapping the two forges a new position
    item = next(i for i in items if i.role == "assistant" and not i.cursor.startswith(f"{i.seq}-"))
    position, tag = item.cursor.split(".")
    turn, seq = position.split("-")
    forged = [
        f"{int(turn) + 1}-{seq}.{tag}",  # another turn, same tag
        f"{turn}-{int(seq) + 1}.{tag}",
        f"{seq}-{turn}.{tag}",  # swapped
        f"{seq}.{tag}",  # the seq alone under the pair's tag
        f"{turn}.{tag}",
    ]
    for cursor in forged:
        with pytest.raises(errors.InvalidArgument, match="not issued"):
            conv.page_history(BOT, CONV, cursor=cursor, forward=True, limit=5)
    for cursor in (
        f"{turn}-{seq}-1.{tag}",
        f"-{seq}.{tag}",
        f"{turn}-.{tag}",
        f"²-{seq}.{tag}",
        f"{turn}--{seq}.{tag}",
    ):
        with pytest.raises(errors.InvalidArgument, match="malformed"):
            conv.page_history(BOT, CONV, cursor=cursor, forward=True, limit=5)
    # A transcript cursor is no event cursor, and the other way round.
    with pytest.raises(errors.InvalidArgument):
        conv.page_events(BOT, CONV, cursor=item.cursor, forward=True, limit=5)
    event = conv.page_events(BOT, CONV, cursor="", forward=True, limit=1).items[0]
    with pytest.raises(errors.InvalidArgument, match="not issued"):
        conv.page_history(BOT, CONV, cursor=event.cursor, forward=True, limit=5)


async def test_pages_walk_the_turn_index(sqlite_burst) -> None:  # noqa: ANN001
    """Every transcript read of a position is an index walk: pages from a cursor seek inside the cursor's turn
    (event_seq = ? AND rowid > ?) rather than walking it, and nothing scans the table or sorts the conversation."""
    conv, t, db = sqlite_burst
    recorded: list[tuple[str, tuple]] = []
    real = db.query_tuples

    def spy(sql: str, params=()):  # noqa: ANN001, ANN202
        recorded.append((sql, tuple(params)))
        return real(sql, params)

    middle = _walk(conv, cursor="", forward=True, limit=100, through=None)[4]  # a reply inside the second turn
    through = sorted(t.turns)[1]
    db.query_tuples = spy
    for forward in (True, False):
        for horizon in (None, through):
            conv.page_history(BOT, CONV, cursor="", forward=forward, limit=2, through_event=horizon)
            conv.page_history(BOT, CONV, cursor=middle.cursor, forward=forward, limit=2, through_event=horizon)
    conv.recent(BOT, CONV, 3, through)
    one_row = db.query_one
    stats: list[tuple[str, tuple]] = []

    def spy_one(sql: str, params=()):  # noqa: ANN001, ANN202
        stats.append((sql, tuple(params)))
        return one_row(sql, params)

    db.query_one = spy_one
    conv.history_stats(BOT, CONV, through)
    recorded += [(sql, p) for sql, p in stats if "event_seq, seq" in sql]
    assert len(recorded) == 10
    seeks = 0
    for sql, params in recorded:
        plan = [row[3] for row in db.reader.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()]
        reads = [line for line in plan if "transcript" in line and line.startswith(("SEARCH", "SCAN"))]
        assert reads and all("INDEX transcript_turn (bot_id=? AND conversation_id=?" in r for r in reads), plan
        if "UNION ALL" in sql:
            # the rest of the cursor's turn, then the turns past it: each a seek; the merge sorts only what the
            # two LIMITed halves return
            assert any("event_seq=? AND rowid" in r for r in reads), plan
            seeks += 1
        else:
            assert not any("TEMP B-TREE" in line for line in plan), plan
    assert seeks == 4


# ---- a reader tailing forward while turns are still running ----


async def _sync_runs(db: Database, t: Transcript, running: int) -> None:
    """The runs rows the model implies: the turns before `running` ended, that one running, the rest queued."""

    def write(conn):  # noqa: ANN001, ANN202
        for k, seq in enumerate(sorted(t.turns)):
            status = "completed" if k < running else "running" if k == running else "queued"
            conn.execute(
                "INSERT INTO runs (run_id, bot_id, conversation_id, binding_id, runner_id, plugin_id, event_id,"
                " status, token_hash, grant_json, created_at, deadline_at)"
                " VALUES (?, ?, ?, '', '', '', ?, ?, '', '{}', 0, 0)"
                " ON CONFLICT (run_id) DO UPDATE SET status = excluded.status",
                (f"run-{seq}", BOT, CONV, t.event_ids[seq], status),
            )

    await db.write(write)


def _tail(conv: Conversations, cursor: str, seen: list[str]) -> str:
    """What a client polling GetHistory forward does: pages on from its last item until nothing more is ready."""
    for _ in range(10_000):
        page = conv.page_history(BOT, CONV, cursor=cursor, forward=True, limit=2, settled=True)
        seen += [i.text for i in page.items]
        if page.items:
            cursor = page.items[-1].cursor
        if not page.has_more:
            return cursor
    raise AssertionError("paging never ended")


async def _play_tail(target: Path | str, root: Path, steps: list[tuple[str, int]]) -> None:
    db = await open_database(target, root)
    try:
        conv = Conversations(db, CODEC)
        t = Transcript()
        running, cursor, seen = 0, "", []
        for kind, n in steps:
            if kind == "message":
                await _message(db, t)
            elif kind == "elsewhere":
                await _message(db, t, OTHER)
            elif kind == "output" and running < len(t.turns):
                await _output(db, t, sorted(t.turns)[running], n)
            elif kind == "finish" and running < len(t.turns):
                running += 1
            await _sync_runs(db, t, running)
            cursor = _tail(conv, cursor, seen)
            # Up to date through the open turn, and nothing of a later turn yet: its output may still be placed
            # before what arrived after it.
            through = sorted(t.turns)[running] if running < len(t.turns) else None
            assert seen == t.expected(through), (kind, seen)
        running = len(t.turns)  # every run ends: the held-back turns follow, each item once
        await _sync_runs(db, t, running)
        _tail(conv, cursor, seen)
        assert seen == t.expected()
    finally:
        await db.close()


@_EXAMPLES
@given(steps=STEPS)
def test_a_forward_reader_sees_every_item_once_while_turns_run(steps: list[tuple[str, int]]) -> None:
    """People's forward reads stop at the first turn still running: a running turn's output is placed before the
    messages that arrived after its own, so a reader already shown those would never be shown that output.
    (Items of no known event are left out: only hosts before V8 wrote them, never during a live conversation.)"""
    _examples(_play_tail, None, steps)


@_PG_EXAMPLES
@given(steps=STEPS)
def test_a_forward_reader_sees_every_item_once_while_turns_run_on_postgresql(
    pg_dsn: str, steps: list[tuple[str, int]]
) -> None:
    _examples(_play_tail, pg_dsn, steps)


async def test_a_forward_reader_is_not_shown_a_reply_s_successor_before_the_reply(
    store_target: Path | str, tmp_path: Path
) -> None:
    """The case itself: m0 m1 arrive; A0 streams in two parts around the reader's poll."""
    await _play_tail(
        store_target, tmp_path, [("message", 0), ("message", 0), ("output", 1), ("output", 2), ("finish", 0)]
    )


async def test_a_settled_read_finds_the_open_turn_by_index(sqlite_burst) -> None:  # noqa: ANN001
    """The bound on a forward reader is one subquery through the partial index of unfinished runs, and the rows are
    still a range of transcript_turn: a conversation with many finished runs costs the same."""
    conv, t, db = sqlite_burst
    await _sync_runs(db, t, 1)
    recorded: list[tuple[str, tuple]] = []
    real = db.query_tuples

    def spy(sql: str, params=()):  # noqa: ANN001, ANN202
        recorded.append((sql, tuple(params)))
        return real(sql, params)

    first = _walk(conv, cursor="", forward=True, limit=100, through=None)[0]
    db.query_tuples = spy
    page = conv.page_history(BOT, CONV, cursor="", forward=True, limit=100, settled=True)
    assert [i.text for i in page.items] == t.expected(sorted(t.turns)[1])
    conv.page_history(BOT, CONV, cursor=first.cursor, forward=True, limit=2, settled=True)
    assert len(recorded) == 2
    for sql, params in recorded:
        plan = [row[3] for row in db.reader.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()]
        assert any(line.startswith("SEARCH r USING INDEX runs_open") for line in plan), plan
        reads = [line for line in plan if "transcript" in line and line.startswith(("SEARCH", "SCAN"))]
        assert reads and all("INDEX transcript_turn (bot_id=? AND conversation_id=? AND event_seq" in r for r in reads)


# ---- through a real host: the run API door ----


class Parked(Runner):
    manifest = RunnerManifest(name="parked")
    live: asyncio.Queue
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await Parked.live.put(run)
        await Parked.release.wait()
        yield events.message(f"reply to {run.text}")


@pytest.mark.slow
async def test_the_run_api_honours_old_cursors_and_refuses_forged_ones(tmp_path: Path) -> None:
    """A run answering m2 of a burst pages m0 A0 m1 A1 m2 through the run API; a seq-only cursor of one of those
    items resumes there; a forged or foreign cursor is INVALID_ARGUMENT, never another position."""
    Parked.live, Parked.release = asyncio.Queue(), asyncio.Event()
    async with HostHarness(tmp_path, runners=[Parked]) as h:
        sends = [asyncio.create_task(h.send(f"m{i}", conversation_id=CONV)) for i in range(3)]
        runs = []
        for _ in range(3):
            runs.append(await asyncio.wait_for(Parked.live.get(), 30))
            if len(runs) < 3:
                Parked.release.set()
                Parked.release = asyncio.Event()
        run = runs[-1]
        pages, cursor = [], ""
        while True:
            page = await run.api.history_page(cursor=cursor, limit=2)
            pages = list(page.items)[::-1] + pages
            if not page.has_more:
                break
            cursor = page.next_cursor
        assert [i.text for i in pages] == [
            run_text for r in runs[:2] for run_text in (r.text, f"reply to {r.text}")
        ] + [run.text]
        conv = h.host.conversations
        scope = conversation_scope(run.context.conversation.bot_id, run.context.conversation.conversation_id)
        legacy = conv.cursors.encode("history", scope, pages[1].seq)  # A0's, as a host before turn order minted it
        after = await run.api.history_page(cursor=legacy, limit=10, direction="forward")
        assert [i.text for i in after.items] == [i.text for i in pages[2:]]
        position, tag = pages[1].cursor.split(".")
        turn, seq = position.split("-")
        foreign = conv.cursors.encode(
            "history", conversation_scope(run.context.conversation.bot_id, OTHER), int(turn), int(seq)
        )
        for bad in (f"{turn}-{int(seq) + 1}.{tag}", f"{seq}-{turn}.{tag}", f"{turn}-{seq}-0.{tag}", foreign):
            with pytest.raises(errors.InvalidArgument):
                await run.api.history_page(cursor=bad, limit=2)
        Parked.release.set()
        await asyncio.wait_for(asyncio.gather(*sends), 30)


class Streaming(Runner):
    """Says part of its reply, then waits to be let go before saying the rest."""

    manifest = RunnerManifest(name="streaming")
    live: asyncio.Queue
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        yield events.tool_started(f"t-{run.text}", "look", {})
        yield events.tool_finished(f"t-{run.text}", "look", "seen")
        await Streaming.live.put(run)
        await Streaming.release.wait()
        yield events.message(f"reply to {run.text}")


@pytest.mark.slow
async def test_get_history_forward_holds_back_turns_behind_a_running_one(tmp_path: Path) -> None:
    """Through the admin API: m1 arrives while m0's run is half done. A client tailing forward is shown m0 and the
    part of its run that exists, not m1; once the runs end, paging on from its last cursor gives the rest of m0's
    turn, then m1's, each item once."""
    Streaming.live, Streaming.release = asyncio.Queue(), asyncio.Event()
    async with HostHarness(tmp_path, runners=[Streaming]) as h:
        first = asyncio.create_task(h.send("m0", conversation_id=CONV))
        await asyncio.wait_for(Streaming.live.get(), 30)
        second = asyncio.create_task(h.send("m1", conversation_id=CONV))
        await h.host.registry.db.flush()

        async def tail(cursor: str) -> tuple[list[str], str]:
            seen: list[str] = []
            while True:
                page = await h.client.call(
                    "GetHistory",
                    hpb.GetHistoryRequest(
                        bot=h.bot, conversation_id=CONV, cursor=cursor, limit=2, direction=pb.FORWARD
                    ),
                )
                seen += [i.text or i.tool_name for i in page.items]
                cursor = page.items[-1].cursor if page.items else cursor
                if not page.has_more:
                    return seen, cursor

        for _ in range(600):  # m1 is recorded by its own send; wait until it is, then read
            recorded = await h.client.call(
                "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id=CONV, limit=10, direction=pb.BACKWARD)
            )
            if any(i.text == "m1" for i in recorded.items):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("m1 was never recorded")
        seen, cursor = await tail("")
        assert seen == ["m0", "look", "seen"]
        Streaming.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        rest, _ = await tail(cursor)
        assert seen + rest == ["m0", "look", "seen", "reply to m0", "m1", "look", "seen", "reply to m1"]
