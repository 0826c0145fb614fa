"""What the walls cost: the same paths with every plugin process sandboxed and with the sandbox off, in one run.

    python benchmarks/bench_walls.py [--starts 8] [--calls 300] [--rounds 5]

Two real hosts in this process, one sandboxed (bwrap around the plugin process) and one with the sandbox forced
off (`--unsafe-no-sandbox` on a machine where it could run), each supervising the fault-switch test plugin
installed like any plugin. Measured alternately, so machine load hits both alike:
  plugin start   stop → start → ready (handshake, health, Describe) of the plugin process
  run-API call   one StateSet from inside the runner through api.sock, over `--calls` calls per run
  trivial run    send → completed for a one-line reply (the host's whole path, sandbox included)
The shell tool call and the harness turn have their own scripts (bench_sandbox_shell.py,
bench_harness_sandbox.py), since their inner sandboxes are the runner's, not the host's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAULTY = str(ROOT / "tests" / "fixtures" / "faulty-plugin")
PLUGIN = "agenthost-faulty"

from agenthost.host.api.client import HostClient  # noqa: E402
from agenthost.host.server import Host  # noqa: E402
from agenthost.plugins import sandbox  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402


class Side:
    def __init__(self, name: str, data_dir: Path, *, sandboxed: bool) -> None:
        self.name = name
        self.sandboxed = sandboxed
        self.host = Host(data_dir, builtin_plugins=False, unsafe_no_sandbox=not sandboxed)
        self.starts: list[float] = []
        self.calls: list[float] = []
        self.runs: list[float] = []

    async def start(self) -> None:
        original = sandbox.probe
        if not self.sandboxed:
            sandbox.probe = lambda: "switched off for the baseline"  # type: ignore[assignment]
        try:
            await self.host.start()
        finally:
            sandbox.probe = original  # type: ignore[assignment]
        self.client = HostClient(self.host.admin_address, token=self.host.admin_token, timeout=300)
        await self.client.call("InstallPlugin", hpb.InstallPluginRequest(source=FAULTY, offline=True), timeout=600)
        await self.client.call("CreateBot", hpb.CreateBotRequest(name="b"))
        await self.client.bind("b", f"{PLUGIN}/faulty", timeout_seconds=600)
        assert self.host.sandbox_status.startswith("on" if self.sandboxed else "disabled"), self.host.sandbox_status

    async def measure_start(self) -> None:
        await self.host.supervisor.stop(PLUGIN)
        t0 = time.perf_counter()
        await self.host.supervisor.start(PLUGIN)
        self.starts.append(time.perf_counter() - t0)

    async def measure_calls(self, n: int) -> None:
        t0 = time.perf_counter()
        empty = await self.client.send("b", "api 0", conversation_id="calls")
        base = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = await self.client.send("b", f"api {n}", conversation_id="calls")
        elapsed = time.perf_counter() - t0
        assert empty.run.status == result.run.status == "completed", result.run.error_message
        self.calls.append((elapsed - base) / n)
        self.runs.append(base)

    async def stop(self) -> None:
        await self.client.close()
        await self.host.stop()


def row(what: str, off: list[float], on: list[float], unit: float, label: str) -> str:
    a, b = statistics.median(off) * unit, statistics.median(on) * unit
    return f"| {what} | {a:.2f} {label} | {b:.2f} {label} | {b - a:+.2f} {label} ({b / a:.2f}×) |"


async def main(starts: int, calls: int, rounds: int) -> None:
    reason = sandbox.probe()
    if reason:
        raise SystemExit(f"no sandbox here: {reason}")
    with tempfile.TemporaryDirectory(prefix="ahwalls-") as work:
        sides = [
            Side("off", Path(work) / "off", sandboxed=False),
            Side("on", Path(work) / "on", sandboxed=True),
        ]
        for side in sides:
            await side.start()
        try:
            for _ in range(starts):
                for side in sides:
                    await side.measure_start()
            for _ in range(rounds):
                for side in sides:
                    await side.measure_calls(calls)
        finally:
            for side in sides:
                await side.stop()
    off, on = sides
    print(f"sandbox: bwrap at {sandbox.find_bwrap()}; {starts} starts, {rounds} rounds of {calls} calls, medians")
    print("| path | sandbox off | sandbox on | cost of the walls |")
    print("|---|---:|---:|---|")
    print(row("plugin start (to ready)", off.starts, on.starts, 1000, "ms"))
    print(row("run-API call (StateSet, from the runner)", off.calls, on.calls, 1e6, "µs"))
    print(row("trivial run, send → completed", off.runs, on.runs, 1000, "ms"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.starts, args.calls, args.rounds))
    sys.exit(0)
