"""Asking grpc-core for several calls of one method at a time, so that a burst of them is taken up in a few event
loop turns instead of one call per handful of turns.

grpc.aio's server (grpcio 1.85) keeps ONE outstanding request for each registered method: it waits for a call,
starts its handler, then asks for the next. Each call taken up costs five or six loop iterations (a task to make
the request, grpc's poller thread, the future, asyncio.wait over every method's future, the main loop's wake-up),
and while the host streams runs each iteration is long: at 5,000 concurrent sends the last ones waited 10-25 s in
grpc-core before any host code saw them. `prefetch` adds `depth` more outstanding requests for the methods it is
given, each handing its call to the same code grpc's own loop uses (`_handle_rpc` under `_schedule_rpc_coro`: the
server's interceptors, deadlines, cancellation, graceful shutdown), so a handler runs exactly as it would have.

These are grpc's private (Cython) entry points. `prefetch` checks that they are there and have the shape it was
written against, and otherwise does nothing (the server then takes calls up one at a time, as before): a grpc
upgrade can make bursts slower again, never wrong. It must not be used on a server with
`maximum_concurrent_rpcs`, whose limiter only grpc's own loop counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import grpc
from grpc._cython import cygrpc

log = logging.getLogger(__name__)

# The signatures `prefetch` was written against (grpcio 1.85): name -> argument names.
_SHAPES = {
    "_handle_rpc": ("method_name", "method_resolver", "interceptors", "rpc_state", "loop", "concurrency_exceeded"),
    "_schedule_rpc_coro": ("rpc_coro", "rpc_state", "loop", "method_name"),
}


def _available(server: grpc.aio.Server) -> bool:
    core = getattr(server, "_server", None)
    request = getattr(type(core), "_request_registered_call", None)
    if request is None or getattr(request, "__code__", None) is None:
        return False
    if request.__code__.co_varnames[:2] != ("self", "method"):
        return False
    for name, args in _SHAPES.items():
        fn = getattr(cygrpc, name, None)
        code = getattr(fn, "__code__", None)
        if code is None or code.co_varnames[: len(args)] != args:
            return False
    return True


class _Resolver:
    """What grpc's `_MethodResolver` is to `_handle_rpc`: the handler for a method name."""

    def __init__(self, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._handlers = dict(handlers)

    def resolve_handler(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(details.method)


class Prefetch:
    """The extra requests of one server; `taken` counts the calls they took up. They end when the server stops
    (grpc-core fails every request still outstanding). Never cancel one: grpc-core holds pointers into a request
    (its call, metadata and callback) until it completes it, and a cancelled request would be freed under it (a
    segfault at the next garbage collection)."""

    def __init__(self) -> None:
        self.taken = 0
        self._takers: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()


def prefetch(
    server: grpc.aio.Server,
    handlers: Mapping[str, grpc.RpcMethodHandler],
    *,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    depth: int,
) -> Prefetch | None:
    """Keeps `depth` extra requests outstanding for each of `handlers` (fully qualified method name -> the handler
    registered for it, with `server.add_registered_method_handlers`) on the started `server`, whose interceptors
    are `interceptors`. Returns them, or None when this grpc's private API is not
    the one this module knows (nothing changes then). Keep a reference to it while the server runs."""
    if not _available(server):
        log.warning("grpc's server internals changed (grpcio %s): calls are taken up one at a time", grpc.__version__)
        return None
    core = server._server
    loop = asyncio.get_running_loop()
    resolver = _Resolver(handlers)
    chain = tuple(interceptors)
    extra = Prefetch()

    async def take(method: str) -> None:
        method_bytes = method.encode()
        while core.is_running():
            try:
                state = await core._request_registered_call(method_bytes)
            except Exception:  # the request failed in grpc-core
                if core.is_running():
                    log.exception("requesting a %s call failed; one extra request fewer", method)
                return
            extra.taken += 1
            rpc = cygrpc._handle_rpc(method, resolver, chain, state, loop, False)
            call = loop.create_task(cygrpc._schedule_rpc_coro(rpc, state, loop, method))
            extra._calls.add(call)  # the loop keeps only a weak reference to a task
            call.add_done_callback(extra._calls.discard)

    extra._takers = [loop.create_task(take(method)) for method in handlers for _ in range(depth)]
    return extra
