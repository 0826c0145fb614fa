"""The plugin process's side of the host's spawn protocol, one for both plugin kinds (the runner SDK's and the
channel SDK's entry points): the command line, the hardened start and the configuration line on stdin, the stop
(SIGTERM, SIGINT or the lifeline: EOF on stdin = the host is gone), the gRPC server with its health service and the
handshake line, its shutdown, `describe`, and loading one distribution's entry points through pluggy. Each SDK
keeps only what is its own: the keys of its configuration, its services, what it runs while it serves. Imports
nothing heavy until it is used: a lazy runner reads its configuration long before it loads any plugin code, and
every idle runner process holds what this module imports."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio
    import logging

    import grpc
    import pluggy


T = TypeVar("T")

# A distribution whose entry points cannot give what the host asked for (describe, or a start that loads them).
EXIT_DISCOVERY = 3
# The configuration line on stdin is not what the host writes.
EXIT_BAD_CONFIG = 2


class DiscoveryError(RuntimeError):
    """A plugin's entry points cannot give what the host asked for; the message names the entry point or rule."""


def read_config_line(required: Iterable[str]) -> dict[str, Any]:
    """The configuration line, read from the raw descriptor: nothing may sit in a buffer, because what follows on
    stdin is only the lifeline's EOF, watched by the event loop. Every `required` key must be a string."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        data += chunk
    config = json.loads(data.split(b"\n", 1)[0])
    if not isinstance(config, dict):
        raise ValueError("not a JSON object")
    for key in required:
        if not isinstance(config.get(key), str):
            raise KeyError(key)
    return config


def start(kind: str, required: Iterable[str], check: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The first steps of `serve`: the process made non-dumpable, then its configuration line read. Before the
    secrets arrive: the process holds them (and every run's token) in memory, and what it starts (a model's
    commands) runs as the same uid; non-dumpable closes /proc/<pid>/mem and ptrace to them, and a forked child
    inherits it. A bad line (not JSON, a `required` key not a string, or refused by `check`) is said on stderr and
    the process exits EXIT_BAD_CONFIG."""
    from agenthost.plugins.sandbox import harden_process

    harden_process()
    try:
        config = read_config_line(required)
        if check is not None:
            check(config)
    except (ValueError, KeyError) as exc:
        print(f"agenthost {kind}: bad configuration line on stdin: {exc!r}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None
    return config


def log_to_stderr(formatter: logging.Formatter) -> None:
    """The process's log goes to stderr (the host's log of the plugin), every line through `formatter`."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)


def watch_lifeline(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Only the host holds the stdin pipe's write end, so EOF means the host died or let go of us, whichever way
    it ended (kill -9 included): `stop` is set. Watched by the loop, not a thread: a thread costs an idle process
    its stack and a malloc arena."""

    def readable() -> None:
        try:
            more = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            more = b""
        if not more:
            loop.remove_reader(0)
            stop.set()

    os.set_blocking(0, False)
    loop.add_reader(0, readable)


def host_stop() -> asyncio.Event:
    """The event a plugin process serves until: set by SIGTERM or SIGINT (the supervisor's stop) and by the
    lifeline's EOF. Called in the running loop before anything that can take long (a runner's set-up, the server's
    start), so a stop that comes meanwhile is kept, not lost to the default handler's kill."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch_lifeline(loop, stop)
    return stop


@contextlib.asynccontextmanager
async def serving(
    listen: str,
    health_service: str,
    add_services: Callable[[grpc.aio.Server], None] = lambda server: None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    handshake: bool = True,
    grace: float,
    closing: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[None]:
    """A gRPC server on `listen` with `add_services` and the health service (SERVING for "" and `health_service`),
    and, with `handshake`, the handshake line on stdout, after which stdout is pointed at stderr so a stray print
    cannot be mistaken for protocol. On the way out: health says NOT_SERVING, `closing` ends what the services hold
    open (a runner's runs), and the server stops within `grace` seconds."""
    from grpc import aio
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from agenthost.protos.wire import HANDSHAKE_PREFIX, PROTOCOL_VERSION

    server = aio.server(options=list(options))
    add_services(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(listen) == 0:
        raise RuntimeError(f"could not listen on {listen}")
    await server.start()
    try:
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(health_service, health_pb2.HealthCheckResponse.SERVING)
        if handshake:
            sys.stdout.write(f"{HANDSHAKE_PREFIX}|{PROTOCOL_VERSION}|{listen}\n")
            sys.stdout.flush()
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        yield
    finally:
        await health_servicer.enter_graceful_shutdown()
        try:
            if closing is not None:
                await closing()
        finally:
            await server.stop(grace=grace)


def describe(distribution: str, key: str, manifests: Callable[[], list[dict[str, Any]]]) -> int:
    """`describe`: the distribution's version, summary and, under `key`, the manifests of what it registers, as one
    JSON line (the host's install-time check); a DiscoveryError is {"error"} and EXIT_DISCOVERY."""
    from importlib import metadata

    try:
        found = manifests()
    except DiscoveryError as exc:
        print(json.dumps({"error": str(exc)}))
        return EXIT_DISCOVERY
    dist = metadata.distribution(distribution)
    print(json.dumps({"version": dist.version, "summary": (dist.metadata.get_all("Summary") or [""])[0], key: found}))
    return 0


def load_entry_points(distribution: str, group: str, only: Collection[str] | None = None) -> pluggy.PluginManager:
    """A plugin manager holding the entry points of `group` that `distribution` declares, and no one else's
    (discovery is execution: a plugin process must not import its neighbours' code); of those, only the ones named
    in `only` when given. An entry point that fails to import is a DiscoveryError naming it, never a skip."""
    from importlib import metadata

    import pluggy

    from agenthost.plugins import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise DiscoveryError(f"distribution {distribution!r} is not installed in this environment") from None
    eps = [ep for ep in dist.entry_points if ep.group == group]
    if not eps:
        raise DiscoveryError(f"{distribution} declares no [{group}] entry points")
    if only is not None:
        missing = set(only) - {ep.name for ep in eps}
        if missing:
            raise DiscoveryError(f"{distribution} no longer declares the [{group}] entry points {sorted(missing)}")
        eps = [ep for ep in eps if ep.name in only]
    prefix = distribution.lower().replace("_", "-").replace(".", "-")
    for ep in eps:
        try:
            plugin = ep.load()
        except Exception as exc:
            raise DiscoveryError(f"entry point {ep.name} = {ep.value} failed to import: {exc!r}") from exc
        pm.register(plugin, name=f"{prefix}:{group}:{ep.name}")
    return pm


def registered_classes(
    distribution: str,
    group: str,
    hook: str,
    base: type[T],
    manifest_type: type[Any],
    kind: str,
    *,
    only: Collection[str] | None = None,
    origins: dict[str, str] | None = None,
) -> dict[str, type[T]]:
    """The classes `distribution` registers through `hook` of its `group` entry points, by manifest name: the one
    discovery of both SDKs (runners: agenthost_register_runners, channel adapters: agenthost_register_channels).
    Whatever is registered must subclass `base` and carry a `manifest` of `manifest_type` with a name of its own;
    a failure anywhere is a DiscoveryError that says what is wrong, never a skip or a bare traceback.

    `only` limits discovery to the named entry points. `origins`, when given, is filled with the entry point that
    registered each class (left empty when a hook wrapper makes that unknowable): a runner process that knows it
    imports only the entry point of the runner a call names."""
    found: dict[str, type[T]] = {}
    source: list[str] = [""]

    def register(cls: type[T]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise DiscoveryError(f"{cls!r} is not a subclass of {base.__module__.rsplit('.', 1)[0]}.{base.__name__}")
        manifest: Any = getattr(cls, "manifest", None)
        if not isinstance(manifest, manifest_type):
            raise DiscoveryError(f"{cls.__qualname__} has no `manifest = {manifest_type.__name__}(...)`")
        if manifest.name in found:
            raise DiscoveryError(f"two {kind} are named {manifest.name!r}")
        found[manifest.name] = cls
        if origins is not None and source[0]:
            origins[manifest.name] = source[0]

    try:
        caller = getattr(load_entry_points(distribution, group, only).hook, hook)
        impls = caller.get_hookimpls()
        if origins is None or any(impl.hookwrapper or impl.wrapper for impl in impls):
            caller(register=register)
        else:
            # pluggy's own call, one implementation at a time (last registered first), to know whose it is.
            prefix = f":{group}:"
            for impl in reversed(impls):
                source[0] = impl.plugin_name.split(prefix, 1)[-1]
                impl.function(**{arg: register for arg in impl.argnames})
    except DiscoveryError:
        raise
    except Exception as exc:
        raise DiscoveryError(f"registering the {kind} failed: {exc!r}") from exc
    if not found:
        raise DiscoveryError(f"the plugin registered no {kind}")
    return found


def main(prog: str, serve: Callable[[], int], describe: Callable[[str], int], argv: list[str] | None = None) -> int:
    """The command line of both SDK entry points: `serve` (what the host spawns) or `describe --distribution D`
    (`argv`, or the process's own). `serve` is matched without argparse, which an idle plugin process would
    otherwise hold for nothing."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["serve"]:
        return serve()
    import argparse

    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve")
    d = sub.add_parser("describe")
    d.add_argument("--distribution", required=True)
    return describe(parser.parse_args(argv).distribution)
