"""The channel adapter SDK's core: the base class a platform adapter subclasses, and the context it runs with.

An adapter is a long-running loop (`run(ctx)`): it reads its platform's updates, turns each into an inbound
message for its bot (`ctx.send`), and delivers the run's replies back (`agenthost.channels.sdk.stream.deliver`).
It runs in its own supervised, sandboxed process; returning ends it cleanly, raising is a crash the host restarts
with backoff. It holds only a `send` credential for its bot: it can send messages to that bot and read, list and
cancel that bot's runs — nothing else of the host.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from agenthost.channels.sdk.state import AdapterState
from agenthost.host.api.client import HostClient
from agenthost.plugins.manifest import ChannelManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb


@dataclass
class ChannelContext:
    instance: str  # the channel's name (`agenthost channels add … --name`)
    bot: str  # the bot id this channel talks to
    config: dict[str, Any]
    secrets: dict[str, str]  # key-store names -> values, only those the config names in secret settings
    data_dir: Path
    host: HostClient  # carries the channel's scoped `send` credential
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # The head the host gave this channel's conversation names (`tg:`, or `<channel name>:`): the host refuses it
    # any other, so name chats with `conversation(id)`.
    chats: str = ""
    source: str = "channel"
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("agenthost.channel"))
    _state: AdapterState | None = None

    @property
    def state(self) -> AdapterState:
        if self._state is None:
            self._state = AdapterState(self.data_dir / "state.json")
        return self._state

    def conversation(self, chat_id: str) -> str:
        """The conversation name of chat `chat_id` on this channel."""
        return f"{self.chats}{chat_id}"

    def secret(self, setting: str) -> str:
        """The value of the key the config's `setting` names (e.g. token_key -> TELEGRAM_BOT_TOKEN -> the token)."""
        name = self.config.get(setting)
        if not isinstance(name, str) or name not in self.secrets:
            raise KeyError(f"setting {setting!r} names no key this channel was given")
        return self.secrets[name]

    def request(
        self,
        conversation_id: str,
        text: str,
        *,
        actor: pb.Actor | None = None,
        data: dict[str, Any] | None = None,
        **fields: Any,
    ) -> hpb.SendMessageRequest:
        return hpb.SendMessageRequest(
            bot=self.bot,
            conversation_id=conversation_id,
            text=text,
            actor=actor,
            source=self.source,
            data_json=json.dumps(data) if data else "",
            **fields,
        )

    def send(self, request: hpb.SendMessageRequest) -> AsyncIterator[hpb.SendMessageReply]:
        """Sends one inbound message and streams its run (no deadline: a run ends by its own deadline)."""
        return self.host.stream(request)

    async def read_artifact(self, run_id: str, artifact_id: str, max_bytes: int) -> bytes | None:
        """The bytes of a file a run of this bot made (its ArtifactCreated event), or None when it is larger than
        `max_bytes` (the platform's limit)."""
        chunks: list[bytes] = []
        offset = 0
        while True:
            piece = await self.host.call(
                "ReadRunArtifact", hpb.ReadRunArtifactRequest(run_id=run_id, artifact_id=artifact_id, offset=offset)
            )
            if piece.artifact.size_bytes > max_bytes:
                return None
            chunks.append(piece.data)
            offset += len(piece.data)
            if piece.eof or not piece.data:
                return b"".join(chunks)

    async def runs(self, conversation_id: str, limit: int = 20) -> list[hpb.RunInfo]:
        """This bot's latest runs in a conversation, newest first."""
        reply = await self.host.call(
            "ListRuns", hpb.ListRunsRequest(bot=self.bot, conversation_id=conversation_id, limit=limit)
        )
        return list(reply.runs)


class ChannelAdapter:
    """Subclass with `manifest = ChannelManifest(...)` and `async def run(self, ctx)`; register the class with
    `agenthost_register_channels` in a module named by an `agenthost.channels` entry point."""

    manifest: ClassVar[ChannelManifest]

    async def run(self, ctx: ChannelContext) -> None:
        raise NotImplementedError
