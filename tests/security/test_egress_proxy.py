"""The runner's egress proxy (agenthost.runners.sdk.egress) against a client that speaks to its socket directly,
as anything in a sandbox can: what a policy lets through, how it refuses, and that it checks the address it
connects to rather than the name (DNS rebinding). The sandbox side is proven in test_harness_sandbox.py and
test_local_agent_shell.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from agenthost.runners.sdk import egress


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    """An HTTP service on loopback that records each request head and answers `UPSTREAM`."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nUPSTREAM")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], heads
    server.close()


async def exchange(proxy: egress.EgressProxy, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


async def connect_then_get(proxy: egress.EgressProxy, target: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    if b" 200 " not in head.split(b"\r\n")[0]:
        writer.close()
        return head + await reader.read()
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        return head + await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


async def test_the_configured_endpoint_on_loopback_is_reachable_both_ways(upstream) -> None:
    port, heads = upstream
    proxy = await egress.proxy_for(egress.EgressPolicy(endpoints=(("127.0.0.1", port),)))
    tunnelled = await connect_then_get(proxy, f"127.0.0.1:{port}")
    assert tunnelled.startswith(b"HTTP/1.1 200 Connection established") and tunnelled.endswith(b"UPSTREAM")
    plain = await exchange(
        proxy,
        f"GET http://127.0.0.1:{port}/v1/models?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n\r\n".encode(),
    )
    assert plain.endswith(b"UPSTREAM")
    # Sent on in origin form, without what was meant for the proxy, and closed after the one request (the next
    # one comes on a new connection and is checked again).
    assert heads[-1].startswith(b"GET /v1/models?x=1 HTTP/1.1\r\n")
    assert b"Proxy-" not in heads[-1] and b"Connection: close" in heads[-1]


async def test_another_port_on_loopback_is_refused_with_a_message_naming_it(upstream) -> None:
    port, heads = upstream
    proxy = await egress.proxy_for(egress.EgressPolicy(endpoints=(("127.0.0.1", port + 1),)))
    for answer in (
        await connect_then_get(proxy, f"127.0.0.1:{port}"),
        await exchange(proxy, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode()),
        await connect_then_get(proxy, f"[::1]:{port}"),
        await connect_then_get(proxy, "169.254.169.254:80"),  # a cloud metadata endpoint
    ):
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
        assert b"loopback, private or link-local" in answer, answer
    assert heads == []


async def test_an_allowed_name_that_resolves_to_a_private_address_is_refused(upstream, monkeypatch) -> None:
    """DNS rebinding: `*.example.org` is allowed, but a name under it that resolves to loopback is refused by its
    address, and a name that resolves to a public address is connected to at that address, not looked up again."""
    port, heads = upstream
    answers = {"rebound.example.org": ["127.0.0.1"], "fine.example.org": ["93.184.215.14"]}
    connected: list[tuple[str, int]] = []

    async def lookup(host: str, p: int) -> list[str]:
        return answers[host]

    async def open_upstream(address: str, p: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        connected.append((address, p))
        return await asyncio.open_connection("127.0.0.1", port)  # hermetic: stands in for the public address

    monkeypatch.setattr(egress, "lookup", lookup)
    monkeypatch.setattr(egress, "open_upstream", open_upstream)
    proxy = await egress.proxy_for(egress.EgressPolicy(domains=("*.example.org",)))
    refused = await connect_then_get(proxy, "rebound.example.org:443")
    assert refused.startswith(b"HTTP/1.1 403") and b"resolves to 127.0.0.1" in refused, refused
    assert b"rebound.example.org:443" in refused
    allowed = await connect_then_get(proxy, "fine.example.org:443")
    assert allowed.endswith(b"UPSTREAM") and connected == [("93.184.215.14", 443)]


# IPv6 forms that carry a loopback or private IPv4 address a translator delivers to (NAT64 on an IPv6-only
# network, 6to4, IPv4-compatible, SIIT); Python 3.11's is_global calls each of them global.
TRANSLATED = [
    "64:ff9b::7f00:1",
    "64:ff9b::a00:1",
    "64:ff9b:1::a9fe:a9fe",
    "::7f00:1",
    "2002:a00:1::1",
    "::ffff:0:a00:1",
]


@pytest.mark.parametrize("address", TRANSLATED)
async def test_an_ipv6_address_carrying_a_private_ipv4_one_is_refused(address: str, monkeypatch) -> None:
    """By literal and by a name resolving to it, with any public host allowed: never connected to."""
    connected: list[str] = []

    async def lookup(host: str, p: int) -> list[str]:
        return [address]

    async def open_upstream(a: str, p: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        connected.append(a)
        raise OSError("the test connects nowhere")

    monkeypatch.setattr(egress, "lookup", lookup)
    monkeypatch.setattr(egress, "open_upstream", open_upstream)
    proxy = await egress.proxy_for(egress.EgressPolicy(any_public=True))
    for target in (f"[{address}]:443", "translated.example.org:443"):
        answer = await connect_then_get(proxy, target)
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"loopback, private" in answer, (target, answer)
    assert connected == []
    assert egress._public("64:ff9b::5db8:d70e") and egress._public("2606:4700::1111")  # public ones still are


async def test_the_allow_list_by_name_and_port() -> None:
    policy = egress.EgressPolicy(
        endpoints=(("api.anthropic.com", 443),), domains=("*.example.org", "pypi.org", "git.example.com:2222")
    )
    assert policy.refusal("api.anthropic.com", 443) is None
    assert policy.refusal("API.Anthropic.com.", 443) is None
    assert policy.refusal("a.b.example.org", 443) is None and policy.refusal("pypi.org", 80) is None
    assert policy.refusal("git.example.com", 2222) is None
    for host, port in [("example.org", 443), ("evilexample.org", 443), ("pypi.org", 8080), ("git.example.com", 443)]:
        why = policy.refusal(host, port)
        assert why is not None and "network.allowed_domains" in why, (host, port)
    assert policy.refusal("api.anthropic.com", 80) is not None
    anything = egress.EgressPolicy(any_public=True, setting="shell.allowed_domains")
    assert anything.refusal("example.com", 443) is None and anything.refusal("example.com", 22) is not None
    assert "loopback" in (anything.refusal("10.1.2.3", 443) or "")


BAD_ENTRIES = ["", "*", "*.", "http://x.org", "a..b", "x.org:0", "x.org:http", "*.*.org", "::1", "a b.org"]


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_bad_allow_list_entries_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        egress.check_domain_pattern(bad)


async def test_neither_a_malformed_nor_an_origin_form_request_gets_through() -> None:
    proxy = await egress.proxy_for(egress.EgressPolicy(any_public=True))
    assert (await exchange(proxy, b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")).startswith(b"HTTP/1.1 400")
    assert (await exchange(proxy, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
    assert (await exchange(proxy, b"CONNECT example.com HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400")


async def test_a_flood_of_connections_stops_at_the_cap(monkeypatch) -> None:
    monkeypatch.setattr(egress, "MAX_CONNECTIONS", 3)
    proxy = await egress.proxy_for(egress.EgressPolicy(any_public=True))
    held = [await asyncio.open_unix_connection(proxy.path) for _ in range(3)]  # each waits for its request line
    try:
        await until(lambda: len(proxy._tasks) == 3)  # the proxy takes them asynchronously
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        assert (await asyncio.wait_for(reader.read(), 20)).startswith(b"HTTP/1.1 503")
        writer.close()
    finally:
        for _, held_writer in held:
            held_writer.close()
    await until(lambda: not proxy._tasks)


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)
