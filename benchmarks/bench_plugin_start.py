"""CPU a runner plugin process spends starting, piece by piece, next to a bare interpreter, in one run.

    python benchmarks/bench_plugin_start.py [--rounds 15] [--top 12]

Every test that starts a host starts the built-in plugin's process, so its start-up CPU is paid hundreds of times
per suite. Each piece runs in a fresh interpreter, as the process runs it (`python -m agenthost.runners.sdk serve`
with the built-in plugin), rounds interleaved; CPU (user + system, from rusage) medians and ranges:

- the serving process up to serving: what `_serve_main` imports before its first call (ssl deferred);
- the describe child it forks at every start: imports every runner class of the plugin and dumps the manifests;
- the serving process's imports and the first call's load, per runner: the one entry point the call names.

Then the `-X importtime` entries of the describe child with the most cumulative time. Run it on two revisions
(e.g. `git checkout BASE -- runners/`, then back) alternated, for a before/after.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys

# What `runners/sdk/__main__.py` `_serve_main` does first, in every piece: the process's own set-up.
_SETUP = """
from agenthost.runners.sdk import lean
if hasattr(lean, "skip_unused_imports"):
    lean.skip_unused_imports()
"""
PIECES = {
    "python -c pass": "pass",
    "serving process, up to serving": _SETUP
    + """
lean.defer_ssl()
import asyncio
from agenthost.protos.text import TerminalSafeFormatter
from agenthost.runners.sdk.server import Deferred, RunnersUnavailable, serve
from grpc_health.v1 import health
""",
    "describe child (every runner class, manifests)": _SETUP
    + """
from agenthost.runners.sdk.__main__ import _manifests
_manifests("agenthost")
""",
    "serving + first call's load: local-agent": _SETUP
    + """
lean.defer_ssl()
import agenthost.runners.sdk.server
lean.restore_ssl()
from agenthost.runners.sdk.__main__ import _runner_classes
_runner_classes("agenthost", ["local-agent"])
""",
    "serving + first call's load: claude-code": _SETUP
    + """
lean.defer_ssl()
import agenthost.runners.sdk.server
lean.restore_ssl()
from agenthost.runners.sdk.__main__ import _runner_classes
_runner_classes("agenthost", ["external-harness"])
""",
}


def cpu_ms(code: str, importtime: bool = False) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", code]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000, out.stderr


def top_imports(stderr: str, top: int) -> list[tuple[int, str]]:
    """(cumulative µs, module) of the top-level imports (and their first level) with the most cumulative time."""
    rows = []
    for m in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \|( +)(\S+)$", stderr, re.M):
        depth = (len(m.group(2)) - 1) // 2
        if depth <= 1:
            rows.append((int(m.group(1)), "  " * depth + m.group(3)))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in PIECES}
    for _ in range(args.rounds):
        for name, code in PIECES.items():
            samples[name].append(cpu_ms(code)[0])
    load = os.getloadavg()
    print(f"plugin start-up CPU, ms (user + system), {args.rounds} interleaved rounds, {sys.executable}")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for name, got in samples.items():
        print(f"  {name:52} median {statistics.median(got):6.0f}   range {min(got):.0f}–{max(got):.0f}")
    _, stderr = cpu_ms(PIECES["describe child (every runner class, manifests)"], importtime=True)
    print("\ndescribe child, -X importtime, cumulative ms (one run):")
    for us, name in top_imports(stderr, args.top):
        print(f"  {us / 1000:7.1f}  {name}")
    cli = sum(int(m.group(1)) for m in re.finditer(r"\|\s+(\d+) \|\s+(?:click|pygments)$", stderr, re.M))
    print(f"  of it, click and pygments (httpx's command-line client): {cli / 1000:.1f} ms")


if __name__ == "__main__":
    main()
