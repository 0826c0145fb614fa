"""`agenthost db migrate-to postgresql://…`: a SQLite data dir's database copied into PostgreSQL.

Resumable and idempotent: each table is copied in batches in its key order as SQLite reads it, each batch in one
PostgreSQL transaction that also records the last key it copied (table `transfer_progress`), so a copy cut anywhere
(a crash, Ctrl-C, the server restarting) goes on after the last committed batch when run again; rows are inserted
with ON CONFLICT DO NOTHING besides. Once every table is copied, the tables whose rows triggers keep
(conversation_stats, state_usage) are replaced by the source's exact rows and the sequences are moved past the copied
keys, so the host numbers new rows after the old. Run again after it finished, it copies nothing and verifies.

Verified per table: the row count and a checksum on both sides, computed the same way (the sum modulo 2^64 of each
row's BLAKE2b digest over its values, so it does not depend on either database's order or collation).

Artifact files (<data dir>/artifacts/objects) are copied into artifact_chunks, one object per transaction, skipped
when already there; verified by the count of objects and a checksum of their contents as read back from each side.

The host must be stopped: the data dir's lock is held throughout, so no host can start on it meanwhile. The
source is first brought to the newest schema, as starting a host would. plugin_processes (the old host's pids) is
not copied.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenthost.host.store.artifacts import file_pieces, put_chunks
from agenthost.host.store.db import connect as sqlite_connect
from agenthost.host.store.migrations import migrate as sqlite_migrate

BATCH_ROWS = 2000
# In foreign-key order; each with the columns that order (and resume) its copy.
TABLES: list[tuple[str, tuple[str, ...]]] = [
    ("meta", ("key",)),
    ("plugins", ("plugin_id",)),
    ("bots", ("bot_id",)),
    ("bindings", ("binding_id",)),
    ("events", ("seq",)),
    ("transcript", ("seq",)),
    ("runs", ("run_id",)),
    ("run_events", ("run_id", "seq")),
    ("artifacts", ("artifact_id",)),
    ("state", ("scope_key", "key")),
    ("audit", ("id",)),
    ("kb_documents", ("doc_id",)),
    ("kb_chunks", ("chunk_id",)),
    ("kb_embeddings", ("scope",)),
    ("worker_tokens", ("token_hash",)),
    ("workers", ("name",)),
]
# Kept by triggers as rows are inserted; replaced by the source's rows at the end.
DERIVED = ["conversation_stats", "state_usage"]
# Identity columns and sequences to move past what was copied.
_SEQUENCES = [
    ("pg_get_serial_sequence('events', 'seq')", "SELECT MAX(seq) FROM events"),
    ("pg_get_serial_sequence('audit', 'id')", "SELECT MAX(id) FROM audit"),
    ("pg_get_serial_sequence('kb_chunks', 'chunk_id')", "SELECT MAX(chunk_id) FROM kb_chunks"),
]


class TransferError(RuntimeError):
    pass


@dataclass
class TableReport:
    table: str
    copied: int  # rows inserted by this run
    source_rows: int
    target_rows: int
    source_checksum: str
    target_checksum: str

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows and self.source_checksum == self.target_checksum


def _columns(src: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in src.execute(f"PRAGMA table_info({table})")]


def _value(v: Any) -> Any:
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def _row_digest(row: Sequence[Any]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for v in row:
        v = _value(v)
        if v is None:
            h.update(b"N")
        elif isinstance(v, bytes):
            h.update(b"B" + struct.pack("<Q", len(v)) + v)
        elif isinstance(v, float):
            h.update(b"F" + struct.pack("<d", v))
        elif isinstance(v, int):
            h.update(b"I" + str(v).encode() + b";")
        else:
            text = str(v).encode()
            h.update(b"S" + struct.pack("<Q", len(text)) + text)
    return int.from_bytes(h.digest(), "little")


def _checksum(rows: Any) -> tuple[int, str]:
    count = total = 0
    for row in rows:
        count += 1
        total = (total + _row_digest(row)) % (1 << 64)
    return count, f"{total:016x}"


def _sha_of(pieces: Any) -> str:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.hexdigest()


def _batches(cursor: Any) -> Any:
    while True:
        rows = cursor.fetchmany(BATCH_ROWS)
        if not rows:
            return
        yield from rows


class Transfer:
    def __init__(self, sqlite_path: Path, dsn: str, *, password: str | None = None) -> None:
        self.sqlite_path = sqlite_path
        self.dsn = dsn
        self.password = password

    def run(self, progress: Callable[[str], None] = lambda line: None) -> list[TableReport]:
        from agenthost.host.store import migrations_pg, postgres

        if not self.sqlite_path.exists():
            raise TransferError(f"there is no SQLite database at {self.sqlite_path}")
        src = sqlite_connect(self.sqlite_path)
        sqlite_migrate(src)
        try:
            dst = postgres.connect(
                self.dsn, password=self.password, application_name="agenthost-migrate-to", exclusive=True
            )
        except postgres.DatabaseBusy as exc:
            raise TransferError(f"{exc}: stop it first") from None
        except postgres.ERRORS as exc:
            from agenthost.host.store.dsn import redacted

            raise TransferError(f"cannot connect to the database {redacted(self.dsn)}: {exc}") from None
        try:
            migrations_pg.migrate(dst)
            dst.execute(
                "CREATE TABLE IF NOT EXISTS transfer_progress (table_name TEXT PRIMARY KEY, last_key TEXT NOT NULL,"
                " done BIGINT NOT NULL DEFAULT 0)"
            )
            self._check_same_source(src, dst)
            copied = {table: self._copy(src, dst, table, key, progress) for table, key in TABLES}
            self._finish(src, dst)
            objects = self._copy_objects(src, dst, progress)
            reports = [
                self._verify(src, dst, table, copied.get(table, 0)) for table in [t for t, _ in TABLES] + DERIVED
            ]
            return [*reports, self._verify_objects(src, dst, objects)]
        finally:
            dst.close()
            src.close()

    @staticmethod
    def _check_same_source(src: sqlite3.Connection, dst: Any) -> None:
        """Refuses a database holding another host's data: its cursor secret (meta) is not the source's."""
        mine = src.execute("SELECT value FROM meta WHERE key = 'cursor_secret'").fetchone()
        theirs = dst.execute("SELECT value FROM meta WHERE key = 'cursor_secret'").fetchone()
        if theirs is not None and (mine is None or mine[0] != theirs[0]):
            raise TransferError(
                "the PostgreSQL database already holds another host's data (its cursor secret differs); migrate"
                " into an empty database"
            )

    def _copy(
        self, src: sqlite3.Connection, dst: Any, table: str, key: tuple[str, ...], progress: Callable[[str], None]
    ) -> int:
        state = dst.execute("SELECT last_key, done FROM transfer_progress WHERE table_name = ?", (table,)).fetchone()
        if state is not None and state[1]:
            return 0
        columns = _columns(src, table)
        where, params = "", []
        if state is not None:
            last = json.loads(state[0])
            where = f" WHERE ({', '.join(key)}) > ({', '.join('?' * len(key))})"
            params = last
        cursor = src.execute(f"SELECT {', '.join(columns)} FROM {table}{where} ORDER BY {', '.join(key)}", params)
        positions = [columns.index(k) for k in key]
        marks = ", ".join("?" * len(columns))
        insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT DO NOTHING"
        copied = 0
        while True:
            rows = cursor.fetchmany(BATCH_ROWS)
            if not rows:
                break
            last_key = json.dumps([rows[-1][p] for p in positions])
            dst.execute("BEGIN")
            try:
                inserted = dst.executemany(insert, [tuple(r) for r in rows])
                self._batch_committing(table)
                dst.execute(
                    "INSERT INTO transfer_progress(table_name, last_key) VALUES (?, ?)"
                    " ON CONFLICT(table_name) DO UPDATE SET last_key = excluded.last_key",
                    (table, last_key),
                )
                dst.execute("COMMIT")
            except BaseException:
                dst.execute("ROLLBACK")
                raise
            copied += max(inserted.rowcount, 0) if inserted.rowcount is not None else len(rows)
            progress(f"{table}: {copied} rows copied")
        dst.execute(
            "INSERT INTO transfer_progress(table_name, last_key, done) VALUES (?, '[]', 1)"
            " ON CONFLICT(table_name) DO UPDATE SET done = 1",
            (table,),
        )
        return copied

    @staticmethod
    def _batch_committing(table: str) -> None:
        """Called inside each batch's transaction before it commits (the tests cut a copy here)."""

    @staticmethod
    def _finish(src: sqlite3.Connection, dst: Any) -> None:
        dst.execute("BEGIN")
        try:
            for table in DERIVED:
                columns = _columns(src, table)
                dst.execute(f"DELETE FROM {table}")
                rows = src.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
                if rows:
                    dst.executemany(
                        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                        [tuple(r) for r in rows],
                    )
            for sequence, maximum in _SEQUENCES:
                top = dst.execute(maximum).fetchone()[0]
                if top is not None:
                    dst.execute(f"SELECT setval({sequence}, ?)", (int(top),))
            given = src.execute(
                "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'transcript'), 0),"
                " COALESCE((SELECT MAX(seq) FROM transcript), 0))"
            ).fetchone()[0]
            if given:
                dst.execute("SELECT setval('transcript_seq', ?)", (int(given),))
            dst.execute("COMMIT")
        except BaseException:
            dst.execute("ROLLBACK")
            raise

    @property
    def objects_dir(self) -> Path:
        return self.sqlite_path.parent / "artifacts" / "objects"

    def _shas(self, src: sqlite3.Connection) -> list[str]:
        return [r[0] for r in src.execute("SELECT DISTINCT sha256 FROM artifacts ORDER BY sha256")]

    def _copy_objects(self, src: sqlite3.Connection, dst: Any, progress: Callable[[str], None]) -> int:
        copied = 0
        for sha in self._shas(src):
            path = self.objects_dir / sha[:2] / sha
            if (
                not path.exists()
                or dst.execute("SELECT 1 FROM artifact_chunks WHERE sha256 = ? AND ordinal = 0", (sha,)).fetchone()
            ):
                continue
            dst.execute("BEGIN")
            try:
                put_chunks(dst, sha, file_pieces(path))
                dst.execute("COMMIT")
            except BaseException:
                dst.execute("ROLLBACK")
                raise
            copied += 1
            progress(f"artifact objects: {copied} copied")
        return copied

    def _verify_objects(self, src: sqlite3.Connection, dst: Any, copied: int) -> TableReport:
        """Every object the artifacts name, hashed again from its file and from its chunks in the database."""
        here, there = [], []
        for sha in self._shas(src):
            path = self.objects_dir / sha[:2] / sha
            if path.exists():
                here.append((sha, _sha_of(file_pieces(path))))
            rows = dst.execute("SELECT data FROM artifact_chunks WHERE sha256 = ? ORDER BY ordinal", (sha,)).fetchall()
            if rows:
                there.append((sha, _sha_of(bytes(r[0]) for r in rows)))
        n_src, sum_src = _checksum(here)
        n_dst, sum_dst = _checksum(there)
        return TableReport("artifact objects", copied, n_src, n_dst, sum_src, sum_dst)

    @staticmethod
    def _verify(src: sqlite3.Connection, dst: Any, table: str, copied: int) -> TableReport:
        columns = ", ".join(_columns(src, table))
        n_src, sum_src = _checksum(_batches(src.execute(f"SELECT {columns} FROM {table}")))
        raw = dst.raw.cursor(name=f"verify_{table}")  # server-side: a large table is not loaded whole
        try:
            dst.execute("BEGIN")
            raw.itersize = BATCH_ROWS
            raw.execute(f"SELECT {columns} FROM {table}")
            n_dst, sum_dst = _checksum(raw)
            raw.close()
            dst.execute("COMMIT")
        except BaseException:
            dst.execute("ROLLBACK")
            raise
        return TableReport(table, copied, n_src, n_dst, sum_src, sum_dst)
