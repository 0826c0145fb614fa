"""The `approvals` section of a binding config, shared by the runners that offer it: which tool calls wait for a
person's yes (asked through `RunContext.request_approval`), and the matching rules.

Imported only by runners that validate configs with pydantic; the serving SDK itself never loads it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agenthost.protos.wire import APPROVAL_DEFAULT_SECONDS, APPROVAL_MAX_SECONDS
from agenthost.runners.sdk.approval_rules import approval_reason

__all__ = ["ApprovalsConfig", "approval_reason"]


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
        default=APPROVAL_DEFAULT_SECONDS,
        gt=0,
        le=APPROVAL_MAX_SECONDS,
        description="No answer within this = denied (the run's deadline also caps it).",
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
