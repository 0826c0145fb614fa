"""Finds a plugin's channel adapter classes: entry points of the `agenthost.channels` group of one distribution,
loaded through pluggy (only that distribution's code is imported), by the rules every plugin kind shares
(agenthost.plugins.plugin_process.registered_classes)."""

from __future__ import annotations

from agenthost.channels.sdk.adapter import ChannelAdapter
from agenthost.plugins import hookspecs
from agenthost.plugins.manifest import ChannelManifest
from agenthost.plugins.plugin_process import DiscoveryError, registered_classes

__all__ = ["DiscoveryError", "channel_classes"]


def channel_classes(distribution: str) -> dict[str, type[ChannelAdapter]]:
    """The channel adapter classes the distribution registers, by manifest name."""
    return registered_classes(
        distribution,
        hookspecs.CHANNELS_ENTRY_POINT_GROUP,
        "agenthost_register_channels",
        ChannelAdapter,
        ChannelManifest,
        "channel adapters",
    )
