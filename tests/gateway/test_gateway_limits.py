"""Issue 25 items 11 and 12: what one key, or anyone who can open a TCP connection, can make the gateway hold.

Large bodies (past limits.GATEWAY_LARGE_BODY_BYTES, or limits.GATEWAY_LOOP_PARSE_VALUES JSON values) are parsed in a
parser process, and only so many are read and parsed at once, per key and host-wide: the next is refused 429 with
Retry-After. Connections are capped (limits.GATEWAY_MAX_CONNECTIONS: past it, 503 and closed), a connection must send
its request head within limits.GATEWAY_HEADER_SECONDS, and api.sock is capped too, so a flood of silent connections
leaves the operator's admin.sock working and the gateway serving again as soon as the flood ends."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from asyncio.subprocess import PIPE
from typing import Any

import httpx
import pytest

from agenthost.host import limits
from agenthost.host.api.gateway import parse_address
from agenthost.protos import host_pb2 as hpb

from .helpers import World, until

pytestmark = pytest.mark.timeout(120)


def _chat(text: str, padding: int = 0) -> bytes:
    """A chat request whose history carries `padding` bytes the host never uses (clients resend all of it)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "p" * padding}] if padding else []
    messages.append({"role": "user", "content": text})
    return json.dumps({"model": "testbot", "messages": messages}).encode()


async def _second_key(world: World) -> str:
    created = await world.harness.client.call(
        "CreateCredential", hpb.CreateCredentialRequest(name="app2", scope="send", bots=["testbot"])
    )
    return created.token


async def _open_body(world: World, key: str, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST that declares its whole body but sends only the first byte: it holds its large-body slot."""
    host, port = parse_address(world.host.gateway.address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body[:1]
    )
    await writer.drain()
    return reader, writer


async def _finish_body(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], body: bytes) -> int:
    reader, writer = conn
    writer.write(body[1:])
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 30)
    writer.close()
    return int(status.split()[1])


@pytest.mark.e2e
async def test_large_bodies_take_bounded_slots_per_key_and_host_wide(world: World, monkeypatch) -> None:
    slots = world.host.gateway.body_slots
    other = await _second_key(world)
    big = _chat("hello", padding=limits.GATEWAY_LARGE_BODY_BYTES + 1)
    async with httpx.AsyncClient(base_url=world.base_url, timeout=30) as http:

        async def post(key: str, content: Any) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            return await http.post("/chat/completions", content=content, headers=headers)

        held = [await _open_body(world, world.key, big) for _ in range(limits.GATEWAY_MAX_LARGE_BODIES_PER_KEY)]
        await until(lambda: slots.by_key.get("app") == 2, "the two held bodies took their key's slots")
        # The key's next large body is refused from its header, and so is one sent chunked (no Content-Length),
        # once it grows past the threshold.
        r = await post(world.key, big)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        error = r.json()["error"]
        assert error["code"] == "too_many_large_bodies" and "GATEWAY_MAX_LARGE_BODIES_PER_KEY = 2" in error["message"]

        async def chunked() -> Any:
            for i in range(0, len(big), 64 * 1024):
                yield big[i : i + 64 * 1024]

        r = await post(world.key, chunked())
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_large_bodies", r.text
        # A small body of the same key is not a large one: it goes on.
        assert (await post(world.key, _chat("small"))).status_code == 200
        # Another key has its own share.
        assert (await post(other, big)).status_code == 200
        # Host-wide: with every slot taken, every key's large body is refused, naming that cap.
        monkeypatch.setattr(limits, "GATEWAY_MAX_LARGE_BODIES", 2)
        r = await post(other, big)
        assert r.status_code == 429 and "GATEWAY_MAX_LARGE_BODIES = 2" in r.json()["error"]["message"], r.text
        print(f"\nslots held: {slots.total} (by key {slots.by_key}); refusals answered 429 with Retry-After: 1")
        # The held bodies complete, and give their slots back.
        assert [await _finish_body(c, big) for c in held] == [200, 200]
    await until(lambda: slots.total == 0 and not slots.by_key, "every slot was given back")


@pytest.mark.e2e
async def test_large_bodies_are_parsed_off_the_event_loop(world: World, monkeypatch) -> None:
    """The host process never json.loads a large body (a parser process does); and the loop's longest stall while
    a burst of 12 MiB bodies (of the shape that costs most to parse: many small messages) is parsed, off the loop
    versus on it as before, printed."""
    other = await _second_key(world)
    parsed_here: list[int] = []
    real_loads = json.loads

    def recording(data: Any, *args: Any, **kwargs: Any) -> Any:
        parsed_here.append(len(data))
        return real_loads(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", recording)
    many = [{"role": "user", "content": "hello there"}] * 250_000
    burst = json.dumps({"model": "testbot", "messages": many}).encode()
    assert 10 * 2**20 < len(burst) < 12 * 2**20

    async def run_burst(n: int) -> tuple[list[int], float, float]:
        stalls: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            # How late the loop wakes a 5 ms timer: the longest time it spent away doing something else.
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                t = loop.time()
                await asyncio.sleep(0.005)
                stalls.append(loop.time() - t - 0.005)

        prober = asyncio.ensure_future(probe())
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=world.base_url, timeout=60) as http:
            keys = [world.key, other]
            results = await asyncio.gather(
                *(
                    http.post(
                        "/chat/completions",
                        content=burst,
                        headers={"Authorization": f"Bearer {keys[i % 2]}", "Content-Type": "application/json"},
                    )
                    for i in range(n)
                )
            )
        took = time.monotonic() - started
        stop.set()
        await prober
        return [r.status_code for r in results], max(stalls), took

    await run_burst(1)  # the first large body starts the parser processes: not what is measured
    parsed_here.clear()
    statuses, off_loop_stall, off_took = await run_burst(4)  # two per key: within every bound
    assert statuses == [200] * 4
    assert all(size <= limits.GATEWAY_LARGE_BODY_BYTES for size in parsed_here), parsed_here
    # The same burst with the threshold out of reach: everything parses on the loop, as before the fix.
    monkeypatch.setattr(limits, "GATEWAY_LARGE_BODY_BYTES", 2**40)
    monkeypatch.setattr(limits, "GATEWAY_LOOP_PARSE_VALUES", 2**40)
    statuses, in_loop_stall, in_took = await run_burst(4)
    assert statuses == [200] * 4 and parsed_here.count(len(burst)) == 4
    print(
        f"\n4 x {len(burst) / 2**20:.1f} MiB bodies: longest loop stall {off_loop_stall * 1000:.0f} ms off-loop "
        f"({off_took:.2f}s for the burst), {in_loop_stall * 1000:.0f} ms in-loop ({in_took:.2f}s)"
    )


async def test_one_key_holds_at_most_its_share_of_open_requests(world: World, monkeypatch) -> None:
    """A key whose requests stay open (streams of long runs, bodies trickled in) used to be able to take every
    gateway connection from the other keys and the console. Past GATEWAY_MAX_OPEN_REQUESTS_PER_KEY it is refused
    429 with Retry-After, at once; another key and the admin are served meanwhile, and the key again once its
    requests end."""
    monkeypatch.setattr(limits, "GATEWAY_MAX_OPEN_REQUESTS_PER_KEY", 3)
    body = _chat("hi")
    held = [await _open_body(world, world.key, body) for _ in range(3)]
    gateway = world.host.gateway
    await until(lambda: gateway.open_by_key.get("app") == 3, "the three trickled requests hold the key's slots")
    other = await _second_key(world)
    async with httpx.AsyncClient(base_url=world.base_url, timeout=30) as http:
        r = await http.post("/chat/completions", content=body, headers={"Authorization": f"Bearer {world.key}"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["code"] == "too_many_open_requests"
        assert "GATEWAY_MAX_OPEN_REQUESTS_PER_KEY = 3" in r.json()["error"]["message"]
        for key in (other, world.admin):
            r = await http.post("/chat/completions", content=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        # The held requests end (one completes, two are dropped by their client): the slots come back.
        assert await _finish_body(held[0], body) == 200
        for _, writer in held[1:]:
            writer.close()
        await until(lambda: "app" not in gateway.open_by_key, "the key's slots were given back")
        r = await http.post("/chat/completions", content=body, headers={"Authorization": f"Bearer {world.key}"})
        assert r.status_code == 200, r.text
    assert len(world.runs()) == 4  # the refused request started no run


# Another process's httpx client (the host's loop is the test's: a flood sent from it would cost the loop too). It
# sends the body on `connections` connections for as long as its stdin is open, then prints the statuses it got.
FLOODER = """
import asyncio, collections, json, sys, httpx
url, key, path, connections = sys.argv[1:5]
body = open(path, "rb").read()
async def main():
    statuses = collections.Counter()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=int(connections))) as http:
        async def one():
            while not stop.is_set():
                statuses[(await http.post(url, content=body, headers=headers)).status_code] += 1
                print("sent", flush=True)
        await asyncio.gather(*(one() for _ in range(int(connections))))
    print(json.dumps(statuses), flush=True)
asyncio.run(main())
"""


PROBES = 11


@pytest.mark.slow
@pytest.mark.timeout(420)  # two floods of 16 connections each, the second parsing every body on the loop
async def test_a_key_flooding_dense_bodies_leaves_other_keys_served(world: World, tmp_path, monkeypatch) -> None:
    """A narrow key sends, from another process on 16 connections, bodies just under the large-body threshold that
    are a list of zeros (131,000 values: 10-30 ms of json.loads each) while another key asks for its models. The
    loop parses no body of more than GATEWAY_LOOP_PARSE_VALUES values itself (the dense ones go to the parser
    processes, behind the key's two large-body slots: 429), and the other key's latency, with the cap and without
    it (as before), is printed."""
    other = await _second_key(world)
    on_loop: list[int] = []  # values (commas) in each body the host's loop parsed
    real_loads = json.loads

    def recording(data: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, bytes):
            on_loop.append(data.count(b","))
        return real_loads(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", recording)
    head = b'{"model": "testbot", "messages": ['
    dense = head + b"0," * ((limits.GATEWAY_LARGE_BODY_BYTES - len(head)) // 2 - 2) + b"0]}"
    assert len(dense) <= limits.GATEWAY_LARGE_BODY_BYTES and dense.count(b",") > 100_000
    (tmp_path / "dense.json").write_bytes(dense)

    async def flood_and_probe() -> tuple[dict[str, int], list[float]]:
        argv = [world.base_url + "/chat/completions", world.key, str(tmp_path / "dense.json"), "16"]
        flood = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOODER, *argv, stdin=PIPE, stdout=PIPE)
        assert flood.stdin is not None and flood.stdout is not None
        latencies: list[float] = []
        try:
            for _ in range(32):  # the flood is under way
                assert await asyncio.wait_for(flood.stdout.readline(), 60) == b"sent\n"
            async with httpx.AsyncClient(base_url=world.base_url, timeout=60) as http:
                for _ in range(PROBES):
                    started = time.monotonic()
                    r = await http.get("/models", headers={"Authorization": f"Bearer {other}"})
                    latencies.append(time.monotonic() - started)
                    assert r.status_code == 200, r.text
            flood.stdin.close()
            lines = (await asyncio.wait_for(flood.stdout.read(), 60)).splitlines()
            assert await asyncio.wait_for(flood.wait(), 60) == 0
        finally:
            if flood.returncode is None:
                flood.kill()
                await flood.wait()
        return json.loads(lines[-1]), sorted(latencies)

    statuses, capped = await flood_and_probe()
    # Refused, never a server error: 400 once parsed off the loop (not a chat), 429 past the key's two slots.
    assert set(statuses) <= {"400", "429"} and "429" in statuses, statuses
    assert max(on_loop, default=0) <= limits.GATEWAY_LOOP_PARSE_VALUES, f"the loop parsed {max(on_loop)} values"
    # As before the cap: every dense body parsed on the loop.
    monkeypatch.setattr(limits, "GATEWAY_LOOP_PARSE_VALUES", 2**40)
    on_loop.clear()
    statuses, uncapped = await flood_and_probe()
    assert max(on_loop) > 100_000 and set(statuses) == {"400"}, statuses
    median = PROBES // 2
    print(
        f"\nanother key's GET /v1/models during a flood of 16 x {len(dense) // 1024} KiB lists of zeros: "
        f"median {capped[median] * 1000:.0f} ms, max {capped[-1] * 1000:.0f} ms with the cap; "
        f"median {uncapped[median] * 1000:.0f} ms, max {uncapped[-1] * 1000:.0f} ms parsed on the loop"
    )
    # Measured in the same run: 24 vs 1,614 ms at load 2. A figure, not an assertion: what is asserted is where the
    # bodies were parsed (above), which no load can change.
