"""Tools backed by the host's run API: search this conversation's history, read an artifact."""

from __future__ import annotations

from typing import Any

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

MAX_READ_BYTES = 64 * 1024


class SearchHistory(Tool):
    name = "search_history"
    description = (
        "Full-text search over this conversation's complete history, including turns no longer in your context "
        "(e.g. after compaction). Returns matching messages, tool calls and results."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            items = await ctx.api.history_search(
                args["query"], conversation_id=ctx.conversation_id, top_k=int(args.get("top_k", 10))
            )
        except host_errors.AgentHostError as exc:
            raise ToolError(f"history search failed: {type(exc).__name__}: {exc.message}") from None
        if not items:
            return "no matches"
        lines = []
        for it in items:
            label = it.role if it.item_type == "message" else f"{it.role}/{it.item_type}"
            if it.tool_name:
                label += f" {it.tool_name}"
            text = it.text or it.data_json
            lines.append(f"[seq {it.seq}] {label}: {text[:500]}")
        return "\n".join(lines)


class ReadArtifact(Tool):
    name = "read_artifact"
    description = (
        "Read a host artifact by id (large tool outputs and pre-compaction transcripts are stored as artifacts). "
        "Use offset/length (bytes) to page through large ones."
    )
    parameters = {
        "type": "object",
        "properties": {
            "artifact_id": {"type": "string", "minLength": 1, "maxLength": 200},
            "offset": {"type": "integer", "minimum": 0},
            "length": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES},
        },
        "required": ["artifact_id"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        aid = args["artifact_id"]
        offset = int(args.get("offset", 0))
        length = int(args.get("length", 16 * 1024))
        try:
            meta = await ctx.api.artifact_metadata(aid)
            chunk = await ctx.api.artifact_read_range(aid, offset, length)
        except host_errors.AgentHostError as exc:
            raise ToolError(f"cannot read artifact {aid}: {type(exc).__name__}: {exc.message}") from None
        data: bytes = chunk.data
        if b"\x00" in data[:8192]:
            return f"artifact {aid} ({meta.mime_type}, {meta.size_bytes} bytes) is binary; not shown"
        text = data.decode("utf-8", "replace")
        end = offset + len(data)
        tail = (
            f"\n… bytes {offset}-{end} of {meta.size_bytes}; continue with offset={end}"
            if end < meta.size_bytes
            else ""
        )
        return text + tail
