"""Where a harness runs: a working directory and a harness home per conversation.

Both harnesses key their saved sessions by (config dir, cwd): Claude Code under
`$CLAUDE_CONFIG_DIR/projects/<cwd-slug>/`, Codex filters `exec resume` by cwd. So every turn of a conversation
must run in the same directory with the same config dir, which is why both paths are pure functions of
(bot id, conversation id) and never of the run.

The harness home (`HOME`, `TMPDIR`, `CLAUDE_CONFIG_DIR`, `CODEX_HOME`) is the conversation's own, never the bot's:
the sandbox shows it read-write, so a model's command can write there what the CLI loads at start-up
(`CLAUDE.md`, `settings.json` hooks, `config.toml`) and read what the CLI keeps there (session transcripts). Shared
by a bot, that would carry one conversation's plants into every later one and show it the others' transcripts.
It is keyed by the resolved working directory, so a spare's slot (below) has its own from the start and it
becomes the conversation's home with the slot. The bot's own directory holds only `defaults/`: files an operator
puts there for every conversation (projection.project_home copies them in before each turn); no sandbox sees it.

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
import fcntl
import hashlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from agenthost.runners.external_harness.errors import HarnessConfigError
from agenthost.runners.external_harness.safe_fs import open_dir

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
SPARES_DIR = ".spares"
AGENTHOST_DIR = ".agenthost"
HOME_DIRS = ("home", "tmp", "claude", "codex")


def path_key(raw: str) -> str:
    """A directory name for an id: `<sanitised prefix>-<12 hex of sha256>`."""
    if not raw:
        raise HarnessConfigError("an empty id cannot name a directory")
    prefix = _UNSAFE.sub("-", raw).strip("-")[:40] or "id"
    return f"{prefix}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def _mkdir_private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def home_key(working_dir: Path) -> str:
    """The name of a conversation's harness home: its resolved working directory's, readable, plus a hash of the
    whole path (two workspace roots may hold the same conversation's directory name)."""
    prefix = _UNSAFE.sub("-", working_dir.name).strip("-")[:40] or "ws"
    return f"{prefix}-{hashlib.sha256(str(working_dir).encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Workspace:
    """The directories one conversation's harness turns use."""

    working_dir: Path  # cwd of the harness; holds the projection
    harness_dir: Path  # per conversation: the harness's home, config dirs and temp dir
    bot_dir: Path  # per bot, never in a sandbox: `defaults/`, the operator's files for every conversation

    @property
    def home(self) -> Path:
        return self.harness_dir / "home"

    @property
    def tmp(self) -> Path:
        # A private TMPDIR, or Claude Code leaves sockets and caches in the shared /tmp.
        return self.harness_dir / "tmp"

    @property
    def claude_config_dir(self) -> Path:
        return self.harness_dir / "claude"

    @property
    def codex_home(self) -> Path:
        return self.harness_dir / "codex"

    @property
    def defaults_dir(self) -> Path:
        return self.bot_dir / "defaults"

    @property
    def agenthost_dir(self) -> Path:
        """`.agenthost/` inside the working dir: the runner-owned part of the projection (written by descriptor,
        safe_fs, because a model may have replaced it with a symlink)."""
        return self.working_dir / AGENTHOST_DIR

    def ensure(self) -> Workspace:
        # Both paths are the runner's own (their parents are outside every sandbox); what is below the harness dir
        # is the harness's, so it is made without following anything there.
        _mkdir_private(self.working_dir)
        _mkdir_private(self.harness_dir)
        for name in HOME_DIRS:
            open_dir(self.harness_dir, name).close()
        return self


# Names this runner process's slots. Its liveness is a lock it holds on `<owner>.lock` beside them, for its whole
# life: a flock holds across pid namespaces (each sandboxed runner has its own, so a pid names nobody for sure) and
# goes with the process, however it dies.
_OWNER = uuid.uuid4().hex[:16]
_HELD: dict[Path, int] = {}  # spares dir -> the open, locked fd of this process's lock file there


def _hold_owner_lock(spares: Path) -> None:
    if spares in _HELD:
        return
    # Locked under a name no sweep reads, then renamed: a sweep never sees the lock file unlocked.
    hidden = spares / f".{_OWNER}.lock"
    fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(hidden, spares / f"{_OWNER}.lock")
    _HELD[spares] = fd


def _owner_gone(spares: Path, owner: str) -> bool:
    """Whether the runner process that named its slots `owner` is gone (its lock is free, or was never taken)."""
    try:
        fd = os.open(spares / f"{owner}.lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its runner is alive
    finally:
        os.close(fd)
    return True


@dataclass(eq=False)
class SpareSlot:
    """The directory of a spare process (warm.py) until a conversation claims it. Its name starts with its owner's
    (the runner process's), so a later runner can tell the slots a dead one left behind."""

    workspace: Workspace
    claimed: bool = field(default=False)

    @property
    def path(self) -> Path:
        return self.workspace.working_dir

    def discard(self) -> None:
        """Removes the slot and its harness home unless a conversation claimed it (then they are its own)."""
        if not self.claimed:
            shutil.rmtree(self.path, ignore_errors=True)
            shutil.rmtree(self.workspace.harness_dir, ignore_errors=True)


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

    def _harness_dir(self, bot: str, resolved_working_dir: Path) -> Path:
        bot_dir = Path(os.path.realpath(self.data_dir / "harness" / bot))
        return bot_dir / "conversations" / home_key(resolved_working_dir)

    def _resolved(self, working_dir: Path, bot: str) -> Workspace:
        # Resolve symlinks once so the cwd we record equals the cwd the harness reports (and keys sessions by).
        resolved = Path(os.path.realpath(_mkdir_private(working_dir)))
        bot_dir = Path(os.path.realpath(self.data_dir / "harness" / bot))
        return Workspace(working_dir=resolved, harness_dir=self._harness_dir(bot, resolved), bot_dir=bot_dir).ensure()

    def _bot_path(self, bot_id: str, workspace_root: str | None) -> Path:
        return self._root(workspace_root) / path_key(bot_id or "default-bot")

    def workspace(self, bot_id: str, conversation_id: str, *, workspace_root: str | None = None) -> Workspace:
        bot = self._bot_path(bot_id, workspace_root)
        return self._resolved(bot / path_key(conversation_id), bot.name)

    def is_new(self, bot_id: str, conversation_id: str, *, workspace_root: str | None = None) -> bool:
        """No directory yet for this conversation: its first message, which a spare's slot may take."""
        return not os.path.lexists(self._bot_path(bot_id, workspace_root) / path_key(conversation_id))

    def new_slot(self, bot_id: str, *, workspace_root: str | None = None) -> SpareSlot:
        """A fresh directory for a spare process of the bot, beside its conversations' directories."""
        bot = self._bot_path(bot_id, workspace_root)
        spares = bot / SPARES_DIR
        spares.mkdir(mode=0o700, parents=True, exist_ok=True)
        _hold_owner_lock(spares)
        self._sweep(spares)
        return SpareSlot(self._resolved(spares / f"{_OWNER}-{uuid.uuid4().hex}", bot.name))

    def claim(self, bot_id: str, conversation_id: str, slot: SpareSlot, *, workspace_root: str | None = None) -> bool:
        """Makes `slot` the conversation's directory; False if the conversation has one by now."""
        path = self._bot_path(bot_id, workspace_root) / path_key(conversation_id)
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
        owners: dict[str, list[str]] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(spares):
                if entry.name.startswith(".") or entry.name.startswith(_OWNER):
                    continue
                if entry.name.endswith(".lock"):
                    owners.setdefault(entry.name.removesuffix(".lock"), [])
                elif entry.is_dir(follow_symlinks=False):
                    owners.setdefault(entry.name.partition("-")[0], []).append(entry.name)
        stale = {owner: slots for owner, slots in owners.items() if _owner_gone(spares, owner)}
        if not stale:
            return
        claimed = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(spares.parent):
                if entry.is_symlink():
                    claimed.add(os.path.basename(os.readlink(entry.path)))
        for owner, slots in stale.items():
            for name in slots:
                if name not in claimed:
                    home = self._harness_dir(spares.parent.name, Path(os.path.realpath(spares / name)))
                    shutil.rmtree(spares / name, ignore_errors=True)
                    shutil.rmtree(home, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(spares / f"{owner}.lock")
