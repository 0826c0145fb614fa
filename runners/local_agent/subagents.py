"""Subagents: the same agent loop on a fresh, private context, started by the `task` tool and recorded by the host
as a child run of the run that started it.

A subagent sees only its type's instructions and the prompt it was given (never the parent's conversation), uses
only its type's tools (a subset of the run's, never `task` itself, so there is one level of subagents), and
returns only its final answer, which becomes the `task` call's result. Its messages never enter the parent's
session or the conversation's transcript; the host keeps its events under the child run's id. It runs inside the
parent's run task, so cancelling the run cancels it (and its model request); its deadline is the host's answer,
never later than the run's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent.compaction import Compactor
from agenthost.runners.local_agent.config import ConfigError, LocalAgentConfig, ModelRoute, as_route
from agenthost.runners.local_agent.errors import ContextWindowUnknown, ProviderError
from agenthost.runners.local_agent.loop import AgentLoop, RunFailed
from agenthost.runners.local_agent.messages import UserMessage
from agenthost.runners.local_agent.providers.base import Provider
from agenthost.runners.local_agent.session import EphemeralSession
from agenthost.runners.local_agent.tools.base import ToolContext, ToolError, ToolRegistry
from agenthost.runners.sdk import events

GENERAL = "general"
GENERAL_DESCRIPTION = (
    "A general-purpose agent for a self-contained piece of work: searching the workspace or the history, "
    "investigating a question, or a multi-step change. Use it when the intermediate steps would crowd your context."
)
SUBAGENT_RULES = (
    "You are a subagent: another agent gave you the task below. Work on it with your tools, then answer with a "
    "complete, self-contained report of what you found or did. The agent that asked sees only your final message "
    "(not your tool calls or their output), so put everything it needs in that message, concisely."
)
# Tools a subagent never gets: `task` (one level of subagents), and those that act on the parent's context or on
# the conversation's plan and memory, which belong to the agent the user is talking to.
NOT_FOR_SUBAGENTS = frozenset({"task", "compact", "todo_write", "task_create", "task_update", "memory"})
MAX_PROMPT_CHARS = 100_000

OpenModel = Callable[[ModelRoute | None], Awaitable[tuple[Provider, int]]]


@dataclass(frozen=True)
class SubagentType:
    name: str
    description: str
    instructions: str
    tools: tuple[str, ...]
    route: ModelRoute | None
    max_turns: int


def subagent_types(config: LocalAgentConfig, run_tools: list[str]) -> dict[str, SubagentType]:
    """The binding's subagent types plus `general` (unless the binding defines its own), each with the tools it
    may use: those it names, within the run's tools (already narrowed by the grant), never NOT_FOR_SUBAGENTS."""
    allowed = [t for t in run_tools if t not in NOT_FOR_SUBAGENTS]
    types = {GENERAL: SubagentType(GENERAL, GENERAL_DESCRIPTION, SUBAGENT_RULES, tuple(allowed), None, 10)}
    for sub in config.subagents:
        tools = allowed if sub.tools is None else [t for t in sub.tools if t in allowed]
        route = as_route(sub.model) if sub.model is not None else None
        instructions = f"{sub.instructions}\n\n{SUBAGENT_RULES}"
        types[sub.name] = SubagentType(sub.name, sub.description, instructions, tuple(tools), route, sub.max_turns)
    return types


def prompt_block(types: dict[str, SubagentType]) -> str:
    """The part of the parent's system prompt that says which subagents the `task` tool can start."""
    lines = [f"- {t.name}: {t.description} (tools: {', '.join(t.tools) or 'none'})" for t in types.values()]
    return "Subagent types for the `task` tool:\n" + "\n".join(lines)


@dataclass
class Subagents:
    """What the `task` tool needs from its run. Built by the runner for each run that offers `task`."""

    types: dict[str, SubagentType]
    run_tools: ToolRegistry
    config: LocalAgentConfig
    open_model: OpenModel
    workspace: Path

    async def run(self, args: dict[str, str], ctx: ToolContext, call_id: str) -> str:
        name = args.get("subagent_type") or GENERAL
        kind = self.types.get(name)
        if kind is None:
            raise ToolError(f"unknown subagent_type {name!r}; available: {', '.join(self.types)}")
        prompt = args["prompt"]
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ToolError(f"prompt is longer than {MAX_PROMPT_CHARS} characters; say less, or point to files")
        tools = [t for n in kind.tools if (t := self.run_tools.get(n)) is not None]
        try:
            provider, window = await self.open_model(kind.route)
        except (ConfigError, ContextWindowUnknown, ProviderError) as exc:
            raise ToolError(f"the {kind.name} subagent's model cannot be used: {exc}") from None
        sub_ctx = ToolContext(
            workspace=ctx.workspace,
            api=ctx.api,
            conversation_id=ctx.conversation_id,
            run_id=ctx.run_id,
            config=ctx.config,
            ledger=ctx.ledger,
        )
        config = self.config.model_copy(update={"max_iterations": kind.max_turns})
        description = args.get("description") or prompt
        try:
            async with (
                ctx.api.child_run(  # type: ignore[attr-defined]
                    description[:200], subagent_type=kind.name, tool_call_id=call_id
                ) as child
            ):
                loop = AgentLoop(
                    provider=provider,
                    registry=ToolRegistry(tools),
                    config=config,
                    session=EphemeralSession(ctx.conversation_id),
                    tool_ctx=sub_ctx,
                    system_prompt=f"{kind.instructions}\n\nWorkspace directory: {self.workspace}",
                    compactor=Compactor(
                        window=window,
                        watermark=config.compaction_watermark,
                        keep_fraction=config.keep_recent_fraction,
                        max_output_tokens=min(config.max_output_tokens, window // 4),
                    ),
                    deadline_at=child.deadline_at,
                    stream_text=False,  # nobody watches a subagent's text stream; whole messages are its record
                    persist_checkpoints=False,
                )
                answer, finish = "", ""
                try:
                    async for ev in loop.run(UserMessage(content=prompt)):
                        kind_ = ev.WhichOneof("kind")
                        if kind_ == "message":
                            answer = ev.message.text
                        elif kind_ == "completed":
                            finish = ev.completed.finish_reason
                        await child.emit(ev)
                except RunFailed as exc:
                    await child.emit(events.failed(exc.code, exc.message, retryable=exc.retryable))
                    raise ToolError(f"the {kind.name} subagent failed ({exc.code}): {exc.message}") from None
        except host_errors.AgentHostError as exc:
            raise ToolError(f"the {kind.name} subagent could not be recorded by the host: {exc.message}") from None
        if not answer:
            return f"(the {kind.name} subagent ended without an answer: {finish or 'no reason given'})"
        return answer
