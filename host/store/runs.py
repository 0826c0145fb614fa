"""The run ledger (runs and their sequenced events) and the audit log of run-scoped API calls."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Sequence

from agenthost.host import limits
from agenthost.host.store.db import Database
from agenthost.host.store.text_deltas import TextDeltas
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import batch_entry

TERMINAL = frozenset({"completed", "failed", "cancelled", "timed_out", "interrupted"})
_CUT_COLUMNS = ("error_code", "error_message", "text", "usage_json")


def cut(text: str, chars: int, marker: str = limits.RUN_TEXT_MARKER) -> str:
    """`text` if it has at most `chars` characters, else its start and the marker, `chars` in all."""
    if len(text) <= chars:
        return text
    return text[: max(0, chars - len(marker))] + marker


def _select(chars: int) -> str:
    """The runs columns, runner-influenced text cut to `chars` characters inside SQLite: a row written by an
    older host (a 158 MB text) never has to be loaded whole to be listed. Each cut column also reports whether
    it was cut, so the marker can be added."""
    parts = [
        "run_id, bot_id, conversation_id, binding_id, runner_id, event_id, status, created_at, started_at,"
        " finished_at, deadline_at, parent_run_id, origin"
    ]
    for column in _CUT_COLUMNS:
        parts.append(f"substr({column}, 1, {int(chars)}) AS {column}, length({column}) > {int(chars)} AS {column}_cut")
    return ", ".join(parts)


# A run_events row holding consecutive text deltas, keyed by the seq of its last one; its payload is their
# RunEventBatch (each event whole, seq and created_at included). Storing a streamed run of deltas as one row takes
# SQLite's per-row cost off the hot path; every reader goes through row_events or RunStore.events.
DELTA_RUN = "text_deltas"
# A delta run closes once it holds this many payload bytes: paging into its middle parses it whole.
DELTA_RUN_MAX_BYTES = 256 * 1024

# One step of a run's writes: numbered events in order and, when they are all text deltas, the batch message whose
# `events` they are (serialized whole: one call instead of one per event); or text deltas numbered as bytes.
EventPart = tuple[Sequence[pb.RunEvent], pb.RunEventBatch | None] | TextDeltas


def row_events(kind: str, payload: bytes) -> list[pb.RunEvent]:
    """The events one run_events row holds, in seq order (rows written before delta runs hold one each)."""
    if kind == DELTA_RUN:
        return list(pb.RunEventBatch.FromString(payload).events)
    return [pb.RunEvent.FromString(payload)]


def _deltas_only(part: EventPart) -> tuple[bytes, int, int] | None:
    """(RunEventBatch bytes, events, last seq) of a part that is text deltas only and comes whole; else None."""
    if isinstance(part, TextDeltas):
        return part.batch, part.count, part.first_seq + part.count - 1
    events, batch = part
    if batch is None or not events:
        return None
    return batch.SerializeToString(), len(events), events[-1].seq


def _rows_of(parts: Sequence[EventPart]) -> list[tuple[int, str, bytes]]:
    """(seq, kind, payload) per row. A lone delta stays a plain row, so a reader of older rows sees no change."""
    rows: list[tuple[int, str, bytes]] = []
    chunks: list[bytes] = []  # the open delta run, as RunEventBatch bytes
    count = last = size = 0

    def close() -> None:
        nonlocal count, size
        if count == 1:
            event = pb.RunEventBatch.FromString(chunks[0]).events[0]
            rows.append((event.seq, "text_delta", event.SerializeToString()))
        elif count:
            rows.append((last, DELTA_RUN, b"".join(chunks)))
        chunks.clear()
        count = size = 0

    for part in parts:
        whole = _deltas_only(part)
        if whole is not None:  # the hot path: a runner message of text deltas only, stored as it was serialized
            data, deltas, last_seq = whole
            if count and size + len(data) > DELTA_RUN_MAX_BYTES:
                close()
            chunks.append(data)
            count += deltas
            last = last_seq
            size += len(data)
            continue
        assert isinstance(part, tuple)
        events = part[0]
        for event in events:
            kind = event.WhichOneof("kind")
            if kind != "text_delta":
                close()
                rows.append((event.seq, kind or "", event.SerializeToString()))
                continue
            data = batch_entry(event.SerializeToString())
            if count and size + len(data) > DELTA_RUN_MAX_BYTES:
                close()
            chunks.append(data)
            count += 1
            last = event.seq
            size += len(data)
    close()
    return rows


def _chars(row: sqlite3.Row) -> int:
    return int(row["_chars"])


class RunStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    def insert(
        conn: sqlite3.Connection,
        run: hpb.RunInfo,
        *,
        plugin_id: str,
        token_hash: str,
        grant_json: str,
        origin: str = "",
        idempotency_key: str = "",
    ) -> None:
        """`origin`: the credential that sent the message the run answers (ActiveRun.origin; migration _V9).
        `idempotency_key`: the client's name for that message (migration _V14; see by_key)."""
        conn.execute(
            "INSERT INTO runs(run_id, bot_id, conversation_id, binding_id, runner_id, plugin_id, event_id, status,"
            " token_hash, grant_json, created_at, deadline_at, started_at, parent_run_id, origin, idempotency_key)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run.run_id,
                run.bot_id,
                run.conversation_id,
                run.binding_id,
                run.runner_id,
                plugin_id,
                run.event_id,
                run.status,
                token_hash,
                grant_json,
                run.created_at,
                run.deadline_at,
                run.started_at,
                run.parent_run_id,
                origin,
                idempotency_key,
            ),
        )

    @staticmethod
    def by_key(conn: sqlite3.Connection, bot_id: str, origin: str, idempotency_key: str) -> tuple[str, str, str] | None:
        """The run a sender's earlier send with this key recorded, with that message's conversation and text, if any
        (one step down runs_idempotency, one down the events' unique event_id)."""
        row = conn.execute(
            "SELECT r.run_id, r.conversation_id, e.text FROM runs r LEFT JOIN events e ON e.event_id = r.event_id"
            " WHERE r.bot_id = ? AND r.origin = ? AND r.idempotency_key = ?",
            (bot_id, origin, idempotency_key),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2] or ""))

    async def mark_running(self, run_id: str, started_at: float, deadline_at: float) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                "UPDATE runs SET status = 'running', started_at = ?, deadline_at = ?"
                " WHERE run_id = ? AND status = 'queued'",
                (started_at, deadline_at, run_id),
            )
        )

    @staticmethod
    def finish(conn: sqlite3.Connection, run: hpb.RunInfo) -> None:
        """Records the outcome; runner-supplied text is cut to its cap here too (whatever the caller did)."""
        run.error_code = cut(run.error_code, limits.RUN_MAX_CODE_CHARS, "…")
        run.error_message = cut(run.error_message, limits.RUN_MAX_ERROR_CHARS)
        run.text = cut(run.text, limits.RUN_MAX_TEXT_CHARS)
        run.usage.model = cut(run.usage.model, limits.RUN_MAX_MODEL_CHARS, "…")
        usage = {
            "input_tokens": run.usage.input_tokens,
            "output_tokens": run.usage.output_tokens,
            "cache_read_tokens": run.usage.cache_read_tokens,
            "cache_write_tokens": run.usage.cache_write_tokens,
            "cost_usd": run.usage.cost_usd,
            "model": run.usage.model,
        }
        conn.execute(
            "UPDATE runs SET status = ?, error_code = ?, error_message = ?, finished_at = ?, text = ?, usage_json = ?"
            " WHERE run_id = ?",
            (run.status, run.error_code, run.error_message, run.finished_at, run.text, json.dumps(usage), run.run_id),
        )

    @staticmethod
    def insert_events(conn: sqlite3.Connection, run_id: str, parts: Sequence[EventPart]) -> None:
        """Writes `parts` (consecutive numbered events, in order) as rows: consecutive text deltas as one
        DELTA_RUN row (see row_events), anything else one row per event; in as few statements as the backend
        allows (dialect.insert_run_events)."""
        conn.dialect.insert_run_events(conn, run_id, _rows_of(parts))

    @staticmethod
    def _info(row: sqlite3.Row) -> hpb.RunInfo:
        keys = row.keys()

        def text(column: str, chars: int) -> str:
            value = row[column]
            if f"{column}_cut" in keys and row[f"{column}_cut"]:
                return cut(value + "…", chars)  # one character past the cap, so cut() adds the marker
            return value

        info = hpb.RunInfo(
            run_id=row["run_id"],
            bot_id=row["bot_id"],
            conversation_id=row["conversation_id"],
            binding_id=row["binding_id"],
            runner_id=row["runner_id"],
            event_id=row["event_id"],
            status=row["status"],
            error_code=text("error_code", _chars(row)),
            error_message=text("error_message", _chars(row)),
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            deadline_at=row["deadline_at"],
            text=text("text", _chars(row)),
            parent_run_id=row["parent_run_id"],
            origin=row["origin"],
        )
        if not ("usage_json_cut" in keys and row["usage_json_cut"]):
            usage = json.loads(row["usage_json"] or "{}")
            if usage:
                info.usage.CopyFrom(pb.Usage(**usage))
        return info

    def get(self, run_id: str, *, text_chars: int | None = None, origin: str | None = None) -> hpb.RunInfo | None:
        """One run. Text fields are cut to `text_chars` (default limits.RUNINFO_GET_TEXT_CHARS) so the reply
        always fits a message, however large a row an older host wrote. `origin`: only if that credential sent the
        message it answers (None: whoever did)."""
        chars = limits.RUNINFO_GET_TEXT_CHARS if text_chars is None else text_chars
        where, params = "run_id = ?", [run_id]
        if origin is not None:
            where += " AND origin = ?"
            params.append(origin)
        row = self.db.query_one(f"SELECT {_select(chars)}, {int(chars)} AS _chars FROM runs WHERE {where}", params)
        return self._info(row) if row else None

    def children(self, run_id: str) -> list[str]:
        """The ids of a run's child runs, oldest first."""
        rows = self.db.query(
            "SELECT run_id FROM runs WHERE parent_run_id = ? AND parent_run_id != '' ORDER BY created_at LIMIT ?",
            (run_id, limits.CHILD_RUNS_MAX_PER_RUN),
        )
        return [r["run_id"] for r in rows]

    def list(
        self,
        *,
        bot_id: str = "",
        conversation_id: str = "",
        status: str = "",
        limit: int = 50,
        text_chars: int | None = None,
        origin: str | None = None,
    ) -> list[hpb.RunInfo]:
        """Newest first; text fields cut to `text_chars` (default limits.RUNINFO_LIST_TEXT_CHARS) per run, so a
        page of 1000 runs fits one message whatever runners wrote. `origin`: only runs answering messages that
        credential sent (None: anyone's)."""
        chars = limits.RUNINFO_LIST_TEXT_CHARS if text_chars is None else text_chars
        where, params = [], []
        for column, value in (("bot_id", bot_id), ("conversation_id", conversation_id), ("status", status)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if origin is not None:
            where.append("origin = ?")
            params.append(origin)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self.db.query(
            f"SELECT {_select(chars)}, {int(chars)} AS _chars FROM runs {clause} ORDER BY created_at DESC LIMIT ?",
            (*params, limit),
        )
        return [self._info(r) for r in rows]

    def events(self, run_id: str, after_seq: int, limit: int) -> tuple[list[pb.RunEvent], bool]:
        """A page of a run's events, at most `limit` and limits.RUN_EVENTS_PAGE_BYTES (at least one event).
        Seq-exact whatever the rows: a delta-run row is keyed by its last seq, so `seq > after_seq` finds the row
        `after_seq` falls inside, and its events up to `after_seq` are skipped."""
        # Stepped row by row, not fetched whole: 5000 rows of up to 8 MiB each must never be loaded at once. Every
        # row holds at least one event, so limit + 1 rows are enough to tell whether there is more.
        cursor = self.db.reader.execute(
            "SELECT kind, payload FROM run_events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (run_id, after_seq, limit + 1),
        )
        events: list[pb.RunEvent] = []
        size = 0
        try:
            for kind, payload in cursor:
                if kind != DELTA_RUN:
                    size += len(payload) + 8
                    if len(events) == limit or (events and size > limits.RUN_EVENTS_PAGE_BYTES):
                        return events, True
                    events.append(pb.RunEvent.FromString(payload))
                    continue
                for event in pb.RunEventBatch.FromString(payload).events:
                    if event.seq <= after_seq:
                        continue
                    size += event.ByteSize() + 8
                    if len(events) == limit or (events and size > limits.RUN_EVENTS_PAGE_BYTES):
                        return events, True
                    events.append(event)
        finally:
            cursor.close()
        return events, False

    async def interrupt_unfinished(self) -> int:
        """At host start: runs a previous host left running can never finish; say so. Runs it accepted and left
        queued are not lost: they start on this host (queued_runs), except a subagent's, whose parent ended."""
        return await self.db.write(
            lambda conn: (
                conn.execute(
                    "UPDATE runs SET status = 'interrupted', error_code = 'host_restarted',"
                    " error_message = 'the host stopped while this run was in progress', finished_at = ?"
                    " WHERE status = 'running' OR (status = 'queued' AND parent_run_id <> '')",
                    (time.time(),),
                ).rowcount
            )
        )

    def queued_runs(self) -> list[hpb.RunInfo]:
        """Every run a previous host accepted and left `queued`, in the order their messages arrived (an event's
        seq is its arrival number, host-wide)."""
        rows = self.db.query(
            "SELECT r.run_id, r.bot_id, r.conversation_id, r.binding_id, r.runner_id, r.event_id, r.created_at,"
            " r.deadline_at, r.origin FROM runs r JOIN events e ON e.event_id = r.event_id"
            " WHERE r.status = 'queued' AND r.parent_run_id = '' ORDER BY e.seq",
        )
        keys = ("run_id", "bot_id", "conversation_id", "binding_id", "runner_id", "event_id", "created_at")
        return [
            hpb.RunInfo(**{k: r[k] for k in keys}, deadline_at=r["deadline_at"], origin=r["origin"], status="queued")
            for r in rows
        ]

    @staticmethod
    def set_token(conn: sqlite3.Connection, run_id: str, token_hash: str) -> None:
        """A queued run taken over by a new host gets a fresh run token (the old one died with its host)."""
        conn.execute("UPDATE runs SET token_hash = ? WHERE run_id = ? AND status = 'queued'", (token_hash, run_id))


class AuditLog:
    """Every AgentRunAPIProxy call, allowed or refused.

    Rows are buffered and written as one queued job per FLUSH_SECONDS, never awaited on the hot path: a commit
    per call would cost more than the call. The loss window on a host crash is that interval's rows. The newest
    limits.AUDIT_MAX_ROWS rows are kept."""

    FLUSH_SECONDS = 0.05

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: list[tuple[float, str, str, str, str, str]] = []
        self._scheduled = False

    def record(self, run_id: str, plugin_id: str, method: str, outcome: str, detail: str = "") -> None:
        self._pending.append((time.time(), run_id[:128], plugin_id, method, outcome, detail[:500]))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self.FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        rows, self._pending, self._scheduled = self._pending, [], False
        if rows:
            keep = limits.AUDIT_MAX_ROWS

            def write(conn: sqlite3.Connection) -> None:
                conn.executemany(
                    "INSERT INTO audit(at, run_id, plugin_id, method, outcome, detail) VALUES (?,?,?,?,?,?)", rows
                )
                # The oldest rows past AUDIT_MAX_ROWS go in the same job: what a batch added, no more (the ids
                # are the primary key, so this is a range delete at the table's start).
                conn.execute("DELETE FROM audit WHERE id <= (SELECT MAX(id) FROM audit) - ?", (keep,))

            self.db.enqueue(write)

    def rows(self, run_id: str | None = None) -> list[sqlite3.Row]:
        """For tests and inspection; call after `flush()` and `Database.flush()` to see the latest rows."""
        if run_id is None:
            return self.db.query("SELECT * FROM audit ORDER BY id")
        return self.db.query("SELECT * FROM audit WHERE run_id = ? ORDER BY id", (run_id,))
