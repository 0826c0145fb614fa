"""Property: stop the loop after any number of events (a killed process), start again from disk, and the
history the model sees is always paired, in declared order, with nothing the dead process wrote lost."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.compaction import Compactor
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.loop import AgentLoop
from agenthost.runners.local_agent.messages import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.session import Session
from agenthost.runners.local_agent.testing import FakeRunAPI, ScriptedProvider
from agenthost.runners.local_agent.tools import build_registry
from agenthost.runners.local_agent.tools.base import ToolContext


def script(groups: list[int]) -> list[AssistantMessage]:
    turns = []
    n = 0
    for size in groups:
        calls = []
        for _ in range(size):
            n += 1
            # Alternate read-only (batched concurrently) and writing tools (run alone).
            if n % 3:
                calls.append(ToolCall(f"c{n}", "list_files", "{}"))
            else:
                calls.append(ToolCall(f"c{n}", "write_file", json.dumps({"path": f"f{n}.txt", "content": "x"})))
        turns.append(AssistantMessage(f"step {n}", calls, model="scripted/m"))
    turns.append(AssistantMessage("all done", model="scripted/m"))
    return turns


def make_loop(root: Path, provider: ScriptedProvider, session: Session) -> AgentLoop:
    config = LocalAgentConfig(context_window=100_000)
    ws = root / "ws"
    ws.mkdir(exist_ok=True)
    ctx = ToolContext(workspace=ws, api=FakeRunAPI(), conversation_id="c", run_id="r", config=config)
    return AgentLoop(
        provider=provider,
        registry=build_registry(config),
        config=config,  # type: ignore[arg-type]
        session=session,
        tool_ctx=ctx,
        system_prompt="s",
        compactor=Compactor(window=100_000, watermark=0.7, keep_fraction=0.25, max_output_tokens=4096),
    )


def assert_request_paired(messages: list[Message]) -> None:
    pairing.check(messages)


async def scenario(root: Path, groups: list[int], stop_after: int) -> None:
    provider = ScriptedProvider(script(groups))
    session = Session.create(root, "c")
    gen = make_loop(root, provider, session).run(UserMessage("do the steps")).__aiter__()
    seen = 0
    try:
        while seen < stop_after:
            await gen.__anext__()
            seen += 1
    except StopAsyncIteration:
        pass
    await gen.aclose()  # the process is gone: whatever is on disk is all that survives
    written_calls = [c.id for m in session.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]

    restored, _ = Session.load(root, "c")
    assert restored is not None
    pairing.check(restored.messages)
    assert [c.id for m in restored.messages if isinstance(m, AssistantMessage) for c in m.tool_calls] == written_calls
    real = [
        m for m in restored.messages if not (isinstance(m, ToolResult) and m.is_error and "interrupted" in m.content)
    ]
    assert all(isinstance(m, ToolResult) or m in session.messages for m in real)

    follow = ScriptedProvider([AssistantMessage("resumed", model="scripted/m")])
    events = [ev async for ev in make_loop(root, follow, restored).run(UserMessage("continue"))]
    assert events[-1].WhichOneof("kind") == "completed"
    assert_request_paired(follow.requests[0].messages)
    assert isinstance(follow.requests[0].messages[-1], UserMessage)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(0, 40))
def test_interrupted_anywhere_resumes_paired(groups: list[int], stop_after: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp), groups, stop_after))
