"""Delta throughput of a runner on the TypeScript SDK next to one on the Python SDK, through the same host, in one run.

    python benchmarks/bench_typescript_sdk.py [--deltas 50000] [--rounds 7] [--batch 64]

Processes, as in production: `agenthost serve`, the Python bench runner (benchmarks/bench-plugin) and the TypeScript
one (sdk/typescript/examples/bench-runner, built by `make ts-sdk`), both installed like any plugin and sandboxed,
and this script as the client. Each runner streams `--deltas` ~50-byte text deltas yielded as strings (each SDK's
fast path for streamed text), at most `--batch` per gRPC message (64 by default: equal batch sizes, so the ratio is
the SDKs' own cost), runner -> host (numbered, persisted) -> client. Rounds alternate the two runners, so the
machine's load hits both alike; the medians, ranges and the runner processes' CPU per delta are printed for both,
and the ratio TypeScript / Python (target: >= 0.8x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_host import STRINGS, host_deltas, tree_cpu  # noqa: E402

from agenthost.host.api.client import HostClient  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402

TS_RUNNER = ROOT / "sdk" / "typescript" / "examples" / "bench-runner"
SIDES = {"python": "agenthost-bench/bench", "typescript": "agenthost-bench-runner/bench"}


async def main(deltas: int, rounds: int, batch: int) -> None:
    if not (TS_RUNNER / "dist" / "main.js").exists():
        raise SystemExit(f"{TS_RUNNER}/dist/main.js is not built: run `make ts-sdk` first")
    work = Path(tempfile.mkdtemp(prefix="ahbench-ts-"))
    env = {**os.environ, "AGENTHOST_HOME": str(work / "home")}
    host = subprocess.Popen(  # noqa: ASYNC220 - started before anything is timed
        [sys.executable, "-m", "agenthost.host.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            if (work / "home" / "host.json").exists():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        async with HostClient.for_data_dir(work / "home", timeout=600) as c:
            pids: dict[str, int] = {}
            for side, source in (("python", ROOT / "benchmarks" / "bench-plugin"), ("typescript", TS_RUNNER)):
                info = await c.call("InstallPlugin", hpb.InstallPluginRequest(source=str(source), offline=True))
                pids[side] = info.pid
                await c.call("CreateBot", hpb.CreateBotRequest(name=side))
                await c.bind(side, SIDES[side], timeout_seconds=3600)
                await host_deltas(c, 2000, batch, command=STRINGS, bot=side)  # warm up
            print(
                f"== {deltas} text deltas (~50 B, yielded as strings), {batch} per message, runner -> host -> client;"
                f" {rounds} rounds, the two runners alternated =="
            )
            rates: dict[str, list[float]] = {side: [] for side in SIDES}
            cpu: dict[str, list[float]] = {side: [] for side in SIDES}
            for i in range(rounds):
                order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    before = tree_cpu(pids[side])
                    rate = await host_deltas(c, deltas, batch, command=STRINGS, bot=side, conversation_id=f"d{i}")
                    cpu[side].append((tree_cpu(pids[side]) - before) * 1e6 / deltas)
                    rates[side].append(rate)
                print(f"round {i + 1}: " + ", ".join(f"{side} {rates[side][-1] / 1000:.1f}k/s" for side in SIDES))
            for side in SIDES:
                r = rates[side]
                print(
                    f"{side:10}: median {statistics.median(r) / 1000:.1f}k deltas/s (range {min(r) / 1000:.1f}-"
                    f"{max(r) / 1000:.1f}); runner process CPU {statistics.median(cpu[side]):.2f} µs per delta"
                )
            ratio = statistics.median(rates["typescript"]) / statistics.median(rates["python"])
            per_round = [t / p for t, p in zip(rates["typescript"], rates["python"], strict=True)]
            print(
                f"typescript / python at {batch} per message: {ratio:.2f}x (per round {min(per_round):.2f}-"
                f"{max(per_round):.2f}x; target >= 0.8x: {'met' if ratio >= 0.8 else 'missed'})"
            )
    finally:
        host.terminate()
        try:
            host.wait(timeout=30)
        except subprocess.TimeoutExpired:
            host.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deltas", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.deltas, args.rounds, args.batch))
