"""Shared by the harness tests."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKE_HARNESS = str(HERE / "fake_harness.py")


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def pids_with_env(marker: str) -> list[int]:
    """Live processes whose environment contains `marker`, in any pid namespace (a sandboxed harness reports its
    own pids from inside its namespace, which mean nothing out here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes() and "Z" != _state(entry):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _state(entry: Path) -> str:
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]


def kinds(events) -> list[str]:
    return [e.WhichOneof("kind") for e in events]


def host_view(events) -> str:
    """The reply as the host projects it: streamed text is one message per segment (a tool call ends a segment)
    and a `message` event replaces the deltas of its segment. A runner that repeats text shows up here twice."""
    segments: list[str] = []
    parts: list[str] = []
    for event in events:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            parts.append(event.text_delta.text)
        elif kind == "message":
            if event.message.text:
                segments.append(event.message.text)
            parts = []
        elif kind in ("tool_started", "completed", "failed"):
            if "".join(parts):
                segments.append("".join(parts))
            parts = []
    if "".join(parts):
        segments.append("".join(parts))
    return "\n\n".join(segments)
