"""The local agent's shell tool against a prompt-injected model: every command below is what an attacker would
run, executed for real through the tool registry in a bubblewrap sandbox, next to a fake host data dir (a live
admin.sock, an agenthost.db), the runner's data dir (sessions, another conversation's workspace) and a secret in
the runner's environment. Each test also checks its control (the target exists and is reachable from outside),
so a refusal cannot come from a broken setup."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agenthost.plugins import sandbox as sandboxing
from agenthost.runners.local_agent.config import LocalAgentConfig, ShellConfig
from agenthost.runners.local_agent.messages import ToolCall, ToolResult
from agenthost.runners.local_agent.testing import FakeRunAPI
from agenthost.runners.local_agent.tools import build_registry
from agenthost.runners.local_agent.tools.base import ToolContext

pytestmark = pytest.mark.skipif(sandboxing.probe() is not None, reason=f"no sandbox here: {sandboxing.probe()}")

RUNNER_SECRET = "sk-runner-secret-" + secrets.token_hex(4)


@dataclass
class Layout:
    workspace: Path
    other_workspace: Path
    host_dir: Path
    admin_sock: Path
    db: Path
    session: Path
    ctx: ToolContext


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Layout]:
    monkeypatch.setenv("OPENAI_API_KEY", RUNNER_SECRET)
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    db = host_dir / "agenthost.db"
    db.write_text("HOST-DB-SECRET")
    runner_dir = tmp_path / "runner-data"
    workspace = runner_dir / "workspaces" / "conv-a"
    other = runner_dir / "workspaces" / "conv-b"
    workspace.mkdir(parents=True)
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("OTHER-WORKSPACE-SECRET")
    (runner_dir / "sessions").mkdir()
    session = runner_dir / "sessions" / "conv-b.jsonl"
    session.write_text('{"role": "user", "content": "SESSION-SECRET"}\n')
    admin_sock = host_dir / "admin.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(admin_sock))
    server.listen(8)
    ctx = ToolContext(
        workspace=workspace, api=FakeRunAPI(), conversation_id="conv-a", run_id="r1", config=LocalAgentConfig()
    )
    try:
        yield Layout(workspace, other, host_dir, admin_sock, db, session, ctx)
    finally:
        server.close()


async def shell(ctx: ToolContext, command: str, **extra: object) -> ToolResult:
    registry = build_registry(ctx.config)
    return await registry.run(ToolCall("s1", "shell", json.dumps({"command": command, **extra})), ctx)


def alive(marker: str) -> list[str]:
    """Processes whose command line holds the marker, seen from the test process (the host's pid namespace)."""
    done = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, timeout=10)
    return done.stdout.split()


def kill_leftovers(marker: str) -> None:
    for pid in alive(marker):
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


async def wait_until(predicate, seconds: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


def marker() -> str:
    # A sleep duration nothing else on the machine uses: the command line is the marker pgrep looks for.
    return f"sleep {secrets.randbelow(900) + 1000}.{secrets.randbelow(10**8):08d}"


# ---------------------------------------------------------------- what the command can see


@pytest.mark.e2e
async def test_parent_process_and_proc_show_nothing_of_the_runner(layout: Layout) -> None:
    ctx = layout.ctx
    # Control: the runner's environment (what a leaky executor would hand down) holds the secret.
    assert os.environ["OPENAI_API_KEY"] == RUNNER_SECRET and Path(f"/proc/{os.getpid()}/environ").exists()
    r = await shell(
        ctx,
        f"echo ppid=$PPID; ls /proc/$PPID/root/; ls /proc/$PPID/root{layout.host_dir} 2>&1; "
        f"cat /proc/$PPID/environ /proc/1/environ /proc/self/environ 2>&1 | tr '\\0' '\\n'; "
        f"ls -d /proc/{os.getpid()} 2>&1; ls /proc | grep -c '^[0-9]'",
    )
    assert not r.is_error, r.content
    out = r.content
    assert "ppid=1" in out  # the sandbox's own init, not the runner
    assert RUNNER_SECRET not in out and "OPENAI_API_KEY" not in out
    lines = out.splitlines()
    assert any(str(layout.host_dir) in line and "No such file" in line for line in lines), out
    # The test process (standing in for the runner) is not in the sandbox's /proc at all.
    assert any(f"/proc/{os.getpid()}" in line and "No such file" in line for line in lines), out
    assert int(out.strip().splitlines()[-1]) <= 6  # bwrap's init, sh, and the few commands of this pipeline


@pytest.mark.e2e
async def test_host_data_dir_admin_socket_and_db_are_out_of_reach(layout: Layout) -> None:
    ctx = layout.ctx
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(str(layout.admin_sock))  # reachable from outside the sandbox
    control.close()
    probe = (
        "import socket; s = socket.socket(socket.AF_UNIX)\n"
        f"try:\n    s.connect({str(layout.admin_sock)!r}); print('ADMIN-CONNECTED')\n"
        "except OSError as e:\n    print('refused:', e)\n"
    )
    r = await shell(
        ctx,
        f"python3 -c {shlex.quote(probe)}; cat {layout.db} 2>&1; ls -la {layout.host_dir} 2>&1; "
        "find / -name admin.sock -not -path '/proc/*' 2>/dev/null; "
        "find / -name agenthost.db -not -path '/proc/*' 2>/dev/null; echo end",
        timeout_seconds=120,
    )
    out = r.content
    assert "refused:" in out and "ADMIN-CONNECTED" not in out, out
    assert "HOST-DB-SECRET" not in out and "admin.sock\n" not in out and "agenthost.db\n" not in out
    assert out.rstrip().endswith("end")


@pytest.mark.slow  # the grep over the whole visible tree takes seconds
async def test_other_workspaces_and_sessions_are_out_of_reach(layout: Layout) -> None:
    ctx = layout.ctx
    (layout.workspace / "mine.txt").write_text("MY-OWN-FILE")
    r = await shell(
        ctx,
        f"cat mine.txt; cat {layout.other_workspace}/notes.txt 2>&1; cat ../conv-b/notes.txt 2>&1; "
        f"cat {layout.session} 2>&1; ls {layout.workspace.parent} 2>&1; ls {layout.workspace.parent.parent} 2>&1; "
        "grep -rs SECRET / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null; echo end",
        timeout_seconds=120,
    )
    out = r.content
    assert "MY-OWN-FILE" in out
    for secret in ("OTHER-WORKSPACE-SECRET", "SESSION-SECRET", "HOST-DB-SECRET", RUNNER_SECRET):
        assert secret not in out, (secret, out)
    # The workspace's parent exists only as the mount point's skeleton: it lists just this conversation.
    lines = out.splitlines()
    assert "conv-a" in lines and "workspaces" in lines
    assert "conv-b" not in lines and "sessions" not in lines


@pytest.mark.e2e
async def test_workspace_is_writable_and_ordinary_dev_commands_work(layout: Layout) -> None:
    ctx = layout.ctx
    git = ""
    if shutil.which("git"):
        git = " && git init -q . && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m m"
        git += " && git log --oneline | wc -l"
    # A unique name, removed afterwards: if the walls ever fail, this test must not litter the real /usr.
    probe = Path(f"/usr/agenthost-write-probe-{secrets.token_hex(6)}")
    try:
        r = await shell(
            ctx,
            "set -e; pwd; echo $HOME; id -u; echo hi > made.txt; t=$(mktemp); cp made.txt $t; sort $t; "
            f"python3 -c 'import sys; print(sys.version_info[0])'{git}; touch {probe} 2>&1 || echo ro-system",
        )
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)
    assert not r.is_error, r.content
    lines = r.content.splitlines()
    assert lines[:5] == [str(layout.workspace), str(layout.workspace), "65534", "hi", "3"]
    if git:
        assert lines[5] == "1" and (layout.workspace / ".git").is_dir()
    assert "ro-system" in r.content
    assert (layout.workspace / "made.txt").read_text() == "hi\n"


# ---------------------------------------------------------------- nothing outlives the call


@pytest.mark.slow
@pytest.mark.parametrize(
    "template",
    [
        "setsid {m} & disown; echo started",
        "( ( {m} & ) & ); echo started",
        "nohup {m} >/dev/null 2>&1 & echo started",
        "python3 -c 'import os, subprocess\nif os.fork() == 0:\n os.setsid()\n if os.fork() == 0:\n"
        '  subprocess.Popen("{m}".split(), start_new_session=True)\n os._exit(0)\nos.wait()\'; echo started',
    ],
    ids=["setsid-disown", "double-fork", "nohup", "python-daemon"],
)
async def test_background_processes_die_with_the_call(layout: Layout, template: str) -> None:
    m = marker()
    try:
        t0 = time.monotonic()
        r = await shell(layout.ctx, template.format(m=m))
        assert not r.is_error and "started" in r.content, r.content
        assert time.monotonic() - t0 < 5
        assert alive(m) == [], "a process started by the command outlived the tool call"
    finally:
        kill_leftovers(m)


@pytest.mark.slow
async def test_cancelled_call_kills_the_whole_sandbox(layout: Layout) -> None:
    m = marker()
    try:
        task = asyncio.create_task(shell(layout.ctx, f"setsid {m} & {m}"))
        assert await wait_until(lambda: len(alive(m)) >= 2), "the command never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = alive(m)
        assert left == [], subprocess.run(  # noqa: ASYNC221 — only on failure, to say what was left
            ["ps", "-o", "pid,ppid,pgid,stat,etime,args", "-p", ",".join(left)],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    finally:
        kill_leftovers(m)


@pytest.mark.slow
async def test_timed_out_call_kills_the_whole_sandbox(layout: Layout) -> None:
    m = marker()
    try:
        t0 = time.monotonic()
        r = await shell(layout.ctx, f"setsid {m} & echo up; {m}", timeout_seconds=1)
        assert r.is_error and "timed out" in r.content and "up" in r.content, r.content
        assert time.monotonic() - t0 < 6
        assert alive(m) == []
    finally:
        kill_leftovers(m)


# ---------------------------------------------------------------- network


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel completes handshakes from the backlog; nobody needs to accept
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def connect_command(port: int) -> str:
    code = (
        "import socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('CONNECTED')\n"
        "except OSError as e:\n    print('NO-NETWORK', e)\n"
    )
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.e2e
async def test_network_is_off_by_default(layout: Layout, listener: int) -> None:
    socket.create_connection(("127.0.0.1", listener), timeout=5).close()  # control: the listener answers
    r = await shell(layout.ctx, connect_command(listener))
    assert "NO-NETWORK" in r.content and "CONNECTED" not in r.content.replace("NO-NETWORK", ""), r.content


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    """A service on an abstract unix socket of the host's network namespace (as D-Bus, X11 or a dev server use)."""
    name = f"agenthost-test-{secrets.token_hex(6)}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(8)
    try:
        yield name
    finally:
        server.close()


def abstract_connect_command(name: str) -> str:
    code = (
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
        f"    s.connect('\\0{name}'); print('CONNECTED')\n"
        "except OSError as e:\n    print('NO-NETWORK', e)\n"
    )
    return f"python3 -c {shlex.quote(code)}"


def proxied_get(url: str) -> str:
    """A command fetching `url` the way tools do: through the proxy its environment names (HTTP(S)_PROXY)."""
    code = (
        "import urllib.request, urllib.error\ntry:\n"
        f"    print('FETCHED', urllib.request.urlopen({url!r}, timeout=20).read().decode())\n"
        "except urllib.error.HTTPError as e:\n    print('HTTP', e.code, e.read().decode())\n"
        "except OSError as e:\n    print('FAILED', e)\n"
    )
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.e2e
async def test_network_when_the_binding_opts_in_still_never_reaches_the_hosts_loopback(
    layout: Layout, listener: int, abstract_listener: str
) -> None:
    """`network: true` is the network through the runner's egress proxy, not the host's namespace: neither a
    port on the host's loopback (the gateway, a database) nor an abstract unix socket is reachable, directly or
    through the proxy. (Before: the command shared the runner's namespace and connected to both.)"""
    probe = socket.socket(socket.AF_UNIX)
    probe.connect("\0" + abstract_listener)  # control: both answer from out here
    probe.close()
    socket.create_connection(("127.0.0.1", listener), timeout=5).close()
    layout.ctx.config = LocalAgentConfig(shell=ShellConfig(network=True))
    r = await shell(layout.ctx, connect_command(listener))
    assert "NO-NETWORK" in r.content and "Connection refused" in r.content, r.content
    r = await shell(layout.ctx, abstract_connect_command(abstract_listener))
    assert "NO-NETWORK" in r.content, r.content
    r = await shell(layout.ctx, proxied_get(f"http://127.0.0.1:{listener}/"))
    assert "HTTP 403" in r.content and f"127.0.0.1:{listener}" in r.content, r.content
    assert "loopback, private or link-local address, which a sandbox never reaches" in r.content, r.content


@pytest.mark.e2e
async def test_network_allow_list_names_the_refused_host_and_the_setting(layout: Layout) -> None:
    layout.ctx.config = LocalAgentConfig(shell=ShellConfig(network=True, allowed_domains=["*.example.org"]))
    r = await shell(layout.ctx, proxied_get("http://not-allowed.invalid/"))
    assert "HTTP 403" in r.content and "not-allowed.invalid:80" in r.content, r.content
    assert "not on this sandbox's allow list (*.example.org)" in r.content and "shell.allowed_domains" in r.content


@pytest.mark.e2e
async def test_network_reaches_an_allowed_host_through_the_proxy(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The way out works: an allowed name, which the proxy resolves (here to a public-looking address it then
    connects to: a hermetic test cannot reach the internet, so the connection itself is redirected to a local
    server, after the proxy's checks)."""
    from agenthost.runners.sdk import egress

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    seen: list[str] = []

    async def lookup(host: str, p: int) -> list[str]:
        return ["93.184.215.14"] if host == "api.example.org" else []

    async def redirected(address: str, p: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        seen.append(f"{address}:{p}")
        return await asyncio.open_connection("127.0.0.1", port)

    monkeypatch.setattr(egress, "lookup", lookup)
    monkeypatch.setattr(egress, "open_upstream", redirected)
    try:
        layout.ctx.config = LocalAgentConfig(shell=ShellConfig(network=True, allowed_domains=["api.example.org"]))
        r = await shell(layout.ctx, proxied_get("http://api.example.org/"))
        assert r.content.strip() == "FETCHED hello", r.content
        assert seen == ["93.184.215.14:80"]  # the address it checked, not the name again
    finally:
        server.close()


# ---------------------------------------------------------------- no sandbox


async def test_refuses_when_no_sandbox_can_start(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandboxing, "probe", lambda: "bubblewrap is not installed (test)")
    r = await shell(layout.ctx, f"touch {layout.workspace}/ran")
    assert r.is_error and "bubblewrap is not installed (test)" in r.content and "sandbox=false" in r.content
    assert not (layout.workspace / "ran").exists()


@pytest.mark.e2e
async def test_explicit_opt_out_runs_unsandboxed_with_a_warning(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandboxing, "probe", lambda: "bubblewrap is not installed (test)")
    layout.ctx.config = LocalAgentConfig(shell=ShellConfig(sandbox=False))
    with caplog.at_level(logging.WARNING, logger="agenthost.local_agent"):
        r = await shell(layout.ctx, "echo $PPID")
        r2 = await shell(layout.ctx, "true")
    assert not r.is_error and not r2.is_error
    assert r.content.strip() == str(os.getpid())  # no pid namespace: the walls are really gone
    warnings = [rec for rec in caplog.records if "WITHOUT a sandbox" in rec.getMessage()]
    assert len(warnings) == 2  # one per command


# ---------------------------------------------------------------- disk and shared memory (issue 25 item 15)


@pytest.mark.e2e
async def test_a_command_filling_the_workspace_is_killed_and_the_next_refused(layout: Layout) -> None:
    ctx = layout.ctx
    ctx.config = LocalAgentConfig(workspace_max_mib=8)
    # 1 MiB files, each under the per-file cap: only the workspace budget can stop this before its 64 MiB.
    fill = "for i in $(seq 64); do head -c 1048576 /dev/zero > fill$i || exit 3; sleep 0.05; done; echo finished"
    r = await shell(ctx, fill, timeout_seconds=600)
    assert r.is_error and "command killed: workspace quota exceeded" in r.content, r.content
    assert "> 8 MiB; binding setting workspace_max_mib" in r.content and "timed out" not in r.content
    used = sum(p.stat().st_size for p in layout.workspace.iterdir())
    assert 8 * 2**20 < used < 64 * 2**20 and "finished" not in r.content

    refused = await shell(ctx, "echo ran")
    assert refused.is_error and "command not started: workspace quota exceeded" in refused.content
    assert "ran" not in refused.content
    for p in layout.workspace.glob("fill*"):
        p.unlink()
    again = await shell(ctx, "echo ran")
    assert not again.is_error and again.content.strip() == "ran"


@pytest.mark.e2e
async def test_one_file_past_the_budget_is_stopped_by_the_file_size_cap(layout: Layout) -> None:
    ctx = layout.ctx
    ctx.config = LocalAgentConfig(workspace_max_mib=4)
    r = await shell(ctx, "head -c 6291456 /dev/zero > big; echo exit=$?")
    assert (layout.workspace / "big").stat().st_size == 4 * 2**20, r.content  # RLIMIT_FSIZE, not the poll
    assert "exit=153" in r.content  # 128 + SIGXFSZ


@pytest.mark.e2e
async def test_dev_shm_is_a_small_tmpfs_of_its_own(layout: Layout) -> None:
    over = (sandboxing.SHM_SIZE_MIB + 1) * 2**20
    r = await shell(layout.ctx, f"df -m /dev/shm | tail -1; head -c {over} /dev/zero > /dev/shm/x; echo exit=$?")
    assert "No space left on device" in r.content and "exit=1" in r.content, r.content
