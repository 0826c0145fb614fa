"""The runner side of a plugin process: serves `agenthost.v1.Runner`, `grpc.health.v1` and `Shutdown`.

Started by the host's supervisor as `python -m agenthost.runners.sdk serve` inside the plugin's own environment. The
host writes one JSON line of configuration (addresses, the plugin's secret) to the process's stdin and keeps that pipe
open for the life of the host: EOF on stdin means the host is gone, and the process exits (the lifeline). The
process answers with one handshake line on stdout once it serves, then stdout is pointed at stderr so stray
prints cannot be mistaken for protocol.

The runners themselves can wait (`Deferred`): health and Describe need only the manifests, so a process that has
them as JSON imports the runner classes (and with them pydantic, a model client, ...) at the first Run or
ValidateConfig. Most plugin processes sit idle most of the time, and an idle one then costs little more than
Python and gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import grpc

from agenthost.plugins import plugin_process
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, runner_pb2, runner_pb2_grpc
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.protos.handlers import add_service, pass_encoded
from agenthost.protos.wire import (
    CHANNEL_OPTIONS,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_EVENT_BYTES,
    PROTOCOL_VERSION,
    RUNNER_HEALTH_SERVICE,
    SERVER_OPTIONS,
    SHORT_ENTRY_PREFIX,
    SHORT_TEXT_BYTES,
    SHORT_TEXT_HEADS,
    batch_entry,
)
from agenthost.runners.sdk import events, lean
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.runner import RunContext, Runner

log = logging.getLogger("agenthost.runner")

_END = object()
# Below the host's own deadline for the call (agenthost.host.api.models), so the runner's answer says what happened.
LIST_MODELS_TIMEOUT = 20.0


class RunnersUnavailable(RuntimeError):
    """The plugin's runner classes could not be imported or set up in this process; the message says why."""


class Deferred:
    """A plugin's runners before their classes are imported: their manifests as JSON (what Describe answers), the
    SDK version to report, `load`, which imports the classes of the named entry points (all of them for None), and
    `origins`, the entry point that registers each runner (empty: unknown, so everything is loaded at once). Called
    at the first call that needs a runner, for that runner's entry point alone: a process serving the harness
    runners does not hold the local agent's modules, nor the other way round."""

    def __init__(
        self,
        manifests_json: list[str],
        sdk_version: str,
        load: Callable[[Collection[str] | None], dict[str, type[Runner]]],
        origins: dict[str, str] | None = None,
    ) -> None:
        self.manifests_json = manifests_json
        self.sdk_version = sdk_version
        self.load = load
        self.origins = origins or {}


class _Runners:
    """The plugin's runner instances by name, made (and set up) once, on first use or at start, an entry point's
    at a time."""

    def __init__(self, deferred: Deferred, data_dir: Path) -> None:
        self._deferred = deferred
        self._data_dir = data_dir
        self.described = {json.loads(raw)["name"]: raw for raw in deferred.manifests_json}
        self.sdk_version = deferred.sdk_version
        self.ready: dict[str, Runner] = {}
        # By entry point; None when the origins are unknown or incomplete: then one load makes every runner.
        origins = deferred.origins
        self._origin: dict[str, str | None] = {
            name: origins.get(name) if set(origins) == set(self.described) else None for name in self.described
        }
        self._loading: dict[str | None, asyncio.Future[None]] = {}
        self.failure = ""

    def __contains__(self, name: str) -> bool:
        return name in self.described

    def entry_points(self) -> dict[str, str]:
        """The entry point of every described runner, or none when one is unknown."""
        known = {name: origin for name, origin in self._origin.items() if origin is not None}
        return known if len(known) == len(self._origin) else {}

    async def get(self, name: str) -> Runner:
        """The runner `name` (which must be described), loading its entry point's runners the first time."""
        origin = self._origin[name]
        loading = self._loading.get(origin)
        if loading is None:
            loading = self._loading[origin] = asyncio.ensure_future(self._load(origin))
        # Shielded: the first caller's cancellation (a cancelled run) must not abort the load other calls wait on.
        await asyncio.shield(loading)
        return self.ready[name]

    async def _load(self, origin: str | None) -> None:
        made: list[Runner] = []
        try:
            classes = self._deferred.load(None if origin is None else [origin])
            loaded = {name: cls.manifest.model_dump(mode="json") for name, cls in classes.items()}
            described = {name: json.loads(raw) for name, raw in self.described.items() if self._origin[name] == origin}
            if loaded != described:
                # The plugin changed on disk since the process described it (an upgrade in place): the host
                # authorised runs against the described manifests, so these classes are not the ones it knows.
                raise RunnersUnavailable(
                    f"the runner classes now declare {sorted(loaded)} with manifests that differ from those this "
                    f"process described at start ({sorted(described)})"
                )
            runners: dict[str, Runner] = {}
            for name, cls in classes.items():
                rdir = self._data_dir / name
                rdir.mkdir(parents=True, exist_ok=True)
                runner = cls(rdir)
                await runner.setup()
                made.append(runner)
                runners[name] = runner
        except Exception as exc:
            log.exception("loading the plugin's runners failed")
            for runner in made:
                with contextlib.suppress(Exception):
                    await runner.close()
            self.failure = str(exc) if isinstance(exc, RunnersUnavailable) else f"{type(exc).__name__}: {exc}"
            raise RunnersUnavailable(f"the plugin's runners could not be loaded: {self.failure}") from exc
        self.ready.update(runners)
        lean.trim_heap()  # what importing and checking the classes freed

    async def close(self) -> None:
        for runner in self.ready.values():
            with contextlib.suppress(Exception):
                await runner.close()


class _EventChannel:
    """Runner task → RPC stream. Cheaper than asyncio.Queue per event, and it hands over everything that piled
    up since the last send in one batch: deltas coalesce under load without waiting for a timer. Items are events
    already encoded as entries of a RunEventBatch (`_encoded`), so a batch is their concatenation."""

    def __init__(self, high_water: int = 1024) -> None:
        self._buf: list[Any] = []
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._high_water = high_water

    def push(self, item: Any) -> bool:
        """Adds without waiting (the per-event hot path); True once the buffer is full: then `await full()`."""
        self._buf.append(item)
        self._ready.set()
        return len(self._buf) >= self._high_water

    async def full(self) -> None:
        """Returns once the consumer took what piled up."""
        if len(self._buf) >= self._high_water:
            self._drained.clear()
            await self._drained.wait()

    async def put(self, item: Any) -> None:
        if self.push(item):
            await self.full()

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
        runners: _Runners,
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
            sdk_version=self.runners.sdk_version,
            protocol_version=PROTOCOL_VERSION,
            manifests_json=list(self.runners.described.values()),
            entry_points=self.runners.entry_points(),
        )

    def _unavailable(self) -> None:
        """After a failed load: this process cannot serve its runners, so it ends (having answered) and the
        supervisor starts a fresh one, whose start reports a lasting failure (a plugin that no longer imports)."""
        self.on_shutdown.set()

    async def _runner(self, name: str, context: grpc.aio.ServicerContext) -> Runner | RunnersUnavailable:
        """The named runner, loaded on first use (an unknown name ends the call with NOT_FOUND); the load's
        failure is returned for the caller to answer with, and ends this process once answered."""
        if name not in self.runners:
            await errors.abort_with(context, errors.NotFound(f"this plugin has no runner {name!r}"))
        try:
            return await self.runners.get(name)
        except RunnersUnavailable as exc:
            self._unavailable()
            return exc

    async def ValidateConfig(
        self, request: runner_pb2.ValidateConfigRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.ValidateConfigResponse:
        runner = await self._runner(request.runner_name, context)
        if isinstance(runner, RunnersUnavailable):
            return runner_pb2.ValidateConfigResponse(problems=[f"the runner could not check this config: {runner}"])
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

    async def ListModels(
        self, request: runner_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.ListModelsResponse:
        runner = await self._runner(request.runner_name, context)
        if isinstance(runner, RunnersUnavailable):
            return runner_pb2.ListModelsResponse(error=f"the runner could not list models: {runner}")
        try:
            config = json.loads(request.config_json or "{}")
            # Bounded here as well as by the host's deadline: a hook stuck on a provider must not hold a task
            # in this process after the host has given up on the answer.
            found = await asyncio.wait_for(runner.list_models(config, dict(request.secrets)), LIST_MODELS_TIMEOUT)
            models = [
                runner_pb2.ModelEntry(
                    provider=str(m.get("provider", "")),
                    model=str(m.get("model", "")),
                    base_url=str(m.get("base_url", "")),
                    error=str(m.get("error", "")),
                )
                for m in found or ()
            ]
        except TimeoutError:
            return runner_pb2.ListModelsResponse(
                error=f"the runner did not list its models within {LIST_MODELS_TIMEOUT:g}s"
            )
        except Exception as exc:
            log.exception("list_models of runner %s failed", request.runner_name)
            return runner_pb2.ListModelsResponse(error=f"the runner could not list models: {type(exc).__name__}: {exc}")
        return runner_pb2.ListModelsResponse(models=models)

    async def Shutdown(
        self, request: runner_pb2.ShutdownRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.ShutdownResponse:
        self.on_shutdown.set()
        return runner_pb2.ShutdownResponse()

    async def Run(self, request: runner_pb2.RunRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Streams the run's events as encoded RunEventBatch messages (see `_batches`)."""
        runner = await self._runner(request.runner_name, context)
        if self._stub is None:
            await errors.abort_with(context, errors.FailedPrecondition("runner process has no host address"))
            return
        if isinstance(runner, RunnersUnavailable):
            yield _encoded(events.failed("runner_unavailable", str(runner)))
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
                    yield batch
                if done:
                    return
        finally:
            # The host cancelled the RPC (or it ended): the runner's task must not outlive it.
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self.tasks.discard(task)
            if not self.tasks:
                lean.trim_heap()  # idle: what the runs allocated and freed goes back to the kernel

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()


def _batches(items: list[bytes]) -> Iterator[bytes]:
    """Consecutive encoded events cut into encoded batches of at most MAX_BATCH events and MAX_BATCH_BYTES bytes;
    an event larger than MAX_BATCH_BYTES (at most MAX_EVENT_BYTES, checked in `_drive`) travels alone."""
    if not items:
        return
    if len(items) <= MAX_BATCH and sum(map(len, items)) <= MAX_BATCH_BYTES:
        yield b"".join(items)  # the common case: what piled up fits one message
        return
    start = size = 0
    for i, item in enumerate(items):
        if i > start and (i - start >= MAX_BATCH or size + len(item) > MAX_BATCH_BYTES):
            yield b"".join(items[start:i])
            start, size = i, 0
        size += len(item)
    yield b"".join(items[start:])


# An encoded RunEvent whose first byte is this tag (field 1, length-delimited) holds a text_delta: a oneof has one
# member set, so whatever an encoder writes first, this byte there means the event's kind is text_delta.
_TEXT_DELTA_TAG = b"\x0a"
# A short text delta's batch entry, by its text's length (see wire.SHORT_TEXT_BYTES).
_SHORT_TEXT_PREFIX = [bytes((0x0A, n + 4)) + head for n, head in enumerate(SHORT_TEXT_HEADS)]


def _text_entry(text: str) -> bytes:
    """A text delta yielded as a plain `str`, framed for a batch: what `_encoded(events.text(text))` returns, at a
    fraction of its cost (no RunEvent object, no upb encoder), because streamed text is most of what runners send."""
    data = text.encode()
    n = len(data)
    if 0 < n <= SHORT_TEXT_BYTES:
        return _SHORT_TEXT_PREFIX[n] + data
    return _encoded(events.text(text))  # longer, empty, or over MAX_EVENT_BYTES (the failure event)


def _encoded(event: pb.RunEvent, data: bytes | None = None) -> bytes:
    """The event (`data`: its encoding, when the caller has it) encoded as one entry of a RunEventBatch, or the
    `failed` event that replaces an event too large for one message. Batches are then plain concatenations, sent
    as they are (`handlers.pass_encoded`): encoding each small event once costs a third of building a batch message
    from them, which copies every event into it and then encodes the whole."""
    if data is None:
        data = event.SerializeToString()
    if len(data) <= MAX_EVENT_BYTES:
        return batch_entry(data)
    return _encoded(
        events.failed(
            "event_too_large",
            f"RESOURCE_EXHAUSTED: the runner emitted a {event.WhichOneof('kind')} event of {len(data)} bytes; the"
            f" limit is MAX_EVENT_BYTES = {MAX_EVENT_BYTES} bytes (put large outputs in an artifact)",
        )
    )


async def _drive(runner: Runner, run: RunContext, channel: _EventChannel) -> None:
    """Runs one runner generator to its terminal event, turning a crash into a `failed` event."""
    try:
        terminal = False
        agen = runner.run(run)
        try:
            async for event in agen:  # per event: encoded, kept to a size and a kind; the rest is per batch
                if type(event) is pb.RunEvent:
                    data = event.SerializeToString()
                    if (n := len(data)) < 128 and data[:1] == _TEXT_DELTA_TAG:
                        # A short text delta made as an object (events.text), the other hot path of streaming:
                        # framed from its encoding as it is, with no look at its kind (a text delta is never
                        # terminal, and under 128 bytes never too large).
                        if channel.push(SHORT_ENTRY_PREFIX[n] + data):
                            await channel.full()
                        continue
                    if channel.push(_encoded(event, data)):
                        await channel.full()
                    if event.WhichOneof("kind") in events.TERMINAL_KINDS:
                        terminal = True
                        break
                elif isinstance(event, str):  # a text delta, the hot path of streaming (see Runner.run)
                    if channel.push(_text_entry(event)):
                        await channel.full()
                else:
                    raise TypeError(
                        f"{type(runner).__name__}.run yielded a {type(event).__name__}; a runner yields RunEvents"
                        " (made with agenthost.runners.sdk.events) or a str for a text delta"
                    )
        finally:
            # `run` is declared to return an AsyncIterator: an async generator (the usual case) is closed here, so
            # its own `finally` runs now, not whenever the garbage collector gets to it.
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()
        if not terminal:
            await channel.put(_encoded(events.completed()))
    except asyncio.CancelledError:
        raise
    except errors.AgentHostError as exc:
        await channel.put(_encoded(events.failed(f"host_{exc.code.name.lower()}", exc.message)))
    except Exception as exc:
        log.exception("runner %s failed in run %s", runner.manifest.name, run.run_id)
        await channel.put(_encoded(events.failed("runner_error", f"{type(exc).__name__}: {exc}")))
    finally:
        await channel.put(_END)


def _add_runner_service(service: RunnerService, server: grpc.aio.Server) -> None:
    """The Runner service as generated but for Run's serializer: its batches leave `_batches` encoded already."""
    add_service(server, runner_pb2.DESCRIPTOR.services_by_name["Runner"], service, serializers={"Run": pass_encoded})


async def serve(
    runner_classes: dict[str, type[Runner]] | Deferred,
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
    (agenthost.runners.sdk.testing).

    Runner classes in hand are made and set up before the process serves (a failing `setup` fails the start);
    `Deferred` ones at the first Run or ValidateConfig. If that load fails, the call is answered with the reason,
    the process stops serving and `serve` raises RunnersUnavailable."""
    stop = stop or asyncio.Event()
    if isinstance(runner_classes, Deferred):
        runners = _Runners(runner_classes, data_dir)
    else:
        from agenthost.protos.wire import VERSION

        classes = dict(runner_classes)
        manifests = [cls.manifest.model_dump_json() for cls in classes.values()]
        runners = _Runners(Deferred(manifests, VERSION, lambda entry_points: classes), data_dir)
        # Before serving, as a runner author expects of classes in hand: a failing setup is a failed start.
        if classes:
            with contextlib.suppress(RunnersUnavailable):
                await runners.get(next(iter(classes)))
        if runners.failure:
            raise RunnersUnavailable(runners.failure)
    service = RunnerService(
        plugin_id=plugin_id, runners=runners, host_address=host_address, plugin_secret=plugin_secret, on_shutdown=stop
    )
    try:
        async with plugin_process.serving(
            listen,
            RUNNER_HEALTH_SERVICE,
            lambda server: _add_runner_service(service, server),
            options=SERVER_OPTIONS,
            handshake=handshake,
            grace=1.0,
            closing=service.close,
        ):
            if ready is not None:
                ready.set()
            lean.trim_heap()  # start-up's garbage (the describe report, gRPC's set-up)
            await stop.wait()
    finally:
        await runners.close()
    if runners.failure:
        raise RunnersUnavailable(runners.failure)
