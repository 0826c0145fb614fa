"""Rebuilding working context from the host when the runner has no session (first contact, lost disk, a new
machine): the last summary checkpoint from conversation state, plus the transcript after it, pulled page by page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.messages import AssistantMessage, Message, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.tool_args import coerce_tool_name, repair_arguments
from agenthost.runners.local_agent.tokens import estimate_text

CHECKPOINT_KEY = "local_agent.checkpoint"
PAGE_SIZE = 100


@dataclass
class Checkpoint:
    summary: str
    through_seq: int
    artifact_id: str = ""

    @classmethod
    def from_state(cls, value: Any) -> Checkpoint | None:
        if not isinstance(value, dict) or not isinstance(value.get("summary"), str):
            return None
        try:
            return cls(value["summary"], int(value.get("through_seq", 0)), str(value.get("artifact_id", "")))
        except (TypeError, ValueError):
            return None

    def to_state(self) -> dict[str, Any]:
        return {"summary": self.summary, "through_seq": self.through_seq, "artifact_id": self.artifact_id}


def _call_arguments(item: Any) -> str:
    # The host stores a tool_started event's arguments_json verbatim as the call item's data_json.
    return repair_arguments(item.data_json or "{}")


def _result_artifact(item: Any) -> str:
    try:
        data = json.loads(item.data_json) if item.data_json else {}
    except ValueError:
        return ""
    return str(data.get("artifact_id", "")) if isinstance(data, dict) else ""


def items_to_messages(items: list[Any], *, exclude_event_id: str = "") -> list[Message]:
    """Oldest-first transcript items to messages; the result satisfies the pairing invariant."""
    out: list[Message] = []
    for it in items:
        kind = it.item_type or "message"
        if kind == "message":
            if it.role == "user":
                if exclude_event_id and it.event_id == exclude_event_id:
                    continue  # the message that triggered this run; the loop adds it itself
                out.append(UserMessage(content=it.text, host_seq=it.seq))
            elif it.role == "assistant":
                out.append(AssistantMessage(content=it.text))
        elif kind == "tool_call":
            call = ToolCall(
                id=it.tool_call_id or f"call_host_{it.seq}",
                name=coerce_tool_name(it.tool_name or "unknown_tool"),
                arguments=_call_arguments(it),
            )
            last = out[-1] if out else None
            if isinstance(last, AssistantMessage):
                # Text and calls of one model turn are separate items in the transcript; rejoin them.
                last.tool_calls.append(call)
            else:
                out.append(AssistantMessage(content="", tool_calls=[call]))
        elif kind == "tool_result":
            out.append(
                ToolResult(
                    tool_call_id=it.tool_call_id,
                    name=it.tool_name,
                    content=it.text,
                    is_error=bool(it.is_error),
                    artifact_id=_result_artifact(it),
                )
            )
    healed, _ = pairing.repair(out)
    return healed


async def rebuild(
    api: Any,
    conversation_id: str,
    *,
    checkpoint: Checkpoint | None,
    exclude_event_id: str,
    token_budget: int,
) -> list[Message]:
    """Walks the transcript backwards until the checkpoint, a compaction marker, or the token budget."""
    collected: list[Any] = []
    cursor = ""
    tokens = 0
    boundary: Summary | None = (
        Summary(checkpoint.summary, checkpoint.artifact_id, checkpoint.through_seq) if checkpoint else None
    )
    truncated_at: int | None = None
    done = False
    while not done:
        page = await api.history_page(
            conversation_id=conversation_id, cursor=cursor, direction="backward", limit=PAGE_SIZE
        )
        for it in page.items:
            if checkpoint and it.seq <= checkpoint.through_seq:
                done = True
                break
            if it.item_type == "compaction" and boundary is None:
                # No checkpoint in state (e.g. written by an older runner) but the host recorded our summary.
                boundary = Summary(it.text, "", it.seq)
                done = True
                break
            tokens += estimate_text(it.text) + estimate_text(it.data_json) + 4
            if tokens > token_budget and collected:
                truncated_at = it.seq
                done = True
                break
            collected.append(it)
        if not page.has_more or not page.next_cursor:
            break
        cursor = page.next_cursor
    collected.reverse()
    messages = items_to_messages(collected, exclude_event_id=exclude_event_id)
    # A cut by budget may start on a tool result whose call fell outside; repair() above dropped it.
    prefix: list[Message] = []
    if boundary is not None:
        prefix.append(boundary)
    if truncated_at is not None:
        prefix.append(
            Summary(
                f"Older turns of this conversation (up to transcript seq {truncated_at}) are not in context. "
                "Use the search_history tool to look them up.",
                through_seq=truncated_at,
            )
        )
    return prefix + messages
