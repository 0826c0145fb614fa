"""Workers that fail or misbehave: silent (partitioned) mid-run, killed with kill -9 mid tool call, drained,
revoked mid-run, offering a local plugin's id or a flood of offers, taking runs they never finish; and a host
restart under a connected worker. Each with its observed outcome."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agenthost.host.api.client import HostClient
from agenthost.host.server import Host
from agenthost.host.store.registry import PluginRecord
from agenthost.host.workers.hub import LOST_AFTER_SECONDS, WATCH_SECONDS
from agenthost.protos import worker_pb2 as wpb
from tests.cli_process import CLI, acli, cli_env
from tests.workers.helpers import (
    ECHO_MANIFEST,
    ScriptedWorker,
    address,
    batch,
    completed,
    enrolled,
    free_port,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow


async def bind_echo(host: Host, *extra: str) -> None:
    for args in (("bots", "create", "b"), ("bots", "bind", "b", "--runner", "fake/echo", *extra)):
        rc, out, err = await acli(host.data_dir, *args)
        assert rc == 0, out + err


async def test_a_silent_worker_loses_its_runs_within_ten_seconds_and_drops_them_when_back(
    host: Host, tmp_path: Path
) -> None:
    assert host.workers is not None
    identity = await enrolled(host, tmp_path / "w", "w1")
    async with HostClient.for_data_dir(host.data_dir) as client:
        async with ScriptedWorker(identity) as w1:
            await bind_echo(host)
            send = asyncio.create_task(client.send("b", "hi", conversation_id="c"))
            run_id = await asyncio.wait_for(w1.assigned.get(), 60)
            call, ups = w1.open_run(run_id)
            await call.read()
            ups.put_nowait(batch(text("partial")))
            await wait_for(lambda: host.runs._live[run_id].seq >= 1)
            # A partition: the worker's process is alive but nothing of it reaches the host any more.
            w1.heartbeats = False
            silent_since = host.workers.sessions["w1"].last_heartbeat
            result = await asyncio.wait_for(send, 60)
            lost_after = time.time() - silent_since
            assert result.run.status == "failed" and result.run.error_code == "runner_lost", result.run
            assert lost_after <= LOST_AFTER_SECONDS + WATCH_SECONDS + 3 <= 10, lost_after
            # What the worker sends after the host ended the run is never recorded (nothing twice, nothing late).
            ups.put_nowait(batch(text("late"), completed()))
            rc, out, _ = await acli(host.data_dir, "runs", "show", run_id, "--events")
            assert "late" not in out and "runner_lost" in out
        # Back after the partition, still holding the run: the host tells it to drop it.
        async with ScriptedWorker(identity, held_runs=[run_id]) as again:
            await wait_for(lambda: any(d.WhichOneof("kind") == "drop" for d in again.downs))
            assert [d.drop.run_id for d in again.downs if d.WhichOneof("kind") == "drop"] == [run_id]


async def test_drain_keeps_in_flight_runs_and_revoke_ends_them(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    one = await enrolled(host, tmp_path / "one", "one")
    two = await enrolled(host, tmp_path / "two", "two")
    async with HostClient.for_data_dir(host.data_dir) as client:
        async with ScriptedWorker(one) as w1:
            await bind_echo(host)
            # c1's context is on `one` (it served it), and `one` will have a run in flight when it is drained.
            zero = asyncio.create_task(client.send("b", "zero", conversation_id="c1"))
            call0, ups0 = w1.open_run(await asyncio.wait_for(w1.assigned.get(), 60))
            await call0.read()
            ups0.put_nowait(batch(text("z"), completed()))
            assert (await asyncio.wait_for(zero, 60)).run.status == "completed"
            first = asyncio.create_task(client.send("b", "first", conversation_id="c2"))
            run1 = await asyncio.wait_for(w1.assigned.get(), 60)
            async with ScriptedWorker(two) as w2:
                rc, out, err = await acli(host.data_dir, "workers", "drain", "one")
                assert rc == 0 and "draining" in out, out + err
                await wait_for(lambda: any(d.drain for d in w1.downs))
                # c1's next run would go to `one` (stickiness): drained, it goes to the other worker.
                second = asyncio.create_task(client.send("b", "second", conversation_id="c1"))
                run2 = await asyncio.wait_for(w2.assigned.get(), 60)
                assert w1.assigned.empty()
                # The drained worker's run in flight finishes normally.
                call1, ups1 = w1.open_run(run1)
                await call1.read()
                ups1.put_nowait(batch(text("done"), completed()))
                assert (await asyncio.wait_for(first, 60)).run.status == "completed"
                # Revoked mid-run: its run ends at once, runner_lost.
                call2, _ = w2.open_run(run2)
                await call2.read()
                began = time.monotonic()
                rc, out, err = await acli(host.data_dir, "workers", "revoke", "two")
                assert rc == 0, err
                result = await asyncio.wait_for(second, 30)
                assert result.run.error_code == "runner_lost" and "revoked" in result.run.error_message
                assert time.monotonic() - began < 10


async def test_offers_colliding_with_a_local_plugin_or_flooding_are_refused(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    await host.registry.put_plugin(
        PluginRecord("fake", "fake", "0", "test", False, False, "python3", "[]", "a local plugin named fake")
    )
    identity = await enrolled(host, tmp_path / "w", "w")
    flood = [wpb.WorkerOffer(plugin_id=f"p{i}", manifests_json=[ECHO_MANIFEST] * 200) for i in range(300)]
    async with ScriptedWorker(identity, offers=[wpb.WorkerOffer(plugin_id="fake", manifests_json=[ECHO_MANIFEST])]):
        assert host.workers.sessions["w"].offers == []
        rc, out, _ = await acli(host.data_dir, "workers", "list")
        assert "runners: -" in out
        # The run goes to the local plugin (disabled here: refused as such), never to the worker's code.
        await acli(host.data_dir, "bots", "create", "b")
        rc, out, err = await acli(host.data_dir, "bots", "bind", "b", "--runner", "fake/echo")
        assert rc != 0 and "offers no runner" in err, out + err
    async with ScriptedWorker(identity, offers=flood):
        offers = host.workers.sessions["w"].offers
        # 64 runners a plugin, WORKER_MAX_RUNNERS (256) in all.
        assert len(offers) == 4 and all(len(o.manifests_json) == 64 for o in offers)


async def test_a_worker_offering_malformed_manifests_does_not_break_workers_list(host: Host, tmp_path: Path) -> None:
    """A compromised worker offers manifests that are not JSON objects (and a plugin id with a terminal escape):
    `workers list` raised on them for every worker, so the operator could not see (nor name to revoke) any. Now
    only the runners that parse are listed, and the escape is shown inert."""
    assert host.workers is not None
    identity = await enrolled(host, tmp_path / "w", "odd")
    offers = [
        wpb.WorkerOffer(plugin_id="fake", version="1", manifests_json=["not json", "[1]", '"x"', ECHO_MANIFEST]),
        wpb.WorkerOffer(plugin_id="evil\x1b]0;owned\x07", version="2", manifests_json=[ECHO_MANIFEST]),
    ]
    async with ScriptedWorker(identity, offers=offers):
        rc, out, err = await acli(host.data_dir, "workers", "list")
        assert rc == 0, out + err
        assert "odd" in out and "fake/echo 1" in out, out
        assert "\x1b" not in out and "\x07" not in out, repr(out)
        rc, out, err = await acli(host.data_dir, "workers", "list", "--json")
        assert rc == 0, out + err


async def test_a_heartbeat_flood_is_read_at_a_bounded_rate(host: Host, tmp_path: Path) -> None:
    """A compromised worker sends heartbeats as fast as it can: the host read every one (~0.7 of a core spent on
    it). Now it reads at most WORKER_CONTROL_MESSAGES_PER_SECOND, and flow control holds the rest in the worker."""
    from agenthost.host import limits

    assert host.workers is not None
    identity = await enrolled(host, tmp_path / "w", "loud")
    rate = limits.WORKER_CONTROL_MESSAGES_PER_SECOND
    async with ScriptedWorker(identity) as worker:
        worker.heartbeats = False
        session = host.workers.sessions["loud"]
        start = time.monotonic()
        for _ in range(5000):
            worker._outbox.put_nowait(wpb.WorkerUp(heartbeat=wpb.WorkerHeartbeat()))
        await wait_for(lambda: session.messages >= 5000 or time.monotonic() - start > 3.0)
        read, elapsed = session.messages, time.monotonic() - start
        assert read <= rate * (elapsed + 1) + 1, (read, elapsed)
        assert host.workers.sessions.get("loud") is session  # still connected: its heartbeats were read in time


async def test_a_worker_holding_calls_open_is_capped_and_the_others_are_not(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compromised, enrolled worker opens run-API calls on the workers port and never sends their request: each
    was held by the host without bound. Past WORKER_MAX_CALLS it is refused RESOURCE_EXHAUSTED before a request
    is read; another worker still connects and serves; and once its calls end the capped worker may call again."""
    import grpc

    from agenthost.host import limits
    from agenthost.protos import run_api_pb2 as api

    assert host.workers is not None
    monkeypatch.setattr(limits, "WORKER_MAX_CALLS", 64)
    hog = await enrolled(host, tmp_path / "hog", "hog")
    honest = await enrolled(host, tmp_path / "honest", "honest")
    never = asyncio.Event()

    async def silence():  # noqa: ANN202 — a request stream that never yields
        await never.wait()
        yield api.HistoryPageRequest()

    extra = 32
    async with hog.channel() as channel:
        page = channel.stream_unary(
            "/agenthost.v1.AgentRunAPIProxy/HistoryPage",
            request_serializer=api.HistoryPageRequest.SerializeToString,
            response_deserializer=api.HistoryPageResponse.FromString,
        )
        held = [page(silence(), timeout=120) for _ in range(limits.WORKER_MAX_CALLS + extra)]
        await wait_for(lambda: sum(call.done() for call in held) >= extra)
        refused = []
        for call in [call for call in held if call.done()]:
            with pytest.raises(grpc.RpcError) as ended:
                await call
            refused.append((ended.value.code(), ended.value.details()))
        assert len(refused) == extra, refused
        assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED for code, _ in refused), refused
        assert "calls open on the workers port, the most one worker may hold" in (refused[0][1] or "")
        async with ScriptedWorker(honest):  # welcomed while the other holds its share
            assert "honest" in host.workers.sessions
        for call in held:
            call.cancel()
    never.set()
    async with ScriptedWorker(hog):  # its calls ended: it may call again
        assert "hog" in host.workers.sessions


async def test_capacity_least_in_flight_and_runs_never_finished(host: Host, tmp_path: Path) -> None:
    """A worker that takes runs and never finishes them holds only its declared capacity; its runs end at their
    deadline; the other worker's runs are not slowed (they complete while the first one's are stuck)."""
    assert host.workers is not None
    one = await enrolled(host, tmp_path / "one", "one")
    two = await enrolled(host, tmp_path / "two", "two")
    async with HostClient.for_data_dir(host.data_dir) as client:
        async with ScriptedWorker(one, capacity=1) as stuck, ScriptedWorker(two, capacity=2) as good:
            await bind_echo(host, "--timeout", "8")
            sends = [asyncio.create_task(client.send("b", f"m{i}", conversation_id=f"c{i}")) for i in range(3)]
            taken_by_good: list[str] = []
            stuck_run = await asyncio.wait_for(stuck.assigned.get(), 60)
            for _ in range(2):
                taken_by_good.append(await asyncio.wait_for(good.assigned.get(), 60))
            assert len(host.workers.sessions["one"].runs) == 1 and len(host.workers.sessions["two"].runs) == 2
            for run_id in taken_by_good:
                call, ups = good.open_run(run_id)
                await call.read()
                ups.put_nowait(batch(text("ok"), completed()))
            results = await asyncio.wait_for(asyncio.gather(*sends), 60)
            by_id = {r.run.run_id: r.run for r in results}
            assert all(by_id[r].status == "completed" for r in taken_by_good)
            assert by_id[stuck_run].status == "timed_out"


async def test_kill_9_of_a_real_worker_mid_tool_call(host: Host, tmp_path: Path) -> None:
    from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
    from tests.local_agent.test_e2e import sleepers

    assert host.workers is not None
    marker = f"37.{os.getpid() % 10000:04d}"
    worker_dir = tmp_path / "worker"
    await enrolled(host, worker_dir, "w1")

    async def start_worker() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *CLI, "--data-dir", str(worker_dir), "worker", "--host", address(host),
            env=cli_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async with FakeProviderServer() as server:
        proc = await start_worker()
        try:
            await wait_for(lambda: "w1" in host.workers.sessions and host.workers.sessions["w1"].offers, 90)
            config = f"base_url={server.url}/v1"
            for args in (
                ("bots", "create", "agent"),
                ("bots", "bind", "agent", "--runner", "agenthost/local-agent", "--config", "model=vllm/m",
                 config, "max_retries=0", "context_window=32000"),
            ):  # fmt: skip
                rc, out, err = await acli(host.data_dir, *args)
                assert rc == 0, out + err
            server.push(openai_tool_calls([("k1", "shell", {"command": f"sleep {marker}"})], text="Running it."))
            async with HostClient.for_data_dir(host.data_dir) as client:
                send = asyncio.create_task(client.send("agent", "run the slow job", conversation_id="k"))
                await wait_for(lambda: bool(sleepers(marker)) or send.done(), 60)
                assert not send.done(), send.result().run
                began = time.monotonic()
                os.kill(proc.pid, signal.SIGKILL)
                result = await asyncio.wait_for(send, 30)
                assert result.run.status == "failed" and result.run.error_code == "runner_lost", result.run
                assert time.monotonic() - began <= 10
                # The worker's runner and the command it ran died with it (lifeline, --die-with-parent).
                await wait_for(lambda: not sleepers(marker), 20)
                await proc.wait()
                # Restarted, the worker serves the conversation again, from the host's history.
                proc = await start_worker()
                await wait_for(lambda: "w1" in host.workers.sessions and host.workers.sessions["w1"].offers, 90)
                server.push(openai_text("It was interrupted."))
                again = await asyncio.wait_for(client.send("agent", "did it finish?", conversation_id="k"), 90)
                assert again.run.status == "completed", again.run
                rc, out, _ = await acli(host.data_dir, "runs", "list")
                assert out.count("runner_lost") == 1
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_workers_reconnect_after_a_host_restart(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "host"
    host = Host(data, builtin_plugins=False, workers_address=f"127.0.0.1:{port}")
    await host.start()
    worker_dir = tmp_path / "worker"
    await enrolled(host, worker_dir, "w1")
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--data-dir", str(worker_dir), "worker", "--host", f"127.0.0.1:{port}",
        env=cli_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert host.workers is not None
        await wait_for(lambda: "w1" in host.workers.sessions and host.workers.sessions["w1"].offers, 90)
        await host.stop()
        host = Host(data, builtin_plugins=False, workers_address=f"127.0.0.1:{port}")
        await host.start()
        assert host.workers is not None
        hub = host.workers
        await wait_for(lambda: "w1" in hub.sessions and hub.sessions["w1"].offers, 60)
        for args in (
            ("bots", "create", "agent"),
            ("bots", "bind", "agent", "--runner", "agenthost/local-agent", "--config", "model=demo/offline"),
        ):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        rc, out, err = await acli(host.data_dir, "send", "agent", "after the restart")
        assert rc == 0 and "after the restart" in out, out + err
        assert proc.returncode is None
    finally:
        proc.kill()
        await proc.wait()
        await host.stop()


async def test_a_worker_offering_wider_permissions_later_widens_no_grant(host: Host, tmp_path: Path) -> None:
    """The binding is made while an honest worker offers `fake/echo` asking for history.page only. A compromised
    worker then offers the same runner id asking for events.page too and takes the next run: its grant came from
    what that worker offered (the first found), so it read the conversation's events. Now the binding keeps the
    manifest it was made with, and the run's grant comes from that."""
    import grpc

    from agenthost.protos import errors
    from agenthost.protos import run_api_pb2 as api

    honest = await enrolled(host, tmp_path / "honest", "honest")
    rogue = await enrolled(host, tmp_path / "rogue", "rogue")
    async with ScriptedWorker(honest):
        for args in (("bots", "create", "b"), ("bots", "bind", "b", "--runner", "fake/echo")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
    assert host.workers is not None
    await wait_for(lambda: "honest" not in host.workers.sessions)
    wider = '{"name": "echo", "permissions": {"apis": ["history.page", "events.page"]}}'
    async with ScriptedWorker(rogue, offers=[wpb.WorkerOffer(plugin_id="fake", manifests_json=[wider])]) as worker:
        async with HostClient.for_data_dir(host.data_dir) as client:
            send = asyncio.create_task(client.send("b", "hi", conversation_id="c"))
            run_id = await asyncio.wait_for(worker.assigned.get(), 60)
            call, ups = worker.open_run(run_id)
            request = (await call.read()).request
            assert worker.channel is not None
            credentials = [("authorization", f"Bearer {request.run_token}")]
            page = await worker.history(run_id, request.run_token)  # what the bound manifest asked for: served
            assert [i.text for i in page.items] == ["hi"]
            with pytest.raises(grpc.RpcError) as caught:
                await worker.channel.unary_unary(
                    "/agenthost.v1.AgentRunAPIProxy/EventPage",
                    request_serializer=api.EventPageRequest.SerializeToString,
                    response_deserializer=api.EventPageResponse.FromString,
                )(api.EventPageRequest(run_id=run_id), metadata=credentials, timeout=30)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value.details()
            ups.put_nowait(batch(text("ok"), completed()))
            ups.put_nowait(None)
            result = await asyncio.wait_for(send, 60)
            assert result.run.status == "completed", result.run
        # A binding made before bindings kept their manifest: refused at send, saying how to pin one.
        await host.registry.db.write(lambda conn: conn.execute("UPDATE bindings SET manifest_json = ''"))
        async with HostClient.for_data_dir(host.data_dir) as client:
            with pytest.raises(errors.FailedPrecondition, match="agenthost bots update-binding"):
                await client.send("b", "again", conversation_id="c")


def slow_offers() -> list[wpb.WorkerOffer]:
    """64 plugins of 64 runners, each config schema unlike the others (no verdict cache helps)."""
    import json

    def manifest(i: int, j: int) -> str:
        fields = {f"p{i}_{j}_{k}": {"type": "string", "pattern": "^a+$", "minLength": k} for k in range(6)}
        schema = {"type": "object", "properties": fields}
        return json.dumps({"name": f"r{j}", "description": "slow", "version": "1", "config_schema": schema})

    return [
        wpb.WorkerOffer(plugin_id=f"p{i}", version="1", manifests_json=[manifest(i, j) for j in range(64)])
        for i in range(64)
    ]


async def test_a_hello_of_manifests_made_to_be_slow_neither_stalls_the_host_nor_is_taken_whole(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each offered runner's manifest is validated and its config schema checked (jsonschema, milliseconds each; the
    verdict cache does not help against schemas that all differ). A hello of 64 × 64 such manifests took ~17 CPU-s,
    on the host's event loop: every run, the admin API and the gateway stood still, again at every reconnect. Now at
    most WORKER_MAX_RUNNERS are taken, and they are validated off the event loop."""
    import threading

    from agenthost.host import limits
    from agenthost.plugins.manifest import RunnerManifest

    assert host.workers is not None
    loop_thread = threading.get_ident()
    on_loop: list[int] = []
    parse = RunnerManifest.parse_json

    def watched(raw: str) -> RunnerManifest:
        on_loop.append(threading.get_ident() == loop_thread)
        return parse(raw)

    monkeypatch.setattr(RunnerManifest, "parse_json", staticmethod(watched))

    identity = await enrolled(host, tmp_path / "w", "slow")
    async with ScriptedWorker(identity, offers=slow_offers()):
        session = host.workers.sessions["slow"]
        assert sum(len(o.manifests_json) for o in session.offers) == limits.WORKER_MAX_RUNNERS
        assert len(session.runners) == limits.WORKER_MAX_RUNNERS
        assert len(on_loop) == limits.WORKER_MAX_RUNNERS, len(on_loop)
        assert not any(on_loop), "manifests were validated on the host's event loop"
        rc, out, err = await acli(host.data_dir, "workers", "list")
        assert rc == 0 and "slow" in out, out + err


async def test_a_worker_reconnecting_in_a_loop_cannot_flood_the_hosts_log(
    host: Host, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every Connect wrote a line when it came and one when it went, and one per offer colliding with a local
    plugin (up to 64 a hello): an enrolled worker connecting again and again wrote the host's log as fast as it
    liked. Those lines are now limited per worker and kind, as refusals are."""
    import logging

    from agenthost.host.ops import logs

    assert host.workers is not None
    await host.registry.put_plugin(
        PluginRecord("fake", "fake", "0", "test", False, False, "python3", "[]", "a local plugin named fake")
    )
    identity = await enrolled(host, tmp_path / "w", "loop")
    colliding = [wpb.WorkerOffer(plugin_id="fake", manifests_json=[ECHO_MANIFEST])] * 8
    caplog.set_level(logging.INFO, logger="agenthost.host.workers.hub")
    rounds = 40
    for _ in range(rounds):
        async with ScriptedWorker(identity, offers=colliding):
            pass
    lines = [r for r in caplog.records if r.name == "agenthost.host.workers.hub"]
    # Three kinds (connect, disconnect, offer), each at most REFUSALS_PER_WINDOW and a summary line.
    assert len(lines) <= 3 * (logs.REFUSALS_PER_WINDOW + 1), f"{len(lines)} lines for {rounds} connections"
    assert any("connected from" in r.getMessage() for r in lines)


async def test_hellos_sent_at_once_by_one_worker_are_read_one_at_a_time(host: Host, tmp_path: Path) -> None:
    """Each hello's manifests are validated in a thread: a worker opening Connect after Connect would have each take
    one. While one of its hellos is read, another is refused RESOURCE_EXHAUSTED; the first is answered."""
    import grpc

    identity = await enrolled(host, tmp_path / "w", "eager")
    hello = wpb.WorkerUp(hello=wpb.WorkerHello(offers=slow_offers(), capacity=1))

    async def first_answer(channel: grpc.aio.Channel) -> str:
        async def up():  # noqa: ANN202 — the hello, then the stream stays open
            yield hello
            await asyncio.Event().wait()

        call = channel.stream_stream(
            "/agenthost.v1.WorkerHub/Connect",
            request_serializer=wpb.WorkerUp.SerializeToString,
            response_deserializer=wpb.WorkerDown.FromString,
        )(up())
        try:
            async for down in call:
                return down.WhichOneof("kind") or ""
            return "ended"
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        finally:
            call.cancel()

    async with identity.channel() as channel:
        answers = await asyncio.wait_for(asyncio.gather(*(first_answer(channel) for _ in range(4))), 120)
    assert answers.count("welcome") >= 1, answers
    refused = [a for a in answers if a != "welcome"]
    assert refused and all(a.startswith("RESOURCE_EXHAUSTED") and "already connecting" in a for a in refused), answers


async def test_a_worker_revoked_while_its_hello_is_read_is_not_taken(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hello's offers are read in a thread, so the host goes on meanwhile: a worker revoked in that time must not
    come out of it connected (revoking cuts only the sessions that exist)."""
    import threading

    import grpc

    from agenthost.host.workers import hub

    assert host.workers is not None
    reading, release = threading.Event(), threading.Event()
    real = hub.offered_runners

    def slow(offers: list[wpb.WorkerOffer]) -> dict:
        reading.set()
        release.wait(60)
        return real(offers)

    monkeypatch.setattr(hub, "offered_runners", slow)
    identity = await enrolled(host, tmp_path / "w", "late")
    worker = ScriptedWorker(identity)
    connecting = asyncio.create_task(worker.__aenter__())
    try:
        await asyncio.to_thread(reading.wait, 60)
        rc, out, err = await acli(host.data_dir, "workers", "revoke", "late")
        assert rc == 0, out + err
        release.set()
        with pytest.raises((TimeoutError, grpc.RpcError)):
            await asyncio.wait_for(asyncio.shield(connecting), 10)
        assert "late" not in host.workers.sessions
        assert not any(d.WhichOneof("kind") == "welcome" for d in worker.downs)
    finally:
        release.set()
        connecting.cancel()
        if worker._task is not None:
            worker._task.cancel()
            await asyncio.gather(worker._task, return_exceptions=True)
        if worker.channel is not None:
            await worker.channel.close()


async def test_a_worker_without_a_run_token_cannot_take_the_hosts_upload_slots(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers port has no run-API gate in front (the guard admits the worker, not its calls' tokens). An
    upload took one of the host's MAX_CONCURRENT_UPLOADS slots before its token was looked at, and held it until
    its header's deadline: a worker with forged tokens, one per call, held every slot the host has, and every other
    runner's upload was refused. Now a token of no live run is refused before a slot is taken."""
    import grpc

    from agenthost.host import limits
    from agenthost.protos import common_pb2 as pb
    from agenthost.protos import run_api_pb2 as api

    monkeypatch.setattr(limits, "MAX_CONCURRENT_UPLOADS", 4)
    rogue = await enrolled(host, tmp_path / "rogue", "rogue")
    honest = await enrolled(host, tmp_path / "honest", "honest")
    never = asyncio.Event()

    async def silence():  # noqa: ANN202 — an upload that never sends its header
        await never.wait()
        yield api.ArtifactUpload()

    def upload(channel: grpc.aio.Channel, token: str, requests) -> grpc.aio.StreamUnaryCall:  # noqa: ANN001
        return channel.stream_unary(
            "/agenthost.v1.AgentRunAPIProxy/ArtifactCreate",
            request_serializer=api.ArtifactUpload.SerializeToString,
            response_deserializer=pb.ArtifactRef.FromString,
        )(requests, metadata=[("authorization", f"Bearer {token}")], timeout=60)

    uploader = '{"name": "echo", "permissions": {"apis": ["artifacts.create"]}}'
    offers = [wpb.WorkerOffer(plugin_id="fake", manifests_json=[uploader])]
    async with rogue.channel() as channel, ScriptedWorker(honest, offers=offers) as worker:
        for args in (("bots", "create", "b"), ("bots", "bind", "b", "--runner", "fake/echo")):
            rc, out, err = await acli(host.data_dir, *args)
            assert rc == 0, out + err
        held = [upload(channel, f"rt_forged_{i}", silence()) for i in range(limits.MAX_CONCURRENT_UPLOADS)]
        async with HostClient.for_data_dir(host.data_dir) as client:
            send = asyncio.create_task(client.send("b", "hi", conversation_id="c"))
            run_id = await asyncio.wait_for(worker.assigned.get(), 60)
            call, ups = worker.open_run(run_id)
            request = (await call.read()).request
            assert worker.channel is not None
            header = api.ArtifactUpload(header=api.ArtifactHeader(run_id=run_id, name="a.txt", mime_type="text/plain"))
            ref = await upload(worker.channel, request.run_token, iter([header, api.ArtifactUpload(data=b"hi")]))
            assert ref.size_bytes == 2
            ups.put_nowait(batch(text("ok"), completed()))
            ups.put_nowait(None)
            await asyncio.wait_for(send, 60)
        for call in held:
            with pytest.raises(grpc.RpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    never.set()


async def half_sent(
    host: Host, directory: Path, identity: Any, method: str, calls: int, quiet: float = 3
) -> asyncio.subprocess.Process:
    """tests/half_sent.py over the worker's mTLS: `calls` calls of `method`, each declaring an 8 MiB request and
    sending all of it but a byte."""
    import json
    import sys

    from agenthost.host.access.worker_pki import HUB_SERVER_NAME

    files = []
    for name, pem in (("cert", identity.cert_pem), ("key", identity.key_pem), ("ca", identity.ca_pem)):
        (directory / f"{name}.pem").write_bytes(pem)
        files.append(str(directory / f"{name}.pem"))
    metadata = json.dumps([["authorization", "Bearer rt_forged"]])
    return await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent.parent / "half_sent.py"), address(host), method, metadata,
        str(calls), str(quiet), "90", *files, HUB_SERVER_NAME, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_a_worker_cannot_make_the_host_hold_requests_it_never_finishes_sending(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grpc-core keeps a message it is reading until its last byte arrives. A worker (a stolen certificate, a
    compromised machine) opened run API calls on the workers port that each declared an 8 MiB request and sent all
    of it but a byte: the host held 8 MiB a call, up to WORKER_MAX_CALLS (1,024) calls, ~8 GiB. Now one worker's
    calls read at most WORKER_READS requests (or streams' first messages) at once, each for RUN_API_READ_SECONDS;
    the others wait without asking for their message, so grpc-core lets in only their streams' windows."""
    import json

    from agenthost.host import limits

    monkeypatch.setattr(limits, "WORKER_READS", 2)
    rogue = await enrolled(host, tmp_path / "rogue", "rogue")
    calls = 24
    for method in ("/agenthost.v1.AgentRunAPIProxy/StateSet", "/agenthost.v1.WorkerHub/Calls"):
        proc = await half_sent(host, tmp_path, rogue, method, calls)
        out, _ = await asyncio.wait_for(proc.communicate(), 150)
        sent = json.loads(out.splitlines()[-1])["sent"]
        bound = (limits.WORKER_READS + limits.WORKER_CALLS_STREAMS) * 8 * 1024 * 1024 + calls * 256 * 1024
        assert sent < bound, f"{method}: the host took in {sent >> 20} MiB of {calls} half-sent requests"


async def test_a_worker_holds_a_bounded_number_of_calls_streams(host: Host, tmp_path: Path) -> None:
    """A `Calls` stream is always reading its next frame, which grpc-core holds until it is whole (up to 8 MiB): a
    worker opening streams that each sent a frame and then half of the next held 8 MiB of the host each, up to
    WORKER_MAX_CALLS. A worker needs one per connection: past WORKER_CALLS_STREAMS it is refused."""
    import grpc

    from agenthost.host import limits
    from agenthost.host.workers.mux import CALLS_METHOD

    rogue = await enrolled(host, tmp_path / "rogue", "rogue")
    frame = wpb.ForwardedCall(id=1, cancel=True).SerializeToString()  # a cancel of nothing: no reply, stream open
    async with rogue.channel() as channel:
        streams = []
        for _ in range(limits.WORKER_CALLS_STREAMS):
            call = channel.stream_stream(CALLS_METHOD)()
            await call.write(frame)
            streams.append(call)
        hub = host.workers
        assert hub is not None
        await wait_for(lambda: hub._calls_streams.get("rogue") == len(streams))
        extra = channel.stream_stream(CALLS_METHOD)()
        await extra.write(frame)
        assert await asyncio.wait_for(extra.code(), 60) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "WORKER_CALLS_STREAMS" in await extra.details()
        for call in streams:
            call.cancel()


async def test_a_cut_session_says_why_in_band_before_its_status(host: Host, tmp_path: Path) -> None:
    """A status the host sends while the worker is writing can reach the worker as grpc.aio's bare INTERNAL, and
    the worker then retried (or stopped) without the reason. The host now sends the reason as the stream's last
    message, which the worker acts on as the status it names (agent.Cut: UNAUTHENTICATED stops it, saying why)."""
    identity = await enrolled(host, tmp_path / "w", "w1")
    async with ScriptedWorker(identity) as worker:
        await asyncio.wait_for(worker.welcomed.wait(), 60)
        rc, out, err = await acli(host.data_dir, "workers", "revoke", "w1")
        assert rc == 0, out + err
        await wait_for(lambda: any(down.WhichOneof("kind") == "cut" for down in worker.downs))
        cut = next(down.cut for down in worker.downs if down.WhichOneof("kind") == "cut")
        assert cut.code == "UNAUTHENTICATED" and "was revoked" in cut.reason, cut
