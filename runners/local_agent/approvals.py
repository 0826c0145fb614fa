"""Which tool calls need a person's approval (the binding's `approvals`), and asking the host for it.

Called from the one place every tool call passes through (`ToolRegistry.run`), after the arguments validated and
before the tool executes, so built-in, MCP and subagent tools are gated alike. The host streams the request to
whoever is talking to the bot and holds the call until a decision, the timeout or the run's end. Anything but
an explicit approval (a denial, no answer, a cancelled run, a host that refused the request) leaves the tool
unexecuted and tells the model why in the call's result: the run itself goes on.
"""

from __future__ import annotations

import json
from typing import Any

from agenthost.runners.local_agent.messages import ToolCall, ToolResult
from agenthost.runners.sdk.approvals import ApprovalsConfig, approval_reason

__all__ = ["approval_reason", "check", "summary"]

SHELL_TOOL = "shell"
SUMMARY_CHARS = 300


def summary(tool_name: str, args: dict[str, Any]) -> str:
    """One line a person can judge: the command for the shell, else the tool and its arguments."""
    if tool_name == SHELL_TOOL and isinstance(args.get("command"), str):
        text = args["command"]
    else:
        text = f"{tool_name} {json.dumps(args, ensure_ascii=False, separators=(',', ':'))}"
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


async def check(api: Any, config: ApprovalsConfig, call: ToolCall, args: dict[str, Any]) -> ToolResult | None:
    """None when the call may run (not gated, or approved); else the error result the model reads instead."""
    reason = approval_reason(config, call.name, args, shell_tools=(SHELL_TOOL,)) if config.enabled else ""
    if not reason:
        return None
    try:
        decision = await api.request_approval(
            call.name,
            summary=summary(call.name, args),
            arguments=args,
            reason=reason,
            timeout_seconds=config.timeout_seconds,
            tool_call_id=call.id,
        )
    except Exception as exc:  # noqa: BLE001 — no answer is no approval; the model hears why
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return _refused(call, f"it needs approval ({reason}), and the request could not be made: {message}")
    if decision.approved:
        return None
    note = f" Their note: {decision.note}" if decision.note and decision.outcome == "denied" else ""
    if decision.outcome == "denied":
        why = f"the user denied it.{note} Do not retry the same call; ask the user or choose another way"
    elif decision.outcome == "timeout":
        waited = round(decision.timeout_seconds, 1)
        why = (
            f"nobody answered the approval request within {waited:g}s, so it was treated as denied. Tell the user "
            "it is waiting for their approval, or choose another way"
        )
    else:
        why = f"the approval request ended without a decision ({decision.outcome}: {decision.note or 'no detail'})"
    return _refused(call, why)


def _refused(call: ToolCall, why: str) -> ToolResult:
    return ToolResult(tool_call_id=call.id, name=call.name, content=f"error: not executed — {why}.", is_error=True)
