"""The one rule for an HTTP listener that untrusted clients reach (the host's gateway, a channel adapter's webhook):
a cap on open connections, in all and per client address, and who a client is behind a reverse proxy.

aiohttp has no such cap: every accepted connection is a descriptor and a protocol object for as long as the client
keeps it, and the request-head timeout only frees them after the fact. Past the cap a connection is answered at once
(503, Retry-After) and closed, so it holds its descriptor for one write.

One client address may hold at most `Caps.per_address` connections, and of those at most
`Caps.unauthenticated_per_address` that have not authenticated yet (OpenSSH's MaxStartups, per source): every
connection starts unauthenticated; the server marks the ones whose request showed a valid credential
(`Clients.authenticated`) and closes the others after their response (`Clients.request` says which), so a client
without one holds a connection for one request at most and cannot keep them with a request every few seconds.

Behind a reverse proxy every connection comes from the proxy's address: for a peer in the operator's trusted
proxies (none by default) the client is read from each request's X-Forwarded-For (else RFC 7239 Forwarded), the hop
nearest the server that is not itself a trusted proxy (nginx's real_ip_recursive), so what a client writes in the
header before its proxy appends the address it saw is ignored. Such a connection is counted for the client of its
latest request; the proxy's own address holds no cap. Importing this module imports aiohttp.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from agenthost.protos.limited_log import RefusalLimiter, log_limited

log = logging.getLogger(__name__)

RETRY_SECONDS = 1
# A refused connection's request is read and dropped for this long before it is closed (_Refused), at most this
# many at once.
LINGER_SECONDS = 1.0
LINGERING = 256
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Caps:
    """A listener's caps, and the names its refusals give them (the settings an operator looks up)."""

    total: int
    per_address: int
    unauthenticated_per_address: int
    names: tuple[str, str, str]  # of total, per_address, unauthenticated_per_address
    credential: str  # what a client shows to authenticate, for the refusal: "`Authorization: Bearer <key>`"


# (status, message, code) -> the body of a refusal, in the shape the listener's clients read errors in.
Render = Callable[[int, str, str], bytes]


def parse_networks(entries: Iterable[str], *, what: str) -> tuple[Network, ...]:
    """Addresses or networks (CIDR) as an operator gives trusted proxies (`what` names the setting in the error)."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"{what} {entry!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/8)"
            ) from None
    return tuple(networks)


@dataclass
class Client:
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
    """The hops the proxies recorded, the first client first: X-Forwarded-For (what nginx, Caddy, HAProxy and
    Traefik set), else RFC 7239 Forwarded's `for=` parameters."""
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


def _client_key(text: str) -> str:
    """What the per-address caps count: an IPv4 address, or an IPv6 address's /64. One subscriber, or one cloud
    host, is given a whole /64 to pick addresses from: counted one by one, each would have the caps afresh."""
    address = _ip(text)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address) if address is not None else text


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        address = _ip(str(peer[0]))
        return str(address) if address is not None else str(peer[0])
    return "unix"


class Refused(Exception):
    """A proxied request from a client over its caps: answer it `status` with `message` and close the connection."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Clients:
    """The client of each connection of one listener, and its per-address caps: the one place that says who a
    connection's client is (the accept path and every request ask it)."""

    def __init__(
        self,
        caps: Callable[[], Caps],
        trusted_proxies: Sequence[Network] = (),
        on_refusal: Callable[[str, str], None] | None = None,
    ) -> None:
        self.caps = caps  # read at each check: the host lowers its caps at start, tests lower them further
        self.trusted_proxies = tuple(trusted_proxies)
        self._refusals = RefusalLimiter()
        self.on_refusal = on_refusal or self._log_refusal
        self._by_handler: dict[RequestHandler, Client] = {}  # aiohttp's protocol object of each connection
        # Per address: connections, and those not authenticated. Kept as connections come, authenticate and go
        # (never counted by a walk over every connection: a flood of accepts would cost that walk each).
        self._held: dict[str, int] = {}
        self._unauthenticated: dict[str, int] = {}

    def _log_refusal(self, address: str, why: str) -> None:
        log_limited(self._refusals, log, "listener-refusal", logging.WARNING, "refused %s: %s", address, why)

    @property
    def server_log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The logger to give this listener's AppRunner (`logger=`): malformed requests logged as refusals."""
        return _ServerLog(self)

    def attach(self, server: web.Server) -> None:
        """Forgets each connection of `server` as it is lost (aiohttp's handler tells its Server)."""
        lost = server.connection_lost

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            client = self._by_handler.pop(handler, None)
            if client is not None:
                self._count(client, -1)
            lost(handler, exc)

        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def trusted(self, address: Address | None) -> bool:
        return address is not None and any(address in network for network in self.trusted_proxies)

    def client_of(self, peer: str, request: web.BaseRequest) -> str:
        """The address a proxied request came from (_client_key); the proxy's own when the hop that names it does
        not parse."""
        hops = _forwarded_hops(request)
        for hop in reversed(hops):
            address = _ip(hop)
            if address is None:
                return _client_key(peer)
            if not self.trusted(address):
                return _client_key(str(address))
        first = _ip(hops[0]) if hops else None  # every hop a trusted proxy: the first is the client
        return _client_key(str(first) if first is not None else peer)

    def counts(self, address: str) -> tuple[int, int]:
        """(connections, unauthenticated connections) the address holds now."""
        return self._held.get(address, 0), self._unauthenticated.get(address, 0)

    def _count(self, client: Client, step: int) -> None:
        if not client.address:
            return
        for table, counted in ((self._held, True), (self._unauthenticated, not client.authenticated)):
            if counted:
                left = table.get(client.address, 0) + step
                if left > 0:
                    table[client.address] = left
                else:
                    table.pop(client.address, None)

    def refusal(self, address: str) -> str | None:
        """Why one more connection (or proxied request) from this address is refused, if it is."""
        held, unauthenticated = self.counts(address)
        caps = self.caps()
        per_address = min(caps.total, caps.per_address)
        if held >= per_address:
            return (
                f"{held} connections from your address ({address}) are open, its cap ({caps.names[1]} = {per_address})"
            )
        per_address = min(per_address, caps.unauthenticated_per_address)
        if unauthenticated >= per_address:
            return (
                f"{unauthenticated} connections from your address ({address}) have not authenticated yet, the cap "
                f"({caps.names[2]} = {per_address}); send {caps.credential}"
            )
        return None

    def accept(self, transport: asyncio.BaseTransport) -> Client | str:
        """A new connection's client (record it with `admit`), or why it is refused."""
        peer = _peer(transport)
        if self.trusted(_ip(peer)):
            return Client("", proxied=True)
        key = _client_key(peer)
        refused = self.refusal(key)
        if refused is not None:
            self.on_refusal(key, refused)
            return refused
        return Client(key, proxied=False)

    def admit(self, handler: RequestHandler, client: Client) -> None:
        self._by_handler[handler] = client
        self._count(client, +1)

    def request(self, request: web.BaseRequest) -> Client:
        """The request's connection's client, known from this request; raises Refused when it came through a
        trusted proxy from an address over its caps (the proxy's connection is not refused at accept: it is not the
        client's). A proxied connection serves whichever client the proxy sends next: it starts unauthenticated.
        The caller closes the connection after the response unless the request authenticated."""
        transport = request.transport
        client = self._by_handler.get(request.protocol)
        if transport is None or client is None:  # the connection went while its request waited
            return Client("", proxied=False)
        if client.proxied:
            self._count(client, -1)  # not counted while its cap is checked
            client.address = ""
            client.authenticated = False
            address = self.client_of(_peer(transport), request)
            refused = self.refusal(address)
            if refused is not None:
                self.on_refusal(address, refused)
                raise Refused(
                    f"request refused: {refused}; retry in {RETRY_SECONDS}s", "too_many_connections_from_address"
                )
            client.address = address
            self._count(client, +1)
        return client

    def authenticated(self, request: web.BaseRequest) -> None:
        """The request showed a valid credential: its connection may stay open after it."""
        client = self._by_handler.get(request.protocol)
        if client is not None and not client.authenticated:
            self._count(client, -1)
            client.authenticated = True
            self._count(client, +1)


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger for one listener (`AppRunner(..., logger=clients.server_log)`). aiohttp logs every
    request that does not parse (a duplicate Content-Length, a folded header, 200 headers) at ERROR with its
    traceback: anyone who reaches the port wrote ~650 bytes of host log per malformed request, and could roll the
    log's history away in a minute. Those are refusals: one line each through the listener's limited refusal log.
    Anything else (a bug in a handler) keeps its traceback."""

    def __init__(self, clients: Clients) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.clients = clients

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            remote = str(args[0]) if args else "?"
            first = next((line.strip() for line in str(exc_info.message).splitlines() if line.strip()), "")
            self.clients.on_refusal(remote, f"a request that does not parse (HTTP {exc_info.code}: {first[:100]})")
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


class CappedSite(web.TCPSite):
    """A TCPSite that refuses connections past its caps' total (read at each accept) and past the caps of their
    client address (Clients)."""

    _refusing = False

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, *, clients: Clients, render: Render, reuse_address: bool
    ) -> None:
        super().__init__(runner, host, port, reuse_address=reuse_address)
        self.clients = clients
        self.render = render

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
        caps = self.clients.caps()
        if len(server.connections) < caps.total:
            if self._refusing:
                log.warning("%s: under its connection cap again; accepting connections", self._host_port())
                self._refusing = False
            return _Admit(server, self)
        if not self._refusing:
            log.warning(
                "%s: %d connections open, its cap (%s = %d); answering new ones 503",
                self._host_port(),
                len(server.connections),
                caps.names[0],
                caps.total,
            )
            self._refusing = True
        message = f"{caps.total} connections are open, the cap ({caps.names[0]}); retry in {RETRY_SECONDS}s"
        return _Refused(503, self.render(503, message, "too_many_connections"))

    def _host_port(self) -> str:
        return f"listener {self._host}:{self._port}"


class _Admit(asyncio.Protocol):
    """Stands for the connection until its peer is known: hands it to aiohttp, or refuses it (Clients.accept)."""

    def __init__(self, server: web.Server, site: CappedSite) -> None:
        self.server = server
        self.site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        client = refused = self.site.clients.accept(transport)
        if isinstance(refused, str):
            message = f"connection refused: {refused}; retry in {RETRY_SECONDS}s"
            body = self.site.render(429, message, "too_many_connections_from_address")
            _Refused(429, body).connection_made(transport)
            return
        assert isinstance(client, Client)
        handler = self.server()
        self.site.clients.admit(handler, client)
        transport.set_protocol(handler)  # the data that follows goes to aiohttp's handler
        handler.connection_made(transport)


_REASONS = {429: "Too Many Requests", 503: "Service Unavailable"}


class _Refused(asyncio.Protocol):
    """Answers the refusal and closes: the client is told why and when to come back.

    The client may have sent its request already: closing with it unread makes the kernel reset the connection,
    and a client reading after its write then loses the answer. So the answer is followed by a half-close, and what
    the client sends is read and dropped until it closes too, for LINGER_SECONDS at most; past LINGERING such
    refusals at once (a flood) a connection is closed at once."""

    lingering = 0

    def __init__(self, status: int, body: bytes) -> None:
        self.response = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {RETRY_SECONDS}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.response)
        if _Refused.lingering >= LINGERING or not transport.can_write_eof():
            transport.close()  # after the write is flushed
            return
        _Refused.lingering += 1
        self._transport = transport
        transport.set_protocol(self)  # reached through _Admit: what the client sends next comes here
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request nobody will answer

    def eof_received(self) -> bool:
        return False  # the client is done too: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            _Refused.lingering -= 1
            self._transport = None
        if self._timer is not None:
            self._timer.cancel()


def json_body(status: int, message: str, code: str) -> bytes:
    """A plain refusal body for a listener whose clients read no particular error shape."""
    return json.dumps({"ok": False, "error_code": status, "description": message, "code": code}).encode()
