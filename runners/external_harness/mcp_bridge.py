"""The host MCP bridge: a stdio MCP server that a harness launches to reach the current run's host data.

    python -m agenthost.runners.external_harness.mcp_bridge

Every tool forwards to the host's AgentRunAPIProxy with the run's token, so the host scopes, caps and audits
each call exactly as it would for the runner itself, and the tools stop working when the run ends (the host
revokes the token). The credentials arrive in the environment only (AGENTHOST_HOST_ADDRESS, AGENTHOST_RUN_ID,
AGENTHOST_RUN_TOKEN, AGENTHOST_DEADLINE_AT, AGENTHOST_EVENT_ID): never argv, never a file. AGENTHOST_RUN_TOKEN is
the run's tool token, which the host accepts without the runner plugin's secret: the bridge runs inside the
harness's sandbox, next to model-run commands, and must hold nothing more than this run's grant.

Hand-written on purpose: the protocol surface a harness uses (initialize, ping, tools/list, tools/call,
notifications) is small, and the `mcp` package costs ~0.8 s of import per launch, once per harness turn.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

SERVER_NAME = "agenthost"
SERVER_VERSION = "1"
SUPPORTED_PROTOCOLS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL = SUPPORTED_PROTOCOLS[-1]
MAX_LINE = 16 * 1024 * 1024
# Harnesses cap tool output (Claude Code: ~25k tokens); a page larger than this is trimmed with a note.
MAX_RESULT_CHARS = 60_000

CREDENTIAL_ENV = (
    "AGENTHOST_HOST_ADDRESS",
    "AGENTHOST_RUN_ID",
    "AGENTHOST_RUN_TOKEN",
    "AGENTHOST_DEADLINE_AT",
    "AGENTHOST_EVENT_ID",
    "AGENTHOST_APIS",  # the run's granted APIs, comma-separated; unset = offer every tool
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
]
TOOL_NAMES = tuple(t["name"] for t in TOOLS)
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
}


def tools_for(apis: str | None) -> tuple[str, ...]:
    """The tools a run with these granted APIs can use (comma-separated; None or "*": not known, offer all)."""
    if apis is None or apis.strip() == "*":
        return TOOL_NAMES
    granted = {a.strip() for a in apis.split(",") if a.strip()}
    return tuple(name for name in TOOL_NAMES if TOOL_APIS[name] in granted)


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

    def __init__(self, api: Any, *, event_id: str = "", channel: Any = None) -> None:
        self.api = api
        self.event_id = event_id
        self.channel = channel  # closed by whoever built the bridge

    @staticmethod
    def _dict(message: Any) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(message, preserving_proto_field_name=True)

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = getattr(self, f"_tool_{name}", None)
        if name not in TOOL_NAMES or handler is None:
            raise KeyError(name)
        return await handler(args)

    async def _tool_current_event(self, args: dict[str, Any]) -> dict[str, Any]:
        if not self.event_id:
            raise ToolInputError("this run has no inbound event")
        return {"event": self._dict(await self.api.event_get(self.event_id))}

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
            "items": [self._dict(i) for i in page.items],
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
        return {"items": [self._dict(i) for i in items]}

    async def _tool_event_get(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"event": self._dict(await self.api.event_get(_require(args, "event_id", str)))}

    async def _tool_artifact_read(self, args: dict[str, Any]) -> dict[str, Any]:
        artifact_id = _require(args, "artifact_id", str)
        offset = _optional_int(args, "offset", 0, 0, 2**62)
        length = _optional_int(args, "length", 32768, 1, 1048576)
        meta = await self.api.artifact_metadata(artifact_id)
        chunk = await self.api.artifact_read_range(artifact_id, offset=offset, length=length)
        out: dict[str, Any] = {
            "artifact": self._dict(meta),
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


def _tool_result(payload: dict[str, Any], *, is_error: bool = False) -> dict[str, Any]:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"... [truncated {len(text) - MAX_RESULT_CHARS} chars; ask for less]"
        return {"content": [{"type": "text", "text": text}], "isError": is_error}
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if not is_error:
        result["structuredContent"] = payload
    return result


class McpServer:
    """JSON-RPC 2.0 over newline-delimited stdio (MCP stdio transport).

    `bridge` may be a factory: the gRPC client (grpc, protobuf, the SDK: ~0.3 s of imports) is built at the
    first tool call. Harnesses wait for every MCP server to connect before their first model request, so work
    done at start-up is latency on every turn; warming the client up in the background right after `tools/list`
    was measured too, and on two cores it still doubled the bridge's cost to a turn (the import competes with
    the harness's own start-up), while most turns never call a host tool.
    """

    def __init__(
        self,
        bridge: Bridge | Callable[[], Awaitable[Bridge]] | None,
        *,
        unavailable_reason: str = "",
        tools: tuple[str, ...] = TOOL_NAMES,
    ) -> None:
        self._bridge = bridge
        self.tools = tools
        self._building: asyncio.Task[Bridge] | None = None
        self.unavailable_reason = unavailable_reason

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
        bridge = self._bridge if isinstance(self._bridge, Bridge) else None
        task = self._building
        if bridge is None and task is not None:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None:
                bridge = task.result()
        if bridge is not None and bridge.channel is not None:
            await bridge.channel.close()

    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answers one message; returns None for notifications and responses (nothing to send)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, -32600, "invalid JSON-RPC 2.0 message")
        method = message.get("method")
        msg_id = message.get("id")
        if not isinstance(method, str):
            return None  # a response to something we never sent, or junk without an id
        if "id" not in message:
            return None  # notifications/initialized, notifications/cancelled, ...
        params = message.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            return _error(msg_id, -32602, "params must be an object")
        if method == "initialize":
            requested = params.get("protocolVersion")
            return _ok(
                msg_id,
                {
                    "protocolVersion": requested if requested in SUPPORTED_PROTOCOLS else LATEST_PROTOCOL,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
                    "instructions": "Tools over the agenthost conversation this turn belongs to: the current event, "
                    "transcript history, attachments and host state.",
                },
            )
        if method == "ping":
            return _ok(msg_id, {})
        if method == "tools/list":
            return _ok(msg_id, {"tools": [t for t in TOOLS if t["name"] in self.tools]})
        if method == "tools/call":
            return _ok(msg_id, await self._call(params))
        if method in ("resources/list", "prompts/list"):
            return _ok(msg_id, {method.split("/")[0]: []})
        return _error(msg_id, -32601, f"method not found: {method}")

    async def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        from agenthost.protos.errors import AgentHostError

        name = params.get("name")
        args = params.get("arguments") or {}
        if not isinstance(args, dict):
            return _tool_result({"error": "arguments must be an object"}, is_error=True)
        if name not in self.tools:
            return _tool_result({"error": f"unknown tool {name!r}; tools: {list(self.tools)}"}, is_error=True)
        try:
            bridge = await self.bridge()
        except Exception as exc:  # the client could not be built; say why instead of dying
            return _tool_result({"error": f"the agenthost bridge is unavailable: {exc}"}, is_error=True)
        if bridge is None:
            reason = self.unavailable_reason
            return _tool_result({"error": f"the agenthost bridge is unavailable: {reason}"}, is_error=True)
        try:
            return _tool_result(await bridge.call(str(name), args))
        except KeyError:
            return _tool_result({"error": f"unknown tool {name!r}; tools: {list(TOOL_NAMES)}"}, is_error=True)
        except ToolInputError as exc:
            return _tool_result({"error": str(exc)}, is_error=True)
        except AgentHostError as exc:
            # The host's typed refusal (PermissionDenied, NotFound, FailedPrecondition after the run ended...).
            return _tool_result({"error": f"{type(exc).__name__}: {exc.message}"}, is_error=True)
        except (ValueError, json.JSONDecodeError) as exc:
            return _tool_result({"error": str(exc)}, is_error=True)


def _ok(msg_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


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
    return Bridge(api, event_id=env.get("AGENTHOST_EVENT_ID", ""), channel=channel)


async def serve_stdio(server: McpServer) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    write_lock = asyncio.Lock()
    pending: set[asyncio.Task[None]] = set()

    async def send(reply: dict[str, Any]) -> None:
        data = json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with write_lock:
            out.write(data)
            out.flush()

    async def answer(message: Any) -> None:
        try:
            reply = await server.handle(message)
        except Exception as exc:  # a bug in one call must not kill the server the harness depends on
            reply = _error(message.get("id") if isinstance(message, dict) else None, -32603, f"internal error: {exc}")
        if reply is not None:
            await send(reply)

    while True:
        try:
            line = await reader.readline()
        except ValueError:
            print("agenthost mcp bridge: dropped an oversize line", file=sys.stderr)
            continue
        if not line:
            break  # stdin closed: the harness is done with us
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            await send(_error(None, -32700, "parse error"))
            continue
        # Calls run concurrently so a slow history search does not hold up a ping.
        task = asyncio.create_task(answer(message))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=5)


async def amain() -> None:
    env = dict(os.environ)
    reason = missing_credentials(env)
    if reason:
        print(f"agenthost mcp bridge: {reason}", file=sys.stderr)
        await serve_stdio(McpServer(None, unavailable_reason=reason))
        return
    server = McpServer(lambda: bridge_from_env(env), tools=tools_for(env.get("AGENTHOST_APIS")))
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
