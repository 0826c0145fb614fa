"""Installs a runner plugin into an isolated environment of its own and checks what it declares.

Each plugin gets `<data>/plugins/<id>/env`, a virtual environment layered over the host's site-packages (a .pth
file appends them after the env's own): the plugin's own dependencies install into its env and shadow the host's
there, while the host's environment and every other plugin's stay untouched. The layering is what gives the
plugin the runner SDK (agenthost itself) without downloading it again. An install is staged in a scratch env
and only replaces an installed version once pip succeeded and the plugin's manifests validated; a failure leaves
nothing behind and says why.

Installing runs the plugin's own code (a build backend, setup.py, then `describe` imports it), so both steps run
inside a sandbox that can write only the staging directory: the build cannot touch the host's files, and a
source directory is copied in first so an in-tree build cannot write into the user's checkout either. Network
only when pip must download (not --offline); `describe` never has it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import site
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from agenthost.plugins import command_plugin, sandbox
from agenthost.plugins.manifest import ChannelManifest, ManifestError, RunnerManifest, parse_many

INSTALL_TIMEOUT = 600.0


class InstallError(RuntimeError):
    """An install that failed; the message carries pip's or the plugin's own reason."""


@dataclass(frozen=True)
class InstalledPlugin:
    plugin_id: str
    distribution: str
    version: str
    python: str
    manifests: list[RunnerManifest]
    source: str
    description: str
    # Channel adapters (agenthost.channels) the plugin offers; a plugin may offer runners, adapters, or both.
    channels: tuple[ChannelManifest, ...] = ()


def _pinned_distribution(path: Path) -> str:
    """The plugin a requirements file installs: its first requirement (the rest are pinned dependencies)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}") from None
    for raw in lines:
        line = raw.split(" #", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith(("#", "-")):
            continue
        spec = line.split(" --hash", 1)[0].strip()
        try:
            return Requirement(spec).name
        except InvalidRequirement as exc:
            raise InstallError(f"{path}: {spec!r} is not a requirement: {exc}") from None
    raise InstallError(f"{path} names no requirement")


def _distribution_of(source: str) -> tuple[str, str]:
    """(kind, distribution name) for a directory, a wheel, a requirements file (hash-pinned installs), or a
    requirement string."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".txt":
        return "requirements", _pinned_distribution(path)
    if path.is_dir():
        pyproject = path / "pyproject.toml"
        if not pyproject.exists():
            raise InstallError(f"{source} is a directory without a pyproject.toml")
        import tomllib

        try:
            name = tomllib.loads(pyproject.read_text())["project"]["name"]
        except (KeyError, tomllib.TOMLDecodeError) as exc:
            raise InstallError(f"{pyproject} has no readable [project] name: {exc}") from None
        return "directory", name
    if path.is_file() and path.suffix == ".whl":
        return "wheel", path.name.split("-")[0]
    try:
        return "requirement", Requirement(source).name
    except InvalidRequirement as exc:
        if source.endswith(".whl"):
            raise InstallError(f"no wheel file at {source}") from None
        raise InstallError(f"{source!r} is neither a directory, a wheel, nor a valid requirement: {exc}") from None


# pip's own configuration (index mirrors, certificates, constraints) is not secret; the sandbox sees it read-only.
_PIP_CONFIG = ("/etc/pip.conf", "/etc/xdg/pip", "~/.config/pip", "~/.pip")


class _Walls:
    """How install steps run: inside a sandbox writing only `staging`, or (the user opted out) as before; then
    through `contain`, the host's resource walls for the install (agenthost.host.processes.resource_walls)."""

    def __init__(self, staging: Path, *, sandboxed: bool, contain: Callable[[list[str]], list[str]] | None) -> None:
        self.staging = staging
        self.sandboxed = sandboxed
        self.contain = contain or (lambda argv: argv)

    def env(self) -> dict[str, str]:
        home = self.staging / "home"
        tmp = self.staging / "tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        # What the plugin process will see (describe imports its code), plus pip's own settings.
        env = sandbox.plugin_environment(os.environ, home=home)
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
        env.update(TMPDIR=str(tmp), PIP_NO_CACHE_DIR="1", XDG_CONFIG_HOME=os.path.expanduser("~/.config"))
        return env

    def argv(self, argv: list[str], *, network: bool, read_only: tuple[str, ...] = ()) -> list[str]:
        return self.contain(self._sandboxed(argv, network=network, read_only=read_only))

    def _sandboxed(self, argv: list[str], *, network: bool, read_only: tuple[str, ...]) -> list[str]:
        if not self.sandboxed:
            return argv
        config = [os.path.expanduser(p) for p in _PIP_CONFIG]
        walls = sandbox.Sandbox(
            ro=[*sandbox.python_paths(), *read_only, *(p for p in config if os.path.exists(p))],
            rw=[str(self.staging)],
            network=network,
            cwd=str(self.staging),
        )
        try:
            return walls.argv(argv)
        except sandbox.SandboxUnavailable as exc:
            raise InstallError(f"cannot sandbox the install: {exc}") from None


async def _run(*args: str, timeout: float = INSTALL_TIMEOUT, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise InstallError(f"{Path(args[0]).name} took longer than {timeout:.0f}s") from None
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def _tail(text: str, lines: int = 12) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return "\n".join(kept[-lines:])


async def install(
    source: str,
    plugins_dir: Path,
    *,
    offline: bool = False,
    sandboxed: bool = True,
    require_hashes: bool = False,
    contain: Callable[[list[str]], list[str]] | None = None,
) -> InstalledPlugin:
    """Called by the host's AgentHost.InstallPlugin. Raises InstallError with the reason on any failure.
    `sandboxed=False` only when the user opted out of the walls (the host refuses installs otherwise).
    `require_hashes`: the source must be a requirements file pinning every distribution it installs by hash.
    `contain`: wraps the command line of every step that runs the plugin's code (pip's build, describe) in the
    host's resource walls: a build script is plugin code, and may fork or allocate without bound.

    A directory holding a package.json (and no pyproject.toml), or an npm package tarball, is a plugin in another
    language whose manifest names its command (agenthost.plugins.command_plugin)."""
    path = Path(source).expanduser()
    if (path.is_dir() and (path / "package.json").exists() and not (path / "pyproject.toml").exists()) or (
        command_plugin.is_package_tarball(path)
    ):
        if require_hashes:
            raise InstallError(
                f"--require-hashes installs Python distributions from a requirements file; {source} is an npm package"
            )
        return await _install_command_plugin(
            path.resolve(), plugins_dir, offline=offline, sandboxed=sandboxed, contain=contain
        )
    kind, dist_name = _distribution_of(source)
    if require_hashes and kind != "requirements":
        raise InstallError(
            "--require-hashes installs from a requirements file whose lines carry --hash=sha256:… (pip's format); "
            f"{source} is a {kind}"
        )
    plugin_id = canonicalize_name(dist_name)
    if plugin_id == "agenthost":
        raise InstallError("agenthost's built-in runners are already installed")
    if kind != "requirement":
        source = str(Path(source).expanduser().resolve())
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = plugins_dir / f".staging-{uuid.uuid4().hex[:8]}"
    try:
        python = await create_env(staging)
        walls = _Walls(staging, sandboxed=sandboxed, contain=contain)
        read_only: tuple[str, ...] = ()
        if kind == "directory":
            copy = staging / "src" / Path(source).name
            shutil.copytree(
                source, copy, symlinks=True, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info")
            )
            source = str(copy)
        elif kind == "wheel":
            read_only = (source,)
        elif kind == "requirements":
            # Pinned wheels usually sit beside the file; file:// references elsewhere are named in it.
            urls = [w.removeprefix("file://") for w in Path(source).read_text().split() if w.startswith("file://")]
            read_only = (str(Path(source).parent), *urls)
        elif (url := Requirement(source).url or "").startswith("file://"):
            read_only = (url.removeprefix("file://"),)  # a direct reference to a local file or directory
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--disable-pip-version-check",
            "--no-input",
        ]
        if offline:
            pip += ["--no-index", "--no-build-isolation"]
        if require_hashes:
            pip.append("--require-hashes")
        target = ["-r", source] if kind == "requirements" else [source]
        env = walls.env()
        code, out, err = await _run(*walls.argv([*pip, *target], network=not offline, read_only=read_only), env=env)
        if code:
            raise InstallError(f"pip could not install {source}:\n{_tail(err or out)}")

        def sandboxed_argv(argv: list[str]) -> list[str]:
            return walls.argv(argv, network=False)  # describe runs the plugin's code: never with network

        # A plugin may offer runners, channel adapters, or both; each SDK describes its own kind.
        (described, reason), (channels_described, _) = await asyncio.gather(
            describe(str(python), dist_name, "runners", sandboxed_argv, env),
            describe(str(python), dist_name, "channels", sandboxed_argv, env),
        )
        if reason and not channels_described:
            raise InstallError(f"{dist_name} installed, but its runners could not be loaded: {reason}")
        if reason:
            described = {**channels_described, "runners": []}  # a plugin of channel adapters only
        manifests = await asyncio.to_thread(
            parse_many, RunnerManifest, [json.dumps(raw) for raw in described["runners"]]
        )
        channels = tuple(
            await asyncio.to_thread(
                parse_many, ChannelManifest, [json.dumps(raw) for raw in channels_described.get("channels", [])]
            )
        )
        for scratch in ("src", "home", "tmp"):
            shutil.rmtree(staging / scratch, ignore_errors=True)
        final = plugins_dir / plugin_id / "env"
        # Only env/bin/python and site-packages are ever used, and both resolve relative to pyvenv.cfg, so the
        # staged env can be moved into place (its console-script shebangs would go stale, but nothing runs them).
        _move_into_place(staging, final)
        return InstalledPlugin(
            plugin_id=plugin_id,
            distribution=dist_name,
            version=described.get("version") or "0",
            python=str(final / "bin" / "python"),
            manifests=manifests,
            source=source,
            description=described.get("summary", ""),
            channels=channels,
        )
    except ManifestError as exc:
        raise InstallError(f"{dist_name}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


async def _install_command_plugin(
    source: Path,
    plugins_dir: Path,
    *,
    offline: bool,
    sandboxed: bool,
    contain: Callable[[list[str]], list[str]] | None,
) -> InstalledPlugin:
    """An npm package (a directory or an `npm pack` tarball) whose package.json names its command: copied or
    unpacked into a staging env, its production dependencies installed by npm when it ships none (not --offline),
    described in the sandbox without network, then moved into place with its launch file."""
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging = plugins_dir / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        app = staging / "app"

        def stage() -> tuple[command_plugin.PackageInfo, str]:
            if source.is_dir():
                command_plugin.check_dir_size(source)
                shutil.copytree(source, app, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            else:
                shutil.move(command_plugin.unpack(source, staging / "unpacked"), app)
            info = command_plugin.read_package(app / "package.json")
            return info, command_plugin.find_runtime(info.runtime)

        try:
            # Up to a GiB copied or unpacked: in a thread, so the host's loop (every run's stream) is not held.
            info, runtime_path = await asyncio.to_thread(stage)
        except command_plugin.CommandPluginError as exc:
            raise InstallError(str(exc)) from None
        plugin_id = command_plugin.plugin_id_of(info.name)
        if plugin_id == "agenthost":
            raise InstallError("agenthost's built-in runners are already installed")
        walls = _Walls(staging, sandboxed=sandboxed, contain=contain)
        env = walls.env()
        runtime_ro = tuple(command_plugin.runtime_paths(runtime_path))
        if info.has_dependencies and not (app / "node_modules").is_dir():
            npm = shutil.which("npm", path=os.environ.get("PATH"))
            if offline or npm is None:
                why = "--offline forbids downloading them" if offline else "npm is not on PATH"
                raise InstallError(
                    f"{info.name} declares dependencies but ships no node_modules, and {why}: bundle them into the "
                    "entry file (e.g. with esbuild), or install without --offline on a machine with npm"
                )
            npm_argv = [npm, "install", "--prefix", str(app), "--omit=dev", "--ignore-scripts", "--no-audit"]
            npm_argv += ["--no-fund", "--no-update-notifier"]
            npm_ro = (*runtime_ro, str(Path(npm).resolve().parent.parent))
            code, out, err = await _run(*walls.argv(npm_argv, network=True, read_only=npm_ro), env=env)
            if code:
                raise InstallError(f"npm could not install the dependencies of {info.name}:\n{_tail(err or out)}")
        entry = app / info.command[1]
        if not entry.is_file():
            raise InstallError(f"{info.name}: the entry file {info.command[1]} is not in the package (build it first?)")
        describe_argv = [runtime_path, str(entry), *info.command[2:], "describe"]
        describe_argv = walls.argv(describe_argv, network=False, read_only=runtime_ro)
        code, out, err = await _run(*describe_argv, timeout=60, env=env)
        try:
            described = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except ValueError:
            described = {}
        if code or not isinstance(described, dict) or not isinstance(described.get("runners"), list):
            reason = described.get("error") if isinstance(described, dict) else None
            reason = reason or _tail(err or out) or f"exit code {code}"
            raise InstallError(f"{info.name} installed, but its runners could not be loaded: {reason}")
        manifests = await asyncio.to_thread(
            parse_many, RunnerManifest, [json.dumps(raw) for raw in described["runners"]]
        )
        if not manifests:
            raise InstallError(f"{info.name} offers no runners")
        for scratch in ("home", "tmp", "unpacked"):
            shutil.rmtree(staging / scratch, ignore_errors=True)
        final = plugins_dir / plugin_id / "env"
        launch_file = command_plugin.write_launch(staging, final, info, runtime_path)
        _move_into_place(staging, final)
        return InstalledPlugin(
            plugin_id=plugin_id,
            distribution=info.name,
            version=info.version,
            python=str(launch_file),
            manifests=manifests,
            source=str(source),
            description=info.description,
        )
    except ManifestError as exc:
        raise InstallError(f"{source.name}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


DESCRIBE_MODULES = {"runners": "agenthost.runners.sdk", "channels": "agenthost.channels.sdk"}


async def describe(
    python: str, distribution: str, kind: str, wrap: Callable[[list[str]], list[str]], env: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """What a distribution offers of one kind ("runners" or "channels"), asked of `python -m <sdk> describe` in
    the environment the plugin runs in (`wrap` puts it in a sandbox): ({"version", "summary", kind: [manifest…]},
    "") or ({}, the reason it could not say)."""
    argv = wrap([python, "-m", DESCRIBE_MODULES[kind], "describe", "--distribution", distribution])
    code, out, err = await _run(*argv, timeout=60, env=env)
    try:
        described = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except ValueError:
        described = {}
    if code or not isinstance(described, dict) or kind not in described:
        error = described.get("error") if isinstance(described, dict) else None
        return {}, error or _tail(err or out) or f"exit code {code}"
    return described, ""


async def create_env(path: Path) -> Path:
    """A venv whose sys.path ends with the host's site-packages; returns its interpreter."""
    code, out, err = await _run(sys.executable, "-m", "venv", "--without-pip", str(path))
    if code:
        raise InstallError(f"could not create the plugin environment: {_tail(err or out)}")
    python = path / "bin" / "python"
    code, out, err = await _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    if code:
        raise InstallError(f"the new plugin environment does not run: {_tail(err or out)}")
    # addsitedir (not a bare path line) so the host's own .pth files, e.g. an editable agenthost, apply too.
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    (Path(out.strip()) / "zz_agenthost_host.pth").write_text(lines)
    return python


def remove(plugins_dir: Path, plugin_id: str) -> None:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", plugin_id):
        raise InstallError(f"not a plugin id: {plugin_id!r}")
    shutil.rmtree(plugins_dir / plugin_id / "env", ignore_errors=True)


def _move_into_place(staging: Path, final: Path) -> None:
    """Replaces a plugin's installed environment with the staged one (an install over an older version)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
