"""`task`: hand a self-contained piece of work to a subagent with a fresh context (see local_agent.subagents)."""

from __future__ import annotations

from typing import Any

from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError


class Task(Tool):
    name = "task"
    description = (
        "Start a subagent on a self-contained piece of work. It begins with a fresh context: it sees only the "
        "prompt you write here (not this conversation), works with its own tools, and you get back only its final "
        "answer. Use it for searches and investigations whose intermediate output you do not need to keep. Write "
        "a complete prompt: what to do, what is already known, and what the answer must contain. Subagent types "
        "are listed in your instructions."
    )
    parameters = {
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "A short (3-10 words) label for the task."},
            "prompt": {"type": "string", "description": "The full task for the subagent."},
            "subagent_type": {"type": "string", "description": "Which subagent to start; default 'general'."},
        },
        "required": ["description", "prompt"],
        "additionalProperties": False,
    }
    needs_call_id = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self.execute_call(args, ctx, "")

    async def execute_call(self, args: dict[str, Any], ctx: ToolContext, call_id: str) -> str:
        if ctx.subagents is None:
            raise ToolError("subagents are not available in this run")
        return await ctx.subagents.run(args, ctx, call_id)
