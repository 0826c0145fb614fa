"""One run-API socket per plugin process, each with its own connection cap.

Every plugin is untrusted, and one process may fork and shares the sandbox uid with every other plugin, so nothing
a caller sends or is (its uid, its pid) tells plugins apart on a shared socket. Where it connects does: the host
binds each plugin process's sandbox to a socket of its own and to no other run-API socket, so a plugin that opens
connections until grpc-core closes the rest (`limits.API_MAX_CONNECTIONS`) fills only its own listener, and every
other plugin's runs keep theirs. The cap is grpc-core's, per server: nothing is added to the per-call path.

grpc-core closes connections past a cap silently, so a watcher counts each listener's accepted connections among
the host's descriptors every half minute and logs, naming the plugin, when one sits at its cap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import grpc

from agenthost.host import limits
from agenthost.protos.wire import MAX_CONCURRENT_CALLS, SERVER_OPTIONS

log = logging.getLogger(__name__)

# How often the watcher counts connections: a readlink and a getsockname per host descriptor, in a thread (measured
# 70-200 ms at 4,000 descriptors on a loaded 2-core machine), so rarely; the cap itself needs no watcher.
WATCH_SECONDS = 30.0


def run_api_server(
    add: Callable[[grpc.aio.Server], None],
    connections: int,
    interceptors: list[grpc.aio.ServerInterceptor] | None = None,
) -> grpc.aio.Server:
    """A run-API server holding at most `connections` at once (grpc-core closes new ones past it at once) and
    MAX_CONCURRENT_CALLS calls; `add` registers the servicer."""
    server = grpc.aio.server(
        # No bandwidth-delay-product probing: it widens every stream's initial window, and a call waiting to read
        # its request (run_api._Gate) must let in no more than that window.
        options=[*SERVER_OPTIONS, ("grpc.max_allowed_incoming_connections", connections), ("grpc.http2.bdp_probe", 0)],
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        interceptors=interceptors,
    )
    add(server)
    return server


@dataclass
class _Listener:
    plugin_id: str
    server: grpc.aio.Server
    cap: int
    full: bool = False  # logged as full; logged again only after it drained


class PluginSockets:
    """The host's per-plugin-process run-API listeners (agenthost.host.processes.supervisor opens one per start)."""

    def __init__(
        self,
        runtime_dir: Path,
        add: Callable[[grpc.aio.Server], None],
        interceptors: list[grpc.aio.ServerInterceptor] | None = None,
    ) -> None:
        self.runtime_dir = runtime_dir
        self._add = add
        self._interceptors = interceptors
        self._listeners: dict[str, _Listener] = {}
        self._counter = 0
        self._watcher: asyncio.Task[None] | None = None

    async def open(self, plugin_id: str) -> str:
        """A new listener for one process of `plugin_id`; returns its address (`unix:<path>`)."""
        self._counter += 1
        path = self.runtime_dir / f"api-{self._counter}.sock"
        path.unlink(missing_ok=True)
        _, cap = limits.listener_caps()
        server = run_api_server(self._add, cap, self._interceptors)
        address = f"unix:{path}"
        server.add_insecure_port(address)
        await server.start()
        self._listeners[str(path)] = _Listener(plugin_id, server, cap)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(), name="plugin-sockets-watch")
        return address

    async def close(self, address: str) -> None:
        """Ends the listener and every connection and call on it (its process is gone or going)."""
        path = address.removeprefix("unix:")
        listener = self._listeners.pop(path, None)
        if listener is not None:
            await listener.server.stop(grace=None)
        Path(path).unlink(missing_ok=True)

    async def close_all(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for path in list(self._listeners):
            await self.close(path)

    def paths(self) -> list[str]:
        return list(self._listeners)

    def check(self, counts: dict[str, int]) -> list[str]:
        """Logs each listener that holds its cap (once per episode); returns the plugins that do."""
        full = []
        for path, listener in self._listeners.items():
            # The listening socket itself is one of the entries with its path.
            held = max(0, counts.get(path, 0) - 1)
            if held >= listener.cap:
                full.append(listener.plugin_id)
                if not listener.full:
                    log.warning(
                        "plugin %s holds %d connections to its run API socket, its cap (API_MAX_CONNECTIONS): the "
                        "host closes any more it opens, so its own runs' calls fail until it closes some; other "
                        "plugins are not affected. If this plugin is yours, look for connections it opens and "
                        "never closes; otherwise disable it (`agenthost plugins disable %s`)",
                        listener.plugin_id,
                        held,
                        listener.plugin_id,
                    )
                listener.full = True
            elif held < listener.cap * 3 // 4:
                listener.full = False
        return full

    async def _watch(self) -> None:
        while self._listeners:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                counts = await asyncio.to_thread(accepted_counts, self.paths())
            except OSError as exc:  # no /proc: the cap still holds, unlogged
                log.debug("cannot count run API connections: %s", exc)
                return
            self.check(counts)


def accepted_counts(paths: Collection[str]) -> dict[str, int]:
    """Sockets of this process bound to each of `paths`: a listener and each connection it accepted carry its path.
    Read from the process's own descriptors (getsockname), not /proc/net/unix, which lists an accepted socket in its
    client's network namespace: a sandboxed plugin's is not the host's."""
    counts: collections.Counter[str] = collections.Counter()
    wanted = set(paths)
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            # Wraps the descriptor without owning it (detached below, never closed): if it was closed and reused
            # meanwhile, getsockname only reads whatever it is now.
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue
        try:
            if sock.family == socket.AF_UNIX:
                bound = sock.getsockname()
                if isinstance(bound, str) and bound in wanted:
                    counts[bound] += 1
        except OSError:
            pass
        finally:
            sock.detach()
    return counts
