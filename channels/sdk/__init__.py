"""The channel adapter SDK: write an adapter that connects a chat platform to an agenthost bot.

    from agenthost.channels.sdk import ChannelAdapter, ChannelContext, ChannelManifest, hookimpl

See docs/writing/channel-adapter.md.
"""

from agenthost.channels.sdk.adapter import ChannelAdapter, ChannelContext
from agenthost.channels.sdk.state import AdapterState
from agenthost.channels.sdk.stream import ReplySink, ReplyStream, deliver, failure_line, refusal_line
from agenthost.channels.sdk.text import one_line, split_text
from agenthost.channels.sdk.throttle import Limits, Pacer
from agenthost.plugins.hookspecs import hookimpl
from agenthost.plugins.manifest import ChannelManifest

__all__ = [
    "AdapterState",
    "ChannelAdapter",
    "ChannelContext",
    "ChannelManifest",
    "Limits",
    "Pacer",
    "ReplySink",
    "ReplyStream",
    "deliver",
    "failure_line",
    "hookimpl",
    "one_line",
    "refusal_line",
    "split_text",
]
