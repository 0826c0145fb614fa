"""Warm MCP client sessions to a binding's own servers, shared by the runs of the runner process.

Imported only when a binding configures `mcp_servers`: the SDK (and its HTTP stack) is not loaded otherwise.

One session per (server settings, resolved secrets) for an http server, and per (…, conversation workspace) for a
stdio server: a stdio server is an untrusted process started inside the shell tool's sandbox with that workspace
as its only writable place (and HOME, and cwd), so it must not serve another conversation. Sessions start on the
first run that needs them, stay up across runs (the start-up is paid once), are shared by concurrent runs (the
SDK multiplexes requests), and close with the runner. A session whose server died is dropped and started again by
the next run; a server that keeps failing to start is retried with exponential backoff.

The SDK's transports are anyio context managers that must be entered and left by one task, so each session has an
owner task that holds them open until the session is closed or lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path, PurePosixPath
from typing import Any

import mcp
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError

from agenthost.plugins import sandbox as sandboxing
from agenthost.plugins.binding_paths import not_shown
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.tools.base import ToolError
from agenthost.runners.local_agent.tools.mcp import McpTool, namespaced
from agenthost.runners.sdk import egress, tool_walls
from agenthost.runners.sdk.mcp_servers import McpServer, McpServerError, ro_path_problems

log = logging.getLogger("agenthost.local_agent")

MAX_SESSIONS = 32
START_TIMEOUT_MIN = 30.0
START_TIMEOUT_MAX = 120.0
STOP_TIMEOUT = 5.0
BACKOFF_MAX = 60.0
STDERR_TAIL = 600
MAX_PAGES = 20


class McpUnavailable(Exception):
    """A server could not be started (or is backing off); the message names it and says why."""


def _backoff(failures: int) -> float:
    return min(BACKOFF_MAX, 2.0 ** (failures - 1)) if failures > 0 else 0.0


class ServerSession:
    """One MCP client session and the task that holds its transport open."""

    def __init__(self, server: McpServer, opener: Callable[[], AbstractAsyncContextManager[Any]], log_path: Path):
        self.server = server
        self._opener = opener
        self._log_path = log_path
        self._lock = asyncio.Lock()
        self._session: Any = None
        self._tools: list[Any] = []
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        self.active = 0

    @property
    def alive(self) -> bool:
        return self._session is not None

    async def start(self) -> list[Any]:
        """The server's tools, starting it first if it is not running."""
        async with self._lock:
            if self._session is not None:
                return self._tools
            now = time.monotonic()
            if now < self._retry_at:
                raise McpUnavailable(
                    f"MCP server {self.server.name} failed to start ({self._last_error}); next attempt in "
                    f"{self._retry_at - now:.0f}s"
                )
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[tuple[Any, list[Any]]] = loop.create_future()
            stop = asyncio.Event()
            task = asyncio.create_task(self._own(ready, stop), name=f"mcp-{self.server.name}")
            limit = min(max(START_TIMEOUT_MIN, self.server.timeout_s), START_TIMEOUT_MAX)
            try:
                session, tools = await asyncio.wait_for(asyncio.shield(ready), limit)
            except BaseException as exc:
                stop.set()
                await _finish(task)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self._failures += 1
                self._retry_at = time.monotonic() + _backoff(self._failures)
                reason = "no answer to initialize" if isinstance(exc, TimeoutError) else _describe(exc)
                tail = self._stderr_tail()
                self._last_error = reason + (f"; its stderr ends: {tail}" if tail else "")
                raise McpUnavailable(
                    f"MCP server {self.server.name} could not be started: {self._last_error}"
                ) from None
            self._failures = 0
            self._session, self._tools, self._stop, self._task = session, tools, stop, task
            task.add_done_callback(lambda t: self._lost(t, "its connection ended"))
            return tools

    async def _own(self, ready: asyncio.Future[tuple[Any, list[Any]]], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._opener())
                session = await stack.enter_async_context(mcp.ClientSession(read, write))
                await session.initialize()
                tools: list[Any] = []
                cursor = None
                for _ in range(MAX_PAGES):
                    params = mcp.types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                if not ready.done():
                    ready.set_result((session, tools))
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_describe(exc)))
            if not isinstance(exc, Exception):
                raise

    def _lost(self, task: asyncio.Task[None] | None, why: str) -> None:
        """Forgets a session whose server stopped (or whose task ended); the next run starts a new one."""
        if task is not None and task is not self._task:
            return
        if self._session is not None:
            log.warning("MCP server %s: session lost (%s); it is restarted on the next run", self.server.name, why)
        self._session = None
        self._last_error = why
        if self._stop is not None:
            self._stop.set()

    async def call(self, tool: str, args: dict[str, Any]) -> Any:
        session = self._session
        name = self.server.name
        if session is None:
            raise ToolError(
                f"MCP server {name} is not running ({self._last_error or 'it stopped'}); it is started again on the "
                "next run"
            )
        self.active += 1
        try:
            async with asyncio.timeout(self.server.timeout_s):
                return await session.call_tool(tool, args)
        except TimeoutError:
            # The timeout cancelled the request, and the SDK told the server (notifications/cancelled).
            raise ToolError(
                f"MCP server {name}: tool {tool} did not answer within {self.server.timeout_s:g}s (timeout_s); the "
                "call was cancelled"
            ) from None
        except MCPError as exc:
            if exc.error.code == mcp.types.CONNECTION_CLOSED:
                self._lost(None, f"the server stopped during a call to {tool}")
                raise ToolError(
                    f"MCP server {name} stopped during the call (its process exited or the connection closed); "
                    "it is started again on the next run"
                ) from None
            raise ToolError(f"MCP server {name} refused the call: {exc}") from None
        except (OSError, EOFError) as exc:
            self._lost(None, _describe(exc))
            raise ToolError(
                f"MCP server {name} is unreachable ({_describe(exc)}); it is started again on the next run"
            ) from None
        except Exception as exc:
            if type(exc).__module__.startswith("anyio"):  # a transport stream closed under the call
                self._lost(None, _describe(exc))
                raise ToolError(
                    f"MCP server {name} stopped during the call; it is started again on the next run"
                ) from None
            raise
        finally:
            self.active -= 1

    def _stderr_tail(self) -> str:
        try:
            with open(self._log_path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - STDERR_TAIL))
                return " ".join(fh.read().decode("utf-8", "replace").split())[-STDERR_TAIL:]
        except OSError:
            return ""

    async def close(self) -> None:
        task, self._task = self._task, None
        self._session = None
        if self._stop is not None:
            self._stop.set()
        if task is not None:
            await _finish(task)


async def _finish(task: asyncio.Task[None]) -> None:
    """Lets the owner task leave its transports (which stops the server); cancels it if that hangs."""
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT)
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions[:3])
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class McpPool:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._sessions: OrderedDict[str, ServerSession] = OrderedDict()

    async def tools(
        self, config: LocalAgentConfig, secrets: Mapping[str, str], workspace: Path
    ) -> tuple[list[McpTool], list[str]]:
        """The run's MCP tools, sorted by name, and a note for each server that is unavailable this run."""
        servers = list(config.mcp_servers)
        results = await asyncio.gather(
            *(self._listed(s, config, secrets, workspace) for s in servers), return_exceptions=True
        )
        notes: list[str] = []
        listed: list[tuple[ServerSession, list[Any]]] = []
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                why = str(result) if isinstance(result, (McpUnavailable, McpServerError)) else _describe(result)
                notes.append(f"{why}; its tools are not offered this run")
                continue
            session, tools = result
            if server.tools is not None:
                tools = [t for t in tools if t.name in server.tools]
            listed.append((session, tools))
        names = namespaced((s.server.name, t.name) for s, tools in listed for t in tools)
        out = [
            McpTool(
                exposed=names[(s.server.name, t.name)],
                server=s.server.name,
                tool=t.name,
                description=t.description or t.title or "",
                schema=t.input_schema,
                call=s.call,
            )
            for s, tools in listed
            for t in tools
        ]
        out.sort(key=lambda t: t.name)
        return out, notes

    async def _listed(
        self, server: McpServer, config: LocalAgentConfig, secrets: Mapping[str, str], workspace: Path
    ) -> tuple[ServerSession, list[Any]]:
        session = self._session(server, config, secrets, workspace)
        return session, await session.start()

    def _session(
        self, server: McpServer, config: LocalAgentConfig, secrets: Mapping[str, str], workspace: Path
    ) -> ServerSession:
        if server.transport == "http":
            headers = server.resolved_headers(secrets)
            material: list[str] = [json.dumps(headers, sort_keys=True)]
        else:
            env = server.resolved_env(secrets)
            material = [json.dumps(env, sort_keys=True), str(workspace), str(config.shell.sandbox)]
        # A digest of the resolved secrets, never the secrets: a rotated key makes a new session.
        key = hashlib.sha256("\0".join([server.model_dump_json(), *material]).encode()).hexdigest()
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
            return session
        log_dir = self.data_dir / "mcp-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{server.name}-{key[:12]}.log"
        if server.transport == "http":
            opener = _http_opener(server.url or "", headers)
        else:
            opener = _stdio_opener(server, env, workspace, config, self.data_dir, log_path)
        session = self._sessions[key] = ServerSession(server, opener, log_path)
        self._evict()
        return session

    def _evict(self) -> None:
        idle = [k for k, s in self._sessions.items() if s.active == 0]
        while len(self._sessions) > MAX_SESSIONS and idle:
            victim = self._sessions.pop(idle.pop(0))
            asyncio.get_running_loop().create_task(victim.close())

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), OrderedDict()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def _http_opener(url: str, headers: dict[str, str]) -> Callable[[], AbstractAsyncContextManager[Any]]:
    @contextlib.asynccontextmanager
    async def open_() -> AsyncIterator[Any]:
        async with create_mcp_http_client(headers=headers) as client:
            async with streamable_http_client(url, http_client=client) as streams:
                yield streams[0], streams[1]

    return open_


def stdio_sandbox(server: McpServer, workspace: Path, data_dir: Path) -> sandboxing.Sandbox:
    """The shell tool's walls, for a server: the workspace read-write (HOME and cwd), the system and the server's
    ro_paths read-only, no network unless the server's settings grant it, nothing of the runner's data dir."""
    reason = sandboxing.probe()
    if reason is not None:
        raise McpUnavailable(
            f"MCP server {server.name} is a stdio server, which runs only inside a sandbox, and none can be started "
            f"here: {reason} (shell.sandbox=false on the binding turns the sandbox off, which is dangerous)"
        )
    check_ro_paths(server, data_dir)
    root = workspace.resolve()
    cwd = server_cwd(server, workspace)
    return sandboxing.Sandbox(
        ro=[*sandboxing.extra_paths(sandboxing.EXTRA_RO_ENV), *server.ro_paths],
        rw=[str(root)],
        network=server.network,
        home=str(root),
        cwd=str(cwd),
    )


def server_cwd(server: McpServer, workspace: Path) -> Path:
    """The server's working directory, made if missing (see `_open_cwd`), as a path. For a sandboxed server only:
    the sandbox resolves the path inside its own walls, where a link swapped in later leads nowhere it could not
    already reach."""
    os.close(_open_cwd(server, workspace))
    root = workspace.resolve()
    return root / server.cwd if server.cwd else root


@contextlib.contextmanager
def held_cwd(server: McpServer, workspace: Path) -> Iterator[str]:
    """The server's working directory for a process started outside any sandbox: `/proc/self/fd/N` of the directory
    `_open_cwd` checked, held open while the server runs (the child changes into it from its own copy of the
    descriptors, before it closes them and execs), so no path is looked up again after the check."""
    fd = _open_cwd(server, workspace)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _open_cwd(server: McpServer, workspace: Path) -> int:
    """A descriptor of the server's working directory, made if missing. The workspace is the model's to write (its
    shell runs beside this process and can plant or swap a symlink at any moment), so the directory is walked one
    component at a time from the workspace's descriptor, each made (mkdirat) and opened (openat) without following
    a link: no path is checked first and used later, so nothing is ever made or opened outside the workspace (in
    another conversation's workspace, the data dir) by this process, which runs outside any sandbox."""
    fd = os.open(workspace.resolve(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in PurePosixPath(server.cwd or ".").parts:  # relative, no '..' (McpServer's own check)
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                raise McpServerError(
                    f"mcp_servers[{server.name}].cwd {server.cwd!r} leads out of the conversation workspace "
                    f"(a symlink or a file at {part!r}: {exc.strerror})"
                ) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_ro_paths(server: McpServer, data_dir: Path) -> None:
    problems = ro_path_problems(server, data_dir)
    # A path the runner's own sandbox does not show would be dropped from the server's (bwrap cannot bind what
    # is not there), and the server would fail on a file the user can see: say so instead.
    problems += [
        reason
        for i, p in enumerate(server.ro_paths)
        if (reason := not_shown(p, f"mcp_servers[{server.name}].ro_paths[{i}]")) is not None
    ]
    if problems:
        raise McpServerError(problems[0])


def _stdio_opener(
    server: McpServer,
    env: dict[str, str],
    workspace: Path,
    config: LocalAgentConfig,
    data_dir: Path,
    log_path: Path,
) -> Callable[[], AbstractAsyncContextManager[Any]]:
    command = [server.command or "", *server.args]

    @contextlib.asynccontextmanager
    async def open_() -> AsyncIterator[Any]:
        if config.shell.sandbox:
            box = stdio_sandbox(server, workspace, data_dir)
            if server.network:  # the shell's allow list, through the runner's egress proxy
                box = await egress.egress_sandbox(box, config.shell.egress_policy())
            argv = box.argv(command)
            cwd = box.cwd
        else:
            log.warning("MCP server %s runs WITHOUT a sandbox (shell.sandbox=false on the binding)", server.name)
            argv, cwd = command, None
        argv = tool_walls.command(argv)
        async with AsyncExitStack() as stack:
            if cwd is None:
                cwd = stack.enter_context(held_cwd(server, workspace))
            # The SDK adds only a few harmless variables (PATH, TERM, USER…) to what the settings name; never the
            # runner's own environment, which is where provider keys would be.
            params = mcp.StdioServerParameters(
                command=argv[0], args=argv[1:], env={**env, "HOME": str(workspace.resolve())}, cwd=cwd
            )
            errlog = stack.enter_context(open(log_path, "w", encoding="utf-8"))
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            yield streams[0], streams[1]

    return open_
