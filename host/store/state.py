"""StateStore: JSON values under scoped keys, with versions for optimistic concurrency and hard size caps.

Caps (host/limits.py): one value's bytes, and per scope the number of keys and the total bytes (key + value).
The scope totals live in `state_usage`, maintained by triggers in the same transaction as the write, so a write
that would cross a quota is refused inside the transaction that would have made it: nothing half-written."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from agenthost.host import limits
from agenthost.host.store.db import Database
from agenthost.protos.errors import Aborted, InvalidArgument, ResourceExhausted

MAX_VALUE_BYTES = limits.STATE_MAX_VALUE_BYTES  # kept for importers; checks read limits at call time
MAX_KEY_CHARS = 256
MAX_LIST = 100
T = TypeVar("T")
# Keys are dotted/slashed identifiers: no control characters, no whitespace at the ends, nothing empty.
_KEY = re.compile(r"^[A-Za-z0-9_.:/@-][A-Za-z0-9_.:/@ -]*$")


@dataclass(frozen=True)
class StoredValue:
    value_json: str
    version: int
    updated_at: float


def check_key(key: str) -> None:
    if not key:
        raise InvalidArgument("state key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidArgument(f"state key is longer than {MAX_KEY_CHARS} characters")
    if not _KEY.match(key) or key != key.strip():
        raise InvalidArgument("state key may contain only letters, digits, space and _ . : / @ -")


def check_value(value_json: str) -> str:
    """Validates and normalises a JSON value; the size cap is on the encoded bytes."""
    cap = limits.STATE_MAX_VALUE_BYTES
    if len(value_json.encode()) > cap:
        raise ResourceExhausted(f"state value is larger than STATE_MAX_VALUE_BYTES = {cap} bytes")
    parse_json(value_json, "state value")
    return value_json


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str, what: str) -> object:
    """Strict JSON (no NaN/Infinity); nesting deep enough to exhaust the parser's recursion is refused too."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidArgument(f"{what} is not valid JSON: {reason}") from None


def _check_quota(conn: sqlite3.Connection, scope_key: str, *, new_keys: int, new_bytes: int) -> None:
    """Writer-thread half of a set: refuses a write that would take its scope past a quota. A write that shrinks
    a scope (or keeps it the same) always passes, so a full scope can still be cleaned up."""
    usage = conn.execute("SELECT n_keys, n_bytes FROM state_usage WHERE scope_key = ?", (scope_key,)).fetchone()
    keys, total = (usage[0], usage[1]) if usage else (0, 0)
    scope = scope_key.split("\x1f", 1)[0]
    if new_keys > 0 and keys + new_keys > limits.STATE_MAX_KEYS_PER_SCOPE:
        raise ResourceExhausted(
            f"the {scope} state scope holds {keys} keys; STATE_MAX_KEYS_PER_SCOPE is"
            f" {limits.STATE_MAX_KEYS_PER_SCOPE} (delete keys to make room)"
        )
    if new_bytes > 0 and total + new_bytes > limits.STATE_MAX_BYTES_PER_SCOPE:
        raise ResourceExhausted(
            f"the {scope} state scope holds {total} bytes and this write adds {new_bytes};"
            f" STATE_MAX_BYTES_PER_SCOPE is {limits.STATE_MAX_BYTES_PER_SCOPE} bytes"
        )


# What the PostgreSQL read cache holds at most (values are capped at STATE_MAX_VALUE_BYTES each).
CACHE_MAX_ENTRIES = 4096
CACHE_MAX_BYTES = 16 * 1024 * 1024
_ABSENT = object()


class _ReadCache:
    """Values by (scope_key, key), None for a key known absent; least recently used dropped past the caps."""

    def __init__(self) -> None:
        self._values: OrderedDict[tuple[str, str], StoredValue | None] = OrderedDict()
        self.bytes = 0

    def get(self, k: tuple[str, str]) -> StoredValue | None | object:
        value = self._values.get(k, _ABSENT)
        if value is not _ABSENT:
            self._values.move_to_end(k)
        return value

    def put(self, k: tuple[str, str], value: StoredValue | None) -> None:
        self.forget(k)
        self._values[k] = value
        self.bytes += _size(k, value)
        while len(self._values) > CACHE_MAX_ENTRIES or self.bytes > CACHE_MAX_BYTES:
            old, dropped = self._values.popitem(last=False)
            self.bytes -= _size(old, dropped)

    def forget(self, k: tuple[str, str]) -> None:
        if k in self._values:
            self.bytes -= _size(k, self._values.pop(k))

    def clear(self) -> None:
        self._values.clear()
        self.bytes = 0


def _size(k: tuple[str, str], value: StoredValue | None) -> int:
    return len(k[0]) + len(k[1]) + (len(value.value_json) if value else 0) + 64


class StateStore:
    """On PostgreSQL, reads of single keys are answered from what this host last read or wrote: a read there is a
    round trip to another process (on a loaded machine ~0.3 ms, against SQLite's ~6 µs in process), and the host
    holding the lease is its database's only writer (every write transaction is fenced by the lease epoch), so
    nothing else changes a row under it. A write updates the cache once its COMMIT is acknowledged, and a write
    that failed forgets its key (a COMMIT whose answer was lost may have happened). The cache answers only while the
    lease is proven (Database.proven: a host cut off from the database stops before the next holder writes); while
    the database is down or the lease is lost it is emptied. Reads then go to the database, which answers them or
    refuses them typed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: _ReadCache | None = _ReadCache() if db.dsn else None

    def _cached(self) -> _ReadCache | None:
        cache = self._cache
        if cache is not None and not self.db.proven:
            if self.db.down or self.db.fenced:
                cache.clear()
            return None
        return cache

    def get(self, scope_key: str, key: str) -> StoredValue | None:
        cache = self._cached()
        if cache is not None:
            hit = cache.get((scope_key, key))
            if hit is not _ABSENT:
                return cast("StoredValue | None", hit)
        row = self.db.query_one(
            "SELECT value_json, version, updated_at FROM state WHERE scope_key = ? AND key = ?", (scope_key, key)
        )
        value = StoredValue(row[0], row[1], row[2]) if row else None
        if cache is not None:
            cache.put((scope_key, key), value)
        return value

    def _learn(
        self, k: tuple[str, str], outcome: Callable[[T], StoredValue | None]
    ) -> Callable[[asyncio.Future[T]], None] | None:
        """What the cache does when a write of key `k` is settled by the writer (Database.write's `on_done`)."""
        cache = self._cache
        if cache is None:
            return None

        def learn(done: asyncio.Future[T]) -> None:
            if done.cancelled() or done.exception() is not None:
                cache.forget(k)  # a COMMIT whose answer was lost may have happened: read it again
            else:
                cache.put(k, outcome(done.result()))

        return learn

    def snapshot(self, scope_key: str, limit: int = 200) -> dict[str, object]:
        rows = self.db.query(
            "SELECT key, value_json FROM state WHERE scope_key = ? ORDER BY key LIMIT ?", (scope_key, limit)
        )
        return {r[0]: json.loads(r[1]) for r in rows}

    async def set(self, scope_key: str, key: str, value_json: str, if_version: int | None = None) -> StoredValue:
        check_key(key)
        check_value(value_json)

        size = len(key.encode()) + len(value_json.encode())

        def write(conn: sqlite3.Connection) -> StoredValue:
            row = conn.execute(
                "SELECT version, length(CAST(key AS BLOB)) + length(CAST(value_json AS BLOB)) FROM state"
                " WHERE scope_key = ? AND key = ?",
                (scope_key, key),
            ).fetchone()
            current = row[0] if row else 0
            if if_version is not None and if_version != current:
                raise Aborted(f"state {key!r} is at version {current}, not {if_version}")
            _check_quota(conn, scope_key, new_keys=0 if row else 1, new_bytes=size - (row[1] if row else 0))
            now = time.time()
            conn.execute(
                "INSERT INTO state(scope_key, key, value_json, version, updated_at) VALUES (?,?,?,?,?)"
                " ON CONFLICT(scope_key, key) DO UPDATE SET value_json = excluded.value_json,"
                " version = excluded.version, updated_at = excluded.updated_at",
                (scope_key, key, value_json, current + 1, now),
            )
            return StoredValue(value_json, current + 1, now)

        return await self.db.write(write, on_done=self._learn((scope_key, key), lambda stored: stored))

    async def delete(self, scope_key: str, key: str) -> bool:
        check_key(key)
        return await self.db.write(
            lambda conn: (
                conn.execute("DELETE FROM state WHERE scope_key = ? AND key = ?", (scope_key, key)).rowcount > 0
            ),
            on_done=self._learn((scope_key, key), lambda _: None),
        )

    def list(self, scope_key: str, prefix: str, after: str, limit: int) -> tuple[list[str], bool]:
        # Range scan instead of LIKE so '%' and '_' in a prefix are literal.
        params: list[object] = [scope_key, max(prefix, after) if after else prefix]
        op = ">" if after and after >= prefix else ">="
        upper = ""
        if prefix:
            upper = " AND key < ?"
            params.append(prefix + "\U0010ffff")
        rows = self.db.query(
            f"SELECT key FROM state WHERE scope_key = ? AND key {op} ?{upper} ORDER BY key LIMIT ?",
            (*params, limit + 1),
        )
        keys = [r[0] for r in rows]
        return keys[:limit], len(keys) > limit
