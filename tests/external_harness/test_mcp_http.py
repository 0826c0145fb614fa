"""The runner-served MCP endpoint (streamable HTTP on loopback, one per harness process) against the MCP spec and
as a wall.

Three halves: the official `mcp` client SDK drives it over streamable HTTP for every protocol version, as
test_mcp_conformance.py does for the stdio bridge; raw HTTP then covers what that client never sends (batches,
cancellation races, oversize bodies, bad headers); and the attacks: no token, a wrong token, another turn's
token, a rebinding Host or Origin, and an endpoint used after its turn ended.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agenthost.runners.external_harness import mcp_bridge, mcp_http
from agenthost.runners.external_harness.mcp_http import McpHttpEndpoint

from .fake_run_api import HOLD_QUERY

pytestmark = [pytest.mark.timeout(120)]

VERSIONS = mcp_bridge.SUPPORTED_PROTOCOLS
APIS = "history.page,history.search,state.read,state.write"


def _creds(fake_host) -> dict[str, str]:
    return {
        "AGENTHOST_HOST_ADDRESS": fake_host.address,
        "AGENTHOST_RUN_ID": fake_host.data.run_id,
        "AGENTHOST_RUN_TOKEN": fake_host.data.tool_token,
        "AGENTHOST_DEADLINE_AT": "0",
        "AGENTHOST_EVENT_ID": "evt-1",
        "AGENTHOST_APIS": APIS,
    }


def _endpoint(fake_host) -> McpHttpEndpoint:
    creds = _creds(fake_host)
    return McpHttpEndpoint(lambda: mcp_bridge.bridge_from_env(creds), tools=mcp_bridge.tools_for(APIS))


@pytest.fixture
async def endpoint(fake_host) -> AsyncIterator[McpHttpEndpoint]:
    async with _endpoint(fake_host) as ep:
        yield ep


# ---- the official client SDK ----


@pytest.mark.parametrize("version", VERSIONS)
async def test_sdk_client_session(version: str, fake_host, endpoint, monkeypatch) -> None:
    mcp = pytest.importorskip("mcp", reason="the conformance test needs the dev extra (pip install mcp)")
    import mcp.client.session as client_session
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

    monkeypatch.setattr(client_session, "LATEST_HANDSHAKE_VERSION", version)
    fake_host.data.add_item("user", "MARKER-CONFORMANCE-HTTP")
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {endpoint.token}"})
    async with http, streamable_http_client(endpoint.url, http_client=http) as (read, write):
        async with mcp.ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.protocol_version == version
            caps = init.capabilities
            assert caps.tools is not None and caps.resources is None and caps.prompts is None
            assert init.server_info.name == "agenthost"
            await session.send_ping()

            tools = (await session.list_tools()).tools
            assert [t.name for t in tools] == ["history_page", "history_search", "state_get", "state_set"]
            page = await session.call_tool("history_page", {"limit": 5})
            assert not page.is_error and "MARKER-CONFORMANCE-HTTP" in page.content[0].text
            assert (page.structured_content is not None) == (version >= "2025-06-18")

            bad_args = await session.call_tool("state_get", {"scope": "galaxy", "key": "k"})
            assert bad_args.is_error and "scope" in bad_args.content[0].text

            with pytest.raises(MCPError) as unknown:
                await session.call_tool("rm_rf", {})
            assert unknown.value.error.code == -32602
            with pytest.raises(MCPError) as ungranted:
                await session.call_tool("event_get", {"event_id": "evt-1"})
            assert ungranted.value.error.code == -32602
            for undeclared in (session.list_resources, session.list_prompts):
                with pytest.raises(MCPError) as err:
                    await undeclared()
                assert err.value.error.code == -32601

            # The SDK gives up on a slow call and sends notifications/cancelled over a second POST; the host
            # call must be stopped and the session keep working.
            with pytest.raises(MCPError):
                await session.call_tool("history_search", {"query": HOLD_QUERY}, read_timeout_seconds=1.0)
            await asyncio.wait_for(fake_host.data.held_gone.wait(), 10)
            await session.send_ping()
            assert not (await session.call_tool("history_search", {"query": "conformance"})).is_error
    # Every host call carried the tool token alone: never the runner's run token or plugin secret.
    assert fake_host.data.callers and set(fake_host.data.callers) == {"tool"}


# ---- raw HTTP ----


class Raw:
    """One client of the endpoint, speaking plain HTTP."""

    def __init__(self, endpoint: McpHttpEndpoint, client: httpx.AsyncClient) -> None:
        self.endpoint = endpoint
        self.client = client
        self.session_id = ""
        self.version = ""

    def headers(self, **extra: str) -> dict[str, str]:
        out = {
            "Authorization": f"Bearer {self.endpoint.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        if self.session_id:
            out["Mcp-Session-Id"] = self.session_id
        if self.version:
            out["MCP-Protocol-Version"] = self.version
        out.update(extra)
        return out

    async def post(self, message: Any, **headers: str) -> httpx.Response:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        return await self.client.post(self.endpoint.url, content=body, headers=self.headers(**headers))

    async def initialize(self, version: str) -> None:
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        reply = await self.post({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": params})
        assert reply.status_code == 200 and reply.json()["result"]["protocolVersion"] == version
        self.session_id = reply.headers["mcp-session-id"]
        self.version = version
        note = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202 and note.content == b""


@pytest.fixture
async def raw(endpoint) -> AsyncIterator[Raw]:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        yield Raw(endpoint, client)


def _ping(msg_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "ping"}


async def test_sessions_and_transport_rules(raw: Raw) -> None:
    # Before initialize there is no session to use.
    assert (await raw.post(_ping(1))).status_code == 400
    await raw.initialize("2025-11-25")
    first = raw.session_id
    assert (await raw.post(_ping(2))).json() == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert (await raw.post(_ping(3), **{"Mcp-Session-Id": "not-a-session"})).status_code == 404
    assert (await raw.post(_ping(4), **{"MCP-Protocol-Version": "1999-01-01"})).status_code == 400
    assert (await raw.post(_ping(5), **{"Content-Type": "text/plain"})).status_code == 415
    assert (await raw.post(_ping(6), Accept="text/html")).status_code == 406
    parse = await raw.post(b'{"jsonrpc": "2.0", "id": 7, "method": ')
    assert parse.status_code == 400 and parse.json()["error"]["code"] == -32700
    # This server sends nothing unprompted, so there is no GET stream; other paths do not exist.
    get = await raw.client.get(raw.endpoint.url, headers=raw.headers())
    assert get.status_code == 405 and "POST" in get.headers["allow"]
    other = await raw.client.post(raw.endpoint.url.replace("/mcp", "/other"), content=b"{}", headers=raw.headers())
    assert other.status_code == 404
    # A second initialize opens a second, independent session; DELETE ends one and only one.
    await raw.initialize("2025-06-18")
    assert raw.session_id != first
    assert (await raw.client.delete(raw.endpoint.url, headers=raw.headers())).status_code == 200
    assert (await raw.post(_ping(8))).status_code == 404
    raw.session_id, raw.version = first, "2025-11-25"
    assert (await raw.post(_ping(9))).json()["id"] == 9


async def test_batches_only_in_2025_03_26(raw: Raw) -> None:
    await raw.initialize("2025-03-26")
    reply = await raw.post(
        [_ping(1), {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, {"jsonrpc": "2.0", "method": "x"}]
    )
    replies = reply.json()
    assert reply.status_code == 200 and sorted(r["id"] for r in replies) == [1, 2]
    only_notes = await raw.post([{"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}])
    assert only_notes.status_code == 202 and only_notes.content == b""
    await raw.initialize("2025-11-25")
    refused = (await raw.post([_ping(3), _ping(4)])).json()
    assert isinstance(refused, dict) and refused["id"] is None and refused["error"]["code"] == -32600


@pytest.mark.parametrize("version", ["2025-03-26", "2025-11-25"])
async def test_a_cancelled_call_is_stopped_at_the_host(version: str, raw: Raw, fake_host) -> None:
    await raw.initialize(version)
    held = {"name": "history_search", "arguments": {"query": HOLD_QUERY}}
    call = asyncio.ensure_future(raw.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": held}))
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "t"}}
    assert (await raw.post(cancel)).status_code == 202
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
    # HTTP owes the first POST an answer: an error, never the call's result.
    answered = (await asyncio.wait_for(call, 15)).json()
    assert answered["id"] == 7 and answered["error"]["code"] == mcp_http.REQUEST_CANCELLED and "result" not in answered
    fake_host.data.gate.set()
    assert (await raw.post(_ping(8))).json()["id"] == 8


async def test_oversize_body_is_refused_unread(raw: Raw) -> None:
    await raw.initialize("2025-06-18")
    big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"x" * mcp_http.MAX_BODY + b'"}}'
    reply = await raw.post(big)
    assert reply.status_code == 413
    assert (await raw.post(_ping(2))).json()["id"] == 2  # the endpoint still serves


# ---- the wall ----


async def _status(url: str, headers: dict[str, str], body: bytes = b'{"jsonrpc":"2.0","id":1,"method":"ping"}') -> int:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        return (await client.post(url, content=body, headers=headers)).status_code


async def test_only_this_turns_token_opens_this_endpoint(fake_host) -> None:
    base = {"Accept": "application/json", "Content-Type": "application/json"}
    init = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
    ).encode()
    async with _endpoint(fake_host) as mine, _endpoint(fake_host) as theirs:
        assert mine.token != theirs.token and mine.port != theirs.port
        attacks = {
            "no token": base,
            "bare scheme": base | {"Authorization": "Bearer"},
            "another turn's token": base | {"Authorization": f"Bearer {theirs.token}"},
            "token prefix": base | {"Authorization": f"Bearer {mine.token[:-1]}"},
            "token without Bearer": base | {"Authorization": mine.token},
            "the run's tool token": base | {"Authorization": f"Bearer {fake_host.data.tool_token}"},
        }
        for name, headers in attacks.items():
            assert await _status(mine.url, headers, init) == 401, name
        good = base | {"Authorization": f"Bearer {mine.token}"}
        # DNS rebinding: a browser page that resolves its own name to 127.0.0.1 sends its Host and Origin.
        assert await _status(mine.url, good | {"Host": "evil.example"}, init) == 403
        assert await _status(mine.url, good | {"Origin": "http://evil.example"}, init) == 403
        assert await _status(mine.url, good | {"Origin": f"http://127.0.0.1:{mine.port}"}, init) == 200
        assert await _status(mine.url, good, init) == 200
        assert mine.refused[401] == len(attacks) and mine.refused[403] == 2
    assert fake_host.data.calls == []  # nothing refused ever reached the host


async def test_the_endpoint_dies_with_its_turn(fake_host) -> None:
    ep = _endpoint(fake_host)
    await ep.start()
    raw = Raw(ep, httpx.AsyncClient(timeout=30, trust_env=False))
    try:
        await raw.initialize("2025-11-25")
        held = {"name": "history_search", "arguments": {"query": HOLD_QUERY}}
        call = asyncio.ensure_future(raw.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": held}))
        await asyncio.wait_for(fake_host.data.held.wait(), 15)
        await ep.close()
        # The in-flight host call is cancelled, its connection dropped, and the port no longer answers.
        await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
        with pytest.raises(httpx.HTTPError):
            await asyncio.wait_for(call, 15)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", ep.port), timeout=5).close()
        await ep.close()  # idempotent
    finally:
        await raw.client.aclose()
        await ep.close()


async def test_connection_flood_is_capped(endpoint) -> None:
    loop = asyncio.get_running_loop()
    socks = []
    try:
        for _ in range(mcp_http.MAX_CONNECTIONS + 8):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", endpoint.port))
            socks.append(sock)
        # The surplus connections are dropped at once, and the endpoint never holds more than its cap.
        for _ in range(100):
            if len(endpoint._connections) >= mcp_http.MAX_CONNECTIONS:
                break
            await asyncio.sleep(0.01)
        assert len(endpoint._connections) == mcp_http.MAX_CONNECTIONS
    finally:
        for sock in socks:
            sock.close()


async def test_idle_sockets_from_another_process_cannot_lock_the_harness_out(endpoint) -> None:
    """Anyone on loopback may fill the connection cap with sockets that never send a byte; the harness's own
    request still gets in (the oldest connection that never showed the token makes room), and once proven, its
    keep-alive connection is not the one dropped for later newcomers."""
    loop = asyncio.get_running_loop()
    socks = []

    async def flood(n: int) -> None:
        for _ in range(n):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", endpoint.port))
            socks.append(sock)
        for _ in range(200):  # until the endpoint has taken them all in
            if (
                len(endpoint._connections) >= mcp_http.MAX_CONNECTIONS
                and len(getattr(endpoint, "_unproven", ())) >= n - 1
            ):
                break
            await asyncio.sleep(0.01)

    try:
        await flood(mcp_http.MAX_CONNECTIONS)
        transport = httpx.AsyncHTTPTransport(retries=0)
        async with httpx.AsyncClient(timeout=10, trust_env=False, transport=transport) as client:
            raw = Raw(endpoint, client)
            message = _modern(1, "server/discover")
            first = await raw.post(message, **_modern_headers(message))
            assert first.status_code == 200, first.text
            await flood(mcp_http.MAX_CONNECTIONS)
            again = await raw.post(message, **_modern_headers(message))  # same connection (no retries allowed)
            assert again.status_code == 200, again.text
        assert len(endpoint._connections) <= mcp_http.MAX_CONNECTIONS
    finally:
        for sock in socks:
            sock.close()


# ---- MCP 2026-07-28: no handshake, one self-contained POST per request ----

MODERN = "2026-07-28"


def _modern(msg_id: Any, method: str, params: dict[str, Any] | None = None, version: str = MODERN) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {**(params or {}), "_meta": meta}}


def _modern_headers(message: dict[str, Any], **extra: str) -> dict[str, str]:
    out = {"MCP-Protocol-Version": MODERN, "Mcp-Method": message["method"]}
    if message["method"] == "tools/call":
        out["Mcp-Name"] = message["params"]["name"]
    return out | extra


async def test_sdk_client_speaks_2026_07_28(fake_host, endpoint) -> None:
    pytest.importorskip("mcp", reason="the conformance test needs the dev extra (pip install mcp)")
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

    fake_host.data.add_item("user", "MARKER-CONFORMANCE-2026")
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {endpoint.token}"})
    transport = streamable_http_client(endpoint.url, http_client=http)
    # mode="auto" probes server/discover and falls back to initialize unless the server answers it as 2026-07-28.
    async with http, Client(transport, mode="auto", cache=None) as client:
        assert client.protocol_version == MODERN
        assert client.server_info is not None and client.server_info.name == "agenthost"
        assert client.server_capabilities.tools is not None and client.server_capabilities.resources is None
        assert "agenthost conversation" in (client.instructions or "")

        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == ["history_page", "history_search", "state_get", "state_set"]
        page = await client.call_tool("history_page", {"limit": 5})
        assert not page.is_error and "MARKER-CONFORMANCE-2026" in page.content[0].text
        assert page.structured_content is not None
        bad_args = await client.call_tool("state_get", {"scope": "galaxy", "key": "k"})
        assert bad_args.is_error and "scope" in bad_args.content[0].text
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("rm_rf", {})
        assert unknown.value.error.code == -32602
        with pytest.raises(MCPError) as undeclared:
            await client.list_prompts()
        assert undeclared.value.error.code == -32601

        # The SDK gives up on a slow call by closing its response: that cancels the host call.
        with pytest.raises(MCPError):
            await client.call_tool("history_search", {"query": HOLD_QUERY}, read_timeout_seconds=1.0)
        await asyncio.wait_for(fake_host.data.held_gone.wait(), 10)
        assert not (await client.call_tool("history_search", {"query": "conformance"})).is_error
    assert endpoint._sessions == {}  # no initialize, no session: every request stood alone
    assert fake_host.data.callers and set(fake_host.data.callers) == {"tool"}


async def test_2026_07_28_discover_and_results(raw: Raw) -> None:
    discover = _modern("d", "server/discover")
    reply = await raw.post(discover, **_modern_headers(discover))
    assert reply.status_code == 200 and "mcp-session-id" not in reply.headers
    result = reply.json()["result"]
    assert result["supportedVersions"] == [MODERN]
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["resultType"] == "complete" and result["ttlMs"] == 0 and result["cacheScope"] == "private"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agenthost"

    listing = _modern(1, "tools/list")
    tools = (await raw.post(listing, **_modern_headers(listing))).json()["result"]
    assert tools["resultType"] == "complete" and tools["cacheScope"] == "private"
    assert [t["name"] for t in tools["tools"]] == ["history_page", "history_search", "state_get", "state_set"]
    call = _modern(2, "tools/call", {"name": "state_get", "arguments": {"scope": "run", "key": "k"}})
    called = (await raw.post(call, **_modern_headers(call))).json()
    assert called["id"] == 2 and called["result"]["resultType"] == "complete"
    assert called["result"]["isError"] is False and called["result"]["structuredContent"]["found"] is False


async def test_2026_07_28_errors(raw: Raw, fake_host) -> None:
    async def refused(message: Any, status: int, code: int, **headers: str) -> dict[str, Any]:
        reply = await raw.post(message, **headers)
        assert reply.status_code == status, (message, reply.text)
        body = reply.json()
        assert body["error"]["code"] == code, body
        return body

    discover = _modern(1, "server/discover")
    ok = _modern_headers(discover)
    # The envelope: version and client capabilities are required in every request's _meta.
    bare = {"jsonrpc": "2.0", "id": 1, "method": "server/discover"}
    await refused(bare, 400, -32602, **ok)
    no_caps = json.loads(json.dumps(discover))
    del no_caps["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    await refused(no_caps, 400, -32602, **ok)
    # The routing headers must say what the body says.
    await refused(discover, 400, -32020, **(ok | {"Mcp-Method": "tools/list"}))
    await refused(_modern(1, "server/discover", version="2025-11-25"), 400, -32020, **ok)
    call = _modern(2, "tools/call", {"name": "state_get", "arguments": {"scope": "run", "key": "k"}})
    await refused(call, 400, -32020, **_modern_headers(call, **{"Mcp-Name": "state_set"}))
    # A version nobody speaks: -32022 names every version this endpoint serves, so a client can pick one.
    future = await refused(
        _modern(1, "server/discover", version="2099-01-01"),
        400,
        -32022,
        **{"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "server/discover"},
    )
    assert future["error"]["data"]["supported"] == [*mcp_bridge.SUPPORTED_PROTOCOLS, MODERN]
    # What 2026-07-28 removed or never had.
    for method in ("ping", "initialize", "resources/list"):
        message = _modern(3, method)
        body = await refused(
            message,
            404 if method != "initialize" else 400,
            -32601 if method != "initialize" else -32022,
            **_modern_headers(message),
        )
        assert body["id"] == 3
    unknown = _modern(4, "tools/call", {"name": "rm_rf", "arguments": {}})
    await refused(unknown, 400, -32602, **_modern_headers(unknown))
    await refused([discover, discover], 400, -32600, **ok)  # no batches
    await refused(b"{not json", 400, -32700, **ok)
    # A notification is accepted and unused (this version defines none from client to server over HTTP).
    note = await raw.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, **ok)
    assert note.status_code == 202 and note.content == b""
    for verb in ("GET", "DELETE"):  # no standing stream, no session to end
        reply = await raw.client.request(verb, raw.endpoint.url, headers=raw.headers(**ok))
        assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    big = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"' + b"x" * mcp_http.MAX_BODY + b'"}}'
    assert (await raw.post(big, **ok)).status_code == 413
    assert (await raw.post(discover, **ok)).status_code == 200  # the endpoint still serves
    assert raw.endpoint._sessions == {} and fake_host.data.calls == []


async def test_2026_07_28_hanging_up_cancels_the_call(endpoint, fake_host) -> None:
    call = _modern(7, "tools/call", {"name": "history_search", "arguments": {"query": HOLD_QUERY}})
    body = json.dumps(call).encode()
    headers = {
        "Host": f"127.0.0.1:{endpoint.port}",
        "Authorization": f"Bearer {endpoint.token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    } | _modern_headers(call)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + body)
    await writer.drain()
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    writer.close()  # 2026-07-28 has no notifications/cancelled over HTTP: the client closes its response stream
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
    assert fake_host.data.held_cancelled
    fake_host.data.gate.set()
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        again = Raw(endpoint, client)
        listing = _modern(8, "tools/list")
        assert (await again.post(listing, **_modern_headers(listing))).json()["id"] == 8


async def test_2026_07_28_requests_meet_the_same_wall(fake_host) -> None:
    discover = _modern(1, "server/discover")
    body = json.dumps(discover).encode()
    base = {"Accept": "application/json", "Content-Type": "application/json"} | _modern_headers(discover)
    async with _endpoint(fake_host) as mine, _endpoint(fake_host) as theirs:
        good = base | {"Authorization": f"Bearer {mine.token}"}
        assert await _status(mine.url, base, body) == 401  # no token
        assert await _status(mine.url, base | {"Authorization": f"Bearer {theirs.token}"}, body) == 401
        assert await _status(mine.url, base | {"Authorization": f"Bearer {fake_host.data.tool_token}"}, body) == 401
        assert await _status(mine.url, good | {"Host": "evil.example"}, body) == 403
        assert await _status(mine.url, good | {"Origin": "http://evil.example"}, body) == 403
        call = _modern(2, "tools/call", {"name": "state_get", "arguments": {"scope": "run", "key": "k"}})
        call_headers = base | _modern_headers(call) | {"Authorization": f"Bearer {theirs.token}"}
        assert await _status(mine.url, call_headers, json.dumps(call).encode()) == 401
        assert await _status(mine.url, good, body) == 200
        assert mine.refused[401] == 4 and mine.refused[403] == 2
    assert fake_host.data.calls == []  # nothing refused ever reached the host


async def test_a_kept_endpoint_reaches_the_attached_run_only(raw: Raw, fake_host) -> None:
    """A kept Claude Code process keeps its endpoint and its MCP session across messages (warm.py); the runner
    attaches each turn's run and detaches it when the turn ends. What the session can reach follows."""
    from agenthost.runners.external_harness.warm import BETWEEN_TURNS

    await raw.initialize("2025-11-25")
    session = raw.session_id

    async def search(msg_id: int, query: str = "conformance") -> dict[str, Any]:
        params = {"name": "history_search", "arguments": {"query": query}}
        return (await raw.post({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": params})).json()

    assert not (await search(1))["result"]["isError"]
    # The turn ends with a call still in flight: it is stopped at the host and never answered with a result.
    held = asyncio.ensure_future(search(2, HOLD_QUERY))
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    await raw.endpoint.attach(None, unavailable_reason=BETWEEN_TURNS)
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
    answered = await asyncio.wait_for(held, 15)
    assert answered["error"]["code"] == mcp_http.REQUEST_CANCELLED and "result" not in answered
    fake_host.data.gate.set()
    # Between messages the same session reaches nothing.
    calls_before = len(fake_host.data.callers)
    between = (await search(3))["result"]
    assert between["isError"] and BETWEEN_TURNS in json.dumps(between)
    assert len(fake_host.data.callers) == calls_before
    # The next turn attaches its own run: a credential the host refuses is refused through the same session...
    stale = _creds(fake_host) | {"AGENTHOST_RUN_TOKEN": "not-this-run"}
    await raw.endpoint.attach(lambda: mcp_bridge.bridge_from_env(stale))
    assert (await search(4))["result"]["isError"]
    # ...and a valid one works, with no new session for the client to open.
    creds = _creds(fake_host)
    await raw.endpoint.attach(lambda: mcp_bridge.bridge_from_env(creds))
    assert not (await search(5))["result"]["isError"]
    assert raw.session_id == session
