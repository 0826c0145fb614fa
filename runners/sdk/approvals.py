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
        description="Shell commands that ask first: a glob matched against each program the command would run "
        "(parsed as bash: lists, pipelines, if/while/for/case bodies, subshells, $(…), `…`, <(…), wrappers such as "
        "command, env, sudo, xargs, and bash -c strings), named by its basename with its arguments (e.g. 'rm *', "
        "'git push*'), or 're:<regex>' searched in the whole command and in each of those. Fails closed: what "
        "cannot be resolved (a variable or glob as the program, eval, source, alias, a function, a parse error) "
        "asks. It matches names: list 'shell' under tools to ask for every command.",
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
