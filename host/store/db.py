"""The SQLite file under every store: one writer thread with group commit, one reader used on the event loop.

Why not one aiosqlite call per statement: a hop to a thread and back costs ~0.1 ms on this machine (an
`asyncio.to_thread` round trip measured 80 µs idle, 90-160 µs under load; the project's design note
performance-anchors.md, which lives outside this repository), more than the indexed reads the run API serves. So:

* Writes go to one dedicated thread (the single writer). It drains every job queued so far into one
  `BEGIN IMMEDIATE` transaction, each job inside its own SAVEPOINT so a failing job rolls back alone, then commits
  once (one fsync for the whole batch) and resolves the callers' futures. A job is acknowledged only after its
  COMMIT returned.
* Reads run synchronously on the event loop through a read-only connection. WAL lets them proceed while the
  writer commits, and every read the host serves is bounded by a hard cap (page sizes, top_k, range lengths), so
  the loop is held for tens of microseconds, less than the hop it saves.

Durability: journal_mode=WAL with synchronous=FULL. FULL syncs the WAL on every commit, so an acknowledged write
survives power loss, not only a process crash; group commit amortises that fsync across everything queued
meanwhile (run events of every run, audit rows, state writes). A batch of writes nobody awaits is held open for
limits.WRITE_GROUP_COMMIT_SECONDS, so a fast stream commits once per window, not once per runner message. Audit
rows are queued without waiting (`enqueue`); the loss window for them is the batch in flight when the host dies.

The queue is bounded (limits.WRITE_QUEUE_MAX_JOBS, WRITE_QUEUE_MAX_BYTES), by backpressure rather than refusal:
`write` waits for room before queuing, and producers of unawaited jobs (a run's event stream) await
`backpressure()` between jobs, which stops them reading from their source (gRPC flow control then stalls the
runner). Nothing is dropped and a slow disk cannot make the host buffer without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from agenthost.host import limits
from agenthost.host.store.dialect import Dialect, SqliteDialect
from agenthost.host.store.dsn import is_dsn, redacted
from agenthost.host.store.faults import DatabaseDown, WriteConflict, down_message, retryable
from agenthost.host.store.faults import reason as _reason
from agenthost.host.store.migrations import migrate

T = TypeVar("T")
log = logging.getLogger(__name__)

_STOP = object()


class SqliteConnection(sqlite3.Connection):
    """A connection that names its backend's statements (host/store/dialect.py), as PgConnection does."""

    dialect: Dialect = SqliteDialect


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Every connection gets the same per-connection pragmas (they are not stored in the file)."""
    kw: dict[str, Any] = {"isolation_level": None, "check_same_thread": False, "factory": SqliteConnection}
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, **kw)
    else:
        conn = sqlite3.connect(path, **kw)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA foreign_keys = ON")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    conn.row_factory = sqlite3.Row
    return conn


class _Job:
    __slots__ = ("fn", "future", "weight", "on_fail")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        future: asyncio.Future[Any] | None,
        weight: int = 0,
        on_fail: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.fn = fn
        self.future = future
        self.weight = weight
        self.on_fail = on_fail


class _Unattributed(Exception):
    """A pipelined batch had a statement fail and which job sent it is not known (Database._try_batch)."""


class LeaseLostError(RuntimeError):
    """A write refused because this host no longer holds the database's lease (another host took over)."""


class DatabaseUnavailable(RuntimeError):
    """The database named at start cannot be used (unreachable, refused us, or its driver is not installed)."""


class Database:
    """Owns the file, or the connections to a PostgreSQL database. Created by `agenthost.host.server.Host` at
    start; every store receives it.

    `target`: a path (SQLite, the default) or a `postgresql://` DSN. On PostgreSQL the design is the same: one
    writer connection on its own thread with the same group commit (BEGIN, a SAVEPOINT per job, ROLLBACK TO on a
    failed job, which also clears PostgreSQL's aborted-transaction state, one COMMIT), and one reader connection
    used synchronously on the event loop (autocommit, so each read sees what was committed before it). Two
    connections in all: the pool is bounded by construction. Why sync reads there too: docs/architecture.md."""

    def __init__(
        self,
        target: Path | str,
        *,
        password: str | None = None,
        standby: Callable[[str], None] | None = None,
        on_lease_lost: Callable[[str], None] | None = None,
    ) -> None:
        """PostgreSQL only: `standby`, wait at open for the host holding the database to go (called with its name
        whenever that changes) instead of refusing to start; `on_lease_lost`, called on the event loop once, with
        the reason, when another host took the lease (every write fails from then on)."""
        self.dsn = str(target) if is_dsn(target) else ""
        self._password = password
        self._standby = standby
        self._on_lease_lost = on_lease_lost
        # Set (the reason) once a write transaction found the lease lost: the writer writes nothing more.
        self.fenced = ""
        # Set (why, and since when) while the database cannot be reached: the last write batch failed on a lost
        # connection. Cleared by the next batch that commits (the writer reconnects before each batch; the lease
        # heartbeat makes one every second).
        self.down = ""
        self.down_since = 0.0
        # Undo callbacks of the batch in flight (writer thread only): see on_rollback; and after-commit ones.
        self._undo: list[Callable[[], None]] = []
        self._done: list[Callable[[], None]] = []
        # PostgreSQL: when the last batch that committed began (monotonic; see `proven`), and whether this host
        # released the lease (it is stopping).
        self._proven_at = 0.0
        self._released = False
        # Bumped by every batch that did not commit (a COMMIT whose answer was lost may have happened): what is
        # kept by a version of the data read before then is read again.
        self.generation = 0
        # This host's name as the lease and the server's session list show it.
        self.holder = f"agenthost-writer {socket.gethostname()}:{os.getpid()}"[:63]
        self.epoch: int | None = None
        # PostgreSQL with pgvector: the knowledge base's vectors are searched in the server (host/store/pgvector.py).
        self.vectors_in_db = False
        self.path = Path(target) if not self.dsn else Path()
        self.backend = "postgresql" if self.dsn else "sqlite"
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: sqlite3.Connection | None = None
        self.batches = 0  # commits made; the benchmark reads it to show group commit at work
        self.pipelining = True  # PostgreSQL: batches sent in pipeline mode (benchmarks turn it off to compare)
        self.unpipelined = 0  # PostgreSQL: pipelined batches run again unpipelined, a job having failed in them
        # Jobs and bytes queued but not yet committed. Changed under _count_lock (the loop adds, the writer
        # subtracts); read without it for the fast-path check, where a stale value only delays a wait by a batch.
        self.pending_jobs = 0
        self.pending_bytes = 0
        self._count_lock = threading.Lock()
        self._room: asyncio.Event | None = None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        self._room.set()
        writer, reader = await asyncio.to_thread(self._connect)
        self._thread = threading.Thread(
            target=self._write_loop, args=(writer,), name="agenthost-db-writer", daemon=True
        )
        self._thread.start()
        self._reader = reader

    def _connect(self) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        """(writer, reader), the schema migrated. A PostgreSQL connection has sqlite3.Connection's surface."""
        if not self.dsn:
            writer = connect(self.path)
            migrate(writer)
            return writer, connect(self.path, readonly=True)
        try:
            from agenthost.host.store import migrations_pg, pgvector, postgres
        except ImportError as exc:
            raise DatabaseUnavailable(
                f"PostgreSQL needs the psycopg driver ({exc}): pip install 'agenthost[postgres]'"
            ) from None

        self.errors = (sqlite3.Error, *postgres.ERRORS, LeaseLostError, DatabaseDown, WriteConflict)
        try:
            pg_writer = postgres.connect(
                self.dsn,
                password=self._password,
                application_name=self.holder,
                exclusive=True,
                standby=self._standby,
            )
        except postgres.DatabaseBusy as exc:
            raise DatabaseUnavailable(f"{exc} ({redacted(self.dsn)})") from None
        except postgres.ERRORS as exc:
            raise DatabaseUnavailable(f"cannot connect to the database {redacted(self.dsn)}: {_reason(exc)}") from None
        try:
            migrations_pg.migrate(pg_writer)
            self.epoch = pg_writer.claim_lease(self.holder)
            self.vectors_in_db = pgvector.enable(pg_writer)
            pg_reader = postgres.connect(
                self.dsn, password=self._password, application_name="agenthost-reader", reader=True
            )
        except postgres.ERRORS as exc:  # e.g. a user that may not create tables there
            pg_writer.close()
            raise DatabaseUnavailable(f"cannot use the database {redacted(self.dsn)}: {_reason(exc)}") from None
        except BaseException:
            pg_writer.close()
            raise
        return cast(sqlite3.Connection, pg_writer), cast(sqlite3.Connection, pg_reader)

    @property
    def description(self) -> str:
        """Where the stores live, for `status` (a DSN without its password)."""
        where = f"postgresql {redacted(self.dsn)}" if self.dsn else f"sqlite {self.path}"
        if self.down:
            since = time.strftime("%H:%M:%S", time.localtime(self.down_since))
            where += f" UNREACHABLE since {since}: {self.down} (runs fail with database_unavailable; reconnecting)"
        return where

    @property
    def proven(self) -> bool:
        """Whether what this host remembers of the database (its caches) may answer reads: on SQLite always (one
        host per data dir); on PostgreSQL while it holds the lease, proven by a write transaction that began less
        than limits.LEASE_PROOF_SECONDS ago and committed (its first statement checked the lease). A host that
        lost the lease without knowing it yet (cut off from the database) stops answering from memory before the
        new holder writes anything (postgres.PgConnection.claim_lease waits longer than that); reads then go to the
        database, which answers or refuses them typed."""
        if not self.dsn:
            return True
        if self.fenced or self.down or self._released:
            return False
        return time.monotonic() - self._proven_at < limits.LEASE_PROOF_SECONDS

    @property
    def dialect(self) -> Dialect:
        """The backend's own statements (host/store/dialect.py)."""
        return cast(Dialect, self.reader.dialect)  # type: ignore[attr-defined]

    async def close(self) -> None:
        if self._thread is not None:
            done = self._loop.create_future() if self._loop else None
            last: Callable[[sqlite3.Connection], Any] = lambda conn: None  # noqa: E731
            if self.epoch is not None and not self.fenced:
                from agenthost.host.store.postgres import PgConnection

                self._released = True  # nothing is answered from memory from here on
                last = PgConnection.release_lease
            self._put(_Job(last, done))
            if done is not None:
                try:
                    await done
                except self.errors as exc:  # the database is gone (PostgreSQL down): stop all the same
                    log.error("the last write batch before closing failed: %r", exc)
            self._jobs.put(_STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @property
    def reader(self) -> sqlite3.Connection:
        assert self._reader is not None, "database is not open"
        return self._reader

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[sqlite3.Row]:
        return self.reader.execute(sql, params).fetchall()

    def query_tuples(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """Plain tuples for hot paths that read columns by position (a Row costs more to build and to index)."""
        cursor = self.reader.cursor()
        cursor.row_factory = None
        return cursor.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> sqlite3.Row | None:
        return self.reader.execute(sql, params).fetchone()

    @property
    def congested(self) -> bool:
        """True while the queue is past a bound; producers should `await backpressure()` before adding more."""
        return self.pending_jobs >= limits.WRITE_QUEUE_MAX_JOBS or self.pending_bytes >= limits.WRITE_QUEUE_MAX_BYTES

    async def backpressure(self) -> None:
        """Returns once the writer queue is below its bounds (at once when it already is)."""
        while self.congested and self._room is not None:
            self._room.clear()
            await self._room.wait()

    def _put(self, job: _Job) -> None:
        with self._count_lock:
            self.pending_jobs += 1
            self.pending_bytes += job.weight
        self._jobs.put(job)

    async def write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        weight: int = 0,
        on_done: Callable[[asyncio.Future[T]], None] | None = None,
    ) -> T:
        """Runs fn(conn) in the next write transaction; returns its result once committed. Waits for room in the
        queue first. `weight` is roughly how many bytes the job writes (it counts toward WRITE_QUEUE_MAX_BYTES).
        `on_done`: called with the job's future once the writer settles it, before any job after it is answered,
        even if this caller stopped waiting (a queued job commits all the same)."""
        assert self._loop is not None, "database is not open"
        if self.congested:
            await self.backpressure()
        future: asyncio.Future[T] = self._loop.create_future()
        self._put(_Job(fn, future, weight))
        if on_done is None:
            return await future
        future.add_done_callback(on_done)
        return await asyncio.shield(future)

    def enqueue(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        *,
        weight: int = 0,
        on_fail: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Queues a write nobody waits for (audit rows, streamed run events); failures are logged, and given to
        `on_fail` on the writer thread, before the next batch runs. Never waits: a producer that can should
        `await backpressure()` between calls."""
        self._put(_Job(fn, None, weight, on_fail))

    def on_rollback(self, undo: Callable[[], None]) -> None:
        """Called by a job on the writer thread: `undo` runs if the transaction it is part of does not commit, so
        a job that took something off a buffer puts it back (the batch may be run again, see _run_batch)."""
        self._undo.append(undo)

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Called by a job on the writer thread: `fn` runs on the writer thread once the transaction it is part of
        has committed, before any caller hears back (nothing, if it does not commit)."""
        self._done.append(fn)

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Calls fn(*args) on the event loop, from the writer thread (nothing, once the loop is closed)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn, *args)

    def charge(self, weight: int) -> None:
        """Counts bytes toward WRITE_QUEUE_MAX_BYTES that ride on a job already queued (a producer that appends to
        its own pending job); the job calls charge(-weight) once it has taken them."""
        with self._count_lock:
            self.pending_bytes += weight

    async def flush(self) -> None:
        """Returns once everything queued before this call is committed."""
        await self.write(lambda conn: None)

    # ---- the writer thread ----

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                first = self._jobs.get()
                if first is _STOP:
                    return
                batch = [first]
                stop = False
                # Nobody waits for these yet: hold the batch open briefly so a stream's next messages share its
                # commit (see limits.WRITE_GROUP_COMMIT_SECONDS). A caller that waits, or a full queue, ends the
                # wait.
                hold_until = 0.0 if first.future is not None else time.monotonic() + limits.WRITE_GROUP_COMMIT_SECONDS
                while len(batch) < 4096:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        left = hold_until - time.monotonic()
                        if left <= 0 or self.congested:
                            break
                        try:
                            job = self._jobs.get(timeout=left)
                        except queue.Empty:
                            break
                    if job is _STOP:
                        stop = True
                        break
                    batch.append(job)
                    if job.future is not None:
                        hold_until = 0.0
                self._run_batch(conn, batch)
                if stop:
                    return
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> None:
        """One transaction for the batch. A transaction PostgreSQL refused as losing a race with another session
        (faults.RETRYABLE_SQLSTATES, anywhere in it, COMMIT included) is rolled back and run again whole, at most
        limits.WRITE_CONFLICT_RETRIES times: its jobs' locks are all released meanwhile, so the other session
        can finish. Jobs are run again from the start; one that consumes a buffer registers an undo (on_rollback)."""
        attempt = 0
        while True:
            try:
                outcomes = self._try_batch(conn, batch)
                break
            except self.errors as exc:
                self._rolled_back(conn)
                if retryable(exc) and attempt < limits.WRITE_CONFLICT_RETRIES:
                    attempt += 1
                    log.warning("write batch of %d conflicted (%s); running it again (%d)", len(batch), exc, attempt)
                    time.sleep(limits.WRITE_CONFLICT_BACKOFF_SECONDS * (2 ** (attempt - 1)) * (0.5 + random.random()))
                    continue
                failure = self._failure(conn, exc, attempt)
                outcomes = [(job.future, False, failure) for job in batch]
                break
        for job, (_, ok, value) in zip(batch, outcomes, strict=True):
            if not ok and job.on_fail is not None:
                job.on_fail(value)
        with self._count_lock:  # before the callers hear back, so a caller never sees its own job still queued
            self.pending_jobs -= len(batch)
            self.pending_bytes -= sum(job.weight for job in batch)
            room = not self.congested
        if room and self._room is not None:
            self.soon(self._room.set)
        if any(f is not None for f, _, _ in outcomes):
            self.soon(_settle, outcomes)

    def _try_batch(self, conn: sqlite3.Connection, batch: list[_Job]) -> list[tuple[Any, bool, Any]]:
        if self.fenced:
            raise LeaseLostError(self.fenced)
        began = time.monotonic()
        pipelined = getattr(conn, "pipelined", None)
        if pipelined is not None and self.pipelining:
            try:
                with pipelined():
                    outcomes, commit = self._transaction(conn, batch, pipelined=True)
                if commit.statusmessage != "COMMIT":
                    # PostgreSQL ends a failed transaction's COMMIT as a ROLLBACK, without an error: never taken
                    # for a commit.
                    raise _Unattributed(f"COMMIT answered {commit.statusmessage!r}")
            except (*self.errors, _Unattributed) as exc:
                if (
                    not isinstance(exc, _Unattributed)
                    and not getattr(exc, "at_begin", False)
                    and (retryable(exc) or getattr(exc, "lease_lost", False) or getattr(conn, "lost", False))
                ):
                    raise  # the whole batch's, as without the pipeline (_run_batch)
                # A statement failed somewhere in the pipeline. The server skipped every statement after it up to
                # the next Sync (COMMIT included: nothing was written), but which job sent it is not known: the
                # batch runs again one statement at a time, which gives the failure to its job alone.
                log.info("pipelined write batch of %d had a failing job (%r); running it again unpipelined",
                         len(batch), exc)  # fmt: skip
                self._rolled_back(conn)
                self.unpipelined += 1
            else:
                return self._committed(outcomes, began)
        return self._committed(self._transaction(conn, batch, pipelined=False)[0], began)

    def _transaction(
        self, conn: sqlite3.Connection, batch: list[_Job], *, pipelined: bool
    ) -> tuple[list[tuple[Any, bool, Any]], Any]:
        """BEGIN, each job in a SAVEPOINT (rolled back to if the job fails), COMMIT. On PostgreSQL without the
        pipeline each statement is a round trip: a job's RELEASE goes with the next job's SAVEPOINT (or the
        COMMIT), one round trip fewer per job; the statements and their order are the same."""
        outcomes: list[tuple[asyncio.Future[Any] | None, bool, Any]] = []
        chained = not pipelined and conn.dialect.chains_statements  # type: ignore[attr-defined]
        held = False  # the last job's savepoint, to be released with the next statement
        conn.execute("BEGIN IMMEDIATE")
        for job in batch:
            conn.execute("RELEASE job; SAVEPOINT job" if held else "SAVEPOINT job")
            held = False
            try:
                result = job.fn(conn)
            except BaseException as exc:  # noqa: BLE001 - a job's failure is its caller's, not the batch's
                if retryable(exc):
                    raise  # the whole transaction lost a race: run it again (_run_batch)
                if pipelined:
                    # The job's own error only if every statement so far succeeded (a database error read here
                    # may be an earlier job's, answered late): else the batch runs again unpipelined.
                    if isinstance(exc, self.errors):
                        raise _Unattributed(repr(exc)) from exc
                    conn.sync()  # type: ignore[attr-defined]
                    if conn.in_error:  # type: ignore[attr-defined]
                        raise _Unattributed(repr(exc)) from exc
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                if job.future is None:
                    log.error("queued write failed: %r", exc)
                outcomes.append((job.future, False, exc))
            else:
                if chained:
                    held = True
                else:
                    conn.execute("RELEASE job")
                outcomes.append((job.future, True, result))
        return outcomes, conn.execute("RELEASE job; COMMIT" if held else "COMMIT")

    def _committed(self, outcomes: list[tuple[Any, bool, Any]], began: float) -> list[tuple[Any, bool, Any]]:
        self._undo.clear()
        self._proven_at = began
        done, self._done = self._done, []
        for fn in done:
            fn()
        self.batches += 1
        if self.down:
            log.warning("the database is reachable again (unreachable since %s)", time.ctime(self.down_since))
            self.down = ""
        return outcomes

    def _rolled_back(self, conn: sqlite3.Connection) -> None:
        """After a failed transaction: rolled back (if the connection still answers), the jobs' undos run."""
        try:
            conn.execute("ROLLBACK")
        except self.errors:
            pass
        self.generation += 1
        self._done.clear()
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            fn()

    def _failure(self, conn: sqlite3.Connection, exc: BaseException, attempts: int) -> BaseException:
        """What the callers of a batch that did not commit get: the typed error of a lost connection or of a
        conflict past its retries, else the error itself. Notes a lost lease or a lost connection."""
        log.error("write batch failed: %r", exc)
        if isinstance(exc, LeaseLostError):  # fenced already: nothing more is written, whatever the connection
            return exc
        if self.epoch is not None and not self.fenced and getattr(exc, "lease_lost", False):
            self.fenced = str(exc)
            if self._on_lease_lost is not None:
                self.soon(self._on_lease_lost, self.fenced)
            return exc
        if retryable(exc):
            return WriteConflict(
                f"the database refused this write as conflicting with another session's ({_reason(exc)}), on each"
                f" of {attempts + 1} attempts; try again"
            )
        if getattr(conn, "lost", False):  # PostgreSQL: the server went away or cannot be reached
            if not self.down:
                self.down_since = time.time()
                log.error("the database is unreachable: %s", _reason(exc))
            self.down = _reason(exc)
            return DatabaseDown(down_message(self.down))
        return exc


def _settle(outcomes: list[tuple[asyncio.Future[Any] | None, bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future is None or future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
