"""Recording a subagent as a child run of the current run (the run API's ChildRun call).

    async with run.child_run("look for the config loader", subagent_type="explore") as child:
        async for ev in my_subagent(...):
            await child.emit(ev)
    child.result.status  # "completed", ...

The host gives the child its own run id and a deadline no later than the run's; the child's events are recorded
under it (`agenthost runs show CHILD --events`) and never enter the conversation's transcript. Leaving the block
normally ends the child as completed (unless a terminal event was emitted), an exception ends it as failed, and
cancellation cancels the call, which the host records as cancelled. When the parent run ends first, the host ends
the child and `emit` raises `errors.Cancelled` (or `errors.DeadlineExceeded`).
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


class ChildRun:
    """An open child run. Built by `RunAPI.child_run`; runner code only emits to it."""

    def __init__(self, call: Any, run_id: str, deadline_at: float) -> None:
        self._call = call
        self.run_id = run_id
        self.deadline_at = deadline_at
        self.ended = False  # a terminal event was emitted
        self.result: api_pb.ChildRunFinished | None = None  # the host's record of its end, once it ended

    async def emit(self, *events: pb.RunEvent) -> None:
        """Sends the child's events (any kinds a run streams, ending with one completed | failed)."""
        if self.ended:
            raise errors.FailedPrecondition(f"child run {self.run_id} has ended")
        if any(ev.WhichOneof("kind") in ("completed", "failed") for ev in events):
            self.ended = True
        try:
            await self._call.write(api_pb.ChildRunRequest(events=pb.RunEventBatch(events=list(events))))
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        except asyncio.InvalidStateError:  # the host already ended the call: its status says why
            raise await errors.from_ended_call(self._call) from None

    async def _close(self) -> None:
        try:
            await self._call.done_writing()
            reply = await self._call.read()
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None
        if reply is grpc.aio.EOF or reply.WhichOneof("kind") != "finished":
            raise await errors.from_ended_call(self._call)
        self.result = reply.finished


@contextlib.asynccontextmanager
async def open_child_run(
    stub: Any,
    metadata: tuple[tuple[str, str], ...],
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
        call.cancel()
        raise
    else:
        try:
            if not child.ended:
                await child.emit(pb.RunEvent(completed=pb.Completed(finish_reason="stop")))
            await child._close()
        finally:
            call.cancel()  # no-op once the call ended; frees it otherwise
