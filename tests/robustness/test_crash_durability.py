"""B7 #13: kill -9 a writer process at random points, many times; on every reopen the database passes
`PRAGMA integrity_check`, every acknowledged write is present, and the ledger's state machine is intact.

The writer is the real agenthost.host.store.db.Database (writer thread, group commit, WAL, synchronous=FULL) in a child
process that prints an ack line only after each awaited write returned. Each writer is forked from a zygote that has
already imported it, so a kill costs milliseconds rather than an interpreter start, and a startup kill lands in the
writer's open, migrations or schema (aimed at the last writer's measured start-up) rather than in Python's imports.
"""

from __future__ import annotations

import os
import random
import signal
import socket
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


@pytest.fixture
def zygote():
    """The writer's zygote (writer_child.py --zygote) and our end of its socket; killed at the end."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "--zygote"], stdin=theirs, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    theirs.close()
    ours.settimeout(30)
    replies = ours.makefile("r")
    try:
        yield ours, replies
    finally:
        replies.close()
        ours.close()  # the zygote's loop ends on EOF
        try:
            proc.wait(timeout=10)
        finally:
            proc.kill()
            proc.communicate()


def test_kill9_writer_at_random_points(tmp_path, zygote):
    sock, replies = zygote
    db = tmp_path / "agenthost.db"
    rng = random.Random(int(os.environ.get("AGENTHOST_CRASH_SEED", "0")) or None)
    total_acks = kills_before_ready = kills_in_open = 0
    startup_s = 0.05  # how long the last writer took from its fork to "ready": the window a startup kill aims at
    for i in range(ITERATIONS):
        read_end, write_end = os.pipe()
        socket.send_fds(sock, [f"{db} {(i + 1) * 1_000_000}".encode()], [write_end])
        os.close(write_end)  # the writer holds the only write end: its death is our EOF
        with os.fdopen(read_end) as acks_pipe:
            pid = int(replies.readline())
            forked = time.monotonic()
            ready = False
            try:
                if rng.random() < 0.1:
                    time.sleep(rng.uniform(0, startup_s))  # somewhere in startup: open, migrations, schema
                else:
                    first = acks_pipe.readline() + acks_pipe.readline()
                    assert first == "opening\nready\n", first + acks_pipe.read()
                    startup_s = time.monotonic() - forked
                    ready = True
                    time.sleep(rng.uniform(0, 0.08))
            finally:
                os.kill(pid, signal.SIGKILL)
                status = int(replies.readline())
            out = acks_pipe.read()
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, out[-2000:]
        acks: dict[str, dict[int, int]] = {"state": {}, "queued": {}, "running": {}, "completed": {}}
        lines = out.splitlines()
        if not ready and "ready" not in lines:
            kills_before_ready += 1
            kills_in_open += "opening" in lines
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
    print(
        f"{ITERATIONS} kills, {total_acks} acknowledged writes verified, {kills_before_ready} during startup"
        f" ({kills_in_open} of them in open, migrations or schema)"
    )
