"""A todo list for multi-step work, kept in conversation state so it survives runs and runner restarts."""

from __future__ import annotations

from typing import Any

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError
from agenthost.runners.sdk import events

STATE_KEY = "local_agent.todos"
MAX_ITEMS = 30
MARK = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}


def render(items: list[dict[str, Any]]) -> str:
    if not items:
        return "(todo list is empty)"
    return "\n".join(f"{MARK[i['status']]} {n}. {i['content']}" for n, i in enumerate(items, 1))


class TodoWrite(Tool):
    name = "todo_write"
    description = (
        "Replace the short checklist for the request at hand. Exactly one item may be in_progress at a time; mark "
        "items completed as soon as they are done. For work spanning requests or with dependencies, use task_create."
    )
    parameters = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": MAX_ITEMS,
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1, "maxLength": 500},
                        "status": {"enum": ["pending", "in_progress", "completed"]},
                    },
                    "required": ["content", "status"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        items = [{"content": i["content"].strip(), "status": i["status"]} for i in args["items"]]
        active = [i["content"] for i in items if i["status"] == "in_progress"]
        if len(active) > 1:
            raise ToolError(f"only one item may be in_progress at a time; got {len(active)}: {active}")
        try:
            await ctx.api.state_set("conversation", STATE_KEY, items)
        except host_errors.AgentHostError as exc:
            raise ToolError(f"could not save the todo list: {type(exc).__name__}: {exc.message}") from None
        ctx.pending_events.append(events.state_updated("conversation", STATE_KEY))
        return render(items)
