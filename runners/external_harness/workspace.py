"""Where a harness runs: a working directory per conversation and a config home per bot.

Both harnesses key their saved sessions by (config dir, cwd): Claude Code under
`$CLAUDE_CONFIG_DIR/projects/<cwd-slug>/`, Codex filters `exec resume` by cwd. So every turn of a conversation
must run in the same directory with the same config dir, which is why both paths are pure functions of
(bot id, conversation id) and never of the run.

Ids come from the host but are still untrusted as path material: each becomes a readable, sanitised prefix plus
a hash of the full id, so two ids never share a directory and none can climb out of the root.

A conversation's directory may also be a spare's (warm.py): a Claude Code process is started ahead, in a slot
under `<root>/<bot>/.spares/`, and the bot's next new conversation claims that slot by a symlink from its own path
(atomic: a conversation already there keeps its directory). Everything downstream resolves the symlink, so the
slot's path is the conversation's working directory for good, the one the harness started in and keys its
session by. No id's directory can be named `.spares`: `path_key` never starts with a dot.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agenthost.runners.external_harness.errors import HarnessConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
SPARES_DIR = ".spares"


def path_key(raw: str) -> str:
    """A directory name for an id: `<sanitised prefix>-<12 hex of sha256>`."""
    if not raw:
        raise HarnessConfigError("an empty id cannot name a directory")
    prefix = _UNSAFE.sub("-", raw).strip("-")[:40] or "id"
    return f"{prefix}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def _mkdir_private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class Workspace:
    """The directories one conversation's harness turns use."""

    working_dir: Path  # cwd of the harness; holds the projection
    bot_dir: Path  # per bot: the harness's home, config dir and temp dir

    @property
    def home(self) -> Path:
        return self.bot_dir / "home"

    @property
    def tmp(self) -> Path:
        # A private TMPDIR, or Claude Code leaves sockets and caches in the shared /tmp.
        return self.bot_dir / "tmp"

    @property
    def claude_config_dir(self) -> Path:
        return self.bot_dir / "claude"

    @property
    def codex_home(self) -> Path:
        return self.bot_dir / "codex"

    @property
    def agenthost_dir(self) -> Path:
        """`.agenthost/` inside the working dir: the runner-owned part of the projection."""
        return self.working_dir / ".agenthost"

    def ensure(self) -> Workspace:
        for path in (
            self.working_dir,
            self.agenthost_dir,
            self.home,
            self.tmp,
            self.claude_config_dir,
            self.codex_home,
        ):
            _mkdir_private(path)
        return self


def _started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if there is no such process: with the pid, it
    names one process for good, where a pid alone may be reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


_OWNER = f"{os.getpid()}-{_started(os.getpid())}"


@dataclass(eq=False)
class SpareSlot:
    """The directory of a spare process (warm.py) until a conversation claims it. Its name starts with its owner
    (the runner process's pid and start time), so a later runner can tell the slots a dead one left behind."""

    workspace: Workspace
    claimed: bool = field(default=False)

    @property
    def path(self) -> Path:
        return self.workspace.working_dir

    def discard(self) -> None:
        """Removes the slot unless a conversation claimed it (then it is that conversation's directory)."""
        if not self.claimed:
            shutil.rmtree(self.path, ignore_errors=True)


class WorkspaceManager:
    """Maps (bot, conversation) to a Workspace under the runner's data dir or a configured root."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._swept: set[Path] = set()

    def _root(self, workspace_root: str | None) -> Path:
        root = Path(workspace_root).expanduser() if workspace_root else self.data_dir / "workspaces"
        if not root.is_absolute():
            raise HarnessConfigError(f"workspace_root must be an absolute path, not {workspace_root!r}")
        return root

    def _resolved(self, working_dir: Path, bot: str) -> Workspace:
        # Resolve symlinks once so the cwd we record equals the cwd the harness reports (and keys sessions by).
        ws = Workspace(working_dir=working_dir, bot_dir=self.data_dir / "harness" / bot).ensure()
        return Workspace(working_dir=Path(os.path.realpath(ws.working_dir)), bot_dir=Path(os.path.realpath(ws.bot_dir)))

    def workspace(self, bot_id: str, conversation_id: str, *, workspace_root: str | None = None) -> Workspace:
        bot = path_key(bot_id or "default-bot")
        return self._resolved(self._root(workspace_root) / bot / path_key(conversation_id), bot)

    def is_new(self, bot_id: str, conversation_id: str, *, workspace_root: str | None = None) -> bool:
        """No directory yet for this conversation: its first message, which a spare's slot may take."""
        path = self._root(workspace_root) / path_key(bot_id or "default-bot") / path_key(conversation_id)
        return not os.path.lexists(path)

    def new_slot(self, bot_id: str, *, workspace_root: str | None = None) -> SpareSlot:
        """A fresh directory for a spare process of the bot, beside its conversations' directories."""
        bot = path_key(bot_id or "default-bot")
        spares = self._root(workspace_root) / bot / SPARES_DIR
        self._sweep(spares)
        return SpareSlot(self._resolved(spares / f"{_OWNER}-{uuid.uuid4().hex}", bot))

    def claim(self, bot_id: str, conversation_id: str, slot: SpareSlot, *, workspace_root: str | None = None) -> bool:
        """Makes `slot` the conversation's directory; False if the conversation has one by now."""
        path = self._root(workspace_root) / path_key(bot_id or "default-bot") / path_key(conversation_id)
        try:
            # Relative: the bot's directories may move together.
            os.symlink(Path(SPARES_DIR) / slot.path.name, path, target_is_directory=True)
        except FileExistsError:
            return False
        slot.claimed = True
        return True

    def _sweep(self, spares: Path) -> None:
        """Removes the slots of runner processes that died before stopping their spares, once per runner process
        and bot: a slot whose owner is gone and that no conversation claimed. Only its owner ever claims a slot,
        so a dead owner's cannot be claimed while this looks."""
        if spares in self._swept:
            return
        self._swept.add(spares)
        try:
            slots = [entry for entry in os.scandir(spares) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return
        stale = []
        for entry in slots:
            pid, _, rest = entry.name.partition("-")
            started, _, _ = rest.partition("-")
            with contextlib.suppress(ValueError):
                if str(_started(int(pid))) != started:
                    stale.append(entry.name)
        if not stale:
            return
        claimed = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(spares.parent):
                if entry.is_symlink():
                    claimed.add(os.path.basename(os.readlink(entry.path)))
        for name in stale:
            if name not in claimed:
                shutil.rmtree(spares / name, ignore_errors=True)
