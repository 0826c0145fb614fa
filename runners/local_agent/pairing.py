"""The pairing invariant: every tool call is followed, immediately and in declared order, by exactly one result.

Providers reject a history that breaks it (OpenAI: "No tool call found for function call output"; Anthropic:
"tool_use ids were found without tool_result blocks immediately after"), and one broken turn poisons every later
request. So `repair` runs before each model call, after every compaction, before writing a rewritten session and
on load; `check` is the assertion the tests and the loop use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agenthost.runners.local_agent.messages import AssistantMessage, Message, ToolResult

INTERRUPTED_RESULT = (
    "error: interrupted — no result was recorded for this call (the run was cancelled, the runner stopped, or the "
    "call was dropped). Its effects, if any, are unknown; check before repeating it."
)


class PairingError(AssertionError):
    """A message list breaks the pairing invariant."""


@dataclass
class RepairReport:
    synthesized: list[str] = field(default_factory=list)  # call ids given an `interrupted` result
    dropped: list[str] = field(default_factory=list)  # orphan or duplicate result ids removed
    reordered: int = 0  # tool groups whose results were put back in declared order

    @property
    def changed(self) -> bool:
        return bool(self.synthesized or self.dropped or self.reordered)


def repair(messages: list[Message]) -> tuple[list[Message], RepairReport]:
    """Returns a new list that satisfies the invariant; never mutates the input or drops a tool call.

    Calls are never removed because an Anthropic assistant turn must be replayed with its thinking blocks intact,
    so the fix is always on the result side: synthesize what is missing, drop what has no call.
    """
    report = RepairReport()
    out: list[Message] = []
    i = 0
    n = len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, ToolResult):
            # A result not directly after its call group: its call was compacted away or never existed.
            report.dropped.append(msg.tool_call_id)
            i += 1
            continue
        out.append(msg)
        i += 1
        if not (isinstance(msg, AssistantMessage) and msg.tool_calls):
            continue
        # Gather the results that follow this call group (results may be out of order or duplicated).
        found: dict[str, ToolResult] = {}
        arrival: list[str] = []
        wanted = {c.id for c in msg.tool_calls}
        while i < n and isinstance(messages[i], ToolResult):
            r = messages[i]
            assert isinstance(r, ToolResult)
            if r.tool_call_id in wanted and r.tool_call_id not in found:
                found[r.tool_call_id] = r
                arrival.append(r.tool_call_id)
            else:
                report.dropped.append(r.tool_call_id)
            i += 1
        declared = [c.id for c in msg.tool_calls]
        if [cid for cid in declared if cid in found] != arrival:
            report.reordered += 1
        for call in msg.tool_calls:
            result = found.get(call.id)
            if result is None:
                report.synthesized.append(call.id)
                result = ToolResult(tool_call_id=call.id, name=call.name, content=INTERRUPTED_RESULT, is_error=True)
            out.append(result)
    return out, report


def check(messages: list[Message]) -> None:
    """Raises PairingError describing the first violation."""
    i = 0
    n = len(messages)
    while i < n:
        msg = messages[i]
        if isinstance(msg, ToolResult):
            raise PairingError(f"message {i}: result for {msg.tool_call_id!r} does not follow its call")
        i += 1
        if isinstance(msg, AssistantMessage) and msg.tool_calls:
            ids = [c.id for c in msg.tool_calls]
            if len(set(ids)) != len(ids):
                raise PairingError(f"message {i - 1}: duplicate tool call ids {ids}")
            for cid in ids:
                if i >= n or not isinstance(messages[i], ToolResult):
                    raise PairingError(f"call {cid!r} has no result")
                r = messages[i]
                assert isinstance(r, ToolResult)
                if r.tool_call_id != cid:
                    raise PairingError(f"call {cid!r} is followed by result {r.tool_call_id!r}")
                i += 1
