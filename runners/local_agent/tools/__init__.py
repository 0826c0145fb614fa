"""The local agent's tools and the registry that runs them."""

from __future__ import annotations

from runners.local_agent.config import LocalAgentConfig
from runners.local_agent.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from runners.local_agent.tools.files import file_tools
from runners.local_agent.tools.host import ReadArtifact, SearchHistory
from runners.local_agent.tools.memory import Memory
from runners.local_agent.tools.shell import Shell
from runners.local_agent.tools.todo import TodoWrite


def all_tools() -> list[Tool]:
    return [*file_tools(), Shell(), SearchHistory(), ReadArtifact(), TodoWrite(), Memory()]


def build_registry(config: LocalAgentConfig) -> ToolRegistry:
    tools = all_tools()
    known = {t.name for t in tools}
    if config.tools is not None:
        unknown = sorted(set(config.tools) - known)
        if unknown:
            from runners.local_agent.config import ConfigError

            raise ConfigError(f"unknown tools {unknown}; available: {sorted(known)}")
        tools = [t for t in tools if t.name in config.tools]
    if not config.shell.enabled:
        tools = [t for t in tools if t.name != "shell"]
    if not config.memory.enabled:
        tools = [t for t in tools if t.name != "memory"]
    return ToolRegistry(tools)


__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "all_tools", "build_registry"]
