"""Admin operations called in-process: the web console asks the same AdminServicer the CLI reaches over gRPC.

No second hop through admin.sock, and no second copy of the rules: the servicer's validation, redaction and bot
checks apply unchanged, and the method allow-list for scoped callers is AuthInterceptor's (Principal.require_method).
A refusal comes back as the typed error the servicer raised (agenthost.protos.errors), for the caller to map once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import grpc

from agenthost.host.access.credentials import Principal, acting_as
from agenthost.host.api.admin import AdminServicer
from agenthost.protos import errors

if TYPE_CHECKING:
    from agenthost.host.api.services import HostServices


class _Context:
    """The part of a grpc.aio.ServicerContext that AdminServicer uses (errors.abort_with): `abort` raises the typed
    error its status stands for, with the retry hint the servicer attached."""

    def __init__(self) -> None:
        self.retry_after_ms = 0

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, str]]) -> None:
        for key, value in metadata:
            if key == errors.RETRY_AFTER_KEY:
                self.retry_after_ms = int(value)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise errors.ERROR_BY_STATUS.get(code, errors.Internal)(details, retry_after_ms=self.retry_after_ms)


class AdminCalls:
    def __init__(self, host: HostServices) -> None:
        self.servicer = AdminServicer(host)

    async def call(self, principal: Principal, method: str, request: Any) -> Any:
        principal.require_method(method)
        with acting_as(principal):
            return await getattr(self.servicer, method)(request, _Context())

    async def stream(self, principal: Principal, method: str, request: Any) -> AsyncIterator[Any]:
        """A server-streaming method's replies; the principal holds for the whole stream."""
        principal.require_method(method)
        with acting_as(principal):
            async for reply in getattr(self.servicer, method)(request, _Context()):
                yield reply
