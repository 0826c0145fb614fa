"""The console tests' world: a real host with the gateway on, a runner that streams text around a tool call, and a
signed-in aiohttp client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.protos.run_api_pb2 import ApprovalDecision
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "greeting": {"type": "string", "title": "Greeting", "description": "What the helper says first."},
        "max_tools": {
            "anyOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"type": "null"}],
            "default": None,
            "title": "Max tools",
        },
        "style": {"enum": ["plain", "fancy"], "title": "Style"},
        "api_key": {"type": "string", "title": "API key"},
    },
}


class Helper(Runner):
    """Says its greeting, calls a `lookup` tool, then answers in deltas. "hold" parks after the tool started until
    the test opens `release`. A message starting with "ask" first asks a person to approve the lookup (its decision
    lands in `decisions`); a refusal ends the run with a line saying who refused and why. Its own rule (beyond the
    schema): the greeting may not say "forbidden"."""

    manifest = RunnerManifest(name="helper", description="streams text around a tool call", config_schema=CONFIG_SCHEMA)
    release: asyncio.Event
    holding: asyncio.Event
    decisions: list[ApprovalDecision]

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        if "forbidden" in str(config.get("greeting", "")):
            return ["greeting: may not say 'forbidden'"]
        return []

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        yield events.text(str(run.config.get("greeting", "Let me look.")) + " ")
        if run.text.startswith("ask"):
            decision = await run.request_approval(
                "lookup",
                summary=f"look up {run.text!r}",
                arguments={"query": run.text, "depth": 2},
                reason="lookups need a person's OK",
                timeout_seconds=60,
                tool_call_id="call_1",
            )
            Helper.decisions.append(decision)
            if not decision.approved:
                yield events.text(f"Not looked up: {decision.outcome} by {decision.decided_by} ({decision.note}).")
                yield events.completed()
                return
        yield events.tool_started("call_1", "lookup", {"query": run.text})
        if run.text == "hold":
            Helper.holding.set()
            await Helper.release.wait()
        yield events.tool_finished("call_1", "lookup", '{"hits": 42}')
        # A kind the console has no renderer for: it must still show (as a generic row).
        yield events.state_updated("conversation", "last_lookup")
        for delta in ("The answer", " is", " 42."):
            yield events.text(delta)
        yield events.usage(12, 5, model="fake-model")
        yield events.completed()
