"""The gateway's per-address caps (connections.Clients), attacked with real clients from loopback addresses of
their own (127.0.0.0/8 is all loopback): one address cannot take the gateway's connections from the others, a client
with no key cannot hold a connection with a cheap request every few seconds, and behind a proxy named with
`--trusted-proxy` the caps count the client the proxy forwards, never the proxy and never a header an untrusted
peer wrote."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from agenthost.host import limits
from agenthost.host.api.gateway import parse_address

from .helpers import World, until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
PER_ADDRESS = 8
UNAUTHENTICATED = 4
ATTACKER = "127.0.0.2"
PROXY = "127.0.0.3"


@pytest.fixture
def gateway_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "GATEWAY_MAX_CONNECTIONS", 20)
    monkeypatch.setattr(limits, "GATEWAY_MAX_CONNECTIONS_PER_ADDRESS", PER_ADDRESS)
    monkeypatch.setattr(limits, "GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS", UNAUTHENTICATED)


@pytest.fixture
def gateway_options() -> dict[str, Any]:
    return {"gateway_trusted_proxies": [f"{PROXY}/32"], "log_level": logging.INFO}


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(world: World, source: str) -> Conn:
    host, port = parse_address(world.host.gateway.address)
    return await asyncio.open_connection(host, port, local_addr=(source, 0))


async def _request(conn: Conn, head: str) -> tuple[int, dict[str, str], bytes]:
    """One request on a kept connection; the response's status, headers and body."""
    reader, writer = conn
    writer.write(head.encode())
    await writer.drain()
    status = int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
    headers = {}
    while (line := await asyncio.wait_for(reader.readline(), 30)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 30)
    return status, headers, body


def _get(path: str, key: str = "", forwarded_for: str = "") -> str:
    extra = (f"Authorization: Bearer {key}\r\n" if key else "") + (
        f"X-Forwarded-For: {forwarded_for}\r\n" if forwarded_for else ""
    )
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n"


def _held_post(world: World, forwarded_for: str) -> str:
    """A chat request whose body never comes: authenticated, it holds its connection until the body timeout."""
    body = json.dumps({"model": "testbot", "messages": [{"role": "user", "content": "hi"}]})
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {world.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nX-Forwarded-For: {forwarded_for}\r\n\r\n"
    )


async def _legit(world: World, source: str = "127.0.0.1", **headers: str) -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(base_url=world.base_url, timeout=30, transport=transport) as http:
        return await http.get("/models", headers={"Authorization": f"Bearer {world.key}", **headers})


async def test_one_address_cannot_take_the_gateways_connections(world: World) -> None:
    server = world.host.gateway._runner.server
    # An attacker with no key opens more connections than the whole gateway allows (20), from one address.
    flood = [await _connect(world, ATTACKER) for _ in range(30)]
    try:
        ends = [asyncio.ensure_future(r.read()) for r, _ in flood]
        await until(lambda: sum(e.done() for e in ends) >= 30 - UNAUTHENTICATED, "the excess was refused")
        refused = [e.result() for e in ends if e.done()]
        assert all(b.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in b for b in refused), refused[:1]
        assert b"GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS = 4" in refused[0], refused[0]
        assert b"send `Authorization: Bearer <key>`" in refused[0]
        assert len(server.connections) == UNAUTHENTICATED
        # Everyone else still gets in: the gateway's own cap (20) was never reached.
        r = await _legit(world)
        assert r.status_code == 200, r.text
    finally:
        for _, w in flood:
            w.close()


async def test_a_client_with_no_key_cannot_hold_a_connection_with_cheap_requests(world: World) -> None:
    """Before: a request every 14 s (under the 15 s request-head timeout) kept a connection for ever, 401 or not."""
    for path in ("/v1/models", "/console/"):  # refused for want of a key; a page anyone may load
        conn = await _connect(world, ATTACKER)
        status, headers, _ = await _request(conn, _get(path))
        assert status in (200, 401) and headers.get("connection") == "close", (path, status, headers)
        assert await asyncio.wait_for(conn[0].read(), 30) == b"", "the connection was closed after the response"
        conn[1].close()
    # A connection that showed a key stays open for its next request, and is no longer counted as unauthenticated:
    # one address may keep more of those than UNAUTHENTICATED, up to PER_ADDRESS.
    kept: list[Conn] = []
    try:
        for _ in range(PER_ADDRESS):
            kept.append(conn := await _connect(world, ATTACKER))
            status, headers, _ = await _request(conn, _get("/v1/models", world.key))
            assert status == 200 and headers.get("connection") != "close", headers
        status, _, _ = await _request(kept[0], _get("/v1/models", world.key))
        assert status == 200
        one_more = await _connect(world, ATTACKER)
        refused = await asyncio.wait_for(one_more[0].read(), 30)
        assert refused.startswith(b"HTTP/1.1 429") and b"GATEWAY_MAX_CONNECTIONS_PER_ADDRESS = 8" in refused, refused
        one_more[1].close()
    finally:
        for _, w in kept:
            w.close()


async def test_behind_a_trusted_proxy_the_caps_count_the_forwarded_client(world: World) -> None:
    server = world.host.gateway._runner.server
    held = []
    try:
        # One client behind the proxy holds PER_ADDRESS requests open (authenticated: a body that never comes).
        for _ in range(PER_ADDRESS):
            conn = await _connect(world, PROXY)
            conn[1].write(_held_post(world, "203.0.113.7").encode())
            held.append(conn)
        await until(lambda: len(server.connections) == PER_ADDRESS, "the proxy's connections were accepted")
        # Its next request, through the proxy, is refused and names its address; the proxy's connection is closed.
        conn = await _connect(world, PROXY)
        status, headers, body = await _request(conn, _get("/v1/models", world.key, "203.0.113.7"))
        error = json.loads(body)["error"]
        assert status == 429 and headers["retry-after"] == "1" and headers.get("connection") == "close", body
        assert error["code"] == "too_many_connections_from_address" and "(203.0.113.7)" in error["message"], error
        conn[1].close()
        # The client cannot escape by writing its own X-Forwarded-For: the proxy appends the address it saw, and
        # the nearest hop that is not a trusted proxy is the client.
        conn = await _connect(world, PROXY)
        status, _, body = await _request(conn, _get("/v1/models", world.key, "198.51.100.1, 203.0.113.7"))
        assert status == 429 and b"(203.0.113.7)" in body, body
        conn[1].close()
        # Another client behind the same proxy, over its own connections, is served: the proxy holds no cap.
        r = await _legit(world, PROXY, **{"X-Forwarded-For": "198.51.100.9"})
        assert r.status_code == 200, r.text
        # A peer that is not a trusted proxy is its own client, whatever it writes in X-Forwarded-For: its header
        # cannot name a client with room (nor frame one that has none).
        r = await _legit(world, ATTACKER, **{"X-Forwarded-For": "203.0.113.7"})
        assert r.status_code == 200, r.text
        # An unauthenticated request through the proxy closes the proxy's connection too.
        conn = await _connect(world, PROXY)
        status, headers, _ = await _request(conn, _get("/v1/models", "", "198.51.100.9"))
        assert status == 401 and headers.get("connection") == "close"
        conn[1].close()
    finally:
        for _, w in held:
            w.close()


async def test_an_ipv6_client_is_counted_by_its_slash_64(world: World) -> None:
    """A subscriber or a cloud host picks its addresses from a whole /64: counted one by one, each address had the
    caps afresh. Driven through the trusted proxy (loopback has one IPv6 address): PER_ADDRESS held requests from
    as many addresses of 2001:db8:1:2::/64, then the next, from yet another, is refused naming the /64."""
    server = world.host.gateway._runner.server
    held = []
    try:
        for i in range(PER_ADDRESS):
            conn = await _connect(world, PROXY)
            conn[1].write(_held_post(world, f"2001:db8:1:2::{i + 1:x}").encode())
            held.append(conn)
        await until(lambda: len(server.connections) == PER_ADDRESS, "the proxy's connections were accepted")
        conn = await _connect(world, PROXY)
        status, _, body = await _request(conn, _get("/v1/models", world.key, "2001:db8:1:2:ffff::9"))
        assert status == 429 and b"(2001:db8:1:2::/64)" in body, body
        conn[1].close()
        # Another /64 is another client.
        r = await _legit(world, PROXY, **{"X-Forwarded-For": "2001:db8:1:3::1"})
        assert r.status_code == 200, r.text
    finally:
        for _, w in held:
            w.close()


async def test_requests_that_do_not_parse_cannot_flood_the_hosts_log(world: World) -> None:
    """aiohttp logged each at ERROR with its traceback (~650 bytes): anyone reaching the port could roll host.log's
    history away with a few thousand malformed requests, no key needed."""
    log = world.host.data_dir / "logs" / "host.log"
    before = log.stat().st_size
    malformed = (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n folded\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n",
    )
    for i in range(300):
        reader, writer = await _connect(world, ATTACKER)
        writer.write(malformed[i % len(malformed)])
        answer = await asyncio.wait_for(reader.read(), 30)
        assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:80]
        writer.close()
    with open(log, encoding="utf-8") as f:
        f.seek(before)
        written = f.read()
    assert "Traceback" not in written and "Error handling request" not in written, written[:2000]
    refused = [line for line in written.splitlines() if "does not parse" in line]
    assert 1 <= len(refused) <= 25, len(refused)
    assert len(written) < 20_000, len(written)
    print(f"\n300 malformed requests: {len(written)} bytes of host log ({len(refused)} lines about them)")
