"""A partition mid-stream, made for real: the worker runs in a network namespace of its own, joined to the host's
by a veth pair, and the host's end is set down while the worker's runner is inside a tool call. Nothing closes
the connection (no FIN, no RST): the host learns it from the missing heartbeats. The run ends runner_lost within
ten seconds; when the link comes back the worker reconnects, what it still ran of the lost run is stopped, and the
next run of the conversation is served. Needs root and iproute2 (skipped otherwise)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.host.api.client import HostClient
from agenthost.host.server import Host
from agenthost.host.workers.agent import enrol
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from tests.cli_process import CLI, acli, cli_env
from tests.local_agent.test_e2e import sleepers
from tests.workers.helpers import token, wait_for

pytestmark = pytest.mark.slow


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str]]:
    """(namespace, host address, host-side link), torn down after."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 100000}"
    ns, host_link, worker_link = f"ahw{tag}", f"ahh{tag}", f"ahv{tag}"
    octet = os.getpid() % 250 + 1
    host_ip, worker_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a network namespace here: {exc}")
    try:
        ip("link", "add", host_link, "type", "veth", "peer", "name", worker_link)
        ip("link", "set", worker_link, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", host_link)
        ip("link", "set", host_link, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{worker_ip}/30", "dev", worker_link)
        ip("netns", "exec", ns, "ip", "link", "set", worker_link, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_ip, host_link
    finally:
        subprocess.run(["ip", "link", "del", host_link], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class ReachableProvider(FakeProviderServer):
    """The scripted model, listening on the host's end of the veth so the worker's runner reaches it."""

    def __init__(self, bind: str) -> None:
        super().__init__()
        self.bind = bind

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    async def __aenter__(self) -> ReachableProvider:
        self._server = await asyncio.start_server(self._handle, self.bind, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self


async def test_partition_mid_tool_call(netns: tuple[str, str, str], tmp_path: Path) -> None:
    ns, host_ip, host_link = netns
    marker = f"41.{os.getpid() % 10000:04d}"
    host = Host(tmp_path / "host", builtin_plugins=False, workers_address=f"{host_ip}:0")
    await host.start()
    proc = None
    try:
        assert host.workers is not None
        hub = host.workers
        worker_dir = tmp_path / "worker"
        await enrol(worker_dir, f"{host_ip}:{hub.port}", await token(host), "w1")
        async with ReachableProvider(host_ip) as server:
            proc = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", ns, *CLI, "--data-dir", str(worker_dir), "worker",
                "--host", f"{host_ip}:{hub.port}",
                env=cli_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            await wait_for(lambda: "w1" in hub.sessions and hub.sessions["w1"].offers, 90)
            config = ["model=vllm/m", f"base_url={server.url}/v1", "max_retries=0", "context_window=32000"]
            for args in (
                ("bots", "create", "agent"),
                ("bots", "bind", "agent", "--runner", "agenthost/local-agent", "--config", *config),
            ):
                rc, out, err = await acli(host.data_dir, *args)
                assert rc == 0, out + err
            server.push(openai_tool_calls([("k1", "shell", {"command": f"sleep {marker}"})], text="Running it."))
            async with HostClient.for_data_dir(host.data_dir) as client:
                send = asyncio.create_task(client.send("agent", "run the slow job", conversation_id="k"))
                await wait_for(lambda: bool(sleepers(marker)) or send.done(), 60)
                assert not send.done(), send.result().run
                ip("link", "set", host_link, "down")
                began = time.monotonic()
                result = await asyncio.wait_for(send, 30)
                lost_in = time.monotonic() - began
                assert result.run.error_code == "runner_lost", result.run
                assert lost_in <= 10, lost_in
                assert "w1" not in hub.sessions
                # The link comes back: the worker reconnects by itself and stops what it still ran of that run.
                ip("link", "set", host_link, "up")
                await wait_for(lambda: "w1" in hub.sessions, 90)
                await wait_for(lambda: not sleepers(marker), 60)
                server.push(openai_text("It was cut off."))
                again = await asyncio.wait_for(client.send("agent", "did it finish?", conversation_id="k"), 90)
                assert again.run.status == "completed", again.run
                rc, out, _ = await acli(host.data_dir, "runs", "list")
                assert out.count("runner_lost") == 1 and out.count("completed") == 1, out
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await host.stop()
