"""Enrolled runner workers and their join tokens (host/workers): only hashes of tokens are stored, a token is
consumed in the transaction that checks it, and a worker's row holds the serial of the certificate accepted for it
and, after a renewal, of the one it replaced (accepted until that one expires)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from agenthost.host.store.db import Database
from agenthost.protos.errors import AlreadyExists, NotFound, Unauthenticated


@dataclass(frozen=True)
class WorkerRecord:
    name: str
    pool: str
    serial: str
    enrolled_at: float
    draining: bool
    revoked_at: float | None
    expires_at: float = 0.0  # the accepted certificate's; 0 = not recorded (enrolled before renewal existed)
    previous_serial: str = ""
    previous_expires_at: float = 0.0
    renewed_at: float = 0.0
    # When the accepted certificate was first presented (0: not yet): the replaced one is then retired for good.
    serial_used_at: float = 0.0

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def accepts(self, serial: str, now: float) -> bool:
        """Whether a certificate of this serial is this worker's: the current one, or the one its last renewal
        replaced until that one's expiry (both also expire in the TLS handshake; this holds on a live connection)."""
        if serial == self.serial:
            return not self.expires_at or now < self.expires_at
        return serial == self.previous_serial and now < self.previous_expires_at


class WorkerStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # Every call a worker makes is checked against its row (WorkerHub.identify): read once, then from here.
        # Safe because this host is the only writer of the table (one host per database) and every write goes
        # through this class, which forgets the name before and after it commits.
        self._records: dict[str, WorkerRecord] = {}

    async def add_token(self, token_hash: str, pool: str, expires_at: float) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                "INSERT INTO worker_tokens(token_hash, pool, created_at, expires_at) VALUES (?,?,?,?)",
                (token_hash, pool, time.time(), expires_at),
            )
        )

    async def enrol(self, token_hash: str, name: str, serial: str, expires_at: float) -> WorkerRecord:
        """Consumes the join token and records worker `name` with its certificate's serial, in one transaction (two
        workers presenting one token: one wins). Unauthenticated for a token unknown, used or expired; AlreadyExists
        for a name an enrolled, unrevoked worker holds."""

        def write(conn: sqlite3.Connection) -> WorkerRecord:
            pool = _usable_token(conn, token_hash)
            now = time.time()
            held = conn.execute("SELECT revoked_at FROM workers WHERE name = ?", (name,)).fetchone()
            if held is not None and held["revoked_at"] is None:
                raise AlreadyExists(
                    f"a worker named {name!r} is enrolled; revoke it first (`agenthost workers revoke {name}`) or"
                    " enrol under another name"
                )
            conn.execute(
                "UPDATE worker_tokens SET used_at = ?, used_by = ? WHERE token_hash = ?", (now, name, token_hash)
            )
            conn.execute(
                "INSERT INTO workers(name, pool, serial, enrolled_at, draining, revoked_at, expires_at,"
                " previous_serial, previous_expires_at, renewed_at) VALUES (?,?,?,?,0,NULL,?,'',0,0)"
                " ON CONFLICT(name) DO UPDATE SET pool = excluded.pool, serial = excluded.serial,"
                " enrolled_at = excluded.enrolled_at, draining = 0, revoked_at = NULL,"
                " expires_at = excluded.expires_at, previous_serial = '', previous_expires_at = 0, renewed_at = 0,"
                " serial_used_at = 0",
                (name, pool, serial, now, expires_at),
            )
            return WorkerRecord(name, pool, serial, now, False, None, expires_at)

        self._records.pop(name, None)
        try:
            return await self.db.write(write)
        finally:
            self._records.pop(name, None)

    def check_token(self, token_hash: str) -> str:
        """The pool of a join token that may still be used, read without writing: refuses a token unknown, used
        or expired before the host spends a signature on its request (enrol checks it again, in its transaction)."""
        return _usable_token(self.db.reader, token_hash)

    async def renew(
        self, name: str, presented: str, presented_expires: float, serial: str, expires_at: float
    ) -> WorkerRecord:
        """Records worker `name`'s renewed certificate, in one transaction with the checks: the worker is not
        revoked, and `presented` (the serial the renewing call authenticated with) is still accepted for it. The
        presented certificate stays accepted until it expires (`presented_expires`, read off the certificate: a
        worker enrolled before renewal existed has no expiry recorded); any other earlier one no longer (a worker
        renewing twice from one certificate, its first answer lost, keeps the certificate it holds)."""

        def write(conn: sqlite3.Connection) -> WorkerRecord:
            row = conn.execute("SELECT * FROM workers WHERE name = ?", (name,)).fetchone()
            if row is None or row["revoked_at"] is not None:
                raise Unauthenticated(f"worker {name!r} was revoked; enrol again with a new join token")
            record, now = self._record(row), time.time()
            if not record.accepts(presented, now):
                raise Unauthenticated(f"certificate {presented} is no longer accepted for worker {name!r}")
            if presented != record.serial and record.serial_used_at:
                raise Unauthenticated(
                    f"certificate {presented} of worker {name!r} was replaced by a renewal whose certificate is in use"
                )
            conn.execute(
                "UPDATE workers SET serial = ?, expires_at = ?, previous_serial = ?, previous_expires_at = ?,"
                " renewed_at = ?, serial_used_at = 0 WHERE name = ?",
                (serial, expires_at, presented, presented_expires, now, name),
            )
            return WorkerRecord(
                name, record.pool, serial, record.enrolled_at, record.draining, None,
                expires_at, presented, presented_expires, now,
            )  # fmt: skip

        self._records.pop(name, None)
        try:
            return await self.db.write(write)
        finally:
            self._records.pop(name, None)

    @staticmethod
    def _record(row: sqlite3.Row) -> WorkerRecord:
        return WorkerRecord(
            row["name"],
            row["pool"],
            row["serial"],
            row["enrolled_at"],
            bool(row["draining"]),
            row["revoked_at"],
            row["expires_at"],
            row["previous_serial"],
            row["previous_expires_at"],
            row["renewed_at"],
            row["serial_used_at"],
        )

    def get(self, name: str) -> WorkerRecord | None:
        record = self._records.get(name)
        if record is not None:
            return record
        row = self.db.query_one("SELECT * FROM workers WHERE name = ?", (name,))
        if row is None:
            return None
        record = self._records[name] = self._record(row)
        return record

    def list(self) -> list[WorkerRecord]:
        return [self._record(r) for r in self.db.query("SELECT * FROM workers ORDER BY name")]

    async def mark_in_use(self, name: str, serial: str) -> None:
        """Records that worker `name`'s accepted certificate `serial` was used (once; nothing if it is no longer the
        accepted one): the certificate it replaced is then refused a renewal and a session, after a restart too."""
        await self._update(
            name,
            "UPDATE workers SET serial_used_at = ? WHERE name = ? AND serial = ? AND serial_used_at = 0",
            (time.time(), name, serial),
        )

    async def set_draining(self, name: str, draining: bool) -> WorkerRecord:
        return await self._update(name, "UPDATE workers SET draining = ? WHERE name = ?", (int(draining), name))

    async def revoke(self, name: str) -> WorkerRecord:
        return await self._update(
            name, "UPDATE workers SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (time.time(), name)
        )

    async def _update(self, name: str, sql: str, params: tuple[object, ...]) -> WorkerRecord:
        def write(conn: sqlite3.Connection) -> WorkerRecord:
            conn.execute(sql, params)
            row = conn.execute("SELECT * FROM workers WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no worker named {name!r}; see `agenthost workers list`")
            return self._record(row)

        self._records.pop(name, None)
        try:
            return await self.db.write(write)
        finally:
            self._records.pop(name, None)


def _usable_token(conn: sqlite3.Connection, token_hash: str) -> str:
    row = conn.execute(
        "SELECT pool, expires_at, used_at FROM worker_tokens WHERE token_hash = ?", (token_hash,)
    ).fetchone()
    if row is None:
        raise Unauthenticated("join token is not valid (unknown or forged); make a new one on the host")
    if row["used_at"] is not None:
        raise Unauthenticated("join token was already used (each is single use); make a new one on the host")
    if time.time() > row["expires_at"]:
        raise Unauthenticated("join token has expired; make a new one on the host")
    return str(row["pool"])
