"""The matching rules of a binding's `approvals` (tools, commands), without pydantic: the stdio MCP bridge uses
them too, and it starts once per harness turn. The validated schema is `agenthost.runners.sdk.approvals`."""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Protocol


class Policy(Protocol):
    tools: list[str]
    commands: list[str]


# Shell control operators: a pattern is matched against each simple command they separate, so "ls; rm -rf x"
# still asks under "rm *".
_SEGMENTS = re.compile(r"\|\||&&|[;&|()`\n]|\$\(")


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
    if isinstance(command, str) and config.commands:
        parts = [command.strip(), *(p.strip() for p in _SEGMENTS.split(command))]
        for pattern in config.commands:
            if pattern.startswith("re:"):
                if _matches(pattern, command):
                    return f"command matches approvals.commands {pattern!r}"
            elif any(p and _matches(pattern, p) for p in parts):
                return f"command matches approvals.commands {pattern!r}"
    return ""
