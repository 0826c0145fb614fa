"""The PostgreSQL backend's connections: sqlite3.Connection's surface over psycopg 3, so every store's SQL and every
writer job runs unchanged on either backend (host/store/db.py).

The stores write SQL once, in the dialect both databases accept (INSERT … ON CONFLICT, RETURNING, substr, COALESCE)
with `?` placeholders. What differs is translated here, once per statement text (cached): `?` becomes `%s` (and a
literal `%` is doubled), SQLite's planner hints (`INDEXED BY`, `NOT INDEXED`) are dropped (PostgreSQL plans from
statistics and the same indexes), `length(CAST(x AS BLOB))` becomes `octet_length(x)`, and `BEGIN IMMEDIATE`
becomes `BEGIN` (there is one writer connection; nothing else writes). Statements that cannot be written once
(full-text search, sequence numbers, the run-event bulk insert) live in host/store/dialect.py.

psycopg is an optional dependency (`pip install 'agenthost[postgres]'`): imported only when a DSN is given.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.rows import tuple_row

from agenthost.host import limits
from agenthost.host.store.dialect import Dialect, PostgresDialect
from agenthost.host.store.faults import DatabaseDown, down_message, reason

_HINT = re.compile(r"\s+(?:INDEXED BY \w+|NOT INDEXED)\b")
_BLOB_LENGTH = re.compile(r"length\(CAST\((\w+) AS BLOB\)\)")


@functools.lru_cache(maxsize=4096)
def translate(sql: str, has_params: bool) -> str:
    """A statement as written for SQLite, as PostgreSQL takes it (see the module's docstring)."""
    if sql == "BEGIN IMMEDIATE":
        return "BEGIN"
    sql = _BLOB_LENGTH.sub(r"octet_length(\1)", _HINT.sub("", sql))
    if not has_params:
        return sql
    out: list[str] = []
    quoted = False
    for ch in sql:
        if ch == "'":
            quoted = not quoted
        if ch == "%":
            out.append("%%")
        elif ch == "?" and not quoted:
            out.append("%s")
        else:
            out.append(ch)
    return "".join(out)


class Row(tuple):  # type: ignore[type-arg]
    """A row read by position or by column name, like sqlite3.Row (its class is made once per column list)."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})


def _named_rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = tuple(c.name for c in cursor.description) if cursor.description else ()
    cls = _row_class(names)
    return cls


class _BoolAsInt(Dumper):
    """Flags are integer columns on both backends (SQLite has no boolean): a Python bool is stored as 0 or 1."""

    oid = psycopg.adapters.types["int8"].oid

    def dump(self, obj: Any) -> bytes:
        return b"1" if obj else b"0"


class _Cursor:
    """What `conn.cursor()` gives on SQLite, to the extent the stores use it: a settable row_factory (None: tuples)."""

    def __init__(self, conn: PgConnection) -> None:
        self._conn = conn
        self.row_factory: object = _named_rows

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        factory: Any = tuple_row if self.row_factory is None else _named_rows
        cursor = self._conn._run(
            lambda raw: raw.cursor(row_factory=factory).execute(
                translate(sql, bool(params)), params or None, binary=self._conn.binary
            ),
            sql,
        )
        return cursor if self._conn._pipeline is None else _PipelinedCursor(cursor, self._conn)  # type: ignore[return-value]


class _PipelinedCursor:
    """A statement's cursor while the writer's connection is in pipeline mode (PgConnection.pipelined): its result
    arrives later. Reading rows makes psycopg flush and wait for it; `rowcount` (and the status) psycopg only sets
    once it arrived, so reading them here waits for it too (a Sync: every statement sent so far is answered)."""

    def __init__(self, cursor: psycopg.Cursor[Any], conn: PgConnection) -> None:
        self._cursor = cursor
        self._conn = conn

    def _answered(self) -> psycopg.Cursor[Any]:
        if self._cursor.pgresult is None:
            self._conn.sync()
        return self._cursor

    def _fetched(self) -> psycopg.Cursor[Any]:
        if self._cursor.pgresult is None:
            self._conn.round_trips += 1  # psycopg flushes and waits for the answer
        return self._cursor

    def fetchone(self) -> Any:
        return self._fetched().fetchone()

    def fetchall(self) -> Any:
        return self._fetched().fetchall()

    @property
    def rowcount(self) -> int:
        return self._answered().rowcount

    @property
    def statusmessage(self) -> str | None:
        return self._answered().statusmessage

    def __iter__(self) -> Any:
        return iter(self._fetched())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class PgConnection:
    """One psycopg connection in autocommit mode (the writer issues BEGIN/SAVEPOINT/COMMIT itself, as on SQLite).

    A connection the server dropped (a restart, a failover, an idle timeout) is opened again where that is safe:
    before a writer's BEGIN (nothing of the batch was sent yet), and for a reader's statement (each read is its own
    transaction, so running it again reads again). A statement of a writer's transaction in flight is never
    repeated: its job fails with the error, unacknowledged, as any job whose transaction did not commit."""

    dialect: Dialect = PostgresDialect

    def __init__(self, opener: Callable[[], psycopg.Connection[Any]], *, reader: bool) -> None:
        self._open = opener
        self._reader = reader
        # The reader asks for results in binary: a page of 50 items' bytes parses in ~95 µs instead of ~145 (bytea
        # in text is hex); the same Python values either way.
        self.binary = reader
        self.raw = opener()
        self.reconnects = 0
        self.exclusive = False
        # The lease epoch this host took (claim_lease); None: no lease (a reader, or `db migrate-to`).
        self.epoch: int | None = None
        # Set while the writer runs a batch in pipeline mode (pipelined): statements are sent without waiting.
        self._pipeline: psycopg.Pipeline | None = None
        # Round trips to the server this connection made (what a write costs on PostgreSQL; benchmarks count it).
        self.round_trips = 0
        # The writer's: per table, the last seq it handed out (numbered). Valid while this session holds the lease
        # (the only writer), so forgotten whenever the connection is opened again.
        self._given: dict[str, int] = {}

    @property
    def lost(self) -> bool:
        """True once the server dropped this connection or could not be reached again (host/store/faults.py)."""
        return bool(self.raw.closed or self.raw.broken)

    @contextlib.contextmanager
    def pipelined(self) -> Iterator[None]:
        """The writer's batch in psycopg's pipeline mode: each statement is sent without waiting for the one before,
        so a batch costs a round trip for BEGIN and the fence, one for each result a job reads, and one for the
        rest up to COMMIT (the Sync at the end), instead of one per statement. A connection the server dropped is
        opened again first, as before a BEGIN (nothing of the batch was sent yet). Leaving waits for every answer,
        raising the first error (the server skipped everything after it up to the Sync)."""
        if self.lost:
            self._reopen()
        with self.raw.pipeline() as pipeline:
            self._pipeline = pipeline
            try:
                yield
            finally:
                self._pipeline = None
                self.round_trips += 1  # the Sync leaving sends

    def sync(self) -> None:
        """In pipeline mode: waits until every statement sent so far is answered (raises the first error)."""
        assert self._pipeline is not None
        self.round_trips += 1
        self._pipeline.sync()

    @property
    def in_error(self) -> bool:
        """The transaction in progress had a statement fail (only ROLLBACK or ROLLBACK TO is accepted now)."""
        return self.raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR

    def _run(self, call: Callable[[psycopg.Connection[Any]], Any], sql: str) -> Any:
        if self._pipeline is not None:
            # A statement sent is not known to be done until its answer, so none is repeated here: a connection lost
            # in the first round trip (BEGIN and the fence) is said so, and the batch is begun again unpipelined
            # (db.py), which opens it again; lost later, the batch fails.
            if sql != "BEGIN IMMEDIATE":
                return call(self.raw)
            try:
                result = call(self.raw)  # answered with the fence's (or with the first result a job reads)
                if self.epoch is not None:
                    self._fence()
            except psycopg.OperationalError as exc:
                if self.lost and not isinstance(exc, LeaseLost):
                    raise LostAtBegin(str(exc)) from exc
                raise
            return result
        self.round_trips += 1
        begin = sql == "BEGIN IMMEDIATE"
        retry = self._reader or begin
        try:
            if retry and self.lost:
                self._reopen()
            try:
                result = call(self.raw)
            except psycopg.OperationalError:
                if not (retry and self.lost):
                    raise
                self._reopen()
                result = call(self.raw)
        except psycopg.OperationalError as exc:
            # A read the server cannot answer now is refused, typed (UNAVAILABLE): never answered from elsewhere.
            # The writer's errors are typed by its batch (host/store/db.py), which also notes the outage.
            if self._reader and self.lost:
                raise DatabaseDown(down_message(reason(exc))) from None
            raise
        if begin and self.epoch is not None:
            self._fence()
        return result

    def numbered(self, table: str, sequence: str, count: int) -> int:
        """The seq just before `count` consecutive seqs of `table` to give now, counted here rather than read from
        the server: a job then reads nothing before it writes (in a pipelined batch, a read is a round trip). The
        writer holding the lease is the database's only writer, so nothing else takes a number meanwhile; the
        count starts, at first use on each connection, past every number `sequence` gave and every row (the
        sequence is also what a new holder of the lease, or a host before this count, starts from). The sequence
        is moved along in the same round trip as the job's writes, and like nextval it is not rolled back: numbers
        given to a transaction that did not commit are skipped, never given twice. Readers of seq take it as an
        order with gaps (as nextval's always left), never as a count."""
        last = self._given.get(table)
        if last is None:
            row = self.execute(
                f"SELECT GREATEST((SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}),"
                f" (SELECT COALESCE(MAX(seq), 0) FROM {table}))"
            ).fetchone()
            last = int(row[0])
        self._given[table] = last + count
        self.execute(f"SELECT setval('{sequence}', ?)", (last + count,))
        return last

    def claim_lease(self, holder: str) -> int:
        """Called once HOST_LOCK is held: a new lease epoch, this host its holder. Every later write transaction
        checks it is still the newest (`_fence`). Waits LEASE_TAKEOVER_GRACE_SECONDS first unless the last holder
        released the lease (`release_lease`, at a clean stop) or there was none: a host that lost it without
        knowing may still answer reads from memory until its proof runs out (Database.proven)."""
        last = self.raw.execute("SELECT heartbeat_at FROM lease WHERE id = 1").fetchone()
        if last is not None and last[0]:
            time.sleep(limits.LEASE_TAKEOVER_GRACE_SECONDS)
        now = time.time()
        row = self.raw.execute(
            "INSERT INTO lease VALUES (1, 1, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET epoch = lease.epoch + 1,"
            " holder = excluded.holder, acquired_at = excluded.acquired_at, heartbeat_at = excluded.heartbeat_at"
            " RETURNING epoch",
            (holder, now, now),
        ).fetchone()
        assert row is not None  # an upsert with RETURNING returns its row
        self.epoch = int(row[0])
        return self.epoch

    @staticmethod
    def release_lease(conn: Any) -> None:
        """A writer job, the last of a host that stops cleanly: the next holder need not wait (claim_lease). A
        heartbeat of 0 says so (a fresh database's lease row has one too)."""
        conn.execute("UPDATE lease SET heartbeat_at = 0 WHERE id = 1")

    def _fence(self) -> None:
        """The first statement of every write transaction: a host another one took the lease from writes nothing
        more. FOR SHARE: a standby's claim (an UPDATE of the row) waits until this transaction ends, so no
        transaction that passed the check commits after the epoch moved on."""
        self.round_trips += 1
        row = self.raw.execute("SELECT epoch, holder FROM lease WHERE id = 1 FOR SHARE").fetchone()
        if row is None or int(row[0]) != self.epoch:
            holder = row[1] if row else "nobody"
            raise LeaseLost(f"this host lost the database lease to {holder} (epoch {row[0] if row else '?'})")

    def _reopen(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.raw.close()
        self._given.clear()  # another host may have written meanwhile: counted again from the database
        try:
            self.raw = self._open()
        except DatabaseBusy as exc:
            if self.epoch is None:
                raise
            raise LeaseLost(f"this host lost the database lease: {exc}") from None
        self.reconnects += 1

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        cursor = self._run(
            lambda raw: raw.execute(translate(sql, bool(params)), params or None, binary=self.binary), sql
        )
        return cursor if self._pipeline is None else _PipelinedCursor(cursor, self)  # type: ignore[return-value]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        cursor.executemany(translate(sql, True), rows)
        return cursor if self._pipeline is None else _PipelinedCursor(cursor, self)  # type: ignore[return-value]

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def close(self) -> None:
        self.raw.close()


# One host per database, as host.lock makes it one host per data dir: the writer's connection holds this session
# advisory lock (taken again whenever it reconnects), and so does `db migrate-to` while it copies.
HOST_LOCK = 0x61676E74_77726974


class DatabaseBusy(psycopg.OperationalError):
    """Another agenthost (or a `db migrate-to`) holds the database."""


class LostAtBegin(psycopg.OperationalError):
    """The writer's pipelined batch found its connection lost at BEGIN: nothing of it was done."""

    at_begin = True  # how host/store/db.py recognises it


class LeaseLost(DatabaseBusy):
    """This host held the database's lease and another host has it now: it must stop writing (and serving)."""

    lease_lost = True  # how host/store/db.py, which imports psycopg only for a DSN, recognises it


# TCP keepalives on the writer's connection, both ends, so a host cut off from the database (a partition, a power
# cut) loses HOST_LOCK within ~5 s on the server (its session ends, a standby takes over) and notices within ~5 s
# itself. Unix-socket connections ignore them (a local peer's death is seen at once).
_KEEPALIVE = {"keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1, "keepalives_count": 3,
              "tcp_user_timeout": 5000}  # fmt: skip
_SERVER_KEEPALIVE = (
    "SET tcp_keepalives_idle = 2; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3;"
    " SET tcp_user_timeout = 5000"
)

# How often a standby waiting for HOST_LOCK looks again at who holds it (for its status).
STANDBY_CHECK_SECONDS = 5.0
STANDBY_RECONNECT_SECONDS = 1.0


def lock_holder(raw: psycopg.Connection[Any]) -> str:
    """Who holds HOST_LOCK, as the server knows the session (its application_name and address)."""
    holder = raw.execute(
        "SELECT a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.objid = %s AND l.granted AND a.datname = current_database()",
        (HOST_LOCK & 0xFFFFFFFF,),
    ).fetchone()
    return f"{holder[0]} from {holder[1] or 'a local socket'}" if holder else "nobody (it was just released)"


def connect(
    dsn: str,
    *,
    password: str | None = None,
    application_name: str = "agenthost",
    connect_timeout: int = 10,
    reader: bool = False,
    exclusive: bool = False,
    standby: Callable[[str], None] | None = None,
) -> PgConnection:
    """A connection as the stores expect it; raises psycopg.OperationalError when the server cannot be reached.
    `password`: kept out of the DSN (it comes from a file or the key store), given to libpq on its own. `reader`:
    its statements may be run again on a new connection when the server dropped the old one (see PgConnection).
    `exclusive`: holds HOST_LOCK, or raises DatabaseBusy (on every reconnect too: a writer that lost the lock to
    another host writes nothing more). `standby`: instead of raising DatabaseBusy at the first open, wait for
    HOST_LOCK as long as it takes, calling standby(holder) whenever the holder seen changes."""
    extra: dict[str, Any] = {} if password is None else {"password": password}
    if exclusive:
        extra.update(_KEEPALIVE)
    opened = False

    def open_one() -> psycopg.Connection[Any]:
        raw = psycopg.connect(
            dsn,
            **extra,
            autocommit=True,
            row_factory=_named_rows,
            application_name=application_name,
            connect_timeout=connect_timeout,
        )
        raw.adapters.register_dumper(bool, _BoolAsInt)
        if exclusive:
            raw.execute(_SERVER_KEEPALIVE)
        return raw

    def opener() -> psycopg.Connection[Any]:
        nonlocal opened
        raw = open_one()
        if exclusive:
            if standby is not None and not opened:
                raw = _stand_by(raw, open_one, standby)
            elif not _take_lock(raw):
                who = lock_holder(raw)
                raw.close()
                raise DatabaseBusy(
                    f"another agenthost ({who}) is using this database; one host per database"
                    " (`serve --standby` waits for it and takes over when it goes)"
                )
        opened = True
        return raw

    conn = PgConnection(opener, reader=reader)
    conn.exclusive = exclusive
    return conn


# How long a host waits for HOST_LOCK at start: the session of a host that just stopped (or was killed) may still
# be ending on the server, its lock with it.
LOCK_PATIENCE_SECONDS = 3.0


def _try_lock(raw: psycopg.Connection[Any]) -> bool:
    row = raw.execute("SELECT pg_try_advisory_lock(%s)", (HOST_LOCK,)).fetchone()
    return bool(row and row[0])


def _take_lock(raw: psycopg.Connection[Any]) -> bool:
    deadline = time.monotonic() + LOCK_PATIENCE_SECONDS
    while not _try_lock(raw):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _stand_by(
    raw: psycopg.Connection[Any], open_one: Callable[[], psycopg.Connection[Any]], report: Callable[[str], None]
) -> psycopg.Connection[Any]:
    """Waits for HOST_LOCK on `raw`; a connection the server drops meanwhile (a restart, an idle timeout) is opened
    again, every STANDBY_RECONNECT_SECONDS while the server cannot be reached. Returns the connection holding it."""
    while True:
        try:
            _wait_for_lock(raw, report)
            return raw
        except psycopg.OperationalError as exc:
            if not (raw.closed or raw.broken):
                raise
            report(f"nobody known: the standby's connection dropped ({exc}); reconnecting")
        while True:
            time.sleep(STANDBY_RECONNECT_SECONDS)
            try:
                raw = open_one()
                break
            except psycopg.OperationalError:
                continue


def _wait_for_lock(raw: psycopg.Connection[Any], report: Callable[[str], None]) -> None:
    """Blocks in the server until HOST_LOCK is granted, so a standby has it the moment the holder's session ends
    (polling would add up to a poll's interval to every takeover); every STANDBY_CHECK_SECONDS the wait is cut by
    lock_timeout to see whether the holder changed."""
    seen = ""
    raw.execute(f"SET lock_timeout = '{int(STANDBY_CHECK_SECONDS * 1000)}ms'")
    try:
        while not _try_lock(raw):
            holder = lock_holder(raw)
            if holder != seen:
                report(holder)
                seen = holder
            try:
                raw.execute("SELECT pg_advisory_lock(%s)", (HOST_LOCK,))
                return
            except psycopg.errors.LockNotAvailable:
                continue
    finally:
        raw.execute("RESET lock_timeout")


ERRORS: tuple[type[BaseException], ...] = (psycopg.Error,)
