"""A prompt-injected model, end to end, as users deploy it: the built-in local agent runs in the host's supervised,
sandboxed plugin process, talks to a scripted model server on loopback, and the model's shell command runs in the
runner's inner sandbox (nested inside the plugin's). The model tries what the issue observed a real injected model
doing on main; the test reads what came back as the tool result, as the model would, and checks the host's side.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
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
