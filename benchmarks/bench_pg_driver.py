"""Which PostgreSQL driver, and sync or async reads: the host's two hot reads timed through each, in one run.

    python benchmarks/bench_pg_driver.py [--calls 3000] [--rounds 5] [--jobs 3000] [--writer-only]

A throwaway cluster (fsync on) over loopback TCP; the reads are the run API's StateGet (one ~1 KiB row by primary
key) and HistoryPage(50) (fifty ~150-byte rows of bytes off an index), as host/store issues them. Sides,
interleaved round by round, medians printed: psycopg 3 with a sync connection used on the event loop (what the host
does), psycopg 3 AsyncConnection awaited on the loop, and asyncpg (if installed) awaited on the loop. Prepared
statements on every side (psycopg prepares a statement on its 5th run; asyncpg always).

Then the same two reads through the host's own stores (on PostgreSQL StateStore.get answers from its cache after
the first read: host/store/state.py) (StateStore.get, Conversations.page_history_encoded) on a
SQLite file and on PostgreSQL over the unix socket and over TCP, rounds interleaved: what a read costs the event loop
on each backend, with nothing else in the process.

Last, the writer on PostgreSQL: queued jobs committed in its batches, rounds alternated between a batch sent
statement by statement (a job's RELEASE sent with the next job's SAVEPOINT, PostgresDialect.chains_statements) and
sent in pipeline mode (Database.pipelining), for one-INSERT jobs and for jobs that also read a row (as a run's event
and transcript writes read their sequence numbers); the writer connection's round trips per job are printed.
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


async def main(calls: int, rounds: int, jobs: int, writer_only: bool = False) -> None:
    found = bindir()
    if found is None:
        raise SystemExit("no PostgreSQL binaries (initdb)")
    cluster = Cluster(found, durable=True)
    cluster.start()
    try:
        if writer_only:
            await writer(cluster, jobs, rounds)
            return
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
        await stores(cluster, calls, rounds)
        await writer(cluster, jobs, rounds)
    finally:
        cluster.stop()


async def stores(cluster: Cluster, calls: int, rounds: int) -> None:
    import tempfile

    from agenthost.host.store.conversations import Conversations, NewItem
    from agenthost.host.store.cursors import CursorCodec
    from agenthost.host.store.db import Database
    from agenthost.host.store.state import StateStore
    from agenthost.protos import common_pb2 as pb

    # One database each: a database takes one host (its writer holds the lease).
    cluster.admin("CREATE DATABASE stores_unix")
    cluster.admin("CREATE DATABASE stores_tcp")
    targets = {
        "SQLite file": Path(tempfile.mkdtemp(prefix="ahbench-")) / "t.db",
        "PostgreSQL, unix socket": cluster.dsn("stores_unix"),
        "PostgreSQL, loopback TCP": cluster.tcp_dsn("stores_tcp"),
    }
    reads: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {}
    dbs = []
    for label, target in targets.items():
        db = Database(target)
        await db.open()
        dbs.append(db)
        state, conv = StateStore(db), Conversations(db, CursorCodec(b"k" * 32))
        if not db.query("SELECT 1 FROM state"):
            await state.set("s", "blob", '"' + "v" * 1000 + '"')
            event = await db.write(
                lambda c: Conversations.insert_event(
                    c, bot_id="b", conversation_id="c", event_type="message.received", source="bench",
                    actor=pb.Actor(actor_type="user", actor_id="u"), text="x", data_json="{}",
                )
            )  # fmt: skip
            items = [NewItem(role="user", item_type="message", text="hello " * 20) for _ in range(60)]
            await db.write(
                lambda c, e=event, conv=conv, items=items: conv.insert_items(
                    c, bot_id="b", conversation_id="c", run_id="r", event_id=e.event_id, items=items
                )
            )
        reads[label] = (
            lambda state=state: state.get("s", "blob"),
            lambda conv=conv: conv.page_history_encoded("b", "c", cursor="", forward=False, limit=50),
        )

    async def wrap(fn: Callable[[], object]) -> object:
        return fn()

    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for label, (get, page) in reads.items():
            results.setdefault((label, "get"), []).append(await timed(calls, lambda get=get: wrap(get)))
            results.setdefault((label, "page"), []).append(await timed(calls, lambda page=page: wrap(page)))
    print(f"\n== the host's stores, one read held on the loop, p50 µs, median (min-max) of {rounds} rounds ==")
    print(f"{'backend':28} {'StateStore.get':>22} {'page of 50':>22}")
    for label in reads:
        cells = []
        for read in ("get", "page"):
            values = results[(label, read)]
            cells.append(f"{statistics.median(values):6.0f} ({min(values):.0f}-{max(values):.0f})")
        print(f"{label:28} {cells[0]:>22} {cells[1]:>22}")
    for db in dbs:
        await db.close()


async def writer(cluster: Cluster, jobs: int, rounds: int) -> None:
    """The writer's throughput on PostgreSQL over loopback TCP: `jobs` queued jobs (a run's 64 deltas are one
    ~3 KiB row), committed in the writer's batches, each job in its savepoint; rounds alternate the batch sent
    statement by statement (RELEASE chained) and in pipeline mode."""
    from agenthost.host.store.db import Database

    cluster.admin("CREATE DATABASE writer")
    db = Database(cluster.tcp_dsn("writer"))
    await db.open()
    conn = await db.write(lambda c: c)
    payload = "x" * 3200
    insert = "INSERT INTO meta(key, value) VALUES (?, ?)"
    insert_read = "INSERT INTO meta(key, value) VALUES (?, ?) RETURNING length(value)"
    kinds = {"one INSERT": False, "an INSERT and a read": True}
    sides = {"statement by statement": False, "pipelined": True}
    results: dict[tuple[str, str], list[float]] = {(k, s): [] for k in kinds for s in sides}
    trips: dict[tuple[str, str], list[float]] = {(k, s): [] for k in kinds for s in sides}
    n = 0
    try:
        for _ in range(rounds):
            for kind, reads in kinds.items():
                for side, pipelined in sides.items():
                    db.pipelining = pipelined
                    before = conn.round_trips
                    t0 = time.perf_counter()
                    for _ in range(jobs):
                        if reads:
                            db.enqueue(lambda c, k=f"k{n}": c.execute(insert_read, (k, payload)).fetchone())
                        else:
                            db.enqueue(lambda c, k=f"k{n}": c.execute(insert, (k, payload)))
                        n += 1
                        if db.congested:
                            await db.backpressure()
                    await db.flush()
                    results[kind, side].append(jobs / (time.perf_counter() - t0))
                    trips[kind, side].append((conn.round_trips - before) / jobs)
    finally:
        db.pipelining = True
        await db.close()
    print(f"\n== the writer on PostgreSQL (TCP, fsync on): {jobs} queued jobs, jobs/s, {rounds} rounds ==")
    for kind in kinds:
        for side in sides:
            values = results[kind, side]
            print(
                f"{kind:22} {side:24} {statistics.median(values):8.0f} ({min(values):.0f}-{max(values):.0f})"
                f"   round trips a job {statistics.median(trips[kind, side]):.3f}"
            )
        ratio = statistics.median(results[kind, "pipelined"]) / statistics.median(
            results[kind, "statement by statement"]
        )
        print(f"{kind:22} ratio of medians, pipelined / statement by statement: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=3000, help="queued write jobs per round of the writer section")
    parser.add_argument("--writer-only", action="store_true", help="only the writer section")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds, args.jobs, args.writer_only))
