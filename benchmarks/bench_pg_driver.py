"""Which PostgreSQL driver, and sync or async reads: the host's two hot reads timed through each, in one run.

    python benchmarks/bench_pg_driver.py [--calls 3000] [--rounds 5]

A throwaway cluster (fsync on) over loopback TCP; the reads are the run API's StateGet (one ~1 KiB row by primary
key) and HistoryPage(50) (fifty ~150-byte rows of bytes off an index), as host/store issues them. Sides,
interleaved round by round, medians printed: psycopg 3 with a sync connection used on the event loop (what the host
does), psycopg 3 AsyncConnection awaited on the loop, and asyncpg (if installed) awaited on the loop. Prepared
statements on every side (psycopg prepares a statement on its 5th run; asyncpg always).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.pg_cluster import Cluster, bindir  # noqa: E402

STATE = "SELECT value_json, version, updated_at FROM state WHERE scope_key = {} AND key = {}"
PAGE = "SELECT seq, item_pb FROM transcript WHERE conv = {} ORDER BY seq DESC LIMIT 51"


async def timed(calls: int, fn: Callable[[], Awaitable[object]]) -> float:
    for _ in range(100):
        await fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


async def main(calls: int, rounds: int) -> None:
    found = bindir()
    if found is None:
        raise SystemExit("no PostgreSQL binaries (initdb)")
    cluster = Cluster(found, durable=True)
    cluster.start()
    try:
        cluster.admin("CREATE DATABASE bench")
        dsn = cluster.tcp_dsn("bench")
        with psycopg.connect(dsn, autocommit=True) as setup:
            setup.execute(
                "CREATE TABLE state (scope_key TEXT, key TEXT, value_json TEXT, version BIGINT,"
                " updated_at DOUBLE PRECISION, PRIMARY KEY (scope_key, key))"
            )
            setup.execute("INSERT INTO state VALUES ('s', 'blob', %s, 1, 1.0)", ('"' + "v" * 1000 + '"',))
            setup.execute("CREATE TABLE transcript (conv TEXT, seq BIGINT, item_pb BYTEA, PRIMARY KEY (conv, seq))")
            setup.execute(
                "INSERT INTO transcript SELECT 'c', g, decode(repeat('ab', 150), 'hex') FROM generate_series(1, 60) g"
            )
        sync = psycopg.connect(dsn, autocommit=True)
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            import asyncpg

            apg = await asyncpg.connect(dsn)
        except ImportError:
            apg = None

        async def sync_state() -> object:
            return sync.execute(STATE.format("%s", "%s"), ("s", "blob")).fetchone()

        async def sync_page() -> object:
            return sync.execute(PAGE.format("%s"), ("c",)).fetchall()

        async def async_state() -> object:
            return await (await aconn.execute(STATE.format("%s", "%s"), ("s", "blob"))).fetchone()

        async def async_page() -> object:
            return await (await aconn.execute(PAGE.format("%s"), ("c",))).fetchall()

        sides: dict[str, tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[object]]]] = {
            "psycopg sync on the loop": (sync_state, sync_page),
            "psycopg async": (async_state, async_page),
        }
        if apg is not None:
            state_sql, page_sql = STATE.format("$1", "$2"), PAGE.format("$1")
            sides["asyncpg"] = (lambda: apg.fetchrow(state_sql, "s", "blob"), lambda: apg.fetch(page_sql, "c"))
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for side, (state, page) in sides.items():
                results.setdefault((side, "state_get"), []).append(await timed(calls, state))
                results.setdefault((side, "history_page50"), []).append(await timed(calls, page))
        print(f"== one read, p50 µs over {calls} calls, median (min-max) of {rounds} interleaved rounds ==")
        print(f"{'driver':28} {'state_get':>22} {'history_page50':>22}")
        for side in sides:
            cells = []
            for read in ("state_get", "history_page50"):
                values = results[(side, read)]
                cells.append(f"{statistics.median(values):6.0f} ({min(values):.0f}-{max(values):.0f})")
            print(f"{side:28} {cells[0]:>22} {cells[1]:>22}")
        sync.close()
        await aconn.close()
        if apg is not None:
            await apg.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
