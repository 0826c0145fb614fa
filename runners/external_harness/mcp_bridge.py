"""The host MCP bridge: a stdio MCP server that a harness launches to reach the current run's host data.

    python -m agenthost.runners.external_harness.mcp_bridge

Every tool forwards to the host's AgentRunAPIProxy with the run's token, so the host scopes, caps and audits
each call exactly as it would for the runner itself, and the tools stop working when the run ends (the host
revokes the token). The credentials arrive in the environment only (AGENTHOST_HOST_ADDRESS, AGENTHOST_RUN_ID,
AGENTHOST_RUN_TOKEN, AGENTHOST_DEADLINE_AT, AGENTHOST_EVENT_ID): never argv, never a file. AGENTHOST_RUN_TOKEN is
the run's tool token, which the host accepts without the runner plugin's secret: the bridge runs inside the
harness's sandbox, next to model-run commands, and must hold nothing more than this run's grant.

Hand-written on purpose: the protocol surface a harness uses (initialize or server/discover, ping, tools/list,
tools/call, notifications) is small, and the `mcp` package costs ~0.8 s of import per launch, once per harness turn.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

SERVER_NAME = "agenthost"
SERVER_VERSION = "1"
SERVER_INFO = {"name": SERVER_NAME, "version": SERVER_VERSION}
INSTRUCTIONS = (
    "Tools over the agenthost conversation this turn belongs to: the current event, transcript history, attachments "
    "and host state."
)
# The versions negotiated by the `initialize` handshake.
SUPPORTED_PROTOCOLS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL = SUPPORTED_PROTOCOLS[-1]
# 2026-07-28 drops the handshake (and ping, notifications/initialized): every request names its version and the
# client's capabilities in params._meta, `server/discover` says what the server speaks, and every result carries
# `resultType`. The first request of a stdio session picks the era; over HTTP each request stands alone.
MODERN_PROTOCOLS = ("2026-07-28",)
ALL_PROTOCOLS = (*SUPPORTED_PROTOCOLS, *MODERN_PROTOCOLS)
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
# JSON-RPC batching was added in 2025-03-26 and removed again in 2025-06-18.
BATCH_PROTOCOLS = frozenset({"2025-03-26"})
STRUCTURED_CONTENT_SINCE = "2025-06-18"  # versions are dates, so they compare as strings
# A bigger line is refused with an error reply (its id is unknowable). Tool arguments are small; the host caps
# every value it stores far below this.
MAX_LINE = 16 * 1024 * 1024
READ_CHUNK = 256 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# 2026-07-28 codes.
HEADER_MISMATCH = -32020  # HTTP: MCP-Protocol-Version / Mcp-Method / Mcp-Name disagree with the body
UNSUPPORTED_PROTOCOL_VERSION = -32022  # data: {"supported": [...], "requested": "..."}
# Harnesses cap tool output (Claude Code: ~25k tokens); a page larger than this is trimmed with a note.
MAX_RESULT_CHARS = 60_000

CREDENTIAL_ENV = (
    "AGENTHOST_HOST_ADDRESS",
    "AGENTHOST_RUN_ID",
    "AGENTHOST_RUN_TOKEN",
    "AGENTHOST_DEADLINE_AT",
    "AGENTHOST_EVENT_ID",
    "AGENTHOST_APIS",  # the run's granted APIs, comma-separated; unset = offer every tool
    # The binding's `approvals` as JSON ({"tools", "commands", "timeout_seconds"}); empty = no `approve` tool.
    "AGENTHOST_APPROVALS",
)

_SCOPES = ["run", "conversation", "actor", "binding", "runner"]
_DIRECTIONS = ["backward", "forward"]

TOOLS: list[dict[str, Any]] = [
    {
        "name": "current_event",
        "description": "The inbound event (user message) this turn answers: text, actor, attachments, ids.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    {
        "name": "history_page",
        "description": "One page of the conversation transcript as the host recorded it (user, assistant and tool "
        "turns). 'backward' starts at the newest item; pass next_cursor to continue.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "cursor": {"type": "string", "description": "next_cursor of the previous page; omit to start"},
                "direction": {"type": "string", "enum": _DIRECTIONS, "default": "backward"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            },
            "additionalProperties": False,
        },
    },
    {
        "name": "history_search",
        "description": "Full-text search over the conversation transcript.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "roles": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["user", "assistant", "tool", "system"]},
                },
                "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
    {
        "name": "event_get",
        "description": "One inbound event of this conversation by id.",
        "inputSchema": {
            "type": "object",
            "properties": {"event_id": {"type": "string", "minLength": 1}},
            "required": ["event_id"],
            "additionalProperties": False,
        },
    },
    {
        "name": "artifact_read",
        "description": "Reads an attachment/artifact: metadata plus a byte range (UTF-8 text, else base64).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "artifact_id": {"type": "string", "minLength": 1},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "length": {"type": "integer", "minimum": 1, "maximum": 1048576, "default": 32768},
            },
            "required": ["artifact_id"],
            "additionalProperties": False,
        },
    },
    {
        "name": "state_get",
        "description": "Reads a JSON value the host keeps for this bot (scopes: run, conversation, actor, binding, "
        "runner).",
        "inputSchema": {
            "type": "object",
            "properties": {"scope": {"type": "string", "enum": _SCOPES}, "key": {"type": "string", "minLength": 1}},
            "required": ["scope", "key"],
            "additionalProperties": False,
        },
    },
    {
        "name": "state_set",
        "description": "Stores a JSON value in host state (e.g. a note to remember in this conversation). Pass "
        "if_version (from state_get) to write only if nobody else changed it.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "scope": {"type": "string", "enum": _SCOPES},
                "key": {"type": "string", "minLength": 1},
                "value": {"description": "any JSON value"},
                "if_version": {"type": "integer", "minimum": 0},
            },
            "required": ["scope", "key", "value"],
            "additionalProperties": False,
        },
    },
    {
        "name": "kb_search",
        "description": "Searches this bot's knowledge base (documents its owner added) by keywords and by meaning; "
        "returns the best passages with their document name, line numbers and artifact id.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 2000},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
]
# Claude Code's --permission-prompt-tool: called by the harness (not meant for the model) with a tool call its own
# rules would refuse; answers {"behavior": "allow", "updatedInput": ...} or {"behavior": "deny", "message": ...}.
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
APPROVE_TOOL = "approve"
APPROVE_SPEC: dict[str, Any] = {
    "name": APPROVE_TOOL,
    "description": "Permission prompt of the harness (asks the bot's user through the host). Not for direct use.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "minLength": 1},
            "input": {"type": "object"},
            "tool_use_id": {"type": "string"},
        },
        "required": ["tool_name", "input"],
    },
}
# Each tool as tools/list gives it. `anthropic/alwaysLoad` puts it in Claude Code's first model request although tool
# search defers other tools (the managed block names these tools; finding them by search would cost a model round
# trip). Set per tool rather than as the server's `alwaysLoad` in mcp.json, which would also make the CLI wait for
# the connection before the rest of its start-up (57-65 ms in its own start-up profile): per tool, it connects while
# it starts and waits only before the first request (see docs/runners/external-harness.md). Other clients ignore the key
# (`_meta` is the spec's).
LISTED_TOOLS = tuple({**spec, "_meta": {"anthropic/alwaysLoad": True}} for spec in (*TOOLS, APPROVE_SPEC))
# The grant each tool needs (agenthost.plugins.manifest.API_METHODS names). A tool the run may not use is not offered:
# a model shown a tool that always fails keeps trying it.
TOOL_APIS = {
    "current_event": "events.get",
    "history_page": "history.page",
    "history_search": "history.search",
    "event_get": "events.get",
    "artifact_read": "artifacts.read",
    "state_get": "state.read",
    "state_set": "state.write",
    "kb_search": "kb",
}


def tools_for(apis: str | None, approvals: str | None = None) -> tuple[str, ...]:
    """The tools a run with these granted APIs can use (comma-separated; None or "*": not known, offer all), plus
    `approve` when the binding has approvals (AGENTHOST_APPROVALS)."""
    data_tools = TOOL_NAMES
    if apis is not None and apis.strip() != "*":
        granted = {a.strip() for a in apis.split(",") if a.strip()}
        data_tools = tuple(name for name in data_tools if TOOL_APIS[name] in granted)
    return (*data_tools, APPROVE_TOOL) if approvals else data_tools


def _jsonable(message: Any) -> dict[str, Any]:
    """A result message as compact JSON values for the model. Imported on use: protobuf comes with the gRPC
    client, after the handshake (see serve)."""
    from agenthost.protos.json_values import to_jsonable

    return to_jsonable(message, defaults=False)


@dataclass(frozen=True)
class ApprovalPolicy:
    """The binding's `approvals` as the bridge receives them (validated by the runner before the turn)."""

    tools: list[str]
    commands: list[str]
    timeout_seconds: float

    @classmethod
    def from_env(cls, raw: str | None) -> ApprovalPolicy | None:
        if not raw:
            return None
        data = json.loads(raw)
        return cls(list(data.get("tools", [])), list(data.get("commands", [])), float(data.get("timeout_seconds", 0)))


class ToolInputError(ValueError):
    """Arguments a tool cannot use; reported to the model as a tool error it can correct."""


def _require(args: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = args.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ToolInputError(f"argument {name!r} is required and must be {getattr(kind, '__name__', kind)}")
    return value


def _optional_int(args: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ToolInputError(f"argument {name!r} must be an integer in {low}..{high}")
    return value


def _choice(args: dict[str, Any], name: str, choices: list[str], default: str | None = None) -> str:
    value = args.get(name, default)
    if value not in choices:
        raise ToolInputError(f"argument {name!r} must be one of {choices}")
    return value


class Bridge:
    """The tool implementations, over an SDK RunAPI. Separate from the stdio loop so tests can call it directly."""

    def __init__(
        self, api: Any, *, event_id: str = "", channel: Any = None, approvals: ApprovalPolicy | None = None
    ) -> None:
        self.api = api
        self.event_id = event_id
        self.channel = channel  # closed by whoever built the bridge
        self.approvals = approvals

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = getattr(self, f"_tool_{name}", None)
        if (name not in TOOL_NAMES and name != APPROVE_TOOL) or handler is None:
            raise KeyError(name)
        return await handler(args)

    async def _tool_current_event(self, args: dict[str, Any]) -> dict[str, Any]:
        if not self.event_id:
            raise ToolInputError("this run has no inbound event")
        return {"event": _jsonable(await self.api.event_get(self.event_id))}

    async def _tool_history_page(self, args: dict[str, Any]) -> dict[str, Any]:
        cursor = args.get("cursor", "")
        if not isinstance(cursor, str):
            raise ToolInputError("argument 'cursor' must be a string")
        page = await self.api.history_page(
            cursor=cursor,
            direction=_choice(args, "direction", _DIRECTIONS, "backward"),
            limit=_optional_int(args, "limit", 20, 1, 100),
        )
        return {
            "items": [_jsonable(i) for i in page.items],
            "next_cursor": page.next_cursor,
            "has_more": page.has_more,
        }

    async def _tool_history_search(self, args: dict[str, Any]) -> dict[str, Any]:
        roles = args.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ToolInputError("argument 'roles' must be a list of strings")
        items = await self.api.history_search(
            _require(args, "query", str), roles=roles, top_k=_optional_int(args, "top_k", 10, 1, 50)
        )
        return {"items": [_jsonable(i) for i in items]}

    async def _tool_event_get(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"event": _jsonable(await self.api.event_get(_require(args, "event_id", str)))}

    async def _tool_artifact_read(self, args: dict[str, Any]) -> dict[str, Any]:
        artifact_id = _require(args, "artifact_id", str)
        offset = _optional_int(args, "offset", 0, 0, 2**62)
        length = _optional_int(args, "length", 32768, 1, 1048576)
        meta = await self.api.artifact_metadata(artifact_id)
        chunk = await self.api.artifact_read_range(artifact_id, offset=offset, length=length)
        out: dict[str, Any] = {
            "artifact": _jsonable(meta),
            "offset": chunk.offset,
            "next_offset": chunk.offset + len(chunk.data),
            "eof": chunk.eof,
        }
        try:
            out["text"] = chunk.data.decode("utf-8")
        except UnicodeDecodeError:
            out["base64"] = base64.b64encode(chunk.data).decode()
        return out

    async def _tool_state_get(self, args: dict[str, Any]) -> dict[str, Any]:
        value = await self.api.state_get_versioned(_choice(args, "scope", _SCOPES), _require(args, "key", str))
        return {
            "found": value.found,
            "value": json.loads(value.value_json) if value.found else None,
            "version": value.version,
        }

    async def _tool_state_set(self, args: dict[str, Any]) -> dict[str, Any]:
        if "value" not in args:
            raise ToolInputError("argument 'value' is required")
        if_version = args.get("if_version")
        if if_version is not None and (isinstance(if_version, bool) or not isinstance(if_version, int)):
            raise ToolInputError("argument 'if_version' must be an integer")
        version = await self.api.state_set(
            _choice(args, "scope", _SCOPES), _require(args, "key", str), args["value"], if_version=if_version
        )
        return {"version": version}

    async def _tool_approve(self, args: dict[str, Any]) -> dict[str, Any]:
        """Claude Code asks here only for calls its own rules (allowed_tools, permission mode) would refuse. Those
        matching the binding's approvals go to a person through the host; the rest stay refused, as they were
        without a prompt tool. Anything but an explicit approval is a denial."""
        from agenthost.protos.errors import AgentHostError
        from agenthost.runners.sdk.approval_rules import approval_reason

        tool_name = _require(args, "tool_name", str)
        tool_input = args.get("input")
        if not isinstance(tool_input, dict):
            raise ToolInputError("argument 'input' must be an object")
        policy = self.approvals
        reason = approval_reason(policy, tool_name, tool_input, shell_tools=("Bash",)) if policy else ""
        if not reason:
            return {
                "behavior": "deny",
                "message": f"{tool_name} is not allowed for this bot (neither in allowed_tools nor in approvals)",
            }
        command = tool_input.get("command") if tool_name == "Bash" else None
        summary = command if isinstance(command, str) else f"{tool_name} {json.dumps(tool_input)[:300]}"
        tool_use_id = args.get("tool_use_id")
        try:
            decision = await self.api.request_approval(
                tool_name,
                summary=summary,
                arguments=tool_input,
                reason=reason,
                timeout_seconds=policy.timeout_seconds if policy else 0.0,
                tool_call_id=tool_use_id if isinstance(tool_use_id, str) else "",
            )
        except AgentHostError as exc:
            return {"behavior": "deny", "message": f"approval could not be requested: {exc.message}"}
        if decision.approved:
            return {"behavior": "allow", "updatedInput": tool_input}
        if decision.outcome == "denied":
            note = f": {decision.note}" if decision.note else ""
            message = f"the user denied this {tool_name} call{note}. Do not retry it unchanged."
        elif decision.outcome == "timeout":
            message = f"nobody answered the approval request within {round(decision.timeout_seconds, 1):g}s; denied"
        else:
            message = f"the approval request ended without a decision ({decision.outcome})"
        return {"behavior": "deny", "message": message}

    async def _tool_kb_search(self, args: dict[str, Any]) -> dict[str, Any]:
        result = await self.api.kb_search(_require(args, "query", str), top_k=_optional_int(args, "top_k", 5, 1, 50))
        return _jsonable(result)


def _tool_result(payload: dict[str, Any], *, is_error: bool = False, structured: bool = True) -> dict[str, Any]:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"... [truncated {len(text) - MAX_RESULT_CHARS} chars; ask for less]"
        return {"content": [{"type": "text", "text": text}], "isError": is_error}
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured and not is_error:
        result["structuredContent"] = payload
    return result


class McpServer:
    """One MCP session: JSON-RPC 2.0 messages in, replies out, following the MCP version the client negotiated.

    `bridge` may be a factory: the gRPC client (grpc, protobuf, the SDK: ~0.3 s of imports) is built at the
    first tool call. Harnesses wait for every MCP server to connect before their first model request, so work
    done at start-up is latency on every turn; warming the client up in the background right after `tools/list`
    was measured too, and on two cores it still doubled the bridge's cost to a turn (the import competes with
    the harness's own start-up), while most turns never call a host tool.

    `handle` answers one message. `receive` is what the transport calls with each parsed line: it adds what
    only a session can do, namely batches (2025-03-26 only), concurrency, and cancellation (a request the client
    cancels is stopped and never answered).
    """

    def __init__(
        self,
        bridge: Bridge | Callable[[], Awaitable[Bridge]] | None,
        *,
        unavailable_reason: str = "",
        tools: tuple[str, ...] = TOOL_NAMES,
        era: str | None = None,
    ) -> None:
        self._bridge = bridge
        self.tools = tools
        self._building: asyncio.Task[Bridge] | None = None
        self.unavailable_reason = unavailable_reason
        self.protocol: str | None = None  # negotiated by `initialize`, or named by each 2026-07-28 request
        # "handshake" after initialize, "modern" after an accepted 2026-07-28 request; the other era is then refused.
        self.era: str | None = era
        self._inflight: dict[tuple[bool, Any], asyncio.Task[Any]] = {}
        self._init_ids: set[tuple[bool, Any]] = set()

    def _start_building(self) -> None:
        if self._building is None and callable(self._bridge) and not isinstance(self._bridge, Bridge):
            self._building = asyncio.ensure_future(self._bridge())

    async def bridge(self) -> Bridge | None:
        if self._bridge is None or isinstance(self._bridge, Bridge):
            return self._bridge
        self._start_building()
        assert self._building is not None
        self._bridge = await self._building
        return self._bridge

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        bridge = self._bridge if isinstance(self._bridge, Bridge) else None
        task = self._building
        if bridge is None and task is not None:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None:
                bridge = task.result()
        if bridge is not None and bridge.channel is not None:
            await bridge.channel.close()

    async def rebind(
        self, bridge: Bridge | Callable[[], Awaitable[Bridge]] | None, *, unavailable_reason: str = ""
    ) -> None:
        """Points this session at another run (the next turn of a kept harness), or at none between turns: the
        previous run's calls still in flight are cancelled and its host client closed first, so nothing of one run
        is answered with another's authority. The negotiated protocol stays; the client never sees a change."""
        await self.close()
        self._inflight.clear()
        self._bridge = bridge
        self._building = None
        self.unavailable_reason = unavailable_reason

    @property
    def pending(self) -> list[asyncio.Task[Any]]:
        return list(self._inflight.values())

    # ---- session level: batches, concurrency, cancellation ----

    def receive(self, payload: Any, send: Callable[[Any], Awaitable[None]]) -> None:
        """Takes one parsed line and schedules its reply (if it gets one) through `send`."""
        if isinstance(payload, list):
            if self.protocol not in BATCH_PROTOCOLS:
                # JSON-RPC batches exist only in MCP 2025-03-26 (added there, removed in 2025-06-18); before a
                # version is negotiated there is nothing that allows them either.
                version = self.protocol or "none negotiated yet"
                self.refuse(INVALID_REQUEST, f"JSON-RPC batches are not part of MCP {version}", send)
                return
            if not payload:
                self.refuse(INVALID_REQUEST, "empty batch", send)
                return
            self._spawn(None, self._batch(payload, send))
            return
        task = self._accept(payload)
        if task is not None:
            self._spawn(None, self._reply_when_done(task, send))

    async def respond(self, payload: Any) -> Any:
        """The reply to one parsed message, for a transport that pairs each reply with its request (HTTP): a
        dict, a list (a batch), or None when nothing is due (notifications, responses, a batch of those). A
        request the client cancels meanwhile raises RequestCancelled: the transport decides what its wire needs
        in place of the response the spec forbids."""
        if isinstance(payload, list):
            if self.protocol not in BATCH_PROTOCOLS:
                version = self.protocol or "none negotiated yet"
                return _error(None, INVALID_REQUEST, f"JSON-RPC batches are not part of MCP {version}")
            if not payload:
                return _error(None, INVALID_REQUEST, "empty batch")
            replies: list[Any] = []
            await self._spawn(None, self._batch(payload, _collect(replies)))
            return replies[0] if replies else None
        task = self._accept(payload)
        if task is None:
            return None
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled():
                raise RequestCancelled from None
            raise

    def refuse(self, code: int, message: str, send: Callable[[Any], Awaitable[None]]) -> None:
        """Answers a line that never became a message (unparsable, too long): an error with id null."""
        self._spawn(None, send(_error(None, code, message)))

    async def _batch(self, messages: list[Any], send: Callable[[Any], Awaitable[None]]) -> None:
        tasks = []
        for message in messages:
            if isinstance(message, dict) and message.get("method") == "initialize" and "id" in message:
                # 2025-03-26: "The initialize request MUST NOT be part of a JSON-RPC batch".
                tasks.append(self._spawn(None, _value(_error(message["id"], INVALID_REQUEST, "initialize in a batch"))))
                continue
            task = self._accept(message)
            if task is not None:
                tasks.append(task)
        replies = []
        for task in tasks:
            try:
                reply = await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # we are being shut down, not this one request
                continue  # cancelled by the client: left out of the batch's reply
            if reply is not None:
                replies.append(reply)
        if replies:  # a batch of notifications (or of cancelled requests) gets no reply at all
            await send(replies)

    def _accept(self, message: Any) -> asyncio.Task[Any] | None:
        """Starts answering one message; None when it gets no reply (notifications, responses)."""
        if isinstance(message, dict) and message.get("jsonrpc") == "2.0" and "id" not in message:
            if message.get("method") == "notifications/cancelled":
                self._cancel(message.get("params"))
            return None
        key = _id_key(message.get("id")) if isinstance(message, dict) else None
        task = self._spawn(key, self.handle(message))
        if key is not None and isinstance(message, dict) and message.get("method") == "initialize":
            self._init_ids.add(key)
        return task

    def _cancel(self, params: Any) -> None:
        if not isinstance(params, dict):
            return
        key = _id_key(params.get("requestId"))
        # The client MUST NOT cancel initialize; an unknown or finished id is no error (the reply may have crossed).
        if key is None or key in self._init_ids:
            return
        task = self._inflight.get(key)
        if task is not None:
            task.cancel()

    def _spawn(self, key: tuple[bool, Any] | None, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        if key is None or key in self._inflight:
            key = (False, object())  # tracked for shutdown only (a reused id is the client's bug)
        self._inflight[key] = task
        task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        return task

    async def _reply_when_done(self, task: asyncio.Task[Any], send: Callable[[Any], Awaitable[None]]) -> None:
        try:
            reply = await task
        except asyncio.CancelledError:
            if task.cancelled():
                return  # cancelled by the client: the spec says no response
            raise
        if reply is not None:
            await send(reply)

    # ---- one message ----

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answers one message; returns None for notifications and responses (nothing to send)."""
        try:
            return await self._handle(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in one call must not kill the server the harness depends on
            msg_id = message.get("id") if isinstance(message, dict) else None
            return _error(msg_id if _id_key(msg_id) else None, INTERNAL_ERROR, f"internal error: {exc}")

    async def _handle(self, message: Any) -> dict[str, Any] | None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "invalid JSON-RPC 2.0 message")
        method = message.get("method")
        if "id" not in message:
            return None  # a notification: never answered, whatever it says
        msg_id = message["id"]
        if _id_key(msg_id) is None:
            # MCP: "the ID MUST NOT be null" (and is a string or an integer). Answered as JSON-RPC answers a
            # request whose id it cannot use: Invalid Request, with id null.
            return _error(None, INVALID_REQUEST, "request id must be a string or an integer")
        if not isinstance(method, str):
            if "result" in message or "error" in message:
                return None  # a response; this server sends no requests, so nothing is waiting for it
            return _error(msg_id, INVALID_REQUEST, "request without a method")
        params = message.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            return _error(msg_id, INVALID_PARAMS, "params must be an object")
        enveloped = _has_envelope(params)
        if self.era == "modern" or (self.era is None and enveloped and method != "initialize"):
            return await self._handle_modern(msg_id, method, message, params)
        if enveloped and method != "initialize":
            # A 2026-07-28 request on a session that chose the handshake era: which rules would it be held to?
            return _error(
                msg_id,
                INVALID_REQUEST,
                f"this session negotiated MCP {self.protocol} by initialize; "
                "requests naming their version in _meta belong to a session that never sent initialize",
            )
        if method == "initialize":
            requested = params.get("protocolVersion")
            self.protocol = requested if requested in SUPPORTED_PROTOCOLS else LATEST_PROTOCOL
            self.era = "handshake"
            return _ok(
                msg_id,
                {
                    "protocolVersion": self.protocol,
                    # Only tools: resources/*, prompts/*, logging/*, completion/* are then "method not found".
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": dict(SERVER_INFO),
                    "instructions": INSTRUCTIONS,
                },
            )
        if method == "ping":
            return _ok(msg_id, {})
        return await self._tools_method(msg_id, method, params)

    async def _tools_method(self, msg_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "tools/list":
            return _ok(msg_id, {"tools": [t for t in LISTED_TOOLS if t["name"] in self.tools]})
        if method == "tools/call":
            name = params.get("name")
            if not isinstance(name, str) or name not in self.tools:
                # A protocol error, not a tool result: the spec's "Unknown tool" case (-32602).
                return _error(msg_id, INVALID_PARAMS, f"Unknown tool: {name!r}; tools: {list(self.tools)}")
            args = params.get("arguments")
            args = {} if args is None else args
            if not isinstance(args, dict):
                return _error(msg_id, INVALID_PARAMS, "tools/call arguments must be an object")
            return _ok(msg_id, await self._call(name, args))
        return _error(msg_id, METHOD_NOT_FOUND, f"method not found: {method}")

    async def _handle_modern(
        self, msg_id: Any, method: str, message: dict[str, Any], params: dict[str, Any]
    ) -> dict[str, Any]:
        """One 2026-07-28 request: its own envelope, no session state but the era it locks."""
        if method == "initialize":
            # -32022 names what this session speaks, so a client that lost track of the era can re-probe.
            requested = params.get("protocolVersion")
            return _error(
                msg_id,
                UNSUPPORTED_PROTOCOL_VERSION,
                "this session speaks MCP 2026-07-28, which has no initialize handshake",
                data={
                    "supported": list(MODERN_PROTOCOLS),
                    "requested": requested if isinstance(requested, str) else "",
                },
            )
        rejection = envelope_rejection(message)
        if rejection is not None:
            return _error(msg_id, *rejection)
        self.era = "modern"
        self.protocol = params["_meta"][PROTOCOL_VERSION_META]
        if method == "server/discover":
            reply = _ok(
                msg_id,
                {
                    "supportedVersions": list(MODERN_PROTOCOLS),
                    "capabilities": {"tools": {"listChanged": False}},
                    "instructions": INSTRUCTIONS,
                    # The answer depends on this turn's grant and lives as long as the turn: cache nothing.
                    "ttlMs": 0,
                    "cacheScope": "private",
                },
            )
        else:
            reply = await self._tools_method(msg_id, method, params)
            if method == "tools/list" and "result" in reply:
                reply["result"] |= {"ttlMs": 0, "cacheScope": "private"}
        if "result" in reply:
            reply["result"] |= {"resultType": "complete", "_meta": {SERVER_INFO_META: dict(SERVER_INFO)}}
        return reply

    def _result(self, payload: dict[str, Any], *, is_error: bool = False) -> dict[str, Any]:
        # structuredContent exists from 2025-06-18 on; older clients get the same JSON as text only.
        structured = self.protocol is None or self.protocol >= STRUCTURED_CONTENT_SINCE
        return _tool_result(payload, is_error=is_error, structured=structured)

    async def _call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        from agenthost.protos.errors import AgentHostError

        try:
            bridge = await self.bridge()
        except Exception as exc:  # the client could not be built; say why instead of dying
            return self._result({"error": f"the agenthost bridge is unavailable: {exc}"}, is_error=True)
        if bridge is None:
            reason = self.unavailable_reason
            return self._result({"error": f"the agenthost bridge is unavailable: {reason}"}, is_error=True)
        try:
            payload = await bridge.call(name, args)
            if name == APPROVE_TOOL:
                # Claude Code reads a permission answer only from a single text block: no structuredContent.
                return _tool_result(payload, structured=False)
            return self._result(payload)
        except ToolInputError as exc:
            # Input the model can correct is a tool execution error it gets to read (2025-11-25 makes this explicit).
            return self._result({"error": str(exc)}, is_error=True)
        except AgentHostError as exc:
            # The host's typed refusal (PermissionDenied, NotFound, FailedPrecondition after the run ended...).
            return self._result({"error": f"{type(exc).__name__}: {exc.message}"}, is_error=True)
        except (ValueError, json.JSONDecodeError) as exc:
            return self._result({"error": str(exc)}, is_error=True)


class RequestCancelled(Exception):
    """The client cancelled the request (notifications/cancelled) before it was answered."""


def _collect(into: list[Any]) -> Callable[[Any], Awaitable[None]]:
    async def send(reply: Any) -> None:
        into.append(reply)

    return send


def _id_key(msg_id: Any) -> tuple[bool, Any] | None:
    """A request id as a dict key (1 and "1" are different ids), or None if it is not a valid MCP id."""
    if isinstance(msg_id, bool) or not isinstance(msg_id, (str, int)):
        return None
    return (isinstance(msg_id, str), msg_id)


async def _value(value: Any) -> Any:
    return value


def _ok(msg_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _error(msg_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": msg_id, "error": error}


def _has_envelope(params: Any) -> bool:
    """Whether a request is a 2026-07-28 one: its _meta names a protocol version (a bare _meta is no sign, older
    requests carry progressToken there)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and PROTOCOL_VERSION_META in meta


def envelope_rejection(message: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, str, Any] | None:
    """The 2026-07-28 checks of one request, first failure wins: the envelope's required keys, then (HTTP, where
    `headers` holds the lower-cased routing headers) the headers against the body, then the version. Returns the
    error's (code, message, data), or None when the request may be served."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict):
        return INVALID_PARAMS, f"params._meta must carry {PROTOCOL_VERSION_META} and {CLIENT_CAPABILITIES_META}", None
    missing = [key for key in (PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META) if key not in meta]
    if missing:
        return INVALID_PARAMS, f"params._meta lacks {', '.join(missing)}", None
    version = meta[PROTOCOL_VERSION_META]
    if headers is not None:
        # An intermediary may route on the headers; a body that says otherwise is refused, not guessed at.
        if headers.get("mcp-protocol-version") != version:
            return HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta", None
        method = message.get("method")
        if headers.get("mcp-method") != method:
            return HEADER_MISMATCH, "Mcp-Method header does not match the method", None
        name = params.get("name")
        if method == "tools/call" and name is not None and _header_text(headers.get("mcp-name")) != name:
            return HEADER_MISMATCH, "Mcp-Name header does not match the tool name", None
    if not isinstance(version, str):
        return INVALID_PARAMS, "the protocol version in params._meta must be a string", None
    if version not in MODERN_PROTOCOLS:
        data = {"supported": list(MODERN_PROTOCOLS), "requested": version}
        return UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol version {version[:40]!r}", data
    return None


def _header_text(value: str | None) -> str | None:
    """A header value as the client meant it: values that are not plain printable ASCII travel as
    `=?base64?<UTF-8 bytes>?=`. A malformed wrapping decodes to None, which equals no name."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def missing_credentials(env: dict[str, str]) -> str:
    """Why the bridge cannot reach the host ('' when it can)."""
    missing = [k for k in CREDENTIAL_ENV[:3] if not env.get(k)]
    return f"missing {', '.join(missing)} in the bridge's environment" if missing else ""


def _import_client() -> None:
    import grpc  # noqa: F401

    from agenthost.protos import run_api_pb2_grpc  # noqa: F401
    from agenthost.runners.sdk.api import RunAPI  # noqa: F401


async def bridge_from_env(env: dict[str, str]) -> Bridge:
    """Builds the RunAPI client from the environment; the caller closes `bridge.channel`."""
    await asyncio.to_thread(_import_client)  # off the loop: the handshake keeps being answered meanwhile
    import grpc

    from agenthost.protos import run_api_pb2_grpc
    from agenthost.runners.sdk.api import RunAPI

    size = 16 * 1024 * 1024
    channel = grpc.aio.insecure_channel(
        env["AGENTHOST_HOST_ADDRESS"],
        options=[("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)],
    )
    try:
        deadline_at = float(env.get("AGENTHOST_DEADLINE_AT") or 0)
    except ValueError:
        deadline_at = 0.0
    api = RunAPI(
        run_api_pb2_grpc.AgentRunAPIProxyStub(channel),
        run_id=env["AGENTHOST_RUN_ID"],
        run_token=env["AGENTHOST_RUN_TOKEN"],  # the tool token: presented alone, no plugin secret
        deadline_at=deadline_at,
    )
    return Bridge(
        api,
        event_id=env.get("AGENTHOST_EVENT_ID", ""),
        channel=channel,
        approvals=ApprovalPolicy.from_env(env.get("AGENTHOST_APPROVALS")),
    )


async def serve_stdio(server: McpServer) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    write_lock = asyncio.Lock()

    async def send(reply: Any) -> None:
        data = json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with write_lock:
            out.write(data)
            out.flush()

    def line(raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            server.refuse(PARSE_ERROR, "parse error", send)
            return
        server.receive(payload, send)

    too_long = f"message longer than {MAX_LINE} bytes; it was not read"
    async for raw in read_lines(reader, MAX_LINE, oversize=lambda: server.refuse(INVALID_REQUEST, too_long, send)):
        line(raw)
    pending = server.pending
    if pending:
        await asyncio.wait(pending, timeout=5)


async def read_lines(reader: asyncio.StreamReader, limit: int, *, oversize: Callable[[], None]) -> AsyncIterator[bytes]:
    """Newline-delimited messages. A line past `limit` is reported once, as soon as it crosses the limit (the
    client is waiting for an answer), and the rest of it is skipped without being buffered."""
    buf = bytearray()
    skipping = False
    while True:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            if buf and not skipping:
                yield bytes(buf)
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not skipping:
                if len(buf) + len(piece) > limit:
                    skipping = True
                    buf.clear()
                    oversize()
                else:
                    buf += piece
            if end < 0:
                break
            if not skipping:
                yield bytes(buf)
            buf.clear()
            skipping = False
            start = end + 1


async def amain() -> None:
    env = dict(os.environ)
    reason = missing_credentials(env)
    if reason:
        print(f"agenthost mcp bridge: {reason}", file=sys.stderr)
        await serve_stdio(McpServer(None, unavailable_reason=reason))
        return
    server = McpServer(
        lambda: bridge_from_env(env), tools=tools_for(env.get("AGENTHOST_APIS"), env.get("AGENTHOST_APPROVALS"))
    )
    try:
        await serve_stdio(server)
    finally:
        await server.close()


def main() -> None:
    try:
        asyncio.run(amain())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
