"""The gateway's HTTP server: aiohttp's web server on the host's own event loop.

aiohttp rather than an ASGI framework under uvicorn: it is a well-kept asyncio server meant to be embedded
(AppRunner/TCPSite start and stop inside a running loop), so the gateway needs no second loop, thread or process,
and its handlers await the host's objects directly. Importing this module imports aiohttp; the host does so only
when the gateway is enabled.

Runs do not belong to HTTP clients, as on the gRPC side: a client that disconnects mid-stream only unsubscribes,
and the run goes on to its end and is recorded (read it with `agenthost runs get`). Every error that comes after a
run started says `x-should-retry: false`, so a client's automatic retry never sends the same message twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from aiohttp import web

from agenthost.host import limits
from agenthost.host.access.credentials import Principal
from agenthost.host.api import access
from agenthost.host.api.gateway import bodies, parse_address
from agenthost.host.api.gateway import openai_api as oa
from agenthost.host.api.gateway.connections import CLIENTS, CappedSite, gateway_clients, openai_refusal
from agenthost.host.api.gateway.errors import NO_RETRY, GatewayError, bad_request, from_host_error, model_not_found
from agenthost.host.api.gateway.sse import EventStream, comment, encode
from agenthost.host.runs import attachments as attachment_checks
from agenthost.host.runs.manager import MAX_INPUT_BYTES
from agenthost.host.store.runs import RunStore
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.listeners import RETRY_SECONDS, Network, Refused
from agenthost.protos.wire import IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_RULE, accepted_run

if TYPE_CHECKING:
    from agenthost.host.api.gateway.console_api import Console
    from agenthost.host.api.services import HostServices

log = logging.getLogger(__name__)

# A chat client resends the whole history with every request; the host uses only the last message (at most
# runs.MAX_INPUT_BYTES of text and limits.ATTACHMENTS_MAX_BYTES_PER_MESSAGE of images, which travel base64-encoded:
# 4/3 of their size), so this bounds what one request may make the gateway read and parse.
MAX_BODY_BYTES = 12 * 1024 * 1024
SHUTDOWN_SECONDS = 5.0
CONVERSATION_HEADER = "X-Agenthost-Conversation"
RUN_HEADER = "X-Agenthost-Run"
# The client's name for this message (SendMessageRequest.idempotency_key): a request repeated with the same key, by
# the same key holder to the same bot, gets the first one's run, never a second (docs/operating/standby.md).
IDEMPOTENCY_HEADER = "Idempotency-Key"
OPEN_RETRY_SECONDS = 1
# The name of the key whose open-request slot a request holds (Gateway._take_open_slot).
_OPEN_SLOT = web.RequestKey("open_slot", str)
SOURCE = "gateway"
# Printable ASCII but '%': conversation ids travel percent-encoded (UTF-8) in both directions.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    def __init__(self, host: HostServices, address: str, trusted_proxies: tuple[Network, ...] = ()) -> None:
        self.host = host
        self.clients = gateway_clients(trusted_proxies)
        self.bind, self.port = parse_address(address)
        self._runner: web.AppRunner | None = None
        self.console: Console | None = None
        self.body_slots = bodies.BodySlots()
        self.open_by_key: dict[str, int] = {}  # requests open per non-admin key (GATEWAY_MAX_OPEN_REQUESTS_PER_KEY)

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[self._client, self._open_requests, self._errors]
        )
        app[bodies.SLOTS] = self.body_slots
        app[CLIENTS] = self.clients
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        self._mount_console(app)
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=SHUTDOWN_SECONDS,
            # aiohttp arms this when a connection opens and after each response, and closes a connection that has
            # not sent a whole request head by then: the request-head (slowloris) timeout.
            keepalive_timeout=limits.GATEWAY_HEADER_SECONDS,
            logger=self.clients.server_log,
        )
        await runner.setup()
        try:
            site = CappedSite(
                runner, self.bind, self.port, clients=self.clients, render=openai_refusal, reuse_address=True
            )
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        if not _loopback(self.bind):
            log.warning(
                "the HTTP gateway listens on %s in plain HTTP: its bearer keys cross the network unencrypted; "
                "put a TLS-terminating proxy in front of it",
                self.address,
            )

    def _mount_console(self, app: web.Application) -> None:
        """The web console under /console/ (console_api): the admin surface for a browser."""
        from agenthost.host.api.gateway.console_api import PREFIX, Console

        async def to_console(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(f"{PREFIX}/")

        self.console = Console(self.host)
        app.router.add_get(PREFIX, to_console)
        app.add_subapp(PREFIX, self.console.app())

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.body_slots.close()

    # ---- cross-cutting ----

    @web.middleware
    async def _client(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Who the request's client is (connections.Clients: its caps, behind a trusted proxy); a connection whose
        request showed no valid key is closed after its response, so it cannot be held with cheap requests."""
        try:
            client = self.clients.request(request)
        except Refused as exc:
            refused = _error_response(
                GatewayError(
                    429,
                    exc.message,
                    type="rate_limit_error",
                    code=exc.code,
                    headers={"retry-after": str(RETRY_SECONDS)},
                )
            )
            refused.force_close()
            return refused
        response = await handler(request)
        if not client.authenticated:
            response.force_close()
        return response

    @web.middleware
    async def _open_requests(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Gives back the key's open-request slot (_principal took it) once the response has ended, however."""
        try:
            return await handler(request)
        finally:
            name = request.get(_OPEN_SLOT)
            if name is not None:
                left = self.open_by_key[name] - 1
                if left:
                    self.open_by_key[name] = left
                else:
                    del self.open_by_key[name]

    def _take_open_slot(self, request: web.Request, principal: Principal) -> None:
        """One of the key's GATEWAY_MAX_OPEN_REQUESTS_PER_KEY, held to the end of the response (an admin key is
        trusted and takes none)."""
        if principal.is_admin:
            return
        held = self.open_by_key.get(principal.name, 0)
        cap = limits.GATEWAY_MAX_OPEN_REQUESTS_PER_KEY
        if held >= cap:
            raise GatewayError(
                429,
                f"request refused: this key has {held} requests open on the gateway (GATEWAY_MAX_OPEN_REQUESTS_PER_KEY"
                f" = {cap}); finish or close one, then retry",
                type="rate_limit_error",
                code="too_many_open_requests",
                headers={"retry-after": str(OPEN_RETRY_SECONDS)},
            )
        self.open_by_key[principal.name] = held + 1
        request[_OPEN_SLOT] = principal.name

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            return _error_response(exc)
        except errors.AgentHostError as exc:
            return _error_response(from_host_error(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error_response(bodies.too_large(MAX_BODY_BYTES))
        except web.HTTPException as exc:  # no such route, wrong method
            if exc.status < 400:
                raise
            return _error_response(GatewayError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_")))
        except Exception:
            log.exception("gateway: %s %s failed", request.method, request.path)
            # A run may have started before the bug struck: no automatic retry.
            return _error_response(
                GatewayError(500, "internal error in the gateway", type="server_error", headers=dict(NO_RETRY))
            )

    def _principal(self, request: web.Request) -> Principal:
        value = request.headers.get("Authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise GatewayError(
                401,
                "missing API key: send `Authorization: Bearer <key>` with a key made by "
                "`agenthost credentials create NAME --scope send --bot BOT`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            principal = self.host.credentials.authenticate((("authorization", f"Bearer {token.strip()}"),))
        except errors.Unauthenticated:
            raise GatewayError(
                401,
                "the API key is not valid (unknown, or revoked)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            ) from None
        self.clients.authenticated(request)
        self._take_open_slot(request, principal)
        return principal

    def _bot(self, principal: Principal, model: str) -> hpb.Bot:
        try:
            bot = self.host.registry.bot(model)
        except (errors.NotFound, errors.InvalidArgument):
            raise model_not_found(model) from None
        if not principal.may_use(bot.bot_id):
            raise model_not_found(model)
        return bot

    def _conversation(self, request: web.Request, principal: Principal, user: str, bot_id: str) -> str:
        """The header names a conversation outright (one this key started, unless it may use them all:
        access.send). Failing that, OpenAI's `user` (documented as a stable id of the end user) gives each end user
        of this key one continuing conversation with the bot, namespaced by the key, so two applications' "alice"
        never share a history (nor a memory: Principal.actor). With neither, each request is a conversation of its
        own; the reply's header names it, so the client can continue it. A request with an Idempotency-Key names
        its own conversation by that key, in the caller's namespace, so that it is the same one when sent again
        (the host refuses a key sent again into another conversation) and no other sender can take it first. A
        key this caller sent before that name (when it was `conv_<hash>`) keeps its run's conversation, so its
        retry follows that run instead of being refused as another message."""
        header = request.headers.get(CONVERSATION_HEADER)
        if header is not None:
            try:
                conversation = unquote(header, errors="strict") if "%" in header else header
            except UnicodeDecodeError:
                raise bad_request(f"{CONVERSATION_HEADER} is not percent-encoded UTF-8") from None
            if not conversation:
                raise bad_request(f"{CONVERSATION_HEADER} is empty")
            return conversation
        if user:
            return principal.user_conversation(user)
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if IDEMPOTENCY_KEY.fullmatch(key):  # a malformed one is refused in _send_request
            # In the key's own namespace (user:<key>/…), which no other sender may start (Principal.start_refusal):
            # a name anyone could compute from a key's name and a guessable Idempotency-Key (order-1234) let another
            # key start it first, locking the key's request out for good, and tell by 403 or 200 whether it was sent.
            named = hashlib.sha256(b"\0".join((principal.name.encode(), key.encode()))).hexdigest()[:32]
            # Only this caller's own run with this key (by_key: per bot and sender) brings the old name back:
            # another sender that took `conv_<hash>` first gains nothing.
            earlier = RunStore.by_key(self.host.run_store.db.reader, bot_id, principal.name, key)
            if earlier is not None and earlier[1] == f"conv_{named}":
                return earlier[1]
            return principal.user_conversation(f"idempotency:{named}")
        return f"conv_{uuid.uuid4().hex}"

    def _send_request(
        self,
        request: web.Request,
        principal: Principal,
        bot: hpb.Bot,
        conversation: str,
        text: str,
        user: str,
        endpoint: str,
        attachments: tuple[hpb.Attachment, ...] = (),
    ) -> hpb.SendMessageRequest:
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if IDEMPOTENCY_HEADER in request.headers and not IDEMPOTENCY_KEY.fullmatch(key):
            raise GatewayError(
                400, f"the {IDEMPOTENCY_HEADER} header must be {IDEMPOTENCY_KEY_RULE}", code="invalid_idempotency_key"
            )
        if len(text.encode()) > MAX_INPUT_BYTES:
            # Not the host's RESOURCE_EXHAUSTED (429): a retry cannot help a message that is too large.
            raise GatewayError(413, f"the message is larger than {MAX_INPUT_BYTES} bytes", code="message_too_large")
        try:
            attachment_checks.check(list(attachments))  # the host checks again; here a size is a 413, not a 429
        except errors.ResourceExhausted as exc:
            raise GatewayError(413, exc.message, code="message_too_large") from None
        return hpb.SendMessageRequest(
            attachments=attachments,
            bot=bot.bot_id,
            conversation_id=conversation,
            text=text,
            source=SOURCE,
            # The end user's id: access.send puts a send key's in the key's namespace (Principal.actor).
            actor=pb.Actor(actor_type="user", actor_id=user),
            data_json=json.dumps({"gateway": {"endpoint": endpoint, "credential": principal.name}}),
            idempotency_key=key,
        )

    async def _start(
        self, send: hpb.SendMessageRequest, principal: Principal
    ) -> tuple[hpb.RunInfo, AsyncGenerator[hpb.SendMessageReply, None]]:
        """Records the message and starts its run; a refusal here is an HTTP error with no run behind it. The run and
        its message event record the gateway key's credential as their sender, and its rules apply, as SendMessage's
        do for gRPC callers: both go through access.send."""
        stream = access.send(self.host.runs, principal, send)
        try:
            first = await anext(stream)
        except BaseException:
            await stream.aclose()
            raise
        return accepted_run(first), _queue_notes(first, stream)

    # ---- endpoints ----

    async def models(self, request: web.Request) -> web.StreamResponse:
        principal = self._principal(request)
        bots = [b for b in self.host.registry.bots() if principal.may_use(b.bot_id)]
        return web.json_response({"object": "list", "data": [_model_object(b) for b in bots]})

    async def model(self, request: web.Request) -> web.StreamResponse:
        principal = self._principal(request)
        return web.json_response(_model_object(self._bot(principal, request.match_info["model"])))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        principal = self._principal(request)
        chat = await bodies.json_object(request, MAX_BODY_BYTES, key=principal.name, then=oa.parse_chat)
        bot = self._bot(principal, chat.model)
        conversation = self._conversation(request, principal, chat.user, bot.bot_id)
        endpoint = "chat.completions"
        send = self._send_request(
            request, principal, bot, conversation, chat.text, chat.user, endpoint, chat.attachments
        )
        run, stream = await self._start(send, principal)
        headers = _run_headers(run)
        async with contextlib.aclosing(stream):
            if chat.stream:
                return await self._stream_chat(request, run, stream, chat, headers)
            finished, text, terminal = await _collect(run, stream, headers)
        if finished.status != "completed":
            raise _run_failed(finished, headers)
        return web.json_response(
            oa.chat_completion(finished, chat.model, text, oa.finish_reason(terminal)), headers=headers
        )

    async def _stream_chat(
        self,
        request: web.Request,
        run: hpb.RunInfo,
        stream: AsyncGenerator[hpb.SendMessageReply, None],
        chat: oa.ChatRequest,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        sse = EventStream(request, headers)
        chunks = oa.ChatChunks(run, chat.model, chat.include_usage)
        text = oa.TextAssembler()
        terminal: pb.RunEvent | None = None
        try:
            await sse.open()
            await sse.send([encode(chunks.role())])
            try:
                async for reply in stream:
                    kind = reply.WhichOneof("kind")
                    note = queue_note(reply)
                    if note is not None:
                        await sse.send([note])
                    elif kind == "events":
                        out = []
                        for event in reply.events.events:
                            if event.WhichOneof("kind") in ("completed", "failed"):
                                terminal = event
                            delta = text.feed(event)
                            if delta:
                                out.append(encode(chunks.content(delta)))
                        await sse.send(out)
                    elif kind == "run_finished":
                        finished = reply.run_finished
                        if finished.status == "completed":
                            tail = []
                            if not text.text and finished.text:  # a repeated Idempotency-Key's ended run
                                tail.append(encode(chunks.content(finished.text)))
                            tail.append(encode(chunks.finish(oa.finish_reason(terminal))))
                            usage = chunks.usage(finished.usage)
                            if usage is not None:
                                tail.append(encode(usage))
                            tail.append(encode("[DONE]"))
                            await sse.send(tail)
                        else:
                            error = _run_failed(finished, headers)
                            await sse.send([encode(error.body())])
            except errors.ResourceExhausted as exc:  # this client fell too far behind and was dropped
                await sse.send([encode({"error": _dropped(exc).body()["error"]})])
            await sse.close()
        except (ConnectionError, TimeoutError) as exc:
            log.info(
                "gateway: client of run %s went away mid-stream (%s); the run goes on", run.run_id, type(exc).__name__
            )
        return sse.response

    async def responses(self, request: web.Request) -> web.StreamResponse:
        principal = self._principal(request)
        req = await bodies.json_object(request, MAX_BODY_BYTES, key=principal.name, then=oa.parse_responses)
        previous = ""
        if req.previous_response_id:
            # The run behind the previous response is the mapping: (bot, conversation) are recorded on it, in the
            # same transaction that accepted its message. A response this key may not see (of a bot it may not use,
            # or one another sender started) does not exist, as on the gRPC side.
            try:
                prior = access.run(self.host.run_store, principal, req.previous_response_id)
            except errors.NotFound:
                raise GatewayError(
                    404,
                    f"no response {oa.response_id(req.previous_response_id)!r}",
                    param="previous_response_id",
                    code="previous_response_not_found",
                ) from None
            previous = oa.response_id(prior.run_id)
            bot = self._bot(principal, prior.bot_id)
            if req.model and self._bot(principal, req.model).bot_id != bot.bot_id:
                raise bad_request("model names another bot than previous_response_id's", "model")
            named = request.headers.get(CONVERSATION_HEADER)
            if named is not None and self._conversation(request, principal, "", bot.bot_id) != prior.conversation_id:
                raise bad_request(f"{CONVERSATION_HEADER} names another conversation than previous_response_id's")
            conversation = prior.conversation_id
        else:
            bot = self._bot(principal, req.model)
            conversation = self._conversation(request, principal, req.user, bot.bot_id)
        model = req.model or bot.name
        send = self._send_request(
            request, principal, bot, conversation, req.text, req.user, "responses", req.attachments
        )
        run, stream = await self._start(send, principal)
        headers = _run_headers(run)
        async with contextlib.aclosing(stream):
            if req.stream:
                return await self._stream_response(request, run, stream, model, previous, req.user, headers)
            finished, text, _ = await _collect(run, stream, headers)
        # A run that failed is still a response the client can read and continue from: status and error say how
        # it ended (a 5xx would invite a retry that sends the message again).
        return web.json_response(oa.response_object(finished, model, previous, text, req.user), headers=headers)

    async def _stream_response(
        self,
        request: web.Request,
        run: hpb.RunInfo,
        stream: AsyncGenerator[hpb.SendMessageReply, None],
        model: str,
        previous: str,
        user: str,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        sse = EventStream(request, headers)
        events = oa.ResponseEvents(run, model, previous, user)
        text = oa.TextAssembler()
        streamed: list[str] = []
        try:
            await sse.open()
            await sse.send([encode(e, kind) for kind, e in events.start()])
            try:
                async for reply in stream:
                    kind = reply.WhichOneof("kind")
                    note = queue_note(reply)
                    if note is not None:
                        await sse.send([note])
                    elif kind == "events":
                        out: list[bytes] = []
                        for event in reply.events.events:
                            delta = text.feed(event)
                            if delta:
                                streamed.append(delta)
                                out.extend(encode(e, k) for k, e in events.delta(delta))
                        await sse.send(out)
                    elif kind == "run_finished":
                        tail: list[bytes] = []
                        if not streamed and reply.run_finished.text:  # a repeated Idempotency-Key's ended run
                            streamed.append(reply.run_finished.text)
                            tail.extend(encode(e, k) for k, e in events.delta(reply.run_finished.text))
                        tail.extend(encode(e, k) for k, e in events.finish(reply.run_finished, "".join(streamed)))
                        await sse.send(tail)
            except errors.ResourceExhausted as exc:
                error = _dropped(exc)
                kind, event = events.error(error.code or "", error.message)
                await sse.send([encode(event, kind)])
            await sse.close()
        except (ConnectionError, TimeoutError) as exc:
            log.info(
                "gateway: client of run %s went away mid-stream (%s); the run goes on", run.run_id, type(exc).__name__
            )
        return sse.response


# ---- helpers ----


async def _collect(
    run: hpb.RunInfo, stream: AsyncGenerator[hpb.SendMessageReply, None], headers: dict[str, str]
) -> tuple[hpb.RunInfo, str, pb.RunEvent | None]:
    """Reads a run to its end: the finished RunInfo (status, usage), the reply text, the terminal event."""
    text = oa.TextAssembler()
    terminal: pb.RunEvent | None = None
    try:
        async for reply in stream:
            kind = reply.WhichOneof("kind")
            if kind == "events":
                for event in reply.events.events:
                    if event.WhichOneof("kind") in ("completed", "failed"):
                        terminal = event
                    text.feed(event)
            elif kind == "run_finished":
                # A repeated Idempotency-Key follows the first request's run from now (or finds it ended): the
                # run's recorded text is the whole answer, what streamed here may be its tail only.
                return reply.run_finished, reply.run_finished.text or text.text, terminal
    except errors.ResourceExhausted as exc:
        raise _dropped(exc) from None
    raise GatewayError(
        503, f"the host ended run {run.run_id}'s stream early", type="server_error", headers={**headers, **NO_RETRY}
    )


async def _queue_notes(
    first: hpb.SendMessageReply, stream: AsyncGenerator[hpb.SendMessageReply, None]
) -> AsyncGenerator[hpb.SendMessageReply, None]:
    """The run's stream from its first reply on, `queued` included: the OpenAI streams pass `queued` and
    `run_started` on as SSE comments (queue_note), the non-streaming calls skip them."""
    try:
        if first.HasField("queued") or first.HasField("run_finished"):  # the latter: a repeated key's ended run
            yield first
        async for reply in stream:
            yield reply
    finally:
        await stream.aclose()


def queue_note(reply: hpb.SendMessageReply) -> bytes | None:
    """`queued` / `run_started` as an SSE comment line (an extension an OpenAI client skips), else None."""
    kind = reply.WhichOneof("kind")
    if kind == "queued":
        q = reply.queued
        place = f" position={q.position}" if q.position else ""  # 0: not told to this key (hpb.RunQueued)
        waiting = f" bots_waiting={q.bots_waiting}" if q.bots_waiting else ""
        return comment(f"agenthost queued run={q.run.run_id} waiting_on={q.waiting_on}{place}{waiting}")
    if kind == "run_started":
        return comment(f"agenthost run_started run={reply.run_started.run_id}")
    return None


def _run_headers(run: hpb.RunInfo) -> dict[str, str]:
    return {RUN_HEADER: run.run_id, CONVERSATION_HEADER: quote(run.conversation_id, safe=_HEADER_SAFE)}


def _run_failed(run: hpb.RunInfo, headers: dict[str, str]) -> GatewayError:
    """A run that started and did not complete: it is recorded, so the client must not retry it blindly."""
    status = 504 if run.status == "timed_out" else 502
    detail = f": {run.error_message}" if run.error_message else ""
    return GatewayError(
        status,
        f"run {run.run_id} {run.status}{detail}",
        type="server_error",
        code=run.error_code or run.status,
        headers={**headers, **NO_RETRY},
    )


def _dropped(exc: errors.ResourceExhausted) -> GatewayError:
    return GatewayError(503, exc.message, type="server_error", code="client_too_slow", headers=dict(NO_RETRY))


def _error_response(exc: GatewayError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


def _loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return bind == "localhost"


def _model_object(bot: hpb.Bot) -> dict[str, Any]:
    return {"id": bot.name, "object": "model", "created": int(bot.created_at), "owned_by": "agenthost"}
