"""The runner's own working context for one conversation: a JSONL file in the runner's data dir.

Appends are one `write` of whole lines on an O_APPEND descriptor, so a killed process leaves at worst a torn last
line; rewrites (after compaction or repair) go to a temp file that is fsynced and renamed over the old one, so a
reader sees the old file or the new one, never a mix. Loading heals what a crash can leave behind: a torn or
unparsable line is dropped and the pairing invariant is restored, and the healed file is written back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.messages import Message, from_dict, to_dict

FORMAT_VERSION = 1


def safe_name(conversation_id: str) -> str:
    """A file-system-safe, collision-free name for a conversation id chosen by the host."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", conversation_id)[:40].lstrip(".") or "conv"
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()[:12]
    return f"{slug}-{digest}"


@dataclass
class LoadReport:
    skipped_lines: int = 0
    torn_tail: bool = False
    repair: pairing.RepairReport = field(default_factory=pairing.RepairReport)

    @property
    def healed(self) -> bool:
        return bool(self.skipped_lines or self.torn_tail or self.repair.changed)


class Session:
    def __init__(self, path: Path, conversation_id: str, messages: list[Message] | None = None) -> None:
        self.path = path
        self.conversation_id = conversation_id
        self.messages: list[Message] = list(messages or [])
        # The system prompt frozen for this session (see `freeze_system`), and a digest of the configuration it was
        # rendered from; "" when none is frozen yet.
        self.system = ""
        self.system_basis = ""

    @classmethod
    def path_for(cls, root: Path, conversation_id: str) -> Path:
        return root / "sessions" / f"{safe_name(conversation_id)}.jsonl"

    @classmethod
    def load(cls, root: Path, conversation_id: str) -> tuple[Session | None, LoadReport]:
        """The session on disk, healed; None when there is none (first contact or a lost disk)."""
        path = cls.path_for(root, conversation_id)
        report = LoadReport()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, report
        messages: list[Message] = []
        lines = raw.split(b"\n")
        if lines and lines[-1] != b"":
            report.torn_tail = True  # the last write did not finish its newline
        lines = lines[:-1]
        header_ok = False
        system = basis = ""
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                report.skipped_lines += 1
                continue
            if not isinstance(rec, dict):
                report.skipped_lines += 1
                continue
            if rec.get("t") == "header":
                header_ok = rec.get("conversation_id") == conversation_id
                if isinstance(rec.get("system"), str) and isinstance(rec.get("system_basis"), str):
                    system, basis = rec["system"], rec["system_basis"]
                continue
            try:
                messages.append(from_dict(rec["m"]))
            except (KeyError, TypeError, ValueError):
                report.skipped_lines += 1
        if not header_ok:
            # A file we did not write for this conversation: do not trust it.
            return None, report
        healed, report.repair = pairing.repair(messages)
        session = cls(path, conversation_id, healed)
        session.system, session.system_basis = system, basis
        if report.healed:
            session.rewrite(healed)
        return session, report

    @classmethod
    def create(cls, root: Path, conversation_id: str, messages: list[Message] | None = None) -> Session:
        session = cls(cls.path_for(root, conversation_id), conversation_id)
        session.rewrite(list(messages or []))
        return session

    def _header(self) -> bytes:
        header: dict[str, Any] = {"t": "header", "v": FORMAT_VERSION, "conversation_id": self.conversation_id}
        if self.system:
            header["system"] = self.system
            header["system_basis"] = self.system_basis
        return _line(header)

    def freeze_system(self, system: str, basis: str) -> None:
        """Keeps `system` as this session's system prompt until the next freeze (session start, compaction, a
        changed configuration). Stored in the header, so a restarted runner sends the same bytes."""
        if (system, basis) == (self.system, self.system_basis):
            return
        self.system, self.system_basis = system, basis
        self._replace(self.messages)

    def append(self, *messages: Message) -> None:
        if not messages:
            return
        data = b"".join(_line({"t": "m", "m": to_dict(m)}) for m in messages)
        try:
            # No O_CREAT: a file deleted under us must come back whole, with its header, or the next load would
            # refuse it and the conversation would be rebuilt from the host for no reason.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            self._replace([*self.messages, *messages])
            return
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)
        self.messages.extend(messages)

    def rewrite(self, messages: list[Message]) -> None:
        """Replaces the whole session atomically; the new list must already satisfy the pairing invariant."""
        pairing.check(messages)
        self._replace(messages)

    def _replace(self, messages: list[Message]) -> None:
        # Also used to restore a deleted file mid-turn, when a call may still be waiting for its result.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self._header() + b"".join(_line({"t": "m", "m": to_dict(m)}) for m in messages)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(self.path.parent)
        self.messages = list(messages)


def _line(record: dict[str, Any]) -> bytes:
    # Lone surrogates (from bad decodes upstream) would make the line unencodable; replace them.
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "replace") + b"\n"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class EphemeralSession(Session):
    """A working context that lives in memory only: a subagent's, which ends with its task and must never be
    mistaken for (or written over) its conversation's session."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(Path("/nonexistent/ephemeral-session"), conversation_id)

    def append(self, *messages: Message) -> None:
        self.messages.extend(messages)

    def _replace(self, messages: list[Message]) -> None:
        self.messages = list(messages)
