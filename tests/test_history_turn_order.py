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

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenthost.host.store.conversations import Conversations, NewItem, conversation_scope
from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [pytest.mark.timeout(120)]
BOT, CONV, OTHER = "b", "c", "other"


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
        Conversations.insert_items(
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
        lambda c: Conversations.insert_items(
            c, bot_id=BOT, conversation_id=CONV, run_id="r", event_id=t.event_ids[event_seq], items=items
        )
    )
    t.turns[event_seq] += texts


async def _legacy(db: Database, t: Transcript) -> None:
    text = f"legacy{len(t.legacy)}"
    items = [NewItem(role="assistant", item_type="message", text=text)]
    await db.write(
        lambda c: Conversations.insert_items(
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


async def _play(root: Path, steps: list[tuple[str, int]]) -> None:
    db = Database(root / "t.db")
    await db.open()
    try:
        conv = Conversations(db, CursorCodec(b"k" * 32))
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


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_pages_read_turn_order_whatever_the_arrival_order(steps: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory(prefix="turnorder-") as tmp:
        asyncio.run(asyncio.wait_for(_play(Path(tmp), steps), 60))


async def test_a_burst_reads_message_then_reply(tmp_path: Path) -> None:
    """The case the order exists for: m0 m1 m2 arrive before any run answers."""
    await _play(
        tmp_path,
        [("message", 0)] * 3 + [("output", 2), ("finish", 0), ("output", 1), ("finish", 0), ("output", 1)],
    )


@pytest.fixture
async def burst(tmp_path: Path):  # noqa: ANN201
    db = Database(tmp_path / "t.db")
    await db.open()
    t = Transcript()
    seqs = [await _message(db, t) for _ in range(3)]
    await _message(db, t, OTHER)
    for seq in seqs:
        await _output(db, t, seq, 2)
    yield Conversations(db, CursorCodec(b"k" * 32)), t, db
    await db.close()


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


async def test_pages_walk_the_turn_index(burst) -> None:  # noqa: ANN001
    """Every transcript read of a position is an index walk: pages from a cursor seek inside the cursor's turn
    (event_seq = ? AND rowid > ?) rather than walking it, and nothing scans the table or sorts the conversation."""
    conv, t, db = burst
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
