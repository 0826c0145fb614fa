"""Prompt-cache prefix stability of the local agent (not a test).

Runs a 20-turn scripted conversation (tool calls in 7 turns: files, the todo list, memory) through a real host
for each provider (OpenAI-compatible, Anthropic), captures every request body the scripted model server
receives, and prints for each request the share of the previous request's cacheable bytes (tool schemas, system
prompt, messages; `cache_control` markers aside) that it repeats byte for byte at its start. The baseline,
measured in the same run, is the same runner with the system prompt re-rendered on every run (the behaviour
before the prompt was frozen per session): memory and todo edits then rewrite the head of the prefix.

    .venv/bin/python benchmarks/bench_prompt_cache.py [--turns 20] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agenthost.runners.local_agent.runner import LocalAgentRunner  # noqa: E402
from agenthost.runners.local_agent.session import Session  # noqa: E402
from agenthost.runners.local_agent.testing import FakeProviderServer, cache_script, prefix_shares  # noqa: E402
from agenthost.runners.local_agent.tools.base import ToolRegistry  # noqa: E402
from agenthost.runners.sdk.runner import RunContext  # noqa: E402
from agenthost.runners.sdk.testing import HostHarness  # noqa: E402

TARGET = 0.95


class PerRunPrompt(LocalAgentRunner):
    """Baseline: the system prompt rendered afresh for every run, as before it was frozen per session."""

    async def _frozen_system(
        self, run: RunContext, config: Any, session: Session, workspace: Path, registry: ToolRegistry
    ) -> str:
        fixed, _ = self._system_basis(run, config, workspace, registry)
        return await self._system_prompt(run, config, fixed)


def binding(provider: str, server: FakeProviderServer) -> dict[str, Any]:
    if provider == "openai":
        base: dict[str, Any] = {"model": "vllm/bench", "base_url": server.url + "/v1"}
    else:
        base = {"model": "anthropic/claude-bench", "base_url": server.url, "api_key": "sk-bench"}
    return {**base, "context_window": 200_000, "max_retries": 0}


async def conversation(provider: str, runner: type[LocalAgentRunner], turns: int) -> tuple[list[float], list[int]]:
    """Shares per request, and the user turn each request belongs to."""
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeProviderServer() as server:
            async with HostHarness(Path(tmp), runners=[runner], config=binding(provider, server)) as h:
                owner: list[int] = []
                for turn, (text, replies) in enumerate(cache_script(provider, turns)):  # type: ignore[arg-type]
                    server.push(*replies)
                    before = len(server.model_requests)
                    r = await h.send(text, conversation_id="bench")
                    if r.run.status != "completed":
                        raise SystemExit(f"turn {turn} failed: {r.run.error_message}")
                    if any(e.WhichOneof("kind") == "compaction" for e in r.events):
                        raise SystemExit("a compaction happened; the figure is defined between compactions")
                    owner += [turn] * (len(server.model_requests) - before)
            bodies = [q.json() for q in server.model_requests]
    return prefix_shares(bodies), owner[1:]


def describe(shares: list[float]) -> str:
    below = sum(1 for s in shares if s < TARGET)
    return (
        f"min {min(shares):7.2%}  median {statistics.median(shares):7.2%}  mean {statistics.fmean(shares):7.2%}  "
        f"below {TARGET:.0%}: {below}/{len(shares)}"
    )


async def main_async(turns: int, verbose: bool) -> None:
    print(f"prompt-cache prefix stability over a {turns}-turn scripted conversation, through a real host")
    print("share = bytes of the previous request repeated at the start of this one / previous request's bytes\n")
    for provider in ("openai", "anthropic"):
        frozen, owner = await conversation(provider, LocalAgentRunner, turns)
        baseline, _ = await conversation(provider, PerRunPrompt, turns)
        print(f"{provider}: {len(frozen) + 1} requests")
        print(f"  frozen per session (this runner)   {describe(frozen)}")
        print(f"  re-rendered per run (baseline)     {describe(baseline)}")
        print(f"  min share, this runner / baseline: {min(frozen) / min(baseline):.2f}x")
        if verbose:
            print("  request  turn   frozen  baseline")
            for i, (s, b, t) in enumerate(zip(frozen, baseline, owner, strict=True), start=2):
                print(f"  {i:7d}  {t:4d}  {s:7.2%}  {b:8.2%}")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="print every request's share")
    args = parser.parse_args()
    asyncio.run(main_async(args.turns, args.verbose))


if __name__ == "__main__":
    main()
