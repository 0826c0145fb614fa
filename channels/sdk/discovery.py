"""Finds a plugin's channel adapter classes: entry points of the `agenthost.channels` group of one distribution,
loaded through pluggy (only that distribution's code is imported)."""

from __future__ import annotations

from agenthost.channels.sdk.adapter import ChannelAdapter
from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import ChannelManifest
from agenthost.plugins.plugin_process import DiscoveryError, load_entry_points

__all__ = ["DiscoveryError", "channel_classes"]


def channel_classes(distribution: str) -> dict[str, type[ChannelAdapter]]:
    pm = load_entry_points(distribution, hookspecs.CHANNELS_ENTRY_POINT_GROUP)
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
