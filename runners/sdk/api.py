"""`RunAPI`: the typed async client a runner uses to reach the host's AgentRunAPIProxy for one run.

Every call carries the run's token and the plugin's process secret, names the run, and is bounded by the run's
deadline (a call never outlives the run that made it). Failed calls raise the typed errors of `agenthost.protos.errors`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import run_api_pb2 as api_pb
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.protos.wire import APPROVAL_DEFAULT_SECONDS
from agenthost.runners.sdk.child import ChildRun, open_child_run
from agenthost.runners.sdk.events import scope_value

Direction = Literal["backward", "forward"]
Scope = Literal["run", "conversation", "actor", "binding", "runner"]

UPLOAD_CHUNK = 256 * 1024
DEFAULT_CALL_TIMEOUT = 30.0


def _direction(direction: Direction) -> pb.Direction:
    if direction == "backward":
        return pb.BACKWARD
    if direction == "forward":
        return pb.FORWARD
    raise ValueError(f"direction must be 'backward' or 'forward', not {direction!r}")


class RunAPI:
    """Constructed by the SDK for each run (`RunContext.api`); runner code does not build one itself."""

    def __init__(
        self,
        stub: api_grpc.AgentRunAPIProxyStub,
        *,
        host_address: str = "",
        run_id: str,
        run_token: str,
        plugin_secret: str = "",
        deadline_at: float,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._stub = stub
        self.run_id = run_id
        self.host_address = host_address
        self.run_token = run_token
        self.plugin_secret = plugin_secret
        # A run token is presented with the plugin process's secret; a tool token (RunContext.tool_token, what a
        # helper process such as an MCP bridge holds) alone. Built once as grpc's own Metadata: a tuple is checked
        # against the Sequence ABC and copied into a new Metadata on every call, about a tenth of a small call's
        # cost on the runner's side (benchmarks/bench_call_path.py). No call path here mutates it.
        pairs = [("authorization", f"Bearer {run_token}")]
        if plugin_secret:
            pairs.append(("x-agenthost-plugin", plugin_secret))
        self._metadata = grpc.aio.Metadata(*pairs)
        self._deadline_at = deadline_at
        self._call_timeout = call_timeout

    def _timeout(self) -> float:
        remaining = self._deadline_at - time.time() if self._deadline_at else self._call_timeout
        if remaining <= 0:
            raise errors.DeadlineExceeded(f"run {self.run_id} is past its deadline")
        return min(remaining, self._call_timeout)

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeout())
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    # ---- history and events ----

    async def history_page(
        self, *, conversation_id: str = "", cursor: str = "", direction: Direction = "backward", limit: int = 50
    ) -> api_pb.HistoryPageResponse:
        """One page of the transcript. BACKWARD (default) starts at the newest item; pass next_cursor on."""
        return await self._unary(
            self._stub.HistoryPage,
            api_pb.HistoryPageRequest(
                run_id=self.run_id,
                conversation_id=conversation_id,
                cursor=cursor,
                direction=_direction(direction),
                limit=limit,
            ),
        )

    async def history_search(
        self,
        query: str,
        *,
        conversation_id: str = "",
        roles: Iterable[str] = (),
        item_types: Iterable[str] = (),
        top_k: int = 10,
    ) -> list[pb.TranscriptItem]:
        resp = await self._unary(
            self._stub.HistorySearch,
            api_pb.HistorySearchRequest(
                run_id=self.run_id,
                conversation_id=conversation_id,
                query=query,
                roles=list(roles),
                item_types=list(item_types),
                top_k=top_k,
            ),
        )
        return list(resp.items)

    async def event_get(self, event_id: str) -> pb.EventRecord:
        return await self._unary(self._stub.EventGet, api_pb.EventGetRequest(run_id=self.run_id, event_id=event_id))

    async def event_page(
        self,
        *,
        conversation_id: str = "",
        cursor: str = "",
        direction: Direction = "backward",
        limit: int = 50,
        event_types: Iterable[str] = (),
    ) -> api_pb.EventPageResponse:
        return await self._unary(
            self._stub.EventPage,
            api_pb.EventPageRequest(
                run_id=self.run_id,
                conversation_id=conversation_id,
                cursor=cursor,
                direction=_direction(direction),
                limit=limit,
                event_types=list(event_types),
            ),
        )

    # ---- artifacts ----

    async def artifact_metadata(self, artifact_id: str) -> pb.ArtifactRef:
        return await self._unary(
            self._stub.ArtifactMetadata, api_pb.ArtifactMetadataRequest(run_id=self.run_id, artifact_id=artifact_id)
        )

    async def artifact_read_range(
        self, artifact_id: str, offset: int = 0, length: int = 64 * 1024
    ) -> api_pb.ArtifactChunk:
        return await self._unary(
            self._stub.ArtifactReadRange,
            api_pb.ArtifactReadRangeRequest(run_id=self.run_id, artifact_id=artifact_id, offset=offset, length=length),
        )

    async def artifact_read(self, artifact_id: str, offset: int = 0) -> AsyncIterator[bytes]:
        """Streams an artifact's bytes from offset to the end, in host-sized chunks."""
        call = self._stub.ArtifactRead(
            api_pb.ArtifactReadRequest(run_id=self.run_id, artifact_id=artifact_id, offset=offset),
            metadata=self._metadata,
            timeout=self._timeout(),
        )
        try:
            async for chunk in call:
                if chunk.data:
                    yield chunk.data
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def artifact_read_all(self, artifact_id: str, *, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        parts: list[bytes] = []
        total = 0
        async for data in self.artifact_read(artifact_id):
            total += len(data)
            if total > max_bytes:
                raise errors.ResourceExhausted(f"artifact {artifact_id} is larger than max_bytes={max_bytes}")
            parts.append(data)
        return b"".join(parts)

    async def artifact_create(
        self,
        data: bytes | AsyncIterable[bytes],
        *,
        name: str,
        mime_type: str = "application/octet-stream",
        metadata: dict[str, Any] | None = None,
    ) -> pb.ArtifactRef:
        """Uploads bytes (or an async stream of chunks) as a new artifact of this run's conversation."""
        header = api_pb.ArtifactHeader(
            run_id=self.run_id,
            name=name,
            mime_type=mime_type,
            metadata_json=json.dumps(metadata or {}),
            expected_size=len(data) if isinstance(data, bytes) else 0,
        )

        # Explicit writes rather than a request iterator: when the host refuses an upload midway (disk full, over
        # the cap), a write on the ended call raises the host's own status, where an iterator being drained by
        # gRPC underneath would surface as a bare INTERNAL "Internal error from Core".
        call = self._stub.ArtifactCreate(metadata=self._metadata, timeout=self._timeout())
        try:
            await call.write(api_pb.ArtifactUpload(header=header))
            if isinstance(data, bytes):
                for start in range(0, len(data), UPLOAD_CHUNK):
                    await call.write(api_pb.ArtifactUpload(data=data[start : start + UPLOAD_CHUNK]))
            else:
                async for chunk in data:
                    for start in range(0, len(chunk), UPLOAD_CHUNK):
                        await call.write(api_pb.ArtifactUpload(data=chunk[start : start + UPLOAD_CHUNK]))
            await call.done_writing()
            return await call
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    # ---- state ----

    async def state_get(self, scope: Scope, key: str, default: Any = None) -> Any:
        """The decoded JSON value, or `default` when the key is absent."""
        value = await self.state_get_versioned(scope, key)
        return json.loads(value.value_json) if value.found else default

    async def state_get_versioned(self, scope: Scope, key: str) -> api_pb.StateValue:
        return await self._unary(
            self._stub.StateGet, api_pb.StateGetRequest(run_id=self.run_id, scope=scope_value(scope), key=key)
        )

    async def state_set(self, scope: Scope, key: str, value: Any, *, if_version: int | None = None) -> int:
        """Stores a JSON value; returns its new version. With if_version, raises Aborted if another write won."""
        request = api_pb.StateSetRequest(
            run_id=self.run_id, scope=scope_value(scope), key=key, value_json=json.dumps(value)
        )
        if if_version is not None:
            request.if_version = if_version
        resp = await self._unary(self._stub.StateSet, request)
        return resp.version

    async def state_delete(self, scope: Scope, key: str) -> bool:
        resp = await self._unary(
            self._stub.StateDelete, api_pb.StateDeleteRequest(run_id=self.run_id, scope=scope_value(scope), key=key)
        )
        return resp.deleted

    async def state_list(
        self, scope: Scope, *, prefix: str = "", cursor: str = "", limit: int = 100
    ) -> api_pb.StateListResponse:
        return await self._unary(
            self._stub.StateList,
            api_pb.StateListRequest(
                run_id=self.run_id, scope=scope_value(scope), prefix=prefix, cursor=cursor, limit=limit
            ),
        )

    # ---- knowledge base ----

    async def kb_search(self, query: str, *, top_k: int = 5) -> api_pb.KbSearchResponse:
        """The bot's knowledge-base chunks that best match the query (needs the `kb` grant). `keyword_only` in the
        reply says the host searched by keywords alone (no embeddings endpoint, or it failed)."""
        return await self._unary(
            self._stub.KbSearch, api_pb.KbSearchRequest(run_id=self.run_id, query=query, top_k=top_k)
        )

    # ---- approvals ----

    async def request_approval(
        self,
        tool_name: str,
        *,
        summary: str = "",
        arguments: Any = None,
        reason: str = "",
        timeout_seconds: float = 0.0,
        tool_call_id: str = "",
    ) -> api_pb.ApprovalDecision:
        """Asks a person whether this tool call may run and waits for the answer (or the timeout: 0 = the host's
        default, capped by the run's deadline). Only `decision.approved` means yes; a timeout, a denial, a cancelled
        run all come back as not approved, with `outcome` saying which. Always granted."""
        request = api_pb.ApprovalRequest(
            run_id=self.run_id,
            tool_name=tool_name,
            summary=summary,
            arguments_json="" if arguments is None else json.dumps(arguments, ensure_ascii=False),
            reason=reason,
            timeout_seconds=timeout_seconds,
            tool_call_id=tool_call_id,
        )
        # The host answers at the timeout itself; the margin only covers the trip back.
        wait = (timeout_seconds or APPROVAL_DEFAULT_SECONDS) + 30.0
        remaining = self._deadline_at - time.time() if self._deadline_at else wait
        if remaining <= 0:
            raise errors.DeadlineExceeded(f"run {self.run_id} is past its deadline")
        try:
            return await self._stub.RequestApproval(request, metadata=self._metadata, timeout=min(wait, remaining))
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    # ---- child runs (subagents) ----

    def child_run(
        self, description: str, *, subagent_type: str = "", tool_call_id: str = "", timeout: float = 0.0
    ) -> AbstractAsyncContextManager[ChildRun]:
        """Records a subagent as a child run of this run (needs the `subagents` grant); see `sdk.child`.
        `timeout` (seconds, optional) ends it before the run's own deadline, never after."""
        remaining = self._deadline_at - time.time() if self._deadline_at else 24 * 3600.0
        if remaining <= 0:
            raise errors.DeadlineExceeded(f"run {self.run_id} is past its deadline")
        header = api_pb.ChildRunHeader(
            run_id=self.run_id,
            description=description,
            subagent_type=subagent_type,
            tool_call_id=tool_call_id,
            timeout_seconds=timeout,
        )
        # The call lives as long as the child, which the host ends at the run's deadline at the latest.
        return open_child_run(self._stub, self._metadata, header, remaining + 5.0)
