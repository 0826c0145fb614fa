"""Finds a plugin's runner classes: entry points of the `agenthost.runners` group, loaded through pluggy.

Only the named distribution's entry points are imported (discovery is execution: a plugin process must not
import its neighbours' code). An entry point that fails to import is a loud error naming it, never a skip.
"""

from __future__ import annotations

import pluggy

from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import RunnerManifest
from agenthost.plugins.plugin_process import DiscoveryError, load_entry_points
from agenthost.runners.sdk.runner import Runner

__all__ = ["DiscoveryError", "runner_classes"]


def runner_classes(distribution: str) -> dict[str, type[Runner]]:
    """The runner classes the distribution registers, by manifest name."""
    return _collect(load_entry_points(distribution, hookspecs.ENTRY_POINT_GROUP))


def _collect(pm: pluggy.PluginManager) -> dict[str, type[Runner]]:
    found: dict[str, type[Runner]] = {}

    def register(cls: type[Runner]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Runner)):
            raise DiscoveryError(f"{cls!r} is not a subclass of agenthost.runners.sdk.Runner")
        manifest = getattr(cls, "manifest", None)
        if not isinstance(manifest, RunnerManifest):
            raise DiscoveryError(f"{cls.__qualname__} has no `manifest = RunnerManifest(...)`")
        if manifest.name in found:
            raise DiscoveryError(f"two runners are named {manifest.name!r}")
        found[manifest.name] = cls

    pm.hook.agenthost_register_runners(register=register)
    if not found:
        raise DiscoveryError("the plugin registered no runners")
    return found
