"""The run event contract under every batch shape, through a real host: the runner's batches are numbered in
place, forwarded to the client without a copy, cut where a client message would be too large, and written to
SQLite by one coalesced job per run. Whatever the shapes, what a client streamed is exactly what ListRunEvents and
the run_events table hold (row for row), seq is dense from 1, created_at is set, nothing after the terminal event
counts, and the run's text is the deltas it streamed."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host import limits
from agenthost.host.run_writer import RunWriter
from agenthost.host.store.db import Database
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
        if roll < 0.70:
            steps.append(("text", f"d{i} " + "x" * rng.randint(0, 60)))
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
        if op == "text":
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
    async with HostHarness(tmp_path, runners=[Shapes]) as h:
        for seed in range(16):
            rng = random.Random(seed)
            # Runner batches of 1 to 64 events, some cut by bytes; client messages sometimes cut by the host.
            monkeypatch.setattr(sdk_server, "MAX_BATCH", rng.choice([1, 2, 7, 64]))
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
            rows = h.host.db.query(
                "SELECT seq, kind, payload FROM run_events WHERE run_id = ? ORDER BY seq", (result.run.run_id,)
            )
            assert [(r["seq"], r["kind"], pb.RunEvent.FromString(r["payload"])) for r in rows] == [
                (e.seq, e.WhichOneof("kind"), e) for e in streamed
            ], why
            if not any(op in ("tool",) for op, _ in script):
                deltas = "".join(e.text_delta.text for e in streamed if e.HasField("text_delta"))
                assert result.run.text == deltas, why
        assert h.host.db.pending_bytes == 0 and h.host.db.pending_jobs == 0


async def test_a_run_writer_coalesces_what_arrives_while_the_writer_is_busy(tmp_path: Path) -> None:
    db = Database(tmp_path / "db.sqlite")
    await db.open()
    try:
        gate = threading.Event()
        db.enqueue(lambda conn: gate.wait(10))  # holds the writer thread
        writer = RunWriter(db, run_id="run_x", bot_id="b", conversation_id="c", event_id="e")
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
        rows = db.query("SELECT seq, kind, payload FROM run_events WHERE run_id = 'run_x' ORDER BY seq")
        assert [r["seq"] for r in rows] == list(range(1, seq + 1))
        assert all(pb.RunEvent.FromString(r["payload"]).text_delta.text == f"t{r['seq']}" for r in rows)
        assert db.pending_bytes == 0 and db.pending_jobs == 0
        # Once written, the next batch queues a new job (nothing is left waiting on a job that already ran).
        writer.add([pb.RunEvent(seq=seq + 1, text_delta=pb.TextDelta(text="late"))], [], weight=1)
        await db.flush()
        assert db.query_one("SELECT COUNT(*) AS n FROM run_events")["n"] == seq + 1
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
        rows = h.host.db.query("SELECT seq FROM run_events WHERE run_id = ?", (result.run.run_id,))
        assert [r["seq"] for r in rows] == [1, 2]
