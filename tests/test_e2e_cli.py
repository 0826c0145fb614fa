"""The user flow of the docs' Getting started, as a user runs it: `agenthost serve` and the CLI as separate real
processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
NOTES = str(ROOT / "plugins" / "examples" / "notes-runner")
FAULTY = str(ROOT / "tests" / "fixtures" / "faulty-plugin")


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST_TEST"))}
    e["AGENTHOST_HOME"] = str(tmp_path / "home")
    return e


def cli(env, *args, check=True, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "agenthost.host.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"agenthost {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_host(env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost.host.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        if (Path(env["AGENTHOST_HOME"]) / "host.json").exists() and cli(
            env, "plugins", "list", check=False
        ).returncode == 0:
            return proc
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("host did not come up")


def runner_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "agenthost.runners.sdk serve"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _descendants(root: int) -> set[int]:
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue  # gone meanwhile
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


# ~30 CLI commands, two host starts and a kill: 33 s at load 4-11, past the default 120 s at load 12-14.
@pytest.mark.timeout(300)
def test_user_flow_kill_and_restart(env):
    host = start_host(env)
    try:
        assert "another agenthost" in cli(env, "serve", check=False).stderr
        assert "installed agenthost-notes" in cli(env, "plugins", "install", NOTES, "--offline").stdout
        bad = cli(env, "plugins", "install", "/nonexistent/dir-or-req!!", check=False)
        assert bad.returncode == 1 and "neither a directory" in bad.stderr
        assert "agenthost-notes/notes" in cli(env, "runners", "list").stdout
        cli(env, "bots", "create", "support")
        bad_cfg = cli(
            env, "bots", "bind", "support", "--runner", "agenthost-notes/notes", "--config", "color=red", check=False
        )
        assert bad_cfg.returncode == 1 and "INVALID_ARGUMENT" in bad_cfg.stderr
        cli(env, "bots", "bind", "support", "--runner", "agenthost-notes/notes", "--config", "greeting=Kept")
        assert "Kept (1 notes)" in cli(env, "send", "support", "note buy milk").stdout
        out = json.loads(cli(env, "send", "support", "list", "--json").stdout)
        assert out["status"] == "completed" and "buy milk" in out["text"]
        history = cli(env, "history", "support").stdout
        assert "[user] note buy milk" in history and "[assistant] Kept (1 notes)" in history
        runs = cli(env, "runs", "list").stdout.splitlines()
        assert len(runs) == 2 and all("completed" in r for r in runs)
        shown = cli(env, "runs", "show", out["run_id"], "--events").stdout
        assert '"completed"' in shown
        nobind = cli(env, "bots", "create", "empty") and cli(env, "send", "empty", "hi", check=False)
        assert nobind.returncode == 1 and "no binding" in nobind.stderr
        # the built-in local agent answers with its labelled offline demo model
        cli(env, "bots", "create", "agent")
        cli(env, "bots", "bind", "agent", "--runner", "agenthost/local-agent")
        demo = cli(env, "send", "agent", "hello").stdout
        assert "offline demo model" in demo

        # a run in flight when the host is killed -9
        cli(env, "plugins", "install", FAULTY, "--offline")
        cli(env, "bots", "create", "slow")
        cli(env, "bots", "bind", "slow", "--runner", "agenthost-faulty/faulty")
        sender = subprocess.Popen(
            [sys.executable, "-m", "agenthost.host.cli", "send", "slow", "sleep"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # Wait until the run is in flight (the faulty runner sleeps through it). Only this host's runners count:
        # tests on other workers start runners of their own meanwhile.
        deadline = time.time() + 30
        while "running" not in cli(env, "runs", "list", "--status", "running").stdout and time.time() < deadline:
            time.sleep(0.1)
        ours = runner_pids() & _descendants(host.pid)
        assert len(ours) >= 2
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    deadline = time.time() + 10
    while runner_pids() & ours and time.time() < deadline:
        time.sleep(0.1)
    assert not runner_pids() & ours, "runner processes outlived their host"
    sender.wait(timeout=10)
    assert sender.returncode != 0

    host = start_host(env)
    try:
        interrupted = cli(env, "runs", "list", "--status", "interrupted").stdout
        assert "agenthost-faulty/faulty" in interrupted
        assert "Kept (2 notes)" in cli(env, "send", "support", "note again").stdout  # nothing acknowledged was lost
    finally:
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=20) == 0
