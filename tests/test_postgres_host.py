"""The host on PostgreSQL, as an operator runs it: `agenthost serve --database` (or $AGENTHOST_DATABASE_URL) and the
CLI as real processes, against the throwaway cluster (tests/pg_cluster.py). The store-level suites run on both
backends through `store_target`; here, the start-up options and faults, and one user flow end to end: a plugin's
runs using state, artifacts, history pages and search, then the host killed -9 and started again."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from tests.pg_cluster import Cluster
from tests.test_e2e_cli import NOTES, cli, start_host

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/process_guard.py)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    from tests.cli_process import cli_env

    return cli_env(tmp_path / "home")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def test_a_password_on_the_command_line_is_refused(env: dict[str, str]) -> None:
    out = cli(env, "serve", "--database", "postgresql://agenthost:hunter2@127.0.0.1/agenthost", check=False)
    assert out.returncode == 2
    assert "carries a password" in out.stderr and "--database-password-file" in out.stderr
    out = cli(env, "serve", "--database", "postgresql://agenthost@127.0.0.1/a?password=hunter2", check=False)
    assert out.returncode == 2 and "carries a password" in out.stderr
    assert not (Path(env["AGENTHOST_HOME"]) / "host.json").exists()


def test_an_unreachable_database_at_start_is_a_clear_error_and_exit_2(env: dict[str, str], tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    dsn = f"postgresql://agenthost@127.0.0.1:{_closed_port()}/agenthost"
    out = cli(env, "serve", "--database", dsn, "--database-password-file", str(secret), check=False, timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"error: cannot connect to the database {dsn}" in out.stderr
    assert "hunter2" not in out.stderr + out.stdout
    out = cli(env, "serve", "--database-password-file", str(secret), check=False)
    assert out.returncode == 2 and "no --database" in out.stderr
    # A DSN from the environment may carry its password, in its user part or as a parameter: neither is shown.
    port = _closed_port()
    for dsn in (
        f"postgresql://agenthost:hunter2@127.0.0.1:{port}/agenthost",
        f"postgresql://agenthost@127.0.0.1:{port}/agenthost?connect_timeout=5&password=hunter2",
    ):
        out = cli({**env, "AGENTHOST_DATABASE_URL": dsn}, "serve", check=False, timeout=60)
        assert out.returncode == 2 and "error: cannot connect to the database" in out.stderr, out.stderr
        assert "hunter2" not in out.stderr + out.stdout, out.stderr


def test_a_database_the_user_may_not_create_tables_in_is_a_clear_error_and_exit_2(
    env: dict[str, str], tmp_path: Path, pg_cluster: Cluster
) -> None:
    name = f"ro_{tmp_path.name[-12:].replace('-', '_')}"
    pg_cluster.admin(f"CREATE ROLE {name} LOGIN")
    pg_cluster.admin(f"CREATE DATABASE {name} TEMPLATE template0")  # owned by postgres: public is not the role's
    out = cli(env, "serve", "--database", pg_cluster.dsn(name, user=name), check=False, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "error: cannot use the database" in out.stderr and "permission denied" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_user_flow_on_postgresql_survives_kill_and_restart(
    env: dict[str, str], tmp_path: Path, pg_cluster: Cluster
) -> None:
    """A role with a password over TCP, the password from a file, the DSN from the environment."""
    name = f"flow_{tmp_path.name[-12:].replace('-', '_')}"
    pg_cluster.admin(f"CREATE ROLE {name} LOGIN PASSWORD 'pw-{name}'")
    pg_cluster.admin(f"CREATE DATABASE {name} OWNER {name} TEMPLATE template0")
    (tmp_path / "pw").write_text(f"pw-{name}\n")
    dsn = f"postgresql://{name}@127.0.0.1:{pg_cluster.port}/{name}"
    env = {**env, "AGENTHOST_DATABASE_URL": dsn, "AGENTHOST_DATABASE_PASSWORD_FILE": str(tmp_path / "pw")}
    host = start_host(env)
    try:
        status = cli(env, "status").stdout
        assert f"database: postgresql {dsn}" in status and "knowledge-base vectors: exact" in status
        assert json.loads(cli(env, "status", "--json").stdout)["database"] == f"postgresql {dsn}"
        cli(env, "plugins", "install", NOTES, "--offline")
        cli(env, "bots", "create", "support")
        cli(env, "bots", "bind", "support", "--runner", "agenthost-notes/notes", "--config", "greeting=Kept")
        assert "Kept (1 notes)" in cli(env, "send", "support", "note buy milk").stdout  # artifact + state CAS
        assert "Kept (2 notes)" in cli(env, "send", "support", "note buy oat milk").stdout
        listed = cli(env, "send", "support", "list").stdout
        assert "1. buy milk (8 bytes)" in listed and "2. buy oat milk" in listed
        found = cli(env, "send", "support", "find oat").stdout  # the run API's history search, on tsvector
        assert "found 1 earlier messages: note buy oat milk" in found
        paged = cli(env, "send", "support", "hello").stdout  # a history page through the run API
        assert "This conversation has 5 recent user messages" in paged
        history = cli(env, "history", "support").stdout
        assert "[user] note buy milk" in history and "[assistant] Kept (2 notes)" in history
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    host = start_host(env)
    try:
        assert "Kept (3 notes)" in cli(env, "send", "support", "note again").stdout  # nothing acknowledged was lost
        assert len(cli(env, "runs", "list").stdout.splitlines()) == 6
    finally:
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=20) == 0
    # Nothing of it is in a SQLite file: the data dir holds no database.
    assert not (Path(env["AGENTHOST_HOME"]) / "agenthost.db").exists()
