"""The host killed (-9) while 200 runs stream from 4 workers, all real processes: `agenthost serve --workers`, four
`agenthost worker` processes each running the built-in local agent in its sandbox, a scripted model streaming
slowly on loopback, and 200 clients each streaming one message of its own conversation.

After the host restarts on the same data dir: every message whose run a client saw start is there, its run ended
`interrupted` (none completed, none lost, none left running), no run's events are recorded twice; the workers
reconnect by themselves, drop what the host ended (their runners stop the model streams: nothing runs on, and no
model request is made again), and the next message is served by a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.api.client import HostClient
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text
from tests.cli_process import CLI, acli, cli_env
from tests.workers.helpers import free_port, wait_for

# Bounded: every wait has its own deadline, and the test is cut at 25 minutes (a loaded machine starts the
# four sandboxed workers slowly).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

RUNS = 200
WORKERS = 4
CAPACITY = RUNS // WORKERS
SLOW_TEXT = "streaming " * 400  # 500 pieces of 8 characters, one a second: still streaming when the host dies


async def _worker_lines(home: Path) -> list[str]:
    rc, out, err = await acli(home, "workers", "list")
    assert rc == 0, err
    return [line for line in out.splitlines() if line.startswith("w")]


@contextlib.asynccontextmanager
async def _processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
        for proc in started:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)


async def _start_host(
    home: Path, port: int, log_path: Path, procs: list[asyncio.subprocess.Process]
) -> asyncio.subprocess.Process:
    """`serve --workers` on `port`, its output appended to `log_path`; returns once `status` answers."""
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "--data-dir", str(home), "serve", "--workers", f"127.0.0.1:{port}",
            env=cli_env(), stdout=log, stderr=log,
        )  # fmt: skip
    procs.append(proc)
    deadline = time.monotonic() + 120
    while (await acli(home, "status"))[0] != 0:
        assert proc.returncode is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the host did not come up"
        await asyncio.sleep(0.2)
    return proc


async def _bind_agent(home: Path, model_url: str) -> None:
    """Bot `agent`, bound to the local agent in the default pool (so on a worker), its model the fake at model_url."""
    config = ["model=vllm/m", f"base_url={model_url}/v1", "max_retries=0", "context_window=32000"]
    for args in (
        ("bots", "create", "agent"),
        ("bots", "bind", "agent", "--runner", "agenthost/local-agent", "--pool", "default", "--config", *config),
    ):
        rc, out, err = await acli(home, *args)
        assert rc == 0, out + err


async def test_host_killed_while_200_runs_stream_from_4_workers(tmp_path: Path) -> None:
    home, port = tmp_path / "host", free_port()
    host_log = (tmp_path / "host.log").open("ab")

    began = time.monotonic()
    async with _processes() as procs, FakeProviderServer() as model:
        slow = openai_text(SLOW_TEXT)
        slow.delay = 1.0
        model.default = slow
        host = await _start_host(home, port, tmp_path / "host.log", procs)
        for n in range(WORKERS):
            rc, join, err = await acli(home, "workers", "token", "create")
            assert rc == 0, err
            worker = await asyncio.create_subprocess_exec(
                *CLI, "--data-dir", str(tmp_path / f"w{n}"), "worker", "--host", f"127.0.0.1:{port}",
                "--join", join.strip(), "--name", f"w{n}", "--capacity", str(CAPACITY),
                env=cli_env(), stdout=host_log, stderr=host_log,
            )  # fmt: skip
            procs.append(worker)
        deadline = time.monotonic() + 420
        while sum(" connected " in line and "local-agent" in line for line in await _worker_lines(home)) < WORKERS:
            assert time.monotonic() < deadline, await _worker_lines(home)
            await asyncio.sleep(0.5)
        print(f"{time.monotonic() - began:.0f}s: {WORKERS} workers connected")
        await _bind_agent(home, model.url)

        started: dict[int, str] = {}
        streamed: set[int] = set()

        async def client_of(i: int, client: HostClient) -> None:
            request = hpb.SendMessageRequest(bot="agent", text=f"message {i}", conversation_id=f"c{i}", source="api")
            with contextlib.suppress(errors.AgentHostError):  # the host dying under the stream
                async for reply in client.stream(request, timeout=600):
                    kind = reply.WhichOneof("kind")
                    if kind == "run_started":
                        started[i] = reply.run_started.run_id
                    elif kind == "events" and any(e.HasField("text_delta") for e in reply.events.events):
                        streamed.add(i)
                    elif kind == "run_finished":
                        raise AssertionError(f"run {i} finished before the host was killed: {reply.run_finished}")

        async with HostClient.for_data_dir(home, timeout=120) as client:
            clients = [asyncio.create_task(client_of(i, client)) for i in range(RUNS)]
            try:
                await wait_for(lambda: len(streamed) == RUNS or any(t.done() for t in clients), 420)
                assert len(streamed) == RUNS, [t.exception() for t in clients if t.done()][:3]
                assert len(model.model_requests) == RUNS
                print(f"{time.monotonic() - began:.0f}s: {RUNS} runs streaming; the host killed")
                host.kill()  # kill -9, mid-stream
                await host.wait()
                await asyncio.wait_for(asyncio.gather(*clients), 60)
            finally:
                for t in clients:
                    t.cancel()
        assert len(started) == RUNS

        await _start_host(home, port, tmp_path / "host.log", procs)
        print(f"{time.monotonic() - began:.0f}s: the host restarted")
        async with HostClient.for_data_dir(home, timeout=120) as client:
            runs = (await client.call("ListRuns", hpb.ListRunsRequest(bot="agent", limit=1000))).runs
            assert {r.run_id for r in runs} == set(started.values())  # none lost, none made again
            assert {(r.status, r.error_code) for r in runs} == {("interrupted", "host_restarted")}, runs[0]
            for i, run_id in started.items():
                history = await client.call("GetHistory", hpb.GetHistoryRequest(bot="agent", conversation_id=f"c{i}"))
                users = [item.text for item in history.items if item.role == "user"]
                assert users == [f"message {i}"], (i, users)
                events = (await client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=run_id))).events
                seqs = [e.seq for e in events]
                assert seqs == sorted(set(seqs)), (run_id, seqs)

            # The workers come back by themselves, are told to drop what the host ended, and their runners stop:
            # every model stream is closed, and none is opened again.
            deadline = time.monotonic() + 300
            while True:
                lines = await _worker_lines(home)
                back = sum(" connected " in line and " runs 0/" in line for line in lines)
                if back == WORKERS and not model._conns:
                    break
                assert time.monotonic() < deadline, (lines, len(model._conns))
                await asyncio.sleep(0.5)
            assert len(model.model_requests) == RUNS
            assert all(p.returncode is None for p in procs[1 : 1 + WORKERS]), "a worker exited"

            print(f"{time.monotonic() - began:.0f}s: the workers back, every model stream closed")
            model.push(openai_text("served after the restart"))
            after = await client.send("agent", "and now?", conversation_id="after", timeout=120)
            assert after.run.status == "completed" and "served after the restart" in after.run.text, after.run
            assert len(model.model_requests) == RUNS + 1


async def test_queued_runs_of_a_worker_runner_wait_for_their_worker_after_the_host_restarts(tmp_path: Path) -> None:
    """Messages queued for a runner only workers serve (a pool binding), the host killed -9 and started again: the
    queued runs resume before the worker, real and backing off, has reconnected; they wait for it (the grace,
    limits.WORKER_RECONNECT_GRACE_SECONDS) and run, in order. When no worker comes back within the grace, a queued
    run fails `runner_unavailable` saying it waited."""
    from agenthost.host import limits

    home, port = tmp_path / "host", free_port()
    log_path = tmp_path / "host.log"
    log_file = log_path.open("ab")

    async def worker_connected() -> None:
        deadline = time.monotonic() + 300
        while not any(" connected " in line and "local-agent" in line for line in await _worker_lines(home)):
            assert time.monotonic() < deadline, await _worker_lines(home)
            await asyncio.sleep(0.2)

    async def queue(client: HostClient, texts: list[str]) -> list[str]:
        """Sends each into conversation c; the first runs (its answer streams slowly), the rest wait behind it."""
        run_ids = []
        for n, text in enumerate(texts):
            stream = client.stream(hpb.SendMessageRequest(bot="agent", text=text, conversation_id="c"), timeout=60)
            first = await anext(stream)
            kind = first.WhichOneof("kind")
            assert kind == ("run_started" if n == 0 else "queued"), first
            run_ids.append((first.run_started if n == 0 else first.queued.run).run_id)
            await stream.aclose()  # leaving only unsubscribes
        return run_ids

    async def runs(client: HostClient, run_ids: list[str]) -> list[hpb.RunInfo]:
        return [await client.call("GetRun", hpb.RunRequestById(run_id=r)) for r in run_ids]

    async with _processes() as procs, FakeProviderServer() as model:
        slow = openai_text(SLOW_TEXT)
        slow.delay = 1.0
        model.default = slow
        await _start_host(home, port, log_path, procs)
        rc, join, err = await acli(home, "workers", "token", "create")
        assert rc == 0, err
        worker = await asyncio.create_subprocess_exec(
            *CLI, "--data-dir", str(tmp_path / "w"), "worker", "--host", f"127.0.0.1:{port}",
            "--join", join.strip(), "--name", "w1", env=cli_env(), stdout=log_file, stderr=log_file,
        )  # fmt: skip
        procs.append(worker)
        await worker_connected()
        await _bind_agent(home, model.url)

        async with HostClient.for_data_dir(home, timeout=120) as client:
            ids = await queue(client, ["slow", "second", "third"])
        await wait_for(lambda: len(model.model_requests) == 1, 120)  # "slow" streams on the worker
        procs[0].kill()
        await procs[0].wait()
        model.default = openai_text("answered after the restart")
        await _start_host(home, port, log_path, procs)
        async with HostClient.for_data_dir(home, timeout=120) as client:
            deadline = time.monotonic() + 180
            while any(r.status in ("queued", "running") for r in await runs(client, ids[1:])):
                assert time.monotonic() < deadline, await runs(client, ids)
                await asyncio.sleep(0.2)
            slow_run, *resumed = await runs(client, ids)
            assert (slow_run.status, slow_run.error_code) == ("interrupted", "host_restarted")
            assert [(r.status, r.text) for r in resumed] == [("completed", "answered after the restart")] * 2, resumed
            assert resumed[0].started_at < resumed[1].started_at

            # Again, and this time the worker does not come back: the queued run fails once the grace is over.
            await worker_connected()
            model.default = slow
            ids = await queue(client, ["slow again", "never served"])
        await wait_for(lambda: len(model.model_requests) == 4, 120)
        procs[-1].kill()
        await procs[-1].wait()
        worker.kill()
        await worker.wait()
        began = time.monotonic()
        await _start_host(home, port, log_path, procs)
        async with HostClient.for_data_dir(home, timeout=120) as client:
            deadline = time.monotonic() + 180
            while (last := (await runs(client, ids[1:]))[0]).status in ("queued", "running"):
                assert time.monotonic() < deadline, last
                await asyncio.sleep(0.2)
        assert time.monotonic() - began >= limits.WORKER_RECONNECT_GRACE_SECONDS
        assert (last.status, last.error_code) == ("failed", "runner_unavailable")
        assert "no connected worker in pool 'default' offers runner agenthost/local-agent" in last.error_message
        assert f"waited {limits.WORKER_RECONNECT_GRACE_SECONDS:g} s from its start" in last.error_message
