"""B7 #13: kill -9 a writer process at random points, many times; on every reopen the database passes
`PRAGMA integrity_check`, every acknowledged write is present, and the ledger's state machine is intact.

The writer is the real agenthost.host.store.db.Database (writer thread, group commit, WAL, synchronous=FULL) in a child
process that prints an ack line only after each awaited write returned.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CHILD = Path(__file__).with_name("writer_child.py")
ITERATIONS = int(os.environ.get("AGENTHOST_CRASH_ITERATIONS", "200"))


def check(db: Path, acks: dict[str, dict[int, int]]) -> None:
    conn = sqlite3.connect(db, isolation_level=None)  # read-write: replays the WAL like the next host would
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        if conn.execute("SELECT name FROM sqlite_master WHERE name = 'crash_ledger'").fetchone() is None:
            assert not any(acks.values())
            return
        status = dict(conn.execute("SELECT id, status FROM crash_ledger"))
        versions = {int(k[1:]): v for k, v in conn.execute("SELECT key, version FROM state WHERE scope_key = 'crash'")}
        for n, version in acks["state"].items():
            assert versions.get(n, 0) >= version, f"acknowledged state write k{n} lost"
        for n in acks["queued"]:
            assert n in status, f"acknowledged ledger row {n} lost"
        for n in acks["running"]:
            assert status.get(n) in ("running", "completed"), f"acknowledged transition of {n} lost"
        for n in acks["completed"]:
            assert status.get(n) == "completed", f"acknowledged completion of {n} lost"
        completed = sum(1 for s in status.values() if s == "completed")
        counter = conn.execute("SELECT completed FROM crash_counter").fetchone()
        assert counter is not None and counter[0] == completed, "counter and ledger disagree (torn transaction)"
        assert set(status) <= set(versions), "a ledger row without its state write (order violated)"
    finally:
        conn.close()


def test_kill9_writer_at_random_points(tmp_path):
    db = tmp_path / "agenthost.db"
    rng = random.Random(int(os.environ.get("AGENTHOST_CRASH_SEED", "0")) or None)
    total_acks = kills_before_ready = 0
    for i in range(ITERATIONS):
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(db), str((i + 1) * 1_000_000)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = False
        try:
            if rng.random() < 0.1:
                time.sleep(rng.uniform(0, 0.12))  # somewhere in startup: open, migrations, schema
            else:
                first = proc.stdout.readline()
                assert first == "ready\n", first + proc.stderr.read()
                ready = True
                time.sleep(rng.uniform(0, 0.08))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL, err[-2000:]
        acks: dict[str, dict[int, int]] = {"state": {}, "queued": {}, "running": {}, "completed": {}}
        lines = out.splitlines()
        if not ready and "ready" not in lines:
            kills_before_ready += 1
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "ack":  # a torn last line is simply not an ack
                if parts[1] == "state" and len(parts) == 4:
                    acks["state"][int(parts[2])] = int(parts[3])
                elif parts[1] in acks and len(parts) == 3:
                    acks[parts[1]][int(parts[2])] = 1
        total_acks += sum(len(v) for v in acks.values())
        check(db, acks)
    assert total_acks > ITERATIONS, "the writer hardly wrote anything before being killed"
    print(f"{ITERATIONS} kills, {total_acks} acknowledged writes verified, {kills_before_ready} during startup")
