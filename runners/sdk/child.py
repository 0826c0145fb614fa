"""Recording a subagent as a child run of the current run (the run API's ChildRun call).

    async with run.child_run("look for the config loader", subagent_type="explore") as child:
        async for ev in my_subagent(...):
            await child.emit(ev)
    child.result.status  # "completed", ...

The host gives the child its own run id and a deadline no later than the run's; the child's events are recorded
under it (`agenthost runs show CHILD --events`) and never enter the conversation's transcript. Leaving the block
normally ends the child as completed (unless a terminal event was emitted), an exception ends it as failed, and
cancellation cancels the call, which the host records as cancelled. When the host ends the child first (a cancel
request on it, the parent run's end, its deadline), `emit` and leaving the block raise `errors.Cancelled` (cancelled,
interrupted) or `errors.DeadlineExceeded` (timed_out); an `emit` after the host failed it (e.g. past the event quota)
raises `errors.FailedPrecondition`, and leaving the block then sets `result` (status "failed").

The host tells every end in-band, as the call's last reply (`ChildRunFinished`), which a reader started with the
child takes as soon as it is sent: the call's status cannot carry it, since grpcio reports a write that races the
end of the call as INTERNAL, whatever the host's status was (grpc/grpc#36066).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import run_api_pb2 as api_pb

# A child the host ended itself, by its status; any other end seen by an `emit` is FailedPrecondition.
_HOST_ENDED: dict[str, type[errors.AgentHostError]] = {
    "cancelled": errors.Cancelled,
    "interrupted": errors.Cancelled,
    "timed_out": errors.DeadlineExceeded,
}
# How long a failed write waits for the host's last reply before it reports the write's own error. Core completes
# the pending read as soon as the call ends, so this bounds only a call that failed some other way.
_END_GRACE_SECONDS = 10.0


class ChildRun:
    """An open child run. Built by `RunAPI.child_run`; runner code only emits to it."""

    def __init__(self, call: Any, run_id: str, deadline_at: float) -> None:
        self._call = call
        self.run_id = run_id
        self.deadline_at = deadline_at
        self.ended = False  # a terminal event was emitted
        self.result: api_pb.ChildRunFinished | None = None  # the host's record of its end, once it ended
        # The host's one reply after `started`: the child's end, or why the call ended without it.
        self._end: asyncio.Task[api_pb.ChildRunFinished | errors.AgentHostError] = asyncio.ensure_future(
            self._read_end()
        )

    async def _read_end(self) -> api_pb.ChildRunFinished | errors.AgentHostError:
        try:
            reply = await self._call.read()
        except grpc.RpcError as exc:
            return errors.from_rpc_error(exc)
        if reply is grpc.aio.EOF:
            return await errors.from_ended_call(self._call)
        if reply.WhichOneof("kind") != "finished":
            return errors.Internal(f"the host sent {reply.WhichOneof('kind')!r} where a child run's end belongs")
        self.result = reply.finished
        return reply.finished

    def _ended_error(self, end: api_pb.ChildRunFinished | errors.AgentHostError) -> errors.AgentHostError:
        if isinstance(end, errors.AgentHostError):
            return end
        why = f"child run {self.run_id} ended {end.status}" + (f" ({end.error_code})" if end.error_code else "")
        why += f": {end.error_message}" if end.error_message else ""
        return _HOST_ENDED.get(end.status, errors.FailedPrecondition)(why)

    async def emit(self, *events: pb.RunEvent) -> None:
        """Sends the child's events (any kinds a run streams, ending with one completed | failed)."""
        if self.ended:
            raise errors.FailedPrecondition(f"child run {self.run_id} has ended")
        if self._end.done():  # the host has ended it: nothing more is written
            raise self._ended_error(self._end.result())
        if any(ev.WhichOneof("kind") in ("completed", "failed") for ev in events):
            self.ended = True
        try:
            await self._call.write(api_pb.ChildRunRequest(events=pb.RunEventBatch(events=list(events))))
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:  # the call ended: the host's last reply says why
            done, _ = await asyncio.wait({self._end}, timeout=_END_GRACE_SECONDS)
            if done:
                raise self._ended_error(self._end.result()) from None
            if isinstance(exc, grpc.RpcError):
                raise errors.from_rpc_error(exc) from None
            raise await errors.from_ended_call(self._call) from None

    async def _close(self) -> None:
        """Half-closes and takes the host's end: sets `result`, or raises if the host ended the child itself."""
        if not self._end.done():
            # A call that is ending can fail the half-close in several ways; its last reply is the answer anyway.
            with contextlib.suppress(Exception):
                await self._call.done_writing()
        end = await self._end
        if isinstance(end, errors.AgentHostError):
            raise end
        if end.status in _HOST_ENDED:
            raise self._ended_error(end)


@contextlib.asynccontextmanager
async def open_child_run(
    stub: Any,
    metadata: grpc.aio.Metadata,
    header: api_pb.ChildRunHeader,
    timeout: float,
) -> AsyncIterator[ChildRun]:
    call = stub.ChildRun(metadata=metadata, timeout=timeout)
    try:
        try:
            await call.write(api_pb.ChildRunRequest(header=header))
            reply = await call.read()
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        except asyncio.InvalidStateError:
            raise await errors.from_ended_call(call) from None
        if reply is grpc.aio.EOF or reply.WhichOneof("kind") != "started":
            raise await errors.from_ended_call(call)
    except BaseException:
        call.cancel()
        raise
    child = ChildRun(call, reply.started.child_run_id, reply.started.deadline_at)
    try:
        # One turn of the loop puts the reader's read in flight before any write can fail and mark the call ended.
        await asyncio.sleep(0)
        yield child
    except asyncio.CancelledError:
        call.cancel()  # the host records the child as cancelled
        raise
    except BaseException as exc:
        if not child.ended:
            with contextlib.suppress(errors.AgentHostError):
                message = f"{type(exc).__name__}: {exc}"[:2000]
                await child.emit(pb.RunEvent(failed=pb.Failed(code="runner_error", message=message)))
        with contextlib.suppress(errors.AgentHostError):
            await child._close()
        raise
    else:
        if not child.ended and not child._end.done():
            try:
                await child.emit(pb.RunEvent(completed=pb.Completed(finish_reason="stop")))
            except errors.AgentHostError:
                pass  # the host ended it meanwhile; its end is read below
        await child._close()
    finally:
        call.cancel()  # no-op once the call ended; frees it otherwise
        child._end.cancel()
