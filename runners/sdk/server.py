"""The runner side of a plugin process: serves `agenthost.v1.Runner`, `grpc.health.v1` and `Shutdown`.

Started by the host's supervisor as `python -m agenthost.runners.sdk serve` inside the plugin's own environment. The
host writes one JSON line of configuration (addresses, the plugin's secret) to the process's stdin and keeps that pipe
open for the life of the host: EOF on stdin means the host is gone, and the process exits (the lifeline). The
process answers with one handshake line on stdout once it serves, then stdout is pointed at stderr so stray
prints cannot be mistaken for protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, runner_pb2, runner_pb2_grpc
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.protos.wire import (
    CHANNEL_OPTIONS,
    HANDSHAKE_PREFIX,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_EVENT_BYTES,
    PROTOCOL_VERSION,
    SERVER_OPTIONS,
    VERSION,
)
from agenthost.runners.sdk import events
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.runner import RunContext, Runner

log = logging.getLogger("agenthost.runner")

_END = object()


class _EventChannel:
    """Runner task → RPC stream. Cheaper than asyncio.Queue per event, and it hands over everything that piled
    up since the last send in one batch: deltas coalesce under load without waiting for a timer."""

    def __init__(self, high_water: int = 1024) -> None:
        self._buf: list[Any] = []
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._high_water = high_water

    async def put(self, item: Any) -> None:
        self._buf.append(item)
        self._ready.set()
        if len(self._buf) >= self._high_water:
            self._drained.clear()
            await self._drained.wait()

    async def take(self) -> list[Any]:
        while not self._buf:
            self._ready.clear()
            await self._ready.wait()
        items, self._buf = self._buf, []
        self._drained.set()
        return items


class RunnerService(runner_pb2_grpc.RunnerServicer):
    def __init__(
        self,
        *,
        plugin_id: str,
        runners: dict[str, Runner],
        host_address: str,
        plugin_secret: str,
        on_shutdown: asyncio.Event,
    ) -> None:
        self.plugin_id = plugin_id
        self.runners = runners
        self.host_address = host_address
        self.plugin_secret = plugin_secret
        self.on_shutdown = on_shutdown
        self._channel = grpc.aio.insecure_channel(host_address, options=CHANNEL_OPTIONS) if host_address else None
        self._stub = api_grpc.AgentRunAPIProxyStub(self._channel) if self._channel else None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def Describe(
        self, request: runner_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.DescribeResponse:
        return runner_pb2.DescribeResponse(
            plugin_id=self.plugin_id,
            sdk_version=VERSION,
            protocol_version=PROTOCOL_VERSION,
            manifests_json=[r.manifest.model_dump_json() for r in self.runners.values()],
        )

    async def ValidateConfig(
        self, request: runner_pb2.ValidateConfigRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.ValidateConfigResponse:
        runner = self.runners.get(request.runner_name)
        if runner is None:
            await errors.abort_with(context, errors.NotFound(f"this plugin has no runner {request.runner_name!r}"))
            return runner_pb2.ValidateConfigResponse()  # not reached: abort raises
        try:
            config = json.loads(request.config_json or "{}")
            result = runner.validate_config(config)
            if inspect.isawaitable(result):
                result = await result
            problems = [str(p) for p in result or ()]
        except Exception as exc:
            # A hook that crashes has not accepted the config: refuse it, with the reason, rather than fail open.
            log.exception("validate_config of runner %s failed", request.runner_name)
            problems = [f"the runner could not check this config: {type(exc).__name__}: {exc}"]
        return runner_pb2.ValidateConfigResponse(problems=problems)

    async def Shutdown(
        self, request: runner_pb2.ShutdownRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.ShutdownResponse:
        self.on_shutdown.set()
        return runner_pb2.ShutdownResponse()

    async def Run(
        self, request: runner_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RunEventBatch]:
        runner = self.runners.get(request.runner_name)
        if runner is None:
            await errors.abort_with(context, errors.NotFound(f"this plugin has no runner {request.runner_name!r}"))
            return
        if self._stub is None:
            await errors.abort_with(context, errors.FailedPrecondition("runner process has no host address"))
            return
        ctx = request.context
        api = RunAPI(
            self._stub,
            host_address=self.host_address,
            run_id=ctx.run_id,
            run_token=request.run_token,
            plugin_secret=self.plugin_secret,
            deadline_at=ctx.runtime.deadline_at,
        )
        run = RunContext(
            context=ctx,
            api=api,
            data_dir=runner.data_dir,
            tool_token=request.tool_token,
            secrets=dict(request.secrets),
        )
        channel = _EventChannel()
        task = asyncio.create_task(_drive(runner, run, channel), name=f"run:{ctx.run_id}")
        self.tasks.add(task)
        try:
            while True:
                items = await channel.take()
                done = items[-1] is _END
                if done:
                    items.pop()
                for batch in _batches(items):
                    yield pb.RunEventBatch(events=batch)
                if done:
                    return
        finally:
            # The host cancelled the RPC (or it ended): the runner's task must not outlive it.
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self.tasks.discard(task)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()


def _batches(items: list[pb.RunEvent]) -> Iterator[list[pb.RunEvent]]:
    """Consecutive events cut into batches of at most MAX_BATCH events and MAX_BATCH_BYTES bytes; an event
    larger than MAX_BATCH_BYTES (at most MAX_EVENT_BYTES, checked in `_drive`) travels alone."""
    batch: list[pb.RunEvent] = []
    size = 0
    for event in items:
        n = event.ByteSize() + 6  # the field tag and length prefix of a repeated message, at most
        if batch and (len(batch) >= MAX_BATCH or size + n > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += n
    if batch:
        yield batch


def _oversize(event: pb.RunEvent) -> pb.RunEvent | None:
    """The `failed` event that replaces an event too large for one message, or None if it fits."""
    size = event.ByteSize()
    if size <= MAX_EVENT_BYTES:
        return None
    return events.failed(
        "event_too_large",
        f"RESOURCE_EXHAUSTED: the runner emitted a {event.WhichOneof('kind')} event of {size} bytes; the limit"
        f" is MAX_EVENT_BYTES ="
        f" {MAX_EVENT_BYTES} bytes (put large outputs in an artifact)",
    )


async def _drive(runner: Runner, run: RunContext, channel: _EventChannel) -> None:
    """Runs one runner generator to its terminal event, turning a crash into a `failed` event."""
    try:
        terminal = False
        agen = runner.run(run)
        try:
            async for event in agen:
                event = _oversize(event) or event
                await channel.put(event)
                if events.is_terminal(event):
                    terminal = True
                    break
        finally:
            await agen.aclose()
        if not terminal:
            await channel.put(events.completed())
    except asyncio.CancelledError:
        raise
    except errors.AgentHostError as exc:
        await channel.put(events.failed(f"host_{exc.code.name.lower()}", exc.message))
    except Exception as exc:
        log.exception("runner %s failed in run %s", runner.manifest.name, run.run_id)
        await channel.put(events.failed("runner_error", f"{type(exc).__name__}: {exc}"))
    finally:
        await channel.put(_END)


async def serve(
    runner_classes: dict[str, type[Runner]],
    *,
    plugin_id: str,
    listen: str,
    host_address: str,
    plugin_secret: str,
    data_dir: Path,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    handshake: bool = False,
) -> None:
    """Serves until `stop` is set or Shutdown is called. Used by `main` and, in-process, by the test harness
    (agenthost.runners.sdk.testing)."""
    stop = stop or asyncio.Event()
    runners: dict[str, Runner] = {}
    for name, cls in runner_classes.items():
        rdir = data_dir / name
        rdir.mkdir(parents=True, exist_ok=True)
        runner = cls(rdir)
        await runner.setup()
        runners[name] = runner
    server = grpc.aio.server(options=SERVER_OPTIONS)
    service = RunnerService(
        plugin_id=plugin_id, runners=runners, host_address=host_address, plugin_secret=plugin_secret, on_shutdown=stop
    )
    runner_pb2_grpc.add_RunnerServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(listen) == 0:
        raise RuntimeError(f"could not listen on {listen}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("agenthost.v1.Runner", health_pb2.HealthCheckResponse.SERVING)
    if handshake:
        sys.stdout.write(f"{HANDSHAKE_PREFIX}|{PROTOCOL_VERSION}|{listen}\n")
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await health_servicer.enter_graceful_shutdown()
        await service.close()
        await server.stop(grace=1.0)
        for runner in runners.values():
            with contextlib.suppress(Exception):
                await runner.close()
