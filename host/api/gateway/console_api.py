"""The web console's server side (`/console/` on the gateway): static pages and a small JSON API over the admin
operations, for operators signed in with an admin credential (console_auth).

Every operation goes through AdminServicer in-process (admin_calls), so the console can do nothing the CLI could
not, under the same checks; refusals map to HTTP in one place (errors.from_admin_error). Nothing here renders
HTML: the browser builds the page from JSON with text nodes only, under a CSP that runs no inline script.

Static files are read once from the package at start, into a table keyed by file name: a request names an entry
of that table or gets 404, so no path a client sends is ever joined to a directory.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from aiohttp import web
from google.protobuf.message import Message

from agenthost.host.api.gateway import bodies
from agenthost.host.api.gateway.admin_calls import AdminCalls
from agenthost.host.api.gateway.connections import authenticated
from agenthost.host.api.gateway.console_auth import (
    COOKIE,
    SECURITY_HEADERS,
    SIGN_IN_CSRF,
    Session,
    Sessions,
    check_csrf,
    clear_cookie,
    set_cookie,
)
from agenthost.host.api.gateway.errors import GatewayError, bad_request, from_admin_error
from agenthost.host.api.gateway.sse import EventStream, encode
from agenthost.host.ops import logs
from agenthost.host.processes import binding_config
from agenthost.host.processes.binding_config import redact_config
from agenthost.host.runs.manager import MAX_INPUT_BYTES
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.json_values import to_jsonable
from agenthost.protos.wire import accepted_run

if TYPE_CHECKING:
    from agenthost.host.api.services import HostServices

log = logging.getLogger(__name__)

PREFIX = "/console"
API = f"{PREFIX}/api/"
MAX_BODY_BYTES = 256 * 1024  # a binding config is the largest thing the console sends
MAX_LOG_LINES = 1000
MAX_TOKEN_CHARS = 512
# A sign-in's body: a token and its JSON around it. It is read and parsed before anyone is known, so it gets no more:
# at the console's MAX_BODY_BYTES, anyone who reached the port made the event loop parse 256 KiB of JSON (~30 ms of
# the host's loop for a list of zeros) per request, with no key.
SIGN_IN_MAX_BYTES = 2 * MAX_TOKEN_CHARS
SOURCE = "console"
# The signed-in session of the request being served: set by the guard middleware, read by handlers (same task).
_session: contextvars.ContextVar[Session] = contextvars.ContextVar("console_session")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def load_static() -> dict[str, tuple[bytes, str]]:
    root = resources.files("agenthost.host.api.gateway") / "console_static"
    files: dict[str, tuple[bytes, str]] = {}
    for entry in root.iterdir():
        kind = _TYPES.get(PurePosixPath(entry.name).suffix)
        if kind and entry.is_file():
            files[entry.name] = (entry.read_bytes(), kind)
    return files


def _binding_json(binding: hpb.Binding) -> dict[str, Any]:
    out = to_jsonable(binding)
    out["config"] = redact_config(json.loads(binding.config_json or "{}"))
    del out["config_json"]
    return out


class Console:
    def __init__(self, host: HostServices) -> None:
        self.host = host
        self.admin = AdminCalls(host)
        self.sessions = Sessions(host.credentials)
        self.static = load_static()
        # Plugin logs are a plugin's raw stderr: token shapes and stored key values are masked before display.
        self.redactor = logs.Redactor(host.secret_values)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_response_prepare.append(_secure_headers)
        r = app.router
        r.add_get("/", self.index)
        r.add_get("/static/{name}", self.static_file)
        r.add_get("/api/session", self.session)
        r.add_post("/api/session", self.sign_in)
        r.add_delete("/api/session", self.sign_out)
        r.add_get("/api/status", self.status)
        r.add_get("/api/bots", self.bots)
        r.add_post("/api/bots", self.create_bot)
        r.add_get("/api/bots/{bot}", self.bot)
        r.add_delete("/api/bots/{bot}", self.delete_bot)
        r.add_post("/api/bots/{bot}/bindings", self.create_binding)
        r.add_post("/api/bots/{bot}/chat", self.chat)
        r.add_patch("/api/bindings/{binding}", self.update_binding)
        r.add_delete("/api/bindings/{binding}", self.delete_binding)
        r.add_post("/api/validate-config", self.validate_config)
        r.add_get("/api/runners", self.runners)
        r.add_get("/api/runs", self.runs)
        r.add_get("/api/runs/{run}", self.run)
        r.add_post("/api/runs/{run}/cancel", self.cancel_run)
        r.add_get("/api/approvals", self.approvals)
        r.add_post("/api/approvals/{approval}", self.decide_approval)
        r.add_get("/api/plugins", self.plugins)
        r.add_post("/api/plugins/{plugin}/enabled", self.set_plugin_enabled)
        r.add_get("/api/plugins/{plugin}/logs", self.plugin_logs)
        return app

    # ---- cross-cutting ----

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Authentication and CSRF before any API handler runs; every refusal as JSON."""
        token = None
        try:
            if request.path.startswith(API):
                if request.path == f"{API}session" and request.method == "POST":
                    check_csrf(request, SIGN_IN_CSRF)
                else:
                    token = _session.set(self.sessions.require(request))
            return await handler(request)
        except GatewayError as exc:
            return _error(exc)
        except errors.AgentHostError as exc:
            return _error(from_admin_error(exc))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(GatewayError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_")))
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            return _error(GatewayError(500, "internal error in the console", type="server_error"))
        finally:
            if token is not None:  # requests on one keep-alive connection share a task: no session carries over
                _session.reset(token)

    async def _call(self, request: web.Request, method: str, message: Message) -> Any:
        session = _session.get()
        return await self.admin.call(session.principal, method, message)

    # ---- pages ----

    async def index(self, request: web.Request) -> web.StreamResponse:
        return self._file("index.html")

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        found = self.static.get(name)
        if found is None:
            raise GatewayError(404, "no such file", code="not_found")
        body, kind = found
        return web.Response(body=body, headers={"Content-Type": kind, "Cache-Control": "no-cache"})

    # ---- session ----

    async def session(self, request: web.Request) -> web.StreamResponse:
        session = _session.get()
        return web.json_response({"name": session.principal.name, "csrf": session.csrf})

    async def sign_in(self, request: web.Request) -> web.StreamResponse:
        token = (await _json(request, SIGN_IN_MAX_BYTES)).get("token")
        if not isinstance(token, str) or not token.strip() or len(token) > MAX_TOKEN_CHARS:
            raise bad_request("give the admin token (in <data dir>/admin.token) or an admin-scoped key", "token")
        session_id, session = self.sessions.sign_in(token)
        authenticated(request)
        response = web.json_response({"name": session.principal.name, "csrf": session.csrf})
        set_cookie(response, request, session_id)
        return response

    async def sign_out(self, request: web.Request) -> web.StreamResponse:
        self.sessions.sign_out(request.cookies.get(COOKIE, ""))
        response = web.json_response({})
        clear_cookie(response)
        return response

    # ---- bots and bindings ----

    async def status(self, request: web.Request) -> web.StreamResponse:
        status = await self._call(request, "GetStatus", hpb.GetStatusRequest())
        out = to_jsonable(status)
        out.pop("plugins", None)
        return web.json_response(out)

    async def bots(self, request: web.Request) -> web.StreamResponse:
        reply = await self._call(request, "ListBots", hpb.ListBotsRequest())
        return web.json_response({"bots": [to_jsonable(b) for b in reply.bots]})

    async def create_bot(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        name, description = body.get("name", ""), body.get("description", "")
        if not isinstance(name, str) or not isinstance(description, str):
            raise bad_request("name and description are strings")
        bot = await self._call(request, "CreateBot", hpb.CreateBotRequest(name=name, description=description))
        return web.json_response(to_jsonable(bot), status=201)

    async def bot(self, request: web.Request) -> web.StreamResponse:
        ref = request.match_info["bot"]
        bindings = await self._call(request, "ListBindings", hpb.BotRequest(bot=ref))
        bots = (await self._call(request, "ListBots", hpb.ListBotsRequest())).bots
        bot = next((b for b in bots if ref in (b.bot_id, b.name)), None)
        if bot is None:  # deleted in between
            raise errors.NotFound(f"no bot {ref!r}")
        return web.json_response({"bot": to_jsonable(bot), "bindings": [_binding_json(b) for b in bindings.bindings]})

    async def delete_bot(self, request: web.Request) -> web.StreamResponse:
        await self._call(request, "DeleteBot", hpb.BotRequest(bot=request.match_info["bot"]))
        return web.json_response({})

    async def runners(self, request: web.Request) -> web.StreamResponse:
        reply = await self._call(request, "ListRunners", hpb.ListRunnersRequest())
        out = []
        for runner in reply.runners:
            manifest = json.loads(runner.manifest_json or "{}")
            out.append(
                {
                    "runner_id": runner.runner_id,
                    "plugin_id": runner.plugin_id,
                    "name": runner.name,
                    "description": runner.description,
                    "config_schema": manifest.get("config_schema", {"type": "object"}),
                }
            )
        return web.json_response({"runners": out})

    async def create_binding(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        config = body.get("config", {})
        if not isinstance(config, dict):
            raise bad_request("config must be a JSON object", "config")
        binding = hpb.Binding(
            runner_id=_string(body, "runner_id"),
            config_json=json.dumps(config),
            event_pattern=_string(body, "event_pattern"),
            conversation_pattern=_string(body, "conversation_pattern"),
            priority=_number(body, "priority", int) or 0,
            timeout_seconds=_number(body, "timeout_seconds", float) or 0.0,
        )
        created = await self._call(
            request, "CreateBinding", hpb.CreateBindingRequest(bot=request.match_info["bot"], binding=binding)
        )
        return web.json_response(_binding_json(created), status=201)

    async def update_binding(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        update = hpb.UpdateBindingRequest(binding_id=request.match_info["binding"])
        patch = body.get("config_patch")
        if patch is not None:
            if not isinstance(patch, dict):
                raise bad_request("config_patch must be a JSON object", "config_patch")
            update.config_patch_json = json.dumps(patch)
        priority = _number(body, "priority", int)
        if priority is not None:
            update.priority = priority
        timeout = _number(body, "timeout_seconds", float)
        if timeout is not None:
            update.timeout_seconds = timeout
        updated = await self._call(request, "UpdateBinding", update)
        return web.json_response(_binding_json(updated))

    async def delete_binding(self, request: web.Request) -> web.StreamResponse:
        await self._call(request, "DeleteBinding", hpb.DeleteBindingRequest(binding_id=request.match_info["binding"]))
        return web.json_response({})

    async def validate_config(self, request: web.Request) -> web.StreamResponse:
        """The problems a config would be refused for, one per setting, before anything is saved: the runner's JSON
        Schema, then the runner's own ValidateConfig, as CreateBinding/UpdateBinding check them. For an existing
        binding the patch is merged into its stored config (whose secrets the browser never saw)."""
        body = await _json(request)
        if body.get("binding_id"):
            binding = self.host.registry.binding(_string(body, "binding_id"))
            patch = body.get("config_patch", {})
            if not isinstance(patch, dict):
                raise bad_request("config_patch must be a JSON object", "config_patch")
            config = binding_config.merge_patch(json.loads(binding.config_json or "{}"), json.dumps(patch))
            runner_id = binding.runner_id
        else:
            runner_id = _string(body, "runner_id")
            config = body.get("config", {})
            if not isinstance(config, dict):
                raise bad_request("config must be a JSON object", "config")
        manifest = self.host.runs.manifest_for(runner_id)
        problems = binding_config.schema_problems(manifest.config_schema, config)
        problems = problems or self.host.binding_path_problems(runner_id, config)
        if not problems:
            plugin_id, _, name = runner_id.partition("/")
            problems = await binding_config.runner_problems(self.host.supervisor, plugin_id, name, json.dumps(config))
        return web.json_response({"problems": problems})

    # ---- chat ----

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """One message to the bot, its run streamed back as server-sent events: `queued` (while it waits for a slot:
        the hpb.RunQueued, its place in line), `run_started`, a `run_event` per
        RunEvent (every kind, including ones this console does not know yet), `run_finished`. A refusal before the
        run starts is a JSON error with its status. Leaving the page does not stop the run."""
        session = _session.get()
        body = await _json(request)
        text = _string(body, "text")
        if not text.strip():
            raise bad_request("the message is empty", "text")
        if len(text.encode()) > MAX_INPUT_BYTES:
            raise GatewayError(413, f"the message is larger than {MAX_INPUT_BYTES} bytes", code="message_too_large")
        send = hpb.SendMessageRequest(
            bot=request.match_info["bot"],
            conversation_id=_string(body, "conversation_id") or "console",
            text=text,
            source=SOURCE,
            actor=pb.Actor(actor_type="user", actor_id=f"console:{session.principal.name}"),
        )
        stream = self.admin.stream(session.principal, "SendMessage", send)
        async with contextlib.aclosing(stream):
            first = await anext(stream)
            return await self._stream_run(request, first, stream)

    async def _stream_run(
        self, request: web.Request, first: hpb.SendMessageReply, stream: AsyncIterator[hpb.SendMessageReply]
    ) -> web.StreamResponse:
        sse = EventStream(request, {})
        run = accepted_run(first)
        try:
            await sse.open()
            if first.HasField("queued"):
                await sse.send([encode(to_jsonable(first.queued), "queued")])
            else:
                await sse.send([encode(to_jsonable(run), "run_started")])
            try:
                async for reply in stream:
                    kind = reply.WhichOneof("kind")
                    if kind == "run_started":
                        await sse.send([encode(to_jsonable(reply.run_started), "run_started")])
                    elif kind == "events":
                        await sse.send([encode(to_jsonable(e), "run_event") for e in reply.events.events])
                    elif kind == "run_finished":
                        await sse.send([encode(to_jsonable(reply.run_finished), "run_finished")])
            except errors.ResourceExhausted as exc:  # this page fell too far behind and was dropped; the run goes on
                await sse.send([encode(from_admin_error(exc).body(), "error")])
            await sse.close()
        except (ConnectionError, TimeoutError) as exc:
            log.info("console: the page of run %s went away (%s); the run goes on", run.run_id, type(exc).__name__)
        return sse.response

    # ---- runs ----

    async def runs(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        reply = await self._call(
            request,
            "ListRuns",
            hpb.ListRunsRequest(
                bot=query.get("bot", ""), status=query.get("status", ""), limit=_query_int(query, "limit", 50)
            ),
        )
        return web.json_response({"runs": [to_jsonable(r) for r in reply.runs]})

    async def run(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run"]
        info = await self._call(request, "GetRun", hpb.RunRequestById(run_id=run_id))
        events = await self._call(
            request,
            "ListRunEvents",
            hpb.ListRunEventsRequest(
                run_id=run_id,
                after_seq=_query_int(request.query, "after_seq", 0),
                limit=_query_int(request.query, "limit", 500),
            ),
        )
        return web.json_response(
            {"run": to_jsonable(info), "events": [to_jsonable(e) for e in events.events], "has_more": events.has_more}
        )

    async def cancel_run(self, request: web.Request) -> web.StreamResponse:
        info = await self._call(request, "CancelRun", hpb.RunRequestById(run_id=request.match_info["run"]))
        return web.json_response(to_jsonable(info))

    # ---- approvals ----

    async def approvals(self, request: web.Request) -> web.StreamResponse:
        """Pending approvals, oldest first (every bot's, or one bot's / one run's), each with its bot's name."""
        query = request.query
        reply = await self._call(
            request, "ListApprovals", hpb.ListApprovalsRequest(bot=query.get("bot", ""), run_id=query.get("run", ""))
        )
        names = {b.bot_id: b.name for b in (await self._call(request, "ListBots", hpb.ListBotsRequest())).bots}
        out = []
        for approval in reply.approvals:
            shown = to_jsonable(approval)
            shown["bot_name"] = names.get(approval.bot_id, "")
            out.append(shown)
        return web.json_response({"approvals": out})

    async def decide_approval(self, request: web.Request) -> web.StreamResponse:
        """One decision: `decision` is one of the request's option ids. Deciding twice is the servicer's
        FAILED_PRECONDITION (409 here), an unknown id its NOT_FOUND (404)."""
        body = await _json(request)
        decision = _string(body, "decision")
        if not decision:
            raise bad_request("decision is required (one of the approval's options, e.g. approve or deny)", "decision")
        info = await self._call(
            request,
            "DecideApproval",
            hpb.DecideApprovalRequest(
                approval_id=request.match_info["approval"], decision=decision, note=_string(body, "note")
            ),
        )
        return web.json_response(to_jsonable(info))

    # ---- plugins ----

    async def plugins(self, request: web.Request) -> web.StreamResponse:
        reply = await self._call(request, "ListPlugins", hpb.ListPluginsRequest())
        out = []
        for plugin in reply.plugins:
            shown = to_jsonable(plugin)
            shown["runners"] = [r.runner_id for r in plugin.runners]
            out.append(shown)
        return web.json_response({"plugins": out})

    async def set_plugin_enabled(self, request: web.Request) -> web.StreamResponse:
        enabled = (await _json(request)).get("enabled")
        if not isinstance(enabled, bool):
            raise bad_request("enabled must be true or false", "enabled")
        info = await self._call(
            request,
            "SetPluginEnabled",
            hpb.SetPluginEnabledRequest(plugin_id=request.match_info["plugin"], enabled=enabled),
        )
        shown = to_jsonable(info)
        shown["runners"] = [r.runner_id for r in info.runners]
        return web.json_response(shown)

    async def plugin_logs(self, request: web.Request) -> web.StreamResponse:
        """The plugin's recent stderr lines, as `agenthost logs --plugin` shows them, secrets masked."""
        plugin_id = request.match_info["plugin"]
        self.host.registry.plugin(plugin_id)  # NotFound for a plugin that is not installed
        lines = _query_int(request.query, "lines", 200)
        if not 0 < lines <= MAX_LOG_LINES:
            raise GatewayError(400, f"lines must be between 1 and {MAX_LOG_LINES}", param="lines")
        try:
            path = logs.plugin_log_path(self.host.data_dir, plugin_id)
        except ValueError:
            return web.json_response({"lines": []})
        found, _ = logs.tail_lines(path, lines)
        return web.json_response({"lines": [self.redactor.scrub(line) for line in found]})


# ---- helpers ----


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
    if request.path.startswith(API):
        response.headers["Cache-Control"] = "no-store"


def _error(exc: GatewayError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string", key)
    return value


def _number(body: dict[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    value = body.get(key)
    if value is None or value == "":
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not (float(value).is_integer() and abs(value) < 2**31))
    ):
        raise bad_request(f"{key} must be {'an integer' if kind is int else 'a number'}", key)
    return kind(value)


def _query_int(query: Any, key: str, default: int) -> int:
    raw = query.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{key} must be an integer", key) from None
    if not 0 <= value < 2**31:
        raise bad_request(f"{key} is out of range", key)
    return value


async def _json(request: web.Request, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """A console request's JSON body; its share of large-body slots is the signed-in credential's (none before
    sign-in). Console bodies are small (MAX_BODY_BYTES), so they seldom need one."""
    session = _session.get(None)
    key = f"console:{session.principal.name}" if session is not None else "console"
    return await bodies.json_object(request, max_bytes, key=key, require_json_type=True)
