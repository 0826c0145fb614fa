"""Every in-process extension point of agenthost, in one place.

Plugins implement these with `plugins.hookimpl` in a module named by an `agenthost.runners` entry point.
agenthost's built-in runners use exactly the same path (see pyproject.toml), so there is no private door.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from agenthost.runners.sdk.runner import Runner

PROJECT = "agenthost"
ENTRY_POINT_GROUP = "agenthost.runners"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def agenthost_register_runners(register: Callable[[type[Runner]], None]) -> None:
    """Register the runner classes this plugin offers by calling ``register(RunnerClass)`` once for each.

    Called once in the plugin's own runner process, when the SDK starts serving. Each class must subclass
    `agenthost.runners.sdk.Runner` and carry a `manifest`; a duplicate runner name within one plugin is an error.
    """
