"""CPU per streamed text delta on each side of the delta path, this tree against a base revision, in one process.

    python benchmarks/bench_delta_path.py [--base 8d9b781] [--rounds 25]

The end-to-end figure (`bench_host.py --sustained`) is what the target is set in, but on a shared 2-core machine
its spread hides a change of a few tenths of a µs. This isolates the two pieces of code a delta goes through:

- runner: the SDK's run loop (`runners/sdk/server.py` `_drive`) over a runner yielding 100 k deltas of ~50 bytes,
  as RunEvent objects (`events.text`, as the raw server builds them) and as `str`, into a channel that only keeps
  them (no gRPC): the part of the runner's CPU that the SDK decides; and the same into the SDK's own channel,
  drained and cut into batches as the Run handler does (all but the gRPC write);
- host: numbering one batch of 256 such deltas (`host/store/text_deltas.py` `number`), ASCII and non-ASCII text.

The base revision's copies of those two files are loaded from git as separate modules, and the two sides run in
alternating rounds; medians and minimums (the least disturbed round) are printed for both.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

from agenthost.host.store import text_deltas
from agenthost.runners.sdk import events
from agenthost.runners.sdk import server as sdk_server

ROOT = Path(__file__).resolve().parent.parent
DELTA = "x" * 48 + " \n"
DELTA_UTF8 = "é" * 24 + " \n"
N = 100_000


def base_module(rev: str, path: str, scratch: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    file = scratch / path.replace("/", "_")
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(f"base_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Keep:
    """The SDK's event channel without the RPC: keeps a batch's worth, then lets it go."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def push(self, item: Any) -> bool:
        self.items.append(item)
        if len(self.items) >= 256:
            self.items = []
        return False

    async def full(self) -> None:
        pass

    async def put(self, item: Any) -> None:
        self.push(item)


class _Streamer:
    class manifest:  # noqa: N801 — stands in for a RunnerManifest: _drive reads only its name
        name = "bench"

    def __init__(self, objects: bool) -> None:
        self.objects = objects

    async def run(self, run: Any) -> Any:
        if self.objects:
            for _ in range(N):
                yield events.text(DELTA)
        else:
            for _ in range(N):
                yield DELTA


async def runner_us(module: ModuleType, objects: bool, channel: str = "keep") -> float:
    """CPU µs per delta of `_drive` into the stand-in channel ("keep"), or ("sdk") into the module's own channel,
    drained and cut into batches (`_batches`) as the Run handler does, all but the gRPC write."""
    t0 = time.process_time()
    if channel == "keep":
        await module._drive(_Streamer(objects), None, _Keep())
    else:
        sdk_channel = module._EventChannel()

        async def drain() -> None:
            while True:
                items = await sdk_channel.take()
                done = items[-1] is module._END
                if done:
                    items.pop()
                for _ in module._batches(items):
                    pass
                if done:
                    return

        drained = asyncio.create_task(drain())
        await module._drive(_Streamer(objects), None, sdk_channel)
        await drained
    return (time.process_time() - t0) / N * 1e6


def host_us(module: ModuleType, data: bytes) -> float:
    return timeit.timeit(lambda: module.number(data, 1000, 1.5), number=50) / 50 / 256 * 1e6


def main(base: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        sides = {
            "base": (
                base_module(base, "runners/sdk/server.py", Path(scratch)),
                base_module(base, "host/store/text_deltas.py", Path(scratch)),
            ),
            "this tree": (sdk_server, text_deltas),
        }
        batches = {text: b"".join(sdk_server._text_entry(text) for _ in range(256)) for text in (DELTA, DELTA_UTF8)}
        cases = [
            "runner, RunEvent objects",
            "runner, str",
            "runner + channel, RunEvent",
            "runner + channel, str",
            "host, ASCII batch",
            "host, non-ASCII batch",
        ]
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for side, (sdk, host) in sides.items():
                figures = [
                    asyncio.run(runner_us(sdk, True)),
                    asyncio.run(runner_us(sdk, False)),
                    asyncio.run(runner_us(sdk, True, "sdk")),
                    asyncio.run(runner_us(sdk, False, "sdk")),
                    host_us(host, batches[DELTA]),
                    host_us(host, batches[DELTA_UTF8]),
                ]
                for case, value in zip(cases, figures, strict=True):
                    samples.setdefault((case, side), []).append(value)
    print(f"CPU µs per delta, {rounds} alternating rounds, base {base} against this tree ({sys.version.split()[0]})")
    print(f"{'':28} {'base median':>12} {'min':>6} {'this median':>12} {'min':>6} {'ratio':>6}")
    for case in cases:
        b, n = samples[(case, "base")], samples[(case, "this tree")]
        print(
            f"{case:28} {statistics.median(b):12.3f} {min(b):6.3f} {statistics.median(n):12.3f} {min(n):6.3f}"
            f" {statistics.median(n) / statistics.median(b):6.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="8d9b781", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    main(args.base, args.rounds)
