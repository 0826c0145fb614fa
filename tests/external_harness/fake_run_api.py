"""A fake AgentRunAPIProxy on a unix socket: in-memory transcript, events, artifacts and state for one run.

Stands in for the host until the SDK's in-process host harness exists; it checks credentials like the host does
(the run token only together with the plugin secret; the tool token alone), so a bridge that forgot its
credentials, or a runner that handed out its own, fails here too.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api_pb
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.protos import runner_pb2
from agenthost.runners.sdk.api import RunAPI

HOLD_QUERY = "HOLD-UNTIL-THE-GATE-OPENS"


@dataclass
class FakeHostData:
    run_id: str = "run-1"
    conversation_id: str = "conv-1"
    bot_id: str = "bot-1"
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    plugin_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    tool_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    transcript: list[pb.TranscriptItem] = field(default_factory=list)
    events: dict[str, pb.EventRecord] = field(default_factory=dict)
    artifacts: dict[str, tuple[pb.ArtifactRef, bytes]] = field(default_factory=dict)
    state: dict[tuple[int, str], tuple[str, int]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    callers: list[str] = field(default_factory=list)  # "runner" (run token + secret) or "tool" (tool token)
    revoked: bool = False
    # A history_search for HOLD_QUERY waits on `gate` (set by the test), so a call can be caught in flight.
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)  # a held call has arrived
    held_cancelled: list[str] = field(default_factory=list)  # held calls the client cancelled (gRPC cancel)
    held_gone: asyncio.Event = field(default_factory=asyncio.Event)  # set with each entry of held_cancelled

    def add_item(self, role: str, text: str) -> pb.TranscriptItem:
        n = len(self.transcript) + 1
        item = pb.TranscriptItem(
            item_id=f"item-{n}",
            conversation_id=self.conversation_id,
            role=role,
            item_type="message",
            text=text,
            seq=n,
            cursor=f"c{n}",
            created_at=time.time(),
        )
        self.transcript.append(item)
        return item

    def add_event(self, text: str, event_id: str = "") -> pb.EventRecord:
        event_id = event_id or f"evt-{len(self.events) + 1}"
        record = pb.EventRecord(
            event_id=event_id,
            event_type="message.received",
            bot_id=self.bot_id,
            conversation_id=self.conversation_id,
            actor=pb.Actor(actor_type="user", actor_id="user-7", display_name="Ada"),
            text=text,
            seq=len(self.events) + 1,
            created_at=time.time(),
            source="cli",
        )
        self.events[event_id] = record
        return record

    def get_state(self, scope: str, key: str) -> Any:
        from agenthost.runners.sdk.events import scope_value

        value = self.state.get((scope_value(scope), key))
        return json.loads(value[0]) if value else None


class FakeRunAPI(api_grpc.AgentRunAPIProxyServicer):
    def __init__(self, data: FakeHostData) -> None:
        self.data = data

    async def _check(self, request: Any, context: grpc.aio.ServicerContext, name: str) -> None:
        meta = dict(context.invocation_metadata() or ())
        self.data.calls.append(name)
        bearer = meta.get("authorization")
        is_tool = bearer == f"Bearer {self.data.tool_token}"
        if (bearer != f"Bearer {self.data.token}" and not is_tool) or self.data.revoked:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad run token")
        if not is_tool and meta.get("x-agenthost-plugin") != self.data.plugin_secret:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "bad plugin secret")
        self.data.callers.append("tool" if is_tool else "runner")
        if request.run_id != self.data.run_id:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "token of another run")

    async def HistoryPage(self, request, context):  # noqa: N802
        await self._check(request, context, "HistoryPage")
        limit = request.limit or 50
        items = list(self.data.transcript)
        if request.direction != pb.FORWARD:
            items.reverse()
        start = int(request.cursor) if request.cursor else 0
        page = items[start : start + limit]
        more = start + limit < len(items)
        return api_pb.HistoryPageResponse(items=page, next_cursor=str(start + limit) if more else "", has_more=more)

    async def HistorySearch(self, request, context):  # noqa: N802
        await self._check(request, context, "HistorySearch")
        if request.query == HOLD_QUERY:
            self.data.held.set()
            try:
                await self.data.gate.wait()
            except asyncio.CancelledError:
                self.data.held_cancelled.append(request.query)
                self.data.held_gone.set()
                raise
        hits = [i for i in self.data.transcript if request.query.lower() in i.text.lower()]
        return api_pb.HistorySearchResponse(items=hits[: request.top_k or 10])

    async def EventGet(self, request, context):  # noqa: N802
        await self._check(request, context, "EventGet")
        if request.event_id not in self.data.events:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no event {request.event_id}")
        return self.data.events[request.event_id]

    async def ArtifactMetadata(self, request, context):  # noqa: N802
        await self._check(request, context, "ArtifactMetadata")
        if request.artifact_id not in self.data.artifacts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no artifact {request.artifact_id}")
        return self.data.artifacts[request.artifact_id][0]

    async def ArtifactReadRange(self, request, context):  # noqa: N802
        await self._check(request, context, "ArtifactReadRange")
        if request.artifact_id not in self.data.artifacts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no artifact {request.artifact_id}")
        data = self.data.artifacts[request.artifact_id][1]
        chunk = data[request.offset : request.offset + (request.length or 65536)]
        return api_pb.ArtifactChunk(
            data=chunk, offset=request.offset, eof=request.offset + len(chunk) >= len(data), size_bytes=len(data)
        )

    async def ArtifactCreate(self, request_iterator, context):  # noqa: N802
        header = None
        data = bytearray()
        async for part in request_iterator:
            if part.HasField("header"):
                header = part.header
            else:
                data += part.data
        assert header is not None
        await self._check(header, context, "ArtifactCreate")
        artifact_id = f"art-{len(self.data.artifacts) + 1}"
        ref = pb.ArtifactRef(
            artifact_id=artifact_id,
            name=header.name,
            mime_type=header.mime_type,
            size_bytes=len(data),
            run_id=self.data.run_id,
            metadata_json=header.metadata_json,
        )
        self.data.artifacts[artifact_id] = (ref, bytes(data))
        return ref

    async def StateGet(self, request, context):  # noqa: N802
        await self._check(request, context, "StateGet")
        value = self.data.state.get((request.scope, request.key))
        if value is None:
            return api_pb.StateValue(found=False)
        return api_pb.StateValue(found=True, value_json=value[0], version=value[1])

    async def StateSet(self, request, context):  # noqa: N802
        await self._check(request, context, "StateSet")
        current = self.data.state.get((request.scope, request.key))
        version = current[1] if current else 0
        if request.HasField("if_version") and request.if_version != version:
            await context.abort(grpc.StatusCode.ABORTED, "stale version")
        self.data.state[(request.scope, request.key)] = (request.value_json, version + 1)
        return api_pb.StateValue(found=True, value_json=request.value_json, version=version + 1)


class FakeHost:
    """Serves FakeRunAPI on `unix:<dir>/api.sock`; builds RunContexts wired to it."""

    def __init__(self, socket_dir: Path, data: FakeHostData | None = None) -> None:
        self.data = data or FakeHostData()
        self.address = f"unix:{socket_dir / 'api.sock'}"
        self.server: grpc.aio.Server | None = None
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> FakeHost:
        self.server = grpc.aio.server()
        api_grpc.add_AgentRunAPIProxyServicer_to_server(FakeRunAPI(self.data), self.server)
        self.server.add_insecure_port(self.address)
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.address)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.server is not None:
            await self.server.stop(grace=None)

    def api(self, *, deadline_at: float = 0.0) -> RunAPI:
        return RunAPI(
            api_grpc.AgentRunAPIProxyStub(self.channel),
            host_address=self.address,
            run_id=self.data.run_id,
            run_token=self.data.token,
            plugin_secret=self.data.plugin_secret,
            deadline_at=deadline_at,
        )

    def context(
        self, text: str, *, config: dict[str, Any] | None = None, deadline_in: float = 60.0, event_id: str = ""
    ) -> runner_pb2.AgentRunContext:
        event = self.data.add_event(text, event_id)
        return runner_pb2.AgentRunContext(
            run_id=self.data.run_id,
            trigger=runner_pb2.Trigger(type="message.received", source="cli", timestamp=time.time()),
            event=event,
            conversation=runner_pb2.Conversation(
                conversation_id=self.data.conversation_id, bot_id=self.data.bot_id, bot_name="Helper Bot"
            ),
            actor=event.actor,
            input=runner_pb2.RunInput(text=text),
            delivery=runner_pb2.Delivery(surface="cli", supports_streaming=True),
            resources=runner_pb2.Resources(apis=["history.page", "state.read", "state.write"]),
            context=runner_pb2.ContextAccess(
                conversation_id=self.data.conversation_id, has_history_before=bool(self.data.transcript)
            ),
            state_json="{}",
            runtime=runner_pb2.Runtime(deadline_at=time.time() + deadline_in, host_version="test"),
            config_json=json.dumps(config or {}),
        )

    def run_context(self, text: str, **kwargs: Any):  # -> RunContext
        from agenthost.runners.sdk.runner import RunContext

        ctx = self.context(text, **kwargs)
        return RunContext(
            context=ctx, api=self.api(deadline_at=ctx.runtime.deadline_at), tool_token=self.data.tool_token
        )
