"""The host MCP bridge served by the runner process itself, over MCP streamable HTTP on loopback: one endpoint
per harness process (a turn's, or a kept Claude Code process's across turns, see warm.py). Codex's default;
Claude Code's is mcp_control.py (its own pipes, nothing listening).

Why: the stdio bridge is a Python process the harness starts on every turn (interpreter + ~55 ms of imports),
and harnesses wait for every MCP server before their first model request, so that start-up was latency on every
message. Here the runner, already running and with gRPC loaded, answers the same MCP sessions (`McpServer`, the
stdio bridge's protocol core) from its own event loop, and the harness connects over HTTP.

The walls:

* **Credential.** A sandboxed harness has a network namespace of its own (runners/sdk/egress.py): its endpoint
  listens on no TCP port of the machine at all, only on a unix socket (0600, in the runner's private directory) that
  the sandbox's forwarder relays to at the port the URL names. Unsandboxed (`process_sandbox: false`) it listens on
  the machine's loopback, where anything can reach the port. Either way every request must carry `Authorization:
  Bearer <token>`, a fresh random token made for this one harness process and handed only to it (in its environment,
  never argv or a file). Another conversation's harness holds another token, for another port. Compared in constant
  time.
* **Lifetime.** The endpoint is opened before the harness starts and closed when the harness process ends: the
  listener, every open connection and every session's in-flight host call go with it. A kept process's endpoint
  outlives a turn, but not the turn's authority: when the turn ends, however it ends, the runner detaches the run
  (`attach(None)`), which cancels its calls in flight and closes its host client; the next turn attaches its own.
  The host also revokes the run's tool token when the run ends, so a call that raced either still fails there.
* **Authority.** Tool calls reach the host's run API with the run's *tool token* alone, exactly as the stdio
  bridge did: the plugin secret and the runner's run token are never used here, so a harness holding the MCP
  token can do what the run's grant allows and nothing more. The harness itself no longer holds the tool token
  or sees api.sock at all.
* **Crowding.** At most MAX_CONNECTIONS connections; a newcomer over the cap displaces the oldest connection
  that has not shown the token, so idle sockets from anyone on loopback cannot keep the harness out.
* **Browsers.** A `Host` header that is not this loopback listener, or a foreign `Origin`, is refused (403)
  before anything else: the spec's DNS-rebinding defence.

Transport rules (MCP 2025-03-26 and later, "Streamable HTTP"): POST carries one JSON-RPC message (or a batch
where the negotiated version has batches); a request is answered with `application/json`, notifications and
responses with 202 and no body. `initialize` opens a session (`Mcp-Session-Id`); later requests must name it
(400 without one, 404 for an unknown or ended one); DELETE ends it. GET is 405: this server never sends requests
or notifications of its own, so there is no stream to offer. A request cancelled by `notifications/cancelled`
is answered with JSON-RPC error -32800, because an HTTP request needs an answer and the spec's "no response"
is about the JSON-RPC reply (the official SDK's 2025-era HTTP transport does the same).

MCP 2026-07-28 (a request whose `MCP-Protocol-Version` header names it): no session at all. Each POST carries one
request with its own version and capabilities in `params._meta`; the routing headers must agree with the body
(-32020); an error's HTTP status follows its code (400, 404 for an unknown method); a notification is 202 and
unused; GET and DELETE are 405. The client cancels a request by closing the connection, so the connection is
watched while the request runs. The walls above are checked first, exactly as for every other request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import h11

from agenthost.runners.external_harness.mcp_bridge import (
    ALL_PROTOCOLS,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_LINE,
    METHOD_NOT_FOUND,
    MODERN_PROTOCOLS,
    PARSE_ERROR,
    SUPPORTED_PROTOCOLS,
    TOOL_NAMES,
    UNSUPPORTED_PROTOCOL_VERSION,
    Bridge,
    McpServer,
    RequestCancelled,
    _error,
    _id_key,
    envelope_rejection,
)

PATH = "/mcp"
TOKEN_ENV = "AGENTHOST_MCP_TOKEN"
REQUEST_CANCELLED = -32800
MAX_BODY = MAX_LINE
MAX_HEADER_BYTES = 32 * 1024
# A harness opens a few connections (Claude Code and Codex keep one or two alive); more is someone else probing.
MAX_CONNECTIONS = 32
MAX_SESSIONS = 16
# A connection must deliver a whole request head this soon; idle keep-alive connections may wait longer.
HEAD_TIMEOUT = 10.0
READ_CHUNK = 64 * 1024
LINGER_SECONDS = 3.0
# 2026-07-28: the HTTP status of a JSON-RPC error, so an intermediary can route on it without reading the body.
ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
ROUTING_HEADERS = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")

BridgeSource = Callable[[], Awaitable[Bridge]]


class _HttpError(Exception):
    def __init__(
        self, status: int, message: str, *, headers: tuple[tuple[str, str], ...] = (), payload: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.payload = payload  # a JSON-RPC error to send instead of the plain one


class McpHttpEndpoint:
    """One turn's MCP endpoint on 127.0.0.1. `async with` it around the harness; `url` and `token` go to the
    harness's MCP config (the token through its environment only)."""

    def __init__(
        self,
        bridge: BridgeSource | None,
        *,
        tools: tuple[str, ...] = TOOL_NAMES,
        unavailable_reason: str = "",
        host: str = "127.0.0.1",
        unix_path: str | None = None,
    ) -> None:
        self._bridge = bridge
        # Served on this unix socket instead of loopback TCP: a harness in a network namespace of its own reaches
        # the endpoint through it (its in-sandbox forwarder listens at `port`, so `url` holds there; egress.py).
        self.unix_path = unix_path
        self._unix_server: asyncio.Server | None = None
        self._tools = tools
        self._unavailable_reason = unavailable_reason
        self._host = host
        self.token = secrets.token_urlsafe(32)
        self._expected = f"Bearer {self.token}".encode()
        self._server: asyncio.Server | None = None
        self._sessions: dict[str, McpServer] = {}
        # 2026-07-28 requests stand alone (no session); they share one protocol core for its lazily built host client.
        self._stateless = McpServer(bridge, tools=tools, unavailable_reason=unavailable_reason, era="modern")
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # Connections that have not yet shown this turn's token, oldest first: what a full endpoint drops to make
        # room, so that anyone on loopback holding idle sockets cannot lock the harness out (see _accept).
        self._unproven: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closed = False
        self.port = 0
        # Counters for tests and diagnostics: what was refused, and why.
        self.refused: dict[int, int] = {}

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}{PATH}"

    async def __aenter__(self) -> McpHttpEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, 0, limit=READ_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]
        self._hosts = {f"{self._host}:{self.port}".encode(), f"localhost:{self.port}".encode()}
        self._origins = {f"http://{h.decode()}".encode() for h in self._hosts}
        if self.unix_path is not None:
            # The port was only for a number no configured endpoint on loopback is using; nothing listens on it.
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            self._unix_server = await asyncio.start_unix_server(self._accept, self.unix_path, limit=READ_CHUNK)
            os.chmod(self.unix_path, 0o600)

    async def attach(self, bridge: BridgeSource | None, *, unavailable_reason: str = "") -> None:
        """Hands the endpoint, with its open sessions, to another run: a kept harness's next turn (`bridge`), or to
        none between turns (every tool call then answers `unavailable_reason`). Called by the runner only, under
        the conversation's lock; the harness keeps its token, which from now on reaches the new run's grant only."""
        self._bridge = bridge
        self._unavailable_reason = unavailable_reason
        for session in [*self._sessions.values(), self._stateless]:
            await session.rebind(bridge, unavailable_reason=unavailable_reason)

    async def close(self) -> None:
        """Idempotent. After it returns nothing answers on the port and no session can reach the host."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        if self._unix_server is not None:
            self._unix_server.close()
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path or "")
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        for session in [*self._sessions.values(), self._stateless]:
            await session.close()
        self._sessions.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # ---- connections ----

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            writer.transport.abort()
            return
        if len(self._connections) >= MAX_CONNECTIONS and not self._evict_unproven():
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(writer)
        self._unproven[task] = writer
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            self._writers.discard(writer)
            self._unproven.pop(task, None)
            writer.transport.abort()

    def _evict_unproven(self) -> bool:
        """Makes room by dropping the oldest connection that never presented the token (an idle socket from
        anyone on this machine); connections the harness has proven are never dropped for a newcomer."""
        if not self._unproven:
            return False
        task, writer = next(iter(self._unproven.items()))
        del self._unproven[task]
        self._connections.discard(task)
        self._writers.discard(writer)
        # Aborting is enough: its reads end at once (it never got past the token, so no host call is in flight),
        # and a cancelled connection task would be logged as an error by asyncio's stream callback.
        writer.transport.abort()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while True:
            try:
                head = await self._next_event(
                    conn, reader, timeout=None if conn.their_state is h11.IDLE else HEAD_TIMEOUT
                )
                if isinstance(head, h11.ConnectionClosed):
                    return
                if not isinstance(head, h11.Request):
                    raise h11.RemoteProtocolError("expected a request")
                status, headers, body = await self._handle(conn, reader, head)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status, headers, body = _plain(exc.error_status_hint, "bad HTTP request")
                    self._count(status)
                    with contextlib.suppress(h11.LocalProtocolError):
                        await self._send(conn, writer, status, headers, body, close=True)
                return
            # A request refused before its body was read leaves the stream out of sync: answer, then hang up.
            in_sync = _finished(conn)
            await self._send(conn, writer, status, headers, body, close=not in_sync)
            if not in_sync:
                await _linger(reader, writer)
                return
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    async def _next_event(self, conn: h11.Connection, reader: asyncio.StreamReader, *, timeout: float | None) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = (
                await asyncio.wait_for(reader.read(READ_CHUNK), timeout) if timeout else await reader.read(READ_CHUNK)
            )
            conn.receive_data(data)

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while True:
            event = await self._next_event(conn, reader, timeout=HEAD_TIMEOUT)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _HttpError(413, f"request body over {MAX_BODY} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:
                raise h11.RemoteProtocolError("unexpected end of the request")

    async def _send(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        close: bool,
    ) -> None:
        headers = [*headers, ("content-length", str(len(body))), ("cache-control", "no-store")]
        if close:
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=status, headers=headers))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
        await writer.drain()

    def _count(self, status: int) -> None:
        if status >= 400:
            self.refused[status] = self.refused.get(status, 0) + 1

    # ---- one request ----

    async def _handle(
        self, conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            return await self._route(conn, reader, request)
        except _HttpError as exc:
            self._count(exc.status)
            if exc.payload is not None:
                status, headers, body = _json(exc.status, exc.payload)
            else:
                status, headers, body = _plain(exc.status, exc.message)
            return status, [*headers, *exc.headers], body

    async def _route(
        self, conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = _headers(request)
        # Rebinding defence first: a browser tricked into calling us names a foreign Host or Origin.
        if headers.get(b"host") not in self._hosts:
            raise _HttpError(403, "forbidden Host")
        origin = headers.get(b"origin")
        if origin is not None and origin not in self._origins:
            raise _HttpError(403, "forbidden Origin")
        if not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
            raise _HttpError(401, "missing or wrong bearer token", headers=(("www-authenticate", "Bearer"),))
        task = asyncio.current_task()
        if task is not None:
            self._unproven.pop(task, None)  # the harness's connection: kept however many others arrive
        if request.target.split(b"?", 1)[0] != PATH.encode():
            raise _HttpError(404, "not found")
        raw_version = headers.get(b"mcp-protocol-version")
        version = None if raw_version is None else raw_version.decode(errors="replace")
        if version in MODERN_PROTOCOLS:
            return await self._stateless_request(conn, reader, request, headers)
        if version is not None and version not in SUPPORTED_PROTOCOLS:
            message = f"unsupported MCP-Protocol-Version; supported: {', '.join(ALL_PROTOCOLS)}"
            data = {"supported": list(ALL_PROTOCOLS), "requested": version[:64]}
            raise _HttpError(400, message, payload=_error(None, UNSUPPORTED_PROTOCOL_VERSION, message, data))
        method = request.method
        if method == b"POST":
            return await self._post(conn, reader, headers)
        if method == b"DELETE":
            session_id, session = self._session(headers)
            del self._sessions[session_id]
            await session.close()
            return 200, [], b""
        # GET would open a stream for server-initiated messages; this server sends none.
        raise _HttpError(405, "method not allowed", headers=(("allow", "POST, DELETE"),))

    def _session(self, headers: dict[bytes, bytes]) -> tuple[str, McpServer]:
        raw = headers.get(b"mcp-session-id")
        if raw is None:
            raise _HttpError(400, "missing Mcp-Session-Id (send initialize first)")
        session_id = raw.decode(errors="replace")
        session = self._sessions.get(session_id)
        if session is None:
            raise _HttpError(404, "unknown or ended session")
        return session_id, session

    async def _read_json(self, conn: h11.Connection, reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> Any:
        content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        if content_type != b"application/json":
            raise _HttpError(415, "Content-Type must be application/json")
        if not _accepts_json(headers.get(b"accept", b"")):
            raise _HttpError(406, "the client must accept application/json")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise _HttpError(413, f"request body over {MAX_BODY} bytes")
        body = await self._body(conn, reader)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise _HttpError(400, "parse error", payload=_error(None, PARSE_ERROR, "parse error")) from None

    async def _post(
        self, conn: h11.Connection, reader: asyncio.StreamReader, headers: dict[bytes, bytes]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        payload = await self._read_json(conn, reader, headers)
        extra: list[tuple[str, str]] = []
        if isinstance(payload, dict) and payload.get("method") == "initialize" and "id" in payload:
            if len(self._sessions) >= MAX_SESSIONS:
                raise _HttpError(503, "too many sessions on this endpoint")
            session_id = secrets.token_urlsafe(18)
            session = McpServer(self._bridge, tools=self._tools, unavailable_reason=self._unavailable_reason)
            self._sessions[session_id] = session
            extra.append(("mcp-session-id", session_id))
        else:
            _, session = self._session(headers)
        try:
            reply = await session.respond(payload)
        except RequestCancelled:
            msg_id = payload.get("id") if isinstance(payload, dict) else None
            reply = _error(msg_id, REQUEST_CANCELLED, "request cancelled")
        if reply is None:
            return 202, extra, b""
        status, out_headers, out = _json(200, reply)
        return status, [*out_headers, *extra], out

    async def _stateless_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request, headers: dict[bytes, bytes]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """MCP 2026-07-28: one POST is one self-contained request (no initialize, no Mcp-Session-Id, no GET stream);
        the client cancels by closing the connection."""
        if request.method != b"POST":
            raise _HttpError(405, "method not allowed", headers=(("allow", "POST"),))
        payload = await self._read_json(conn, reader, headers)
        if not isinstance(payload, dict) or ("id" in payload and "method" not in payload):
            # A batch, or a response: this server sends no requests, so nothing waits for one.
            message = "a 2026-07-28 POST carries one JSON-RPC request or notification"
            raise _HttpError(400, message, payload=_error(None, INVALID_REQUEST, message))
        if "id" not in payload:
            # The version defines no client notifications over HTTP (cancelling is hanging up): accepted, unused.
            return 202, [], b""
        routing = {name.decode(): headers[name].decode(errors="replace") for name in ROUTING_HEADERS if name in headers}
        rejection = envelope_rejection(payload, routing)
        if rejection is not None:
            reply = _error(payload["id"] if _id_key(payload["id"]) else None, *rejection)
        else:
            task = asyncio.ensure_future(self._stateless.respond(payload))
            try:
                reply = await _unless_hung_up(task, conn, reader)
            except RequestCancelled:
                reply = _error(payload["id"], REQUEST_CANCELLED, "request cancelled")
        if reply is None:
            return 202, [], b""
        error = reply.get("error") if isinstance(reply, dict) else None
        status = ERROR_STATUS.get(error.get("code"), 200) if isinstance(error, dict) else 200
        self._count(status)
        return _json(status, reply)


async def _unless_hung_up(task: asyncio.Task[Any], conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    """Awaits `task` while watching the connection: a client that closes it has cancelled the request, so the
    task (and the host call under it) is cancelled. Bytes that arrive meanwhile are the next pipelined request;
    h11 keeps them for the next cycle."""
    read = asyncio.ensure_future(reader.read(READ_CHUNK))
    try:
        done, _ = await asyncio.wait({task, read}, return_when=asyncio.FIRST_COMPLETED)
        if read in done:
            data = b"" if read.exception() is not None else read.result()
            if not data:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestCancelled):
                    await task
                raise ConnectionError("the client closed the connection during its request")
            conn.receive_data(data)
        return await task
    finally:
        task.cancel()  # a no-op once it is done; stops it if we are being shut down
        if not read.done():
            read.cancel()
            await asyncio.wait({read})  # the reader takes one waiter at a time: the next request's read is next


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-closes and discards what the client is still sending (bounded), so the refusal it was sent is read:
    closing a socket with unread input makes the kernel reset the connection, and the reset can destroy the
    answer before the client reads it."""
    with contextlib.suppress(OSError, RuntimeError):
        writer.write_eof()
    budget = 2 * MAX_BODY
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER_SECONDS):
            while budget > 0 and (chunk := await reader.read(READ_CHUNK)):
                budget -= len(chunk)


def _finished(conn: h11.Connection) -> bool:
    """Whether the client's request has been read to its end, consuming an already buffered end-of-message (a
    request without a body) but never waiting for more."""
    while conn.their_state is h11.SEND_BODY:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return False
        if not isinstance(event, h11.EndOfMessage):
            return False
    return conn.their_state is h11.DONE


def _headers(request: h11.Request) -> dict[bytes, bytes]:
    # h11 lower-cases names. A repeated header keeps its first value, except that two differing credentials or
    # hosts are simply unequal to what we expect.
    out: dict[bytes, bytes] = {}
    for name, value in request.headers:
        if name in out and name in (b"authorization", b"host", b"origin", b"mcp-session-id", *ROUTING_HEADERS):
            if out[name] != value:
                out[name] = b"\0conflicting"
            continue
        out.setdefault(name, value)
    return out


def _accepts_json(accept: bytes) -> bool:
    for part in accept.split(b","):
        kind = part.split(b";", 1)[0].strip().lower()
        if kind in (b"application/json", b"application/*", b"*/*"):
            return True
    return False


def _json(status: int, payload: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return status, [("content-type", "application/json")], body


def _plain(status: int, message: str) -> tuple[int, list[tuple[str, str]], bytes]:
    # JSON-RPC-shaped, as MCP clients try to read an error body as one.
    return _json(status, _error(None, INVALID_REQUEST, message))
