"""Shared helpers for local-agent tests that drive the whole runner against FakeRunAPI + FakeProviderServer."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, FakeRunAPI, make_run


def server_config(server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    return {"model": "vllm/test-model", "base_url": server.url + "/v1", "context_window": 32_000, **extra}


async def send(
    runner: LocalAgentRunner,
    api: FakeRunAPI,
    text: str,
    config: dict[str, Any],
    *,
    state: dict[str, Any] | None = None,
) -> list[pb.RunEvent]:
    """One run the way the host drives it: the user item is recorded first, events are projected afterwards."""
    event_id = f"ev_{uuid.uuid4().hex[:8]}"
    api.add_user(text, event_id=event_id)
    run = make_run(api, text, conversation_id=api.conversation_id, config=config, event_id=event_id, state=state)
    events = [ev async for ev in runner.run(run)]
    api.project(events, run_id=run.run_id)
    return events


def kinds(events: list[pb.RunEvent]) -> list[str]:
    return [str(e.WhichOneof("kind")) for e in events]


def terminal(events: list[pb.RunEvent]) -> pb.RunEvent:
    terms = [e for e in events if e.WhichOneof("kind") in ("completed", "failed")]
    assert len(terms) == 1, kinds(events)
    assert events[-1] is terms[0]
    return terms[0]


def streamed_text(events: list[pb.RunEvent]) -> str:
    return "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")


def session_key(api: FakeRunAPI, bot_id: str = "bot1") -> str:
    """The runner keys sessions by (bot, conversation); make_run's default bot is bot1."""
    return f"{bot_id}\x1f{api.conversation_id}"


def new_runner(data_dir: Path, env: dict[str, str] | None = None) -> LocalAgentRunner:
    return LocalAgentRunner(data_dir, env=env or {})
