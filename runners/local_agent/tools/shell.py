"""The shell tool and its isolated executor.

Every command runs in a bubblewrap sandbox of its own (`agenthost.plugins.sandbox`): the conversation's workspace
read-write at its own path (also $HOME and the working directory), the read-only system, a private /tmp, a network
namespace of its own (with `network: true`, its only way out is the runner's egress proxy, to `allowed_domains` or
any public host: agenthost.runners.sdk.egress), and nothing of the runner's data dir, other workspaces, the host's
files or sockets. Its own pid namespace means the command cannot outlive the call: when the command's main process
exits, bwrap exits, and with it the namespace's init, which makes the kernel kill every process left inside (a
`setsid cmd &`, a double fork, a daemon). A timeout or cancel kills bwrap, with the same effect, and so does the
runner's own death (`--die-with-parent`).

Around that, as before: an explicit environment (never the runner's: that holds provider keys), stdin closed,
its own process group, a blocklist, and bounded output that keeps the head and the tail. `sandbox: false` in the
binding runs commands without the sandbox; only the process-group kill and the ledger below then contain them.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agenthost.plugins import sandbox as sandboxing
from agenthost.runners.local_agent.config import ShellConfig
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError
from agenthost.runners.sdk import egress, tool_walls, workspace_budget

log = logging.getLogger("agenthost.local_agent")

TIMEOUT_EXIT = 124
# Grandchildren started with `cmd &` keep the pipe open after the shell exits; stop reading shortly after.
DRAIN_GRACE_SECONDS = 0.3
# A sandbox's pid namespace is torn down by the kernel once bwrap is gone; its pipe reaches EOF when the last
# process in it has exited, which is how the call knows nothing is left. Bounded in case that never comes; the
# bound is generous because it is only reached when the kernel is slow to tear down (a loaded machine, a fork bomb
# next door), and returning before then would let the call end with its processes still alive.
SANDBOX_EXIT_SECONDS = 10.0

DEFAULT_BLOCKLIST = [
    r"\brm\s+(-[a-zA-Z]*\s+)*-[a-zA-Z]*[rR][a-zA-Z]*\s+(-[a-zA-Z]*\s+)*(/|~|\$HOME)(\s|$|\*)",
    r"\bsudo\b",
    r"\bsu\s+-?\s*\w*\s*$",
    r"\b(shutdown|reboot|halt|poweroff)\b",
    r"\bmkfs(\.\w+)?\b",
    r"\bdd\b[^|;&]*\bof=/dev/",
    r">\s*/dev/(sd|nvme|hd|disk)",
    r":\(\)\s*\{\s*:\|:&\s*\};:",  # fork bomb
    r"\bchmod\s+(-R\s+)?[0-7]*7[0-7]{2}\s+/(\s|$)",
]
# Names that must never reach a tool subprocess, even when a binding asks to pass them through.
_BASE_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "TZ")


class ProcessLedger:
    """Process groups of running unsandboxed commands (`sandbox: false`), one file each, so a runner restarted
    after a SIGKILL can kill what its predecessor left running (commands run in their own session, out of reach
    of a kill of the runner's group). A group is only killed if its leader's start time still matches: pids get
    reused. Sandboxed commands are not recorded: bwrap dies with the runner and takes its pid namespace along.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def record(self, pid: int) -> None:
        start = sandboxing.proc_start_time(pid)
        if start is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / str(pid)).write_text(start)

    def forget(self, pid: int) -> None:
        (self.directory / str(pid)).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Kills every recorded group whose leader is still the process we started; returns how many."""
        killed = 0
        if not self.directory.is_dir():
            return 0
        for entry in self.directory.iterdir():
            if entry.name.isdigit():
                pid = int(entry.name)
                recorded = entry.read_text().strip()
                if recorded and sandboxing.proc_start_time(pid) == recorded:
                    _kill_group(pid)
                    killed += 1
            entry.unlink(missing_ok=True)
        return killed


@dataclass
class ShellResult:
    exit_code: int
    output: str
    timed_out: bool
    omitted_chars: int
    quota_error: str | None = None  # the workspace passed its budget and the command was killed


def build_env(config: ShellConfig, workspace: Path, source: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if source is None else source
    env = {k: source[k] for k in _BASE_ENV_NAMES if k in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(workspace)
    env["TERM"] = "dumb"
    env["PAGER"] = "cat"
    for name in config.env_passthrough:
        if sandboxing.SECRET_NAME.search(name):
            continue
        if name in source:
            env[name] = source[name]
    env.update(config.env)
    return env


def check_blocklist(command: str, extra: list[str]) -> None:
    for pattern in DEFAULT_BLOCKLIST + extra:
        if re.search(pattern, command):
            raise ToolError(f"command refused by the safety blocklist (matched {pattern!r})")


class _Capture:
    """Keeps the first 40% and the last 60% of the budget; counts what falls in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = int(limit * 0.4)
        self.tail_limit = limit - self.head_limit
        self.head: list[str] = []
        self.head_len = 0
        self.tail = ""
        self.omitted = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if not text:
            return
        room = self.head_limit - self.head_len
        if room > 0:
            self.head.append(text[:room])
            self.head_len += min(room, len(text))
            text = text[room:]
        if text:
            self.tail += text
            if len(self.tail) > self.tail_limit:
                cut = len(self.tail) - self.tail_limit
                self.omitted += cut
                self.tail = self.tail[cut:]

    def render(self) -> str:
        head = "".join(self.head)
        if self.omitted:
            return f"{head}\n… [{self.omitted} chars omitted] …\n{self.tail}"
        return head + self.tail


async def run_command(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,  # noqa: ASYNC109 — enforced here with a process-group kill, not by cancelling the caller
    max_output_chars: int,
    ledger: ProcessLedger | None = None,
    sandbox: sandboxing.Sandbox | None = None,
    budget: workspace_budget.Budget | None = None,
) -> ShellResult:
    argv = ["/bin/sh", "-c", command]
    info_r = info_w = -1
    if sandbox is not None:
        # bwrap reports the pid of the namespace's init on --info-fd; its exit is the proof that nothing of the
        # command is left (the kernel kills and reaps every process of a pid namespace before its init is gone).
        info_r, info_w = os.pipe()
        os.set_blocking(info_r, False)
        argv = replace(sandbox, extra=(*sandbox.extra, "--info-fd", str(info_w))).argv(argv)
        ledger = None  # nothing to sweep after a crash: --die-with-parent and the pid namespace cover it
    argv = tool_walls.command(argv, **({"max_file_bytes": budget.limit_bytes} if budget else {}))
    # subprocess.Popen rather than asyncio's: asyncio's Process.wait() also waits for the pipes to close, so a
    # background child (`cmd &`) holding stdout would make a finished command look like it is still running.
    # Started from the loop's thread, not a worker: bwrap's --die-with-parent watches the thread that forked it.
    loop = asyncio.get_running_loop()
    try:
        proc = subprocess.Popen(  # noqa: ASYNC220 — Popen returns at once; waiting happens off the loop
            argv,
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own process group, so a kill reaches every descendant (unsandboxed) or bwrap and the sandbox's
            # init (sandboxed: their death ends the pid namespace and everything in it).
            start_new_session=True,
            pass_fds=(info_w,) if info_w >= 0 else (),
        )
    except BaseException:
        if info_r >= 0:
            os.close(info_r)
        raise
    finally:
        if info_w >= 0:
            os.close(info_w)
    if ledger is not None:
        ledger.record(proc.pid)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    capture = _Capture(max_output_chars)
    eof = asyncio.Event()

    def on_readable() -> None:
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    loop.remove_reader(fd)
                    eof.set()
                    return
                capture.feed(chunk)
        except BlockingIOError:
            return
        except OSError:
            loop.remove_reader(fd)
            eof.set()

    loop.add_reader(fd, on_readable)
    over: list[str] = []
    watcher = asyncio.create_task(_watch(budget, proc.pid, over)) if budget is not None else None
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.to_thread(proc.wait)), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await asyncio.to_thread(proc.wait)
        # The shell is gone; give its pipe a moment to drain, then stop even if a background child holds it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(eof.wait(), DRAIN_GRACE_SECONDS)
    finally:
        if watcher is not None:
            watcher.cancel()
        # Always: the group may hold background children of a finished shell, or we are being cancelled.
        _kill_group(proc.pid)
        loop.remove_reader(fd)
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        if sandbox is not None:
            # Blocking, but only for the moments the kernel takes to kill what was left in the namespace, and
            # it also runs when we are cancelled: the call must not return while a process of it survives.
            deadline = time.monotonic() + SANDBOX_EXIT_SECONDS
            _drain_until_eof(fd, capture, deadline)
            _wait_namespace_gone(info_r, deadline)
        on_readable_final(fd, capture)
        proc.stdout.close()
        if ledger is not None:
            ledger.forget(proc.pid)
    capture.feed(b"", final=True)
    code = TIMEOUT_EXIT if timed_out else (proc.returncode if proc.returncode is not None else -1)
    return ShellResult(
        exit_code=code,
        output=capture.render(),
        timed_out=timed_out,
        omitted_chars=capture.omitted,
        quota_error=over[0] if over else None,
    )


async def _watch(budget: workspace_budget.Budget, pid: int, over: list[str]) -> None:
    """Kills the command's group once the workspace passes its budget."""
    over.append(await workspace_budget.watch(budget))
    _kill_group(pid)


def _wait_namespace_gone(info_fd: int, deadline: float) -> None:
    """Waits (bounded) until the sandbox's init has exited; closes info_fd."""
    try:
        try:
            info = json.loads(os.read(info_fd, 65536).decode() or "{}")
        except (OSError, ValueError):
            return  # bwrap failed before starting anything
        pid = info.get("child-pid") if isinstance(info, dict) else None
        if not isinstance(pid, int):
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # already gone
        try:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(pidfd)
    finally:
        os.close(info_fd)


def _drain_until_eof(fd: int, capture: _Capture, deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not chunk:
            return
        capture.feed(chunk)


def on_readable_final(fd: int, capture: _Capture) -> None:
    """Picks up what is already buffered in the pipe without waiting for writers that may never close it."""
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            capture.feed(chunk)
    except OSError:
        return


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def command_sandbox(config: ShellConfig, workspace: Path) -> sandboxing.Sandbox | None:
    """The walls for one command, or None when the binding opted out; ToolError when none can be built."""
    if not config.sandbox:
        log.warning(
            "shell tool: running a command WITHOUT a sandbox (the binding sets shell.sandbox=false); it can read "
            "and write everything this runner can"
        )
        return None
    reason = sandboxing.probe()
    if reason is not None:
        raise ToolError(
            f"the shell tool is unavailable: commands run only inside a sandbox, and none can be started here: "
            f"{reason}. (An administrator can set shell.sandbox=false on the binding to run commands without "
            "one, which is dangerous.)"
        )
    # Mounted at its real path, so paths the model sees in tool results and in the shell agree.
    root = str(workspace.resolve())
    # The user's extra read-only paths (a toolchain under $HOME) come along; the extra read-write ones do not:
    # a directory shared by every plugin would be a channel between conversations.
    return sandboxing.Sandbox(
        ro=sandboxing.extra_paths(sandboxing.EXTRA_RO_ENV),
        rw=[root],
        network=config.network,
        home=root,
        cwd=root,
    )


class Shell(Tool):
    name = "shell"
    description = (
        "Run a shell command (/bin/sh -c) in the workspace, inside a sandbox: the workspace is writable (it is "
        "also $HOME), the system is read-only, /tmp is private and emptied after each command, and anything "
        "still running when the command ends is killed (no background servers across calls). stdout and stderr "
        "are combined; long output keeps its beginning and end. There is no stdin, and the runner's credentials "
        "are not in the environment. Set timeout_seconds for slow commands."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1},
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        cfg = ctx.config.shell
        command: str = args["command"]
        check_blocklist(command, cfg.extra_blocklist)
        timeout = min(float(args.get("timeout_seconds", cfg.timeout_seconds)), 3600.0)
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        budget = workspace_budget.Budget(
            ctx.workspace, ctx.config.workspace_max_mib * workspace_budget.MIB, "workspace_max_mib"
        )
        refusal = await asyncio.to_thread(budget.check)
        if refusal is not None:
            raise ToolError(f"command not started: {refusal}")
        sandbox = command_sandbox(cfg, ctx.workspace)
        if sandbox is not None and cfg.network:
            sandbox = await egress.egress_sandbox(sandbox, cfg.egress_policy())
        workspace = Path(sandbox.cwd) if sandbox is not None and sandbox.cwd else ctx.workspace
        result = await run_command(
            command,
            cwd=workspace,
            env=build_env(cfg, workspace),
            timeout=timeout,
            max_output_chars=cfg.max_output_chars,
            ledger=ctx.ledger,
            sandbox=sandbox,
            budget=budget,
        )
        if result.quota_error is not None:
            raise ToolError(f"command killed: {result.quota_error}\n{result.output}")
        if result.timed_out:
            raise ToolError(
                f"command timed out after {timeout:g}s and was killed (exit {TIMEOUT_EXIT}); "
                f"pass a larger timeout_seconds if it needs longer.\n{result.output}"
            )
        body = result.output if result.output else "(no output)"
        if result.exit_code != 0:
            raise ToolError(f"exit code {result.exit_code}\n{body}")
        return body
