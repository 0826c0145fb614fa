"""Database faults on PostgreSQL (docs/operating/postgresql.md, "When the database is not there"), each with its
observed outcome: a real `agenthost serve` on a throwaway cluster of the test's own (tests/pg_cluster.py), stopped
with `pg_ctl stop -m immediate` and started again while runs stream; a deadlock provoked by a second session
holding a row lock. No mock database anywhere.

The contract: a run whose events or end cannot be written fails `database_unavailable` and its client hears so;
reads and sends while the database is down are refused UNAVAILABLE (never answered from anything else), `status`
answers and says the database is unreachable; when the server is back the host reconnects by itself and the next
message runs; nothing acknowledged is lost (an acknowledged send's run is there, ended as its client was told)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.protos.errors import AgentHostError
from tests.cli_process import cli_env
from tests.pg_cluster import Cluster
from tests.test_e2e_cli import FAULTY, cli
from tests.test_standby import serving, wait_for

DOWN = "UNREACHABLE"


@pytest.fixture
def host_env(tmp_path: Path, own_pg_cluster: Cluster) -> dict[str, str]:
    return {**cli_env(tmp_path / "home"), "AGENTHOST_DATABASE_URL": own_pg_cluster.dsn()}


@pytest.fixture
def host(host_env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """`agenthost serve`, its output to a file (a pipe nobody reads would block a host logging an outage), with the
    faulty runner bound to bot `slow`."""
    with (tmp_path / "serve.log").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost.host.cli", "serve"], env=host_env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for("the host serving", lambda: serving(host_env), proc, timeout=120)  # type: ignore[arg-type]
        cli(host_env, "plugins", "install", FAULTY, "--offline")
        cli(host_env, "bots", "create", "slow")
        cli(host_env, "bots", "bind", "slow", "--runner", "agenthost-faulty/faulty")
        yield proc  # type: ignore[misc]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def db_runs(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """run id -> (status, error_code), read by the test's own connection."""
    import psycopg

    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT run_id, status, error_code FROM runs")}


def status_line(env: dict[str, str]) -> str:
    out = cli(env, "status", timeout=60)
    return next(line for line in out.stdout.splitlines() if "database:" in line)


async def follow(home: Path, text: str, conversation: str, started: asyncio.Event | None = None) -> Any:
    """One send followed to its end: ("acked", RunInfo at run_finished) or ("refused", status code, details) when
    the send itself was refused; `started` is set once the run has streamed a delta."""
    from agenthost.host.api.client import HostClient
    from agenthost.protos import host_pb2 as hpb

    request = hpb.SendMessageRequest(bot="slow", text=text, conversation_id=conversation)
    acked = False
    try:
        async with HostClient.for_data_dir(home, timeout=60) as client:
            async for reply in client.stream(request, timeout=600):
                kind = reply.WhichOneof("kind")
                acked = acked or kind in ("queued", "run_started", "run_finished")
                if kind == "events" and started is not None:
                    started.set()
                if kind == "run_finished":
                    return ("acked", reply.run_finished)
    except AgentHostError as exc:  # the client's typed form of the call's status
        return ("broken" if acked else "refused", exc.code, exc.message)
    return ("broken", None, "the stream ended without run_finished")


async def all_streaming(started: list[asyncio.Event], runs: list[asyncio.Future[Any]], timeout: float) -> None:
    """Returns once every run has streamed; fails at once if one ended before (with what it ended with)."""
    waiting = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in started)))
    done, _ = await asyncio.wait([waiting, *runs], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        waiting.cancel()
        ended = [r.result() if not r.exception() else r.exception() for r in done]
        raise AssertionError(f"not every run streaming within {timeout} s; ended: {ended}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_database_stopped_mid_run_fails_runs_typed_and_the_host_recovers_when_it_is_back(
    host: subprocess.Popen[str], host_env: dict[str, str], own_pg_cluster: Cluster
) -> None:
    home = Path(host_env["AGENTHOST_HOME"])
    assert "ok: before" in cli(host_env, "send", "slow", "before").stdout  # acknowledged: must survive
    n = 6

    async def main() -> list[Any]:
        started = [asyncio.Event() for _ in range(n)]
        runs = [asyncio.ensure_future(follow(home, "stream", f"s{i}", started[i])) for i in range(n)]
        await all_streaming(started, runs, 120)
        await asyncio.to_thread(own_pg_cluster.stop_server)
        return await asyncio.wait_for(asyncio.gather(*runs), 180)

    ended = asyncio.run(main())
    # Every streaming run ended, failed with the typed code, and its client was told so.
    assert all(e[0] == "acked" for e in ended), ended
    assert {(e[1].status, e[1].error_code) for e in ended} == {("failed", "database_unavailable")}, ended
    assert "database is unreachable" in ended[0][1].error_message
    # The host keeps answering what it can: status, saying the database is down; reads and sends are refused.
    assert DOWN in status_line(host_env)
    for args in (("history", "slow"), ("runs", "list"), ("send", "slow", "during")):
        out = cli(host_env, *args, check=False, timeout=60)
        assert out.returncode != 0 and "UNAVAILABLE" in out.stderr and "database is unreachable" in out.stderr, (
            args,
            out.stderr,
        )
    assert host.poll() is None

    own_pg_cluster.start_server()
    wait_for("the database back in status", lambda: DOWN not in status_line(host_env), host, timeout=120)
    assert "ok: after" in cli(host_env, "send", "slow", "after").stdout  # no restart: the next message runs
    # The ends the outage kept from being written are written now; nothing acknowledged was lost.
    ids = {e[1].run_id for e in ended}
    try:
        wait_for(
            "the failed runs' ends recorded",
            lambda: all(db_runs(own_pg_cluster).get(i) == ("failed", "database_unavailable") for i in ids),
            host,
            timeout=120,
        )
    except AssertionError:
        raise AssertionError(f"recorded: {[db_runs(own_pg_cluster).get(i) for i in ids]}") from None
    history = cli(host_env, "history", "slow").stdout
    assert "[user] before" in history and "ok: before" in history and "[user] after" in history
    assert "during" not in history
    assert sorted(s for s, _ in db_runs(own_pg_cluster).values()) == ["completed"] * 2 + ["failed"] * n


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_database_restarted_under_load_loses_nothing_acknowledged(
    host: subprocess.Popen[str], host_env: dict[str, str], own_pg_cluster: Cluster
) -> None:
    """PGFAULT_RUNS runs (default 100) streaming, plus a sender that keeps sending short messages while the server
    is stopped and started again: outcomes counted; every acknowledged send's run is recorded as its client was told."""
    home = Path(host_env["AGENTHOST_HOME"])
    n = int(os.environ.get("PGFAULT_RUNS", "100"))

    async def main() -> tuple[list[Any], list[Any]]:
        started = [asyncio.Event() for _ in range(n)]
        # 600 deltas 50 ms apart: each run writes all through the outage.
        runs = [asyncio.ensure_future(follow(home, "load 600 50", f"l{i}", started[i])) for i in range(n)]
        await all_streaming(started, runs, 300)
        probes: list[asyncio.Future[Any]] = []
        restarted = threading.Event()

        def restart() -> None:
            own_pg_cluster.stop_server()
            time.sleep(1)  # the outage every probe in it meets; the restart itself takes longer under load
            own_pg_cluster.start_server()
            restarted.set()

        restarting = asyncio.ensure_future(asyncio.to_thread(restart))
        while not restarted.is_set():
            probes.append(asyncio.ensure_future(follow(home, f"probe {len(probes)}", f"p{len(probes)}")))
            await asyncio.sleep(0.1)
        await restarting
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # then one at a time, until one runs (no host restart in between)
            probes.append(asyncio.ensure_future(follow(home, f"probe {len(probes)}", f"p{len(probes)}")))
            last = await probes[-1]
            if last[0] == "acked" and last[1].status == "completed":
                break
            await asyncio.sleep(0.2)
        return await asyncio.wait_for(asyncio.gather(*runs), 600), await asyncio.wait_for(asyncio.gather(*probes), 300)

    began = time.monotonic()
    ended, probes = asyncio.run(main())
    outcomes = collections.Counter(
        (e[1].status, e[1].error_code) if e[0] == "acked" else (e[0], e[1].name) for e in ended + probes
    )
    print(f"{n} runs + {len(probes)} probes in {time.monotonic() - began:.1f} s: {dict(outcomes)}")
    assert all(e[0] in ("acked", "refused") for e in ended + probes), outcomes  # no stream broke untold
    # Refused sends were refused typed, saying why; the streaming runs were all caught by the outage.
    for e in ended + probes:
        if e[0] == "refused":
            assert e[1] == grpc.StatusCode.UNAVAILABLE and "database is unreachable" in e[2], e
    assert all(e[0] == "acked" for e in ended)
    assert {(e[1].status, e[1].error_code) for e in ended} == {("failed", "database_unavailable")}, outcomes
    told = {e[1].run_id: (e[1].status, e[1].error_code) for e in ended + probes if e[0] == "acked"}
    assert any(s == ("completed", "") for s in told.values())  # probes after the restart ran

    def recorded() -> bool:
        rows = db_runs(own_pg_cluster)
        return all(rows.get(run_id) == outcome for run_id, outcome in told.items())

    wait_for("every acknowledged run recorded as its client was told", recorded, host, timeout=300)
    assert all(s not in ("queued", "running") for s, _ in db_runs(own_pg_cluster).values())
    assert "ok: after" in cli(host_env, "send", "slow", "after").stdout


# ---- a transaction that loses a race with another session, provoked for real on the shared cluster ----


def test_a_deadlock_with_another_session_is_run_again_and_the_writes_succeed(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A second session holds a row the host's writer wants, then asks for the lease row every write transaction
    holds FOR SHARE (the fence): a real deadlock, which the server breaks by failing the host's transaction (its
    deadlock_timeout is the shorter). The store runs the whole batch again once the other session could finish: the
    awaited write succeeds, and so does a queued job of the same batch that had taken a buffer (put back by its
    undo, then taken again)."""
    import psycopg

    from tests.test_standby import _open, new_query

    async def main() -> None:
        db = await _open(pg_dsn)
        try:
            await db.write(lambda c: c.execute("INSERT INTO meta(key, value) VALUES ('row', 'v0')"))
            other = psycopg.connect(pg_dsn, autocommit=True)
            other.execute("SET deadlock_timeout = '30s'")  # the host's session detects the deadlock, not this one
            other.execute("BEGIN")
            other.execute("UPDATE meta SET value = 'other' WHERE key = 'row'")
            buffer = ["a", "b"]
            attempts = 0

            def take(conn: Any) -> None:
                taken = buffer[:]
                buffer.clear()

                def put_back() -> None:
                    buffer[:0] = taken

                db.on_rollback(put_back)
                for key in taken:
                    conn.execute("INSERT INTO meta(key, value) VALUES (?, 'x')", (f"buffered-{key}",))

            def update(conn: Any) -> None:
                nonlocal attempts
                attempts += 1
                conn.execute("UPDATE meta SET value = 'host' WHERE key = 'row'")

            db.enqueue(take)
            write = asyncio.ensure_future(db.write(update))
            waiting = (
                "SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted"
                " AND a.datname = current_database() AND a.application_name LIKE 'agenthost-writer %'"
            )
            await asyncio.to_thread(lambda: wait_for("the writer blocked", lambda: bool(new_query(pg_dsn, waiting))))
            # Returns once the server has failed the host's transaction (the deadlock) and it rolled back.
            await asyncio.to_thread(other.execute, "UPDATE lease SET heartbeat_at = heartbeat_at + 1 WHERE id = 1")
            other.execute("COMMIT")
            other.close()
            await asyncio.wait_for(write, 60)
            assert attempts >= 2
            rows = dict(new_query(pg_dsn, "SELECT key, value FROM meta WHERE key LIKE 'row' OR key LIKE 'buffered-%'"))
            assert rows == {"row": "host", "buffered-a": "x", "buffered-b": "x"}
        finally:
            await db.close()

    with caplog.at_level(logging.WARNING, logger="agenthost.host.store.db"):
        asyncio.run(main())
    assert "deadlock detected" in caplog.text and "running it again (1)" in caplog.text


def test_a_write_that_keeps_conflicting_fails_typed_after_its_retries(pg_dsn: str) -> None:
    """A job whose transaction the server fails with SQLSTATE 40001 every time: run 1 + WRITE_CONFLICT_RETRIES
    times, then its caller gets WriteConflict (ABORTED), saying why; the next write goes through."""
    from agenthost.host import limits
    from agenthost.host.store.faults import WriteConflict
    from tests.test_standby import _open

    async def main() -> None:
        db = await _open(pg_dsn)
        attempts = 0

        def conflicting(conn: Any) -> None:
            nonlocal attempts
            attempts += 1
            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'forced' USING ERRCODE = 'serialization_failure'; END $$")

        try:
            with pytest.raises(WriteConflict, match="conflicting .* on each of 6 attempts") as raised:
                await db.write(conflicting)
            assert raised.value.code == grpc.StatusCode.ABORTED
            assert attempts == 1 + limits.WRITE_CONFLICT_RETRIES
            await db.write(lambda c: c.execute("INSERT INTO meta(key, value) VALUES ('after', 'x')"))
        finally:
            await db.close()

    asyncio.run(main())
