"""The worker's second hop alone (issue 22): a forwarded unary call as a grpc.aio call of its own (what the worker
did before) against the same call as a frame on one `WorkerHub.Calls` stream (host/workers/mux.py: the real
Multiplexer and serve_calls), both over loopback TCP to a server in another process-less event loop, same handler
(a ~1 KiB reply, as StateGet's), rounds alternated.

    python benchmarks/bench_forward_hop.py [--calls 2000] [--rounds 5]

bench_workers.py measures the whole path (runner -> worker -> host) beside raw TLS; this isolates what the
multiplexing changes, which the whole path's noise on a loaded machine can hide.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agenthost.host.workers.mux import Multiplexer, serve_calls  # noqa: E402

REPLY = b"x" * 1024
METHOD = "/agenthost.v1.AgentRunAPIProxy/StateGet"


async def handler(request: bytes, context: Any) -> bytes:
    return REPLY


async def main(calls: int, rounds: int) -> None:
    handlers = {METHOD: grpc.unary_unary_rpc_method_handler(handler)}

    def admit() -> Callable[[], None]:
        return lambda: None

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for reply in serve_calls(requests, context, handlers=handlers, admit=admit):
            yield reply

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "agenthost.v1.WorkerHub", {"Calls": grpc.stream_stream_rpc_method_handler(stream)}
            ),
            grpc.method_handlers_generic_handler("agenthost.v1.AgentRunAPIProxy", {"StateGet": handlers[METHOD]}),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    per_call = channel.unary_unary(METHOD)
    mux = Multiplexer(channel)
    sides: dict[str, Callable[[], Any]] = {
        "a grpc.aio call per forwarded call": lambda: per_call(
            b"req", metadata=[("authorization", "Bearer t")], timeout=10
        ),
        "a frame on the Calls stream": lambda: mux.call(METHOD, "Bearer t", b"req", 10.0),
    }
    p50s: dict[str, list[float]] = {side: [] for side in sides}
    for call in sides.values():  # warm-up
        for _ in range(100):
            await call()
    for _ in range(rounds):
        for side, call in sides.items():
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                await call()
                samples.append(time.perf_counter() - t0)
            p50s[side].append(statistics.median(samples) * 1e6)
    print(f"== forwarded unary call, client + server in one process, {calls} calls x {rounds} alternated rounds ==")
    for side, values in p50s.items():
        print(f"{side:36} p50 median {statistics.median(values):6.0f} µs  range {min(values):.0f}-{max(values):.0f}")
    saved = [a - b for a, b in zip(*p50s.values(), strict=True)]
    print(f"saved per call, per round: {', '.join(f'{s:.0f}' for s in saved)} µs")
    await mux.close()
    await channel.close()
    await server.stop(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
