"""Running one harness process: explicit environment, own process group, JSONL stdout, bounded stderr, and a
stop ladder (SIGINT to the group -> grace -> SIGKILL to the group) that leaves nothing behind.

Why a process group: the harness starts its own children (MCP servers, shell tools, background tasks). Signalling
the group reaches all of them, and killing the group after a normal exit reaps stragglers a harness forgot.

A group is not a wall, though: a `setsid cmd &` leaves it. So a run's harness normally runs in a bubblewrap
sandbox (`sandbox=`) with its own pid namespace. Its first process is bwrap's init; when the harness exits,
or that init is killed, or the runner dies (--die-with-parent), the kernel kills everything in the namespace,
whatever session it made for itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agenthost.plugins.sandbox import Sandbox
from agenthost.protos.text import plain_text
from agenthost.runners.external_harness.errors import HarnessCrashed, HarnessNotFound
from agenthost.runners.sdk import tool_walls

# Variables a harness may inherit from the runner process. Everything else (credentials of the host, the
# plugin secret, unrelated tokens) stays out unless a binding names it.
ENV_ALLOWLIST = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "USER",
    "LOGNAME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_CHUNK = 256 * 1024
MAX_LINE_BYTES = 64 * 1024 * 1024  # real harness lines exceed 1 MiB (big tool results); this only stops runaways
STDERR_TAIL_BYTES = 16 * 1024
STDERR_HEAD_BYTES = 4 * 1024  # the first lines usually say what went wrong; a backtrace follows
# After the harness itself exits, how long its leftover children may keep our pipes open before they are killed.
# (A grandchild holding stdout would otherwise keep the turn open until the deadline.)
EXIT_DRAIN_SECONDS = 2.0


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Signals the moment the process exits. `Process.wait()` (3.11) also waits for every pipe to close, which a
    surviving grandchild can delay indefinitely."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()
        # stdout and stderr both at their end: asyncio then closes the transport itself (once the process exited).
        self.outputs_closed = asyncio.Event()
        self._open_outputs = {1, 2}

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        super().pipe_connection_lost(fd, exc)
        self._open_outputs.discard(fd)
        if not self._open_outputs:
            self.outputs_closed.set()


def build_env(
    *,
    inherited: Mapping[str, str],
    allowlist: Iterable[str] = ENV_ALLOWLIST,
    set_env: Mapping[str, str] = (),  # type: ignore[assignment]
) -> dict[str, str]:
    """The harness's whole environment: allowlisted names from `inherited`, then `set_env` on top."""
    env = {name: inherited[name] for name in allowlist if name in inherited}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(dict(set_env))
    return env


def _pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig KILL --` (for a harness run without a sandbox, whose bwrap --die-with-parent does
    this and more): if the runner process dies (SIGKILL, crash), the kernel kills the harness too. A preexec_fn
    calling prctl would do the same without the extra exec, but running Python between fork and exec in a
    process with gRPC threads can crash the child (seen: SIGSEGV), so util-linux does it instead.

    The death signal only covers a parent that dies after it is set: a runner killed between its fork and setpriv's
    prctl (a window of a few execs, long on a loaded machine) would leave the harness running, re-parented. So a
    shell after setpriv checks that its parent is still this runner, and exits instead of starting the harness."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not setpriv:
        return []
    alive = f'[ "$PPID" = {os.getpid()} ] || exit 137\nexec "$@"'
    return [setpriv, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", alive, "agenthost-harness"]


def _inner_pid(pid: int) -> int | None:
    """`pid`'s number in its innermost pid namespace (the last NSpid field), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _child_pid(line: bytes) -> int | None:
    """The `child-pid` of bwrap's first --json-status-fd line, or None (bwrap failed before making a sandbox)."""
    try:
        value = json.loads(line or b"{}").get("child-pid")
    except (json.JSONDecodeError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


async def _drain_status(reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
    try:
        while await reader.read(4096):
            pass
    finally:
        transport.close()


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[redacted]")
    return text


class HarnessProcess:
    """One harness invocation. Use `async with`: leaving the block always stops the whole process group."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        stdin_data: bytes | None = None,
        keep_stdin: bool = False,
        interrupt_grace: float = 3.0,
        secrets: Iterable[str] = (),
        sandbox: Sandbox | None = None,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.stdin_data = stdin_data
        # Open after stdin_data, for later `send`s (a harness that reads one JSON message per line, turn after turn).
        self.keep_stdin = keep_stdin
        self.interrupt_grace = interrupt_grace
        self.secrets = tuple(secrets)
        self.sandbox = sandbox
        # The pid of bwrap's init inside the sandbox (seen from outside): the leader of the group holding the
        # harness, and the process whose death ends the whole pid namespace.
        self.sandbox_init: int | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self._protocol: _ExitAwareProtocol | None = None
        self._reaper_task: asyncio.Task[None] | None = None
        self._stderr = bytearray()
        self._stderr_head = bytearray()
        self._stderr_total = 0
        self._stderr_task: asyncio.Task[None] | None = None
        self._stdin_task: asyncio.Task[None] | None = None
        self._status_task: asyncio.Task[None] | None = None
        self.skipped_lines = 0
        self.interrupted = False
        # stdout not yet parsed into events; kept here, not in a generator, so that a cancelled read loses nothing.
        self._out = bytearray()
        self._out_start = 0
        self._out_eof = False
        self.startup_processes: frozenset[tuple[int, int]] | None = None  # (pid, start time)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def __aenter__(self) -> HarnessProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        exe = self.argv[0]
        if os.sep in exe:
            if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
                raise HarnessNotFound(f"harness executable {exe!r} does not exist or is not executable")
            resolved = exe
        else:
            found = shutil.which(exe, path=self.env.get("PATH", ""))
            if found is None:
                raise HarnessNotFound(f"harness executable {exe!r} not found (PATH={self.env.get('PATH', '')})")
            resolved = found
        loop = asyncio.get_running_loop()
        status_r = status_w = -1
        if self.sandbox is not None:
            # bwrap reports the outside pid of its init on this pipe (JSON, one object per line).
            status_r, status_w = os.pipe()
            sandbox = replace(self.sandbox, extra=(*self.sandbox.extra, "--json-status-fd", str(status_w)))
            command = sandbox.argv([resolved, *self.argv[1:]])
        else:
            command = [*_pdeathsig_prefix(), resolved, *self.argv[1:]]
        command = tool_walls.command(command)
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitAwareProtocol(limit=READ_CHUNK, loop=loop),
                *command,
                cwd=str(self.cwd),
                env=self.env,
                stdin=asyncio.subprocess.PIPE
                if self.stdin_data is not None or self.keep_stdin
                else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_w,) if status_w >= 0 else (),
            )
            self.proc = asyncio.subprocess.Process(transport, protocol, loop)
            self._protocol = protocol
        except FileNotFoundError:
            raise HarnessNotFound(f"harness executable {exe!r} not found (PATH={self.env.get('PATH', '')})") from None
        except PermissionError as exc:
            raise HarnessNotFound(f"cannot execute harness {exe!r}: {exc}") from None
        finally:
            if status_w >= 0:
                os.close(status_w)
        if status_r >= 0:
            status = asyncio.StreamReader()
            status_transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(status), os.fdopen(status_r, "rb", buffering=0)
            )
            # EOF without a status means bwrap failed before creating the sandbox; its stderr says why.
            self.sandbox_init = _child_pid(await status.readline())
            # bwrap writes its exit status here too: keep reading, or that write kills it with SIGPIPE.
            self._status_task = asyncio.create_task(_drain_status(status, status_transport))
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._reaper_task = asyncio.create_task(self._reap_after_exit())
        if self.stdin_data is not None:
            self._stdin_task = asyncio.create_task(self._feed_stdin(self.stdin_data, close=not self.keep_stdin))

    async def _feed_stdin(self, data: bytes, *, close: bool) -> None:
        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the harness exited early; its exit code and stderr tell why
        finally:
            if close:
                with contextlib.suppress(Exception):
                    self.proc.stdin.close()

    async def send(self, data: bytes) -> None:
        """Writes more input to a process started with `keep_stdin`. A harness that has exited is not an error
        here: its stdout ends, and the turn reading it reports the exit."""
        if self._stdin_task is not None and not self._stdin_task.done():
            await self._stdin_task  # in order after stdin_data
        self._stdin_task = asyncio.create_task(self._feed_stdin(data, close=False))
        await self._stdin_task

    def sandbox_processes(self) -> dict[int, tuple[int, int]] | None:
        """Every process in the sandbox's pid namespace: outside pid -> (parent pid, start time). What a kept
        process's sandbox holds between messages (warm.py). None without a sandbox, or once it is gone."""
        if self.sandbox_init is None or not self.running:
            return None
        try:
            namespace = os.readlink(f"/proc/{self.sandbox_init}/ns/pid")
        except OSError:
            return None
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
                found[int(entry.name)] = (int(fields[1]), int(fields[19]))
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile, or not ours to read (then not in our sandbox either)
        return found

    def note_started(self) -> None:
        """Records what the sandbox holds once the harness is up, MCP servers it started included: processes
        `left_running` then does not count. Called by the runner at the harness's first `init` line, before any
        tool could run (a tool needs a model reply first)."""
        if self.startup_processes is None:
            procs = self.sandbox_processes()
            self.startup_processes = frozenset((pid, start) for pid, (_, start) in (procs or {}).items())

    def left_running(self) -> set[int] | None:
        """Processes in the sandbox other than its init, the harness, and what `note_started` saw: what the turns'
        commands left running. None when that cannot be known (no sandbox, or the sandbox gone)."""
        procs = self.sandbox_processes()
        if procs is None:
            return None
        # The harness is init's first child: an orphan (a `setsid` escapee) is re-parented to init too, later.
        children = sorted((start, pid) for pid, (parent, start) in procs.items() if parent == self.sandbox_init)
        allowed = {self.sandbox_init}
        if children:
            allowed.add(children[0][1])
        allowed |= {pid for pid, start in self.startup_processes or () if procs.get(pid, (0, -1))[1] == start}
        # The sandbox's own helpers (the egress forwarder), known by their pid inside it.
        helpers = getattr(self.sandbox, "helper_pids", ())
        allowed |= {pid for pid in procs if helpers and _inner_pid(pid) in helpers}
        return set(procs) - allowed

    async def end_input(self) -> None:
        """Closes stdin after what was sent (a `keep_stdin` process's way to finish)."""
        if self._stdin_task is not None and not self._stdin_task.done():
            with contextlib.suppress(Exception):
                await self._stdin_task
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self._out_eof

    def forget_stderr(self) -> None:
        """Starts stderr afresh: what a kept process printed during an earlier turn is not this turn's reason."""
        self._stderr.clear()
        self._stderr_head.clear()
        self._stderr_total = 0

    async def _reap_after_exit(self) -> None:
        assert self._protocol is not None
        await self._protocol.exited.wait()
        await asyncio.sleep(EXIT_DRAIN_SECONDS)
        self._signal_group(signal.SIGKILL)

    async def _exited(self) -> int:
        assert self.proc is not None and self._protocol is not None
        await self._protocol.exited.wait()
        code = self.proc.returncode
        return code if code is not None else -1

    async def _drain_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        while chunk := await self.proc.stderr.read(READ_CHUNK):
            if len(self._stderr_head) < STDERR_HEAD_BYTES:
                self._stderr_head += chunk[: STDERR_HEAD_BYTES - len(self._stderr_head)]
            self._stderr_total += len(chunk)
            self._stderr += chunk
            if len(self._stderr) > 2 * STDERR_TAIL_BYTES:
                del self._stderr[:-STDERR_TAIL_BYTES]

    def stderr_tail(self, limit: int = 4000) -> str:
        """What the user sees of stderr: all of it when short, else its beginning and its end; as plain text,
        since it ends up in a run's error message and on people's terminals."""
        if self._stderr_total <= limit:
            raw = bytes(self._stderr[-limit:])
        else:
            half = limit // 2
            raw = bytes(self._stderr_head[:half]) + b"\n[...]\n" + bytes(self._stderr[-half:])
        return redact(plain_text(raw.decode("utf-8", errors="replace")).strip(), self.secrets)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The JSON objects the harness prints, one per line, of any size up to MAX_LINE_BYTES.

        Lines that are not JSON objects (debug noise some builds print on stdout) are skipped and counted.
        """
        while (event := await self.next_event()) is not None:
            yield event

    async def next_event(self) -> dict[str, Any] | None:
        """The next JSON object the harness prints, or None at the end of its stdout.

        Safe to cancel and call again: the unparsed rest of stdout lives on the process, not in this frame. That is
        what lets a kept process be watched while idle (a task waiting here) and the watch be dropped for a turn.
        """
        assert self.proc and self.proc.stdout
        buf = self._out
        while True:
            while (nl := buf.find(b"\n", self._out_start)) >= 0:
                event = self._parse(bytes(buf[self._out_start : nl]))
                self._out_start = nl + 1
                if event is not None:
                    return event
            del buf[: self._out_start]
            self._out_start = 0
            if self._out_eof:
                return None
            chunk = await self.proc.stdout.read(READ_CHUNK)
            if not chunk:
                self._out_eof = True
                rest = bytes(buf)
                buf.clear()
                return self._parse(rest) if rest.strip() else None
            buf += chunk
            if len(buf) > MAX_LINE_BYTES:
                raise HarnessCrashed(f"harness printed a line longer than {MAX_LINE_BYTES} bytes")

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        line = line.strip()
        if not line.startswith(b"{"):
            if line:
                self.skipped_lines += 1
            return None
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.skipped_lines += 1
            return None
        return value if isinstance(value, dict) else None

    async def wait(self) -> int:
        """The exit code, once the process has exited (not once every descendant let go of the pipes)."""
        code = await self._exited()
        if self._stderr_task:
            # stderr may still hold the reason the harness exited; give the drain a moment to finish.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._stderr_task), timeout=2)
        return code

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.sandbox is not None:
            # bwrap itself forwards no signal, so they go to its init's group (init ignores them; the harness,
            # which shares that group, gets them). Once bwrap has exited the namespace is gone, and its init's
            # pid may name an unrelated process: nothing is signalled then.
            if self.proc.returncode is not None:
                return
            if self.sandbox_init is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if sig == signal.SIGKILL:
                        os.kill(self.sandbox_init, sig)  # the init's death kills the whole pid namespace
                    else:
                        os.killpg(self.sandbox_init, sig)
            if sig != signal.SIGKILL:
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def interrupt(self) -> None:
        """SIGINT the group (harnesses end the turn cleanly on it), then SIGKILL whatever is left after grace."""
        if self.proc is None:
            return
        self.interrupted = True
        if self.proc.returncode is None:
            self._signal_group(signal.SIGINT)
            try:
                await asyncio.wait_for(self._exited(), timeout=self.interrupt_grace)
            except TimeoutError:
                pass
        self._signal_group(signal.SIGKILL)
        await self._exited()

    async def stop(self, *, wind_down: bool = True) -> None:
        """Idempotent; safe to call from `finally` while the surrounding task is being cancelled. `wind_down`
        False: SIGKILL at once, for a process that was never handed a message (a spare), which has no turn to end
        cleanly: the interrupt's grace would only be waited out (a runner's close waited 10 s for one)."""
        if self.proc is None:
            return
        try:
            if self.proc.returncode is None and not wind_down:
                self._signal_group(signal.SIGKILL)
                await self._exited()
            elif self.proc.returncode is None:
                await self.interrupt()
            else:
                self._signal_group(signal.SIGKILL)  # stragglers of a harness that exited on its own
        except asyncio.CancelledError:
            self._signal_group(signal.SIGKILL)
            raise
        finally:
            for task in (self._stdin_task, self._stderr_task, self._reaper_task, self._status_task):
                if task and not task.done():
                    task.cancel()
            if self.proc.stdin is not None:  # a `keep_stdin` pipe, left open by a process stopped mid-conversation
                with contextlib.suppress(Exception):
                    self.proc.stdin.close()
        if self._protocol is not None and self.proc.returncode is not None:
            # Its outputs end as soon as the last holder is gone (the sandbox's are, with its init): wait for that,
            # briefly, so no pipe of a stopped harness is left open for the garbage collector to close.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._protocol.outputs_closed.wait(), EXIT_DRAIN_SECONDS)
