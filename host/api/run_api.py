"""The AgentRunAPIProxy servicer: every runner's only door to host data, one run at a time.

Each method authorizes through `RunRegistry.authorize`, validates its arguments against the caps below, does
its bounded read or awaited write, and is audited (allowed or refused). A refused call raises before it changes
anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message as pb_message

from agenthost.host import limits
from agenthost.host.access.grants import ActiveRun, RunRegistry
from agenthost.host.knowledge import KnowledgeBase
from agenthost.host.ops.logs import RefusalLimiter, log_limited
from agenthost.host.ops.observability import Observer
from agenthost.host.ops.tracing import CALL_RUN_ID
from agenthost.host.runs.approvals import Approvals
from agenthost.host.runs.child_runs import ChildRuns
from agenthost.host.store.artifacts import ArtifactStore
from agenthost.host.store.conversations import MAX_PAGE, MAX_TOP_K, Conversations
from agenthost.host.store.runs import AuditLog, RunStore
from agenthost.host.store.state import MAX_LIST, StateStore, check_key
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.protos.handlers import method_handlers, pass_encoded

log = logging.getLogger(__name__)
_current_run: contextvars.ContextVar[ActiveRun | None] = contextvars.ContextVar("agenthost_run", default=None)
# Whether the call being served presented its run's tool token (RunRegistry.authorize); set with _current_run.
_by_tool_token: contextvars.ContextVar[bool] = contextvars.ContextVar("agenthost_by_tool_token", default=False)
# What `_Gate` read from the metadata of the call being served (token hash, plugin secret). grpc.aio resolves a
# call's handler inside the call's own task, so the method's `authorize` sees its own call's value and does not
# convert and hash the same metadata a second time (see `RunRegistry.authorize`).
_gated: contextvars.ContextVar[tuple[str, str | bytes | None] | None] = contextvars.ContextVar(
    "agenthost_gated", default=None
)
R = TypeVar("R")

MAX_READ_RANGE = 1024 * 1024
DEFAULT_READ_RANGE = 64 * 1024
STREAM_CHUNK = 256 * 1024
MAX_QUERY_CHARS = 1000
MAX_FILTERS = 16


def _limit(value: int, default: int, cap: int, what: str) -> int:
    if value == 0:
        return default
    if value < 0 or value > cap:
        raise errors.OutOfRange(f"{what} must be between 1 and {cap}, got {value}")
    return value


def _check_offset(ref: pb.ArtifactRef, offset: int) -> None:
    if offset < 0 or offset > ref.size_bytes:
        raise errors.OutOfRange(f"offset must be between 0 and {ref.size_bytes}")


def _forward(direction: int) -> bool:
    if direction in (pb.DIRECTION_UNSPECIFIED, pb.BACKWARD):
        return False
    if direction == pb.FORWARD:
        return True
    raise errors.InvalidArgument(f"unknown direction {direction}")


class Malformed:
    """What a request that does not parse as its message type deserializes to. gRPC itself would answer such
    bytes with UNKNOWN before any handler (or the audit log) saw them; the handlers refuse this with
    INVALID_ARGUMENT instead."""

    run_id = ""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.message = f"request is not a valid {type_name}: {error}"


def _tolerant(message_class: Any) -> Callable[[bytes], Any]:
    type_name = message_class.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except pb_message.DecodeError as exc:
            return Malformed(type_name, exc)

    return deserialize


def run_api_handlers(servicer: RunAPIServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The run API's handlers by full method path, with deserializers that never raise (a malformed request
    reaches the handler, is refused with INVALID_ARGUMENT and is audited)."""
    service = api.DESCRIPTOR.services_by_name["AgentRunAPIProxy"]
    return {
        f"/{service.full_name}/{name}": handler
        for name, handler in method_handlers(
            service, servicer, deserializer=_tolerant, serializers={"HistoryPage": pass_encoded}
        ).items()
    }


def add_servicer(servicer: RunAPIServicer, server: grpc.aio.Server) -> None:
    """Like the generated add_AgentRunAPIProxyServicer_to_server, but with run_api_handlers, behind a gate that
    refuses calls without a valid run token before their request is read (see `_Gate`)."""
    server.add_generic_rpc_handlers((_Gate(servicer, run_api_handlers(servicer)),))


class _Count:
    """A number shared by reference (`_Gate`'s refusals reading, handed to `RunAPIServicer.refuse_early`)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


_NOTHING = object()  # what a request stream that ended before its first message gives `_Gate._first_read`


class _Gate(grpc.GenericRpcHandler):
    """Refuses a call whose metadata carries no valid run token as soon as it arrives, before its request message
    is read. gRPC would otherwise hold the call (and one of the server's maximum_concurrent_rpcs slots) until the
    client sent its message, which an idle client never does: a few thousand such calls from any local process
    would lock every runner out. The refusal is handed back as a client-streaming handler because that is the
    shape gRPC starts without waiting for a message; the client sees UNAUTHENTICATED either way. Everything past
    the token (run id, plugin secret, grant) is checked by the method itself once the request is in.

    A call with a valid token reads its request only while fewer than RUN_API_READS calls of this listener (one per
    plugin process) are reading theirs, each for at most RUN_API_READ_SECONDS. grpc-core keeps a message it is
    reading in memory until its last byte arrives, up to MAX_MESSAGE_BYTES: a runner opening calls that each
    declared an 8 MiB request and sent all of it but a byte held 8 MiB of the host per call (1.6 GiB for 200 calls
    on one connection, up to the listener's MAX_CONCURRENT_CALLS). A call waiting its turn has asked for no message,
    so grpc-core lets in no more than its stream's initial window (the listener probes no bandwidth-delay product
    that would widen it). A client-streaming call's first message (ChildRun's header, an upload's) is read under the
    same bound, within the method's own deadline for it; what follows is bounded by the method's caps (uploads and
    child runs in flight).

    The reads' deadline is one timer per listener, armed for the earliest read in progress (at most RUN_API_READS
    of them), not a timer per call: on the path of every call, a per-call `call_later` and its cancel (and the
    cancelled handles it leaves in the loop's heap for RUN_API_READ_SECONDS) cost more than the read itself."""

    def __init__(self, servicer: RunAPIServicer, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._servicer = servicer
        self._reads = asyncio.Semaphore(limits.RUN_API_READS)
        # Refusals of this listener reading a refused stream now (REFUSED_STREAMS_READ): per listener, so one
        # plugin's callers without a token cannot use up what tells another's expired client why it was refused.
        self._refusals_reading = _Count()
        # The unary reads in progress (their task -> when they must be in), and the ones cut for taking too long.
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._handlers = {method: self._bounded(handler) for method, handler in handlers.items()}

    def _expire_due(self) -> None:
        """The reads' timer: cancels every read past its deadline, then waits for the earliest one left."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for task, due in list(self._reading.items()):
            if due <= now:
                del self._reading[task]
                self._expired.add(task)
                task.cancel()
        if self._reading:
            self._sweep = loop.call_at(min(self._reading.values()), self._expire_due)

    async def _read(self, context: grpc.aio.ServicerContext) -> Any:
        """The call's one request, read in its turn. On the path of every call, so: `context.read` rather than the
        request iterator, and the listener's one timer (see the class) rather than `asyncio.timeout`."""
        async with self._reads:
            task = asyncio.current_task()
            assert task is not None
            loop = asyncio.get_running_loop()
            self._reading[task] = due = loop.time() + limits.RUN_API_READ_SECONDS
            if self._sweep is None:
                self._sweep = loop.call_at(due, self._expire_due)
            try:
                request = await context.read()
            except asyncio.CancelledError:
                if task not in self._expired:
                    raise
                task.uncancel()
                request = None
            finally:
                self._reading.pop(task, None)
        if task in self._expired:
            self._expired.discard(task)
            if request is not None:
                task.uncancel()  # cut as its read completed: the request is in, the cancel is void
            else:
                await errors.abort_with(
                    context,
                    errors.DeadlineExceeded(
                        f"the request did not arrive within RUN_API_READ_SECONDS = {limits.RUN_API_READ_SECONDS}s"
                    ),
                )
        if request is None or request is grpc.aio.EOF:
            await errors.abort_with(context, errors.InvalidArgument("the call carried no request message"))
        return request

    async def _requests(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """What a client-streaming method is handed: its stream, the first message read in its turn."""
        return self._first_read(request_iterator)

    async def _first_read(self, request_iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """`request_iterator` with its first message read under the bound of `_read`; no deadline of its own (the
        method's, cancelling this read, gives the call its answer)."""
        async with self._reads:
            messages = aiter(request_iterator)  # not before: grpc.aio makes its reader here, which must be run
            first = await anext(messages, _NOTHING)
        if first is _NOTHING:
            return
        yield first
        async for message in messages:
            yield message

    def _bounded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The method served request-streaming (a unary request's wire is the same), so `_read` decides when its
        request is read. A unary request goes straight to `_read`, with no wrapper between."""
        inner: Any = handler.stream_stream or handler.stream_unary or handler.unary_stream or handler.unary_unary
        codecs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        read = self._read
        requests = self._requests
        if handler.response_streaming:
            streamed = handler.request_streaming

            async def streaming(
                request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                given = await (requests(request_iterator, context) if streamed else read(context))
                async with contextlib.aclosing(inner(given, context)) as replies:
                    async for reply in replies:
                        yield reply

            return grpc.stream_stream_rpc_method_handler(streaming, **codecs)

        if handler.request_streaming:

            async def upload(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                return await inner(await requests(request_iterator, context), context)

            return grpc.stream_unary_rpc_method_handler(upload, **codecs)

        async def single(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await inner(await read(context), context)

        return grpc.stream_unary_rpc_method_handler(single, **codecs)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._handlers.get(handler_call_details.method)
        if handler is None:
            return None
        name = handler_call_details.method.rsplit("/", 1)[-1]
        try:
            _, presented, plugin_secret = self._servicer.registry.token_run(
                handler_call_details.invocation_metadata or ()
            )
        except errors.Unauthenticated as exc:
            _gated.set(None)
            refuse = functools.partial(
                self._servicer.refuse_early, name, exc, _SENT_BEFORE_A_REPLY.get(name, 0), self._refusals_reading
            )
            return grpc.stream_unary_rpc_method_handler(refuse)
        _gated.set((presented, plugin_secret))
        return handler


# Messages a well-behaved client of a client-streaming method writes before it waits for the host: ArtifactCreate's
# whole upload (None: until it half-closes), ChildRun's header. A refusal reads them first (see _drain).
_SENT_BEFORE_A_REPLY: dict[str, int | None] = {"ArtifactCreate": None, "ChildRun": 1}


async def _drain(
    request_iterator: AsyncIterator[Any],
    seconds: float = 5.0,
    messages: int | None = None,
    max_bytes: int | None = None,
) -> None:
    """Reads and discards what a client is still uploading (at most `messages`, and `max_bytes` of messages, raw or
    parsed; a message that did not parse ends it) before the call is refused. Ending a client-streaming call while
    the client still writes makes gRPC hand it a bare INTERNAL ("Internal error from Core": grpc.aio puts it in
    place of our status when its write fails) instead of our status; the client has already committed those bytes
    to the wire, so reading them costs little."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(seconds):
            read = size = 0
            async for message in request_iterator:
                read += 1
                if max_bytes is not None:
                    if isinstance(message, Malformed):
                        return
                    size += len(message) if isinstance(message, bytes) else message.ByteSize()
                if read == messages or (max_bytes is not None and size >= max_bytes):
                    return


def _run_scoped(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """A unary method of the run API: authorizes the call for the method's own name, hands the handler its
    ActiveRun, maps domain errors to statuses, and audits the outcome either way. An unexpected exception is a
    host bug: it is logged with the run id, audited and answered with INTERNAL instead of gRPC's opaque UNKNOWN."""
    method = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: RunAPIServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
        run_id = getattr(request, "run_id", "")
        try:
            if isinstance(request, Malformed):
                raise errors.InvalidArgument(request.message)
            run = self._authorize(context, run_id, method)
            result = await fn(self, run, request)
        except Exception as exc:
            await self._refuse(context, run_id, method, exc)
            raise  # unreachable: abort raises
        self.audit.record(run_id, run.plugin_id, method, "OK")
        self.observer.api_call(method, "OK")
        return result

    return wrapper


async def _first_header(messages: AsyncIterator[Any], method: str) -> Any:
    """The first message of a client stream that opens with a `header` part (ArtifactCreate, ChildRun), read under
    UPLOAD_HEADER_SECONDS: a stream that never sends it must not hold a server slot."""
    try:
        async with asyncio.timeout(limits.UPLOAD_HEADER_SECONDS):
            first = await anext(messages, None)
    except TimeoutError:
        raise errors.DeadlineExceeded(
            f"the {method} header did not arrive within UPLOAD_HEADER_SECONDS = {limits.UPLOAD_HEADER_SECONDS}s"
        ) from None
    if isinstance(first, Malformed):
        raise errors.InvalidArgument(first.message)
    if first is None or first.WhichOneof("part") != "header":
        raise errors.InvalidArgument(f"the first {method} message must be the header")
    return first


class RunAPIServicer(api_grpc.AgentRunAPIProxyServicer):
    def __init__(
        self,
        registry: RunRegistry,
        runs: RunStore,
        conversations: Conversations,
        artifacts: ArtifactStore,
        state: StateStore,
        audit: AuditLog,
        observer: Observer | None = None,
        knowledge: KnowledgeBase | None = None,
        approvals: Approvals | None = None,
        children: ChildRuns | None = None,
        worker_of: Callable[[grpc.aio.ServicerContext], str] | None = None,
    ) -> None:
        """`worker_of`: for the run API served to runner workers (host/workers/hub.py), the name of the worker a
        call came from (its certificate); such a call reaches only runs placed on that worker."""
        self.registry = registry
        self.worker_of = worker_of
        self.approvals = approvals
        self.children = children
        self.knowledge = knowledge
        self.observer = observer or Observer()
        self.runs = runs
        self.conversations = conversations
        self.artifacts = artifacts
        self.state = state
        self.audit = audit
        # Uploads in flight, host-wide and by presented token (limits.MAX_CONCURRENT_UPLOADS, MAX_UPLOADS_PER_RUN).
        self._uploads = 0
        self._uploads_by_token: dict[str, int] = {}
        self._internal_lines = RefusalLimiter()

    async def refuse_early(
        self,
        method: str,
        error: errors.AgentHostError,
        sent_before_a_reply: int | None,
        reading: _Count,
        request_iterator: Any,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """The behaviour `_Gate` hands a call it refuses on its metadata alone: audited and ended. A client-streaming
        call's opening messages are read first (a client whose token expired with its run gets UNAUTHENTICATED, not
        the bare INTERNAL of a write cut short), but only by REFUSED_STREAMS_READ refusals at a time of one listener
        (`reading`: its gate's count), each for at
        most 5 s and REFUSED_STREAM_READ_BYTES: beyond that a refusal ends the call at once, so callers without a
        token hold next to nothing (a caller uploading at full speed had the host read ~400 MiB a refusal)."""
        self.audit.record("", "", method, error.code.name, error.message)
        self.observer.api_call(method, error.code.name)
        if sent_before_a_reply != 0 and reading.n < limits.REFUSED_STREAMS_READ:
            reading.n += 1
            try:
                # The gate's refusal has no deserializer: its messages are raw bytes, counted as they come.
                await _drain(request_iterator, messages=sent_before_a_reply, max_bytes=limits.REFUSED_STREAM_READ_BYTES)
            finally:
                reading.n -= 1
        await errors.abort_with(context, error)

    async def _refuse(self, context: grpc.aio.ServicerContext, run_id: str, method: str, exc: Exception) -> None:
        """Ends a failed call, audited either way: a domain error with its own status; anything else is a host bug,
        logged with the run id and answered INTERNAL rather than gRPC's opaque UNKNOWN. Raises (abort does)."""
        if isinstance(exc, errors.AgentHostError):
            self.audit.record(run_id, self._caller(context), method, exc.code.name, exc.message)
            self.observer.api_call(method, exc.code.name)
            await errors.abort_with(context, exc)
        # A runner that found such a bug can call it again and again: the traceback a few times a minute, then counted.
        log_limited(
            self._internal_lines,
            log,
            f"run_api_internal:{method}",
            logging.ERROR,
            "run API %s failed for run %s",
            method,
            run_id[:128],
            exc_info=exc,
        )
        self.audit.record(run_id, self._caller(context), method, "INTERNAL", f"{type(exc).__name__}: {exc}")
        self.observer.api_call(method, "INTERNAL")
        await errors.abort_with(context, errors.Internal(f"the host failed to serve {method}; see its log"))

    def _caller(self, context: grpc.aio.ServicerContext) -> str:
        active = _current_run.get()
        if active is not None:
            return active.plugin_id
        return f"worker:{self.worker_of(context)}" if self.worker_of is not None else ""

    def _authorize(self, context: grpc.aio.ServicerContext, run_id: str, method: str) -> ActiveRun:
        CALL_RUN_ID.set(run_id if isinstance(run_id, str) else "")  # for the call's span (ops.tracing)
        gated = _gated.get()
        run, by_tool_token = self.registry.authorize(
            () if gated is not None else context.invocation_metadata() or (),
            run_id,
            method,
            lambda rid: self.runs.get(rid) is not None,
            worker=self.worker_of(context) if self.worker_of is not None else "",
            gated=gated,
        )
        _current_run.set(run)  # each RPC runs in its own task, so this is per call; read for the audit row
        _by_tool_token.set(by_tool_token)
        return run

    # ---- history and events ----

    @_run_scoped
    async def HistoryPage(self, run: ActiveRun, request: api.HistoryPageRequest) -> bytes:
        """Answered with the serialized HistoryPageResponse, made of the items as stored (pass_encoded sends it)."""
        conversation = run.conversation(request.conversation_id)
        limit = _limit(request.limit, 50, MAX_PAGE, "limit")
        return self.conversations.page_history_message(
            run.bot_id,
            conversation,
            cursor=request.cursor,
            forward=_forward(request.direction),
            limit=limit,
            through_event=run.horizon(conversation),
        )

    @_run_scoped
    async def HistorySearch(self, run: ActiveRun, request: api.HistorySearchRequest) -> api.HistorySearchResponse:
        conversation = run.conversation(request.conversation_id)
        top_k = _limit(request.top_k, 10, MAX_TOP_K, "top_k")
        if len(request.query) > MAX_QUERY_CHARS:
            raise errors.InvalidArgument(f"query is longer than {MAX_QUERY_CHARS} characters")
        if len(request.roles) > MAX_FILTERS or len(request.item_types) > MAX_FILTERS:
            raise errors.InvalidArgument(f"at most {MAX_FILTERS} role and item type filters")
        items = self.conversations.search(
            run.bot_id,
            conversation,
            request.query,
            roles=list(request.roles),
            item_types=list(request.item_types),
            top_k=top_k,
            through_event=run.horizon(conversation),
        )
        return api.HistorySearchResponse(items=items)

    @_run_scoped
    async def EventGet(self, run: ActiveRun, request: api.EventGetRequest) -> pb.EventRecord:
        if not request.event_id or len(request.event_id) > 128:
            raise errors.InvalidArgument("event_id must be 1-128 characters")
        event = self.conversations.get_event(request.event_id)
        if event is None:
            raise errors.NotFound(f"no event {request.event_id!r}")
        if not run.may_read(event.bot_id, event.conversation_id):
            raise errors.PermissionDenied("that event belongs to a conversation this run may not read")
        horizon = run.horizon(event.conversation_id)
        if horizon is not None and event.seq > horizon:
            raise errors.NotFound(f"no event {request.event_id!r}")  # queued behind this run: its future
        return event

    @_run_scoped
    async def EventPage(self, run: ActiveRun, request: api.EventPageRequest) -> api.EventPageResponse:
        conversation = run.conversation(request.conversation_id)
        limit = _limit(request.limit, 50, MAX_PAGE, "limit")
        if len(request.event_types) > MAX_FILTERS:
            raise errors.InvalidArgument(f"at most {MAX_FILTERS} event type filters")
        page = self.conversations.page_events(
            run.bot_id,
            conversation,
            cursor=request.cursor,
            forward=_forward(request.direction),
            limit=limit,
            event_types=list(request.event_types),
            through_event=run.horizon(conversation),
        )
        return api.EventPageResponse(events=page.items, next_cursor=page.next_cursor, has_more=page.has_more)

    # ---- artifacts ----

    def _artifact(self, run: ActiveRun, artifact_id: str) -> pb.ArtifactRef:
        if not artifact_id or len(artifact_id) > 128:
            raise errors.InvalidArgument("artifact_id must be 1-128 characters")
        found = self.artifacts.get(artifact_id)
        if found is None:
            raise errors.NotFound(f"no artifact {artifact_id!r}")
        ref, bot_id = found
        if not run.may_read(bot_id, ref.conversation_id):
            raise errors.PermissionDenied("that artifact belongs to a conversation this run may not read")
        return ref

    @_run_scoped
    async def ArtifactMetadata(self, run: ActiveRun, request: api.ArtifactMetadataRequest) -> pb.ArtifactRef:
        return self._artifact(run, request.artifact_id)

    @_run_scoped
    async def ArtifactReadRange(self, run: ActiveRun, request: api.ArtifactReadRangeRequest) -> api.ArtifactChunk:
        ref = self._artifact(run, request.artifact_id)
        length = _limit(int(request.length), DEFAULT_READ_RANGE, MAX_READ_RANGE, "length")
        _check_offset(ref, request.offset)
        data = self.artifacts.read(ref.sha256, request.offset, length)
        return api.ArtifactChunk(
            data=data,
            offset=request.offset,
            eof=request.offset + len(data) >= ref.size_bytes,
            size_bytes=ref.size_bytes,
        )

    async def ArtifactRead(
        self, request: api.ArtifactReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api.ArtifactChunk]:
        try:
            if isinstance(request, Malformed):
                raise errors.InvalidArgument(request.message)
            run = self._authorize(context, request.run_id, "ArtifactRead")
            ref = self._artifact(run, request.artifact_id)
            _check_offset(ref, request.offset)
        except Exception as exc:
            await self._refuse(context, request.run_id, "ArtifactRead", exc)
            return
        self.audit.record(request.run_id, run.plugin_id, "ArtifactRead", "OK")
        self.observer.api_call("ArtifactRead", "OK")
        offset = request.offset
        while True:
            data = self.artifacts.read(ref.sha256, offset, STREAM_CHUNK)
            eof = offset + len(data) >= ref.size_bytes
            yield api.ArtifactChunk(data=data, offset=offset, eof=eof, size_bytes=ref.size_bytes)
            offset += len(data)
            if eof or not data:
                return

    async def ArtifactCreate(
        self, request_iterator: AsyncIterator[api.ArtifactUpload], context: grpc.aio.ServicerContext
    ) -> pb.ArtifactRef:
        try:
            # A slot is counted against a live run's token, looked up before anything is taken: the workers port
            # has no gate in front (a worker presenting a forged token per call held every host-wide slot). An
            # upload holds a temp file, a descriptor and a task, so how many may be open at once is capped before
            # anything is read (and without waiting).
            _, slot, _ = self.registry.token_run(tuple(context.invocation_metadata() or ()))
            if self._uploads >= limits.MAX_CONCURRENT_UPLOADS:
                raise errors.ResourceExhausted(
                    f"the host has MAX_CONCURRENT_UPLOADS = {limits.MAX_CONCURRENT_UPLOADS} uploads in flight; retry"
                )
            if self._uploads_by_token.get(slot, 0) >= limits.MAX_UPLOADS_PER_RUN:
                raise errors.ResourceExhausted(
                    f"this run has MAX_UPLOADS_PER_RUN = {limits.MAX_UPLOADS_PER_RUN} uploads in flight"
                )
        except errors.AgentHostError as exc:
            await self._refuse(context, "", "ArtifactCreate", exc)
            raise
        self._uploads += 1
        self._uploads_by_token[slot] = self._uploads_by_token.get(slot, 0) + 1
        try:
            return await self._artifact_create(request_iterator, context)
        finally:
            self._uploads -= 1
            left = self._uploads_by_token.pop(slot) - 1
            if left:
                self._uploads_by_token[slot] = left

    async def _artifact_create(
        self, request_iterator: AsyncIterator[api.ArtifactUpload], context: grpc.aio.ServicerContext
    ) -> pb.ArtifactRef:
        run_id = ""
        messages = aiter(request_iterator)
        try:
            first = await _first_header(messages, "ArtifactCreate")
            header = first.header
            run_id = header.run_id
            run = self._authorize(context, header.run_id, "ArtifactCreate")

            async def chunks() -> AsyncIterator[bytes]:
                while True:
                    try:
                        async with asyncio.timeout(limits.UPLOAD_IDLE_SECONDS):
                            message = await anext(messages)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        raise errors.DeadlineExceeded(
                            f"no upload data for UPLOAD_IDLE_SECONDS = {limits.UPLOAD_IDLE_SECONDS}s;"
                            " nothing was stored"
                        ) from None
                    if isinstance(message, Malformed):
                        raise errors.InvalidArgument(message.message)
                    if message.WhichOneof("part") != "data":
                        raise errors.InvalidArgument("only data messages may follow the header")
                    yield message.data
                # grpc.aio ends the request iterator the same way whether the client half-closed or gRPC failed
                # the call underneath (a message over the size cap, a broken connection), so a cut upload would
                # look complete. Sending the initial metadata fails on a dead call: the upload is discarded.
                try:
                    await context.send_initial_metadata(())
                except asyncio.CancelledError:
                    raise errors.Cancelled("the upload was cut before it ended; nothing was stored") from None

            ref = await self.artifacts.create(
                chunks(),
                name=header.name,
                mime_type=header.mime_type,
                metadata_json=header.metadata_json or "{}",
                bot_id=run.bot_id,
                conversation_id=run.conversation_id,
                run_id=run.run_id,
                expected_size=header.expected_size,
            )
        except Exception as exc:
            # A client still writing gets our status only if we read what it sent (see _drain); one that went
            # quiet (a deadline) or whose call is gone has nothing to read.
            if isinstance(exc, errors.AgentHostError) and not isinstance(
                exc, (errors.Cancelled, errors.DeadlineExceeded)
            ):
                # The whole upload, for the drain's 5 s at most: a polite client refused mid-upload (its quota, a
                # full disk) must hear why, and one cut after a byte cap is told a bare INTERNAL instead.
                await _drain(request_iterator)
            await self._refuse(context, run_id, "ArtifactCreate", exc)
            raise
        self.audit.record(run_id, run.plugin_id, "ArtifactCreate", "OK", ref.artifact_id)
        self.observer.api_call("ArtifactCreate", "OK")
        return ref

    # ---- state ----

    @_run_scoped
    async def StateGet(self, run: ActiveRun, request: api.StateGetRequest) -> api.StateValue:
        scope_key = run.scope_key(request.scope)
        check_key(request.key)
        stored = self.state.get(scope_key, request.key)
        if stored is None:
            return api.StateValue(found=False)
        return api.StateValue(
            found=True, value_json=stored.value_json, version=stored.version, updated_at=stored.updated_at
        )

    @_run_scoped
    async def StateSet(self, run: ActiveRun, request: api.StateSetRequest) -> api.StateValue:
        scope_key = run.scope_key(request.scope)
        if_version = request.if_version if request.HasField("if_version") else None
        stored = await self.state.set(scope_key, request.key, request.value_json, if_version)
        return api.StateValue(
            found=True, value_json=stored.value_json, version=stored.version, updated_at=stored.updated_at
        )

    @_run_scoped
    async def StateDelete(self, run: ActiveRun, request: api.StateDeleteRequest) -> api.StateDeleteResponse:
        return api.StateDeleteResponse(deleted=await self.state.delete(run.scope_key(request.scope), request.key))

    @_run_scoped
    async def StateList(self, run: ActiveRun, request: api.StateListRequest) -> api.StateListResponse:
        scope_key = run.scope_key(request.scope)
        limit = _limit(request.limit, MAX_LIST, MAX_LIST, "limit")
        if len(request.prefix) > 256 or len(request.cursor) > 256:
            raise errors.InvalidArgument("prefix and cursor are at most 256 characters")
        keys, has_more = self.state.list(scope_key, request.prefix, request.cursor, limit)
        return api.StateListResponse(keys=keys, next_cursor=keys[-1] if has_more else "", has_more=has_more)

    # ---- knowledge base ----

    @_run_scoped
    async def KbSearch(self, run: ActiveRun, request: api.KbSearchRequest) -> api.KbSearchResponse:
        if self.knowledge is None:
            raise errors.Unavailable("this host serves no knowledge base")
        # Always the run's own bot: the request cannot name another.
        return await self.knowledge.search(run.bot_id, request.query, request.top_k)

    # ---- approvals ----

    @_run_scoped
    async def RequestApproval(self, run: ActiveRun, request: api.ApprovalRequest) -> api.ApprovalDecision:
        if self.approvals is None:
            raise errors.Unavailable("this host serves no approvals")
        # Always the caller's own run: authorize() refused any other run id before this line. With the tool token,
        # the caller is whatever runs in the run's sandbox (a harness, or a command the model ran): the request is
        # marked so, for the person who reads it.
        return await self.approvals.request(run, request, from_sandbox=_by_tool_token.get())

    # ---- child runs (subagents) ----

    async def ChildRun(
        self, request_iterator: AsyncIterator[api.ChildRunRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api.ChildRunReply]:
        run_id = ""
        messages = aiter(request_iterator)
        try:
            first = await _first_header(messages, "ChildRun")
            run_id = first.header.run_id
            run = self._authorize(context, run_id, "ChildRun")
            if self.children is None:
                raise errors.Unavailable("this host records no child runs")
            child = await self.children.open(run, first.header)
        except Exception as exc:
            await self._refuse(context, run_id, "ChildRun", exc)
            return
        info = child.st.info
        self.audit.record(run_id, run.plugin_id, "ChildRun", "OK", info.run_id)
        self.observer.api_call("ChildRun", "OK")
        error: errors.AgentHostError | None = None
        try:
            yield api.ChildRunReply(started=api.ChildRunStarted(child_run_id=info.run_id, deadline_at=info.deadline_at))
            error = await self.children.stream(child, messages)
        except (asyncio.CancelledError, GeneratorExit):
            self.children.runner_cancelled(child)
            raise
        finally:
            ending = self.children.end(child)
        await asyncio.shield(ending)
        if error is not None:  # the runner broke the protocol: refused like any bad request
            await errors.abort_with(context, error)
            return
        # Every recorded end, the host's own (a cancel request, the parent's end, the deadline) included, is told
        # in-band and the call ends OK: a status sent while the runner writes can reach it as INTERNAL (child_runs).
        yield api.ChildRunReply(
            finished=api.ChildRunFinished(
                child_run_id=info.run_id,
                status=info.status,
                error_code=info.error_code,
                error_message=info.error_message,
                usage=info.usage,
            )
        )
