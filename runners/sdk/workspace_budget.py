"""A conversation's workspace has a size budget: without root there is no quota filesystem, so the runner keeps
it. Before a tool command starts, the workspace is measured and the command refused when it is over; while the
command runs, the workspace is measured every POLL_SECONDS and the command's whole process group killed once it
passes the budget. One file is also capped by RLIMIT_FSIZE on everything the runner starts (tool_walls), so a
single write cannot outrun the poll by more than the budget.

A measurement walks the tree with os.scandir (no symlink followed) and stops as soon as the total is over the
budget or MAX_ENTRIES entries were seen, so its cost is bounded whatever a model made there. A directory its
owner may not list or enter (`chmod 300 d` still lets a command write files in it by name) would hide what it
holds: it gets u+rx back before it is read, and one that still cannot be read counts as over the budget.
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MIB = 1024
POLL_SECONDS = 0.5
MAX_ENTRIES = 200_000
# What one directory entry costs at least, however small: a million empty files is not an empty workspace.
ENTRY_BYTES = 4096
MIB = 1024 * 1024


@dataclass(frozen=True)
class Budget:
    root: Path
    limit_bytes: int
    setting: str  # the binding setting that sets it, named in every refusal
    # More trees the same budget covers: a harness's home and TMPDIR, which its commands write as freely.
    also: tuple[Path, ...] = ()

    def used(self) -> int:
        """Bytes the trees take, counted until the total passes the budget."""
        total = 0
        for root in (self.root, *self.also):
            total += usage(root, self.limit_bytes - total)
            if total > self.limit_bytes:
                break
        return total

    def exceeded(self, used: int) -> str:
        return (
            f"workspace quota exceeded ({used // MIB} MiB > {self.limit_bytes // MIB} MiB; binding setting "
            f"{self.setting}): free space by deleting files in the workspace, or raise {self.setting}"
        )

    def check(self) -> str | None:
        """The refusal when the workspace is over budget now, else None."""
        used = self.used()
        return self.exceeded(used) if used > self.limit_bytes else None


def usage(root: Path, stop_above: int) -> int:
    """Bytes the tree under `root` takes (allocated blocks, at least ENTRY_BYTES an entry), counted until the
    total passes `stop_above` or MAX_ENTRIES entries were seen (then reported as just over `stop_above`)."""
    total = 0
    seen = 0
    stack = [str(root)]
    while stack:
        path = stack.pop()
        _make_readable(path)
        try:
            it = os.scandir(path)
        except FileNotFoundError:
            continue  # removed while measured
        except OSError:
            return stop_above + 1  # what it holds cannot be seen: not taken for nothing
        with it:
            for entry in it:
                seen += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError:
                    return stop_above + 1
                total += max(st.st_blocks * 512, ENTRY_BYTES)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                if total > stop_above or seen > MAX_ENTRIES:
                    return max(total, stop_above + 1)
    return total


def _make_readable(path: str) -> None:
    """Gives a directory its owner's r and x back (bits only added), through a descriptor of the directory itself
    so a symlink swapped in on the way is never followed."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o500 != 0o500:
            os.chmod(f"/proc/self/fd/{fd}", mode | 0o500)
    except OSError:
        pass  # then scandir fails and the tree counts as over
    finally:
        os.close(fd)


async def watch(budget: Budget) -> str:
    """Returns the refusal once the trees pass the budget, measured every POLL_SECONDS off the event loop (a walk
    may take a while, and the loop serves every conversation). The caller stops what was writing: the local
    agent's shell tool the command's process group, the harness runner the harness."""
    while True:
        used = await asyncio.to_thread(budget.used)
        if used > budget.limit_bytes:
            return budget.exceeded(used)
        await asyncio.sleep(POLL_SECONDS)  # a periodic measurement, not a wait for a condition
