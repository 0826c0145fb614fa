"""Runner plugin processes that crash, hang, print garbage or never get ready — real processes, real host."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
from robustness.pids import alive, outer_pid

from agenthost.host.api.client import HostClient
from agenthost.host.processes.supervisor import SupervisorPolicy, describe_exit
from agenthost.host.server import Host
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

pytestmark = pytest.mark.slow
FAULTY = str(Path(__file__).parent / "fixtures" / "faulty-plugin")
# A start that is slow (a loaded machine takes seconds to start Python under bubblewrap) is not what these tests
# test: the start timeout is generous, and only the test of a plugin that never answers shortens it.
POLICY = SupervisorPolicy(
    start_timeout=20,
    health_timeout=2,
    shutdown_grace=0.5,
    term_grace=0.5,
    backoff_base=0.05,
    backoff_max=0.2,
    restart_limit=2,
    stable_after=5,
)


@pytest.fixture
async def host(tmp_path, monkeypatch, reused_plugin_installs):
    monkeypatch.delenv("AGENTHOST_TEST_FAULT", raising=False)
    h = Host(tmp_path / "data", policy=POLICY, builtin_plugins=False)
    await h.start()
    client = HostClient(h.admin_address, token=h.admin_token)
    yield h, client
    await client.close()
    await h.stop()


async def install_and_bind(h: Host, client: HostClient, timeout: float = 0) -> None:
    await h.install_plugin(FAULTY, offline=True)
    await client.call("CreateBot", hpb.CreateBotRequest(name="b"))
    await client.bind("b", "agenthost-faulty/faulty", timeout_seconds=timeout)


async def test_bad_manifest_is_an_install_error(host, monkeypatch):
    h, _ = host
    monkeypatch.setenv("AGENTHOST_TEST_FAULT", "bad_manifest")
    with pytest.raises(Exception, match="manifest"):
        await h.install_plugin(FAULTY, offline=True)
    assert [p.plugin_id for p in h.registry.plugins()] == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("crash_at_start", "exited with code 7 before the handshake"),
        ("garbage", "unrecognized handshake line"),
        ("never_ready", "no handshake within"),
    ],
)
async def test_start_failures_are_reported_and_the_breaker_opens(host, monkeypatch, fault, reason):
    h, client = host
    await install_and_bind(h, client)
    await h.supervisor.stop("agenthost-faulty")
    monkeypatch.setenv("AGENTHOST_TEST_FAULT", fault)
    if fault == "never_ready":
        h.supervisor.policy = dataclasses.replace(POLICY, start_timeout=1)
    with pytest.raises(Exception, match="did not start|dead|did not become ready"):
        await h.supervisor.start("agenthost-faulty")
    pp = h.supervisor.processes["agenthost-faulty"]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pp.wait_for_state("dead"), 60)
    assert pp.state == "dead"
    assert reason in pp.last_error
    assert pp.proc is None or pp.proc.returncode is not None  # reaped, no zombie
    result = await client.send("b", "hello")
    assert result.run.status == "failed" and result.run.error_code == "runner_unavailable"
    assert reason in result.run.error_message


async def test_crash_mid_run_fails_the_run_and_the_plugin_restarts(host):
    h, client = host
    await install_and_bind(h, client)
    first_pid = h.supervisor.processes["agenthost-faulty"].proc.pid
    result = await client.send("b", "crash")
    assert result.run.status == "failed"
    assert result.run.error_code == "runner_crashed"
    assert "SIGKILL" in result.run.error_message
    assert "about to crash" in result.run.text  # what was streamed before the crash is kept
    ok = await client.send("b", "after")  # the supervisor restarted it
    assert ok.run.status == "completed" and ok.text == "ok: after", ok.run.error_message
    assert h.supervisor.processes["agenthost-faulty"].proc.pid != first_pid


async def test_a_runner_killed_by_a_signal_is_reported_by_its_signal(host):
    """`kill -9` of the plugin's process (the pid the supervisor started, bwrap when sandboxed) mid-run: the run
    says which signal, not "exited with code -9"."""
    h, client = host
    await install_and_bind(h, client)
    pid = h.supervisor.processes["agenthost-faulty"].proc.pid
    sending = asyncio.create_task(client.send("b", "sleep"))
    deadline = time.monotonic() + 30
    while not any(st.info.status == "running" for st in h.runs._live.values()):
        assert time.monotonic() < deadline and not sending.done(), "the run never started"
        await asyncio.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    result = await asyncio.wait_for(sending, 30)
    assert result.run.status == "failed" and result.run.error_code == "runner_crashed"
    assert result.run.error_message == "runner process killed by SIGKILL during the run", result.run.error_message


def test_exit_descriptions_name_the_signal() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGTERM, sandboxed=True) == "killed by SIGTERM"
    assert describe_exit(128 + signal.SIGSEGV, sandboxed=True) == "killed by SIGSEGV"  # bwrap's report
    assert describe_exit(137) == "exited with code 137"  # unsandboxed, 137 is just a code
    assert describe_exit(3) == "exited with code 3" and describe_exit(None) == "still running"


async def test_cancel_and_deadline(host):
    """A cancel ends a running run at once (cancelled, not left to run out its deadline); a deadline ends one that
    runs past it (timed_out). The run sleeps far longer than the test waits, so its status says which ended it: no
    clock is read, and a loaded machine changes nothing."""
    h, client = host
    await install_and_bind(h, client, timeout=300)
    task = asyncio.create_task(client.send("b", "sleep"))
    for _ in range(1000):
        live = h.runs._live
        if live and next(iter(live.values())).info.status == "running":
            break
        await asyncio.sleep(0.02)
    run_id = next(iter(h.runs._live))
    cancelled = await client.call("CancelRun", hpb.RunRequestById(run_id=run_id))
    assert cancelled.status == "cancelled"
    assert (await asyncio.wait_for(task, 60)).run.status == "cancelled"
    with pytest.raises(errors.FailedPrecondition):
        await client.call("CancelRun", hpb.RunRequestById(run_id=run_id))
    await client.call("CreateBot", hpb.CreateBotRequest(name="short"))
    await client.bind("short", "agenthost-faulty/faulty", timeout_seconds=1.5)
    timed = await client.send("short", "sleep")
    assert timed.run.status == "timed_out"


async def test_shutdown_ladder_kills_grandchildren_and_term_ignorers(host):
    h, client = host
    await install_and_bind(h, client)
    pid = h.supervisor.processes["agenthost-faulty"].proc.pid
    grandchild = outer_pid(int((await client.send("b", "spawn")).text), pid)
    assert alive(grandchild)
    assert (await client.send("b", "ignore_term")).run.status == "completed"
    t0 = time.monotonic()
    await h.supervisor.stop("agenthost-faulty")
    assert time.monotonic() - t0 < 5
    await asyncio.sleep(0.2)
    assert not alive(pid)
    assert not alive(grandchild)


async def test_second_host_on_same_data_dir_is_refused(host):
    h, _ = host
    from agenthost.host.server import HostAlreadyRunning

    with pytest.raises(HostAlreadyRunning, match="another agenthost"):
        await Host(h.data_dir, builtin_plugins=False).start()
