"""Plugins in another language than Python: a package whose manifest names the command the host runs.

An npm package (a directory, or the tarball `npm pack` makes) declares it in its package.json:

    "agenthost": {"runtime": "node", "command": ["node", "dist/main.js"]}

`command[0]` names the runtime, the rest are the entry file and arguments, relative to the package. The plugin
process speaks the same spawn protocol as a Python plugin (agenthost.plugins.plugin_process: the configuration line,
the handshake, health, the lifeline; the TypeScript SDK in sdk/typescript implements it), so everything after the
spawn is the same. Installing copies (or unpacks) the package into `<data>/plugins/<id>/env/app`, runs its
`describe` in the sandbox, and writes `env/launch.json`: the runtime's resolved path and the command. The runtime is
looked up at install and again at every start: a missing runtime is an error that says what to install, never a
plugin that silently fails to start. In the sandbox the runtime's binary and the package are bound read-only;
everything else (data dir, sockets, network only if accepted at install) is exactly a Python plugin's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The file a command plugin's environment holds instead of a Python interpreter; PluginRecord.python names it.
LAUNCH_FILE = "launch.json"
# The package.json field that makes an npm package an agenthost plugin.
MANIFEST_FIELD = "agenthost"
# The runtimes a plugin may name, with what to tell a user who lacks one.
RUNTIMES: dict[str, str] = {
    "node": "install Node.js 18 or newer (Debian: apt-get install nodejs; or from https://nodejs.org) so that "
    "`node` is on the host's PATH, or point AGENTHOST_NODE at its binary",
}
RUNTIME_ENV = {"node": "AGENTHOST_NODE"}
# The most a package may hold, counted before anything is copied or unpacked into the host's data dir: a tarball of
# a few kilobytes can declare gigabytes (a gzip bomb), and the copy runs in the host, outside any cgroup. A package
# that bundles its dependencies (esbuild) is a few megabytes; one shipping node_modules is rarely past 300 MB.
MAX_PACKAGE_BYTES = 1 << 30
MAX_PACKAGE_FILES = 200_000


class CommandPluginError(RuntimeError):
    """A command plugin that cannot be installed or started; the message says why and what to do."""


@dataclass(frozen=True)
class PackageInfo:
    name: str
    version: str
    description: str
    runtime: str
    command: tuple[str, ...]  # command[0] is the runtime's name; the rest relative to the package
    has_dependencies: bool


def plugin_id_of(name: str) -> str:
    """An npm name (`@scope/name` included) as a plugin id: lowercase letters, digits and single dashes."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def is_package_dir(path: Path) -> bool:
    """A directory holding an npm package that declares itself an agenthost plugin."""
    try:
        return MANIFEST_FIELD in json.loads((path / "package.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def is_package_tarball(path: Path) -> bool:
    return path.is_file() and path.name.endswith((".tgz", ".tar.gz"))


def read_package(package_json: Path) -> PackageInfo:
    """The package's name and its agenthost field, checked; CommandPluginError names what is wrong."""
    try:
        doc: Any = json.loads(package_json.read_text())
    except (OSError, ValueError) as exc:
        raise CommandPluginError(f"cannot read {package_json}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not plugin_id_of(doc["name"]):
        raise CommandPluginError(f"{package_json} has no package name")
    field = doc.get(MANIFEST_FIELD)
    if not isinstance(field, dict):
        raise CommandPluginError(f'{package_json} has no "{MANIFEST_FIELD}" object naming the plugin\'s command')
    runtime = field.get("runtime")
    command = field.get("command")
    if runtime not in RUNTIMES:
        raise CommandPluginError(
            f'{package_json}: "{MANIFEST_FIELD}.runtime" must be one of {sorted(RUNTIMES)}, not {runtime!r}'
        )
    if (
        not isinstance(command, list)
        or len(command) < 2
        or not all(isinstance(a, str) and a for a in command)
        or command[0] != runtime
    ):
        raise CommandPluginError(
            f'{package_json}: "{MANIFEST_FIELD}.command" must be a list starting with the runtime and its entry '
            f'file, e.g. ["{runtime}", "dist/main.js"]'
        )
    entry = command[1]
    if os.path.isabs(entry) or ".." in Path(entry).parts:
        raise CommandPluginError(f"{package_json}: the entry file {entry!r} must be a path inside the package")
    deps = doc.get("dependencies")
    return PackageInfo(
        name=doc["name"],
        version=str(doc.get("version") or "0"),
        description=str(doc.get("description") or ""),
        runtime=runtime,
        command=tuple(command),
        has_dependencies=isinstance(deps, dict) and bool(deps),
    )


def find_runtime(runtime: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The runtime's binary, resolved (AGENTHOST_NODE, else PATH); CommandPluginError says what to install."""
    override = env.get(RUNTIME_ENV[runtime], "")
    found = override or shutil.which(runtime, path=env.get("PATH"))
    if not found or not os.access(found, os.X_OK):
        where = f"{RUNTIME_ENV[runtime]}={override}" if override else "PATH"
        raise CommandPluginError(
            f"the plugin needs the {runtime} runtime, which is not on {where}: {RUNTIMES[runtime]}"
        )
    return str(Path(found).resolve())


def runtime_paths(runtime_path: str) -> list[str]:
    """What the sandbox binds read-only for the runtime: its binary alone. Node needs nothing else of its prefix to
    run a package (a distribution's libnode lives in the system directories every sandbox sees), and the prefix of
    a node the user put in `~/bin` is the user's home: SSH keys, perhaps the host's own data dir."""
    return [runtime_path]


def _check_size(source: Path, files: int, size: int) -> None:
    if files > MAX_PACKAGE_FILES or size > MAX_PACKAGE_BYTES:
        raise CommandPluginError(
            f"{source} holds {size / (1 << 20):.0f} MiB in {files} files; a command plugin may hold at most"
            f" {MAX_PACKAGE_BYTES >> 20} MiB in {MAX_PACKAGE_FILES} files: bundle its code and dependencies into"
            " its entry file (e.g. with esbuild)"
        )


def check_dir_size(source: Path, ignore: tuple[str, ...] = (".git",)) -> None:
    """Refuses a package directory past MAX_PACKAGE_BYTES or MAX_PACKAGE_FILES before it is copied (links are
    copied as links, so not followed here either)."""
    files = size = 0
    for root, dirs, names in os.walk(source):
        dirs[:] = [d for d in dirs if d not in ignore]
        for name in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, name)).st_size
        _check_size(source, files, size)  # as it goes: a directory of millions of files is not walked to its end


def unpack(tarball: Path, into: Path) -> Path:
    """An npm tarball's package (its files sit under `package/`) unpacked into `into`; no link, device or path
    outside is made (tarfile's data filter), and nothing at all when its members declare more than the caps."""
    try:
        with tarfile.open(tarball) as archive:
            files = size = 0
            for member in archive:  # headers only: the sizes are declared before any byte is written
                files += 1
                size += member.size if member.isreg() else 0
                _check_size(tarball, files, size)
            archive.extractall(into, filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise CommandPluginError(f"cannot unpack {tarball}: {exc}") from None
    roots = [p for p in into.iterdir() if p.is_dir()]
    if (into / "package" / "package.json").exists():
        return into / "package"
    if len(roots) == 1 and (roots[0] / "package.json").exists():
        return roots[0]
    raise CommandPluginError(f"{tarball} holds no package.json (an npm package tarball has package/package.json)")


@dataclass(frozen=True)
class Launch:
    """How the supervisor starts a command plugin: `argv` + ["serve"], with `ro_paths` bound read-only."""

    argv: list[str]
    ro_paths: list[str]


def write_launch(env_dir: Path, final_env: Path, info: PackageInfo, runtime_path: str) -> Path:
    """Writes env_dir/launch.json for the env's final place (`final_env`); returns the final path of the file."""
    doc = {"runtime": info.runtime, "runtime_path": runtime_path, "command": list(info.command)}
    (env_dir / LAUNCH_FILE).write_text(json.dumps(doc))
    return final_env / LAUNCH_FILE


def is_launch_file(path: str) -> bool:
    return Path(path).name == LAUNCH_FILE


def launch(launch_file: str) -> Launch:
    """The command that starts the plugin, checked now: the runtime it was installed with must still be there (else
    the one on PATH now), and its entry file. CommandPluginError says what is missing."""
    path = Path(launch_file)
    try:
        doc = json.loads(path.read_text())
        runtime, runtime_path, command = doc["runtime"], doc["runtime_path"], doc["command"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CommandPluginError(f"the plugin's launch file {path} is unreadable ({exc}); install it again") from None
    if runtime not in RUNTIMES:
        raise CommandPluginError(f"the plugin names an unknown runtime {runtime!r}; install it again")
    if not os.access(runtime_path, os.X_OK):
        runtime_path = find_runtime(runtime)  # moved or upgraded since the install: the one there is now
    app = path.parent / "app"
    entry = app / command[1]
    if not entry.is_file():
        raise CommandPluginError(f"the plugin's entry file {entry} is missing; install it again")
    return Launch([runtime_path, str(entry), *command[2:]], [*runtime_paths(runtime_path), str(app)])
