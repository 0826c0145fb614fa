"""Resource walls around plugin processes: a cgroup per process (memory cap, process cap, CPU weight) where the
host can manage cgroups, and the limits that need no privilege (setrlimit) everywhere.

The sandbox (agenthost.plugins.sandbox) decides what a plugin can see; this decides how much of the machine it
can take. Without it a plugin, a command a model runs through a runner's shell tool, or a harness CLI could fork
until the process table is full or allocate until the kernel kills something the user cares about.

Each plugin process joins its cgroup in a shell prologue (`ResourceWalls.command`) that then execs bwrap, so the
sandbox and everything it starts are inside before any plugin code runs. Groups live under one directory per host
instance, `agenthost-<pidns>-<pid>-<starttime>-<nonce>`, next to the host's own cgroup; `sweep_stale` removes those of
hosts that are gone, `close` removes this host's.

cgroup v2 (unified): the host's cgroup must be delegated to it (root, or a systemd unit with Delegate=yes). The
kernel forbids enabling controllers for children of a cgroup that holds processes, so the host first moves
itself into a leaf, `agenthost.leaf`, of its own cgroup. cgroup v1: the `memory` and `pids` hierarchies, each
used below the host's own place in it.

Where neither works (a user without delegation) the host still runs plugins, with the rlimits only, and says
so once at start and in `agenthost status`.

Inside a runner process's group, `tools` holds the commands the runner starts for a model, with a share of the
group's caps (limits.PLUGIN_TOOLS_SHARE), so a command that forks or allocates without bound stops at its own cap
and the runner keeps the rest. The runner moves those commands there itself (agenthost.runners.sdk.tool_walls),
through the tools group's cgroup.procs files, which the supervisor binds into its sandbox and names in
wire.TOOLS_CGROUP_ENV. On v2 the runner process lives in a `main` leaf beside it (a cgroup that gives controllers
to children holds no processes).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import resource
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from agenthost.host import limits
from agenthost.plugins.sandbox import join_cgroups, proc_start_time

log = logging.getLogger(__name__)

LEAF = "agenthost.leaf"  # the v2 leaf the host moves itself into (see the module doc)
MAIN = "main"  # v2: the plugin process's leaf inside its group
TOOLS = "tools"  # the sub-group of the commands a plugin starts for a model
# agenthost-<pid namespace inode>-<pid>-<start time>-<nonce>: a host's pid means something only in its namespace.
_GROUP = re.compile(r"^agenthost-(\d+)-(\d+)-(\d+)-[0-9a-f]+$")
ENABLE_HINT = (
    "run the host in a cgroup of its own delegated to it: `systemd-run --user --scope -p Delegate=yes agenthost "
    "serve` (as root, without --user), or a systemd service with Delegate=yes"
)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", limits.GiB), ("MiB", limits.MiB), ("KiB", limits.KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Caps:
    """What each plugin process (with everything it starts) may take; read from agenthost.host.limits at spawn."""

    memory_max_bytes: int
    pids_max: int
    cpu_weight: int
    open_files_max: int

    @classmethod
    def current(cls) -> Caps:
        return cls(
            limits.PLUGIN_MEMORY_MAX_BYTES,
            limits.PLUGIN_PIDS_MAX,
            limits.PLUGIN_CPU_WEIGHT,
            limits.PLUGIN_OPEN_FILES_MAX,
        )

    def tools_share(self) -> Caps:
        """The caps of a plugin group's `tools` sub-group."""
        share = limits.PLUGIN_TOOLS_SHARE
        return Caps(
            int(self.memory_max_bytes * share), int(self.pids_max * share), self.cpu_weight, self.open_files_max
        )


@dataclass
class PluginGroup:
    """One plugin process's cgroup: a directory per hierarchy (one on v2; memory, pids and maybe cpu on v1)."""

    version: int
    dirs: dict[str, Path]  # controller ("memory", "pids", "cpu"; "unified" on v2) → directory
    caps: Caps
    # Where the plugin process itself joins (`dirs`, or their `main` leaf on v2), and its tools sub-group; empty
    # for the groups of sweeps and installs.
    members: dict[str, Path] = field(default_factory=dict)
    tools: dict[str, Path] = field(default_factory=dict)
    _oom_kills: int = 0
    _forks_refused: int = 0

    @property
    def tools_procs(self) -> list[str]:
        """The files a process writes "0" into to join the tools sub-group (one per hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.tools.values()]

    def oom_kills(self) -> int:
        """How many processes of the plugin process's own part of the group (not its tools) the kernel's OOM killer
        has killed; the last count read is kept, so it still answers after the group is removed."""
        own = self.members or self.dirs
        memory = own.get("unified") or own.get("memory")
        if memory is not None:
            name = "memory.events" if self.version == 2 else "memory.oom_control"
            with contextlib.suppress(OSError, ValueError):
                for line in (memory / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        self._oom_kills = max(self._oom_kills, int(value))
        return self._oom_kills

    def forks_refused(self) -> int:
        """How many forks (or new threads) the process cap refused; kept like oom_kills."""
        pids = self.dirs.get("unified") or self.dirs.get("pids")
        if pids is not None:
            with contextlib.suppress(OSError, ValueError):
                for line in (pids / "pids.events").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "max":
                        self._forks_refused = max(self._forks_refused, int(value))
        return self._forks_refused

    def _all_dirs(self) -> list[Path]:
        """Sub-groups first: the order they must be removed in."""
        subs = [*self.tools.values(), *(d for d in self.members.values() if d not in self.dirs.values())]
        return [*subs, *self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self._all_dirs():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL to everything left in the group: nothing a plugin started escapes its end."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.dirs["unified"] / "cgroup.kill").write_text("1")
                return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout: float = 5.0) -> bool:
        """Kills what is left and removes the directories (dying processes keep a group busy for a moment)."""
        self.oom_kills()
        self.forks_refused()
        deadline = time.monotonic() + timeout
        while True:
            self.kill()
            left = [d for d in self._all_dirs() if not _rmdir(d)]
            if not left:
                return True
            if time.monotonic() >= deadline:
                log.warning("could not remove cgroups %s: still busy", ", ".join(map(str, left)))
                return False
            time.sleep(0.02)


@dataclass
class ResourceWalls:
    """The host's resource walls. `on` when plugin processes get cgroups; `reason` says why not otherwise."""

    version: int = 0  # 2, 1, or 0: off
    reason: str = ""
    host_dirs: dict[str, Path] = field(default_factory=dict)  # this host's group per hierarchy
    groups: dict[int, PluginGroup] = field(default_factory=dict)  # by plugin pid
    _counter: int = 0

    @property
    def on(self) -> bool:
        return self.version != 0

    @property
    def mechanism(self) -> str:
        return f"cgroup v{self.version}" if self.on else ""

    # ---- set-up ----

    @classmethod
    def setup(cls) -> ResourceWalls:
        """Finds a cgroup hierarchy this host may manage and makes this host's group in it; never raises."""
        if os.environ.get("AGENTHOST_NO_CGROUPS") == "1":
            return cls(reason="turned off with AGENTHOST_NO_CGROUPS=1")
        token = f"agenthost-{_pid_namespace()}-{os.getpid()}-{proc_start_time(os.getpid()) or 0}-{secrets.token_hex(3)}"
        reasons = []
        for attempt in (_setup_v2, _setup_v1):
            try:
                found = attempt(token)
            except OSError as exc:
                reasons.append(f"{attempt.__name__[-2:]}: {exc}")
                continue
            if isinstance(found, str):
                reasons.append(found)
                continue
            version, dirs = found
            return cls(version=version, host_dirs=dirs)
        return cls(reason="; ".join(reasons) or "no cgroup hierarchy found")

    def sweep_stale(self) -> int:
        """Removes the groups of host instances that are gone (their pid and start time no longer match),
        killing anything left in them. Returns how many it removed."""
        removed = 0
        namespace = str(_pid_namespace())
        for mine in self.host_dirs.values():
            with contextlib.suppress(OSError):
                for entry in mine.parent.iterdir():
                    match = _GROUP.match(entry.name)
                    if not match or entry == mine or not entry.is_dir():
                        continue
                    if match[1] != namespace or proc_start_time(int(match[2])) == match[3]:
                        continue  # another live host's, or one whose pid this host cannot check
                    removed += _remove_tree(entry, self.version)
        return removed

    # ---- per plugin process ----

    def new_group(self, name: str, *, with_tools: bool = False) -> PluginGroup | None:
        """A fresh group for one plugin process with the current caps (`with_tools`: and its tools sub-group);
        None when the walls are off. OSError when the group cannot be made (the caller refuses to start the plugin
        rather than start it unwalled)."""
        if not self.on:
            return None
        caps = Caps.current()
        self._counter += 1
        leaf = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.{self._counter}"
        dirs = {c: d / leaf for c, d in self.host_dirs.items()}
        group = PluginGroup(self.version, dirs, caps)
        try:
            for controller, d in dirs.items():
                d.mkdir()
                _apply_caps(self.version, controller, d, caps)
            if with_tools:
                for controller, d in dirs.items():
                    if self.version == 2:
                        # The same controllers as the host's group gives its children.
                        given = (d.parent / "cgroup.subtree_control").read_text().split()
                        _enable(d, [c.lstrip("+") for c in given])
                        group.members[controller] = d / MAIN
                        (d / MAIN).mkdir()
                    else:
                        group.members[controller] = d
                    group.tools[controller] = d / TOOLS
                    (d / TOOLS).mkdir()
                    _apply_caps(self.version, controller, d / TOOLS, caps.tools_share())
        except OSError:
            group.remove(timeout=0)
            raise
        return group

    def adopt(self, pid: int, group: PluginGroup) -> None:
        self.groups[pid] = group

    def release(self, pid: int) -> PluginGroup | None:
        """Removes the group of a plugin process that has ended (and whatever it left)."""
        group = self.groups.pop(pid, None)
        if group is not None:
            group.remove()
        return group

    def close(self) -> None:
        """At host stop: every plugin group, then this host's own."""
        for pid in list(self.groups):
            self.release(pid)
        for d in self.host_dirs.values():
            _remove_tree(d, self.version)

    @staticmethod
    def command(argv: list[str], group: PluginGroup | None, caps: Caps | None = None) -> list[str]:
        """`argv` behind a /bin/sh prologue that sets the rlimits, joins `group` (every hierarchy) and execs it, so
        the process is walled before the sandbox or any plugin code runs. Not a preexec_fn: the host has threads,
        and Python code in the forked child of a threaded process crashed there (SIGSEGV in a few percent of starts);
        a shell started by exec has no such hazard, and costs about a millisecond."""
        caps = caps or (group.caps if group is not None else Caps.current())
        _, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile = caps.open_files_max
        if nofile_hard != resource.RLIM_INFINITY:
            nofile = min(nofile, nofile_hard)
        # No core dumps: a crashing plugin must not leave its memory (keys, other runs' data) in a file.
        lines = ["ulimit -c 0 || exit 125", f"ulimit -n {nofile} || exit 125"]
        if group is not None:
            lines += join_cgroups(str(d / "cgroup.procs") for d in (group.members or group.dirs).values())
        lines.append('exec "$@"')
        return ["/bin/sh", "-c", "\n".join(lines), "agenthost-walls", *argv]

    def describe(self) -> str:
        if not self.on:
            return f"off: {self.reason}"
        caps = Caps.current()
        return (
            f"on ({self.mechanism}): each plugin process may use {human_bytes(caps.memory_max_bytes)} of memory "
            f"and {caps.pids_max} processes"
        )


# ---- hierarchies ----


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root within the hierarchy, mount point, fstype, super options) of each cgroup mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for the unified hierarchy) → this process's cgroup path, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _place(mount_root: str, mount_point: str, path: str) -> Path:
    rel = path[len(mount_root) :] if mount_root != "/" and path.startswith(mount_root) else path
    return Path(mount_point) / rel.lstrip("/")


def _setup_v2(token: str) -> tuple[int, dict[str, Path]] | str:
    own = _own_cgroups().get("")
    mount = next((m for m in _mounts() if m[2] == "cgroup2"), None)
    if own is None or mount is None:
        return "v2: no unified hierarchy"
    base = _place(mount[0], mount[1], own)
    if base.name == LEAF:
        base = base.parent  # a host before this one in this process moved it there already
    available = set((base / "cgroup.controllers").read_text().split())
    missing = {"memory", "pids"} - available
    if missing:
        return f"v2: controllers {', '.join(sorted(missing))} not available in {base}"
    if not os.access(base / "cgroup.subtree_control", os.W_OK) or not os.access(base, os.W_OK):
        return f"v2: {base} is not delegated to this user"
    wanted = ["memory", "pids", *(["cpu"] if "cpu" in available else [])]
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        leaf = base / LEAF
        if base != Path(mount[1]):  # the root cgroup is exempt from "no internal processes"
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        try:
            _enable(base, wanted)
        except OSError as exc:
            if leaf.exists():  # back where it was: the host does not leave the user's cgroup rearranged for nothing
                with contextlib.suppress(OSError):
                    (base / "cgroup.procs").write_text(str(os.getpid()))
                _rmdir(leaf)
            if exc.errno == errno.EBUSY:
                return f"v2: {base} holds other processes, so its controllers cannot be enabled"
            raise
    host = base / token
    host.mkdir()
    try:
        _enable(host, wanted)
    except OSError:
        _rmdir(host)
        raise
    return 2, {"unified": host}


def _enable(cgroup: Path, controllers: list[str]) -> None:
    (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers if c != "cpu"))
    if "cpu" in controllers:
        with contextlib.suppress(OSError):  # optional: refused e.g. with realtime threads in the tree
            (cgroup / "cgroup.subtree_control").write_text("+cpu")


def _setup_v1(token: str) -> tuple[int, dict[str, Path]] | str:
    own = _own_cgroups()
    dirs: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpu"):
        mount = next((m for m in _mounts() if m[2] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in own:
            if controller == "cpu":
                continue
            return f"v1: no {controller} hierarchy"
        base = _place(mount[0], mount[1], own[controller])
        if not os.access(base, os.W_OK):
            if controller == "cpu":
                continue
            return f"v1: {base} is not writable by this user"
        dirs[controller] = base / token
    made: list[Path] = []
    try:
        for d in dirs.values():
            d.mkdir()
            made.append(d)
    except OSError:
        for d in made:
            _rmdir(d)
        raise
    return 1, dirs


def _apply_caps(version: int, controller: str, d: Path, caps: Caps) -> None:
    if version == 2:
        (d / "memory.max").write_text(str(caps.memory_max_bytes))
        if (d / "memory.swap.max").exists():  # the cap is on memory, not RAM: no spilling into swap
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(caps.pids_max))
        if (d / "cpu.weight").exists():
            (d / "cpu.weight").write_text(str(caps.cpu_weight))
    elif controller == "memory":
        (d / "memory.limit_in_bytes").write_text(str(caps.memory_max_bytes))
        with contextlib.suppress(FileNotFoundError):  # memory+swap (absent without swap accounting)
            (d / "memory.memsw.limit_in_bytes").write_text(str(caps.memory_max_bytes))
    elif controller == "pids":
        (d / "pids.max").write_text(str(caps.pids_max))
    elif controller == "cpu":
        (d / "cpu.shares").write_text(str(max(2, caps.cpu_weight * 1024 // 100)))


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _remove_tree(top: Path, version: int) -> int:
    """Kills what is in `top` and below, then removes the directories bottom-up (a plugin group holds its `tools`
    and, on v2, `main`). Returns 1 if `top` is gone."""
    with contextlib.suppress(OSError):
        for child in top.iterdir():
            if child.is_dir():
                _remove_tree(child, version)
    return 1 if PluginGroup(version, {"unified" if version == 2 else "any": top}, Caps.current()).remove() else 0
