"""Claude Code processes kept between the messages of a conversation, so the next message skips the CLI's start-up.

Why: of a trivial turn through Claude Code, about 0.5 s is the CLI starting (its own start-up, the MCP connection,
the session file read back on `--resume`). A process reading one JSON message per line from stdin
(`--input-format stream-json`) answers the conversation's next message without any of that: 0.04-0.09 s measured
against ~0.6 s for a new `claude -p --resume`.

What stays as it was with one process per message:

* **Walls.** The kept process stays in its sandbox (the conversation's workspace, its bwrap, its pid namespace) and
  keeps its host bridge (on its own pipes, mcp_control.py, or its loopback endpoint and token, mcp_http.py). The
  bridge reaches the run being answered and no other: when a turn ends, however it ends, the runner detaches the
  run (`attach(None)`), which cancels its host calls in flight and closes its host client, so between messages
  every tool call is refused; the next turn attaches its own run's credentials. A binding on the stdio bridge
  (whose process holds a run's token in its environment) is never kept. Nothing a turn's commands started may
  stay: a turn that leaves a process in the sandbox (beyond the harness and what it started before any tool
  could run) ends the sandbox with it.
* **What the process read at start-up.** It is reused only when the command line, the binary, the environment, the
  sandbox, the bridge's transport and tool list, and the files the CLI reads once at start (the projected
  CLAUDE.md, the MCP config, the appended system prompt, the skills, the settings files) are unchanged, and it
  holds the session stored for the conversation. Anything else (a new binding config, a rotated key, an edited
  CLAUDE.md, a reset session) stops it, and the turn starts a new process that resumes the stored session,
  exactly as before.
* **Only clean turns.** A turn that failed, timed out, was cancelled or whose process exited stops the process; only
  a turn that ended with the CLI's own `result` of success keeps it.
* **Nothing from between turns.** An idle process should print nothing but requests to its bridge (answered, every
  tool refused). If it prints anything else, or exits, while kept, it is retired, so stray output is never taken
  for the next message's reply.
* **Bounded.** At most MAX_KEPT processes per runner process (the least recently used is stopped first), each for
  at most the binding's `keep_warm_seconds` idle; all stop with the runner (and, through bwrap's
  --die-with-parent, with the runner's death).

Spares: a conversation's first message. A kept process serves a conversation's later messages; its first would
still wait for the CLI to start (~0.5 s). So after a turn that kept its process, the runner also starts one spare
process for the binding (at most one per binding; MAX_SPARES in all, never one in place of another binding's),
as a new conversation's would start: the same
command line and environment, its own new session id, the binding's bridge with no run attached, the projected
start-up files, and its own sandbox around a fresh directory (a slot, workspace.py). Claude Code reads nothing of a
conversation before its first message; the managed block holds nothing of one (projection.py). The bot's next new
conversation claims the spare's slot as its working directory and gives the spare its first message, if the
fingerprint, computed after that turn's projection, is the spare's; otherwise the spare stops and a process starts
as before. A spare answers the CLI's start-up MCP requests (tools are refused, as between turns), is retired like a
kept process if it prints anything else or exits, stops after the binding's `keep_warm_seconds` unclaimed, and
its slot goes with it. A spare holds no run's credentials and has seen no message, so no conversation can reach
another's through it.

Codex is not kept: `codex exec` answers one prompt per process. It gets spares alone (CodexConfig.spare_process,
after every clean turn): `codex exec -` reads its whole prompt from stdin, and before the prompt has come it has
done its start-up, which in a new conversation's own Codex home is mostly creating and migrating its state
databases (0.3-0.5 s of a 0.4 s bare turn, measured 2026-11-27); it connects to its MCP servers only once the
prompt has come. The claiming turn writes the prompt and closes stdin. The same rules hold: no run attached to its
bridge, no message seen, a fresh slot and home of its own, the fingerprint (its AGENTS.md files, config.toml and
.agents/skills among the start-up files).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenthost.runners.external_harness.claude_code import APPEND_PROMPT_FILE
from agenthost.runners.external_harness.mcp_control import McpControl, is_control
from agenthost.runners.external_harness.mcp_http import McpHttpEndpoint
from agenthost.runners.external_harness.process import HarnessProcess
from agenthost.runners.external_harness.projection import SKILL_DIRS
from agenthost.runners.external_harness.workspace import SpareSlot, Workspace

# The bridges a runner serves itself, which a kept process keeps and each turn attaches to its run.
RunnerBridge = McpControl | McpHttpEndpoint
# An idle Claude Code process holds ~110 MiB of its own memory (measured with 2.1.332; its code pages are shared).
MAX_KEPT = 4
MAX_SPARES = 2  # spare processes per runner process, for as many bindings
SESSION_FLAGS = ("--resume", "--session-id")
# Between messages no run is attached to a kept process's bridge; a tool call then gets this.
BETWEEN_TURNS = "no message is being answered: host tools work only during a turn"


def startup_files(workspace: Workspace) -> list[Path]:
    """What Claude Code reads once when it starts and not again for a later message of the same process, and what
    a spare Codex may have read before its prompt came (its AGENTS.md files and config.toml)."""
    ws, agenthost, config = workspace.working_dir, workspace.agenthost_dir, workspace.claude_config_dir
    codex = workspace.codex_home
    return [
        ws / "AGENTS.md",
        ws / "AGENTS.override.md",
        codex / "AGENTS.md",
        codex / "AGENTS.override.md",
        codex / "config.toml",
        ws / "CLAUDE.md",
        ws / "CLAUDE.local.md",
        ws / ".claude" / "CLAUDE.md",
        ws / ".claude" / "settings.json",
        ws / ".claude" / "settings.local.json",
        agenthost / "mcp.json",
        agenthost / APPEND_PROMPT_FILE,
        agenthost / "skills.json",
        config / "CLAUDE.md",
        config / "settings.json",
    ]


def fingerprint(argv: list[str], env: dict[str, str], *, workspace: Workspace, sandbox: Any) -> str:
    """A digest of what a process took in at start-up, apart from the session it resumes: equal fingerprints mean
    a new process would start the same way."""
    digest = hashlib.sha256()
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in SESSION_FLAGS:
            skip = True
        else:
            args.append(arg)
    digest.update(json.dumps([args, sorted(env.items()), repr(sandbox)]).encode())
    with contextlib.suppress(OSError, IndexError):  # the binary itself: an upgrade in place means a new process
        stat = Path(argv[0]).stat()
        digest.update(f"{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    # The files by what stat says, not their bytes: a rewrite changes the mtime (an atomic one the inode), the runner
    # writes them only when their content changes, and a read is no part of it: nothing here can be made to block
    # (a FIFO a model planted) or to read what a symlink points out of the workspace. The skill files too: the
    # manifest names only the runner's own, and a user's may sit beside them.
    paths = startup_files(workspace)
    for skills in (workspace.working_dir / name for name in SKILL_DIRS):
        paths += sorted(skills.rglob("*")) if skills.is_dir() else []
    for path in paths:
        digest.update(b"\0" + str(path).encode() + b"\0")
        with contextlib.suppress(OSError):
            st = path.stat()
            digest.update(f"{st.st_mode}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return digest.hexdigest()


@dataclass(eq=False)
class KeptHarness:
    """A Claude Code process between two messages of its conversation, with its host MCP bridge (None without one)."""

    proc: HarnessProcess
    bridge: RunnerBridge | None
    fingerprint: str
    session_id: str
    # Its bridge's transport and what it lists (granted APIs, approvals): the CLI listed the tools once, at start-up.
    grant: str = ""
    cost_usd: float = 0.0  # the process's running total_cost_usd after its last turn
    # A spare's directory (and fresh, with no message yet) until a conversation claims it; removed with it otherwise.
    slot: SpareSlot | None = None
    _watch: asyncio.Task[Any] | None = field(default=None, repr=False)
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    async def idle(self) -> dict[str, Any] | None:
        """Waits while the process is idle, for the first line that is not the bridge's (which it answers, as the
        CLI connects to its MCP servers at start-up), or for stdout's end (None). Cancel-safe: see `next_event`."""
        while True:
            raw = await self.proc.next_event()
            if raw is None or not (is_control(raw) and isinstance(self.bridge, McpControl)):
                return raw
            self.bridge.receive(raw)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        try:
            # A spare no conversation claimed has had no message: nothing to wind down.
            await self.proc.stop(wind_down=self.slot is None or self.slot.claimed)
        finally:
            try:
                if self.bridge is not None:
                    await self.bridge.close()
            finally:
                if self.slot is not None:
                    self.slot.discard()


Key = tuple[str, str]  # (bot_id, conversation_id); for spares (bot_id, the binding's digest)


class KeptHarnesses:
    """The runner's kept processes, one per conversation at most (or its spares, one per binding). A kept process is
    used under the conversation's lock: taken out for a turn and put back after it, so no two turns ever share one;
    a spare is taken once, by one conversation."""

    def __init__(self, capacity: int = MAX_KEPT) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[Key, KeptHarness] = OrderedDict()
        self._stopping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: Key) -> bool:
        return key in self._kept

    async def take(self, key: Key) -> KeptHarness | None:
        """The conversation's kept process, ready for a turn, or None (never kept, expired, or retired because it
        printed something or exited while idle)."""
        kept = self._kept.pop(key, None)
        if kept is None:
            return None
        if kept._timer is not None:
            kept._timer.cancel()
        watch, kept._watch = kept._watch, None
        if watch is not None and not watch.done():
            watch.cancel()
            try:
                # The read it was waiting in gives nothing up when cancelled (HarnessProcess.next_event).
                await asyncio.wait([watch])
            except BaseException:  # the turn taking it was cancelled here: out of the pool, it must not linger
                self._stop_later(kept)
                raise
        if (watch is not None and not watch.cancelled()) or not kept.proc.running:
            await kept.stop()
            return None
        return kept

    async def put(self, key: Key, kept: KeptHarness, idle_seconds: float) -> None:
        """Keeps `kept` for the conversation's next message, for at most `idle_seconds`."""
        old = self._kept.pop(key, None)
        if old is not None and old is not kept:
            await old.stop()
        if kept.bridge is not None:
            await kept.bridge.attach(None, unavailable_reason=BETWEEN_TURNS)
        kept._watch = asyncio.create_task(kept.idle())
        kept._watch.add_done_callback(lambda watch: self._retire(key, kept, watch))
        kept._timer = asyncio.get_running_loop().call_later(idle_seconds, self._retire, key, kept, None)
        self._kept[key] = kept
        while len(self._kept) > self.capacity:
            _, oldest = self._kept.popitem(last=False)
            self._stop_later(oldest)

    def _retire(self, key: Key, kept: KeptHarness, watch: asyncio.Task[Any] | None) -> None:
        """Idle time is up (`watch` None), or the idle process printed or exited: stop it, unless a turn has
        taken it since (then `take` cancelled that watch, and the process may even be kept again by now)."""
        if watch is not None and (watch.cancelled() or watch is not kept._watch):
            return
        if watch is not None:
            watch.exception()  # a line too long to parse, say: retired all the same, and the error not left unread
        if self._kept.get(key) is kept:
            del self._kept[key]
            self._stop_later(kept)

    def _stop_later(self, kept: KeptHarness) -> None:
        task = asyncio.create_task(kept.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        kept, self._kept = list(self._kept.values()), OrderedDict()
        for item in kept:
            await item.stop()
        if self._stopping:
            await asyncio.wait(list(self._stopping), timeout=10)
