"""The statements that cannot be written once for both backends, in one place: each store asks its connection's
`dialect` (SQLite's or PostgreSQL's) for them. Everything else is written once (see host/store/postgres.py).

Full-text search keeps one contract on both: the same words match (each word of a history query must occur, as a
phrase of its tokens; a knowledge-base query matches any of its words, stemmed), best match first by each engine's
relevance with its length normalisation (FTS5's bm25; PostgreSQL's ts_rank with normalisation 1, rank divided by
1 + log of the document's length), ties in recording order. Scores themselves differ, so the order of two hits of
near-equal relevance may differ between backends.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

_ROWS_PER_INSERT = 256  # a power of two; 769 bound parameters, well under SQLite's limit (32766 since 3.32, 999 before)


@functools.cache
def _insert_events_sql(rows: int) -> str:
    """`rows` rows in one statement, the run id bound once (?1). Cached per row count: sqlite3's statement cache
    then keeps the prepared statement too."""
    values = ",".join(f"(?1,?{2 + 3 * i},?{3 + 3 * i},?{4 + 3 * i})" for i in range(rows))
    return f"INSERT INTO run_events(run_id, seq, kind, payload) VALUES {values}"


_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


class SqliteDialect:
    name = "sqlite"
    # sqlite3 runs one statement per execute (and a statement costs a function call, not a round trip).
    chains_statements = False

    @staticmethod
    def transcript_seq_base(conn: Any, count: int) -> int:
        """The seq just before the `count` transcript seqs to give now (the writer's alone, inside its
        transaction): past every seq ever given (sqlite_sequence; never one of a deleted row) and every row."""
        return int(
            conn.execute(
                "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'transcript'), 0),"
                " COALESCE((SELECT MAX(seq) FROM transcript), 0))"
            ).fetchone()[0]
        )

    @staticmethod
    def event_seq(conn: Any) -> int | None:
        """The seq of the event to insert now; None: the insert takes the next one itself (RETURNING)."""
        return None

    @staticmethod
    def insert_run_events(conn: Any, run_id: str, rows: Sequence[tuple[int, str, bytes]]) -> None:
        """Multi-row INSERTs: per row, executemany's step-and-reset costs about as much as SQLite's own insert.
        Chunks of 256, 128, ..., 1 rows, so at most nine distinct statements share the statement cache."""
        start, left = 0, len(rows)
        while left:
            count = _ROWS_PER_INSERT
            while count > left:
                count //= 2
            params: list[object] = [run_id]
            for row in rows[start : start + count]:
                params += row
            conn.execute(_insert_events_sql(count), params)
            start += count
            left -= count

    @staticmethod
    def history_search(words: Sequence[str]) -> tuple[str, str, list[object]]:
        """(FROM clause, ORDER BY expression, their parameters) of a transcript search for rows matching every
        word; the FROM clause names the transcript `t`."""
        # Each word a quoted FTS5 phrase: user text is never parsed as FTS syntax.
        terms = " ".join('"' + w.replace('"', '""') + '"' for w in words)
        return (
            # NOT INDEXED: rows are fetched by rowid for each match; with the event_seq bound SQLite would otherwise
            # walk transcript_turn over the whole conversation and probe the FTS index per row.
            "transcript_fts JOIN transcript t NOT INDEXED ON t.seq = transcript_fts.rowid WHERE transcript_fts MATCH ?",
            "bm25(transcript_fts)",
            [terms],
        )

    @staticmethod
    def kb_keyword(match: str) -> tuple[str, list[object]]:
        """(statement, parameters before bot_id and limit) finding a bot's chunks matching an FTS5 query of
        quoted words OR-ed (knowledge.fts_match), best first."""
        return (
            "SELECT c.chunk_id FROM kb_fts JOIN kb_chunks c ON c.chunk_id = kb_fts.rowid"
            " WHERE kb_fts MATCH ? AND c.bot_id = ? ORDER BY bm25(kb_fts), c.chunk_id LIMIT ?",
            [match],
        )


class PostgresDialect:
    name = "postgresql"
    # Statements without parameters, separated by `;`, go in one round trip (the simple query protocol): the writer
    # sends a job's RELEASE with the next job's SAVEPOINT, and the last one's with the COMMIT.
    chains_statements = True

    @staticmethod
    def transcript_seq_base(conn: Any, count: int) -> int:
        """`count` numbers of transcript_seq, counted by the writer (PgConnection.numbered): no round trip."""
        return int(conn.numbered("transcript", "transcript_seq", count))

    @staticmethod
    def event_seq(conn: Any) -> int | None:
        """The event's seq counted by the writer (PgConnection.numbered), so its insert reads nothing back."""
        return int(conn.numbered("events", "events_seq_seq", 1)) + 1

    @staticmethod
    def insert_run_events(conn: Any, run_id: str, rows: Sequence[tuple[int, str, bytes]]) -> None:
        """All rows in one statement, whatever their number: three arrays unnested."""
        if not rows:
            return
        seqs, kinds, payloads = zip(*rows, strict=True)
        conn.execute(
            "INSERT INTO run_events(run_id, seq, kind, payload)"
            " SELECT ?, r.s, r.k, r.p FROM unnest(?::bigint[], ?::text[], ?::bytea[]) AS r(s, k, p)",
            (run_id, list(seqs), list(kinds), list(payloads)),
        )

    @staticmethod
    def history_search(words: Sequence[str]) -> tuple[str, str, list[object]]:
        query = " && ".join(["phraseto_tsquery('simple', ?)"] * len(words))
        return (
            f"transcript t, (SELECT {query}) AS q(q) WHERE t.text_tsv @@ q.q",
            "ts_rank(t.text_tsv, q.q, 1) DESC, t.seq",
            list(words),
        )

    @staticmethod
    def kb_keyword(match: str) -> tuple[str, list[object]]:
        # fts_match's words are letters and digits only, so they are safe as to_tsquery terms.
        words = [w.replace('""', '"') for w in _QUOTED.findall(match)]
        return (
            "SELECT c.chunk_id FROM kb_chunks c, to_tsquery('agenthost_kb', ?) AS q(q)"
            " WHERE c.text_tsv @@ q.q AND c.bot_id = ? ORDER BY ts_rank(c.text_tsv, q.q, 1) DESC, c.chunk_id LIMIT ?",
            [" | ".join(words)],
        )


Dialect = type[SqliteDialect] | type[PostgresDialect]
