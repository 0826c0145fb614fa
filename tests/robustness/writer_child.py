"""Child process for test_crash_durability: writes through the real agenthost.host.store.db.Database and prints one ack
line after each awaited write, until the parent kills it with SIGKILL.

    python writer_child.py DB_PATH FIRST_ID
    python writer_child.py --zygote      # the test's way: one interpreter, a forked writer per kill

A zygote has imported everything (an interpreter and these imports cost ~0.3 s; a fork costs milliseconds) and forks
one writer per request, so each kill lands in the writer's own work (open, migrations, schema, writes) rather than
mostly in interpreter start-up. It stays single-threaded (the database's writer thread starts only in a forked
writer), so forking it is safe. Protocol on its stdin/stdout, one request at a time: the test sends the writer's
ack pipe (SCM_RIGHTS) with "DB_PATH FIRST_ID"; the zygote answers the writer's pid, then, once the writer died,
its wait status.

Writes per item n (several items in flight at once, so group commit batches them):
  state     StateStore.set on key k<n>                       → "ack state <n> <version>"
  queued    ledger row n inserted as queued                   → "ack queued <n>"
  running   ledger row n queued → running                     → "ack running <n>"
  completed ledger row n running → completed, counter += 1    → "ack completed <n>"   (one job)
plus unawaited audit-like rows (enqueue) that are never acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agenthost.host.store.db import Database  # noqa: E402
from agenthost.host.store.state import StateStore  # noqa: E402

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS crash_ledger (id INTEGER PRIMARY KEY, status TEXT NOT NULL"
    " CHECK (status IN ('queued', 'running', 'completed')), payload TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS crash_counter (k INTEGER PRIMARY KEY CHECK (k = 0), completed INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO crash_counter VALUES (0, 0)",
]


def ack(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def transition(conn, n: int, src: str, dst: str) -> None:  # noqa: ANN001
    cur = conn.execute("UPDATE crash_ledger SET status = ? WHERE id = ? AND status = ?", (dst, n, src))
    if cur.rowcount != 1:
        raise RuntimeError(f"illegal transition of {n}: {src} -> {dst}")
    if dst == "completed":
        conn.execute("UPDATE crash_counter SET completed = completed + 1 WHERE k = 0")


async def item(db: Database, state: StateStore, n: int) -> None:
    payload = f"payload {n} " + "x" * (n % 700)
    stored = await state.set("crash", f"k{n}", f'"{payload}"')
    ack(f"ack state {n} {stored.version}")
    await db.write(lambda c: c.execute("INSERT INTO crash_ledger VALUES (?, 'queued', ?)", (n, payload)))
    ack(f"ack queued {n}")
    await db.write(lambda c: transition(c, n, "queued", "running"))
    ack(f"ack running {n}")
    db.enqueue(
        lambda c: c.execute(
            "INSERT INTO audit(at, run_id, plugin_id, method, outcome, detail) VALUES (0, ?, '', 'crash', 'OK', '')",
            (str(n),),
        )
    )
    await db.write(lambda c: transition(c, n, "running", "completed"))
    ack(f"ack completed {n}")


async def main(path: str, first: int) -> None:
    ack("opening")  # not an ack: tells the test that a kill before "ready" landed in open, migrations or schema
    db = Database(Path(path))
    await db.open()
    for sql in SCHEMA:
        await db.write(lambda c, sql=sql: c.execute(sql))
    state = StateStore(db)
    ack("ready")
    n = first
    while True:
        await asyncio.gather(*(item(db, state, n + i) for i in range(6)))
        n += 6


def zygote(sock: socket.socket) -> None:
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        if not msg:
            return  # the test is done
        path, first = msg.decode().split()
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                os.dup2(fds[0], 1)  # acks and any traceback go to the test's pipe
                os.dup2(fds[0], 2)
                os.close(fds[0])
                asyncio.run(main(path, int(first)))
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(1)  # never back into the zygote's loop
        os.close(fds[0])
        sock.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        sock.sendall(f"{status}\n".encode())


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote(socket.socket(fileno=0))
    else:
        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
