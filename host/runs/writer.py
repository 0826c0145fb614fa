"""A streaming run's way to the database: its numbered events and transcript items, appended per runner batch on
the event loop, written by one queued job that takes everything appended until it runs.

Why not one writer job per runner batch: every job costs the writer thread a SAVEPOINT, its statements and a
RELEASE, and each of those gives the GIL away and has to win it back from a busy event loop, so under a fast
stream the writer fell behind by whole seconds while mostly waiting. One job per run in the queue, however many
batches arrived meanwhile, makes that a per-commit cost; consecutive text deltas then go out as one row (RunStore).

Order and durability are those of the queue: a run's job sits in the FIFO ahead of anything queued after the
batches it holds (its end, in particular), and it commits with the group like any other job.

A write of the run that does not commit (the database unreachable, the job's SQL refused) loses events clients
already saw: from then on the writer records nothing more of the run (`lost` says why) and calls `on_lost` on the
event loop, so the run is ended failed (faults.RUN_CODE) rather than recorded with a hole. A transaction the writer
runs again after a conflict gets back what the job had taken (Database.on_rollback)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence

from agenthost.host.store.conversations import Conversations, NewItem
from agenthost.host.store.db import Database
from agenthost.host.store.runs import EventPart, RunStore
from agenthost.host.store.text_deltas import TextDeltas
from agenthost.protos import common_pb2 as pb


class RunWriter:
    def __init__(
        self,
        conversations: Conversations,
        *,
        run_id: str,
        bot_id: str,
        conversation_id: str,
        event_id: str,
        event_seq: int | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        """`event_seq`: the seq of `event_id` (the run's message), if known (see Conversations.insert_items)."""
        self._conversations = conversations
        self._db: Database = conversations.db
        self._run = (run_id, bot_id, conversation_id, event_id)
        self._event_seq = event_seq
        # The loop appends and the writer thread takes: both under the lock, held for a few list operations.
        self._lock = threading.Lock()
        self._events: list[EventPart] = []
        self._items: list[NewItem] = []
        self._weight = 0
        self._queued = False
        self._on_lost = on_lost
        self.lost = ""

    def add(
        self,
        events: Sequence[pb.RunEvent] | TextDeltas,
        items: list[NewItem],
        weight: int,
        deltas: pb.RunEventBatch | None = None,
    ) -> None:
        """Queues `events` (numbered, never mutated again, or numbered as bytes) and `items` for writing; never
        waits. `weight` counts toward the writer queue's byte bound until written, so the producer's backpressure
        sees it. `deltas`: the batch whose `events` these are, when all of them are text deltas (it is then
        serialized whole)."""
        if self.lost:
            return  # nothing more of this run is recorded; the run is being ended
        with self._lock:
            self._events.append(events if isinstance(events, TextDeltas) else (events, deltas))
            if items:
                self._items.extend(items)
            self._weight += weight
            queue = not self._queued
            self._queued = True
        self._db.charge(weight)
        if queue:
            self._db.enqueue(self._write, on_fail=self._failed)

    def _write(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            events, self._events = self._events, []
            items, self._items = self._items, []
            weight, self._weight = self._weight, 0
            self._queued = False
        self._db.charge(-weight)
        self._db.on_rollback(lambda: self._put_back(events, items, weight))
        run_id, bot_id, conversation_id, event_id = self._run
        RunStore.insert_events(conn, run_id, events)
        if items:
            self._conversations.insert_items(
                conn,
                bot_id=bot_id,
                conversation_id=conversation_id,
                run_id=run_id,
                event_id=event_id,
                items=items,
                event_seq=self._event_seq,
            )

    def _put_back(self, events: list[EventPart], items: list[NewItem], weight: int) -> None:
        """Undo of a _write whose transaction did not commit (writer thread): ahead of anything appended since."""
        with self._lock:
            self._events[:0] = events
            self._items[:0] = items
            self._weight += weight
            self._queued = True  # the job is still in the batch being run again, or failed (then _failed)
        self._db.charge(weight)

    def _failed(self, exc: BaseException) -> None:
        """The job did not commit (writer thread, before the next batch: the run's end job, queued behind it,
        sees `lost`)."""
        with self._lock:
            weight, self._weight = self._weight, 0
            self._events, self._items = [], []
            self._queued = False
            self.lost = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        self._db.charge(-weight)
        if self._on_lost is not None:
            self._db.soon(self._on_lost, self.lost)
