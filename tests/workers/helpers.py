"""What the worker tests share: a host listening for workers, tokens from the real CLI, and a scripted worker that
speaks the wire itself (a hostile or broken worker is one that does what the real one never would)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from agenthost.host.server import Host
from agenthost.host.workers.agent import Identity, enrol
from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import worker_pb2 as wpb
from tests.cli_process import acli

ECHO_MANIFEST = json.dumps({"name": "echo", "permissions": {"apis": ["history.page"]}})


def address(host: Host) -> str:
    assert host.workers is not None
    return f"127.0.0.1:{host.workers.port}"


async def token(host: Host, *args: str) -> str:
    rc, out, err = await acli(host.data_dir, "workers", "token", "create", *args)
    assert rc == 0, err
    return out.strip()


async def enrolled(host: Host, directory: Path, name: str, *token_args: str) -> Identity:
    return await enrol(directory, address(host), await token(host, *token_args), name)


async def wait_for(condition: Callable[[], Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


class ScriptedWorker:
    """A worker under the test's control: it connects with an identity, offers what it is told, and exposes each
    RunRequest it is sent (run token included) instead of running anything."""

    def __init__(
        self,
        identity: Identity,
        offers: list[wpb.WorkerOffer] | None = None,
        capacity: int = 4,
        held_runs: list[str] | None = None,
        renewed: bool = False,
    ) -> None:
        self.identity = identity
        self.renewed = renewed
        self.held_runs = held_runs or []
        self.offers = (
            offers if offers is not None else [wpb.WorkerOffer(plugin_id="fake", manifests_json=[ECHO_MANIFEST])]
        )
        self.capacity = capacity
        self.channel: grpc.aio.Channel | None = None
        self.assigned: asyncio.Queue[str] = asyncio.Queue()
        self.downs: list[wpb.WorkerDown] = []
        self._outbox: asyncio.Queue[wpb.WorkerUp] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.welcomed = asyncio.Event()
        self.got = asyncio.Event()  # set at each message from the host
        self.heartbeats = True

    async def __aenter__(self) -> ScriptedWorker:
        self.channel = self.identity.channel()
        hello = wpb.WorkerHello(
            offers=self.offers, capacity=self.capacity, held_runs=self.held_runs, renewed=self.renewed
        )
        self._outbox.put_nowait(wpb.WorkerUp(hello=hello))
        self._task = asyncio.create_task(self._control())
        await asyncio.wait_for(self.welcomed.wait(), 30)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None and self.channel is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.channel.close()

    async def _control(self) -> None:
        async def up() -> AsyncIterator[wpb.WorkerUp]:
            while True:
                yield await self._outbox.get()

        async def beat() -> None:
            while True:
                await asyncio.sleep(1.0)
                if self.heartbeats:
                    self._outbox.put_nowait(wpb.WorkerUp(heartbeat=wpb.WorkerHeartbeat()))

        assert self.channel is not None
        beating = asyncio.create_task(beat())
        try:
            call = self.channel.stream_stream(
                "/agenthost.v1.WorkerHub/Connect",
                request_serializer=wpb.WorkerUp.SerializeToString,
                response_deserializer=wpb.WorkerDown.FromString,
            )(up())
            async for down in call:
                self.downs.append(down)
                self.got.set()
                if down.WhichOneof("kind") == "welcome":
                    self.welcomed.set()
                elif down.WhichOneof("kind") == "assign":
                    self.assigned.put_nowait(down.assign.run_id)
        finally:
            beating.cancel()

    def open_run(self, run_id: str) -> tuple[grpc.aio.StreamStreamCall, asyncio.Queue[wpb.WorkerRunUp | None]]:
        """Opens the Run stream for `run_id`; put batches (WorkerRunUp) on the queue, None to end it."""
        assert self.channel is not None
        queue: asyncio.Queue[wpb.WorkerRunUp | None] = asyncio.Queue()
        queue.put_nowait(wpb.WorkerRunUp(run_id=run_id))

        async def ups() -> AsyncIterator[wpb.WorkerRunUp]:
            while (item := await queue.get()) is not None:
                yield item
            yield wpb.WorkerRunUp(end=True)

        call = self.channel.stream_stream(
            "/agenthost.v1.WorkerHub/Run",
            request_serializer=wpb.WorkerRunUp.SerializeToString,
            response_deserializer=wpb.WorkerRunDown.FromString,
        )(ups())
        return call, queue

    async def history(self, run_id: str, run_token: str) -> api.HistoryPageResponse:
        """The run API's HistoryPage over this worker's own channel, with the given run token."""
        assert self.channel is not None
        return await self.channel.unary_unary(
            "/agenthost.v1.AgentRunAPIProxy/HistoryPage",
            request_serializer=api.HistoryPageRequest.SerializeToString,
            response_deserializer=api.HistoryPageResponse.FromString,
        )(api.HistoryPageRequest(run_id=run_id), metadata=[("authorization", f"Bearer {run_token}")], timeout=30)


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """Ends a worker process the test started: SIGTERM, then SIGKILL if it has not gone in 30 s."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch(*events: pb.RunEvent) -> wpb.WorkerRunUp:
    return wpb.WorkerRunUp(batch=pb.RunEventBatch(events=list(events)).SerializeToString())


def text(t: str) -> pb.RunEvent:
    return pb.RunEvent(text_delta=pb.TextDelta(text=t))


def completed() -> pb.RunEvent:
    return pb.RunEvent(completed=pb.Completed())
