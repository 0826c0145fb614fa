"""Issue 25 item 12: silent connections, with no key, used to run the host out of descriptors (~4,000 to the
gateway, ~1,100 to api.sock at a 1,024 limit), taking the gateway and the admin surface down. Now the gateway and
api.sock each hold at most their cap (a quarter of the descriptor limit at most; lowered here so a few dozen
connections show it), the excess is answered at once (the gateway: 503 with Retry-After) and closed, a connection
that sends no whole request head within GATEWAY_HEADER_SECONDS is closed, and admin.sock has no cap: the operator's
CLI works through the flood."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from agenthost.host import limits
from agenthost.host.api.gateway import parse_address
from tests.cli_process import acli

from .helpers import World, until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
CAP = 20
FLOOD = 60


@pytest.fixture
def gateway_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "GATEWAY_MAX_CONNECTIONS", CAP)
    monkeypatch.setattr(limits, "API_MAX_CONNECTIONS", CAP)
    monkeypatch.setattr(limits, "GATEWAY_HEADER_SECONDS", 5.0)


async def test_a_flood_of_silent_connections_leaves_the_admin_surface_working(world: World) -> None:
    server = world.host.gateway._runner.server
    host, port = parse_address(world.host.gateway.address)
    # A slow-loris client: its request head never ends.
    loris_reader, loris_writer = await asyncio.open_connection(host, port)
    loris_writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    conns = [await asyncio.open_connection(host, port) for _ in range(FLOOD)]
    # Unix connections to api.sock, as a plugin could open them: grpc-core closes those past the cap.
    api_path = world.host.api_address.removeprefix("unix:")
    api_socks = []
    for _ in range(FLOOD):
        s = socket.socket(socket.AF_UNIX)
        s.connect(api_path)
        s.setblocking(False)
        api_socks.append(s)
    try:
        # Each connection read to its end: what the gateway sent before it closed it.
        ends = [asyncio.ensure_future(r.read()) for r, _ in conns]
        loris_end = asyncio.ensure_future(loris_reader.read())
        await until(lambda: sum(e.done() for e in ends) >= FLOOD - CAP, "the excess was refused")
        assert len(server.connections) <= CAP
        refused = [e.result() for e in ends if e.done() and e.result()]
        # Connections that outlived the request-head timeout may have made room for a few later ones.
        assert len(refused) >= FLOOD - 2 * CAP, len(refused)
        assert all(b.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in b for b in refused), refused[:1]
        assert b"GATEWAY_MAX_CONNECTIONS" in refused[0]

        def api_closed() -> int:
            n = 0
            for s in api_socks:
                try:
                    if s.recv(65536) == b"":
                        n += 1
                except BlockingIOError:
                    pass
                except OSError:
                    n += 1
            return n

        api_refused = 0

        def api_flood_answered() -> bool:
            nonlocal api_refused
            api_refused += api_closed()
            return api_refused >= FLOOD - CAP

        await until(api_flood_answered, "api.sock closed the connections past its cap")
        # (a) The operator's CLI, through admin.sock, works with both listeners full.
        code, out, err = await acli(world.host.data_dir, "status")
        assert code == 0, err
        # A client that comes now is told the gateway is full, and when to come back.
        async with httpx.AsyncClient(base_url=world.base_url, timeout=20) as http:
            r = await http.get("/models", headers={"Authorization": f"Bearer {world.key}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "too_many_connections"
        # (b) The silent connections, and the slow loris, are closed after the request-head timeout.
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*ends, loris_end), 30)
        assert loris_end.result() == b"" and all(e.result() == b"" for e in ends if e.result()[:12] != b"HTTP/1.1 503")
        print(
            f"\n{FLOOD} silent gateway connections: {len(refused)} refused at once (503), the others closed"
            f" by {time.monotonic() - started:.1f}s later (GATEWAY_HEADER_SECONDS = 5); api.sock closed"
            f" {api_refused} of {FLOOD} past its cap; `agenthost status` answered meanwhile"
        )
    finally:
        for _, w in conns:
            w.close()
        loris_writer.close()
        for s in api_socks:
            s.close()
    # (c) After the flood, a legit request is served, and its run (over api.sock) completes.
    await until(lambda: len(server.connections) == 0, "the gateway let go of the flood")
    async with httpx.AsyncClient(base_url=world.base_url, timeout=30) as http:
        r = await http.post(
            "/chat/completions",
            json={"model": "testbot", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {world.key}"},
        )
    assert r.status_code == 200, r.text


def test_listener_caps_take_at_most_a_quarter_of_the_descriptor_limit() -> None:
    assert limits.listener_caps(1024) == (256, 256)
    assert limits.listener_caps(1 << 20) == (limits.GATEWAY_MAX_CONNECTIONS, limits.API_MAX_CONNECTIONS)
