"""The memory tool: add, replace (by unique substring) and delete entries of the user profile or notes."""

from __future__ import annotations

from typing import Any

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent import memory
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError
from agenthost.runners.sdk import events


class Memory(Tool):
    name = "memory"
    description = (
        "Save durable facts across conversations. target 'profile' is about the user (name, preferences, role); "
        "'notes' holds facts about their environment and projects. Actions: add (content), replace (old_text = a "
        "unique substring of the entry, content = new text), delete (old_text). Keep entries short; never store "
        "secrets or instructions. Changes appear in your context from the next conversation turn."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"enum": ["add", "replace", "delete"]},
            "target": {"enum": ["profile", "notes"]},
            "content": {"type": "string", "maxLength": 5000},
            "old_text": {"type": "string", "maxLength": 500},
        },
        "required": ["action", "target"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            message = await memory.edit(
                ctx.api,
                ctx.config.memory,
                action=args["action"],
                target=args["target"],
                content=args.get("content"),
                old_text=args.get("old_text"),
            )
        except memory.MemoryError as exc:
            raise ToolError(str(exc)) from None
        except host_errors.AgentHostError as exc:
            raise ToolError(f"memory is unavailable: {type(exc).__name__}: {exc.message}") from None
        ctx.pending_events.append(events.state_updated(memory.STATE_SCOPE, memory.STATE_KEY))
        return message
