"""Registers the local agent with the plugin system, the same way any third-party runner plugin does."""

from __future__ import annotations

from collections.abc import Callable

from agenthost.plugins.hookspecs import hookimpl
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.sdk.runner import Runner


@hookimpl
def agenthost_register_runners(register: Callable[[type[Runner]], None]) -> None:
    register(LocalAgentRunner)
