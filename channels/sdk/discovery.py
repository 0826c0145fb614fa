"""Finds a plugin's channel adapter classes: entry points of the `agenthost.channels` group of one distribution,
loaded through pluggy (only that distribution's code is imported)."""

from __future__ import annotations

from importlib import metadata

import pluggy

from agenthost.channels.sdk.adapter import ChannelAdapter
from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import ChannelManifest


class DiscoveryError(RuntimeError):
    pass


def channel_classes(distribution: str) -> dict[str, type[ChannelAdapter]]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise DiscoveryError(f"distribution {distribution!r} is not installed in this environment") from None
    eps = [ep for ep in dist.entry_points if ep.group == hookspecs.CHANNELS_ENTRY_POINT_GROUP]
    if not eps:
        raise DiscoveryError(f"{distribution} declares no [{hookspecs.CHANNELS_ENTRY_POINT_GROUP}] entry points")
    for ep in eps:
        try:
            plugin = ep.load()
        except Exception as exc:
            raise DiscoveryError(f"entry point {ep.name} = {ep.value} failed to import: {exc!r}") from exc
        pm.register(plugin, name=f"{distribution}:channels:{ep.name}")
    found: dict[str, type[ChannelAdapter]] = {}

    def register(cls: type[ChannelAdapter]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, ChannelAdapter)):
            raise DiscoveryError(f"{cls!r} is not a subclass of agenthost.channels.sdk.ChannelAdapter")
        manifest = getattr(cls, "manifest", None)
        if not isinstance(manifest, ChannelManifest):
            raise DiscoveryError(f"{cls.__qualname__} has no `manifest = ChannelManifest(...)`")
        if manifest.name in found:
            raise DiscoveryError(f"two channel adapters are named {manifest.name!r}")
        found[manifest.name] = cls

    try:
        pm.hook.agenthost_register_channels(register=register)
    except DiscoveryError:
        raise
    except Exception as exc:
        raise DiscoveryError(f"registering the channel adapters failed: {exc}") from exc
    if not found:
        raise DiscoveryError("the plugin registered no channel adapters")
    return found
