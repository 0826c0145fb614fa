"""File tools confined to the conversation's workspace: read, write, edit, list, glob, grep.

The workspace is shared with shell commands a model drives, so anything in it may change between two system
calls of a tool. Paths are therefore never checked as strings and then opened: every open starts from a
descriptor of the workspace root and the kernel resolves the path beneath it — `openat2(RESOLVE_BENEATH |
RESOLVE_NO_MAGICLINKS)` where the kernel has it (Linux 5.6+), otherwise a walk that opens one component at a time
with `O_NOFOLLOW` and resolves symlinks itself, holding a descriptor for every directory it passed. Either way
`..`, absolute paths and symlinks (absolute ones, or relative ones climbing out) cannot leave the workspace,
and a directory swapped for a symlink mid-call is either refused or read through the descriptor already held.
What was opened is checked on its descriptor (`fstat`): only regular files, and never one with more than one
hard link, since a hard link made in the workspace may name a file outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fnmatch
import os
import platform
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent.images import MAX_IMAGE_BYTES, ToolImage, ToolOutput
from agenthost.runners.local_agent.images import sniff as sniff_image
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

MAX_READ_LINES = 2_000
MAX_LINE_CHARS = 2_000
MAX_LIST = 500
MAX_GREP_MATCHES = 200
MAX_GREP_FILE_BYTES = 2 * 1024 * 1024
MAX_WALK_FILES = 20_000  # glob/grep stop here rather than stall a run on a huge tree
MAX_WALK_DEPTH = 64  # the walk holds one descriptor per level
MAX_SYMLINKS = 40  # the kernel's own limit per resolution
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"}

# openat2(2): <linux/openat2.h>. The syscall number is 437 on every architecture using the generic table.
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_O_PATH = getattr(os, "O_PATH", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _O_NOCTTY  # NONBLOCK: opening a FIFO must not wait for a writer


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Escape(OSError):
    """The fallback walk's counterpart of openat2's EXDEV: the path would leave the workspace."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EXDEV, "path leads outside the directory", path)


_libc: Any = None
_openat2_ok: bool | None = None  # None = not probed yet


def _raw_openat2(dirfd: int, path: str, flags: int, mode: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags | _O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(16):
        fd = _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(raw),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        # EAGAIN: a rename somewhere on the filesystem raced the walk and the kernel could not vouch for `..`.
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def openat2_available() -> bool:
    """Whether openat2 works here; probed once (old kernels say ENOSYS, some seccomp filters EPERM)."""
    global _openat2_ok
    if _openat2_ok is None:
        _openat2_ok = False
        if _SYS_OPENAT2 is not None and _O_PATH:
            root = os.open("/", _O_PATH | _O_DIRECTORY | _O_CLOEXEC)
            try:
                os.close(_raw_openat2(root, ".", _O_PATH | _O_DIRECTORY, 0))
                _openat2_ok = True
            except OSError:
                pass
            finally:
                os.close(root)
    return _openat2_ok


def _walk_open(root_fd: int, path: str, flags: int, mode: int) -> int:
    """RESOLVE_BENEATH in user space: one component at a time from a held directory descriptor, never following
    a symlink implicitly (O_NOFOLLOW), `..` popping the descriptors walked so far rather than asking the
    filesystem, and symlinks expanded by hand (relative ones only, like the kernel's RESOLVE_BENEATH)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack: list[int] = []  # descriptors we own, below root_fd
    links = 0
    try:
        while True:
            top = stack[-1] if stack else root_fd
            if not parts:
                # The path named the root or a directory reached by `..`: open that directory itself.
                return os.open(".", flags | _O_CLOEXEC, mode, dir_fd=top)
            name = parts.pop(0)
            if name == "..":
                if not stack:
                    raise _Escape(path)
                os.close(stack.pop())
                continue
            try:
                st = os.stat(name, dir_fd=top, follow_symlinks=False)
            except FileNotFoundError:
                if parts or not flags & os.O_CREAT:
                    raise
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                target = os.readlink(name, dir_fd=top)
                if target.startswith("/"):
                    raise _Escape(path)
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if parts:
                # Swapped for a symlink since the stat: O_NOFOLLOW|O_DIRECTORY fails rather than follows it.
                stack.append(os.open(name, _O_PATH | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=top))
                continue
            fd = os.open(name, flags | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=top)
            if flags & _O_PATH and stat.S_ISLNK(os.fstat(fd).st_mode):
                # O_PATH|O_NOFOLLOW opens a symlink itself instead of failing: it was swapped in after the stat.
                os.close(fd)
                raise OSError(errno.ELOOP, "a symlink appeared while the path was opened", path)
            return fd
    finally:
        for fd in stack:
            os.close(fd)


def open_beneath(root_fd: int, path: str, flags: int, mode: int = 0o666) -> int:
    """Opens `path` (relative) beneath the directory `root_fd`; EXDEV when it would lead outside."""
    if openat2_available():
        return _raw_openat2(root_fd, path or ".", flags, mode)
    return _walk_open(root_fd, path, flags, mode)


# ---------------------------------------------------------------- paths as the model writes them


def relative_path(workspace: Path, user_path: str) -> str:
    """The model's path made relative to the workspace, lexically; whether it stays inside is decided when it
    is opened. Absolute paths are accepted only under the workspace (as the shell sees it, same path)."""
    if not isinstance(user_path, str) or not user_path:
        raise ToolError("path must be a non-empty string")
    if "\x00" in user_path:
        raise ToolError("path contains a NUL byte")
    path = os.path.expanduser(user_path) if user_path.startswith("~") else user_path
    if path.startswith("/"):
        for root in dict.fromkeys((str(workspace), str(workspace.resolve()))):
            root = root.rstrip("/") or "/"
            if path == root or path.startswith(root + "/"):
                path = path[len(root) + 1 :] or "."
                break
        else:
            raise ToolError(_outside(user_path))
    # Refused early even where the missing directory it climbs out of would otherwise answer "does not exist".
    if os.path.normpath(path).split("/")[0] == "..":
        raise ToolError(_outside(user_path))
    return path


def _outside(user_path: str) -> str:
    return (
        f"path {user_path!r} is outside the workspace (through '..', an absolute path or a symlink leading out); "
        "use paths relative to the workspace root"
    )


def display(path: str) -> str:
    return os.path.normpath(path) if path not in ("", ".") else "."


def _tool_error(user_path: str, exc: OSError) -> ToolError:
    shown = display(user_path) if not user_path.startswith("/") else user_path
    if isinstance(exc, _Escape) or exc.errno == errno.EXDEV:
        return ToolError(_outside(user_path))
    if exc.errno == errno.ENOENT:
        return ToolError(f"{shown} does not exist")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"{shown}: a part of the path is not a directory")
    if exc.errno == errno.EISDIR:
        return ToolError(f"{shown} is a directory")
    if exc.errno == errno.ELOOP:
        return ToolError(f"{shown}: too many symlinks, or a symlink that cannot be followed safely")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ToolError(f"{shown}: permission denied")
    return ToolError(f"{shown}: {exc.strerror or exc}")


def _check_regular(shown: str, st: os.stat_result, dir_hint: str = "") -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{shown} is a directory{dir_hint}")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or device would block the read forever.
        raise ToolError(f"{shown} is not a regular file")
    if st.st_nlink > 1:
        raise ToolError(
            f"{shown} has {st.st_nlink} hard links; refused, since a hard link can name a file outside the "
            "workspace (copy it to a new file first if it is yours)"
        )


def _read_fd(fd: int) -> bytes:
    os.set_blocking(fd, True)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class Workspace:
    """The conversation workspace held open by descriptor for the length of one tool call."""

    path: Path
    fd: int = -1

    def __enter__(self) -> Workspace:
        self.path.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, _O_PATH | _O_DIRECTORY | _O_CLOEXEC)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def open(self, user_path: str, flags: int, mode: int = 0o666) -> int:
        rel = relative_path(self.path, user_path)
        try:
            return open_beneath(self.fd, rel, flags, mode)
        except OSError as exc:
            raise _tool_error(user_path, exc) from None

    def read_bytes(self, user_path: str) -> bytes:
        shown = display(relative_path(self.path, user_path))
        fd = self.open(user_path, _READ_FLAGS)
        try:
            _check_regular(shown, os.fstat(fd), "; use list_files")
            return _read_fd(fd)
        finally:
            os.close(fd)

    # ---- writing: temp file + rename inside the directory descriptor that holds the target

    def _parent(self, rel: str) -> tuple[int, str]:
        """A descriptor of the directory that will hold `rel`'s last component (created if missing) and that
        component's name."""
        head, name = os.path.split(rel.rstrip("/"))
        if name in ("", ".", ".."):
            raise ToolError(f"{display(rel)} is a directory, not a file name")
        try:
            return open_beneath(self.fd, head or ".", _O_PATH | _O_DIRECTORY), name
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _tool_error(rel, exc) from None
        # Missing parents: create them one level at a time, each mkdir relative to a descriptor opened beneath.
        parts = [p for p in head.split("/") if p not in ("", ".")]
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            try:
                os.close(open_beneath(self.fd, prefix, _O_PATH | _O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise _tool_error(rel, exc) from None
            try:
                pfd = open_beneath(self.fd, "/".join(parts[: i - 1]) or ".", _O_PATH | _O_DIRECTORY)
            except OSError as exc:
                raise _tool_error(rel, exc) from None
            try:
                os.mkdir(parts[i - 1], dir_fd=pfd)  # mkdirat never follows a symlink in the last place
            except FileExistsError:
                pass
            except OSError as exc:
                raise _tool_error(rel, exc) from None
            finally:
                os.close(pfd)
        try:
            return open_beneath(self.fd, head or ".", _O_PATH | _O_DIRECTORY), name
        except OSError as exc:
            raise _tool_error(rel, exc) from None

    @contextlib.contextmanager
    def target(self, user_path: str, *, must_exist: bool) -> Iterator[_Target]:
        """Where a write to `user_path` lands: a symlink in the last place is followed (within the workspace),
        so editing a linked file edits the file, as it always did."""
        rel = relative_path(self.path, user_path)
        for _ in range(MAX_SYMLINKS):
            if must_exist:
                # Don't create directories for an edit of a file that is not there.
                try:
                    os.close(open_beneath(self.fd, os.path.dirname(rel.rstrip("/")) or ".", _O_PATH | _O_DIRECTORY))
                except OSError as exc:
                    raise _tool_error(user_path, exc) from None
            dfd, name = self._parent(rel)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except OSError as exc:
                os.close(dfd)
                raise _tool_error(user_path, exc) from None
            if st is not None and stat.S_ISLNK(st.st_mode):
                link = os.readlink(name, dir_fd=dfd)
                os.close(dfd)
                if link.startswith("/"):
                    raise ToolError(_outside(user_path))
                rel = os.path.join(os.path.dirname(rel.rstrip("/")), link)
                continue
            try:
                yield _Target(dfd, name, display(rel), st)
            finally:
                os.close(dfd)
            return
        raise ToolError(f"{user_path}: too many levels of symlinks")


@dataclass
class _Target:
    dir_fd: int
    name: str
    shown: str
    st: os.stat_result | None  # of the entry when the target was found; None = does not exist yet

    def read_existing(self, *, content: bool = True) -> tuple[bytes, int]:
        """The current content and permission bits, read from a descriptor that is checked, not from the name."""
        fd = os.open(self.name, _READ_FLAGS | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=self.dir_fd)
        try:
            st = os.fstat(fd)
            _check_regular(self.shown, st)
            return (_read_fd(fd) if content else b""), stat.S_IMODE(st.st_mode)
        finally:
            os.close(fd)

    def replace(self, data: bytes, mode: int | None) -> None:
        """Atomic: readers see the old file or the new one. The temp file and the rename both live in the held
        directory descriptor, so a directory swapped in the meantime does not redirect them."""
        tmp = f".{self.name[:200]}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if mode is not None:
                    os.fchmod(fd, mode & 0o777)  # never carry set-id bits over
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            raise


def write_file(workspace: Path, user_path: str, data: bytes) -> str:
    with Workspace(workspace) as ws, ws.target(user_path, must_exist=False) as t:
        mode = None
        if t.st is not None and stat.S_ISDIR(t.st.st_mode):
            raise ToolError(f"{t.shown} is a directory")
        try:
            if t.st is not None:
                _, mode = t.read_existing(content=False)  # for its checks: a regular file, one link
            t.replace(data, mode)
        except OSError as exc:
            raise _tool_error(user_path, exc) from None
        return t.shown


def edit_file(workspace: Path, user_path: str, old: str, new: str, replace_all: bool) -> tuple[int, str]:
    with Workspace(workspace) as ws, ws.target(user_path, must_exist=True) as t:
        if t.st is None:
            raise ToolError(f"{t.shown} does not exist or is not a file")
        try:
            raw, mode = t.read_existing()
        except OSError as exc:
            raise _tool_error(user_path, exc) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{t.shown} is not UTF-8 text") from None
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_string not found in {t.shown}; read the file and copy it exactly")
        if count > 1 and not replace_all:
            raise ToolError(f"old_string occurs {count} times; add context to make it unique or set replace_all")
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        try:
            t.replace(updated.encode("utf-8"), mode)
        except OSError as exc:
            raise _tool_error(user_path, exc) from None
        return (count if replace_all else 1), t.shown


def _is_binary(sample: bytes) -> bool:
    return b"\x00" in sample


class ReadFile(Tool):
    name = "read_file"
    description = (
        "Read a text file from the workspace. Lines are numbered from 1. Use offset/limit for a range of lines. "
        "An image file (png, jpeg, gif, webp) is returned as the image itself."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES},
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str | ToolOutput:
        offset = int(args.get("offset", 1))
        limit = int(args.get("limit", MAX_READ_LINES))
        return await asyncio.to_thread(self._read, ctx.workspace, args["path"], offset, limit)

    @staticmethod
    def _read(workspace: Path, user_path: str, offset: int, limit: int) -> str | ToolOutput:
        with Workspace(workspace) as ws:
            shown = display(relative_path(workspace, user_path))
            data = ws.read_bytes(user_path)
        mime = sniff_image(data)
        if mime:
            if len(data) > MAX_IMAGE_BYTES:
                raise ToolError(
                    f"{shown} is a {len(data)}-byte image; images over {MAX_IMAGE_BYTES} bytes are not shown"
                )
            name = Path(shown).name
            return ToolOutput(f"{shown}: {mime} image, {len(data)} bytes", (ToolImage(name, mime, data),))
        if _is_binary(data[:8192]):
            raise ToolError(f"{shown} looks binary; not shown")
        lines = data.decode("utf-8", errors="replace").splitlines()
        total = len(lines)
        if total == 0:
            return "(empty file)"
        if offset > total:
            raise ToolError(f"offset {offset} is past the end ({total} lines)")
        chosen = lines[offset - 1 : offset - 1 + limit]
        out = []
        for n, line in enumerate(chosen, start=offset):
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + " …[line truncated]"
            out.append(f"{n:6}\t{line}")
        last = offset + len(chosen) - 1
        if last < total:
            out.append(f"… lines {offset}-{last} of {total}; read on with offset={last + 1}")
        return "\n".join(out)


class WriteFile(Tool):
    name = "write_file"
    description = "Create or overwrite a text file in the workspace with the given content."
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        data = args["content"].encode("utf-8")
        shown = await asyncio.to_thread(write_file, ctx.workspace, args["path"], data)
        return f"wrote {len(data)} bytes to {shown}"


class EditFile(Tool):
    name = "edit_file"
    description = (
        "Replace an exact string in a file. old_string must match exactly once unless replace_all is true; "
        "include enough surrounding context to make it unique."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "old_string": {"type": "string", "minLength": 1},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean"},
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        count, shown = await asyncio.to_thread(
            edit_file,
            ctx.workspace,
            args["path"],
            args["old_string"],
            args["new_string"],
            bool(args.get("replace_all")),
        )
        return f"replaced {count} occurrence(s) in {shown}"


def _list_dir(fd: int) -> list[os.DirEntry[str]]:
    # scandir on a descriptor reads the directory it names, whatever its path has become since.
    with os.scandir(fd) as it:
        return sorted(it, key=lambda e: e.name)


class ListFiles(Tool):
    name = "list_files"
    description = (
        "List a workspace directory: one entry per line, directories end with '/', symlinks show their target."
    )
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Directory, default '.'"}},
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await asyncio.to_thread(self._list, ctx.workspace, args.get("path", "."))

    @staticmethod
    def _list(workspace: Path, user_path: str) -> str:
        with Workspace(workspace) as ws:
            fd = ws.open(user_path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    raise ToolError(f"{display(relative_path(workspace, user_path))} is not a directory")
                entries = _list_dir(fd)
                lines = []
                for e in entries[:MAX_LIST]:
                    try:
                        if e.is_symlink():
                            lines.append(f"{e.name} -> {os.readlink(e.name, dir_fd=fd)}")
                        elif e.is_dir(follow_symlinks=False):
                            lines.append(f"{e.name}/")
                        else:
                            lines.append(f"{e.name}\t{e.stat(follow_symlinks=False).st_size} bytes")
                    except OSError:
                        lines.append(e.name)
            finally:
                os.close(fd)
        if len(entries) > MAX_LIST:
            lines.append(f"… {len(entries) - MAX_LIST} more entries")
        return "\n".join(lines) if lines else "(empty directory)"


@dataclass
class _Found:
    rel: str  # relative to the walk's base
    dir_fd: int  # valid only while the walk is at this entry
    name: str
    is_symlink: bool


def _walk(base_fd: int, limit: int = MAX_WALK_FILES) -> Iterator[_Found]:
    """Files under a directory descriptor, depth-first and sorted, files of a directory before its
    subdirectories. Directories are opened with O_NOFOLLOW from their parent's descriptor, so a symlinked
    directory is never entered; symlinked files are reported as such for the caller to decide."""
    count = 0

    def visit(fd: int, prefix: str, depth: int) -> Iterator[_Found]:
        nonlocal count
        try:
            entries = _list_dir(fd)
        except OSError:
            return
        subdirs = []
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS:
                        subdirs.append(e.name)
                    continue
                link = e.is_symlink()
            except OSError:
                continue
            yield _Found(prefix + e.name, fd, e.name, link)
            count += 1
            if count >= limit:
                return
        if depth >= MAX_WALK_DEPTH:
            return
        for name in subdirs:
            try:
                sub = os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue  # replaced by a symlink or removed since the listing
            try:
                yield from visit(sub, f"{prefix}{name}/", depth + 1)
            finally:
                os.close(sub)
            if count >= limit:
                return

    yield from visit(base_fd, "", 0)


def _open_base(ws: Workspace, user_path: str) -> tuple[int, bool]:
    """A descriptor for a glob/grep base and whether it is a directory."""
    fd = ws.open(user_path, os.O_RDONLY | os.O_NONBLOCK)
    return fd, stat.S_ISDIR(os.fstat(fd).st_mode)


def _join(base: str, rel: str) -> str:
    return rel if base in ("", ".") else f"{base}/{rel}"


class Glob(Tool):
    name = "glob"
    description = "Find workspace files whose path matches a glob pattern such as '**/*.py'."
    parameters = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"}},
        "required": ["pattern"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        pattern: str = args["pattern"]
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise ToolError("pattern must be relative to the workspace and must not contain '..'")
        hits = await asyncio.to_thread(self._find, ctx.workspace, args.get("path", "."), pattern)
        if not hits:
            return "no matches"
        more = f"\n… {len(hits) - MAX_LIST} more" if len(hits) > MAX_LIST else ""
        return "\n".join(hits[:MAX_LIST]) + more

    @staticmethod
    def _find(workspace: Path, user_path: str, pattern: str) -> list[str]:
        hits: list[str] = []
        with Workspace(workspace) as ws:
            base = display(relative_path(workspace, user_path))
            fd, is_dir = _open_base(ws, user_path)
            try:
                if not is_dir:
                    return []
                for f in _walk(fd):
                    r = f.rel
                    if not (
                        fnmatch.fnmatch(r, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(r, pattern[3:]))
                    ):
                        continue
                    full = _join(base, r)
                    if f.is_symlink:
                        # Listed only if it leads somewhere inside the workspace.
                        try:
                            os.close(open_beneath(ws.fd, full, _O_PATH))
                        except OSError:
                            continue
                    hits.append(full)
            finally:
                os.close(fd)
        return hits


class Grep(Tool):
    name = "grep"
    description = "Search workspace files for a regular expression; prints path:line: text for each match."
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "minLength": 1},
            "path": {"type": "string"},
            "glob": {"type": "string", "description": "Only files whose name matches, e.g. '*.py'"},
            "ignore_case": {"type": "boolean"},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            regex = re.compile(args["pattern"], re.IGNORECASE if args.get("ignore_case") else 0)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from None
        hits = await asyncio.to_thread(self._search, ctx.workspace, args.get("path", "."), regex, args.get("glob"))
        return "\n".join(hits) if hits else "no matches"

    @staticmethod
    def _search(workspace: Path, user_path: str, regex: re.Pattern[str], name_glob: str | None) -> list[str]:
        out: list[str] = []

        def scan(fd: int, shown: str) -> bool:
            """Appends the matches of one open file; False once the match budget is spent."""
            try:
                st = os.fstat(fd)
                # FIFOs and devices would block, huge files are not source, multi-linked files may be outside.
                if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_size > MAX_GREP_FILE_BYTES:
                    return True
                data = _read_fd(fd)
            except OSError:
                return True
            if _is_binary(data[:8192]):
                return True
            for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if regex.search(line):
                    out.append(f"{shown}:{n}: {line[:300]}")
                    if len(out) >= MAX_GREP_MATCHES:
                        out.append(f"… stopped at {MAX_GREP_MATCHES} matches; narrow the pattern")
                        return False
            return True

        with Workspace(workspace) as ws:
            base = display(relative_path(workspace, user_path))
            fd, is_dir = _open_base(ws, user_path)
            try:
                if not is_dir:
                    if not name_glob or fnmatch.fnmatch(os.path.basename(base), name_glob):
                        scan(fd, base)
                    return out
                for f in _walk(fd):
                    if f.is_symlink or (name_glob and not fnmatch.fnmatch(f.name, name_glob)):
                        continue  # a symlink's target inside the workspace is searched under its own name
                    try:
                        ffd = os.open(f.name, _READ_FLAGS | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=f.dir_fd)
                    except OSError:
                        continue
                    try:
                        if not scan(ffd, _join(base, f.rel)):
                            break
                    finally:
                        os.close(ffd)
            finally:
                os.close(fd)
        return out


def file_tools() -> list[Tool]:
    return [ReadFile(), WriteFile(), EditFile(), ListFiles(), Glob(), Grep()]
