"""Errors as OpenAI clients expect them: `{"error": {"message", "type", "param", "code"}}` with the matching status.

The official clients pick their exception class from the status (401 AuthenticationError, 404 NotFoundError, 429
RateLimitError, ...) and retry 408/409/429/5xx unless the response says `x-should-retry: false`. Every error that
comes after a run was started carries that header: the message was accepted and recorded, and a retry would start a
second run for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agenthost.protos import errors

NO_RETRY = {"x-should-retry": "false"}


@dataclass
class GatewayError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in the gateway's body parser processes too (bodies.BodySlots), and pickled back from there.
        return (type(self), (self.status, self.message, self.type, self.code, self.param, self.headers))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def model_not_found(model: str) -> GatewayError:
    """One answer for a bot that does not exist and a bot this key may not use: a scoped key learns nothing about
    the host's other bots, as on the gRPC side, where other bots' runs do not exist for a scoped credential."""
    return GatewayError(
        404,
        f"The model {model!r} does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


# Refusals that come before any run exists: the status tells the client what to do next.
_STATUS: dict[type[errors.AgentHostError], tuple[int, str]] = {
    errors.InvalidArgument: (400, "invalid_request_error"),
    errors.OutOfRange: (400, "invalid_request_error"),
    errors.Unauthenticated: (401, "invalid_request_error"),
    # Only reachable for non-bot checks (bots are answered by model_not_found before the host is asked).
    errors.PermissionDenied: (403, "invalid_request_error"),
    errors.NotFound: (404, "invalid_request_error"),
    errors.AlreadyExists: (409, "invalid_request_error"),
    errors.ResourceExhausted: (429, "rate_limit_error"),
    errors.Unavailable: (503, "server_error"),
    errors.DeadlineExceeded: (504, "server_error"),
}


def from_host_error(exc: errors.AgentHostError) -> GatewayError:
    """A refusal of the host before a run started."""
    if isinstance(exc, errors.FailedPrecondition):
        # The bot has no binding for this, or its plugin is disabled: an operator has to act, so the client is told
        # the service is unavailable and not to retry by itself.
        return GatewayError(503, exc.message, type="server_error", code="bot_unavailable", headers=dict(NO_RETRY))
    status, kind = _STATUS.get(type(exc), (500, "server_error"))
    # The host's admission queue says when to come back (whole seconds up, as HTTP's Retry-After takes them).
    headers = {"retry-after": str(max(1, -(-exc.retry_after_ms // 1000)))} if status == 429 else {}
    return GatewayError(status, exc.message, type=kind, code=exc.code.name.lower(), headers=headers)


def from_admin_error(exc: errors.AgentHostError) -> GatewayError:
    """A refusal of an admin operation made from the web console. Unlike a chat client, the console's user is the
    operator: a failed precondition ("built-in plugins cannot be removed", "the plugin is disabled") is theirs to
    fix, so it is a 409 with the host's own message rather than the chat surface's 503."""
    if isinstance(exc, errors.FailedPrecondition):
        return GatewayError(409, exc.message, code="failed_precondition")
    return from_host_error(exc)
