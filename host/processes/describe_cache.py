"""What a plugin's describe reported, kept by content so the next start (or `channels add`) of the same files
skips it.

A runner process forks a describe child at start that imports every runner class of its plugin (about 0.75 CPU-s
for the built-in plugin) only to learn the manifests and the entry point of each runner. The report depends on the
plugin's files, the interpreter, agenthost itself (the SDK that describes) and what the process can see (its
environment, its walls), so that is the key:

- the interpreter (its real path, size and mtime) and the host's site-packages listing (dist-info names carry
  versions);
- agenthost's version and the content (sha256) of every file of its packages: the built-in plugin *is* these files;
- for a plugin in its own environment, the content of every file there, by its path inside that environment (the
  same files copied elsewhere are the same plugin);
- the distribution, the sandbox and network settings and, but for the built-in plugin (whose import reads
  neither), the bound paths and the environment without HOME (a test fault, a model default: anything a
  third-party plugin's import may read).

A changed file is a new key, so the plugin is described again. A kept report is handed to the process on its
configuration line; the host still parses the manifests the process then answers in Describe (the same checks as
ever), and the process still imports the classes at first use and refuses them if they differ from the report
(agenthost.runners.sdk.server), so a report can never authorise what the plugin's own code does not declare.
`channels add` keeps what `python -m agenthost.channels.sdk describe` printed the same way; the host parses its
manifests at every use.

Entries live in <data>/cache/describe (AGENTHOST_INTERNAL_DESCRIBE_CACHE overrides: the test suite shares one
across its hosts), written whole (rename), at most MAX_ENTRIES, readable by the host's user only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import site
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CACHE_ENV = "AGENTHOST_INTERNAL_DESCRIBE_CACHE"  # AGENTHOST_INTERNAL*: never passed to a plugin
MAX_ENTRIES = 256
MAX_HASHED_BYTES = 64 * 1024 * 1024
# agenthost's packages (the built-in plugin and the SDK that describes every Python plugin).
_PACKAGES = ("agenthost.host", "agenthost.runners", "agenthost.channels", "agenthost.plugins", "agenthost.protos")


def cache_dir(data_dir: Path) -> Path:
    return Path(os.environ.get(CACHE_ENV) or data_dir / "cache" / "describe")


def _hash_tree(digest: Any, root: Path) -> None:
    """Every file under `root` into `digest`; ValueError past MAX_HASHED_BYTES (then nothing is kept: hashing a
    large environment at every start would cost more than the describe it saves)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted([*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]):
            if name.endswith(".pyc"):
                continue
            path = os.path.join(dirpath, name)
            try:
                if os.path.islink(path):  # the interpreter's link, lib64: where it points, not what
                    data = b"\0link " + os.readlink(path).encode()
                else:
                    with open(path, "rb") as f:
                        data = f.read()
            except OSError:
                data = b"\0unreadable"
            total += len(data)
            if total > MAX_HASHED_BYTES:
                raise ValueError(f"more than {MAX_HASHED_BYTES} bytes under {root}")
            # Relative: a copy of a plugin's environment elsewhere (each test host gets one) is the same plugin.
            digest.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode())
            digest.update(data)


def _agenthost_roots() -> Iterable[Path]:
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None:
            yield from (Path(p) for p in spec.submodule_search_locations or [])


def key(
    *,
    kind: str,
    python: str,
    distribution: str,
    builtin: bool,
    sandboxed: bool,
    network: bool,
    bound: Iterable[tuple[str, str]],
    env: Mapping[str, str],
) -> str:
    """The content key of what a describe child of this plugin would report (reads files: call off the loop)."""
    digest = hashlib.sha256()
    real = os.path.realpath(python)
    st = os.stat(real)
    header: dict[str, Any] = {
        "python": [real, st.st_size, st.st_mtime_ns],
        "host_python": sys.version,
        "site": sorted(n for d in site.getsitepackages() if os.path.isdir(d) for n in os.listdir(d)),
        "agenthost": importlib.metadata.version("agenthost"),
        "kind": kind,
        "distribution": distribution,
        "walls": [builtin, sandboxed, network],
    }
    if not builtin:  # the built-in runners' and adapters' import reads neither (the test suite's hosts differ in both)
        header["bound"] = sorted(bound)
        header["env"] = sorted((k, v) for k, v in env.items() if k != "HOME")
    digest.update(json.dumps(header).encode())
    for root in _agenthost_roots():
        digest.update(str(root).encode())
        _hash_tree(digest, root)
    if not builtin:
        _hash_tree(digest, Path(python).parent.parent)  # the plugin's own environment
    return digest.hexdigest()


def load(directory: Path, entry: str, kind: str) -> dict[str, Any] | None:
    """The kept report (a runner start's {"sdk_version", "runners", "origins"}, or what `describe` printed for
    "channels") or None."""
    try:
        report = json.loads((directory / f"{entry}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get(kind), list):
        return None
    return report


def store_runners(
    directory: Path, entry: str, sdk_version: str, manifests_json: list[str], origins: Mapping[str, str]
) -> None:
    """Keeps a runner report whose every runner has its entry point (else there is nothing a start could skip)."""
    manifests = [json.loads(raw) for raw in manifests_json]
    if manifests and {m.get("name") for m in manifests} == set(origins):
        store(directory, entry, {"sdk_version": sdk_version, "runners": manifests, "origins": dict(origins)})


def store(directory: Path, entry: str, report: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f)
        os.replace(tmp, directory / f"{entry}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns if p.exists() else 0)
    for old in entries[:-MAX_ENTRIES]:
        with contextlib.suppress(OSError):
            old.unlink()
