"""`compact`: the model asks for its working context to be compacted now, rather than at the watermark.

The tool only records the request; the loop compacts after every call of the step has its result, with the same
guarantees as automatic compaction (the pre-compaction transcript saved as an artifact, the current request kept
verbatim as a user message, the latest exchange kept whole), and then rewrites this call's result in the working
context to say what happened.
"""

from __future__ import annotations

from typing import Any

from agenthost.runners.local_agent.tools.base import Tool, ToolContext

REQUESTED = "Compaction requested; it runs as soon as every tool call of this step has finished."


class Compact(Tool):
    name = "compact"
    description = (
        "Compact your context now (earlier turns become a summary, the full transcript an artifact); the current "
        "request stays. Use before a new phase of work. focus: what the summary must keep."
    )
    parameters = {
        "type": "object",
        "properties": {"focus": {"type": "string", "maxLength": 500}},
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        focus = str(args.get("focus", "")).strip()
        ctx.compact_request = focus if ctx.compact_request is None else (ctx.compact_request + " " + focus).strip()
        return REQUESTED
