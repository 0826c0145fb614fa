"""The wall around an external harness: what a run's harness (and every command it runs) can see, hold and leave
behind. Attacks come from inside the harness's process tree, as a model-run command would make them.

Fast tests drive `HarnessProcess` and the runner with a probe harness (tests/security/harness_probe.py) in the
sandbox the runner really builds; the slow ones make the real Claude Code CLI run the attacks through its Bash
tool against a fake model API on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from external_harness.fake_apis import FakeAnthropic, Request
from external_harness.fake_run_api import FakeHost
from external_harness.helpers import kinds, pids_with_env

from agenthost.plugins import sandbox as walls
from agenthost.runners.external_harness import runner as runner_mod
from agenthost.runners.external_harness.errors import HarnessSandboxError
from agenthost.runners.external_harness.process import HarnessProcess, build_env
from agenthost.runners.external_harness.runner import ClaudeCodeRunner
from agenthost.runners.external_harness.sandboxing import harness_sandbox
from agenthost.runners.external_harness.workspace import WorkspaceManager

PROBE = str(Path(__file__).resolve().parent / "harness_probe.py")
REPO = Path(__file__).resolve().parents[2]

needs_bwrap = pytest.mark.skipif(walls.probe() is not None, reason=f"no working bubblewrap: {walls.probe()}")
# Each runner a test makes is closed at its end, with the processes it keeps and the spare it starts after a turn.
pytestmark = pytest.mark.usefixtures("close_harness_runners")


def marker_pids(mark: str) -> list[int]:
    """Processes whose command line names `mark` (pgrep -f), whatever pid namespace or session they are in."""
    if shutil.which("pgrep"):
        done = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split() if int(p) != os.getpid()]
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"sleep\0{mark}".encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def gone(mark: str, timeout: float = 10.0) -> bool:
    """Whether every process named by `mark` has ended within `timeout` (the kernel kills a pid namespace
    asynchronously, so poll rather than look once)."""
    deadline = time.monotonic() + timeout
    while marker_pids(mark):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def appeared(mark: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not marker_pids(mark):
        assert time.monotonic() < deadline, f"the probe never started `sleep {mark}`"
        await asyncio.sleep(0.05)


def new_mark() -> str:
    return f"3600.{secrets.randbelow(10**9):09d}"  # a valid `sleep` duration no other process uses


def kill_marked(mark: str) -> None:
    for pid in marker_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class HostDir:
    """A stand-in for the host's data dir: the run API socket the harness may reach, the admin socket and a
    database it must not."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.admin = socket.socket(socket.AF_UNIX)
        self.admin.bind(str(path / "admin.sock"))
        self.admin.listen(8)
        (path / "host.db").write_text("host secrets")


@pytest.fixture
async def host() -> AsyncIterator[tuple[FakeHost, HostDir]]:
    with tempfile.TemporaryDirectory(prefix="ah-sec-") as d:  # short: unix socket paths cap at ~107 bytes
        host_dir = HostDir(Path(d))
        try:
            async with FakeHost(Path(d)) as fake:
                yield fake, host_dir
        finally:
            host_dir.admin.close()


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A runner data dir with this conversation's workspace and another conversation's (holding a secret)."""
    data = tmp_path / "runner-data"
    manager = WorkspaceManager(data)
    ws = manager.workspace("bot-1", "conv-1")
    other = manager.workspace("bot-1", "conv-other")
    (other.working_dir / "other-secret.txt").write_text("not yours")
    (data / "runner-secret.txt").write_text("runner only")
    yield {"data": data, "ws": ws, "other": other}


def probe_env(host_dir: HostDir, layout: dict[str, Any], mark: str, **extra: str) -> dict[str, str]:
    return build_env(
        inherited=os.environ,
        set_env={
            "HOME": str(layout["ws"].home),
            "PROBE_HOST_DIR": str(host_dir.path),
            "PROBE_DATA_DIR": str(layout["data"]),
            "PROBE_OTHER_WS": str(layout["other"].working_dir),
            "PROBE_MARK": mark,
            **extra,
        },
    )


def sandbox_for(fake: FakeHost, layout: dict[str, Any]) -> walls.Sandbox:
    return harness_sandbox(workspace=layout["ws"], install=[PROBE], host_address=fake.address, data_dir=layout["data"])


def assert_walled(report: dict[str, Any], host_dir: HostDir, layout: dict[str, Any], *, api_sock: bool = True) -> None:
    assert report["uid"] == walls.SANDBOX_UID
    assert report["admin_sock"].startswith("refused"), report["admin_sock"]
    if api_sock:
        assert report["api_sock"] == "connected"
        assert report["host_dir"] == ["api.sock"]  # no admin.sock, no database
    else:  # the HTTP bridge: the run API is not in the sandbox at all
        assert report["api_sock"].startswith("refused"), report["api_sock"]
        assert str(report["host_dir"]).startswith("error"), report["host_dir"]
    assert str(report["data_dir"]).startswith("error") or "runner-secret.txt" not in report["data_dir"]
    assert str(report["other_ws"]).startswith("error"), report["other_ws"]
    assert report["cwd_writable"] is True
    assert os.getpid() not in report["proc_pids"]  # its own pid namespace: the runner is not even visible


async def probe_report(proc: HarnessProcess) -> dict[str, Any]:
    """Runs the probe to its end (it must exit 0) and returns what it reported seeing."""
    async with proc:
        events = [e async for e in proc.events()]
        assert await proc.wait() == 0
    return json.loads(events[-1]["result"])


# ---- HarnessProcess in the runner's sandbox ----


@needs_bwrap
@pytest.mark.e2e
async def test_probe_sees_only_its_workspace_and_leaves_nothing_behind(host, layout) -> None:
    fake, host_dir = host
    mark = new_mark()
    proc = HarnessProcess(
        [PROBE], cwd=layout["ws"].working_dir, env=probe_env(host_dir, layout, mark), sandbox=sandbox_for(fake, layout)
    )
    try:
        report = await probe_report(proc)
        assert_walled(report, host_dir, layout)
        assert (layout["ws"].working_dir / "probe-wrote-here").exists()
        # The harness exited; its `setsid sleep` went with the pid namespace.
        assert await gone(mark), "a setsid process outlived the harness"
    finally:
        kill_marked(mark)


@needs_bwrap
@pytest.mark.e2e
async def test_interrupt_kills_a_stubborn_tree(host, layout) -> None:
    fake, host_dir = host
    mark, tag = new_mark(), f"probe-{secrets.token_hex(6)}"
    env = probe_env(host_dir, layout, mark, PROBE_MODE="hang", PROBE_TAG=tag)
    proc = HarnessProcess(
        [PROBE], cwd=layout["ws"].working_dir, env=env, sandbox=sandbox_for(fake, layout), interrupt_grace=0.3
    )
    try:
        await proc.start()
        events = proc.events()
        assert (await asyncio.wait_for(anext(events), 20))["type"] == "system"
        report = (await asyncio.wait_for(anext(events), 20))["report"]
        assert_walled(report, host_dir, layout)
        await appeared(mark)
        await proc.stop()  # SIGINT (ignored by the probe), then SIGKILL of the namespace
        assert await gone(mark)
        assert not pids_with_env(tag)
    finally:
        await proc.stop()
        kill_marked(mark)


@needs_bwrap
@pytest.mark.e2e
async def test_killed_runner_takes_the_sandbox_with_it(host, layout, tmp_path) -> None:
    fake, host_dir = host
    mark, tag = new_mark(), f"probe-{secrets.token_hex(6)}"
    spec = {
        "env": probe_env(host_dir, layout, mark, PROBE_MODE="hang", PROBE_TAG=tag),
        "cwd": str(layout["ws"].working_dir),
        "harness_dir": str(layout["ws"].harness_dir),
        "data": str(layout["data"]),
        "address": fake.address,
        "probe": PROBE,
    }
    # A stand-in runner process: starts the sandboxed probe, reports, then is SIGKILLed (no cleanup can run).
    code = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from agenthost.runners.external_harness.process import HarnessProcess\n"
        "from agenthost.runners.external_harness.sandboxing import harness_sandbox\n"
        "from agenthost.runners.external_harness.workspace import Workspace\n"
        "spec = json.loads(sys.argv[1])\n"
        "async def main():\n"
        "    ws = Workspace(working_dir=Path(spec['cwd']), harness_dir=Path(spec['harness_dir']), bot_dir=Path('/'))\n"
        "    sb = harness_sandbox(workspace=ws, install=[spec['probe']], host_address=spec['address'],\n"
        "                         data_dir=Path(spec['data']))\n"
        "    p = HarnessProcess([spec['probe']], cwd=ws.working_dir, env=spec['env'], sandbox=sb)\n"
        "    await p.start()\n"
        "    async for event in p.events():\n"
        "        if event.get('type') == 'probe':\n"
        "            print('ready', flush=True)\n"
        "    await asyncio.sleep(300)\n"
        "asyncio.run(main())\n"
    )
    runner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, json.dumps(spec), cwd=tmp_path, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert runner.stdout
        assert await asyncio.wait_for(runner.stdout.readline(), 30) == b"ready\n"
        await appeared(mark)
        assert pids_with_env(tag)
    finally:
        runner.kill()
        await runner.wait()
    try:
        assert await gone(mark), "a setsid process outlived the SIGKILLed runner"
        for _ in range(100):
            if not pids_with_env(tag):
                break
            await asyncio.sleep(0.05)
        assert not pids_with_env(tag), "the harness outlived the SIGKILLed runner"
    finally:
        kill_marked(mark)


@pytest.mark.e2e
async def test_the_probe_does_catch_an_escape(host, layout) -> None:
    """The control: without the sandbox the same probe's `setsid sleep` does survive the harness, and sees the
    admin socket. (So the tests above can fail.)"""
    fake, host_dir = host
    mark = new_mark()
    try:
        async with HarnessProcess([PROBE], cwd=layout["ws"].working_dir, env=probe_env(host_dir, layout, mark)) as proc:
            events = [e async for e in proc.events()]
            await proc.wait()
        report = json.loads(events[-1]["result"])
        assert report["admin_sock"] == "connected" and "host.db" in report["host_dir"]
        assert not await gone(mark, timeout=0.5)
    finally:
        kill_marked(mark)
    assert await gone(mark)


def test_a_read_only_path_holding_the_data_dir_is_refused(layout) -> None:
    if walls.probe() is not None:
        pytest.skip(walls.probe() or "")
    with pytest.raises(HarnessSandboxError, match="contains the runner's data dir"):
        harness_sandbox(
            workspace=layout["ws"], install=[str(layout["data"].parent)], host_address="", data_dir=layout["data"]
        )


# ---- the runner ----


def _probe_config(host_dir: HostDir, layout: dict[str, Any], mark: str, **extra: Any) -> dict[str, Any]:
    return {
        "command": PROBE,
        # The probe reads these through the binding's literal env, like any harness variable.
        "env": {
            "PROBE_HOST_DIR": str(host_dir.path),
            "PROBE_DATA_DIR": str(layout["data"]),
            "PROBE_OTHER_WS": str(layout["other"].working_dir),
            "PROBE_MARK": mark,
        },
        "interrupt_grace_seconds": 0.3,
        **extra,
    }


@needs_bwrap
@pytest.mark.e2e
async def test_runner_hands_the_harness_only_the_tool_token(host, layout, monkeypatch) -> None:
    fake, host_dir = host
    monkeypatch.setenv("AGENTHOST_PLUGIN_SECRET", fake.data.plugin_secret)  # as a runner process would hold it
    mark = new_mark()
    runner = ClaudeCodeRunner(layout["data"])
    rc = fake.run_context("probe", config=_probe_config(host_dir, layout, mark, mcp_transport="stdio"))
    try:
        events = [e async for e in runner.run(rc)]
        assert kinds(events)[-1] == "completed", events[-1]
        report = json.loads(events[-2].message.text)
        env = report["env"]
        assert "AGENTHOST_PLUGIN_SECRET" not in env
        assert env["AGENTHOST_RUN_TOKEN"] == fake.data.tool_token
        values = "\n".join(env.values())
        assert fake.data.plugin_secret not in values and fake.data.token not in values
        assert_walled(report, host_dir, layout)
        assert await gone(mark)
    finally:
        kill_marked(mark)


@needs_bwrap
@pytest.mark.e2e
async def test_the_default_bridge_hands_the_harness_no_credential_at_all(host, layout, monkeypatch) -> None:
    """Claude Code's default transport (mcp_control.py): the bridge answers on the harness's own pipes, so the
    harness holds no token of any kind and nothing it could connect to is written down."""
    fake, host_dir = host
    monkeypatch.setenv("AGENTHOST_PLUGIN_SECRET", fake.data.plugin_secret)
    mark = new_mark()
    rc = fake.run_context("probe", config=_probe_config(host_dir, layout, mark))
    try:
        events = [e async for e in ClaudeCodeRunner(layout["data"]).run(rc)]
        assert kinds(events)[-1] == "completed", events[-1]
        env = json.loads(events[-2].message.text)["env"]
        values = "\n".join(env.values())
        for secret in (fake.data.plugin_secret, fake.data.token, fake.data.tool_token):
            assert secret not in values
        credentials = {"AGENTHOST_RUN_TOKEN", "AGENTHOST_HOST_ADDRESS", "AGENTHOST_PLUGIN_SECRET"}
        credentials.add("AGENTHOST_MCP_TOKEN")
        assert not credentials & set(env)
        workdir = Path(fake.data.get_state("conversation", "external.working_directory"))
        entry = json.loads((workdir / ".agenthost" / "mcp.json").read_text())["mcpServers"]["agenthost"]
        assert entry == {"type": "sdk", "name": "agenthost"}  # no URL, no command, no header
        assert_walled(json.loads(events[-2].message.text), host_dir, layout, api_sock=False)
    finally:
        kill_marked(mark)


@needs_bwrap
@pytest.mark.e2e
async def test_http_bridge_hands_the_harness_only_a_turn_token(host, layout, monkeypatch) -> None:
    """The HTTP transport: the harness holds a token for its own endpoint and nothing of the run's. Without a kept
    process (keep_warm_seconds: 0) that endpoint is the turn's; a kept one's is walled per turn instead
    (tests/external_harness/test_real_clis.py::test_claude_kept_process_answers_the_next_message_with_that_runs_bridge).
    """
    fake, host_dir = host
    monkeypatch.setenv("AGENTHOST_PLUGIN_SECRET", fake.data.plugin_secret)
    runner = ClaudeCodeRunner(layout["data"])
    tokens: list[str] = []
    for _ in range(2):
        mark = new_mark()
        config = _probe_config(host_dir, layout, mark, keep_warm_seconds=0, mcp_transport="http")
        rc = fake.run_context("probe", config=config)
        try:
            events = [e async for e in runner.run(rc)]
            assert kinds(events)[-1] == "completed", events[-1]
            report = json.loads(events[-2].message.text)
            env = report["env"]
            values = "\n".join(env.values())
            for secret in (fake.data.plugin_secret, fake.data.token, fake.data.tool_token):
                assert secret not in values
            assert not {"AGENTHOST_RUN_TOKEN", "AGENTHOST_HOST_ADDRESS", "AGENTHOST_PLUGIN_SECRET"} & set(env)
            tokens.append(env["AGENTHOST_MCP_TOKEN"])
            assert_walled(report, host_dir, layout, api_sock=False)
            # The endpoint the harness was given died with the turn: its port no longer answers.
            workdir = Path(fake.data.get_state("conversation", "external.working_directory"))
            url = json.loads((workdir / ".agenthost" / "mcp.json").read_text())["mcpServers"]["agenthost"]["url"]
            assert fake.data.tool_token not in (workdir / ".agenthost" / "mcp.json").read_text()
            port = int(url.split(":")[2].split("/")[0])
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            assert await gone(mark)
        finally:
            kill_marked(mark)
    assert tokens[0] != tokens[1]  # a fresh credential every turn


class _Service:
    """A plain HTTP service on the host's loopback that answers every request with `answer` (the model API a
    binding names, or something else running on the machine: a gateway, a database's HTTP port)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer.encode()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _Service:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(self.answer))
                writer.write(self.answer)
                await writer.drain()
            writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
def abstract_socket() -> Iterator[str]:
    """A listener on an abstract unix socket of the host's network namespace (D-Bus, X11, dev servers use them)."""
    name = f"agenthost-test-{secrets.token_hex(6)}"
    server = socket.socket(socket.AF_UNIX)
    server.bind("\0" + name)
    server.listen(8)
    try:
        yield name
    finally:
        server.close()


@needs_bwrap
@pytest.mark.parametrize("transport", ["sdk", "http"])
@pytest.mark.e2e
async def test_the_harness_reaches_its_model_endpoint_and_nothing_else_of_the_hosts_network(
    host, layout, abstract_socket, transport
) -> None:
    """What the harness and its commands reach: the binding's model endpoint on the host's loopback (at its own
    URL), through the runner's egress proxy; not another port on that loopback, not an abstract unix socket of
    the host, and not a host off the allow list (a 403 naming it and the setting). Before: the sandbox shared
    the runner's network namespace, and all of those answered."""
    fake, host_dir = host
    mark = new_mark()
    async with _Service("MODEL-API") as api, _Service("HOST-GATEWAY") as other:
        probe = socket.socket(socket.AF_UNIX)
        probe.connect("\0" + abstract_socket)  # controls: both answer from out here
        probe.close()
        socket.create_connection(("127.0.0.1", other.port), timeout=5).close()
        config = _probe_config(
            host_dir,
            layout,
            mark,
            base_url=f"http://127.0.0.1:{api.port}",
            mcp_transport=transport,
            keep_warm_seconds=0,
            network={"allowed_domains": ["*.example.org"]},
        )
        config["env"].update(
            PROBE_TCP_PORT=str(other.port),
            PROBE_ABSTRACT=abstract_socket,
            PROBE_FETCH=f"http://127.0.0.1:{api.port}/v1/models http://localhost:{api.port}/ "
            f"http://127.0.0.1:{other.port}/ http://elsewhere.invalid/",
        )
        try:
            events = [e async for e in ClaudeCodeRunner(layout["data"]).run(fake.run_context("probe", config=config))]
            assert kinds(events)[-1] == "completed", events[-1]
            report = json.loads(events[-2].message.text)
        finally:
            kill_marked(mark)
    assert report["tcp"].startswith("refused"), report["tcp"]
    assert report["abstract"].startswith("refused"), report["abstract"]
    fetched = report["fetched"]
    assert fetched[f"http://127.0.0.1:{api.port}/v1/models"] == "200 MODEL-API", fetched
    assert fetched[f"http://localhost:{api.port}/"] == "200 MODEL-API", fetched
    assert fetched[f"http://127.0.0.1:{other.port}/"].startswith("failed"), fetched
    refused = fetched["http://elsewhere.invalid/"]
    assert refused.startswith("403 agenthost egress proxy refused elsewhere.invalid:80"), refused
    assert f"127.0.0.1:{api.port}" in refused and "*.example.org" in refused and "network.allowed_domains" in refused
    assert report["env"]["HTTPS_PROXY"] == report["env"]["http_proxy"] and report["env"]["HTTPS_PROXY"]


@pytest.mark.e2e
async def test_no_bwrap_refuses_the_run_unless_opted_out(host, layout, monkeypatch, caplog) -> None:
    fake, host_dir = host
    monkeypatch.setattr(walls, "probe", lambda: "bubblewrap is not installed (simulated)")
    mark = new_mark()
    runner = ClaudeCodeRunner(layout["data"])
    try:
        refused = [e async for e in runner.run(fake.run_context("probe", config=_probe_config(host_dir, layout, mark)))]
        assert kinds(refused) == ["failed"] and refused[0].failed.code == "harness_sandbox"
        assert "simulated" in refused[0].failed.message and "process_sandbox: false" in refused[0].failed.message
        assert not marker_pids(mark)  # nothing was started

        config = _probe_config(host_dir, layout, mark, process_sandbox=False)
        with caplog.at_level("WARNING"):
            ran = [e async for e in runner.run(fake.run_context("probe", config=config))]
        assert kinds(ran)[0] == "progress" and "without a sandbox" in ran[0].progress.message
        assert kinds(ran)[-1] == "completed"
        assert any("WITHOUT a sandbox" in r.getMessage() for r in caplog.records)
    finally:
        kill_marked(mark)


@pytest.mark.e2e
async def test_no_tool_token_means_no_bridge(host, layout, monkeypatch) -> None:
    fake, host_dir = host
    mark = new_mark()
    rc = fake.run_context("probe", config=_probe_config(host_dir, layout, mark, process_sandbox=False))
    rc.tool_token = ""  # a host too old to issue one
    try:
        events = [e async for e in ClaudeCodeRunner(layout["data"]).run(rc)]
        notes = [e.progress.message for e in events if e.WhichOneof("kind") == "progress"]
        assert any("bridge not started" in n and "tool token" in n for n in notes), notes
        env = json.loads(events[-2].message.text)["env"]
        assert not any(k.startswith("AGENTHOST_") for k in env), sorted(env)
    finally:
        kill_marked(mark)


# ---- the real Claude Code CLI: the attacks as Bash tool calls ----


def _claude_bin() -> str:
    path = os.environ.get("AGENTHOST_CLAUDE_BIN") or str(REPO / ".tools" / "npm" / "node_modules" / ".bin" / "claude")
    if not os.access(path, os.X_OK):
        pytest.skip("claude CLI not installed: run scripts/install_harness_clis.sh")
    return path


def _attack_command(host_dir: HostDir, layout: dict[str, Any], mark: str) -> str:
    return "; ".join(
        [
            'echo "SECRET=${AGENTHOST_PLUGIN_SECRET:-absent}"',
            'echo "TOKEN=${AGENTHOST_RUN_TOKEN:-absent}"',
            'echo "UID=$(id -u)"',
            f"test -S {host_dir.path}/admin.sock && echo ADMIN=visible || echo ADMIN=absent",
            f"test -e {host_dir.path}/host.db && echo HOSTDB=visible || echo HOSTDB=absent",
            f"test -e {layout['data']}/runner-secret.txt && echo DATADIR=visible || echo DATADIR=absent",
            f"test -e {layout['other'].working_dir} && echo OTHERWS=visible || echo OTHERWS=absent",
            f"(setsid sleep {mark} >/dev/null 2>&1 &)",
            "echo LAUNCHED",
        ]
    )


def _attack_script(command: str):
    def script(req: Request) -> list[dict[str, Any]]:
        if req.steps == 0:
            return [{"type": "tool", "name": "Bash", "input": {"command": command, "description": "probe"}}]
        if "HANG-AFTER" in req.prompt:
            return [{"type": "hang"}]
        return [{"type": "text", "text": f"REPORT {req.last_tool_result}"}]

    return script


def _claude_attack_config(fake: FakeAnthropic, host_dir: HostDir, layout: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": _claude_bin(),
        "base_url": f"http://127.0.0.1:{fake.port}",
        "allowed_tools": ["Bash"],
        "workspace_root": str(layout["data"] / "workspaces"),
        "interrupt_grace_seconds": 1.0,
    }


@pytest.mark.slow
@needs_bwrap
async def test_claude_bash_tool_is_walled_in(host, layout, monkeypatch) -> None:
    fake_host, host_dir = host
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    monkeypatch.setenv("AGENTHOST_PLUGIN_SECRET", fake_host.data.plugin_secret)
    mark = new_mark()
    with FakeAnthropic(_attack_script(_attack_command(host_dir, layout, mark))) as fake:
        config = _claude_attack_config(fake, host_dir, layout)
        try:
            events = [e async for e in ClaudeCodeRunner(layout["data"]).run(fake_host.run_context("go", config=config))]
            assert kinds(events)[-1] == "completed", events[-1]
            report = events[-2].message.text
            assert "LAUNCHED" in report, report  # the tool did run
            for line in ("SECRET=absent", "UID=65534", "ADMIN=absent", "HOSTDB=absent", "DATADIR=absent"):
                assert line in report, report
            # The HTTP bridge keeps the run's tool token in the runner; the model's commands never see it.
            assert "TOKEN=absent" in report and fake_host.data.tool_token not in report
            assert fake_host.data.token not in report and fake_host.data.plugin_secret not in report
            assert await gone(mark), "a setsid process from the Bash tool outlived the run"
        finally:
            kill_marked(mark)


def _network_attack(port: int, abstract: str) -> str:
    code = (
        "import socket, urllib.request, urllib.error\n"
        "def attempt(what, connect):\n"
        "    try:\n        connect(); print(what + '=open')\n"
        "    except urllib.error.HTTPError as e:\n        print(what + '=http-' + str(e.code), e.read().decode())\n"
        "    except OSError as e:\n        print(what + '=closed', e)\n"
        f"attempt('LOOPBACK', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5).close())\n"
        f"attempt('ABSTRACT', lambda: socket.socket(socket.AF_UNIX).connect('\\0{abstract}'))\n"
        "attempt('ELSEWHERE', lambda: urllib.request.urlopen('http://elsewhere.invalid/', timeout=20))\n"
    )
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.slow
@needs_bwrap
async def test_claude_bash_tool_reaches_neither_the_hosts_loopback_nor_its_abstract_sockets(
    host, layout, abstract_socket, monkeypatch
) -> None:
    """The real Claude Code, its model API on the host's loopback, runs the attack through its Bash tool: another
    port of that loopback and an abstract unix socket of the host are closed, a host off the allow list gets the
    proxy's 403, and the turn itself (two model requests through the proxy) completes."""
    fake_host, host_dir = host
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    async with _Service("HOST-GATEWAY") as other:
        socket.create_connection(("127.0.0.1", other.port), timeout=5).close()  # control
        with FakeAnthropic(_attack_script(_network_attack(other.port, abstract_socket))) as fake:
            config = _claude_attack_config(fake, host_dir, layout)
            events = [e async for e in ClaudeCodeRunner(layout["data"]).run(fake_host.run_context("go", config=config))]
    assert kinds(events)[-1] == "completed", events[-1]
    report = events[-2].message.text
    assert "LOOPBACK=closed" in report and "ABSTRACT=closed" in report, report
    assert "ELSEWHERE=http-403" in report and "elsewhere.invalid:80" in report, report
    assert "network.allowed_domains" in report, report


@pytest.mark.slow
@needs_bwrap
async def test_claude_cancel_ends_what_its_bash_tool_started(host, layout, monkeypatch) -> None:
    fake_host, host_dir = host
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    mark = new_mark()
    with FakeAnthropic(_attack_script(_attack_command(host_dir, layout, mark))) as fake:
        config = _claude_attack_config(fake, host_dir, layout)
        runner = ClaudeCodeRunner(layout["data"])
        task = asyncio.create_task(_collect(runner, fake_host.run_context("HANG-AFTER go", config=config)))
        try:
            await appeared(mark, timeout=60)
            for _ in range(1200):  # wait for the model call after the tool, which hangs
                if len(fake.requests) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert len(fake.requests) >= 2, "the harness never came back to the model after the tool"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not runner_mod._LIVE
            assert await gone(mark), "a setsid process from the Bash tool outlived the cancelled run"
            assert not pids_with_env(fake_host.data.tool_token)
        finally:
            fake.hang_event.set()
            if not task.done():
                task.cancel()
            kill_marked(mark)


async def _collect(runner: ClaudeCodeRunner, rc: Any) -> list:
    return [e async for e in runner.run(rc)]


@needs_bwrap
@pytest.mark.e2e
async def test_a_claimed_spare_slot_sees_neither_another_spare_nor_the_spares_dir(host, tmp_path) -> None:
    """A conversation that took a spare runs in the spare's slot: the other slots (a spare waiting for the next
    conversation) and the slots' folder stay out of its sandbox, as other conversations' directories do."""
    fake, host_dir = host
    data = tmp_path / "runner-data"
    manager = WorkspaceManager(data)
    mine, waiting = manager.new_slot("bot-1"), manager.new_slot("bot-1")
    assert manager.claim("bot-1", "conv-1", mine)
    (waiting.path / "other-secret.txt").write_text("the next conversation's")
    (data / "runner-secret.txt").write_text("runner only")
    layout = {"data": data, "ws": manager.workspace("bot-1", "conv-1"), "other": waiting.workspace}
    assert layout["ws"].working_dir == mine.path
    mark = new_mark()
    proc = HarnessProcess(
        [PROBE],
        cwd=mine.path,
        env=probe_env(host_dir, layout, mark, PROBE_LIST=str(mine.path.parent)),
        sandbox=sandbox_for(fake, layout),
    )
    try:
        report = await probe_report(proc)
        assert_walled(report, host_dir, layout)
        assert report["listed"] == [mine.path.name]  # the slots' folder shows its own slot and nothing else
    finally:
        kill_marked(mark)
