"""The gateway's listener: a cap on open connections, in all and per client address.

aiohttp has no such cap: every accepted connection is a descriptor and a protocol object for as long as the client
keeps it, and the request-head timeout (AppRunner's keepalive_timeout, which aiohttp also arms when a connection
opens) only frees them after the fact. A flood of thousands of silent connections ran the host out of descriptors:
the gateway, the run API and the operator's admin.sock with it. Past the cap a connection is answered 503 with
Retry-After and closed at once, so it holds its descriptor for one write.

One client address may hold at most GATEWAY_MAX_CONNECTIONS_PER_ADDRESS of them, and of those at most
GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS that have not shown a key yet (OpenSSH's MaxStartups, per source): every
connection starts unauthenticated, and one whose request did not authenticate (no key, a wrong key, the console's
sign-in page) is closed after its response, so a client with no key holds a connection for one request at most and
cannot keep the gateway's connections with a request every few seconds. Behind a reverse proxy every connection
comes from the proxy's address: the client's is read from X-Forwarded-For (else RFC 7239 Forwarded) of each
request, and only when the peer is in the operator's trusted proxies (`serve --trusted-proxy`, none by default);
those connections are counted for the client address of their latest request, the proxy's own address holds no cap.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from agenthost.host import limits
from agenthost.host.api.gateway.errors import GatewayError
from agenthost.host.ops.addresses import Network
from agenthost.host.ops.logs import RefusalLimiter, log_limited

log = logging.getLogger(__name__)

RETRY_SECONDS = 1

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass
class _Client:
    """Whom one connection serves: its peer, or behind a trusted proxy the client its latest request came from."""

    address: str  # "" for a trusted proxy's connection before its first request: counted for nobody
    proxied: bool
    authenticated: bool = False


def _ip(text: str) -> Address | None:
    """An address as proxies write it in X-Forwarded-For or Forwarded (`for=`): bare, quoted, [v6], with a port."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # v4 with a port; a bare v6 has several colons
        text = text.partition(":")[0]
    try:
        found = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def _forwarded_hops(request: web.BaseRequest) -> list[str]:
    """The hops the proxies recorded, first client first: X-Forwarded-For (what nginx, Caddy, HAProxy and Traefik
    set), else RFC 7239 Forwarded's `for=` parameters."""
    hops = [hop for value in request.headers.getall("X-Forwarded-For", ()) for hop in value.split(",")]
    if hops:
        return hops
    found = []
    for value in request.headers.getall("Forwarded", ()):
        for element in value.split(","):
            for pair in element.split(";"):
                name, _, given = pair.partition("=")
                if name.strip().lower() == "for":
                    found.append(given)
    return found


class Clients:
    """The client address of each gateway connection and the per-address caps; the one place that says who a
    connection's client is (the accept path and every request ask it)."""

    def __init__(self, trusted_proxies: Sequence[Network] = ()) -> None:
        self.trusted_proxies = tuple(trusted_proxies)
        self._by_transport: weakref.WeakKeyDictionary[asyncio.BaseTransport, _Client] = weakref.WeakKeyDictionary()
        self._refusals = RefusalLimiter()
        self._server: web.Server | None = None  # its open connections are the ones counted (attach)

    def attach(self, server: web.Server) -> None:
        self._server = server

    def trusted(self, address: Address | None) -> bool:
        return address is not None and any(address in network for network in self.trusted_proxies)

    def client_of(self, peer: str, request: web.BaseRequest) -> str:
        """The address a request came from: its peer's, or (from a trusted proxy) the hop nearest the proxies
        that is not itself one of them (nginx's real_ip_recursive); the proxy's own when that does not parse."""
        hops = _forwarded_hops(request)
        for hop in reversed(hops):
            address = _ip(hop)
            if address is None:
                return peer
            if not self.trusted(address):
                return str(address)
        first = _ip(hops[0]) if hops else None
        return str(first) if first is not None else peer

    def counts(self, address: str) -> tuple[int, int]:
        """(connections, unauthenticated connections) the address holds now."""
        held = unauthenticated = 0
        # aiohttp's own list of open connections (a closed one's handler has no transport), never a table of ours
        # that a lost connection could leave behind.
        for handler in self._server.connections if self._server is not None else ():
            client = self._by_transport.get(handler.transport) if handler.transport is not None else None
            if client is not None and client.address == address:
                held += 1
                unauthenticated += not client.authenticated
        return held, unauthenticated

    def refusal(self, address: str, held: int, unauthenticated: int) -> str | None:
        """Why one more connection (or request, for a proxied one) from this address is refused, if it is."""
        cap, _ = limits.listener_caps()
        per_address = min(cap, limits.GATEWAY_MAX_CONNECTIONS_PER_ADDRESS)
        if held >= per_address:
            return (
                f"{held} connections from your address ({address}) are open, its cap "
                f"(GATEWAY_MAX_CONNECTIONS_PER_ADDRESS = {per_address})"
            )
        per_address = min(per_address, limits.GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS)
        if unauthenticated >= per_address:
            return (
                f"{unauthenticated} connections from your address ({address}) have sent no valid key yet, the cap "
                f"(GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS = {per_address}); send `Authorization: Bearer <key>`"
            )
        return None

    def accept(self, transport: asyncio.BaseTransport) -> str | None:
        """Records a new connection; returns why it is refused instead, if it is."""
        peer = _peer(transport)
        if self.trusted(_ip(peer)):
            self._by_transport[transport] = _Client("", proxied=True)
            return None
        held, unauthenticated = self.counts(peer)
        refused = self.refusal(peer, held, unauthenticated)
        if refused is not None:
            self._warn(peer, refused)
            return refused
        self._by_transport[transport] = _Client(peer, proxied=False)
        return None

    def request(self, request: web.BaseRequest) -> _Client:
        """The request's connection's client, known from this request; raises GatewayError 429 when it came
        through a trusted proxy from an address over its caps (the proxy's connection is not refused: it is not the
        client's). A proxied connection serves whichever client the proxy sends next: it starts unauthenticated."""
        transport = request.transport
        client = self._by_transport.get(transport) if transport is not None else None
        if transport is None or client is None:  # the connection went while its request waited
            return _Client("", proxied=False)
        if client.proxied:
            client.address = ""  # not counted while its cap is checked
            client.authenticated = False
            address = self.client_of(_peer(transport), request)
            held, unauthenticated = self.counts(address)
            refused = self.refusal(address, held, unauthenticated)
            if refused is not None:
                self._warn(address, refused)
                raise GatewayError(
                    429,
                    f"request refused: {refused}; retry in {RETRY_SECONDS}s",
                    type="rate_limit_error",
                    code="too_many_connections_from_address",
                    headers={"retry-after": str(RETRY_SECONDS)},
                )
            client.address = address
        return client

    def authenticated(self, request: web.BaseRequest) -> None:
        """The request showed a valid key or console session: its connection may stay open after it."""
        client = self._by_transport.get(request.transport) if request.transport is not None else None
        if client is not None:
            client.authenticated = True

    def _warn(self, address: str, why: str) -> None:
        # A flood is a few lines a minute, not one a try.
        log_limited(
            self._refusals, log, "gateway-address-cap", logging.WARNING, "gateway: refused %s: %s", address, why
        )


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        address = _ip(str(peer[0]))
        return str(address) if address is not None else str(peer[0])
    return "unix"


CLIENTS = web.AppKey("clients", Clients)


def authenticated(request: web.Request) -> None:
    """Marks the request's connection as one that showed a key (Clients.authenticated), from any sub-app."""
    clients = request.config_dict.get(CLIENTS)
    if clients is not None:
        clients.authenticated(request)


class CappedSite(web.TCPSite):
    """A TCPSite that refuses connections past limits.listener_caps()'s gateway share (read at each accept), and
    past the caps of their client address (Clients)."""

    _refusing = False

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, clients: Clients, reuse_address: bool) -> None:
        super().__init__(runner, host, port, reuse_address=reuse_address)
        self.clients = clients

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner; TCPSite.start would open the socket
        server = self._runner.server
        assert server is not None
        self.clients.attach(server)
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
            return _Admit(server, self.clients)
        if not self._refusing:
            log.warning(
                "gateway: %d connections open (GATEWAY_MAX_CONNECTIONS, at most a quarter of the "
                "descriptor limit, is %d); answering new ones 503",
                len(server.connections),
                cap,
            )
            self._refusing = True
        return _Refused(
            503,
            f"the gateway has {cap} connections open, its cap (GATEWAY_MAX_CONNECTIONS); retry in {RETRY_SECONDS}s",
            "too_many_connections",
        )


class _Admit(asyncio.Protocol):
    """Stands for the connection until its peer is known: hands it to aiohttp, or refuses it (Clients.accept)."""

    def __init__(self, server: web.Server, clients: Clients) -> None:
        self.server = server
        self.clients = clients

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        refused = self.clients.accept(transport)
        if refused is not None:
            _Refused(
                429, f"connection refused: {refused}; retry in {RETRY_SECONDS}s", "too_many_connections_from_address"
            ).connection_made(transport)
            return
        handler = self.server()
        transport.set_protocol(handler)  # the data that follows goes to aiohttp's handler
        handler.connection_made(transport)


_REASONS = {429: "Too Many Requests", 503: "Service Unavailable"}


class _Refused(asyncio.Protocol):
    """Answers in the OpenAI error shape and closes: the client is told why and when to come back."""

    def __init__(self, status: int, message: str, code: str) -> None:
        error = {
            "message": message,
            "type": "server_error" if status >= 500 else "rate_limit_error",
            "param": None,
            "code": code,
        }
        body = json.dumps({"error": error}).encode()
        self.response = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {RETRY_SECONDS}\r\nConnection: close\r\n\r\n"
        ).encode() + body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.response)
        transport.close()  # after the write is flushed; the client's request, if any, is never read
