"""One supervised process per runner plugin (and per configured channel adapter): start, readiness, crash
detection, restart, shutdown, no orphans.

Channel adapters (agenthost.channels) go through the same lifecycle and walls with a different spec: their own
entry module, health service and data dir, no Describe, and instead of the run API socket the admin socket, with
a scoped `send` credential that `PluginSpec.prepare` hands them fresh at each start.

Lifecycle of a plugin process (states in PluginProcess.state):
  starting → ready            handshake line on stdout within start_timeout, then health SERVING, then Describe
  ready → backoff → starting  it died: in-flight runs fail with runner_crashed, restart after jittered backoff
  backoff → dead              crash-loop breaker: too many consecutive short-lived starts; `restart()` revives it
  * → stopped                 graceful ladder: Shutdown RPC → SIGTERM → SIGKILL of the whole process group

No runner outlives its host: the host holds the write end of each child's stdin (the lifeline: EOF = exit),
children get their own process group, and at start the host kills groups a previous host left behind whose
pid and start time it recorded.

Walls: each plugin process runs inside a bubblewrap sandbox (agenthost.plugins.sandbox) that dies with the host
and sees the read-only system and interpreter, its own environment (read-only), its own data dir, its own socket
directory and the run API socket — never admin.sock, the database, other plugins' files or the host's /proc. Its
environment is an allowlist: no provider key, no host secret. Network only for built-ins and for plugins whose
manifest asked and whose user accepted at install. Resource walls (agenthost.host.processes.resource_walls): each
process joins its own cgroup (memory and process caps) before exec where the host can manage cgroups, and gets rlimits
(no core dumps) everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenthost.host.access.grants import RunRegistry, new_token
from agenthost.host.ops.logs import RotatingFile, pump
from agenthost.host.ops.observability import Observer
from agenthost.host.processes import describe_cache
from agenthost.host.processes.plugin_sockets import PluginSockets
from agenthost.host.processes.resource_walls import PluginGroup, ResourceWalls, human_bytes
from agenthost.host.store.db import Database
from agenthost.plugins import binding_paths, command_plugin, sandbox
from agenthost.plugins.binding_paths import NamedPath
from agenthost.plugins.manifest import ManifestError, RunnerManifest, parse_many
from agenthost.protos import runner_pb2, runner_pb2_grpc, wire
from agenthost.protos.wire import CHANNEL_OPTIONS, HANDSHAKE_PREFIX, PROTOCOL_VERSION, TOOLS_CGROUP_ENV

log = logging.getLogger(__name__)


@dataclass
class SupervisorPolicy:
    start_timeout: float = 20.0
    health_timeout: float = 5.0
    shutdown_grace: float = 2.0
    term_grace: float = 2.0
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    restart_limit: int = 5  # consecutive short-lived starts before the breaker opens
    stable_after: float = 10.0  # alive this long = a healthy start; resets the counter


@dataclass
class PluginSpec:
    plugin_id: str
    distribution: str
    python: str
    builtin: bool = False
    network: bool = False  # the user accepted the plugin's request for network access
    # "runner": serves the Runner service, described at start, reaches the run API. "channel": a channel adapter
    # process (agenthost.channels.sdk), which reaches `host_socket` with what `prepare` returns.
    kind: str = "runner"
    module: str = "agenthost.runners.sdk"
    data_dir: Path | None = None  # default: <data>/plugins/<plugin_id>/data
    host_socket: str | None = None  # the one host socket the process sees; default: the run API's
    # Extra settings for the process's configuration line, made at each start (a fresh credential, named keys).
    prepare: Callable[[], Awaitable[dict[str, Any]]] | None = None
    # The host paths its bindings name (checked again at each start: agenthost.plugins.binding_paths), bound into
    # the sandbox: a plugin process serves every binding of its runners, so it sees the union; each run's own
    # sandbox (tool commands, harness) is built by the runner from that run's binding and shows only its paths.
    paths: Callable[[], list[NamedPath]] | None = None

    @property
    def health_service(self) -> str:
        return wire.CHANNEL_HEALTH_SERVICE if self.kind == "channel" else wire.RUNNER_HEALTH_SERVICE


class PluginStartError(RuntimeError):
    pass


def describe_exit(returncode: int | None, *, sandboxed: bool = False) -> str:
    """How a process ended: its exit code, or the signal that killed it (a negative returncode: the process the
    host started, bwrap itself, was killed; under bwrap also 128 + N, its report of the sandboxed child's death)."""
    if returncode is None:
        return "still running"
    signum = -returncode if returncode < 0 else 0
    if sandboxed and 128 < returncode < 128 + 65:
        signum = returncode - 128
    if signum:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"killed by signal {signum}"
    return f"exited with code {returncode}"


@dataclass
class PluginProcess:
    spec: PluginSpec
    state: str = "stopped"
    proc: asyncio.subprocess.Process | None = None
    channel: grpc.aio.Channel | None = None
    stub: runner_pb2_grpc.RunnerStub | None = None
    manifests: dict[str, RunnerManifest] = field(default_factory=dict)
    last_error: str = ""
    restarts: int = 0
    consecutive_failures: int = 0
    started_at: float = 0.0
    monitor: asyncio.Task[None] | None = None
    stopping: bool = False
    sock_dir: Path | None = None
    api_socket: str = ""  # the process's own run-API listener (PluginSockets), closed with it
    log_pump: asyncio.Task[None] | None = None  # copies the process's stderr into its rotating log
    bound_paths: frozenset[tuple[str, str]] = frozenset()  # (path, mode) the running process's sandbox shows
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def set_state(self, state: str) -> None:
        self.state = state
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_state(self, *states: str) -> None:
        while self.state not in states:
            await self._changed.wait()


class Supervisor:
    """Owned by agenthost.host.server.Host. `on_ready(plugin_id, manifests)` lets the host record what a start
    described. Runs in flight when a process dies learn it from their own broken `Run` stream
    (agenthost.host.runs.manager)."""

    def __init__(
        self,
        *,
        db: Database,
        registry: RunRegistry,
        runtime_dir: Path,
        data_dir: Path,
        host_address: str,
        policy: SupervisorPolicy | None = None,
        on_ready: Callable[[str, dict[str, RunnerManifest]], Awaitable[None]] | None = None,
        sandboxed: bool = True,
        observer: Observer | None = None,
        walls: ResourceWalls | None = None,
        api_sockets: PluginSockets | None = None,
    ) -> None:
        self.db = db
        # None (tests that build a bare supervisor): runners share `host_address`, whose connection cap is then
        # host-wide.
        self.api_sockets = api_sockets
        self.observer = observer or Observer()
        # One rotating log per plugin, shared by its successive processes (and by a dying one's last words).
        self._logs: dict[str, RotatingFile] = {}
        self.registry = registry
        self.runtime_dir = runtime_dir
        self.data_dir = data_dir
        self.host_address = host_address
        self.policy = policy or SupervisorPolicy()
        self.on_ready = on_ready
        # False only when the user opted out of the walls (`serve --unsafe-no-sandbox`) or no sandbox works here
        # (then the host starts built-ins only); see Host._sandbox_mode.
        self.sandboxed = sandboxed
        self.processes: dict[str, PluginProcess] = {}
        self._counter = 0
        # Cgroups (when on) and rlimits of plugin processes; off = rlimits only. The group of each process started
        # stays readable after it ends, so how it ended (the memory cap?) can be told to the runs it was serving.
        self.walls = walls or ResourceWalls(reason="not set up")
        self._groups: weakref.WeakKeyDictionary[asyncio.subprocess.Process, PluginGroup] = weakref.WeakKeyDictionary()

    # ---- orphan sweep ----

    async def sweep_orphans(self) -> int:
        """Kills process groups a previous host recorded, if pid and start time still match (no pid reuse)."""
        rows = self.db.query("SELECT plugin_id, pid, start_time FROM plugin_processes")
        killed = 0
        for row in rows:
            pid, start_time = row["pid"], row["start_time"]
            if sandbox.proc_start_time(pid) == start_time:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    killed += 1
        await self.db.write(lambda conn: conn.execute("DELETE FROM plugin_processes"))
        return killed

    # ---- start ----

    def add(self, spec: PluginSpec) -> PluginProcess:
        proc = self.processes.get(spec.plugin_id)
        if proc is None:
            proc = self.processes[spec.plugin_id] = PluginProcess(spec)
        else:
            proc.spec = spec
        return proc

    async def start(self, plugin_id: str) -> PluginProcess:
        """Starts (or waits for) the plugin; raises PluginStartError with the reason when it cannot."""
        pp = self.processes[plugin_id]
        if pp.state == "ready":
            return pp
        if pp.state in ("starting", "backoff") and pp.monitor is not None:
            await self.wait_ready(plugin_id, self.policy.start_timeout + self.policy.backoff_max)
            return pp
        pp.stopping = False
        pp.consecutive_failures = 0
        # Before the task exists: wait_ready must not take the old "stopped" for an outcome (from Python 3.12,
        # wait_for awaits in this task, so it can look before the monitor has run at all).
        pp.set_state("starting")
        pp.monitor = asyncio.create_task(self._keep_running(pp), name=f"supervise:{plugin_id}")
        await self.wait_ready(plugin_id, self.policy.start_timeout + self.policy.health_timeout + 1)
        return pp

    async def wait_ready(self, plugin_id: str, timeout: float) -> PluginProcess:
        pp = self.processes.get(plugin_id)
        if pp is None:
            raise PluginStartError(f"plugin {plugin_id!r} is not installed")
        if pp.state == "ready":
            return pp
        if pp.state in ("dead", "stopped") and pp.monitor is None:
            raise PluginStartError(f"plugin {plugin_id} is {pp.state}: {pp.last_error or 'not started'}")
        try:
            await asyncio.wait_for(pp.wait_for_state("ready", "dead", "stopped"), timeout)
        except TimeoutError:
            raise PluginStartError(f"plugin {plugin_id} did not become ready: {pp.last_error}") from None
        if pp.state != "ready":
            raise PluginStartError(f"plugin {plugin_id} is {pp.state}: {pp.last_error}")
        return pp

    async def _keep_running(self, pp: PluginProcess) -> None:
        try:
            while not pp.stopping:
                try:
                    await self._spawn(pp)
                except PluginStartError as exc:
                    pp.last_error = str(exc)
                    await self._close_api_socket(pp)  # a start that failed before its process existed
                    self.observer.plugin_failed(pp.spec.plugin_id, pp.last_error, crashed=False)
                else:
                    if self.on_ready is not None and pp.spec.kind == "runner":
                        await self.on_ready(pp.spec.plugin_id, pp.manifests)
                    pp.set_state("ready")
                    self.observer.plugin_ready(pp.spec.plugin_id, pp.proc.pid, sorted(pp.manifests))
                    await pp.proc.wait()
                    # Not "ready" while its channel is being closed: a run arriving now waits for the restart.
                    pp.set_state("backoff")
                    alive = time.monotonic() - pp.started_at
                    await self._forget_process(pp)
                    if pp.stopping:
                        break
                    pp.last_error = f"{pp.spec.kind} process {self.describe_end(pp.proc)}"
                    self.observer.plugin_failed(pp.spec.plugin_id, pp.last_error, crashed=True)
                    if alive >= self.policy.stable_after:
                        pp.consecutive_failures = 0
                pp.consecutive_failures += 1
                if pp.stopping:
                    break
                if pp.consecutive_failures > self.policy.restart_limit:
                    pp.last_error = (
                        f"crash loop: {pp.consecutive_failures} failed starts in a row; last: {pp.last_error}"
                    )
                    pp.set_state("dead")
                    self.observer.plugin_breaker_open(pp.spec.plugin_id, pp.consecutive_failures, pp.last_error)
                    return
                pp.set_state("backoff")
                delay = min(self.policy.backoff_max, self.policy.backoff_base * 2 ** (pp.consecutive_failures - 1))
                delay *= random.uniform(0.5, 1.0)
                self.observer.plugin_restarting(pp.spec.plugin_id, pp.restarts + 1, delay)
                await asyncio.sleep(delay)
                pp.restarts += 1
        finally:
            if pp.state != "dead":
                pp.set_state("stopped")
            pp.monitor = None

    async def _spawn(self, pp: PluginProcess) -> None:
        spec = pp.spec
        pp.set_state("starting")
        self._counter += 1
        # A directory of its own per process: the sandbox binds it (for the Runner socket) and nothing else of the
        # runtime dir but api.sock, so admin.sock and other plugins' sockets stay out of sight.
        sock_dir = self.runtime_dir / f"p{self._counter}"
        shutil.rmtree(sock_dir, ignore_errors=True)
        sock_dir.mkdir(mode=0o700)
        sock = sock_dir / "r.sock"
        listen = f"unix:{sock}"
        secret = new_token("ps")
        data_dir = spec.data_dir or self.data_dir / "plugins" / spec.plugin_id / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            extra = await spec.prepare() if spec.prepare is not None else {}
        except Exception as exc:  # noqa: BLE001 — whatever stops the start is the plugin's last_error
            raise PluginStartError(f"cannot prepare the {spec.kind} process: {exc}") from None
        host_socket = spec.host_socket or self.host_address
        if spec.host_socket is None and self.api_sockets is not None:
            try:
                host_socket = pp.api_socket = await self.api_sockets.open(spec.plugin_id)
            except (RuntimeError, OSError) as exc:
                raise PluginStartError(f"cannot open the {spec.kind} process's run API socket: {exc}") from None
        log_path = self.data_dir / "logs" / f"{spec.plugin_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = sandbox.plugin_environment(os.environ, home=data_dir)
        if command_plugin.is_launch_file(spec.python):
            # A plugin in another language: its runtime and package, read-only; the rest of the walls as below.
            try:
                launch = command_plugin.launch(spec.python)
            except command_plugin.CommandPluginError as exc:
                raise PluginStartError(f"cannot start the {spec.kind} process: {exc}") from None
            argv = [*launch.argv, "serve"]
            runtime_ro = launch.ro_paths
        else:
            argv = [spec.python, "-m", spec.module, "serve"]
            runtime_ro = [*sandbox.python_paths(), str(Path(spec.python).parent.parent)]
        try:
            # Runner processes start commands for models: their group has a tools sub-group for those.
            group = self.walls.new_group(spec.plugin_id, with_tools=spec.kind == "runner")
        except OSError as exc:
            raise PluginStartError(f"cannot make the {spec.kind} process's cgroup: {exc}") from None
        tools_procs = group.tools_procs if group is not None else []
        if tools_procs:
            env[TOOLS_CGROUP_ENV] = ":".join(tools_procs)
        named = spec.paths() if spec.paths is not None else []
        pp.bound_paths = frozenset((n.path, n.mode) for n in named)
        kept_as, kept = await self._kept_description(spec, pp, env)
        if self.sandboxed:
            env[sandbox.INSIDE_ENV] = "1"
            named_ro, named_rw = binding_paths.sandbox_paths(named)
            box = sandbox.Sandbox(
                ro=[
                    *runtime_ro,
                    *sandbox.extra_paths(sandbox.EXTRA_RO_ENV),
                    *named_ro,
                ],
                rw=[
                    *named_rw,
                    str(data_dir),
                    str(sock_dir),
                    host_socket.removeprefix("unix:"),
                    *sandbox.extra_paths(sandbox.EXTRA_RW_ENV),
                ],
                network=spec.builtin or spec.network,
                cwd=str(data_dir),
                rw_files=tools_procs,
                cgroup_namespace=not (tools_procs and self.walls.version == 2),
            )
            try:
                argv = box.argv(argv)
            except sandbox.SandboxUnavailable as exc:
                if group is not None:
                    await asyncio.to_thread(group.remove)
                raise PluginStartError(f"cannot sandbox the {spec.kind} process: {exc}") from None
        pp.sock_dir = sock_dir
        # stderr comes through a pipe and the host writes it, so the log rotates by size whatever the child does
        # (a child holding the file itself could grow it past any rotation).
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.walls.command(argv, group),  # in its cgroup before bwrap or plugin code runs
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=data_dir,
                env=env,
                start_new_session=True,
                limit=64 * 1024,
            )
        except OSError as exc:
            if group is not None:
                await asyncio.to_thread(group.remove)
            raise PluginStartError(f"cannot start the {spec.kind} process: {exc}") from None
        if group is not None:
            self.walls.adopt(proc.pid, group)
            self._groups[proc] = group
        sink = self._logs.get(spec.plugin_id)
        if sink is None or sink.path != log_path:
            sink = self._logs[spec.plugin_id] = RotatingFile(log_path)
        # A marker per start: a quiet runner still has a log, and restarts are easy to find in it.
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        sink.write(f"--- agenthost: {spec.kind} process {proc.pid} started at {started} ---\n".encode())
        assert proc.stderr is not None
        pp.log_pump = asyncio.create_task(pump(proc.stderr, sink), name=f"log:{spec.plugin_id}")
        pp.proc = proc
        self.observer.plugin_spawned(spec.plugin_id, proc.pid, pp.restarts)
        pp.started_at = time.monotonic()
        start_time = sandbox.proc_start_time(proc.pid) or ""
        await self.db.write(
            lambda conn: conn.execute(
                "INSERT INTO plugin_processes(plugin_id, pid, start_time) VALUES (?,?,?) ON CONFLICT(plugin_id)"
                " DO UPDATE SET pid = excluded.pid, start_time = excluded.start_time",
                (spec.plugin_id, proc.pid, start_time),
            )
        )
        config = {
            "plugin_id": spec.plugin_id,
            "distribution": spec.distribution,
            "listen": listen,
            "host": host_socket,
            "secret": secret,
            "data_dir": str(data_dir),
            **extra,
        }
        if kept is not None:
            config["described"] = kept
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps(config) + "\n").encode())
            await proc.stdin.drain()
            await self._handshake(pp, proc, listen, log_path)
            if self.sandboxed:
                # Before any run: what the runner starts for one conversation must not see another's processes.
                try:
                    await asyncio.to_thread(sandbox.hide_foreign_processes, proc.pid)
                except sandbox.SandboxUnavailable as exc:
                    raise PluginStartError(f"cannot sandbox the {spec.kind} process: {exc}") from None
            pp.channel = grpc.aio.insecure_channel(listen, options=CHANNEL_OPTIONS)
            await self._await_health(pp)
            if spec.kind == "runner":
                pp.stub = runner_pb2_grpc.RunnerStub(pp.channel)
                described = await pp.stub.Describe(runner_pb2.DescribeRequest(), timeout=self.policy.health_timeout)
                parsed = await asyncio.to_thread(parse_many, RunnerManifest, list(described.manifests_json))
                pp.manifests = {m.name: m for m in parsed}
                if kept_as and kept is None:
                    try:
                        await asyncio.to_thread(
                            describe_cache.store_runners,
                            describe_cache.cache_dir(self.data_dir),
                            kept_as,
                            described.sdk_version,
                            list(described.manifests_json),
                            dict(described.entry_points),
                        )
                    except OSError as exc:  # a full disk costs the next start its describe child, nothing more
                        log.warning("%s: description not kept (%s)", spec.plugin_id, exc)
        except (PluginStartError, ManifestError, grpc.RpcError, OSError) as exc:
            await self._kill(pp)
            await self._forget_process(pp)
            if isinstance(exc, grpc.RpcError):
                raise PluginStartError(
                    f"{spec.kind} process did not answer: {exc.code().name} {exc.details()}"
                ) from None
            raise PluginStartError(str(exc)) from None
        if spec.kind == "runner":
            self.registry.add_plugin_secret(spec.plugin_id, secret)
        # Drain stdout for the rest of the process's life so a chatty runner can never block on a full pipe.
        asyncio.create_task(_drain(proc.stdout))

    async def _kept_description(
        self, spec: PluginSpec, pp: PluginProcess, env: dict[str, str]
    ) -> tuple[str, dict[str, Any] | None]:
        """The content key of a Python runner plugin's description ('' for other kinds) and the report kept under
        it, if any: agenthost.host.processes.describe_cache."""
        if spec.kind != "runner" or command_plugin.is_launch_file(spec.python):
            return "", None
        try:
            kept_as = await asyncio.to_thread(
                describe_cache.key,
                kind="runners",
                python=spec.python,
                distribution=spec.distribution,
                builtin=spec.builtin,
                sandboxed=self.sandboxed,
                network=spec.builtin or spec.network,
                bound=pp.bound_paths,
                env={k: v for k, v in env.items() if k != TOOLS_CGROUP_ENV},  # this process's own cgroup
            )
        except (OSError, ImportError, ValueError) as exc:  # no key: the process describes itself, as ever
            log.warning("%s: no kept description (%s)", spec.plugin_id, exc)
            return "", None
        kept = await asyncio.to_thread(describe_cache.load, describe_cache.cache_dir(self.data_dir), kept_as, "runners")
        return kept_as, kept

    def out_of_memory(self, proc: asyncio.subprocess.Process) -> bool:
        """Whether the kernel killed this ended plugin process for passing its cgroup's memory cap."""
        group = self._groups.get(proc)
        killed = proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
        return group is not None and killed and group.oom_kills() > 0

    def describe_end(self, proc: asyncio.subprocess.Process) -> str:
        """How a plugin process ended, naming the memory cap when that is what ended it."""
        if self.out_of_memory(proc):
            cap = self._groups[proc].caps.memory_max_bytes
            return (
                "killed by SIGKILL from the kernel's out-of-memory killer: its processes passed the per-plugin "
                f"memory cap PLUGIN_MEMORY_MAX_BYTES = {human_bytes(cap)}"
            )
        how = describe_exit(proc.returncode, sandboxed=self.sandboxed)
        group = self._groups.get(proc)
        if group is not None and group.forks_refused():
            # Short of processes (a fork bomb in a tool command, say), a runtime that cannot start a thread aborts.
            how += f" after its processes reached the per-plugin process cap PLUGIN_PIDS_MAX = {group.caps.pids_max}"
        return how

    async def _handshake(
        self, pp: PluginProcess, proc: asyncio.subprocess.Process, listen: str, log_path: Path
    ) -> None:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), self.policy.start_timeout)
        except TimeoutError:
            raise PluginStartError(f"no handshake within {self.policy.start_timeout:.0f}s; see {log_path}") from None
        except ValueError:
            raise PluginStartError("unrecognized handshake: a line longer than 64 KiB on stdout") from None
        if not line:
            await proc.wait()
            if pp.log_pump is not None:
                # Its last words may still be in the pipe; a grandchild holding the pipe must not hold us here.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pp.log_pump), 1.0)
            raise PluginStartError(
                f"{pp.spec.kind} process {self.describe_end(proc)} before the handshake: {_tail(log_path)}"
            )
        text = line.decode(errors="replace").strip()
        parts = text.split("|")
        if len(parts) != 3 or parts[0] != HANDSHAKE_PREFIX:
            raise PluginStartError(f"unrecognized handshake line on stdout: {text[:200]!r}")
        if parts[1] != str(PROTOCOL_VERSION):
            raise PluginStartError(f"incompatible protocol version {parts[1]!r}; this host speaks {PROTOCOL_VERSION}")
        if parts[2] != listen:
            raise PluginStartError(f"runner listens on {parts[2]!r}, not the assigned {listen!r}")

    async def _await_health(self, pp: PluginProcess) -> None:
        stub = health_pb2_grpc.HealthStub(pp.channel)
        deadline = time.monotonic() + self.policy.health_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=pp.spec.health_service), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.RpcError as exc:
                last = exc.code().name
            await asyncio.sleep(0.05)
        raise PluginStartError(f"health check never reported SERVING (last: {last})")

    async def _close_api_socket(self, pp: PluginProcess) -> None:
        if pp.api_socket and self.api_sockets is not None:
            address, pp.api_socket = pp.api_socket, ""
            await self.api_sockets.close(address)

    async def _forget_process(self, pp: PluginProcess) -> None:
        if pp.channel is not None:
            await pp.channel.close()
            pp.channel = None
            pp.stub = None
        self.registry.remove_plugin(pp.spec.plugin_id)
        await self._close_api_socket(pp)
        if pp.sock_dir is not None:
            shutil.rmtree(pp.sock_dir, ignore_errors=True)
            pp.sock_dir = None
        pid = pp.proc.pid if pp.proc else None
        if pid is not None:
            # The group may still hold grandchildren the runner spawned; they go with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            group = self.walls.groups.pop(pid, None)
            if group is not None:
                # Whatever left the process group (setsid) is still in the cgroup: it goes too.
                await asyncio.to_thread(group.remove)
        with contextlib.suppress(*self.db.errors):
            await self.db.write(
                lambda conn: conn.execute("DELETE FROM plugin_processes WHERE plugin_id = ?", (pp.spec.plugin_id,))
            )

    async def attach(
        self, plugin_id: str, address: str, secret: str, manifests: dict[str, RunnerManifest]
    ) -> PluginProcess:
        """Adopts a runner server this supervisor did not spawn (an in-process one in agenthost.runners.sdk.testing).
        It is not restarted or killed; `stop` only forgets it."""
        pp = self.add(PluginSpec(plugin_id, plugin_id, ""))
        pp.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        pp.stub = runner_pb2_grpc.RunnerStub(pp.channel)
        pp.manifests = dict(manifests)
        pp.set_state("ready")
        self.registry.add_plugin_secret(plugin_id, secret)
        return pp

    # ---- stop ----

    async def _kill(self, pp: PluginProcess) -> None:
        proc = pp.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()

    async def stop(self, plugin_id: str) -> None:
        """The graceful ladder: Shutdown RPC, then SIGTERM, then SIGKILL of the process group. Idempotent."""
        pp = self.processes.get(plugin_id)
        if pp is None:
            return
        pp.stopping = True
        proc = pp.proc
        if proc is not None and proc.returncode is None:
            if pp.stub is not None:
                with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
                    await pp.stub.Shutdown(
                        runner_pb2.ShutdownRequest(grace_seconds=self.policy.shutdown_grace),
                        timeout=self.policy.shutdown_grace,
                    )
            # Without a Shutdown RPC (a channel adapter, a runner not yet ready) SIGTERM is the first rung.
            if pp.stub is None or not await _exited(proc, self.policy.shutdown_grace):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                if not await _exited(proc, self.policy.term_grace):
                    await self._kill(pp)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # grandchildren left in the group
        if pp.monitor is not None:
            pp.monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pp.monitor
        await self._forget_process(pp)
        pp.set_state("stopped")
        self.observer.plugin_stopped(plugin_id)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(pid) for pid in list(self.processes)), return_exceptions=True)
        pumps = [pp.log_pump for pp in self.processes.values() if pp.log_pump is not None]
        if pumps:
            # The process groups are gone, so the pipes reach EOF; bounded in case something else held one open.
            await asyncio.wait(pumps, timeout=2.0)
            for task in pumps:
                task.cancel()
        for sink in self._logs.values():
            sink.close()


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), timeout)
        return True
    except TimeoutError:
        return False


async def _drain(stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass


def _tail(path: Path, limit: int = 600) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return "(no log)"
    text = data.decode(errors="replace").strip()
    return text or "(nothing on stderr)"
