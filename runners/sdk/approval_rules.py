"""The matching rules of a binding's `approvals` (tools, commands), without pydantic: the stdio MCP bridge uses
them too, and it starts once per harness turn. The validated schema is `agenthost.runners.sdk.approvals`."""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Protocol


class Policy(Protocol):
    tools: list[str]
    commands: list[str]


def _matches(pattern: str, text: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], text) is not None
    return fnmatch.fnmatchcase(text, pattern)


def approval_reason(
    config: Policy, tool_name: str, args: dict[str, Any], *, shell_tools: tuple[str, ...] = ("shell", "Bash")
) -> str:
    """Why this call needs approval, or "" when it may run as is. `commands` apply to the runner's shell tools
    (their `command` argument)."""
    for pattern in config.tools:
        if _matches(pattern, tool_name):
            return f"tool {tool_name!r} matches approvals.tools {pattern!r}"
    command = args.get("command") if tool_name in shell_tools else None
    if config.commands and tool_name in shell_tools and command is not None:
        return _command_reason(config.commands, command)
    return ""


def _command_reason(patterns: list[str], command: Any) -> str:
    """Each pattern against the whole line and against every program it would run (shell_commands: parsed, the
    program by its basename); what the parse cannot resolve asks too (fail closed)."""
    from agenthost.runners.sdk import shell_commands

    if not isinstance(command, str):
        return "the command is not a string, so approvals.commands cannot be checked"
    parsed = shell_commands.parse(command)
    for pattern in patterns:
        if _matches(pattern, command.strip()):
            return f"command matches approvals.commands {pattern!r}"
        for simple in parsed.commands:
            if pattern.startswith("re:"):
                # a regular expression cannot be checked against text only the run fills in
                hit = _matches(pattern, shell_commands.show(simple)) if shell_commands.is_literal(simple) else True
            else:
                hit = shell_commands.could_match(pattern, simple)
            if hit:
                return f"command matches approvals.commands {pattern!r} ({shell_commands.show(simple)!r})"
    if parsed.unresolved:
        return f"approvals.commands cannot be checked against this command: {parsed.unresolved[0]}"
    return ""
