"""The runner SDK: everything a runner plugin author imports.

from runners.sdk import Runner, RunContext, RunnerManifest, events, hookimpl
"""

from plugins.hookspecs import hookimpl
from plugins.manifest import ContextNeeds, RunnerCapabilities, RunnerManifest, RunnerPermissions
from runners.sdk import events
from runners.sdk.api import RunAPI
from runners.sdk.runner import RunContext, Runner

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
