"""HTTP gateway benchmark: a chat completion through the gateway next to the same send through the gRPC client
(HostClient.send) for the same bot, in one run.

    python benchmarks/bench_gateway.py [--requests 300]

Processes: a host (HostHarness: the real host with an in-process test runner on its own unix socket) with the
gateway on a loopback port, in a child process; this script as the client of both surfaces. Requests alternate
between the two paths, each in a fresh conversation, so drift (database growth, CPU frequency) hits both alike.

Figures:
* round trip, p50/p90: gRPC SendMessage (HostClient.send) vs gateway chat completion (non-streaming), and the
  difference (target: <= 1 ms added at p50). The HTTP client is aiohttp's (C parser, keep-alive), the leanest
  usual client; the official `openai` client's own cost is printed separately (its request building and pydantic
  parsing are not the gateway's).
* time to first token: the runner stamps its first delta with the system's monotonic clock (shared by the two
  processes); the client notes when that delta reaches it, through gRPC streaming and through the gateway's SSE
  (stream: true). The latency between the runner's first delta and the client's first token is what the host and
  the gateway add to a model's first token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agenthost.protos import common_pb2 as pb  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events  # noqa: E402

WARMUP = 30


class Stamp(Runner):
    """Replies in four deltas, the first carrying the monotonic time at which it was yielded, then usage."""

    manifest = RunnerManifest(name="stamp")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        yield events.text(f"{time.monotonic_ns()}|")
        for word in ("a short", " reply", " here"):
            yield events.text(word)
        yield events.usage(12, 4)
        yield events.completed()


async def serve(work: Path) -> None:
    """The child: a host with the gateway; prints where to reach it, serves until stdin closes."""
    from agenthost.runners.sdk.testing import HostHarness

    async with HostHarness(work, runners=[Stamp], bot="bench", host_options={"gateway_address": "127.0.0.1:0"}) as h:
        created = await h.client.call(
            "CreateCredential", hpb.CreateCredentialRequest(name="bench", scope="send", bots=["bench"])
        )
        info = {
            "admin": h.host.admin_address,
            "admin_token": h.host.admin_token,
            "gateway": f"http://{h.host.gateway.address}/v1",
            "key": created.token,
        }
        print(json.dumps(info), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f} ms"


async def measure(info: dict[str, str], n: int) -> None:
    import aiohttp
    from openai import AsyncOpenAI

    from agenthost.host.api.client import HostClient

    grpc_client = HostClient(info["admin"], token=info["admin_token"])
    headers = {"Authorization": f"Bearer {info['key']}"}
    session = aiohttp.ClientSession(info["gateway"] + "/", headers=headers)
    oai = AsyncOpenAI(base_url=info["gateway"], api_key=info["key"], max_retries=0)
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    counter = 0

    def conversation() -> str:
        nonlocal counter
        counter += 1
        return f"bench-{counter}"

    async def via_grpc() -> float:
        t0 = time.perf_counter()
        result = await grpc_client.send("bench", "hi", conversation_id=conversation())
        elapsed = time.perf_counter() - t0
        assert result.run.status == "completed", result.run
        return elapsed

    async def via_gateway() -> float:
        t0 = time.perf_counter()
        async with session.post(
            "chat/completions", json=body, headers={"X-Agenthost-Conversation": conversation()}
        ) as r:
            done = await r.json()
        elapsed = time.perf_counter() - t0
        assert r.status == 200 and done["usage"]["total_tokens"] == 16, done
        return elapsed

    async def via_openai() -> float:
        t0 = time.perf_counter()
        done = await oai.chat.completions.create(
            model="bench",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Agenthost-Conversation": conversation()},
        )
        elapsed = time.perf_counter() - t0
        assert done.usage.total_tokens == 16
        return elapsed

    async def first_grpc() -> tuple[float, float]:
        """(request -> first delta at the client, runner's first delta -> client) in seconds."""
        t0 = time.monotonic_ns()
        request = hpb.SendMessageRequest(bot="bench", text="hi", conversation_id=conversation(), source="api")
        first: tuple[float, float] | None = None
        async for reply in grpc_client.stream(request):
            if first is None and reply.WhichOneof("kind") == "events":
                for event in reply.events.events:
                    if event.WhichOneof("kind") == "text_delta":
                        now = time.monotonic_ns()
                        stamp = int(event.text_delta.text.split("|", 1)[0])
                        first = ((now - t0) / 1e9, (now - stamp) / 1e9)
                        break
        assert first is not None
        return first

    async def first_gateway() -> tuple[float, float]:
        t0 = time.monotonic_ns()
        first: tuple[float, float] | None = None
        async with session.post(
            "chat/completions", json={**body, "stream": True}, headers={"X-Agenthost-Conversation": conversation()}
        ) as r:
            async for line in r.content:
                if first is None and b'"content":"' in line and b"|" in line:
                    now = time.monotonic_ns()
                    chunk = json.loads(line.removeprefix(b"data: "))
                    stamp = int(chunk["choices"][0]["delta"]["content"].split("|", 1)[0])
                    first = ((now - t0) / 1e9, (now - stamp) / 1e9)
        assert first is not None
        return first

    try:
        for _ in range(WARMUP):
            await via_grpc()
            await via_gateway()
            await via_openai()
            await first_grpc()
            await first_gateway()
        rt: dict[str, list[float]] = {"grpc": [], "gateway": [], "openai": []}
        ttft: dict[str, list[tuple[float, float]]] = {"grpc": [], "gateway": []}
        for _ in range(n):
            rt["grpc"].append(await via_grpc())
            rt["gateway"].append(await via_gateway())
            rt["openai"].append(await via_openai())
            ttft["grpc"].append(await first_grpc())
            ttft["gateway"].append(await first_gateway())
    finally:
        await session.close()
        await oai.close()
        await grpc_client.close()

    print(f"\nchat completion round trip, {n} requests per path, alternating, one fresh conversation each")
    print(f"  {'path':44} {'p50':>10} {'p90':>10}")
    rows = [
        ("gRPC HostClient.send (baseline)", rt["grpc"]),
        ("gateway, aiohttp client", rt["gateway"]),
        ("gateway, official openai client", rt["openai"]),
    ]
    for name, values in rows:
        print(f"  {name:44} {ms(pct(values, 0.5))} {ms(pct(values, 0.9))}")
    added = statistics.median(rt["gateway"]) - statistics.median(rt["grpc"])
    ratio = statistics.median(rt["gateway"]) / statistics.median(rt["grpc"])
    verdict = "meets" if added <= 0.001 else "MISSES"
    print(f"  gateway adds {added * 1000:+.2f} ms at p50 over gRPC (x{ratio:.2f}); target <= 1 ms: {verdict}")
    openai_added = statistics.median(rt["openai"]) - statistics.median(rt["gateway"])
    print(f"  the openai client itself adds {openai_added * 1000:+.2f} ms at p50 over the aiohttp client")

    print("\ntime to first token (runner's first delta stamped with the shared monotonic clock)")
    print(f"  {'path':44} {'request->token p50':>19} {'runner delta->token p50':>24} {'p90':>10}")
    for name, key in (("gRPC SendMessage stream (baseline)", "grpc"), ("gateway SSE (stream: true)", "gateway")):
        total = [t for t, _ in ttft[key]]
        hop = [h for _, h in ttft[key]]
        print(f"  {name:44} {ms(pct(total, 0.5)):>19} {ms(pct(hop, 0.5)):>24} {ms(pct(hop, 0.9))}")
    hop_added = statistics.median([h for _, h in ttft["gateway"]]) - statistics.median([h for _, h in ttft["grpc"]])
    print(f"  gateway adds {hop_added * 1000:+.2f} ms at p50 between the runner's first delta and the client's token")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    work = Path(tempfile.mkdtemp(prefix="ahgw-"))
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            raise SystemExit("the host did not start")
        asyncio.run(measure(json.loads(line), args.requests))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
