"""How long a standby host takes to take over from an active host killed -9, against a cold restart of that host.

    python benchmarks/bench_failover.py [--rounds 5]

A throwaway PostgreSQL cluster (fsync on); two data dirs, one database; real `agenthost serve` processes. Each round,
interleaved: (failover) a `serve --standby` waits on the database held by the active host, which is killed -9;
(restart, the baseline: what one gets without a standby) the host now active is killed -9 and `serve` is started
again on its data dir at once. Per side, from the kill: `lease`, the new host holds the database's lease (the lease
row's acquired_at); `serving`, its admin socket accepts clients (host.json names the new pid); `answered`, a
`agenthost send` to the built-in local agent has its reply (the CLI's own start, ~0.5 s, included). Medians and
maxima printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.pg_cluster import Cluster, bindir  # noqa: E402

CLI = [sys.executable, "-m", "agenthost.host.cli"]


def env_for(home: Path, dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST"))}
    return {**env, "AGENTHOST_HOME": str(home), "AGENTHOST_DATABASE_URL": dsn}


def serve(env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, "serve", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def until(check, timeout: float = 120.0) -> float:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return time.time()
        time.sleep(0.01)
    raise SystemExit("timed out")


def serves(home: Path, pid: int) -> bool:
    try:
        return int(json.loads((home / "host.json").read_text())["pid"]) == pid
    except (OSError, ValueError, KeyError):
        return False


def answered(env: dict[str, str]) -> bool:
    out = subprocess.run([*CLI, "send", "agent", "ping"], env=env, capture_output=True, text=True, timeout=120)
    return out.returncode == 0 and "offline demo model" in out.stdout


def measure(new: subprocess.Popen[bytes], home: Path, env: dict[str, str], dsn: str, killed: float) -> list[float]:
    serving = until(lambda: serves(home, new.pid))
    done = until(lambda: answered(env))
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT acquired_at FROM lease").fetchone()
    assert row is not None
    return [float(row[0]) - killed, serving - killed, done - killed]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    found = bindir()
    if found is None:
        raise SystemExit("no PostgreSQL binaries (initdb)")
    cluster = Cluster(found, durable=True)
    work = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster.start()
        cluster.admin("CREATE DATABASE failover")
        dsn = cluster.dsn("failover")
        homes = [work / "a", work / "b"]
        envs = [env_for(h, dsn) for h in homes]
        active = serve(envs[0])
        procs.append(active)
        until(lambda: serves(homes[0], active.pid))
        subprocess.run([*CLI, "bots", "create", "agent"], env=envs[0], check=True, capture_output=True)
        subprocess.run(
            [*CLI, "bots", "bind", "agent", "--runner", "agenthost/local-agent"],
            env=envs[0],
            check=True,
            capture_output=True,
        )
        on = 0
        figures: dict[str, list[list[float]]] = {"failover": [], "restart": []}
        for r in range(args.rounds):
            other = 1 - on
            standby = serve(envs[other], "--standby")
            procs.append(standby)
            waiting = homes[other] / "standby.json"
            until(waiting.exists)
            killed = time.time()
            active.send_signal(signal.SIGKILL)
            active.wait()
            figures["failover"].append(measure(standby, homes[other], envs[other], dsn, killed))
            # The baseline: the same host killed and started again, no standby.
            killed = time.time()
            standby.send_signal(signal.SIGKILL)
            standby.wait()
            active = serve(envs[other])
            procs.append(active)
            figures["restart"].append(measure(active, homes[other], envs[other], dsn, killed))
            on = other
            print(f"round {r + 1}: failover {figures['failover'][-1]}, restart {figures['restart'][-1]}", flush=True)
        print(f"\n{args.rounds} rounds, seconds from the kill -9 (median / max):")
        print(f"{'':10} {'lease':>14} {'serving':>14} {'answered':>14}")
        for side, rows in figures.items():
            cols = list(zip(*rows, strict=True))
            cells = [f"{statistics.median(c):6.2f} / {max(c):5.2f}" for c in cols]
            print(f"{side:10} " + " ".join(f"{c:>14}" for c in cells))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        cluster.stop()


if __name__ == "__main__":
    main()
