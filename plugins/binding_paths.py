"""Host paths a binding names (a local agent's `workspace`, a harness's `workspace_root` and `command`, an MCP
server's `ro_paths`): which settings they are, whether one may be shown to a runner, and how.

A runner's config_schema marks such a setting with `"x-agenthost-path": MODE` (`path_setting(MODE)` in a pydantic
Field's json_schema_extra): "rw" a directory bound read-write, "ro" a directory or file bound read-only, "exec" an
executable file bound read-only (a bare name is looked up on PATH instead and needs nothing). The host checks every
such value when a binding is made or changed (`problems`) and the supervisor binds the ones that pass into that
plugin's sandbox at the same path (`sandbox_paths`), so a path a binding names is either there or the bind was
refused with the remedy — never a directory that silently exists only in the sandbox's scratch memory.

The mark comes from the plugin, which is untrusted; the value comes from the binding, which only an admin makes.
So a plugin can make the host look at a setting's value, never choose the value: whatever it names is checked here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PATH_KEY = "x-agenthost-path"
Mode = Literal["rw", "ro", "exec"]
MODES: tuple[str, ...] = ("rw", "ro", "exec")
MODE_TEXT = {"rw": "read-write", "ro": "read-only", "exec": "read-only (executable)"}

# Under a home directory: credentials no runner sees, whether named, inside a named path or containing one.
HOME_SECRETS = (
    ".ssh",
    ".aws",
    ".gnupg",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".password-store",
    ".config/gcloud",
    ".config/gh",
    ".local/share/keyrings",
)
# A file named like these holds secrets wherever it is.
SECRET_NAMES = (".env", ".netrc", ".pgpass", ".git-credentials", "id_rsa", "id_ed25519", "id_ecdsa")
# Never bound: the machine's own state. Read-write also not the system (already visible read-only).
_NEVER = ("/", "/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/var/run")
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")


def path_setting(mode: Mode) -> dict[str, Any]:
    """The json_schema_extra that marks a setting as a host path the sandbox must show."""
    return {PATH_KEY: mode}


@dataclass(frozen=True)
class NamedPath:
    setting: str  # where in the config, e.g. "mcp_servers[0].ro_paths[1]"
    path: str
    mode: str

    def describe(self) -> str:
        return f"{self.path} ({MODE_TEXT.get(self.mode, self.mode)}, {self.setting})"


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a (sub)schema stands for, $refs followed: a pydantic Optional is anyOf [X, null]."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return _resolve({**defs.get(name, {}), **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return [r for b in branches if isinstance(b, dict) for r in _resolve(b, defs)]
    return [schema]


def _walk(schema: dict[str, Any], value: Any, where: str, defs: dict[str, Any]) -> Iterator[NamedPath]:
    mode = schema.get(PATH_KEY)
    if mode in MODES:
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, str):
                yield NamedPath(f"{where}[{i}]" if isinstance(value, list) else where, item, str(mode))
        return
    for alt in _resolve(schema, defs):
        if alt is not schema and alt.get(PATH_KEY) in MODES:
            yield from _walk(alt, value, where, defs)
            return
        if isinstance(value, dict) and isinstance(alt.get("properties"), dict):
            for key, sub in alt["properties"].items():
                if key in value and isinstance(sub, dict):
                    yield from _walk(sub, value[key], f"{where}.{key}" if where else key, defs)
            return
        if isinstance(value, list) and isinstance(alt.get("items"), dict):
            for i, item in enumerate(value):
                yield from _walk(alt["items"], item, f"{where}[{i}]", defs)
            return


def named_paths(schema: dict[str, Any], config: dict[str, Any]) -> list[NamedPath]:
    """Every host path `config` names in a setting `schema` marks, in config order."""
    return list(_walk(schema, config, "", schema.get("$defs", {})))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _secret(real: str, home: str) -> str | None:
    """The credential location `real` is, is inside or contains, if any."""
    if Path(real).name in SECRET_NAMES or Path(real).name.startswith(".env."):
        return real
    for name in HOME_SECRETS:
        secret = os.path.join(home, name)
        if _inside(real, secret) or (_inside(secret, real) and os.path.lexists(secret)):
            return secret
    return None


def problems(
    named: Iterable[NamedPath], *, data_dir: Path, private: Iterable[Path] = (), home: str | None = None
) -> list[str]:
    """Why each path cannot be shown to a runner, one sentence each with the remedy; [] when all can.
    `private`: more host directories no runner may see (the runtime dir with admin.sock)."""
    home = home if home is not None else os.path.expanduser("~")
    data = os.path.realpath(data_dir)
    hidden = [data, *(os.path.realpath(p) for p in private)]
    found = []
    for n in named:
        where = f"{n.setting}: {n.path!r}"
        if n.mode == "exec" and "/" not in n.path:
            continue  # a name looked up on PATH
        if not os.path.isabs(n.path):
            found.append(f"{where} must be an absolute path (the host shows it to the runner at that path)")
            continue
        real = os.path.realpath(n.path)
        # A command in the system dirs (`npm i -g` links /usr/local/bin/claude into /usr/local/lib) is visible in
        # every sandbox, link and target alike; anywhere else the host binds the named path alone, so a link there
        # would lead the runner to a target it cannot see.
        linked_in_system = n.mode == "exec" and all(any(_inside(p, s) for s in SYSTEM) for p in (n.path, real))
        if os.path.normpath(n.path) != real and not linked_in_system:
            found.append(f"{where} is or passes through a symlink; name the real path {real!r}")
            continue
        if not os.path.exists(real):
            kind = "file" if n.mode == "exec" else "directory" if n.mode == "rw" else "path"
            found.append(f"{where} does not exist; create the {kind} first (or fix the path), then bind again")
            continue
        if n.mode == "rw" and not os.path.isdir(real):
            found.append(f"{where} is not a directory; name a directory for the runner to work in")
            continue
        if n.mode == "exec" and not (os.path.isfile(real) and os.access(real, os.X_OK)):
            found.append(f"{where} is not an executable file")
            continue
        clash = next((h for h in hidden if _inside(real, h) or _inside(h, real)), None)
        if clash is not None:
            found.append(
                f"{where} overlaps agenthost's own directory {clash} (database, keys, sockets, every runner's "
                "files); name a directory outside it (or leave the setting unset for the runner's default)"
            )
            continue
        secret = _secret(real, home)
        if secret is not None:
            found.append(
                f"{where} is, is inside or contains the credential location {secret}; name a path that holds no "
                "credentials (a project directory, not a home directory)"
            )
            continue
        system = n.mode == "rw" and any(_inside(real, s) for s in SYSTEM)
        if real == "/" or system or any(_inside(real, p) for p in _NEVER[1:]):
            found.append(f"{where} is part of the system, which is never shown {MODE_TEXT[n.mode]}; name another")
    return found


def sandbox_paths(named: Iterable[NamedPath]) -> tuple[list[str], list[str]]:
    """(read-only, read-write) paths a plugin sandbox binds for these (already checked) names; paths the sandbox
    shows anyway (the read-only system) and bare command names need nothing."""
    ro: list[str] = []
    rw: list[str] = []
    for n in named:
        if not os.path.isabs(n.path):
            continue
        if n.mode == "rw":
            rw.append(n.path)
        elif not any(_inside(n.path, s) for s in SYSTEM):
            ro.append(n.path)
    return ro, rw


def not_shown(path: str, setting: str) -> str | None:
    """The runner's side: why a host path its binding names is not usable here, else None. Inside a plugin
    sandbox a path the host did not bind is either missing or (once something makes it) a directory on the
    sandbox's own scratch memory, which vanishes with it: a workspace there would swallow the user's work."""
    from agenthost.plugins.sandbox import INSIDE_ENV

    remedy = (
        "the host shows a binding's paths to the runner's sandbox when the plugin starts; check that the path "
        "exists on the host, then save the binding again (`agenthost bots update-binding`), which restarts the "
        "plugin with it"
    )
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return f"{setting} {path} does not exist in the runner's sandbox: {remedy}"
    if os.environ.get(INSIDE_ENV) == "1":
        scratch = set()
        for root in ("/", "/tmp"):
            with contextlib.suppress(OSError):
                scratch.add(os.stat(root).st_dev)
        if dev in scratch:
            return (
                f"{setting} {path} is not a host path bound into the runner's sandbox (it is scratch memory): {remedy}"
            )
    return None
