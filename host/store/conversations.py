"""The EventLog (append-only inbound events) and the Transcript (projected turns, FTS5-searchable).

Both are keyed by (bot_id, conversation_id); every query names both, so one bot never sees another's rows.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database
from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos.errors import InvalidArgument
from agenthost.protos.wire import batch_entry, page_message

T = TypeVar("T")
MAX_PAGE = 100
MAX_TOP_K = 50
# Pages are capped in bytes as well as items: 50 long assistant messages would not fit one gRPC message (8 MiB),
# and a page the host cannot send is a page the runner can never get past. At least one row is always returned.
MAX_PAGE_BYTES = 4 * 1024 * 1024


# Slots of the per-conversation write counts that version kept pages on PostgreSQL (page_history_message): a
# write into another conversation of the same slot only makes a kept page be read again.
_VERSION_SLOTS = 4096

# Serialized pages kept for the run API (Conversations.page_history_message): at most this many bytes in all, and
# no page larger than PAGE_CACHE_ENTRY_BYTES (a page of a few long messages is read again from the store).
PAGE_CACHE_BYTES = 8 * 1024 * 1024
PAGE_CACHE_ENTRY_BYTES = 256 * 1024


# An item's columns in this order build it by position: for rows stored without their encoding (before migration
# _V12, or written by hand), and for writing that encoding.
_ITEM_COLUMNS = (
    "seq, item_id, conversation_id, run_id, event_id, role, item_type, text, data_json, tool_call_id, tool_name,"
    " is_error, created_at, attachments_json, event_seq"
)
# Where text and data_json sit, in _ITEM_COLUMNS and in `SELECT * FROM events` alike.
_TEXT, _DATA = 7, 8
_SEQ, _EVENT_SEQ = 0, 14
# What transcript reads select (the page hot path): the item's place in turn order and its stored encoding: the
# serialized TranscriptItem, cursor included, framed as an entry of a repeated field 1, which is where every list of
# items sits (HistoryPageResponse, HistorySearchResponse, GetHistoryResponse); NULL for older rows.
_PAGE_COLUMNS = "event_seq, seq, item_pb"
_PAGE_COLUMNS_OF_T = "t.event_seq, t.seq, t.item_pb"
_P_TURN, _P_SEQ, _P_ENCODED = 0, 1, 2
# The transcript's one order (turn order): by the event each item belongs to, then by seq. See page_history.
_TURN_ORDER = {True: "ORDER BY event_seq, seq", False: "ORDER BY event_seq DESC, seq DESC"}
# Just past the first turn of a conversation (parameters: bot_id, conversation_id) whose run has not ended, or past
# every event when none is open. An uncorrelated scalar subquery: SQLite evaluates it once, through the partial
# index runs_open (migration _V11), and ranges transcript_turn with it.
_PAST_SETTLED = (
    "COALESCE((SELECT MIN(e.seq) FROM runs r JOIN events e ON e.event_id = r.event_id"
    " WHERE r.bot_id = ? AND r.conversation_id = ? AND r.status IN ('queued', 'running')) + 1, 9223372036854775807)"
)


def _event_size(row: sqlite3.Row) -> int:
    return len(row[_TEXT]) + len(row[_DATA]) + 512


def _within_budget(rows: list[T], limit: int, size_of: Callable[[T], int]) -> tuple[list[T], bool]:
    """The first rows (at most `limit`) whose sizes fit MAX_PAGE_BYTES; True if any were cut for size."""
    if sum(map(size_of, rows[:limit])) <= MAX_PAGE_BYTES:  # nearly every page
        return rows[:limit], False
    size = 0
    for i, row in enumerate(rows[:limit]):
        size += size_of(row)
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


def _parsed(encoded: list[bytes]) -> list[pb.TranscriptItem]:
    """Encoded items (see _PAGE_COLUMNS) as messages, parsed in one call as the list they make."""
    return list(api.HistorySearchResponse.FromString(b"".join(encoded)).items)


@dataclass(frozen=True)
class Page:
    items: list
    next_cursor: str
    has_more: bool


@dataclass(frozen=True)
class EncodedPage:
    """A transcript page as its items' serialized TranscriptItems (wire.page_message makes the response of it)."""

    items: list[bytes]  # each framed as an entry of a repeated field 1 (see _PAGE_COLUMNS)
    next_cursor: str
    has_more: bool


class PageCache:
    """Serialized transcript pages by request, least recently used dropped first, each kept with the version of
    its conversation it was read at (see Conversations.page_history_message); an entry of another version is
    dropped, never served."""

    def __init__(self, budget: int = PAGE_CACHE_BYTES, entry_max: int = PAGE_CACHE_ENTRY_BYTES) -> None:
        self._budget = budget
        self._entry_max = entry_max
        self._entries: OrderedDict[Hashable, tuple[Hashable, bytes]] = OrderedDict()
        self._bytes = 0

    def get(self, key: Hashable, version: Hashable) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] != version:
            self._bytes -= len(self._entries.pop(key)[1])
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: Hashable, version: Hashable, page: bytes) -> None:
        if len(page) > self._entry_max:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[1])
        self._entries[key] = (version, page)
        self._bytes += len(page)
        while self._bytes > self._budget:
            self._bytes -= len(self._entries.popitem(last=False)[1][1])


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
        self.pages = PageCache()
        # PostgreSQL: items committed into the conversations hashed to each slot (bumped on the writer thread after
        # COMMIT): with the writer's generation, a page's version without a round trip (page_history_message).
        self._written = [0] * _VERSION_SLOTS

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
        values = (
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
        )
        columns = "event_id, bot_id, conversation_id, event_type, source, actor_json, text, data_json, created_at,"
        seq = conn.dialect.event_seq(conn)
        if seq is None:
            seq = conn.execute(
                f"INSERT INTO events({columns} attachments_json, origin) VALUES (?,?,?,?,?,?,?,?,?,?,?) RETURNING seq",
                values,
            ).fetchone()[0]
        else:
            conn.execute(
                f"INSERT INTO events({columns} attachments_json, origin, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (*values, seq),
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
            seq=seq,
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

    def _cursor_encoder(self, kind: str, bot_id: str, conversation_id: str) -> Callable[..., str]:
        return self.cursors.encoder(kind, conversation_scope(bot_id, conversation_id))

    def _event(self, row: sqlite3.Row, cursor_of: Callable[..., str] | None = None) -> pb.EventRecord:
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
        kept, cut = _within_budget(rows, limit, _event_size)
        has_more = cut or len(rows) > limit
        cursor_of = self._cursor_encoder("events", bot_id, conversation_id)
        items = [self._event(r, cursor_of) for r in kept]
        return Page(items, items[-1].cursor if has_more else "", has_more)

    # ---- transcript ----

    def insert_items(
        self,
        conn: sqlite3.Connection,
        *,
        bot_id: str,
        conversation_id: str,
        run_id: str,
        event_id: str,
        items: Iterable[NewItem],
        event_seq: int | None = None,
    ) -> None:
        """Writer-thread half of an append. Each row also stores its item serialized, seq and cursor included
        (item_pb, migration _V12): every field is known here and never changes (the transcript is append-only), so a
        page is read as bytes instead of being built and MAC-ed item by item on every read. `event_seq`: the seq of
        `event_id`, when the caller knows it (a read less, a round trip on PostgreSQL)."""
        now = time.time()
        if event_seq is None:
            # The turn the items belong to (see migration _V8): one lookup by the events' unique index.
            found = conn.execute("SELECT seq FROM events WHERE event_id = ?", (event_id,)).fetchone()
            event_seq = found[0] if found else 0
        # The seqs are given here because the encoding holds them (see dialect.transcript_seq_base).
        items = list(items)
        seq = conn.dialect.transcript_seq_base(conn, len(items))
        cursor_of = self._cursor_encoder("history", bot_id, conversation_id)
        rows = []
        for it in items:
            seq += 1
            row = (
                seq,
                f"it_{uuid.uuid4().hex}",
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
                now,
                refs_to_json(it.attachments),
                event_seq,
            )
            rows.append((*row, bot_id, batch_entry(self._item(row, cursor_of).SerializeToString())))
        conn.executemany(
            f"INSERT INTO transcript({_ITEM_COLUMNS}, bot_id, item_pb) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        if self.db.dsn:
            self.db.on_commit(functools.partial(self._wrote, hash((bot_id, conversation_id)) % _VERSION_SLOTS))

    def _wrote(self, slot: int) -> None:
        self._written[slot] += 1

    @staticmethod
    def _item(row: tuple[Any, ...], cursor_of: Callable[..., str]) -> pb.TranscriptItem:
        """Builds an item from a row of _ITEM_COLUMNS; its cursor names its place in turn order. (Attachments go
        through their JSON, so an item built at insert and one built from its row are the same.)"""
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
            cursor=cursor_of(row[_EVENT_SEQ], row[_SEQ]),
        )

    def _position(self, bot_id: str, conversation_id: str, cursor: str) -> tuple[int, int]:
        """The (event_seq, seq) a history cursor names. A cursor minted before turn order named a seq alone; its
        MAC still proves it was issued for this conversation, and the item it names still exists (the transcript
        is append-only), so it is read as that item's place in turn order."""
        position = self.cursors.decode_parts("history", conversation_scope(bot_id, conversation_id), cursor)
        if len(position) == 2:
            return position[0], position[1]
        row = self.db.query_one(
            "SELECT event_seq FROM transcript WHERE seq = ? AND bot_id = ? AND conversation_id = ?",
            (position[0], bot_id, conversation_id),
        )
        if row is None:
            raise InvalidArgument("cursor names no item of this conversation; page again from the newest item")
        return row[0], position[0]

    def _turn_rows(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        position: tuple[int, int] | None,
        forward: bool,
        limit: int,
        through_event: int | None,
        settled: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Up to `limit` rows of _PAGE_COLUMNS past `position` in turn order, each read off transcript_turn: that
        index is on (bot_id, conversation_id, event_seq) and, like every SQLite index of a rowid table, ends in the
        rowid (seq), so it holds the rows in exactly this order. A row-value bound `(event_seq, seq) > (?, ?)` would
        seek on event_seq alone and walk the cursor's whole turn, so the rest of the cursor's turn and the turns
        past it are two seeks, merged."""
        base = (
            f"SELECT {_PAGE_COLUMNS} FROM transcript INDEXED BY transcript_turn"
            " WHERE bot_id = ? AND conversation_id = ?"
        )
        key = (bot_id, conversation_id)
        # One upper bound on event_seq, not two: SQLite ranges the index on one and would filter the other.
        upper = None if through_event is None else through_event + 1  # exclusive
        parts: list[tuple[str, tuple[object, ...]]] = []
        # `settled`: the bound is the first open turn's event, read in the same statement (so from the same
        # snapshot) as the rows.
        open_bound, open_params = (f" AND event_seq < {_PAST_SETTLED}", key) if settled else ("", ())
        if position is not None:
            turn, seq = position
            if upper is None or turn < upper:
                order = "ASC" if forward else "DESC"
                parts.append(
                    (
                        f"{base} AND event_seq = ? AND seq {'>' if forward else '<'} ?{open_bound}"
                        f" ORDER BY seq {order} LIMIT ?",
                        (*key, turn, seq, *open_params, limit),
                    )
                )
            if forward:
                bounds, params = " AND event_seq > ?", [turn]
                if upper is not None:
                    bounds += " AND event_seq < ?"
                    params.append(upper)
            else:
                bounds, params = " AND event_seq < ?", [turn if upper is None else min(turn, upper)]
        else:
            bounds, params = ("", []) if upper is None else (" AND event_seq < ?", [upper])
        if settled and upper is None:
            bounds += open_bound
            params.extend(open_params)
        parts.append((f"{base}{bounds} {_TURN_ORDER[forward]} LIMIT ?", (*key, *params, limit)))
        if len(parts) == 1:
            return self.db.query_tuples(*parts[0])
        # One statement, so both halves read the same snapshot of the transcript.
        (first, first_params), (rest, rest_params) = parts
        return self.db.query_tuples(
            f"SELECT * FROM (SELECT * FROM ({first}) AS a UNION ALL SELECT * FROM ({rest}) AS b) AS u"
            f" {_TURN_ORDER[forward]} LIMIT ?",
            (*first_params, *rest_params, limit),
        )

    def _encoded(self, bot_id: str, conversation_id: str, rows: Sequence[tuple[Any, ...]]) -> list[bytes]:
        """The encoded items of rows of _PAGE_COLUMNS: as stored, or built from the columns of a row stored without
        its encoding."""
        encoded = [r[_P_ENCODED] for r in rows]
        older = [r[_P_SEQ] for r in rows if r[_P_ENCODED] is None]
        if older:
            cursor_of = self._cursor_encoder("history", bot_id, conversation_id)
            built = {
                row[_SEQ]: batch_entry(self._item(row, cursor_of).SerializeToString())
                for row in self.db.query_tuples(
                    # NOT INDEXED: by seq, the rowid. With an index usable for bot and conversation, SQLite
                    # walked the whole conversation's entries in it to find the 50 (12 ms at 50k items).
                    f"SELECT {_ITEM_COLUMNS} FROM transcript NOT INDEXED WHERE bot_id = ? AND conversation_id = ?"
                    f" AND seq IN ({','.join('?' * len(older))})",
                    (bot_id, conversation_id, *older),
                )
            }
            encoded = [built[r[_P_SEQ]] if e is None else e for r, e in zip(rows, encoded, strict=True)]
        return encoded

    def page_history(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        cursor: str,
        forward: bool,
        limit: int,
        through_event: int | None = None,
        settled: bool = False,
    ) -> Page:
        """page_history_encoded, its items parsed."""
        page = self.page_history_encoded(
            bot_id,
            conversation_id,
            cursor=cursor,
            forward=forward,
            limit=limit,
            through_event=through_event,
            settled=settled,
        )
        return Page(_parsed(page.items), page.next_cursor, page.has_more)

    def page_history_encoded(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        cursor: str,
        forward: bool,
        limit: int,
        through_event: int | None = None,
        settled: bool = False,
    ) -> EncodedPage:
        """A page in turn order: by the event each item belongs to (a user message's own event; a run's output,
        its run's event), then by seq. Seq is recording order, and a message is recorded when it arrives: in a
        burst m1 m2 A1 A2. Turn order reads m1 A1 m2 A2, the conversation as it went, for every reader (runs,
        GetHistory, `agenthost history`). `through_event`: only items of turns up to that event seq (a run's view of its
        own conversation, without the messages queued behind it; see ActiveRun.horizon), so the run's own
        message and output come last. Items of no known event (event_seq 0) come first.

        `settled` (people's forward reads): the page ends before the first turn after one whose run is still queued
        or running. That turn's output is placed before messages that arrived after its own, so a reader tailing
        forward who had been shown those messages would never be shown the output; held back, they follow it once
        the turn ends, and a forward reader sees every item exactly once, in turn order."""
        position = self._position(bot_id, conversation_id, cursor) if cursor else None
        return self._page(bot_id, conversation_id, position, forward, limit, through_event, settled)

    def _page(
        self,
        bot_id: str,
        conversation_id: str,
        position: tuple[int, int] | None,
        forward: bool,
        limit: int,
        through_event: int | None,
        settled: bool = False,
    ) -> EncodedPage:
        rows = self._turn_rows(
            bot_id,
            conversation_id,
            position=position,
            forward=forward,
            limit=limit + 1,
            through_event=through_event,
            settled=settled,
        )
        # Each item counts against MAX_PAGE_BYTES with its encoding's size.
        kept, cut = _within_budget(self._encoded(bot_id, conversation_id, rows), limit, len)
        has_more = cut or len(rows) > limit
        next_cursor = ""
        if has_more:
            last = rows[len(kept) - 1]
            next_cursor = self.cursors.encode(
                "history", conversation_scope(bot_id, conversation_id), last[_P_TURN], last[_P_SEQ]
            )
        return EncodedPage(kept, next_cursor, has_more)

    def page_history_message(
        self,
        bot_id: str,
        conversation_id: str,
        *,
        cursor: str,
        forward: bool,
        limit: int,
        through_event: int | None = None,
    ) -> bytes:
        """page_history_encoded as the serialized HistoryPageResponse (wire.page_message), for the run API.

        A run reads the same page again and again (every step of an agent loop); the page changes only when an item
        is added to its conversation. The transcript is append-only, and every insert raises the conversation's
        item_count in conversation_stats in its own transaction (a trigger on both backends), so that count is the
        conversation's version: a page is served from `self.pages` while the count read before it is the count read
        now, and read from the store otherwise. The count is read before the rows, so a page can only be newer than
        the version it is kept with (then it is read again at once), never older. The cursor is checked on every call.

        On PostgreSQL the version is counted here instead (a read there is a round trip): the host holding the lease
        is the only writer, and its writer counts the items it committed per conversation (`_wrote`, after COMMIT),
        with its generation (moved by any batch that did not commit). Kept pages answer only while the lease is
        proven (Database.proven); otherwise the page is read from the database and kept for nobody."""
        position = self._position(bot_id, conversation_id, cursor) if cursor else None
        version: object
        if self.db.dsn:
            version = (self.db.generation, self._written[hash((bot_id, conversation_id)) % _VERSION_SLOTS])
            proven = self.db.proven
        else:
            row = self.db.query_one(
                "SELECT item_count FROM conversation_stats WHERE bot_id = ? AND conversation_id = ?",
                (bot_id, conversation_id),
            )
            version, proven = (0 if row is None else row[0]), True
        key = (bot_id, conversation_id, position, forward, limit, through_event)
        message = self.pages.get(key, version) if proven else None
        if message is None:
            page = self._page(bot_id, conversation_id, position, forward, limit, through_event)
            message = page_message(page.items, page.next_cursor, page.has_more)
            if proven:
                self.pages.put(key, version, message)
        return message

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
        # Each whitespace-separated word must occur, as a phrase of its tokens; user text is never parsed as query
        # syntax (dialect.history_search). NUL would end the FTS5 query string inside SQLite's C code (an
        # "unterminated string" error), and PostgreSQL refuses it in text, so it separates words like whitespace.
        words = query.replace("\x00", " ").split()
        if not words:
            return []
        source, order, params = self.db.dialect.history_search(words)
        where = ["t.bot_id = ?", "t.conversation_id = ?"]
        params += [bot_id, conversation_id]
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
            f"SELECT {_PAGE_COLUMNS_OF_T} FROM {source} AND {' AND '.join(where)} ORDER BY {order} LIMIT ?",
            (*params, top_k),
        )
        return _parsed(_within_budget(self._encoded(bot_id, conversation_id, rows), top_k, len)[0])

    def history_stats(self, bot_id: str, conversation_id: str, through_event: int | None = None) -> tuple[int, str]:
        """(item count, cursor of the newest item in turn order) — what ContextAccess tells a runner; with
        `through_event`, of the items up to that event (see page_history): the stats row less the few items of
        later turns."""
        row = self.db.query_one(
            "SELECT item_count FROM conversation_stats WHERE bot_id = ? AND conversation_id = ?",
            (bot_id, conversation_id),
        )
        if row is None:
            return 0, ""
        count = row[0]
        if through_event is not None:
            count -= self.db.query_one(
                "SELECT COUNT(*) FROM transcript INDEXED BY transcript_turn"
                " WHERE bot_id = ? AND conversation_id = ? AND event_seq > ?",
                (bot_id, conversation_id, through_event),
            )[0]
        bound, params = ("", ()) if through_event is None else (" AND event_seq <= ?", (through_event,))
        newest = self.db.query_one(
            "SELECT event_seq, seq FROM transcript INDEXED BY transcript_turn"
            f" WHERE bot_id = ? AND conversation_id = ?{bound} {_TURN_ORDER[False]} LIMIT 1",
            (bot_id, conversation_id, *params),
        )
        if newest is None or count <= 0:
            return 0, ""
        return count, self.cursors.encode("history", conversation_scope(bot_id, conversation_id), *newest)

    def recent(
        self, bot_id: str, conversation_id: str, limit: int, through_event: int | None = None
    ) -> list[pb.TranscriptItem]:
        """The newest `limit` items in turn order, oldest first."""
        rows = self._turn_rows(
            bot_id, conversation_id, position=None, forward=False, limit=limit, through_event=through_event
        )
        return _parsed(self._encoded(bot_id, conversation_id, rows[::-1]))

    def list_conversations(self, bot_id: str) -> list[tuple[str, int, float]]:
        rows = self.db.query(
            "SELECT conversation_id, item_count, updated_at FROM conversation_stats WHERE bot_id = ?"
            " ORDER BY updated_at DESC LIMIT 1000",
            (bot_id,),
        )
        return [(r[0], r[1], r[2]) for r in rows]
