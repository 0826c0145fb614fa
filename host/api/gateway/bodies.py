"""A request's JSON object body, read under a byte cap and a time limit, for both the OpenAI-compatible endpoints
and the console API.

A body past limits.GATEWAY_LARGE_BODY_BYTES, or one that may hold more than limits.GATEWAY_LOOP_PARSE_VALUES JSON
values, takes a large-body slot (host-wide and per key; none free: 429 with Retry-After) for as long as it is read and
parsed, and is parsed in another process: a burst of 12 MiB bodies, or of 256 KiB lists of zeros, on one key neither
holds the event loop through every parse in turn nor makes the host hold them all at once. What the loop parses
itself is bounded by values, not only bytes: that is what a parse costs."""

from __future__ import annotations

import asyncio
import ctypes
import json
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar, overload

from aiohttp import web

from agenthost.host import limits
from agenthost.host.api.gateway.errors import GatewayError, bad_request

BODY_SECONDS = 30.0  # to read a request body: a trickling client holds a socket briefly
RETRY_SECONDS = 1  # a large body's slot is held for one read and parse: they turn over within about a second
PR_SET_PDEATHSIG = 1

T = TypeVar("T")


class BodySlots:
    """The large bodies being read and parsed, host-wide and per key, and the processes that parse them.

    Processes, not threads: json.loads is C that holds the GIL for a whole document (150 ms for 12 MiB of small
    messages), so a parsing thread stalls the loop as long as parsing on it does, and several stall it longer. A
    parser process gets the raw bytes and sends back only what the endpoint keeps (the last message), so the
    parsed object, several times the body's size, never lives in the host either. Started at the first large
    body (a spare Python process each, about 40 MiB); spawned, not forked, as the host runs gRPC's threads."""

    def __init__(self) -> None:
        self.total = 0
        self.by_key: dict[str, int] = {}
        self._pool: ProcessPoolExecutor | None = None

    def take(self, key: str) -> None:
        held = self.by_key.get(key, 0)
        if held >= limits.GATEWAY_MAX_LARGE_BODIES_PER_KEY:
            cap = f"this key is sending {held} large bodies (GATEWAY_MAX_LARGE_BODIES_PER_KEY = "
            cap += f"{limits.GATEWAY_MAX_LARGE_BODIES_PER_KEY})"
        elif self.total >= limits.GATEWAY_MAX_LARGE_BODIES:
            cap = f"the gateway is reading {self.total} large bodies (GATEWAY_MAX_LARGE_BODIES = "
            cap += f"{limits.GATEWAY_MAX_LARGE_BODIES})"
        else:
            self.total += 1
            self.by_key[key] = held + 1
            return
        raise GatewayError(
            429,
            f"request refused: {cap}, each over {limits.GATEWAY_LARGE_BODY_BYTES} bytes or "
            f"{limits.GATEWAY_LOOP_PARSE_VALUES} JSON values; retry in {RETRY_SECONDS}s",
            type="rate_limit_error",
            code="too_many_large_bodies",
            headers={"retry-after": str(RETRY_SECONDS)},
        )

    def give(self, key: str) -> None:
        self.total -= 1
        left = self.by_key[key] - 1
        if left:
            self.by_key[key] = left
        else:
            del self.by_key[key]

    async def off_loop(self, key: str, data: bytes, then: Callable[[dict[str, Any]], T] | None) -> Any:
        """`_decode(data, then)` in a parser process. The key's slot is given back when the parser is done with the
        body, even if the request is cancelled meanwhile (the parse goes on, and so does the memory it holds)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                limits.GATEWAY_BODY_PARSERS,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_die_with_host,
                initargs=(os.getpid(),),
            )
        pool = self._pool
        try:
            future = asyncio.get_running_loop().run_in_executor(pool, _decode, data, then)
        except BrokenProcessPool:
            future = None
        if future is not None:
            future.add_done_callback(lambda _: self.give(key))
            try:
                return await asyncio.shield(future)
            except BrokenProcessPool:
                pass
        else:
            self.give(key)
        # A parser died (killed, out of memory): the next large body starts a fresh pool.
        if self._pool is pool:
            self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
        raise GatewayError(
            503,
            f"the gateway's body parser stopped while parsing this request; retry in {RETRY_SECONDS}s",
            type="server_error",
            headers={"retry-after": str(RETRY_SECONDS)},
        )

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)


def _die_with_host(host_pid: int) -> None:
    """A parser process's first act: the kernel kills it when the host's thread that started it (the event loop's,
    at submit) ends, a kill -9 of the host too. Otherwise it would wait on its queue for ever, with the host's
    environment, one more after each crash; and so would multiprocessing's resource tracker, which it keeps open."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != host_pid:  # the host died before the line above
        os._exit(1)


SLOTS = web.AppKey("body_slots", BodySlots)


def too_large(max_bytes: int) -> GatewayError:
    return GatewayError(413, f"the request body is larger than {max_bytes} bytes", code="request_too_large")


@overload
async def json_object(
    request: web.Request, max_bytes: int, *, key: str, then: None = None, require_json_type: bool = False
) -> dict[str, Any]: ...


@overload
async def json_object(
    request: web.Request,
    max_bytes: int,
    *,
    key: str,
    then: Callable[[dict[str, Any]], T],
    require_json_type: bool = False,
) -> T: ...


async def json_object(
    request: web.Request,
    max_bytes: int,
    *,
    key: str,
    then: Callable[[dict[str, Any]], T] | None = None,
    require_json_type: bool = False,
) -> Any:
    """The body as a JSON object (or, with `then`, what `then` makes of it: it runs where the parse does, so the
    parsed object is walked and dropped off the loop too). Read chunk by chunk, so a body without Content-Length is
    cut off at the cap rather than read whole first. `key`: whose share of large-body slots a large body takes (the
    credential's name). `require_json_type`: refuse other content types with 415 (the console needs it: a
    cross-site form cannot send application/json without a preflight)."""
    if require_json_type and request.content_type != "application/json":
        raise GatewayError(415, "send JSON (Content-Type: application/json)", code="unsupported_media_type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large(max_bytes)
    slots = request.config_dict[SLOTS]
    large = False
    if request.content_length is not None and request.content_length > limits.GATEWAY_LARGE_BODY_BYTES:
        slots.take(key)  # refused from the header, before a byte of the body is buffered
        large = True
    try:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(BODY_SECONDS):
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > max_bytes:
                        raise too_large(max_bytes)
                    if not large and size > limits.GATEWAY_LARGE_BODY_BYTES:  # undeclared (chunked), grown large
                        slots.take(key)
                        large = True
                    chunks.append(chunk)
        except TimeoutError:
            raise GatewayError(408, f"the request body did not arrive within {BODY_SECONDS:.0f}s") from None
        data = b"".join(chunks)
        del chunks
        if not large and _may_hold(data) > limits.GATEWAY_LOOP_PARSE_VALUES:
            slots.take(key)
            large = True
        if not large:
            return _decode(data, then)
        large = False  # from here the slot is the parser's, given back when it is done
        return await slots.off_loop(key, data, then)
    finally:
        if large:
            slots.give(key)


def _may_hold(data: bytes) -> int:
    """At most how many array elements and object members `data` holds: each follows a comma, or is its
    container's first (after a bracket), or is the document. One C pass (about 1.5 ns a byte), skipped for a body
    too short to reach the cap (an element and its comma take at least two bytes)."""
    if len(data) <= 2 * limits.GATEWAY_LOOP_PARSE_VALUES:
        return 0
    return len(data) - len(data.translate(None, b",[{")) + 1


def _decode(data: bytes, then: Callable[[dict[str, Any]], T] | None) -> Any:
    """Runs on the loop for a small body, in a parser process for a large one (`then` must then be a module-level
    function: it travels by name)."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body if then is None else then(body)
