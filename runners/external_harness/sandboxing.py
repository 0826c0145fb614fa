"""The wall around a harness's whole process tree: what one run's bubblewrap sandbox shows, and where the
harness binaries (and what they need to run) live on this machine.

A harness runs model-chosen shell commands, so everything it starts is as untrusted as the model. Inside the
sandbox it sees the read-only system, its own install, the Python that runs the MCP bridge, the host's run API
socket (a single file), and read-write only this conversation's working directory and its harness home.
The runner's data dir, other conversations' workspaces and harness homes (their session transcripts, what their
CLIs load at start-up), the bot's defaults, the host's data dir and admin.sock are simply absent.
A pid namespace ends every process of the run with the harness (or with the runner, if it dies first).
Its network is a namespace of its own whose only way out is the runner's egress proxy (`harness_egress`,
agenthost.runners.sdk.egress): to the binding's model endpoint, its http MCP servers and
`network.allowed_domains`, never the host's loopback or its abstract unix sockets.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from agenthost.plugins import sandbox as walls
from agenthost.runners.external_harness.config import CommandWalls, HarnessConfig
from agenthost.runners.external_harness.errors import HarnessNotFound, HarnessSandboxError
from agenthost.runners.external_harness.workspace import Workspace
from agenthost.runners.sdk import egress

# Installed under these, a path is already visible through the sandbox's read-only system.
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/opt/")
_CODEX_TRIPLES = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}
_CODEX_PLATFORM_PACKAGES = {
    "x86_64-unknown-linux-musl": "@openai/codex-linux-x64",
    "aarch64-unknown-linux-musl": "@openai/codex-linux-arm64",
}


def resolve_executable(binary: str, path_env: str) -> str | None:
    """The real file behind `binary` (a path, or a name looked up on `path_env`), or None if there is none."""
    found = binary if os.sep in binary else shutil.which(binary, path=path_env)
    if not found or not os.path.isfile(found):
        return None
    return os.path.realpath(found)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _shebang(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return ""
    return head.split(b"\n", 1)[0].decode(errors="replace") if head.startswith(b"#!") else ""


def _package_root(path: str) -> Path | None:
    """The npm package a file belongs to: the nearest ancestor holding package.json directly inside a
    node_modules (or @scope) folder. None for a file that is not part of an npm install."""
    for parent in Path(path).parents:
        if (parent / "package.json").is_file() and (
            parent.parent.name == "node_modules" or parent.parent.parent.name == "node_modules"
        ):
            return parent
        if parent.name == "node_modules":
            return None
    return None


def _node_modules_of(path: Path) -> Path | None:
    for parent in path.parents:
        if parent.name == "node_modules":
            return parent
    return None


def install_paths(exe: str, path_env: str) -> list[str]:
    """What must be readable inside the sandbox to run `exe` (already resolved): its npm package when it is
    part of one, else the file alone; for a node script also the folder its dependencies are hoisted into and
    node's own install prefix."""
    paths: list[str] = []
    root = _package_root(exe)
    paths.append(str(root) if root else exe)
    if not _is_elf(exe) and "node" in _shebang(exe):
        if root is not None and (modules := _node_modules_of(root)) is not None:
            paths.append(str(modules))
        node = resolve_executable("node", path_env)
        if node is not None:
            # <prefix>/bin/node: the prefix also holds node's bundled modules and headers.
            paths.append(str(Path(node).parent.parent))
    return [p for p in paths if not p.startswith(_SYSTEM_PREFIXES)]


def resolve_codex(binary: str, path_env: str) -> tuple[str, dict[str, str], list[str]]:
    """Codex's native executable for `binary`, the environment its npm launcher would set, and the paths to
    show read-only.

    The npm package's `bin/codex.js` only picks the platform binary and execs it under node. Running that
    binary directly means the runner's signals and the sandbox's death signal reach Codex itself, not a node
    process in front of it."""
    exe = resolve_executable(binary, path_env)
    if exe is None:
        raise HarnessNotFound(f"harness executable {binary!r} not found (PATH={path_env})")
    if _is_elf(exe):
        return exe, {}, install_paths(exe, path_env)
    root = _package_root(exe)
    if root is None or not (root / "package.json").read_text(errors="replace").count('"@openai/codex"'):
        # A wrapper script of the user's own: run it as given (its interpreter must be in the system).
        return exe, {}, install_paths(exe, path_env)
    triple = _CODEX_TRIPLES.get(platform.machine())
    if triple is None:
        raise HarnessNotFound(f"Codex publishes no Linux binary for {platform.machine()}")
    candidates: list[Path] = []
    # node's require.resolve order: the package's own node_modules, then each ancestor's.
    for base in [root / "node_modules", *(p for p in root.parents if p.name == "node_modules")]:
        pkg = base / _CODEX_PLATFORM_PACKAGES[triple]
        candidates += [pkg / "vendor" / triple / "bin" / "codex", pkg / "vendor" / triple / "codex" / "codex"]
    candidates += [root / "vendor" / triple / "bin" / "codex", root / "vendor" / triple / "codex" / "codex"]
    native = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if native is None:
        raise HarnessNotFound(
            f"Codex's native binary for {triple} is missing next to {exe} (looked for "
            f"{_CODEX_PLATFORM_PACKAGES[triple]}); reinstall with scripts/install_harness_clis.sh"
        )
    native_real = os.path.realpath(native)
    # What codex.js sets before exec: the package root (Codex finds its bundled resources through it) and
    # the package manager that owns the install (for update hints).
    env = {"CODEX_MANAGED_PACKAGE_ROOT": str(root), "CODEX_MANAGED_BY_NPM": "1"}
    native_root = _package_root(native_real)
    ro = [str(root), str(native_root) if native_root else str(Path(native_real).parent)]
    return native_real, env, [p for p in ro if not p.startswith(_SYSTEM_PREFIXES)]


def unix_socket_path(address: str) -> str | None:
    """The file behind a gRPC `unix:` address (None for a TCP address, which the shared network reaches)."""
    if address.startswith("unix://"):
        return address[len("unix://") :] or None
    if address.startswith("unix:"):
        return address[len("unix:") :] or None
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def harness_sandbox(
    *,
    workspace: Workspace,
    install: list[str],
    host_address: str,
    data_dir: Path,
    commands: CommandWalls | None = None,
) -> walls.Sandbox:
    """The sandbox for one harness turn. Refuses (HarnessSandboxError) when bubblewrap does not work here, or
    when a read-only path would reveal the runner's data dir as a whole.

    `commands` is what the binding lets the model's commands do: a working directory they may not write is
    mounted read-only (the harness home, where the harness keeps its sessions, and /tmp stay writable). Default:
    the working directory is writable."""
    commands = commands or CommandWalls()
    reason = walls.probe()
    if reason is not None:
        raise HarnessSandboxError(
            f"cannot sandbox the harness: {reason}. Install bubblewrap, or set `process_sandbox: false` in the "
            "binding to run the harness without walls (not recommended)"
        )
    ro = [*install, *walls.python_paths(), *walls.extra_paths(walls.EXTRA_RO_ENV)]
    socket = unix_socket_path(host_address)
    if socket:
        ro.append(socket)
    data = os.path.realpath(data_dir)
    for path in ro:
        real = os.path.realpath(path)
        if _inside(data, real):
            raise HarnessSandboxError(
                f"refusing to sandbox the harness: read-only path {real} contains the runner's data dir {data}"
            )
    workdir = str(workspace.working_dir)
    return walls.Sandbox(
        ro=ro if commands.workdir_writable else [*ro, workdir],
        rw=[workdir, str(workspace.harness_dir)] if commands.workdir_writable else [str(workspace.harness_dir)],
        network=False,  # its own namespace; harness_egress adds the one way out
        home=str(workspace.home),
        cwd=str(workspace.working_dir),
    )


# Where each harness sends its model requests when the binding names no base_url.
DEFAULT_API = {"claude-code": "https://api.anthropic.com", "codex": "https://api.openai.com"}


def egress_policy(config: HarnessConfig, harness: str) -> egress.EgressPolicy:
    """The binding's allow list: its model endpoint, its own http MCP servers, and `network.allowed_domains`."""
    urls = [config.base_url or DEFAULT_API.get(harness, "")]
    urls += [s.url for s in config.mcp_servers if s.transport == "http" and s.url]
    # A base URL the binding sets through `env` is as much the binding's endpoint as `base_url`.
    urls += [value for name, value in config.env.items() if name.endswith("_BASE_URL")]
    endpoints = tuple(sorted({e for u in urls if (e := egress.url_endpoint(u)) is not None}))
    return egress.EgressPolicy(endpoints=endpoints, domains=tuple(config.network.allowed_domains))


async def harness_egress(sandbox: walls.Sandbox, config: HarnessConfig, harness: str) -> egress.EgressSandbox:
    """`sandbox` (harness_sandbox's) with its one way out: the runner's egress proxy for this binding."""
    return await egress.egress_sandbox(sandbox, egress_policy(config, harness))


def with_bridge(sandbox: walls.Sandbox | None, bridge: object) -> walls.Sandbox | None:
    """The sandbox with the runner's loopback MCP endpoint forwarded in at its own port (its URL then holds inside
    the sandbox's namespace too). Unchanged for any other bridge, or without a sandbox."""
    port, path = getattr(bridge, "port", 0), getattr(bridge, "unix_path", None)
    if isinstance(sandbox, egress.EgressSandbox) and port and path:
        return sandbox.with_forward(port, path)
    return sandbox
