"""The runner SDK: everything a runner plugin author imports.

from agenthost.runners.sdk import Runner, RunContext, RunnerManifest, events, hookimpl
"""

from agenthost.plugins.hookspecs import hookimpl
from agenthost.plugins.manifest import ContextNeeds, RunnerCapabilities, RunnerManifest, RunnerPermissions
from agenthost.runners.sdk import events
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.runner import RunContext, Runner

__all__ = [
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
