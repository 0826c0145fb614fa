"""Every in-process extension point of agenthost, in one place.

Plugins implement these with `plugins.hookimpl` in a module named by an entry point of the group the hook belongs
to: `agenthost.runners` for runners, `agenthost.channels` for channel adapters. agenthost's built-in runners and
its Telegram adapter use exactly the same path (see pyproject.toml), so there is no private door.

Two extension points:
* runners (`agenthost_register_runners`): the code that answers an inbound event; served over gRPC in a
  supervised, sandboxed process; reaches the host only through the run-scoped AgentRunAPIProxy.
* channel adapters (`agenthost_register_channels`): the code that connects a chat platform to a bot; one
  supervised, sandboxed process per configured instance (`agenthost channels add`); reaches the host only through
  the admin socket with a `send` credential limited to its bot, so it can send messages and read the runs they
  start, nothing else. See docs/writing/channel-adapter.md for writing one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from agenthost.channels.sdk.adapter import ChannelAdapter
    from agenthost.runners.sdk.runner import Runner

PROJECT = "agenthost"
ENTRY_POINT_GROUP = "agenthost.runners"
CHANNELS_ENTRY_POINT_GROUP = "agenthost.channels"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def agenthost_register_runners(register: Callable[[type[Runner]], None]) -> None:
    """Register the runner classes this plugin offers by calling ``register(RunnerClass)`` once for each.

    Called once in the plugin's own runner process, when the SDK starts serving. Each class must subclass
    `agenthost.runners.sdk.Runner` and carry a `manifest`; a duplicate runner name within one plugin is an error.
    """


@hookspec
def agenthost_register_channels(register: Callable[[type[ChannelAdapter]], None]) -> None:
    """Register the channel adapter classes this plugin offers by calling ``register(AdapterClass)`` once each.

    Called in the adapter's own process (and at install, to describe it). Each class must subclass
    `agenthost.channels.sdk.ChannelAdapter` and carry a `manifest` (`ChannelManifest`); names are unique per plugin.
    """
