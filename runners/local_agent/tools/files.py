"""File tools confined to the conversation's workspace: read, write, edit, list, glob, grep.

Every path goes through `confine`, which resolves symlinks before checking containment, so neither `../`
traversal nor a symlink planted inside the workspace reaches anything outside it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

MAX_READ_LINES = 2_000
MAX_LINE_CHARS = 2_000
MAX_LIST = 500
MAX_GREP_MATCHES = 200
MAX_GREP_FILE_BYTES = 2 * 1024 * 1024
MAX_WALK_FILES = 20_000  # glob/grep stop here rather than stall a run on a huge tree
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"}


def confine(workspace: Path, user_path: str) -> Path:
    if not isinstance(user_path, str) or not user_path:
        raise ToolError("path must be a non-empty string")
    if "\x00" in user_path:
        raise ToolError("path contains a NUL byte")
    root = workspace.resolve()
    candidate = Path(user_path).expanduser() if user_path.startswith("~") else Path(user_path)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve(strict=False)
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"path {user_path!r} is outside the workspace; use paths relative to the workspace root")
    return resolved


def rel(workspace: Path, path: Path) -> str:
    try:
        return str(path.relative_to(workspace.resolve())) or "."
    except ValueError:
        return str(path)


def _is_binary(sample: bytes) -> bool:
    return b"\x00" in sample


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ReadFile(Tool):
    name = "read_file"
    description = (
        "Read a text file from the workspace. Lines are numbered from 1. Use offset/limit for a range of lines."
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

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = confine(ctx.workspace, args["path"])
        offset = int(args.get("offset", 1))
        limit = int(args.get("limit", MAX_READ_LINES))
        return await asyncio.to_thread(self._read, path, offset, limit, ctx.workspace)

    @staticmethod
    def _read(path: Path, offset: int, limit: int, workspace: Path) -> str:
        if not path.exists():
            raise ToolError(f"{rel(workspace, path)} does not exist")
        if path.is_dir():
            raise ToolError(f"{rel(workspace, path)} is a directory; use list_files")
        if not path.is_file():
            # A FIFO or device would block the read forever.
            raise ToolError(f"{rel(workspace, path)} is not a regular file")
        with path.open("rb") as f:
            if _is_binary(f.read(8192)):
                raise ToolError(f"{rel(workspace, path)} looks binary; not shown")
        lines = path.read_text("utf-8", errors="replace").splitlines()
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
        path = confine(ctx.workspace, args["path"])
        if path.is_dir():
            raise ToolError(f"{rel(ctx.workspace, path)} is a directory")
        data = args["content"].encode("utf-8")
        await asyncio.to_thread(atomic_write, path, data)
        return f"wrote {len(data)} bytes to {rel(ctx.workspace, path)}"


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
        path = confine(ctx.workspace, args["path"])
        if not path.is_file():
            raise ToolError(f"{rel(ctx.workspace, path)} does not exist or is not a file")
        text = path.read_text("utf-8")
        old, new = args["old_string"], args["new_string"]
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_string not found in {rel(ctx.workspace, path)}; read the file and copy it exactly")
        if count > 1 and not args.get("replace_all"):
            raise ToolError(f"old_string occurs {count} times; add context to make it unique or set replace_all")
        updated = text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
        await asyncio.to_thread(atomic_write, path, updated.encode("utf-8"))
        return f"replaced {count if args.get('replace_all') else 1} occurrence(s) in {rel(ctx.workspace, path)}"


class ListFiles(Tool):
    name = "list_files"
    description = "List a workspace directory: one entry per line, directories end with '/'."
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Directory, default '.'"}},
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = confine(ctx.workspace, args.get("path", "."))
        if not path.is_dir():
            raise ToolError(f"{rel(ctx.workspace, path)} is not a directory")
        entries = sorted(path.iterdir(), key=lambda p: p.name)
        lines = []
        for p in entries[:MAX_LIST]:
            if p.is_dir():
                lines.append(f"{p.name}/")
            else:
                try:
                    lines.append(f"{p.name}\t{p.stat().st_size} bytes")
                except OSError:
                    lines.append(p.name)
        if len(entries) > MAX_LIST:
            lines.append(f"… {len(entries) - MAX_LIST} more entries")
        return "\n".join(lines) if lines else "(empty directory)"


def _walk(root: Path, limit: int = MAX_WALK_FILES) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            out.append(Path(dirpath) / name)
            if len(out) >= limit:
                return out
    return out


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
        base = confine(ctx.workspace, args.get("path", "."))
        root = ctx.workspace.resolve()

        def find() -> list[str]:
            hits = []
            for p in _walk(base):
                r = str(p.relative_to(base))
                if fnmatch.fnmatch(r, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(r, pattern[3:])):
                    real = p.resolve()
                    if real == root or root in real.parents:
                        hits.append(rel(ctx.workspace, p))
            return hits

        hits = await asyncio.to_thread(find)
        if not hits:
            return "no matches"
        more = f"\n… {len(hits) - MAX_LIST} more" if len(hits) > MAX_LIST else ""
        return "\n".join(hits[:MAX_LIST]) + more


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
        base = confine(ctx.workspace, args.get("path", "."))
        name_glob = args.get("glob")
        root = ctx.workspace.resolve()

        def search() -> list[str]:
            out: list[str] = []
            files = [base] if base.is_file() else _walk(base)
            for p in files:
                if name_glob and not fnmatch.fnmatch(p.name, name_glob):
                    continue
                real = p.resolve()
                if not (real == root or root in real.parents):
                    continue
                try:
                    if not p.is_file() or p.stat().st_size > MAX_GREP_FILE_BYTES:
                        continue  # FIFOs and devices would block; huge files are not source
                    data = p.read_bytes()
                except OSError:
                    continue
                if _is_binary(data[:8192]):
                    continue
                for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                    if regex.search(line):
                        out.append(f"{rel(ctx.workspace, p)}:{n}: {line[:300]}")
                        if len(out) >= MAX_GREP_MATCHES:
                            out.append(f"… stopped at {MAX_GREP_MATCHES} matches; narrow the pattern")
                            return out
            return out

        hits = await asyncio.to_thread(search)
        return "\n".join(hits) if hits else "no matches"


def file_tools() -> list[Tool]:
    return [ReadFile(), WriteFile(), EditFile(), ListFiles(), Glob(), Grep()]
