"""Entry point module (`agenthost.runners` group): registers the built-in harness runners."""

from __future__ import annotations

from collections.abc import Callable

from agenthost.plugins.hookspecs import hookimpl
from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner
from agenthost.runners.sdk.runner import Runner


@hookimpl
def agenthost_register_runners(register: Callable[[type[Runner]], None]) -> None:
    register(ClaudeCodeRunner)
    register(CodexRunner)
