"""Where a trivial harness turn through agenthost spends its time before the model request: timestamps along the path.

    .venv/bin/python benchmarks/bench_harness_trace.py [--runs 7] [--harness codex|claude-code] [--spare-seconds 600]

Each round sends one message in a new conversation through the real host (HostHarness, the default binding: for
Codex the runner's loopback MCP bridge, for Claude Code the bridge on its own pipes; a sandboxed spare when one is
waiting) and stamps, from the host's `send`: the host's dispatch (the message and run recorded, marked running, the
context built, the Run call), the runner receiving the run (its stored session, from the run's snapshot), the spare
claimed, the prompt written to the harness's stdin (or the harness spawned, with no spare), the CLI's first and last
MCP request before the model request, the model request at the fake API, and the reply. It prints the median and
range of each step, so a change to the path shows where it moved. The bare CLI's own times are in bench_harness.py
(same fake API, same binary).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agenthost.host.runs.context import ContextBuilder  # noqa: E402
from agenthost.host.runs.manager import RunManager  # noqa: E402
from agenthost.host.store.runs import RunStore  # noqa: E402
from agenthost.runners.external_harness import mcp_control, mcp_http, process, runner  # noqa: E402
from agenthost.runners.sdk.testing import HostHarness  # noqa: E402
from benchmarks.bench_harness import BIN, settle  # noqa: E402
from tests.external_harness.fake_apis import FakeAnthropic, FakeOpenAI, Request  # noqa: E402

STAMPS: dict[str, float] = {}


def stamp(name: str) -> None:
    STAMPS.setdefault(name, time.perf_counter())


def wrap(owner: Any, attr: str, name: str) -> None:
    original = getattr(owner, attr)

    async def traced(*args: Any, **kwargs: Any) -> Any:
        stamp(name)
        return await original(*args, **kwargs)

    setattr(owner, attr, traced)


def wrap_start(owner: Any, attr: str, name: str) -> None:
    original = getattr(owner, attr)

    def traced(*args: Any, **kwargs: Any) -> Any:
        stamp(name)
        return original(*args, **kwargs)

    setattr(owner, attr, traced)


def wrap_end(owner: Any, attr: str, name: str) -> None:
    original = getattr(owner, attr)
    if asyncio.iscoroutinefunction(original):

        async def traced(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            stamp(name)
            return result

    else:

        def traced(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            result = original(*args, **kwargs)
            stamp(name)
            return result

    setattr(owner, attr, traced)


def install_tracer() -> None:
    # The host's dispatch: the message and run recorded (one durable commit), the run's task started, marked
    # running (a second commit), its context built, the Run call made.
    wrap_start(RunManager, "send", "host: send")
    wrap(RunManager, "_execute", "host: run recorded")
    wrap_end(RunStore, "mark_running", "host: marked running")
    wrap_end(ContextBuilder, "build", "host: context built")
    wrap(RunManager, "_stream", "host: Run call")
    wrap_start(runner, "parse_config", "runner.run called")
    wrap_end(runner, "find_binary", "binary found")
    wrap_end(runner, "bridge_credentials", "bridge credentials")
    wrap_end(runner, "harness_sandbox", "sandbox planned")
    wrap_end(runner, "harness_egress", "egress set up")
    wrap_end(runner.HarnessRunner, "_load_session", "stored session read")
    wrap_end(runner, "write_context", "context projected")
    wrap_end(runner.HarnessRunner, "_project_startup", "start-up files projected")
    wrap_end(runner.workspace_budget.Budget, "check", "workspace budget checked")
    wrap_end(runner, "fingerprint", "fingerprint")
    wrap(runner.HarnessRunner, "_load_session", "runner has the run")
    original_claim = runner.HarnessRunner._claim_spare

    async def claim(*args: Any, **kwargs: Any) -> Any:
        spare = await original_claim(*args, **kwargs)
        stamp("spare claimed" if spare is not None else "no spare")
        return spare

    runner.HarnessRunner._claim_spare = claim  # type: ignore[method-assign]
    wrap(process.HarnessProcess, "end_input", "prompt on stdin")
    wrap(process.HarnessProcess, "start", "harness spawned")
    original_route = mcp_http.McpHttpEndpoint._route

    async def route(*args: Any, **kwargs: Any) -> Any:
        if "model request" not in STAMPS:
            STAMPS["last MCP request"] = time.perf_counter()
            stamp("first MCP request")
        return await original_route(*args, **kwargs)

    mcp_http.McpHttpEndpoint._route = route  # type: ignore[method-assign]
    original_receive = mcp_control.McpControl.receive

    def receive(*args: Any, **kwargs: Any) -> Any:  # Claude Code's bridge on its own pipes
        if "model request" not in STAMPS:
            STAMPS["last MCP request"] = time.perf_counter()
            stamp("first MCP request")
        return original_receive(*args, **kwargs)

    mcp_control.McpControl.receive = receive  # type: ignore[method-assign]


def pong(_: Request) -> list[dict[str, Any]]:
    stamp("model request")
    return [{"type": "text", "text": "pong"}]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--harness", choices=["codex", "claude-code"], default="codex")
    parser.add_argument("--spare-seconds", type=float, default=600.0, help="0: no process waiting (cold)")
    args = parser.parse_args()
    install_tracer()
    codex = args.harness == "codex"
    binary = os.path.realpath(BIN / ("codex" if codex else "claude"))
    os.environ["OPENAI_API_KEY" if codex else "ANTHROPIC_API_KEY"] = "sk-bench"
    rows: list[dict[str, float]] = []
    fake_cls = FakeOpenAI if codex else FakeAnthropic
    with fake_cls(pong, max_requests=4 * (args.runs + 1)) as fake, tempfile.TemporaryDirectory() as tmp:
        config: dict[str, Any] = {"command": binary}
        if codex:
            config |= {"base_url": f"http://127.0.0.1:{fake.port}/v1", "model": "gpt-fake"}
            config |= {"spare_seconds": args.spare_seconds}
        else:  # a Claude Code spare is kept as long as a conversation's process (keep_warm_seconds)
            config |= {"base_url": f"http://127.0.0.1:{fake.port}", "keep_warm_seconds": args.spare_seconds}
        runner_cls = runner.CodexRunner if codex else runner.ClaudeCodeRunner
        async with HostHarness(Path(tmp), runners=[runner_cls], config=config) as host:
            for i in range(args.runs + 1):  # the first one warms up (and starts the first spare)
                await settle()
                STAMPS.clear()
                started = time.perf_counter()
                result = await host.send("ping", conversation_id=f"trace-{i}")
                stamp("reply")
                if result.run.status != "completed" or "pong" not in result.text:
                    raise RuntimeError(f"{result.run.status} {result.run.error_message}")
                if i:
                    rows.append({k: (v - started) * 1000 for k, v in STAMPS.items()})
    print(
        f"{args.harness} through agenthost, {args.runs} rounds, ms from the host's send (median, min-max), load "
        f"{os.getloadavg()[0]:.1f}"
    )
    names = sorted({k for r in rows for k in r}, key=lambda k: statistics.median(r[k] for r in rows if k in r))
    for name in names:
        values = [r[name] for r in rows if name in r]
        print(f"  {name:<20} {statistics.median(values):8.1f}  ({min(values):.1f}-{max(values):.1f}, n={len(values)})")


if __name__ == "__main__":
    asyncio.run(main())
