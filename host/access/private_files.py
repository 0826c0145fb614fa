"""Files private to the host's user: a 0600 JSON document written atomically, a tightened data dir, and a socket
directory that nobody else can have prepared.

Used by the host at start (umask, data dir, socket dir) and by the credential and key stores.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from agenthost.protos import errors

# The full-admin credential (agenthost.host.access.credentials), in the data dir, which no sandbox can see.
ADMIN_TOKEN_FILE = "admin.token"
# A standby host's status while it waits for the database (host/server.py writes it, `agenthost status` reads it).
STANDBY_FILE = "standby.json"


def read_json(path: Path) -> Any | None:
    """The document, or None if the file does not exist. Refuses a file another user could have written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise PermissionError(f"{path} is not private to this user (owner {st.st_uid}, mode {st.st_mode:o})")
        return json.load(f)


def write_private(path: Path, data: bytes) -> None:
    """Replaces the file with `data` (0600) so a reader sees the old or the new file, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_private(path: Path) -> bytes:
    """A key or certificate this user alone may have written; refuses one anybody else could have."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} is not private to this user (owner {st.st_uid}, mode {st.st_mode:o})")
        return f.read()


def write_json(path: Path, doc: Any) -> None:
    """Replaces the file with `doc` (0600), atomically (write_private)."""
    write_private(path, json.dumps(doc, indent=1, sort_keys=True).encode())


def tighten(data_dir: Path) -> int:
    """Removes group and other access from the data dir and everything in it (installs made before the host set
    its umask, or copied in with a permissive one). Returns how many entries changed. Symlinks are not followed."""
    changed = 0
    for root, dirs, files in os.walk(data_dir):
        for name in [*dirs, *files, ""]:
            path = os.path.join(root, name) if name else root
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            with contextlib.suppress(OSError):
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
                changed += 1
    return changed


def private_dir(path: Path) -> bool:
    """True if `path` is a real directory owned by this user that nobody else can enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def make_private_dir(path: Path) -> Path:
    """Creates `path` (0700) or accepts it if it is already ours and private. A path someone else prepared (a
    symlink, another owner, open permissions: squatting in a shared /tmp) is never used: a fresh, unpredictable
    sibling is made instead, and returned."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if private_dir(path):
        return path
    return Path(tempfile.mkdtemp(prefix=path.name + "-", dir=path.parent))


def read_admin_token(data_dir: Path) -> str:
    """For clients (the CLI): the full-admin token of the host serving `data_dir`."""
    path = data_dir / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise errors.Unauthenticated(f"no admin token at {path}: is the host serving this data dir?") from None
    except PermissionError:
        raise errors.Unauthenticated(f"{path} is not readable by this user: only the host's user is an admin") from None


def read_standby(data_dir: Path) -> dict[str, Any] | None:
    """The status of a standby host waiting on this data dir, or None (none, or its process is gone)."""
    try:
        doc = read_json(data_dir / STANDBY_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        pid = int(doc.get("pid", 0))
        if pid <= 0:
            return None
        os.kill(pid, 0)
    except (OSError, ValueError, TypeError):
        return None
    return doc
