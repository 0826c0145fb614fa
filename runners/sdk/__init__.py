"""The runner SDK: everything a runner plugin author imports.

from agenthost.runners.sdk import Runner, RunContext, RunnerManifest, events, hookimpl

The names resolve on first use, not when the package is imported: `python -m agenthost.runners.sdk serve` imports
this package before anything else, and an idle runner process must not pay for pydantic and pluggy (the manifest
model and the hook markers) until it loads the plugin's runner classes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenthost.plugins.hookspecs import hookimpl
    from agenthost.plugins.manifest import ContextNeeds, RunnerCapabilities, RunnerManifest, RunnerPermissions
    from agenthost.runners.sdk import events
    from agenthost.runners.sdk.api import RunAPI
    from agenthost.runners.sdk.child import ChildRun
    from agenthost.runners.sdk.runner import RunContext, Runner

_EXPORTS: dict[str, str] = {
    "ChildRun": "agenthost.runners.sdk.child",
    "ContextNeeds": "agenthost.plugins.manifest",
    "RunAPI": "agenthost.runners.sdk.api",
    "RunContext": "agenthost.runners.sdk.runner",
    "Runner": "agenthost.runners.sdk.runner",
    "RunnerCapabilities": "agenthost.plugins.manifest",
    "RunnerManifest": "agenthost.plugins.manifest",
    "RunnerPermissions": "agenthost.plugins.manifest",
    "hookimpl": "agenthost.plugins.hookspecs",
}

__all__ = [
    "ChildRun",
    "ContextNeeds",
    "RunAPI",
    "RunContext",
    "Runner",
    "RunnerCapabilities",
    "RunnerManifest",
    "RunnerPermissions",
    "events",
    "hookimpl",
]


def __getattr__(name: str) -> Any:
    if name == "events":
        return importlib.import_module("agenthost.runners.sdk.events")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once; later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
