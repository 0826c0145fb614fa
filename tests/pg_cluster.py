"""A throwaway PostgreSQL cluster for the tests: Debian's initdb/pg_ctl in a temp dir, one per xdist worker.

The stores' tests run on both backends (`store_target`, parametrized sqlite | postgresql). Each PostgreSQL test gets
a fresh database, created from a template the session migrated once (CREATE DATABASE … TEMPLATE copies files, far
faster than migrating). initdb refuses to run as root: as root (CI), the cluster runs as the `postgres` user, its
temp dir given to it. Only a unix socket in that dir and 127.0.0.1 on a free port; fsync off (nothing here needs to
survive a power cut). Where no PostgreSQL binaries exist the PostgreSQL half is skipped with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TEMPLATE = "agenthost_template"
_names = itertools.count()


def bindir() -> Path | None:
    """The newest installed PostgreSQL's bin dir (Debian: /usr/lib/postgresql/<version>/bin), not PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def pgvector_bindir() -> Path | None:
    """A PostgreSQL with pgvector: PyPI's `pgserver` (PostgreSQL 16 + pgvector 0.6 in its wheel; Debian bookworm
    packages no pgvector). None where it is not installed."""
    spec = importlib.util.find_spec("pgserver")  # not imported: only its files are used
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "pginstall" / "bin"
    return found if (found / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """`durable`: fsync and synchronous commit on, as a production server (the benchmarks); off by default."""

    def __init__(self, bin_dir: Path, *, durable: bool = False) -> None:
        self.bin = bin_dir
        self.durable = durable
        # Under /tmp, not $TMPDIR: the `postgres` user must reach it (as root), and a unix socket's path is short.
        self.root = Path(tempfile.mkdtemp(prefix="agenthost-pg-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120, cwd=self.root)

    def start(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C.UTF-8", "-N",
        )  # fmt: skip
        with (self.data / "pg_hba.conf").open("w") as hba:  # passwords over TCP, for the DSN tests
            hba.write(
                "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
            )
        self.start_server()

    def start_server(self) -> None:
        """pg_ctl start on the cluster initdb made (again, after stop_server)."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c max_connections=100"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w",
            "-t", "120", "start",
        )  # fmt: skip

    def stop_server(self) -> None:
        """pg_ctl stop -m immediate: every session cut at once, as a crash of the server (no checkpoint)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@/{dbname}?host={self.root}&port={self.port}"

    def tcp_dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """Over loopback TCP, as a server on another machine is reached."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def new_database(self) -> str:
        """A fresh database with the newest schema; returns its DSN."""
        name = f"t{os.getpid()}_{next(_names)}"
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE}')
        return self.dsn(name)

    def drop(self, dsn: str) -> None:
        name = dsn.split("/")[3].split("?")[0]
        with contextlib.suppress(Exception):
            self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def bench_database(name: str = "agenthost_bench") -> Iterator[str]:
    """For a benchmark: a throwaway durable cluster (fsync and synchronous commit on, as in production) with one
    empty database; yields its DSN over loopback TCP, as a server on another machine is reached."""
    found = bindir()
    if found is None:
        raise SystemExit("no PostgreSQL binaries (initdb): apt-get install postgresql")
    cluster = Cluster(found, durable=True)
    try:
        cluster.start()
        cluster.admin(f'CREATE DATABASE "{name}"')
        yield cluster.tcp_dsn(name)
    finally:
        cluster.stop()


async def wipe(db: Any) -> None:
    """Empties a PostgreSQL Database's tables and restarts its numbering, as a new file would be (hypothesis
    examples share one database). The lease stays: the open Database holds it, and its writes check it."""
    tables = [
        r[0]
        for r in db.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename NOT IN ('schema_version', 'lease')"
        )
    ]

    def truncate(conn: Any) -> None:
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
        conn.execute("ALTER SEQUENCE transcript_seq RESTART")

    await db.write(truncate)


async def open_database(target: Path | str, tmp: Path) -> Any:
    """An open, empty Database on `target` (store_target's): a new SQLite file under `tmp`, or the DSN's database
    emptied."""
    from agenthost.host.store.db import Database

    db = Database(target if isinstance(target, str) else tmp / "t.db")
    await db.open()
    if isinstance(target, str):
        await wipe(db)
    return db


def _binaries() -> Path:
    """The PostgreSQL bin dir, or the test skipped saying what is missing."""
    found = bindir()
    if found is None:
        pytest.skip("no PostgreSQL binaries (initdb) on this machine: apt-get install postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'agenthost[postgres]')")
    return found


@pytest.fixture
def own_pg_cluster() -> Iterator[Cluster]:
    """A cluster of the test's own, for a test that stops and starts the server (pg_cluster serves other tests).
    Durable (fsync, synchronous_commit): `stop -m immediate` is a crash, and with synchronous_commit off a commit
    already acknowledged may be lost in one (seen: an acknowledged run's row gone), which is the server's choice,
    not what the host promises on a durable server."""
    cluster = Cluster(_binaries(), durable=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    cluster = Cluster(_binaries())
    atexit.register(cluster.stop)  # a worker that dies without its session teardown stops its server too
    try:
        cluster.start()
        cluster.admin(f"CREATE DATABASE {TEMPLATE}")
        from agenthost.host.store import migrations_pg, postgres

        conn = postgres.connect(cluster.dsn(TEMPLATE))
        migrations_pg.migrate(conn)
        conn.close()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pgvector_cluster() -> Iterator[Cluster]:
    """A cluster whose server has pgvector (pgvector_bindir), its template database migrated with the extension
    created and the knowledge base's vector column added (as the host does at open)."""
    found = pgvector_bindir()
    if found is None:
        pytest.skip("no PostgreSQL with pgvector on this machine: pip install pgserver==0.1.4 (Python 3.11, x86-64)")
    _binaries()  # psycopg
    cluster = Cluster(found)
    atexit.register(cluster.stop)
    try:
        cluster.start()
        cluster.admin(f"CREATE DATABASE {TEMPLATE}")
        from agenthost.host.store import migrations_pg, pgvector, postgres

        conn = postgres.connect(cluster.dsn(TEMPLATE))
        migrations_pg.migrate(conn)
        assert pgvector.enable(conn)
        conn.close()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pgvector_dsn(pgvector_cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database on a server with pgvector."""
    dsn = pgvector_cluster.new_database()
    yield dsn
    pgvector_cluster.drop(dsn)


@pytest.fixture
def pg_dsn(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database."""
    dsn = pg_cluster.new_database()
    yield dsn
    pg_cluster.drop(dsn)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a test's Database lives: a SQLite file, or a fresh PostgreSQL database (both, by parametrization)."""
    if request.param == "sqlite":
        return tmp_path / "t.db"
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture(params=["sqlite", "postgresql"])
def host_database(request: pytest.FixtureRequest) -> dict[str, Any]:
    """HostHarness `host_options` putting the host's stores on each backend in turn (a fresh PostgreSQL database)."""
    if request.param == "sqlite":
        return {}
    return {"database": request.getfixturevalue("pg_dsn")}
