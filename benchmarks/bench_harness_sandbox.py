"""What the harness sandbox costs: one external-harness turn with `process_sandbox` on and off, in the same run.

    .venv/bin/python benchmarks/bench_harness_sandbox.py [--runs 7] [--harness claude-code codex]

Each turn is a trivial one ("ping" -> one model request -> "pong") against a fake model API on loopback, driven
straight through the runner (no host around it, so the sandbox is a larger share of what is measured), with the
host MCP bridge on (it starts inside the sandbox too), in a fresh conversation each time. The two variants
alternate so drift in machine load hits both alike. Prints medians and the sandbox's overhead in percent.
Needs bubblewrap and the pinned CLIs (scripts/install_harness_clis.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from external_harness.fake_apis import FakeAnthropic, FakeOpenAI, Request  # noqa: E402
from external_harness.fake_run_api import FakeHost  # noqa: E402

from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner  # noqa: E402

BIN = REPO / ".tools" / "npm" / "node_modules" / ".bin"


def pong(_: Request) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "pong"}]


async def one_turn(runner: Any, host: FakeHost, config: dict[str, Any], conversation: str) -> float:
    host.data.conversation_id = conversation
    rc = host.run_context("ping", config=config)
    started = time.perf_counter()
    events = [e async for e in runner.run(rc)]
    elapsed = time.perf_counter() - started
    if events[-1].WhichOneof("kind") != "completed":
        raise RuntimeError(f"turn failed: {events[-1]}")
    return elapsed


async def bench(harness: str, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"sandbox": [], "no-sandbox": []}
    fake_cls = FakeAnthropic if harness == "claude-code" else FakeOpenAI
    runner_cls = ClaudeCodeRunner if harness == "claude-code" else CodexRunner
    with tempfile.TemporaryDirectory(prefix="ah-bench-") as d, fake_cls(pong) as fake:
        os.environ["ANTHROPIC_API_KEY" if harness == "claude-code" else "OPENAI_API_KEY"] = "sk-bench-0123456789"
        base = {
            "command": str(BIN / ("claude" if harness == "claude-code" else "codex")),
            "base_url": f"http://127.0.0.1:{fake.port}" + ("" if harness == "claude-code" else "/v1"),
        }
        if harness == "codex":
            base["model"] = "gpt-fake"
        async with FakeHost(Path(d)) as host:
            runner = runner_cls(Path(d) / "data")
            for variant in ("sandbox", "no-sandbox"):  # warm-up: page cache, first-run caches of the CLIs
                await one_turn(runner, host, {**base, "process_sandbox": variant == "sandbox"}, f"warm-{variant}")
            for i in range(runs):
                order = ("sandbox", "no-sandbox") if i % 2 == 0 else ("no-sandbox", "sandbox")
                for variant in order:
                    config = {**base, "process_sandbox": variant == "sandbox"}
                    times[variant].append(await one_turn(runner, host, config, f"c{i}-{variant}"))
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--harness", nargs="+", default=["claude-code", "codex"], choices=["claude-code", "codex"])
    args = parser.parse_args()
    logging.getLogger("agenthost.runners.external_harness").setLevel(logging.ERROR)  # the opt-out's warning
    for harness in args.harness:
        times = await bench(harness, args.runs)
        on, off = statistics.median(times["sandbox"]), statistics.median(times["no-sandbox"])
        # Paired differences (the two variants of one round ran back to back) resist load drift better than
        # the difference of medians on a busy machine; the minimum shows the cost without interference.
        paired = statistics.median(a - b for a, b in zip(times["sandbox"], times["no-sandbox"], strict=True))
        low_on, low_off = min(times["sandbox"]), min(times["no-sandbox"])
        print(
            f"{harness:12s} runs={args.runs}  median: no-sandbox {off * 1000:6.0f} ms, sandbox {on * 1000:6.0f} ms "
            f"({100 * (on - off) / off:+5.1f} %); median paired difference {paired * 1000:+5.0f} ms "
            f"({100 * paired / off:+5.1f} %); min: {low_off * 1000:.0f} vs {low_on * 1000:.0f} ms"
        )
        for variant, values in times.items():
            print(f"  {variant:11s} " + " ".join(f"{v * 1000:.0f}" for v in values))


if __name__ == "__main__":
    asyncio.run(main())
