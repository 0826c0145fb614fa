"""Placement on workers: a binding's pool, a conversation's stickiness to the worker that served it last (and its
move elsewhere when that worker is gone), least in flight; driven through the real CLI's bind and a real client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agenthost.host.api.client import HostClient
from agenthost.host.server import Host
from tests.cli_process import acli
from tests.workers.helpers import ScriptedWorker, batch, completed, enrolled, text

pytestmark = pytest.mark.slow


async def finish(worker: ScriptedWorker, run_id: str) -> None:
    call, ups = worker.open_run(run_id)
    await call.read()
    ups.put_nowait(batch(text("ok"), completed()))


async def test_pool_stickiness_and_moving_on(host: Host, tmp_path: Path) -> None:
    gpu_a = await enrolled(host, tmp_path / "a", "gpu-a", "--pool", "gpu")
    gpu_b = await enrolled(host, tmp_path / "b", "gpu-b", "--pool", "gpu")
    cpu = await enrolled(host, tmp_path / "c", "cpu", "--pool", "default")
    async with HostClient.for_data_dir(host.data_dir) as client, ScriptedWorker(cpu) as c:
        # A runner only workers offer is bound while one offers it (its manifest checks the config).
        for args in (("bots", "create", "b"), ("bots", "bind", "b", "--runner", "fake/echo", "--pool", "gpu")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        async with ScriptedWorker(gpu_a) as a:
            first = asyncio.create_task(client.send("b", "one", conversation_id="c1"))
            await finish(a, await asyncio.wait_for(a.assigned.get(), 60))
            assert (await asyncio.wait_for(first, 60)).run.status == "completed"
            busy = asyncio.create_task(client.send("b", "busy", conversation_id="c2"))
            busy_run = await asyncio.wait_for(a.assigned.get(), 60)
            async with ScriptedWorker(gpu_b) as b:
                # gpu-a has a run in flight and gpu-b none, but c1's context is on gpu-a: its next run goes there.
                second = asyncio.create_task(client.send("b", "two", conversation_id="c1"))
                await finish(a, await asyncio.wait_for(a.assigned.get(), 60))
                assert (await asyncio.wait_for(second, 60)).run.status == "completed"
                assert b.assigned.empty()
                # A new conversation goes to the least in flight: gpu-b.
                other = asyncio.create_task(client.send("b", "new", conversation_id="c3"))
                await finish(b, await asyncio.wait_for(b.assigned.get(), 60))
                assert (await asyncio.wait_for(other, 60)).run.status == "completed"
                await finish(a, busy_run)
                assert (await asyncio.wait_for(busy, 60)).run.status == "completed"
                # gpu-a goes away: c1 continues on gpu-b.
                await a.__aexit__(None, None, None)
                third = asyncio.create_task(client.send("b", "three", conversation_id="c1"))
                await finish(b, await asyncio.wait_for(b.assigned.get(), 60))
                assert (await asyncio.wait_for(third, 60)).run.status == "completed"
        # The default-pool worker had the least in flight all along and never got a gpu run.
        assert c.assigned.empty()
        # A pool nobody serves: refused at once, saying so.
        for args in (("bots", "create", "n"), ("bots", "bind", "n", "--runner", "fake/echo", "--pool", "nosuch")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        result = await asyncio.wait_for(client.send("n", "hi"), 30)
        assert result.run.error_code == "runner_unavailable" and "pool 'nosuch'" in result.run.error_message


async def test_a_pool_binding_on_a_host_without_workers_is_refused_at_bind_time(tmp_path: Path) -> None:
    """Every run of it would fail `runner_unavailable`: the operator hears so when binding, with what to do."""
    h = Host(tmp_path / "plain", builtin_plugins=False)
    await h.start()
    try:
        await acli(h.data_dir, "bots", "create", "agent")
        rc, _, err = await acli(
            h.data_dir, "bots", "bind", "agent", "--runner", "agenthost/local-agent", "--pool", "gpu"
        )
        assert rc != 0 and "does not listen for workers" in err and "--workers" in err, err
        assert h.registry.bindings(h.registry.bot("agent").bot_id) == []
    finally:
        await h.stop()
