"""The shell tool and its isolated executor.

Commands run in their own process group with an explicit environment (never the runner's: that holds provider
keys), stdin closed, a timeout that kills the whole group, and bounded output that keeps the head and the tail.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent.config import ShellConfig
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

TIMEOUT_EXIT = 124
# Grandchildren started with `cmd &` keep the pipe open after the shell exits; stop reading shortly after.
DRAIN_GRACE_SECONDS = 0.3

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
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
_BASE_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "TZ")


class ProcessLedger:
    """Process groups of running commands, one file each, so a runner restarted after a SIGKILL can kill what
    its predecessor left running (commands run in their own session, out of reach of a kill of the runner's
    group). A group is only killed if its leader's start time still matches: pids get reused.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def _start_time(pid: int) -> str | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return stat.rsplit(")", 1)[1].split()[19]

    def record(self, pid: int) -> None:
        start = self._start_time(pid)
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
                if recorded and self._start_time(pid) == recorded:
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


def build_env(config: ShellConfig, workspace: Path, source: Mapping[str, str] | None = None) -> dict[str, str]:
    source = os.environ if source is None else source
    env = {k: source[k] for k in _BASE_ENV_NAMES if k in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(workspace)
    env["TERM"] = "dumb"
    env["PAGER"] = "cat"
    for name in config.env_passthrough:
        if _SECRET_NAME.search(name):
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
) -> ShellResult:
    # subprocess.Popen rather than asyncio's: asyncio's Process.wait() also waits for the pipes to close, so a
    # background child (`cmd &`) holding stdout would make a finished command look like it is still running.
    loop = asyncio.get_running_loop()
    proc = subprocess.Popen(  # noqa: ASYNC220 — Popen returns at once; waiting happens off the loop
        ["/bin/sh", "-c", command],
        cwd=str(cwd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a kill reaches every descendant
    )
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
        # Always: the group may hold background children of a finished shell, or we are being cancelled.
        _kill_group(proc.pid)
        loop.remove_reader(fd)
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        on_readable_final(fd, capture)
        proc.stdout.close()
        if ledger is not None:
            ledger.forget(proc.pid)
    capture.feed(b"", final=True)
    code = TIMEOUT_EXIT if timed_out else (proc.returncode if proc.returncode is not None else -1)
    return ShellResult(exit_code=code, output=capture.render(), timed_out=timed_out, omitted_chars=capture.omitted)


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


class Shell(Tool):
    name = "shell"
    description = (
        "Run a shell command (/bin/sh -c) in the workspace. stdout and stderr are combined; long output keeps "
        "its beginning and end. There is no stdin, and the runner's credentials are not in the environment. "
        "Set timeout_seconds for slow commands."
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
        result = await run_command(
            command,
            cwd=ctx.workspace,
            env=build_env(cfg, ctx.workspace),
            timeout=timeout,
            max_output_chars=cfg.max_output_chars,
            ledger=ctx.ledger,
        )
        if result.timed_out:
            raise ToolError(
                f"command timed out after {timeout:g}s and was killed (exit {TIMEOUT_EXIT}); "
                f"pass a larger timeout_seconds if it needs longer.\n{result.output}"
            )
        body = result.output if result.output else "(no output)"
        if result.exit_code != 0:
            raise ToolError(f"exit code {result.exit_code}\n{body}")
        return body
