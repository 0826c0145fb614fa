"""`demo/offline`: a scripted stand-in used when no model is configured. It is not a language model and says so
in every answer; it exists so a fresh install streams text and runs a real tool call end to end without a key.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.base import (
    Final,
    ModelRequest,
    ProbeResult,
    Provider,
    StreamEvent,
    TextChunk,
    Usage,
)
from agenthost.runners.local_agent.tokens import estimate_messages, estimate_text

DEMO_LABEL = "[offline demo model — not a real LLM; configure a model for real answers]"
DEMO_WINDOW = 32_768
SUMMARIZER_MARKER = "You compact conversations"


def _chunks(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class DemoProvider(Provider):
    context_window_hint = DEMO_WINDOW

    def __init__(self, model: str = "offline", *, delay: float = 0.0) -> None:
        super().__init__("demo", model)
        self.delay = delay
        self._calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self._calls += 1
        usage = Usage(input_tokens=estimate_text(request.system) + estimate_messages(request.messages), output_tokens=0)
        last = request.messages[-1] if request.messages else None
        tool_names = {t.name for t in request.tools}
        calls: list[ToolCall] = []
        if SUMMARIZER_MARKER in request.system:
            users = [m.content for m in request.messages if isinstance(m, UserMessage)]
            text = f"{DEMO_LABEL} Extractive summary: " + " | ".join(u[:200] for u in users)
        elif isinstance(last, ToolResult):
            if last.is_error:
                outcome = "failed"
            elif last.content.strip() == "(empty directory)":
                outcome = "shows the workspace is empty"
            else:
                outcome = f"lists {len(last.content.strip().splitlines())} entries"
            text = (
                f"{DEMO_LABEL} I called the `{last.name}` tool and it {outcome}. "
                "A real model would now reason about the result."
            )
        else:
            user = next((m for m in reversed(request.messages) if isinstance(m, (UserMessage, Summary))), None)
            text = f"{DEMO_LABEL} You said: {(user.content[:200] if user else '')!r}."
            earlier = [m for m in request.messages if isinstance(m, UserMessage) and m is not user]
            if earlier:
                # Shows the runner's working context at work: earlier turns really are in the request.
                text += f" Before that you said {len(earlier)} thing(s), first {earlier[0].content[:80]!r}."
            if "list_files" in tool_names and request.tool_choice == "auto":
                text += " Let me look at the workspace first."
                calls = [
                    ToolCall(id=f"demo_call_{self._calls}", name="list_files", arguments=json.dumps({"path": "."}))
                ]
        for piece in _chunks(text):
            if self.delay:
                await asyncio.sleep(self.delay)
            yield TextChunk(piece)
        usage.output_tokens = estimate_text(text)
        message = AssistantMessage(content=text, tool_calls=calls, model=self.full_model)
        yield Final(message=message, finish_reason="tool_calls" if calls else "stop", usage=usage)

    async def probe(self) -> ProbeResult:
        return ProbeResult(ok=True, context_window=DEMO_WINDOW, detail="offline demo model")
