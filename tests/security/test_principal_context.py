"""The caller's principal rides in a context variable for the length of its call (host/access/credentials.py). A
streaming handler is an async generator: when the host stops while it is suspended at a `yield` (a client that
stopped reading), the event loop closes it later, from a task of its own, in another context."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agenthost.host.access import credentials


async def test_a_stream_closed_by_the_loop_in_another_context_does_not_raise() -> None:
    """It raised ValueError ("was created in a different Context") on every such stream: a host stopped with a
    thousand slow readers logged a thousand tracebacks. Within the call the principal is still set."""
    seen: list[object] = []

    async def inner(request: Any, context: Any) -> AsyncIterator[str]:
        seen.append(credentials._current.get(None))
        yield "one"
        yield "two"

    principal: Any = object()
    handler = credentials._with_principal(grpc.unary_stream_rpc_method_handler(inner), principal)
    stream = handler.unary_stream(None, None)
    assert await anext(stream) == "one" and seen == [principal]
    closing = asyncio.get_running_loop().create_task(stream.aclose(), context=contextvars.Context())
    await closing  # raised ValueError before
