"""The worker's unary run API calls, multiplexed on one long-lived `WorkerHub.Calls` stream per connection.

Forwarding each runner call as a gRPC call of its own cost about 0.5 ms of grpc.aio call set-up on each side of the
second hop (issue 22). Here a call is a frame (`ForwardedCall`: id, method, run token, deadline left, request
bytes) and its answer a frame with the same id (`ForwardedReply`). Both sides keep every check they had: the
worker still checks its runner's plugin secret and run before a frame is written; the host checks each frame as
it would the call (this worker's certificate, unrevoked and unexpired, per frame; the run token and the run placed
on this worker, the grant and the audit in the run API handler itself; the per-worker cap of open calls).

`Multiplexer` is the worker's side, `serve_calls` the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from agenthost.protos import errors
from agenthost.protos import worker_pb2 as wpb

log = logging.getLogger(__name__)

CALLS_METHOD = "/agenthost.v1.WorkerHub/Calls"
# Frames the worker may have written and not yet had flow control take: a full queue makes callers wait (the
# stream's back-pressure reaches the runners) instead of growing memory.
OUTBOX_FRAMES = 256
# Replies the host holds for a worker that does not read them: when full, the host reads no more of its frames (a
# worker sending refused frames without reading the refusals would otherwise grow the host's memory without end).
REPLY_QUEUE_FRAMES = 256


class CallFailed(Exception):
    """A forwarded call's non-OK status, as the host (or a cut stream) gave it."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_ms: int = 0) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.retry_after_ms = retry_after_ms


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Multiplexer:
    """The worker's end of one `Calls` stream on one channel, opened at the first call. A reply whose id is not in
    flight is logged and dropped; when the stream ends or breaks, every call in flight fails UNAVAILABLE at once
    (a runner retries; none waits for a reply that cannot come) and the next call opens a new stream."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._factory = channel.stream_stream(CALLS_METHOD)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._next = 0
        self._outbox: asyncio.Queue[wpb.ForwardedCall | None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self.unknown_replies = 0  # what the tests read

    def _open(self) -> asyncio.Queue[wpb.ForwardedCall | None]:
        if self._outbox is not None and self._reader is not None and not self._reader.done():
            return self._outbox
        outbox: asyncio.Queue[wpb.ForwardedCall | None] = asyncio.Queue(OUTBOX_FRAMES)

        async def frames() -> AsyncIterator[bytes]:
            while (frame := await outbox.get()) is not None:
                yield frame.SerializeToString()

        call = self._factory(frames())
        self._outbox = outbox
        self._reader = asyncio.create_task(self._read(call, outbox), name="worker:calls")
        return outbox

    async def _read(self, call: Any, outbox: asyncio.Queue[wpb.ForwardedCall | None]) -> None:
        reason = "the host ended this worker's calls stream"
        try:
            async for data in call:
                reply = wpb.ForwardedReply.FromString(data)
                future = self._pending.pop(reply.id, None)
                if future is None:
                    # A reply for a call given up (cancelled, its deadline passed) or a host bug: never a hang.
                    self.unknown_replies += 1
                    log.warning("the host answered call %d, which is not in flight here; dropped", reply.id)
                    continue
                if future.done():
                    continue
                if reply.code == 0:
                    future.set_result(reply.reply)
                else:
                    code = _CODES.get(reply.code, grpc.StatusCode.UNKNOWN)
                    future.set_exception(CallFailed(code, reply.details, reply.retry_after_ms))
        except grpc.RpcError as exc:
            reason = f"this worker's calls stream to the host broke: {exc.code().name}: {exc.details()}"
        finally:
            if self._outbox is outbox:
                self._outbox = None
            self._fail_all(reason)
            call.cancel()

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(CallFailed(grpc.StatusCode.UNAVAILABLE, f"{reason}; try again shortly"))

    async def call(self, method: str, authorization: str, request: bytes, timeout: float | None) -> bytes:
        """The reply's bytes, or CallFailed with the call's status; cancelling the caller cancels it on the host."""
        outbox = self._open()
        self._next += 1
        call_id = self._next
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await outbox.put(
                wpb.ForwardedCall(
                    id=call_id, method=method, authorization=authorization, request=request, timeout=timeout or 0.0
                )
            )
            # The host enforces the deadline; this side waits a little longer for its DEADLINE_EXCEEDED.
            async with asyncio.timeout(None if timeout is None else timeout + 1.0):
                return await future
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "the forwarded call's deadline passed") from None
        except asyncio.CancelledError:
            if self._pending.pop(call_id, None) is not None and self._outbox is outbox:
                with contextlib.suppress(asyncio.QueueFull):
                    outbox.put_nowait(wpb.ForwardedCall(id=call_id, cancel=True))
            raise
        finally:
            self._pending.pop(call_id, None)

    async def close(self) -> None:
        if self._outbox is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._outbox.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class _FrameContext:
    """What a run API handler reads of its grpc context, for one frame: the run token as its metadata, the frame's
    deadline, and abort; the rest (the peer, the TLS auth context) is the stream's."""

    def __init__(self, outer: grpc.aio.ServicerContext, authorization: str, deadline: float | None) -> None:
        self._outer = outer
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", authorization),) if authorization else ()
        self._deadline = deadline
        self.retry_after_ms = 0

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        for key, value in metadata:
            if key == errors.RETRY_AFTER_KEY:
                with contextlib.suppress(ValueError):
                    self.retry_after_ms = int(value)

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details)

    def peer(self) -> str:
        return str(self._outer.peer())

    def auth_context(self) -> Any:
        return self._outer.auth_context()


async def serve_calls(
    requests: AsyncIterator[bytes],
    context: grpc.aio.ServicerContext,
    *,
    handlers: dict[str, grpc.RpcMethodHandler],
    admit: Callable[[], Callable[[], None]],
) -> AsyncIterator[bytes]:
    """The host's end of a worker's `Calls` stream. `handlers`: the unary run API handlers by method path;
    `admit()` checks this worker again (its certificate, per frame) and takes one of its open calls (the caller
    calls what it returns when done), raising AgentHostError otherwise. Each frame is served in its own task, so a
    slow call holds up no other; the stream's context (the calling worker) is what every task inherits."""
    replies: asyncio.Queue[wpb.ForwardedReply | None] = asyncio.Queue()
    room = asyncio.Semaphore(REPLY_QUEUE_FRAMES)  # replies queued and not yet taken by the worker's reads

    async def put(reply: wpb.ForwardedReply) -> None:
        await room.acquire()
        replies.put_nowait(reply)

    tasks: dict[int, asyncio.Task[None]] = {}

    async def serve(frame: wpb.ForwardedCall, leave: Callable[[], None]) -> None:
        deadline = time.monotonic() + frame.timeout if frame.timeout > 0 else None
        ctx = _FrameContext(context, frame.authorization, deadline)
        reply = wpb.ForwardedReply(id=frame.id)
        try:
            handler = handlers[frame.method]
            request = handler.request_deserializer(frame.request) if handler.request_deserializer else frame.request
            async with asyncio.timeout(frame.timeout if frame.timeout > 0 else None):
                result = await handler.unary_unary(request, ctx)
            reply.reply = handler.response_serializer(result) if handler.response_serializer else result
        except _Aborted as exc:
            reply.code, reply.details, reply.retry_after_ms = exc.code.value[0], exc.details, ctx.retry_after_ms
        except TimeoutError:
            reply.code = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
            reply.details = "the forwarded call's deadline passed"
        except asyncio.CancelledError:
            tasks.pop(frame.id, None)
            leave()
            return  # the worker gave up on it: no reply
        except Exception:
            log.exception("serving forwarded call %s failed", frame.method)
            reply.code = grpc.StatusCode.INTERNAL.value[0]
            reply.details = f"the host failed to serve {frame.method}; see its log"
        try:
            await put(reply)  # its open-call slot is held until the reply is queued: bounded either way
        finally:
            tasks.pop(frame.id, None)
            leave()

    async def read() -> None:
        try:
            async for data in requests:
                frame = wpb.ForwardedCall.FromString(data)
                if frame.cancel:
                    task = tasks.get(frame.id)
                    if task is not None:
                        task.cancel()
                    continue
                handler = handlers.get(frame.method)
                if frame.id in tasks or handler is None or handler.unary_unary is None:
                    what = "is in flight already" if frame.id in tasks else "is not a unary run API method"
                    await put(
                        wpb.ForwardedReply(
                            id=frame.id,
                            code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                            details=f"forwarded call {frame.id}: {frame.method!r} {what}",
                        )
                    )
                    continue
                try:
                    leave = admit()
                except errors.AgentHostError as exc:
                    await put(
                        wpb.ForwardedReply(
                            id=frame.id, code=exc.code.value[0], details=exc.message, retry_after_ms=exc.retry_after_ms
                        )
                    )
                    continue
                tasks[frame.id] = asyncio.create_task(serve(frame, leave))
            # The worker half-closed: the calls in flight still get their replies.
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        finally:
            replies.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (reply := await replies.get()) is not None:
            room.release()
            yield reply.SerializeToString()
    finally:
        reader.cancel()
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(reader, *tasks.values(), return_exceptions=True)
