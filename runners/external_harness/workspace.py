"""Where a harness runs: a working directory per conversation and a config home per bot.

Both harnesses key their saved sessions by (config dir, cwd): Claude Code under
`$CLAUDE_CONFIG_DIR/projects/<cwd-slug>/`, Codex filters `exec resume` by cwd. So every turn of a conversation
must run in the same directory with the same config dir, which is why both paths are pure functions of
(bot id, conversation id) and never of the run.

Ids come from the host but are still untrusted as path material: each becomes a readable, sanitised prefix plus
a hash of the full id, so two ids never share a directory and none can climb out of the root.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from agenthost.runners.external_harness.errors import HarnessConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


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


class WorkspaceManager:
    """Maps (bot, conversation) to a Workspace under the runner's data dir or a configured root."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def workspace(self, bot_id: str, conversation_id: str, *, workspace_root: str | None = None) -> Workspace:
        root = Path(workspace_root).expanduser() if workspace_root else self.data_dir / "workspaces"
        if not root.is_absolute():
            raise HarnessConfigError(f"workspace_root must be an absolute path, not {workspace_root!r}")
        bot = path_key(bot_id or "default-bot")
        working_dir = root / bot / path_key(conversation_id)
        # Resolve symlinks once so the cwd we record equals the cwd the harness reports (and keys sessions by).
        ws = Workspace(working_dir=working_dir, bot_dir=self.data_dir / "harness" / bot).ensure()
        return Workspace(working_dir=Path(os.path.realpath(ws.working_dir)), bot_dir=Path(os.path.realpath(ws.bot_dir)))
