"""Writes into directories a model can change, without following anything it planted there.

The working directory and the conversation's harness home are bound read-write into the harness's sandbox, so
any name under them may be a symlink, a FIFO or a file where a directory was, put there by a model's command. The
runner writes there from outside the sandbox: a path it follows (`mkdir -p`, a temp file beside the target, a
rename onto it) would land wherever the model pointed, outside the sandbox. So every write starts from a
directory the runner trusts (its path is the runner's own: the resolved working directory, the harness dir) opened
once with O_NOFOLLOW, walks down one component at a time by descriptor (`openat` with O_NOFOLLOW|O_DIRECTORY), and
creates, renames and removes only by name relative to such a descriptor. A component that is a symlink or not a
directory is a ProjectionError; a symlink in place of a file the runner writes is replaced, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path

from agenthost.runners.external_harness.errors import ProjectionError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What the runner reads back (CLAUDE.md with the user's text, its manifests, an operator's template).
MAX_READ_BYTES = 4 * 1024 * 1024


def name_parts(rel: str) -> list[str]:
    """The components of a relative path the runner writes; ProjectionError for one that could climb out."""
    parts = [p for p in rel.split("/") if p]
    if rel.startswith("/") or any(p in (".", "..") or "\0" in p for p in parts):
        raise ProjectionError(f"{rel!r} is not a plain relative path")
    return parts


class SafeDir:
    """An open directory (by descriptor) and what the runner may do in it by name."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path  # for messages only: never opened by path again

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def sub(self, rel: str, *, create: bool = True) -> SafeDir:
        """The directory `rel` below this one (made 0700 where missing, unless `create` is False: then
        FileNotFoundError), each component opened without following a symlink."""
        fd, path = os.dup(self.fd), self.path
        try:
            for part in name_parts(rel):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _not_a_dir(path / part) from None
                    raise
                os.close(fd)
                fd, path = child, path / part
        except BaseException:
            os.close(fd)
            raise
        return SafeDir(fd, path)

    def read(self, name: str, *, limit: int = MAX_READ_BYTES) -> tuple[bytes, int] | None:
        """The bytes and mode bits of `name`, a regular file of at most `limit` bytes, or None if there is none.
        No following, no waiting on a FIFO (the runner's event loop serves every conversation), no reading past
        `limit`: ProjectionError for anything else there."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink
            raise ProjectionError(f"{name} is not a regular file ({exc.strerror}); refusing to read it") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ProjectionError(f"{name} is not a regular file; refusing to read it")
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ProjectionError(f"{name} is over {limit} bytes; refusing to read it")
        return data, stat.S_IMODE(st.st_mode)

    def write(self, name: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """Replaces `name` atomically (readers see the old file or the new one): a temp file made here with
        O_EXCL|O_NOFOLLOW, renamed over whatever `name` is (a symlink there is replaced, not followed)."""
        raw = data.encode() if isinstance(data, str) else data
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def write_if_changed(self, name: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """`write`, skipped when `name` is already a regular file holding exactly `data` with `mode`: a rewrite is a
        new inode, which a kept process's fingerprint would take for a change (warm.py)."""
        raw = data.encode() if isinstance(data, str) else data
        with contextlib.suppress(ProjectionError):  # anything but a regular file there is replaced
            if self.read(name, limit=len(raw)) == (raw, mode):
                return
        self.write(name, raw, mode=mode)

    def lexists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def is_regular(self, rel: str) -> bool:
        """Whether `rel` is a regular file, reached without following any symlink."""
        *dirs, name = name_parts(rel)
        try:
            with self.sub("/".join(dirs), create=False) as parent:
                st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
        except (OSError, ProjectionError):
            return False
        return stat.S_ISREG(st.st_mode)

    def remove(self, name: str) -> None:
        """Removes `name` (a tree, a file or a symlink itself), if there."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            # rmtree by descriptor (avoids_symlink_attacks on Linux): a symlink inside is unlinked, not followed.
            shutil.rmtree(name, dir_fd=self.fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)


def open_dir(root: Path, rel: str = "", *, create: bool = True) -> SafeDir:
    """`root` (a directory whose path the runner trusts, never a model's name) opened without following its last
    component, then `rel` below it walked by `SafeDir.sub`."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _not_a_dir(root) from None
        raise
    top = SafeDir(fd, root)
    if not rel:
        return top
    with top:
        return top.sub(rel, create=create)


def _not_a_dir(path: Path) -> ProjectionError:
    return ProjectionError(f"{path} is a symlink or not a directory; the runner follows nothing there (remove it)")
