"""Finds a plugin's runner classes: entry points of the `agenthost.runners` group of one distribution, loaded
through pluggy (only that distribution's code is imported: discovery is execution). The rules are the ones every
plugin kind shares (agenthost.plugins.plugin_process.registered_classes)."""

from __future__ import annotations

from collections.abc import Collection

from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import RunnerManifest
from agenthost.plugins.plugin_process import DiscoveryError, registered_classes
from agenthost.runners.sdk.runner import Runner

__all__ = ["DiscoveryError", "runner_classes"]


def runner_classes(
    distribution: str, *, only: Collection[str] | None = None, origins: dict[str, str] | None = None
) -> dict[str, type[Runner]]:
    """The runner classes the distribution registers, by manifest name (of the entry points in `only`, when given;
    `origins` is filled with each one's entry point: see registered_classes)."""
    return registered_classes(
        distribution,
        hookspecs.ENTRY_POINT_GROUP,
        "agenthost_register_runners",
        Runner,
        RunnerManifest,
        "runners",
        only=only,
        origins=origins,
    )
