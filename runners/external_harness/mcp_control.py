"""The host MCP bridge over Claude Code's own stdin and stdout: the control protocol its Agent SDK speaks.

Claude Code registers an MCP server of type `sdk` without connecting to anything: each MCP message for it comes out
on stdout as a `control_request` (subtype `mcp_message`), and the answer goes back on stdin as a `control_response`.
The runner already holds both pipes, so it answers from the same protocol core as the other transports (`McpServer`).

Why this is the default for Claude Code: walls. Nothing listens: no port on loopback for another local process to
find, and no token in the harness's environment, where every command the model runs could read it and call the
bridge directly, around Claude Code's own permission checks. Only the runner holds the harness's pipes, so the
bridge is reached through the CLI's tool calls alone, and through them only the run attached at the moment
(`attach`, as for the HTTP endpoint: detached between turns, every call then refused). Speed is no reason either
way: a scratch A/B once read 1.06x against 1.23x a bare `claude -p` for this against loopback HTTP, but the
committed benchmark's runs (31, 41 and 61 rounds) read 1.08x / 1.04x, 1.19x / 1.17x and 1.13x / 1.06x.

The harness is untrusted here as everywhere: a control request the runner did not expect (another subtype, another
server's name) gets an error response and nothing else; at most MAX_INFLIGHT MCP requests run at once, and at most
MAX_PENDING answers wait for the harness to read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agenthost.runners.external_harness.mcp_bridge import SERVER_NAME, TOOL_NAMES, McpServer, RequestCancelled
from agenthost.runners.external_harness.mcp_http import BridgeSource

MAX_INFLIGHT = 64
# Answers (refusals included) a harness may leave unread at once. Past this it gets no more answers: a harness that
# floods requests and never reads its stdin would otherwise make the runner hold one waiting write per request.
MAX_PENDING = 2 * MAX_INFLIGHT

Send = Callable[[bytes], Awaitable[None]]


def is_control(raw: dict[str, Any]) -> bool:
    """A line of the harness's stdout addressed to the runner, not an event of the turn."""
    return raw.get("type") in ("control_request", "control_cancel_request")


class McpControl:
    """The bridge of one Claude Code process, served over its control protocol. The runner feeds it every control
    line of the process's stdout (`receive`); answers go out through `send`, the process's stdin."""

    def __init__(self, send: Send | None = None, *, tools: tuple[str, ...] = TOOL_NAMES) -> None:
        self.send = send
        self.tools = tools
        self._source: BridgeSource | None = None
        self._reason = ""
        self._server = McpServer(None, tools=tools)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def attach(self, bridge: BridgeSource | None, *, unavailable_reason: str = "") -> None:
        """Hands the bridge to a run (a turn), or to none between turns: the previous run's MCP requests still in
        flight are cancelled and its host client closed (McpServer.rebind)."""
        self._source, self._reason = bridge, unavailable_reason
        await self._server.rebind(bridge, unavailable_reason=unavailable_reason)

    async def restart(self) -> None:
        """A new MCP session for a new harness process (a kept one replaced within a turn, a retry after a lost
        session), attached to the same run: nothing of an earlier process's session or requests carries over."""
        await self._cancel_all()
        await self._server.close()
        self._server = McpServer(self._source, tools=self.tools, unavailable_reason=self._reason)

    def receive(self, raw: dict[str, Any]) -> None:
        """Takes one control line (see `is_control`). Never blocks the reader: each request is answered by a task
        of its own, so a slow host call does not hold up the turn's events."""
        if raw.get("type") == "control_cancel_request":
            task = self._tasks.get(str(raw.get("request_id")))
            if task is not None:
                task.cancel()  # the CLI gave up on it and expects no response
            return
        request_id = raw.get("request_id")
        request = raw.get("request")
        if not isinstance(request_id, str) or not request_id or request_id in self._tasks:
            return  # nothing to answer to
        if len(self._tasks) >= MAX_PENDING:
            return  # see MAX_PENDING: an honest CLI never has this many requests open
        if not isinstance(request, dict) or request.get("subtype") != "mcp_message":
            self._spawn(request_id, self._answer_error(request_id, "unsupported control request"))
        elif request.get("server_name") != SERVER_NAME or not isinstance(request.get("message"), dict):
            self._spawn(request_id, self._answer_error(request_id, "no such MCP server"))
        elif len(self._tasks) >= MAX_INFLIGHT:
            self._spawn(request_id, self._answer_error(request_id, f"over {MAX_INFLIGHT} MCP requests in flight"))
        else:
            self._spawn(request_id, self._answer(request_id, request["message"]))

    def _spawn(self, request_id: str, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))

    async def _answer(self, request_id: str, message: dict[str, Any]) -> None:
        try:
            reply = await self._server.respond(message)
        except RequestCancelled:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None  # the CLI withdrew it (control_cancel_request): no response
            await self._answer_error(request_id, "request cancelled")  # the turn ended under it
            return
        # A notification gets no MCP reply, but the control request that carried it still wants its response.
        response = {"mcp_response": reply if reply is not None else {"jsonrpc": "2.0", "result": {}}}
        await self._write({"subtype": "success", "request_id": request_id, "response": response})

    async def _answer_error(self, request_id: str, message: str) -> None:
        await self._write({"subtype": "error", "request_id": request_id, "error": message})

    async def _write(self, response: dict[str, Any]) -> None:
        if self.send is not None:
            line = json.dumps({"type": "control_response", "response": response}) + "\n"
            await self.send(line.encode())

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, timeout=5)

    async def close(self) -> None:
        await self._cancel_all()
        await self._server.close()
