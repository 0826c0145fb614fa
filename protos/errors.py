"""The one place where agenthost's domain errors meet gRPC status codes.

The host raises these from any layer (stores, grants, validation); its servicers translate them to a status with
`abort_with`. Clients (the runner SDK, the CLI) turn a failed call back into the same class with `from_rpc_error`,
so a runner author catches `NotFound`, not `grpc.RpcError` with a code to compare.
"""

from __future__ import annotations

import grpc


class AgentHostError(Exception):
    """Base of every typed error agenthost reports. `code` is the gRPC status it travels as."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
    return cls(details or code.name)


async def abort_with(context: grpc.aio.ServicerContext, error: AgentHostError) -> None:
    """Ends an aio call with the error's status. Awaited, so the handler really stops (grpc/grpc#21582)."""
    await context.abort(error.code, error.message)
