"""Host logs: one JSON object per line, on stderr and in `<data>/logs/host.log`, size-rotated; plugin logs too.

Why JSON lines rather than logfmt: much of what a log line carries comes from untrusted code (a runner's error
code, a plugin's exit description, a conversation id). JSON escapes every value the same unambiguous way, so no
value can end a line early or forge a `key=value` pair, and `jq` reads the result; logfmt has no single escaping
rule to lean on.

Every line is terminal-safe: control characters json.dumps keeps raw (DEL, C1, bidi controls) are written as
`\\uXXXX` escapes, whoever's text a value is (agenthost.protos.text is the one rule). Every line passes a redactor
before it is written: host token shapes (run, tool, plugin, admin and credential
tokens) and the values of stored provider keys never reach a log, whoever put them in the message.

Disk use is bounded by rotation: the host log rotates at HOST_LOG_MAX_BYTES keeping HOST_LOG_BACKUPS old files;
each plugin's stderr reaches the host through a pipe (the child never holds a file descriptor to its log), and the
host writes it to `<data>/logs/<plugin>.log` with the same rule at PLUGIN_LOG_MAX_BYTES × PLUGIN_LOG_BACKUPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import logging.handlers
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# The limit on lines an untrusted party can make the host write: one rule with the plugin side's, kept there.
from agenthost.protos.limited_log import REFUSAL_WINDOW_SECONDS as REFUSAL_WINDOW_SECONDS
from agenthost.protos.limited_log import REFUSALS_PER_WINDOW as REFUSALS_PER_WINDOW
from agenthost.protos.limited_log import RefusalLimiter as RefusalLimiter
from agenthost.protos.limited_log import log_limited as log_limited
from agenthost.protos.text import json_safe

LEVELS = ("debug", "info", "warning", "error")
LEVEL_ENV = "AGENTHOST_LOG_LEVEL"
HOST_LOG = "host.log"
HOST_LOG_MAX_BYTES = 10 * 1024 * 1024
HOST_LOG_BACKUPS = 3
PLUGIN_LOG_MAX_BYTES = 5 * 1024 * 1024
PLUGIN_LOG_BACKUPS = 2
PLUGIN_READ_CHUNK = 64 * 1024
# Lines waiting for stderr's reader (StderrHandler); past this they are dropped, and counted.
STDERR_BACKLOG_LINES = 10_000
# How long a stopping host waits for stderr to take the lines still waiting.
STDERR_CLOSE_SECONDS = 5.0

# Tokens minted by agenthost.host.access.grants.new_token: "<prefix>_<43 url-safe characters>", and common provider key
# shapes. Masked wherever they appear in a line.
_TOKEN = re.compile(r"\b(?:rt|tt|ps|adm|cred)_[A-Za-z0-9_-]{20,}|\bsk-[A-Za-z0-9_-]{16,}|\bBearer\s+\S+")
REDACTED = "[redacted]"

_PLUGIN_LOG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")


def logs_dir(data_dir: Path) -> Path:
    return data_dir / "logs"


def plugin_log_path(data_dir: Path, plugin_id: str) -> Path:
    """`<data>/logs/<plugin>.log`; the id is checked so no name can point outside the logs directory."""
    if not _PLUGIN_LOG_NAME.match(plugin_id) or plugin_id == "host":
        raise ValueError(f"not a plugin id: {plugin_id!r}")
    return logs_dir(data_dir) / f"{plugin_id}.log"


def parse_level(text: str | None) -> int:
    name = (text or "info").strip().lower()
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {text!r}")
    return getattr(logging, name.upper())


def event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    """One structured line: `name` is the event (`run.finished`), `fields` its values."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={"fields": fields})


class Redactor:
    """Masks token shapes and the exact values of secrets the host holds. `secrets` is asked on every line (so a
    key stored a moment ago is masked at once); it should be cheap, e.g. cached until its source changes."""

    def __init__(self, secrets: Callable[[], Iterable[str]] | None = None) -> None:
        self._source = secrets
        self._seen: frozenset[str] = frozenset()
        self._values: list[str] = []

    def _current(self) -> list[str]:
        if self._source is None:
            return self._values
        try:
            raw = frozenset(v for v in self._source() if v and len(v) >= 8)
        except Exception:  # a broken source must not take the log down with it; keep what was known
            return self._values
        if raw != self._seen:
            # Also as JSON would escape them: the formatter redacts the encoded line.
            values = set(raw) | {json.dumps(v, ensure_ascii=False)[1:-1] for v in raw}
            self._seen = raw
            self._values = sorted(values, key=len, reverse=True)
        return self._values

    def scrub(self, text: str) -> str:
        text = _TOKEN.sub(REDACTED, text)
        for value in self._current():
            if value in text:
                text = text.replace(value, REDACTED)
        return text


class JsonFormatter(logging.Formatter):
    """`{"ts": ..., "level": ..., "logger": ..., "msg": ..., <fields>}`; an exception as `exc`."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        # json_safe last: json.dumps leaves DEL, C1 (U+009B is CSI) and bidi controls raw, and every line is read on
        # a terminal (the serving process's stderr, `tail host.log`) whoever wrote the text it quotes.
        return json_safe(self.redactor.scrub(json.dumps(out, ensure_ascii=False, default=str)))


class _PrivateRotatingHandler(logging.handlers.RotatingFileHandler):
    """RotatingFileHandler whose files are created 0600 whatever the umask (the CLI may configure it first), and
    whose lines are formatted once. The standard handler formats every record twice (once to measure it for the
    rollover check, once to write it) and stats the file twice a line: the host logs on its event loop, and under a
    burst of runs that was a tenth of its CPU (bench_load.py's profile). The file is always the regular file this
    handler created in the 0700 logs folder, so the standard check that it still is one is not needed."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, "a", encoding=self.encoding or "utf-8", errors=self.errors)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            if self.stream is None:
                self.stream = self._open()
            size = self.stream.tell()  # O_APPEND: the end of the file
            if self.maxBytes > 0 and size and size + len(line) >= self.maxBytes:
                self.doRollover()
                if self.stream is None:
                    self.stream = self._open()
            self.stream.write(line)
            self.stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


class StderrHandler(logging.Handler):
    """Log lines to a stream (stderr) written by a thread of their own: a reader that stops reading (a pipe nobody
    drains, a stalled log collector) blocks that thread, never the host's event loop. With the loop blocked in a
    write, the host would answer nothing, and as an active host it would keep the database lease, so no standby
    could take over. Lines past STDERR_BACKLOG_LINES waiting are dropped and counted; the count is written once the
    stream takes lines again. `<data>/logs/host.log` (a file) has every line."""

    def __init__(self, stream: Any, backlog: int = STDERR_BACKLOG_LINES) -> None:
        super().__init__()
        self.stream = stream
        self.dropped = 0
        self._lines: queue.Queue[str | None] = queue.Queue(backlog)
        self._writer = threading.Thread(target=self._write, name="agenthost-stderr-log", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.put_nowait(self.format(record) + "\n")
        except queue.Full:
            self.dropped += 1
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _write(self) -> None:
        written_drops = 0
        while (line := self._lines.get()) is not None:
            try:
                if self.dropped != written_drops:
                    lost, written_drops = self.dropped - written_drops, self.dropped
                    self.stream.write(
                        json.dumps(
                            {
                                "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "level": "warning",
                                "logger": __name__,
                                "msg": f"{lost} log lines not written here: stderr was not read (host.log has them)",
                            }
                        )
                        + "\n"
                    )
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):  # the reader is gone: the lines go nowhere, as a print's would
                pass

    def close(self) -> None:
        """Writes what waits, for at most STDERR_CLOSE_SECONDS (a stream nobody reads does not hold the exit)."""
        with contextlib.suppress(queue.Full):
            self._lines.put(None, timeout=STDERR_CLOSE_SECONDS)
        self._writer.join(STDERR_CLOSE_SECONDS)
        super().close()


class HostLogging:
    """The handlers one host installs on the root logger, removed again by `close`."""

    def __init__(self, handlers: list[logging.Handler], previous_level: int) -> None:
        self.handlers = handlers
        self._previous_level = previous_level

    def close(self) -> None:
        root = logging.getLogger()
        for handler in self.handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(self._previous_level)


def install(
    data_dir: Path | None,
    level: int,
    *,
    stderr: bool = False,
    redactor: Redactor | None = None,
    max_bytes: int = HOST_LOG_MAX_BYTES,
    backups: int = HOST_LOG_BACKUPS,
) -> HostLogging:
    """Routes every logger (the host's, grpc's, asyncio's) through the JSON formatter, to `<data>/logs/host.log`
    when a data dir is given and to stderr when asked."""
    formatter = JsonFormatter(redactor)
    handlers: list[logging.Handler] = []
    if data_dir is not None:
        directory = logs_dir(data_dir)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        file_handler = _PrivateRotatingHandler(
            directory / HOST_LOG, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=False
        )
        handlers.append(file_handler)
    if stderr:
        handlers.append(StderrHandler(sys.stderr))
    root = logging.getLogger()
    previous = root.level
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(level)
        root.addHandler(handler)
    root.setLevel(level)
    return HostLogging(handlers, previous)


class RotatingFile:
    """An append-only byte log rotated by size: `path` → `path.1` → … → `path.<backups>`, the oldest dropped.
    Disk use stays under max_bytes × (backups + 1) plus one write. Used for plugin stderr."""

    def __init__(self, path: Path, max_bytes: int = PLUGIN_LOG_MAX_BYTES, backups: int = PLUGIN_LOG_BACKUPS) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _rotate(self) -> None:
        self.close()
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            with contextlib.suppress(FileNotFoundError):
                if n == self.backups:
                    older.unlink(missing_ok=True)
                os.replace(newer, older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)

    def write(self, data: bytes) -> None:
        fd = self._open()
        if self._size and self._size + len(data) > self.max_bytes:
            # Cut at the last line end that still fits, so lines stay whole across files where they can.
            room = self.max_bytes - self._size
            cut = data.rfind(b"\n", 0, room) + 1 if room > 0 else 0
            if cut:
                os.write(fd, data[:cut])
                data = data[cut:]
            self._rotate()
            fd = self._open()
        while data:
            written = os.write(fd, data)
            self._size += written
            data = data[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def pump(stream: asyncio.StreamReader, sink: RotatingFile) -> None:
    """Copies a child's stderr into its rotating log until EOF. A child writing faster than the disk takes it
    blocks on the full pipe; it never fills the disk."""
    while True:
        try:
            data = await stream.read(PLUGIN_READ_CHUNK)
        except (OSError, ValueError):
            return
        if not data:
            return
        try:
            sink.write(data)
        except OSError as exc:
            logging.getLogger(__name__).warning("could not write %s: %s", sink.path, exc)
            with contextlib.suppress(OSError):
                while await stream.read(PLUGIN_READ_CHUNK):
                    pass
            return


# ---- reading (the `agenthost logs` command: no grpc, no host, just the files) ----


def tail_lines(path: Path, n: int) -> tuple[list[str], int]:
    """The last `n` lines of `path` (and, when it holds fewer, of its rotated predecessors), and the offset in
    `path` they end at: `follow` goes on from there, so nothing is lost or printed twice in between."""
    files = [path] + [path.with_name(f"{path.name}.{i}") for i in range(1, 10)]
    lines: list[str] = []
    end = 0
    for file in files:
        if len(lines) >= n:
            break
        try:
            data, size = _read_tail(file, n - len(lines))
        except FileNotFoundError:
            if file == path:
                continue
            break
        if file == path:
            end = size
        lines = data + lines
    return (lines[-n:] if n else []), end


def _read_tail(path: Path, n: int) -> tuple[list[str], int]:
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(64 * 1024, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
        data = data[: end - pos]
    lines = data.decode("utf-8", errors="replace").splitlines()
    return (lines[-n:] if n else []), end


def follow(
    path: Path, out: Any, *, offset: int = 0, stop: Callable[[], bool] = lambda: False, poll: float = 0.2
) -> None:
    """Writes what is appended to `path` from `offset` on, across rotations (another file under the name, or the
    file shrinking, is read from its start), until `stop()` is true or the reader is interrupted."""
    f = None
    ident: tuple[int, int] | None = None
    try:
        while not stop():
            if f is None:
                try:
                    f = open(path, "rb")  # noqa: SIM115 — held across iterations, closed below
                except FileNotFoundError:
                    time.sleep(poll)
                    continue
                st = os.fstat(f.fileno())
                ident = (st.st_dev, st.st_ino)
                if offset <= st.st_size:
                    f.seek(offset)
                offset = 0  # a later (rotated) file is read from its start
            chunk = f.read(64 * 1024)
            if chunk:
                out.write(chunk.decode("utf-8", errors="replace"))
                out.flush()
                continue
            try:
                st = os.stat(path)
                replaced = (st.st_dev, st.st_ino) != ident or st.st_size < f.tell()
            except FileNotFoundError:
                replaced = False
            if replaced:
                f.close()
                f = None
                continue
            time.sleep(poll)
    finally:
        if f is not None:
            f.close()
