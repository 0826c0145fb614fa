"""The gateway's listener with a cap on open connections.

aiohttp has no such cap: every accepted connection is a descriptor and a protocol object for as long as the client
keeps it, and the request-head timeout (AppRunner's keepalive_timeout, which aiohttp also arms when a connection
opens) only frees them after the fact. A flood of thousands of silent connections ran the host out of descriptors:
the gateway, the run API and the operator's admin.sock with it. Past the cap a connection is answered 503 with
Retry-After and closed at once, so it holds its descriptor for one write.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from agenthost.host import limits

log = logging.getLogger(__name__)

RETRY_SECONDS = 1


class CappedSite(web.TCPSite):
    """A TCPSite that refuses connections past limits.listener_caps()'s gateway share (read at each accept)."""

    _refusing = False

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner; TCPSite.start would open the socket
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self._accept(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )

    def _accept(self, server: web.Server) -> asyncio.BaseProtocol:
        cap, _ = limits.listener_caps()
        if len(server.connections) < cap:
            if self._refusing:
                log.warning("gateway: under its connection cap again; accepting connections")
                self._refusing = False
            return server()
        if not self._refusing:
            log.warning(
                "gateway: %d connections open (GATEWAY_MAX_CONNECTIONS, at most a quarter of the "
                "descriptor limit, is %d); answering new ones 503",
                len(server.connections),
                cap,
            )
            self._refusing = True
        return _Refused(cap)


class _Refused(asyncio.Protocol):
    """Answers 503 in the OpenAI error shape and closes: the client is told why and when to come back."""

    def __init__(self, cap: int) -> None:
        error = {
            "message": f"the gateway has {cap} connections open, its cap (GATEWAY_MAX_CONNECTIONS); "
            f"retry in {RETRY_SECONDS}s",
            "type": "server_error",
            "param": None,
            "code": "too_many_connections",
        }
        body = json.dumps({"error": error}).encode()
        self.response = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {RETRY_SECONDS}\r\nConnection: close\r\n\r\n"
        ).encode() + body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.response)
        transport.close()  # after the write is flushed; the client's request, if any, is never read
