"""The EventLog (append-only inbound events) and the Transcript (projected turns, FTS5-searchable).

Both are keyed by (bot_id, conversation_id); every query names both, so one bot never sees another's rows.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database
from agenthost.protos import common_pb2 as pb

R = TypeVar("R", sqlite3.Row, tuple)
MAX_PAGE = 100
MAX_TOP_K = 50
# Pages are capped in bytes as well as items: 50 long assistant messages would not fit one gRPC message (8 MiB),
# and a page the host cannot send is a page the runner can never get past. At least one row is always returned.
MAX_PAGE_BYTES = 4 * 1024 * 1024


# Transcript reads select these columns in this order and build items by position (the page hot path).
_ITEM_COLUMNS = (
    "seq, item_id, conversation_id, run_id, event_id, role, item_type, text, data_json, tool_call_id, tool_name,"
    " is_error, created_at, attachments_json"
)
_ITEM_COLUMNS_OF_T = ", ".join(f"t.{c.strip()}" for c in _ITEM_COLUMNS.split(","))
# Where text and data_json sit, in _ITEM_COLUMNS and in `SELECT * FROM events` alike.
_TEXT, _DATA = 7, 8


def _within_budget(rows: list[R], limit: int) -> tuple[list[R], bool]:
    """The first rows (at most `limit`) whose text and data fit MAX_PAGE_BYTES; True if any were cut for size."""
    size = 0
    for i, row in enumerate(rows[:limit]):
        size += len(row[_TEXT]) + len(row[_DATA]) + 512
        if size > MAX_PAGE_BYTES and i > 0:
            return rows[:i], True
    return rows[:limit], False


# The ArtifactRef fields an attachment list keeps in attachments_json (events and transcript alike).
_REF_FIELDS = ("artifact_id", "name", "mime_type", "size_bytes", "sha256", "conversation_id", "run_id", "created_at")


def refs_to_json(refs: Sequence[pb.ArtifactRef]) -> str:
    return json.dumps([{f: getattr(r, f) for f in _REF_FIELDS} for r in refs]) if refs else "[]"


def refs_from_json(text: str) -> list[pb.ArtifactRef]:
    if not text or text == "[]":
        return []
    return [pb.ArtifactRef(**{f: v for f, v in raw.items() if f in _REF_FIELDS}) for raw in json.loads(text)]


def conversation_scope(bot_id: str, conversation_id: str) -> str:
    return f"{bot_id}\x1f{conversation_id}"


@dataclass(frozen=True)
class Page:
    items: list
    next_cursor: str
    has_more: bool


@dataclass
class NewItem:
    """A transcript item to append; built by the run orchestrator from run events."""

    role: str
    item_type: str
    text: str = ""
    data_json: str = "{}"
    tool_call_id: str = ""
    tool_name: str = ""
    is_error: bool = False
    attachments: Sequence[pb.ArtifactRef] = ()


class Conversations:
    def __init__(self, db: Database, cursors: CursorCodec) -> None:
        self.db = db
        self.cursors = cursors

    # ---- events ----

    @staticmethod
    def insert_event(
        conn: sqlite3.Connection,
        *,
        bot_id: str,
        conversation_id: str,
        event_type: str,
        source: str,
        actor: pb.Actor,
        text: str,
        data_json: str,
        attachments: Sequence[pb.ArtifactRef] = (),
        origin: str = "",
    ) -> pb.EventRecord:
        """Writer-thread half of an append; called inside a Database.write job. `attachments`: refs of artifacts
        recorded in the same transaction. `origin`: the credential that sent it (migration _V9)."""
        event_id = f"ev_{uuid.uuid4().hex}"
        now = time.time()
        actor_json = json.dumps(
            {"actor_type": actor.actor_type, "actor_id": actor.actor_id, "display_name": actor.display_name}
        )
        cur = conn.execute(
            "INSERT INTO events(event_id, bot_id, conversation_id, event_type, source, actor_json, text, data_json,"
            " created_at, attachments_json, origin) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                event_id,
                bot_id,
                conversation_id,
                event_type,
                source,
                actor_json,
                text,
                data_json,
                now,
                refs_to_json(attachments),
                origin,
            ),
        )
        return pb.EventRecord(
            event_id=event_id,
            event_type=event_type,
            bot_id=bot_id,
            conversation_id=conversation_id,
            actor=actor,
            text=text,
            data_json=data_json,
            attachments=attachments,
            seq=cur.lastrowid or 0,
            created_at=now,
            source=source,
        )

    @staticmethod
    def starter(conn: sqlite3.Connection, bot_id: str, conversation_id: str) -> str | None:
        """Who sent the conversation's first event ('' for events of hosts before migration _V9); None: it has
        none yet. One step down events_conversation."""
        row = conn.execute(
            "SELECT origin FROM events WHERE bot_id = ? AND conversation_id = ? ORDER BY seq LIMIT 1",
            (bot_id, conversation_id),
        ).fetchone()
        return None if row is None else row[0]

    def _cursor_encoder(self, kind: str, bot_id: str, conversation_id: str) -> Callable[[int], str]:
        return self.cursors.encoder(kind, conversation_scope(bot_id, conversation_id))

    def _event(self, row: sqlite3.Row, cursor_of: Callable[[int], str] | None = None) -> pb.EventRecord:
        cursor_of = cursor_of or self._cursor_encoder("events", row["bot_id"], row["conversation_id"])
        actor = json.loads(row["actor_json"])
        return pb.EventRecord(
            event_id=row["event_id"],
            event_type=row["event_type"],
            bot_id=row["bot_id"],
            conversation_id=row["conversation_id"],
            actor=pb.Actor(**actor),
            text=row["text"],
            data_json=row["data_json"],
            attachments=refs_from_json(row["attachments_json"]),
            seq=row["seq"],
            cursor=cursor_of(row["seq"]),
            created_at=row["created_at"],
            source=row["source"],
        )

    def get_event(self, event_id: str) -> pb.EventRecord | None:
        row = self.db.query_one("SELECT * FROM events WHERE event_id = ?", (event_id,))
        return self._event(row) if row else None

    def page_events(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        cursor: str,
        forward: bool,
        limit: int,
        event_types: Sequence[str] = (),
        through_event: int | None = None,
    ) -> Page:
        """`through_event`: only events up to that seq (a run's view of its own conversation; see ActiveRun)."""
        scope = conversation_scope(bot_id, conversation_id)
        where = ["bot_id = ?", "conversation_id = ?"]
        params: list[object] = [bot_id, conversation_id]
        after = before = None  # bounds on seq, exclusive
        if cursor:
            position = self.cursors.decode("events", scope, cursor)
            after, before = (position, None) if forward else (None, position)
        if through_event is not None:
            # One upper bound, not two: given `seq <= a AND seq < b` SQLite ranges the index on the first and
            # filters the second, walking every event between them.
            before = through_event + 1 if before is None else min(before, through_event + 1)
        if after is not None:
            where.append("seq > ?")
            params.append(after)
        if before is not None:
            where.append("seq < ?")
            params.append(before)
        if event_types:
            where.append(f"event_type IN ({','.join('?' * len(event_types))})")
            params.extend(event_types)
        order = "ASC" if forward else "DESC"
        rows = self.db.query(
            f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY seq {order} LIMIT ?", (*params, limit + 1)
        )
        kept, cut = _within_budget(rows, limit)
        has_more = cut or len(rows) > limit
        cursor_of = self._cursor_encoder("events", bot_id, conversation_id)
        items = [self._event(r, cursor_of) for r in kept]
        return Page(items, items[-1].cursor if has_more else "", has_more)

    # ---- transcript ----

    @staticmethod
    def insert_items(
        conn: sqlite3.Connection,
        *,
        bot_id: str,
        conversation_id: str,
        run_id: str,
        event_id: str,
        items: Iterable[NewItem],
    ) -> None:
        now = time.time()
        # The turn the items belong to (see migration _V8): one lookup by the events' unique index per call.
        found = conn.execute("SELECT seq FROM events WHERE event_id = ?", (event_id,)).fetchone()
        event_seq = found[0] if found else 0
        conn.executemany(
            "INSERT INTO transcript(item_id, bot_id, conversation_id, run_id, event_id, role, item_type, text,"
            " data_json, tool_call_id, tool_name, is_error, attachments_json, created_at, event_seq)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    f"it_{uuid.uuid4().hex}",
                    bot_id,
                    conversation_id,
                    run_id,
                    event_id,
                    it.role,
                    it.item_type,
                    it.text,
                    it.data_json,
                    it.tool_call_id,
                    it.tool_name,
                    int(it.is_error),
                    refs_to_json(it.attachments),
                    now,
                    event_seq,
                )
                for it in items
            ],
        )

    @staticmethod
    def _item(row: tuple[Any, ...], cursor_of: Callable[[int], str]) -> pb.TranscriptItem:
        """Builds an item from a row of _ITEM_COLUMNS."""
        return pb.TranscriptItem(
            seq=row[0],
            item_id=row[1],
            conversation_id=row[2],
            run_id=row[3],
            event_id=row[4],
            role=row[5],
            item_type=row[6],
            text=row[7],
            data_json=row[8],
            tool_call_id=row[9],
            tool_name=row[10],
            is_error=bool(row[11]),
            created_at=row[12],
            attachments=refs_from_json(row[13]),
            cursor=cursor_of(row[0]),
        )

    def page_history(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        cursor: str,
        forward: bool,
        limit: int,
        through_event: int | None = None,
    ) -> Page:
        """A page in seq order. `through_event`: only items of turns up to that event seq (a run's view of its own
        conversation, without the messages queued behind it; see ActiveRun.horizon). Those are at most the
        conversation's queued messages, so the filter rejects few rows of the seq index it walks."""
        scope = conversation_scope(bot_id, conversation_id)
        params: list[object] = [bot_id, conversation_id]
        bound = ""
        if cursor:
            bound = " AND seq > ?" if forward else " AND seq < ?"
            params.append(self.cursors.decode("history", scope, cursor))
        if through_event is not None:
            bound += " AND event_seq <= ?"
            params.append(through_event)
        order = "ASC" if forward else "DESC"
        rows = self.db.query_tuples(
            f"SELECT {_ITEM_COLUMNS} FROM transcript INDEXED BY transcript_conversation"
            f" WHERE bot_id = ? AND conversation_id = ?{bound} ORDER BY seq {order} LIMIT ?",
            (*params, limit + 1),
        )
        kept, cut = _within_budget(rows, limit)
        has_more = cut or len(rows) > limit
        cursor_of = self._cursor_encoder("history", bot_id, conversation_id)
        items = [self._item(r, cursor_of) for r in kept]
        return Page(items, items[-1].cursor if has_more else "", has_more)

    def search(
        self,
        bot_id: str,
        conversation_id: str,
        query: str,
        *,
        roles: Sequence[str],
        item_types: Sequence[str],
        top_k: int,
        through_event: int | None = None,
    ) -> list[pb.TranscriptItem]:
        # Each whitespace-separated word becomes a quoted FTS5 phrase: user text is never parsed as FTS syntax.
        # NUL would end the FTS5 query string inside SQLite's C code (an "unterminated string" error), so it
        # separates words like whitespace.
        terms = " ".join('"' + w.replace('"', '""') + '"' for w in query.replace("\x00", " ").split())
        if not terms:
            return []
        where = ["transcript_fts MATCH ?", "t.bot_id = ?", "t.conversation_id = ?"]
        params: list[object] = [terms, bot_id, conversation_id]
        if roles:
            where.append(f"t.role IN ({','.join('?' * len(roles))})")
            params.extend(roles)
        if item_types:
            where.append(f"t.item_type IN ({','.join('?' * len(item_types))})")
            params.extend(item_types)
        if through_event is not None:
            where.append("t.event_seq <= ?")
            params.append(through_event)
        rows = self.db.query_tuples(
            # NOT INDEXED: rows are fetched by rowid for each match; with the event_seq bound SQLite would otherwise
            # walk transcript_turn over the whole conversation and probe the FTS index per row.
            f"SELECT {_ITEM_COLUMNS_OF_T} FROM transcript_fts JOIN transcript t NOT INDEXED"
            " ON t.seq = transcript_fts.rowid"
            f" WHERE {' AND '.join(where)} ORDER BY bm25(transcript_fts) LIMIT ?",
            (*params, top_k),
        )
        cursor_of = self._cursor_encoder("history", bot_id, conversation_id)
        return [self._item(r, cursor_of) for r in _within_budget(rows, top_k)[0]]

    def history_stats(self, bot_id: str, conversation_id: str, through_event: int | None = None) -> tuple[int, str]:
        """(item count, cursor of the newest item) — what ContextAccess tells a runner; with `through_event`, of
        the items up to that event (see page_history): the stats row less the few items of later turns."""
        row = self.db.query_one(
            "SELECT item_count, last_seq FROM conversation_stats WHERE bot_id = ? AND conversation_id = ?",
            (bot_id, conversation_id),
        )
        if row is None:
            return 0, ""
        count, last_seq = row[0], row[1]
        if through_event is not None:
            later = self.db.query_one(
                "SELECT COUNT(*) FROM transcript INDEXED BY transcript_turn"
                " WHERE bot_id = ? AND conversation_id = ? AND event_seq > ?",
                (bot_id, conversation_id, through_event),
            )[0]
            if later:
                count -= later
                newest = self.db.query_one(
                    "SELECT seq FROM transcript INDEXED BY transcript_conversation"
                    " WHERE bot_id = ? AND conversation_id = ? AND event_seq <= ? ORDER BY seq DESC LIMIT 1",
                    (bot_id, conversation_id, through_event),
                )
                if newest is None:
                    return 0, ""
                last_seq = newest[0]
        return count, self.cursors.encode("history", conversation_scope(bot_id, conversation_id), last_seq)

    def recent(
        self, bot_id: str, conversation_id: str, limit: int, through_event: int | None = None
    ) -> list[pb.TranscriptItem]:
        bound, params = ("", ()) if through_event is None else (" AND event_seq <= ?", (through_event,))
        rows = self.db.query_tuples(
            f"SELECT {_ITEM_COLUMNS} FROM transcript INDEXED BY transcript_conversation"
            f" WHERE bot_id = ? AND conversation_id = ?{bound} ORDER BY seq DESC LIMIT ?",
            (bot_id, conversation_id, *params, limit),
        )
        cursor_of = self._cursor_encoder("history", bot_id, conversation_id)
        return [self._item(r, cursor_of) for r in reversed(rows)]

    def list_conversations(self, bot_id: str) -> list[tuple[str, int, float]]:
        rows = self.db.query(
            "SELECT conversation_id, item_count, updated_at FROM conversation_stats WHERE bot_id = ?"
            " ORDER BY updated_at DESC LIMIT 1000",
            (bot_id,),
        )
        return [(r[0], r[1], r[2]) for r in rows]
