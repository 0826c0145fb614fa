"""Host benchmark: run-scoped API calls and delta streaming through agenthost, next to raw grpc.aio, in one run.

    python benchmarks/bench_host.py [--calls 2000] [--deltas 50000]

Processes, as in production: `agenthost serve` (host), the bench runner plugin (installed like any plugin), this
script as the client, and a raw grpc.aio server serving the same protos from memory (the baseline). Prints
medians/p99 and ratios; targets from notes/performance-anchors.md: a call within raw + 0.15 ms at p50, deltas at
>= 0.8x raw and >= 80k/s coalesced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPEATS = 3
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agenthost.host.client import HostClient  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402
from agenthost.protos import runner_pb2, runner_pb2_grpc  # noqa: E402
from agenthost.runners.sdk.server import CHANNEL_OPTIONS  # noqa: E402


async def raw_deltas(address: str, n: int, batch: int) -> float:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
        stub = runner_pb2_grpc.RunnerStub(ch)
        req = runner_pb2.RunRequest(
            context=runner_pb2.AgentRunContext(input=runner_pb2.RunInput(text=f"deltas {n} {batch}"))
        )
        t0 = time.perf_counter()
        got = 0
        async for b in stub.Run(req):
            got += len(b.events)
        assert got == n
        return n / (time.perf_counter() - t0)


async def host_deltas(client: HostClient, n: int, batch: int) -> float:
    t0 = time.perf_counter()
    got = 0
    status = ""
    async for reply in client.stream(
        hpb.SendMessageRequest(bot="bench", text=f"deltas {n} {batch}", conversation_id="deltas")
    ):
        if reply.WhichOneof("kind") == "events":
            got += sum(1 for e in reply.events.events if e.WhichOneof("kind") == "text_delta")
        elif reply.WhichOneof("kind") == "run_finished":
            status = reply.run_finished.status
    elapsed = time.perf_counter() - t0
    assert got == n and status == "completed", (got, status)
    return n / elapsed


async def main(calls: int, deltas: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="ahbench-"))
    env = {**os.environ, "AGENTHOST_HOME": str(work / "home")}
    raw_address = f"unix:{work / 'raw.sock'}"
    raw = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "raw_server.py"), raw_address], stdout=subprocess.PIPE, env=env
    )
    host = subprocess.Popen(
        [sys.executable, "-m", "agenthost.host.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        raw.stdout.readline()
        for _ in range(300):
            if (work / "home" / "host.json").exists():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        async with HostClient.for_data_dir(work / "home", timeout=600) as c:
            await c.call(
                "InstallPlugin",
                hpb.InstallPluginRequest(source=str(ROOT / "benchmarks" / "bench-plugin"), offline=True),
            )
            await c.call("CreateBot", hpb.CreateBotRequest(name="bench"))
            await c.bind("bench", "agenthost-bench/bench", timeout_seconds=3600)
            for i in range(30):  # 60 transcript items, so a page of 50 is full
                await c.send("bench", f"seed message {i}")
            result = await c.send("bench", f"api {raw_address} {calls}")
            stats = json.loads(result.text)
            print(f"\n== run-scoped API call, runner process -> host, {calls} calls each, interleaved ==")
            print(f"{'call':22} {'raw p50':>9} {'host p50':>9} {'+p50':>8} {'raw p99':>9} {'host p99':>9}   (µs)")
            for name in ("state_get", "history_page50"):
                r, h = stats[f"{name}/raw"], stats[f"{name}/host"]
                print(
                    f"{name:22} {r['p50_us']:9.0f} {h['p50_us']:9.0f} {h['p50_us'] - r['p50_us']:+8.0f} {r['p99_us']:9.0f} {h['p99_us']:9.0f}"
                )
            print("target: host p50 within raw + 150 µs")

            print(f"\n== text deltas, {deltas} per stream: runner -> host (persist + project) -> client ==")
            print(
                f"{'mode (median of ' + str(REPEATS) + ' interleaved)':30} {'raw /s':>10} {'host /s':>10} {'host/raw':>9}"
            )
            for label, batch in (("one per message", 1), ("coalesced (<=64/message)", 64)):
                n = deltas if batch > 1 else max(2000, deltas // 10)
                raws, hosts = [], []
                for _ in range(REPEATS):  # this machine is shared and noisy: interleave, take medians
                    raws.append(await raw_deltas(raw_address, n, batch if batch == 1 else 16))
                    hosts.append(await host_deltas(c, n, batch))
                r, h = statistics.median(raws), statistics.median(hosts)
                print(f"{label:30} {r:10.0f} {h:10.0f} {h / r:9.2f}")
            print(
                "raw coalesced = 16 deltas per message (the anchor's figure); target: >= 0.8x raw, >= 80k/s coalesced"
            )
            runs = await c.call("ListRuns", hpb.ListRunsRequest(bot="bench", limit=1))
            events = await c.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=runs.runs[0].run_id, limit=5000))
            print(
                f"persisted: {len(events.events)}+ run events readable back for the last run (has_more={events.has_more})"
            )
    finally:
        host.terminate()
        raw.terminate()
        host.wait(timeout=30)
        raw.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=50000)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.deltas))
