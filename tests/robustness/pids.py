"""Pids across the sandbox boundary, for tests that kill or watch a plugin's processes from the host's side.

A runner process lives in a pid namespace of its own (its bwrap sandbox), so the pids it reports (os.getpid(), a
child's pid) are its namespace's numbers, not the host's: `outer_pid` finds the host's number for one of them.
"""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, not yet reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        pid = _ppid(pid)
    return False


def outer_pid(inner: int, ancestor: int) -> int:
    """The host's pid of the process numbered `inner` in its own (innermost) pid namespace, among the descendants
    of `ancestor` (the sandbox's bwrap process, or the host that started it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        line = next((ln for ln in status.splitlines() if ln.startswith("NSpid:")), "")
        ids = line.split()[1:]
        if len(ids) >= 2 and int(ids[-1]) == inner and _descends_from(int(entry.name), ancestor):
            return int(entry.name)
    raise LookupError(f"no process {inner} inside a sandbox under {ancestor}")
