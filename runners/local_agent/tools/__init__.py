"""The local agent's tools and the registry that runs them."""

from __future__ import annotations

from collections.abc import Collection

from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError, ToolRegistry
from agenthost.runners.local_agent.tools.compact import Compact
from agenthost.runners.local_agent.tools.files import file_tools
from agenthost.runners.local_agent.tools.host import ReadArtifact, SearchHistory
from agenthost.runners.local_agent.tools.knowledge import SearchKnowledge
from agenthost.runners.local_agent.tools.memory import Memory
from agenthost.runners.local_agent.tools.shell import Shell
from agenthost.runners.local_agent.tools.skills import LoadSkill
from agenthost.runners.local_agent.tools.subagent import Task
from agenthost.runners.local_agent.tools.tasks import task_tools
from agenthost.runners.local_agent.tools.todo import TodoWrite


def all_tools() -> list[Tool]:
    return [
        *file_tools(),
        Shell(),
        SearchHistory(),
        ReadArtifact(),
        SearchKnowledge(),
        TodoWrite(),
        *task_tools(),
        Memory(),
        Compact(),
        LoadSkill(),
        Task(),
    ]


# The run-API grants a host-backed tool needs; a tool whose grant is missing is not offered at all, because a model
# offered a tool that always fails keeps calling it.
TOOL_APIS: dict[str, tuple[str, ...]] = {
    "search_history": ("history.search",),
    "read_artifact": ("artifacts.read",),
    "search_knowledge": ("kb",),
    "todo_write": ("state.write",),
    "task_create": ("state.read", "state.write"),
    "task_update": ("state.read", "state.write"),
    "task_list": ("state.read",),
    "task_get": ("state.read",),
    "memory": ("state.read", "state.write"),
    "task": ("subagents",),
}
TOOL_SCOPES: dict[str, str] = {
    "todo_write": "conversation",
    "task_create": "conversation",
    "task_update": "conversation",
    "task_list": "conversation",
    "task_get": "conversation",
    "memory": "actor",
}


# Planning and context tools a small window cannot afford by default: their schemas (~600 tokens) would take a
# sixth of a 4K window (Ollama's default), which is better spent on the work itself. Listed in `tools`, they are
# offered whatever the window.
WINDOW_HUNGRY = frozenset({"task_create", "task_update", "task_list", "task_get", "compact", "task"})
SMALL_WINDOW = 16_384


def build_registry(
    config: LocalAgentConfig,
    *,
    granted_apis: Collection[str] = (),
    granted_scopes: Collection[str] = (),
    window: int | None = None,
) -> ToolRegistry:
    """The tools the config enables, minus those the run's grant cannot serve (empty grant lists = unknown, keep)."""
    tools = all_tools()
    known = {t.name for t in tools}
    if config.tools is not None:
        unknown = sorted(set(config.tools) - known)
        if unknown:
            from agenthost.runners.local_agent.config import ConfigError

            raise ConfigError(f"unknown tools {unknown}; available: {sorted(known)}")
        tools = [t for t in tools if t.name in config.tools]
    elif window is not None and window < SMALL_WINDOW:
        tools = [t for t in tools if t.name not in WINDOW_HUNGRY]
    if not config.shell.enabled:
        tools = [t for t in tools if t.name != "shell"]
    if not config.memory.enabled:
        tools = [t for t in tools if t.name != "memory"]
    if not config.skills:
        tools = [t for t in tools if t.name != "load_skill"]
    if granted_apis:
        tools = [t for t in tools if all(api in granted_apis for api in TOOL_APIS.get(t.name, ()))]
    if granted_scopes:
        tools = [t for t in tools if TOOL_SCOPES.get(t.name, next(iter(granted_scopes))) in granted_scopes]
    return _cached(tuple(t.name for t in tools), tools)


_REGISTRIES: dict[tuple[str, ...], ToolRegistry] = {}


def _cached(key: tuple[str, ...], tools: list[Tool]) -> ToolRegistry:
    # Tools are stateless (all per-run state lives in ToolContext), so one registry per tool set is shared.
    registry = _REGISTRIES.get(key)
    if registry is None:
        registry = _REGISTRIES[key] = ToolRegistry(tools)
    return registry


__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "all_tools", "build_registry"]
