"""Rebuilding working context from the host when the runner has no session (first contact, lost disk, a new
machine): the last summary checkpoint from conversation state, plus the turns after it, pulled page by page; and
catching a session up with turns it missed.

A message is recorded when it arrives and its run's output when the run executes, so seq order is not conversation
order when messages queue. The host pages the transcript in turn order (each event's message, then its run's
output) and only up to the run's own event; everything here still works on turns (told apart by event id), so it
reads the same conversation from a host, or a test double, that pages in seq order. A checkpoint's through_seq
covers the turns whose message seq is at or below it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agenthost.runners.local_agent import images, pairing
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
                text, parts = images.from_attachments(it.text, it.attachments)
                out.append(UserMessage(content=text, host_seq=it.seq, images=parts))
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


@dataclass
class HostContext:
    """What the host transcript says precedes the triggering message."""

    messages: list[Message]
    trigger_seq: int = 0  # transcript seq of the triggering user message; 0 when it was not found


@dataclass
class _Turn:
    """One event's items: its user message (recorded when it arrived) and its run's output (recorded when the run
    executed). Both are in transcript order within the turn, but turns interleave in the transcript."""

    key: str
    user: Any = None
    outputs: list[Any] = field(default_factory=list)

    @property
    def first_output(self) -> int:
        return self.outputs[0].seq if self.outputs else 0


def _is_user_message(item: Any) -> bool:
    return item.role == "user" and (item.item_type or "message") == "message"


def _turns(items: list[Any]) -> dict[str, _Turn]:
    """Groups oldest-first items by the event they belong to. The host tags every item with its event id; an item
    without one (older data, test doubles) belongs with the nearest user message before it, which is right for a
    transcript written one turn at a time."""
    turns: dict[str, _Turn] = {}
    current = ""
    for it in items:
        is_user = _is_user_message(it)
        if it.event_id:
            key = it.event_id
        elif is_user or not current:
            key = f"seq:{it.seq}"
        else:
            key = current
        if is_user or not it.event_id:
            current = key
        turn = turns.setdefault(key, _Turn(key))
        if is_user and turn.user is None:
            turn.user = it
        else:
            turn.outputs.append(it)
    return turns


def _conversation_order(
    turns: dict[str, _Turn], *, trigger_key: str, trigger_seq: int, trigger_created_at: float, anchor: str
) -> list[_Turn]:
    """The turns that precede the trigger, in the order the conversation had them.

    The host records a user message when it arrives and its run's output when the run executes, one run per
    conversation at a time in arrival order. So in a burst the transcript reads m1 m2 m3 A1 A2 A3, and seq order is
    not conversation order. What does hold: user messages are in arrival order, runs' outputs are in execution
    order, and both are the order of the events. A turn whose run produced output already ran, so it precedes the
    trigger (whose run is the one now executing); a turn with only its message precedes the trigger when the
    message arrived first, and otherwise is still queued and does not belong in this run's context.
    """
    executed: list[_Turn] = []
    waiting: list[_Turn] = []
    for turn in turns.values():
        if turn.key == trigger_key:
            continue
        if turn.outputs:
            executed.append(turn)
        elif turn.user is not None:
            if trigger_seq:
                if turn.user.seq < trigger_seq:
                    waiting.append(turn)
            elif not trigger_created_at or turn.user.created_at < trigger_created_at:
                waiting.append(turn)
    executed.sort(key=lambda t: t.first_output)
    # An executed turn whose message lies beyond where the walk stopped (before the checkpoint, or past the token
    # budget) is covered by what replaces the older history; the exception is a turn with no message at all (an
    # event that is not a message) that ran after a turn we keep, or the turn holding the compaction marker.
    kept: list[_Turn] = []
    anchored = False
    for turn in executed:
        if turn.user is not None or turn.key == anchor:
            anchored = True
            kept.append(turn)
        elif anchored:
            kept.append(turn)
    waiting.sort(key=lambda t: t.user.seq)
    ordered: list[_Turn] = []
    w = 0
    for turn in kept:
        # A message whose run produced nothing (it failed, or was cancelled) sits before the first executed turn
        # whose message arrived after it.
        while turn.user is not None and w < len(waiting) and waiting[w].user.seq < turn.user.seq:
            ordered.append(waiting[w])
            w += 1
        ordered.append(turn)
    ordered.extend(waiting[w:])
    return ordered


async def read_context(
    api: Any,
    conversation_id: str,
    *,
    checkpoint: Checkpoint | None,
    trigger_event_id: str,
    token_budget: int,
    trigger_created_at: float = 0.0,
    after_seq: int | None = None,
) -> HostContext:
    """The conversation before the triggering message, from the host transcript: the last checkpoint's summary and
    every turn after it, each once, in conversation order, without the trigger or anything queued behind it.

    Walks the transcript backwards from its newest item until the checkpoint, a compaction marker, or the token
    budget. `after_seq` instead asks only for the turns whose message came after that seq (a session catching up
    with turns it missed), with no summary in front and no budget.
    """
    collected: list[Any] = []
    cursor = ""
    tokens = 0
    boundary: Summary | None = (
        Summary(checkpoint.summary, checkpoint.artifact_id, checkpoint.through_seq) if checkpoint else None
    )
    stop_seq = after_seq if after_seq is not None else (checkpoint.through_seq if checkpoint else None)
    truncated_at: int | None = None
    trigger_seq = 0
    # After a compaction marker (no checkpoint in state): the messages of turns queued behind the marker's turn
    # arrived before the marker, so keep walking, taking only user messages, until the marker turn's own message.
    marker: Any = None
    marker_key = ""
    done = False
    while not done:
        page = await api.history_page(
            conversation_id=conversation_id, cursor=cursor, direction="backward", limit=PAGE_SIZE
        )
        for it in page.items:
            if stop_seq is not None and it.seq <= stop_seq:
                done = True
                break
            is_user = _is_user_message(it)
            if trigger_event_id and it.event_id == trigger_event_id:
                if is_user:
                    trigger_seq = it.seq
                continue  # the message that triggered this run; the loop adds it itself
            if marker is not None:
                if not is_user:
                    continue  # output of the marker's turn or earlier ones: the summary covers it
                if it.event_id == marker_key or (not marker.event_id and not marker_key):
                    done = True  # the marker turn's own message: the summary covers it and all before
                    break
            elif it.item_type == "compaction" and boundary is None and after_seq is None:
                # No checkpoint in state (e.g. written by an older runner) but the host recorded our summary.
                boundary = Summary(it.text, "", it.seq)
                marker, marker_key = it, it.event_id
                continue
            tokens += estimate_text(it.text) + estimate_text(it.data_json) + 4
            # Catching up is bounded by the session's own last message instead: the walk passes the output of the
            # turn the session already has, and counting that against the budget would cut turns it lacks.
            if after_seq is None and tokens > token_budget and collected:
                truncated_at = it.seq
                done = True
                break
            collected.append(it)
        if not page.has_more or not page.next_cursor:
            break
        cursor = page.next_cursor
    if truncated_at is not None:
        # In turn order a kept turn's message can be older than the item the budget stopped at (it queued behind
        # that item's turn): the note must not claim to cover a turn the context holds.
        kept_messages = [it.seq for it in collected if _is_user_message(it)]
        if kept_messages:
            truncated_at = min(truncated_at, min(kept_messages) - 1)
    collected.reverse()
    if marker is not None:
        # Items before the marker are covered by its summary, except messages of turns that came after its turn.
        collected = [it for it in collected if it.seq > marker.seq or _is_user_message(it)]
        if not marker_key:
            marker_key = _marker_turn_key(collected, marker)
    ordered = _conversation_order(
        _turns(collected),
        trigger_key=trigger_event_id,
        trigger_seq=trigger_seq,
        trigger_created_at=trigger_created_at,
        anchor=marker_key,
    )
    items = [it for turn in ordered for it in ([turn.user] if turn.user is not None else []) + turn.outputs]
    messages = items_to_messages(items)
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
    return HostContext(prefix + messages, trigger_seq)


def _marker_turn_key(collected: list[Any], marker: Any) -> str:
    """For a marker without an event id: the turn key `_turns` gives the items right after it."""
    turns = _turns(collected)
    for key, turn in turns.items():
        if any(it.seq > marker.seq for it in turn.outputs):
            return key
    return ""


async def rebuild(
    api: Any,
    conversation_id: str,
    *,
    checkpoint: Checkpoint | None,
    exclude_event_id: str,
    token_budget: int,
) -> list[Message]:
    """The working context rebuilt from the host; see `read_context`."""
    ctx = await read_context(
        api, conversation_id, checkpoint=checkpoint, trigger_event_id=exclude_event_id, token_budget=token_budget
    )
    return ctx.messages


def in_host_order(messages: list[Message]) -> bool:
    """Whether a session's user messages stand in the host's order, each once: their transcript seqs (where known)
    strictly increase. Versions before turn-ordered rebuilds could save a burst as [m2, m1, A1, m2]; a session like
    that is rebuilt from the host instead of being trusted (see LocalAgentRunner._session)."""
    last = 0
    for m in messages:
        if isinstance(m, UserMessage) and m.host_seq:
            if m.host_seq <= last:
                return False
            last = m.host_seq
    return True


def session_watermark(messages: list[Message]) -> int | None:
    """The transcript seq of the newest user message a session holds, when it can be trusted to mean "every turn
    up to here is in this session": only a message after the last summary (a summary's through_seq errs low, so
    catching up from it would repeat a turn the summary already tells), and only a message whose seq is known.
    A progress note (a turn's own earlier steps, folded in place right after its user message) is not such a
    summary: it tells nothing of earlier turns."""
    for m in reversed(messages):
        if isinstance(m, UserMessage):
            return m.host_seq or None
        if isinstance(m, Summary) and not m.progress:
            return None
    return 0 if not messages else None


async def find_trigger_seq(api: Any, conversation_id: str, event_id: str, *, max_pages: int = 3) -> int:
    """The transcript seq of the triggering user message. It is near the newest end (only messages queued behind
    it are newer), so a few pages suffice; 0 when it is not there (an event that is not a message)."""
    if not event_id:
        return 0
    cursor = ""
    for _ in range(max_pages):
        page = await api.history_page(
            conversation_id=conversation_id, cursor=cursor, direction="backward", limit=PAGE_SIZE
        )
        for it in page.items:
            if it.event_id == event_id and _is_user_message(it):
                return int(it.seq)
        if not page.has_more or not page.next_cursor:
            break
        cursor = page.next_cursor
    return 0
