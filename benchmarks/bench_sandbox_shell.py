"""Cost of the shell tool's sandbox (not a test).

Runs N calls of the local agent's `shell` tool with the command `true` through the tool registry, sandboxed
(bubblewrap, the default) and unsandboxed (`shell.sandbox: false`), interleaved in one run so both see the same
machine load, and prints the median and p90 latency per call for each and the difference. Target: at most
+15 ms per call.

    .venv/bin/python benchmarks/bench_sandbox_shell.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agenthost.plugins import sandbox as sandboxing  # noqa: E402
from agenthost.runners.local_agent.config import LocalAgentConfig, ShellConfig  # noqa: E402
from agenthost.runners.local_agent.messages import ToolCall  # noqa: E402
from agenthost.runners.local_agent.testing import FakeRunAPI  # noqa: E402
from agenthost.runners.local_agent.tools import build_registry  # noqa: E402
from agenthost.runners.local_agent.tools.base import ToolContext  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def main(calls: int) -> None:
    reason = sandboxing.probe()
    if reason is not None:
        sys.exit(f"no sandbox on this machine: {reason}")
    # The unsandboxed side logs a warning per command by design; it is not what is measured.
    logging.getLogger("agenthost.local_agent").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        configs = {
            "sandboxed": LocalAgentConfig(),
            "unsandboxed": LocalAgentConfig(shell=ShellConfig(sandbox=False)),
        }
        ctxs = {
            name: ToolContext(workspace=ws, api=FakeRunAPI(), conversation_id="c", run_id="r", config=cfg)
            for name, cfg in configs.items()
        }
        registry = build_registry(configs["sandboxed"])
        call = ToolCall("b", "shell", json.dumps({"command": "true"}))
        for ctx in ctxs.values():  # warm-up: imports, page cache, bwrap's first start
            for _ in range(5):
                assert not (await registry.run(call, ctx)).is_error
        times: dict[str, list[float]] = {name: [] for name in ctxs}
        for _ in range(calls):
            for name, ctx in ctxs.items():
                t0 = time.perf_counter()
                result = await registry.run(call, ctx)
                times[name].append((time.perf_counter() - t0) * 1000)
                assert not result.is_error, result.content
    print(f"shell tool, command `true`, {calls} calls each (ms per call)")
    for name, values in times.items():
        print(f"  {name:12} median {statistics.median(values):6.2f}   p90 {pct(values, 0.9):6.2f}")
    dm = statistics.median(times["sandboxed"]) - statistics.median(times["unsandboxed"])
    dp = pct(times["sandboxed"], 0.9) - pct(times["unsandboxed"], 0.9)
    verdict = "within" if dm <= 15 else "OVER"
    print(f"  difference   median {dm:+6.2f}   p90 {dp:+6.2f}   ({verdict} the +15 ms target)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
