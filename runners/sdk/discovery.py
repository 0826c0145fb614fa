"""Finds a plugin's runner classes: entry points of the `agenthost.runners` group, loaded through pluggy.

Only the named distribution's entry points are imported (discovery is execution: a plugin process must not
import its neighbours' code). An entry point that fails to import is a loud error naming it, never a skip.
"""

from __future__ import annotations

from importlib import metadata

import pluggy

from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import RunnerManifest
from agenthost.runners.sdk.runner import Runner


class DiscoveryError(RuntimeError):
    pass


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def runner_classes(distribution: str) -> dict[str, type[Runner]]:
    """The runner classes the distribution registers, by manifest name."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise DiscoveryError(f"distribution {distribution!r} is not installed in this environment") from None
    eps = [ep for ep in dist.entry_points if ep.group == hookspecs.ENTRY_POINT_GROUP]
    if not eps:
        raise DiscoveryError(f"{distribution} declares no [{hookspecs.ENTRY_POINT_GROUP}] entry points")
    for ep in eps:
        try:
            plugin = ep.load()
        except Exception as exc:
            raise DiscoveryError(f"entry point {ep.name} = {ep.value} failed to import: {exc!r}") from exc
        pm.register(plugin, name=f"{_normalise(distribution)}:{ep.name}")
    return _collect(pm)


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
