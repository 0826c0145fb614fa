"""The one place where agenthost's domain errors meet gRPC status codes.

The host raises these from any layer (stores, grants, validation); its servicers translate them to a status with
`abort_with`. Clients (the runner SDK, the CLI) turn a failed call back into the same class with `from_rpc_error`,
so a runner author catches `NotFound`, not `grpc.RpcError` with a code to compare.
"""

from __future__ import annotations

import inspect

import grpc

# Trailing metadata of a refusal that a later retry can cure (the host's run admission): how long to wait, in
# milliseconds, as decimal digits. Clients read it from the typed error's `retry_after_ms`.
RETRY_AFTER_KEY = "retry-after-ms"


class AgentHostError(Exception):
    """Base of every typed error agenthost reports. `code` is the gRPC status it travels as; `retry_after_ms`
    (0: none) travels as the trailing metadata RETRY_AFTER_KEY."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms


class InvalidArgument(AgentHostError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(AgentHostError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AgentHostError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AgentHostError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(AgentHostError):
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(AgentHostError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(AgentHostError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class OutOfRange(AgentHostError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Aborted(AgentHostError):
    """Optimistic-concurrency conflict (a state write whose if_version is stale)."""

    code = grpc.StatusCode.ABORTED


class DeadlineExceeded(AgentHostError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(AgentHostError):
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(AgentHostError):
    code = grpc.StatusCode.CANCELLED


class Internal(AgentHostError):
    code = grpc.StatusCode.INTERNAL


ERROR_BY_STATUS: dict[grpc.StatusCode, type[AgentHostError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        FailedPrecondition,
        ResourceExhausted,
        OutOfRange,
        Aborted,
        DeadlineExceeded,
        Unavailable,
        Cancelled,
        Internal,
    )
}


def from_rpc_error(err: grpc.RpcError) -> AgentHostError:
    """Maps a failed call (sync or aio) back to its typed error; unknown codes become Internal."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    cls = ERROR_BY_STATUS.get(code, Internal)
    return cls(details or code.name, retry_after_ms=_retry_after(err))


async def from_ended_call(call: grpc.aio.Call) -> AgentHostError:
    """The typed error of a streaming aio call that ended without the reply its protocol promised (its status is
    read from the call, since no RpcError was raised)."""
    code = await call.code()
    details = await call.details()
    return ERROR_BY_STATUS.get(code, Internal)(details or code.name)


def _retry_after(err: grpc.RpcError) -> int:
    trailing = getattr(err, "trailing_metadata", None)
    try:
        metadata = trailing() if callable(trailing) else None
        if inspect.iscoroutine(metadata):  # a live aio call, not its error: its trailers are not in yet
            metadata.close()
            return 0
        for key, value in metadata or ():
            if key == RETRY_AFTER_KEY:
                return max(0, int(value))
    except (TypeError, ValueError):  # a peer's malformed hint is no hint
        pass
    return 0


async def abort_with(context: grpc.aio.ServicerContext, error: AgentHostError) -> None:
    """Ends an aio call with the error's status. Awaited, so the handler really stops (grpc/grpc#21582)."""
    if error.retry_after_ms > 0:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(error.retry_after_ms)),))
    await context.abort(error.code, error.message)
