"""What a run-API call's metadata costs on plain grpc.aio, in one run, rounds interleaved.

    python benchmarks/bench_call_path.py [--calls 3000]

One raw grpc.aio server (benchmarks/raw_server.py: StateGet of ~1 KiB from memory, no auth) in its own process, and
this script as the client, calling it three ways: with no metadata (raw grpc.aio, the baseline of bench_host.py);
with the run API's two credential headers passed as a tuple (what the runner SDK did on every call: grpc checks it
against the Sequence ABC and copies it into a new `grpc.aio.Metadata` per call); and with the same headers built
once as a `grpc.aio.Metadata` (what `agenthost.runners.sdk.api.RunAPI` does now). The host's own per-call work is
measured by bench_host.py; this isolates the transport's share of the gap.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agenthost.protos import common_pb2 as pb  # noqa: E402
from agenthost.protos import run_api_pb2 as api  # noqa: E402
from agenthost.protos import run_api_pb2_grpc  # noqa: E402
from agenthost.protos.wire import CHANNEL_OPTIONS  # noqa: E402

# The shapes of a run token and a plugin secret (secrets.token_urlsafe(32) behind their prefixes).
HEADERS = (("authorization", "Bearer rt_" + "a" * 43), ("x-agenthost-plugin", "ps_" + "b" * 43))


async def main(calls: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="ahcallpath-"))
    address = f"unix:{work / 'raw.sock'}"
    raw = subprocess.Popen(  # noqa: ASYNC220 - started before anything is timed
        [sys.executable, str(ROOT / "benchmarks" / "raw_server.py"), address], stdout=subprocess.PIPE
    )
    try:
        raw.stdout.readline()
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
            request = api.StateGetRequest(run_id="r" * 32, scope=pb.CONVERSATION, key="blob")
            built = grpc.aio.Metadata(*HEADERS)
            cases: dict[str, Callable[[], Awaitable[object]]] = {
                "no metadata (raw)": lambda: stub.StateGet(request, timeout=10),
                "headers as a tuple": lambda: stub.StateGet(request, metadata=HEADERS, timeout=10),
                "headers as Metadata, built once": lambda: stub.StateGet(request, metadata=built, timeout=10),
            }
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for call in cases.values():  # warm up
                for _ in range(100):
                    await call()
            for _ in range(3):  # three rounds, each interleaving the cases in blocks of 100
                for _ in range(calls // 100):
                    for name, call in cases.items():
                        for _ in range(100):
                            t0 = time.perf_counter()
                            await call()
                            samples[name].append(time.perf_counter() - t0)
        base = statistics.median(samples["no metadata (raw)"]) * 1e6
        print(f"== StateGet ~1 KiB, {3 * calls} calls each, interleaved; p50 over no metadata ==")
        for name, values in samples.items():
            p50 = statistics.median(values) * 1e6
            print(f"{name:32} p50 {p50:7.0f} µs  {p50 - base:+6.0f} µs")
    finally:
        raw.terminate()
        raw.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    asyncio.run(main(parser.parse_args().calls))
