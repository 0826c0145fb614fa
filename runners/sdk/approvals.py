"""The `approvals` section of a binding config, shared by the runners that offer it: which tool calls wait for a
person's yes (asked through `RunContext.request_approval`), and the matching rules.

Imported only by runners that validate configs with pydantic; the serving SDK itself never loads it.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ApprovalsConfig(BaseModel):
    """Tool calls that wait for a person's yes before they run (agenthost.runners.local_agent.approvals)."""

    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="Tool names or globs (fnmatch, e.g. 'write_*'), or 're:<regex>': every call of a matching "
        "tool asks first.",
    )
    commands: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="Shell commands that ask first: a glob matched against the whole command and each part of it "
        "between ; & | && || ( ) ` and newlines (e.g. 'rm *', 'git push*'), or 're:<regex>' searched anywhere in "
        "the command. A filter for convenience, not a wall: a command can hide what it runs (sh -c, eval, "
        "variables); list 'shell' under tools to ask for every command.",
    )
    timeout_seconds: float = Field(
        default=300.0, gt=0, le=3600, description="No answer within this = denied (the run's deadline also caps it)."
    )

    @field_validator("tools", "commands")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or len(pattern) > 500:
                raise ValueError("each pattern must be 1-500 characters and not blank")
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as exc:
                    raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.commands)


# Shell control operators: a pattern is matched against each simple command they separate, so "ls; rm -rf x"
# still asks under "rm *".
_SEGMENTS = re.compile(r"\|\||&&|[;&|()`\n]|\$\(")


def _matches(pattern: str, text: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], text) is not None
    return fnmatch.fnmatchcase(text, pattern)


def approval_reason(
    config: ApprovalsConfig, tool_name: str, args: dict[str, Any], *, shell_tools: tuple[str, ...] = ("shell", "Bash")
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
