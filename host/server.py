"""The host process: owns the data dir, the stores, the plugin supervisor, and the two gRPC servers.

    async with Host(data_dir) as host:   # or: await host.start() ... await host.stop()
        ...

Sockets: `api.sock` (AgentRunAPIProxy, for runners) and `admin.sock` (AgentHost, for the CLI) live in a
directory only this user can enter; its path is written to `<data_dir>/host.json` for clients. One host per data
dir, enforced with an exclusive lock on `<data_dir>/host.lock`. Every admin call carries a credential
(agenthost.host.access.credentials); everything the host writes is private to its user (umask 077, and an existing data
dir is tightened at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agenthost.host import limits
from agenthost.host.access.credentials import AuthInterceptor, Credentials
from agenthost.host.access.grants import RunRegistry
from agenthost.host.access.keys import KEYS_FILE, KeyStore
from agenthost.host.access.private_files import STANDBY_FILE, make_private_dir, tighten, write_json
from agenthost.host.api.admin import add_admin_servicer
from agenthost.host.api.run_api import RunAPIServicer, add_servicer, run_api_handlers
from agenthost.host.knowledge import KnowledgeBase
from agenthost.host.ops.addresses import parse_address
from agenthost.host.ops.logs import HostLogging, Redactor
from agenthost.host.ops.logs import install as install_logging
from agenthost.host.ops.metrics import MetricsServer
from agenthost.host.ops.observability import Observer
from agenthost.host.ops.tracing import Tracing
from agenthost.host.processes import binding_config
from agenthost.host.processes.channels import Channels
from agenthost.host.processes.plugin_sockets import PluginSockets, run_api_server
from agenthost.host.processes.resource_walls import ENABLE_HINT, Caps, ResourceWalls
from agenthost.host.processes.supervisor import PluginSpec, PluginStartError, Supervisor, SupervisorPolicy
from agenthost.host.runs.manager import RunManager, parse_runner_id
from agenthost.host.store import pgvector
from agenthost.host.store.artifacts import ArtifactStore
from agenthost.host.store.conversations import Conversations
from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database, DatabaseUnavailable
from agenthost.host.store.faults import DatabaseDown
from agenthost.host.store.knowledge import KnowledgeStore
from agenthost.host.store.registry import PluginRecord, Registry
from agenthost.host.store.runs import AuditLog, RunStore
from agenthost.host.store.state import StateStore
from agenthost.host.store.workers import WorkerStore
from agenthost.host.workers.hub import WorkerHub
from agenthost.host.workers.hub import caller as worker_caller
from agenthost.plugins import binding_paths, sandbox
from agenthost.plugins import install as installer
from agenthost.plugins.binding_paths import NamedPath
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.prefetch import Prefetch, prefetch
from agenthost.protos.wire import SERVER_OPTIONS, VERSION

log = logging.getLogger(__name__)

BUILTIN_PLUGIN = "agenthost"
SEND_MESSAGE = f"/{hpb.DESCRIPTOR.services_by_name['AgentHost'].full_name}/SendMessage"
# Extra SendMessage calls asked of grpc-core ahead (agenthost.protos.prefetch): enough that a burst is taken up in
# a few loop iterations; each is only a pending request in grpc-core until a call arrives.
PREFETCH_SENDS = 64


class HostAlreadyRunning(RuntimeError):
    pass


def default_data_dir() -> Path:
    return Path(os.environ.get("AGENTHOST_HOME", Path.home() / ".agenthost")).expanduser()


def _runtime_dir(data_dir: Path) -> Path:
    """A 0700 directory for the sockets; under the data dir when the path fits a unix socket name (108 bytes),
    else under the temp dir, where another user may have created the name first: that one is never used."""
    candidate = data_dir / "run"
    if len(str(candidate)) < 70:
        return make_private_dir(candidate)
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return make_private_dir(Path(tempfile.gettempdir()) / f"agenthost-{os.getuid()}-{digest}")


class Host:
    def __init__(
        self,
        data_dir: Path,
        *,
        policy: SupervisorPolicy | None = None,
        builtin_plugins: bool = True,
        unsafe_no_sandbox: bool = False,
        log_level: int | None = None,
        metrics_address: str | None = None,
        otlp_endpoint: str | None = None,
        tracing: Tracing | None = None,
        gateway_address: str | None = None,
        gateway_trusted_proxies: Sequence[str] = (),
        database: str | None = None,
        database_password: str | None = None,
        database_password_key: str | None = None,
        workers_address: str | None = None,
        workers_enrol_address: str | None = None,
        standby: bool = False,
    ) -> None:
        """`database`: a `postgresql://` DSN to keep the stores in (None: the SQLite file <data>/agenthost.db); its
        password, if not in the DSN, is `database_password` or the key store's `database_password_key`.
        `log_level`: also write the host log to <data>/logs/host.log at that level (None: leave logging to the
        embedding process). `metrics_address`: serve Prometheus metrics there (HOST:PORT). `otlp_endpoint` (or
        OTEL_EXPORTER_OTLP_ENDPOINT): export spans; `tracing` instead hands in a configured Tracing (tests)."""
        self.data_dir = data_dir.expanduser().resolve()
        self.database = database
        self.database_password = database_password
        self.database_password_key = database_password_key
        # PostgreSQL only: wait for the host holding the database to go, then take over (docs/operating/standby.md).
        self.standby = standby
        # Set once another host took the database's lease from this one: `serve` stops the host and exits.
        self.deposed = asyncio.Event()
        self.lease_lost = ""
        self.log_level = log_level
        self.metrics_address = metrics_address
        self.otlp_endpoint = otlp_endpoint
        self.tracing = tracing
        # The HTTP gateway (agenthost.host.api.gateway), off unless given HOST:PORT; aiohttp is imported only then.
        self.gateway_address = gateway_address
        # Proxies whose X-Forwarded-For / Forwarded name the client (the gateway's per-address caps); none by default.
        self.gateway_trusted_proxies = tuple(gateway_trusted_proxies)
        self.gateway: Any = None
        # Runner workers (agenthost.host.workers): off unless given HOST:PORT; the CA is made at the first start
        # that listens, in <data>/workers/.
        self.workers_address = workers_address
        self.workers_enrol_address = workers_enrol_address
        self.workers: WorkerHub | None = None
        self.metrics_server: MetricsServer | None = None
        self._logging: HostLogging | None = None
        self._keys_stamp: tuple[int, ...] | None = None
        self._key_values: list[str] = []
        self.policy = policy or SupervisorPolicy()
        self.builtin_plugins = builtin_plugins
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self.resource_walls = ResourceWalls(reason="the host has not started")
        self.sandbox_status = ""
        self.started_at = 0.0
        self._lock_fd: int | None = None
        self._servers: list[grpc.aio.Server] = []
        self.plugin_sockets: PluginSockets | None = None
        self.prefetch: Prefetch | None = None
        self._health: health.aio.HealthServicer | None = None
        self._background: set[asyncio.Task[None]] = set()

    # ---- lifecycle ----

    async def start(self) -> None:
        # Everything the host creates from here on (database, WAL, logs, artifacts, sockets) is its user's alone.
        os.umask(0o077)
        sandbox.harden_process()
        soft, hard = limits.raise_fd_limit()
        log.info(
            "descriptor limit %d (hard %d); connection caps: gateway %d, api.sock %d",
            soft,
            hard,
            *limits.listener_caps(soft),
        )
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._acquire_lock()
        try:
            if self.log_level is not None:
                self._logging = install_logging(self.data_dir, self.log_level, redactor=Redactor(self.secret_values))
            await self._start()
        except BaseException:
            self.resource_walls.close()
            await self._stop_observing()
            self._release_lock()
            raise

    def secret_values(self) -> list[str]:
        """What the log redactor masks besides token shapes: the admin token and every stored provider key. Asked
        for every log line, so the key file is read again only when it changed (a new stat)."""
        found = [self.credentials.admin_token] if hasattr(self, "credentials") else []
        if hasattr(self, "keys"):
            try:
                st = os.stat(self.data_dir / KEYS_FILE)
                stamp: tuple[int, ...] = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                stamp = ()
            if stamp != self._keys_stamp:
                self._key_values = list(self.keys.resolve([k.name for k in self.keys.list()]).values())
                self._keys_stamp = stamp
            found.extend(self._key_values)
        return found

    async def _stop_observing(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            self.metrics_server = None
        if self.tracing is not None:
            self.tracing.shutdown()
        if self._logging is not None:
            self._logging.close()
            self._logging = None

    def _acquire_lock(self) -> None:
        fd = os.open(self.data_dir / "host.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise HostAlreadyRunning(f"another agenthost (pid {holder}) is serving {self.data_dir}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _start(self) -> None:
        self.started_at = time.time()
        if self.tracing is None:
            self.tracing = Tracing.configure(self.otlp_endpoint, required=bool(self.otlp_endpoint))
        self.observer = Observer(tracing=self.tracing)
        loosened = tighten(self.data_dir)
        if loosened:
            log.warning("made %d files and directories under %s private to this user", loosened, self.data_dir)
        self.credentials = Credentials(self.data_dir)
        self.keys = KeyStore(self.data_dir)
        self.sandbox_status = self._sandbox_mode()
        self.resource_walls = self._resource_walls()
        password = self.database_password
        if self.database_password_key:
            name = self.database_password_key
            try:
                password = self.keys.resolve([name])[name]
            except errors.FailedPrecondition:
                raise DatabaseUnavailable(
                    f"the key store has no key {name!r} for the database password: set it with"
                    f" `agenthost keys set {name}` (while a host serves this data dir) or use a password file"
                ) from None
        self.db = Database(
            self.database or self.data_dir / "agenthost.db",
            password=password,
            standby=self._waiting if self.standby else None,
            on_lease_lost=self._lost_lease,
        )
        try:
            await self.db.open()
        finally:
            (self.data_dir / STANDBY_FILE).unlink(missing_ok=True)
        if self.db.epoch is not None:
            log.warning("holding the database lease, epoch %d, as %s", self.db.epoch, self.db.holder)
            self._keep_background(self._heartbeat())
        secret_row = self.db.query_one("SELECT value FROM meta WHERE key = 'cursor_secret'")
        if secret_row is None:
            secret = secrets.token_hex(32)
            await self.db.write(
                lambda c: c.execute("INSERT INTO meta(key, value) VALUES ('cursor_secret', ?)", (secret,))
            )
        else:
            secret = secret_row[0]
        self.registry = Registry(self.db)
        self.conversations = Conversations(self.db, CursorCodec(bytes.fromhex(secret)))
        self.run_store = RunStore(self.db)
        self.state = StateStore(self.db)
        self.audit = AuditLog(self.db)
        self.artifacts = ArtifactStore(self.db, self.data_dir / "artifacts")
        self.knowledge = KnowledgeBase(KnowledgeStore(self.db), self.artifacts, self.keys)
        self.grants = RunRegistry()
        self.runtime_dir = _runtime_dir(self.data_dir)
        self.api_address = f"unix:{self.runtime_dir / 'api.sock'}"
        self.admin_address = f"unix:{self.runtime_dir / 'admin.sock'}"
        self.supervisor = Supervisor(
            db=self.db,
            registry=self.grants,
            runtime_dir=self.runtime_dir,
            data_dir=self.data_dir,
            host_address=self.api_address,
            policy=self.policy,
            on_ready=self._record_manifests,
            sandboxed=self.sandbox_status == "on",
            observer=self.observer,
            walls=self.resource_walls,
        )
        swept = await self.supervisor.sweep_orphans()
        interrupted = await self.run_store.interrupt_unfinished()
        if swept or interrupted:
            log.warning("previous host left %d runner process groups and %d unfinished runs", swept, interrupted)
        self.runs = RunManager(
            registry=self.registry,
            runs=self.run_store,
            conversations=self.conversations,
            state=self.state,
            grants=self.grants,
            supervisor=self.supervisor,
            keys=self.keys,
            observer=self.observer,
            artifacts=self.artifacts,
        )
        # The runs a previous host accepted and left queued join the queue before the sockets open, so a new message
        # of the same conversation lines up behind them; none starts before the plugins are supervised (release).
        self.runs.hold()
        resumed = await self.runs.resume_queued()
        if resumed:
            log.warning("resumed %d runs the previous host accepted and left queued", resumed)
        self._watch()
        await self._serve()
        if self.builtin_plugins:
            await self._register_builtin()
        for plugin in self.registry.plugins():
            # A plugin that offers only channel adapters has no runner process; its channels start below.
            if plugin.enabled and (plugin.builtin or plugin.manifests_json != "[]"):
                self._supervise(plugin)
        # After the plugins: a channel's messages need its bot's runner.
        self.channels = Channels(self)
        self.channels.start_all()
        # Last: queued runs, resumed or new, start once their runners can (their plugins are supervised).
        self.runs.release()

    def _waiting(self, holder: str) -> None:
        """A standby's status while it waits (on the writer's thread): what `agenthost status` shows."""
        log.warning("standby: %s holds the database; waiting to take over", holder)
        write_json(
            self.data_dir / STANDBY_FILE,
            {"pid": os.getpid(), "database": self.db.description, "active": holder, "since": time.time()},
        )

    def _lost_lease(self, reason: str) -> None:
        log.error("%s: stopping (this host writes nothing more)", reason)
        self.lease_lost = reason
        self.deposed.set()

    async def _heartbeat(self) -> None:
        """The lease row's heartbeat, for humans (the lease itself is the lock's session); each beat is also a write
        transaction, so a host that lost the lease finds out within a beat even when idle."""
        while not self.db.fenced:
            await asyncio.sleep(limits.LEASE_HEARTBEAT_SECONDS)
            with contextlib.suppress(*self.db.errors):
                await self.db.write(
                    lambda c: c.execute("UPDATE lease SET heartbeat_at = ? WHERE id = 1", (time.time(),))
                )

    def _keep_background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _sandbox_mode(self) -> str:
        reason = sandbox.probe()
        if reason is None:
            return "on"
        if self.unsafe_no_sandbox:
            log.error("RUNNING EVERY PLUGIN WITHOUT A SANDBOX (--unsafe-no-sandbox): %s", reason)
            return f"disabled by the user: {reason}"
        log.error("no sandbox here, so only built-in runners will start, unsandboxed: %s", reason)
        return f"off: {reason}"

    def _resource_walls(self) -> ResourceWalls:
        walls = ResourceWalls.setup()
        if walls.on:
            stale = walls.sweep_stale()
            if stale:
                log.warning("removed %d cgroups of hosts that are gone", stale)
            log.info("resource limits %s", walls.describe())
        else:
            log.warning(
                "RESOURCE LIMITS ARE OFF: a plugin process can use all memory and fork without bound (%s); to turn "
                "them on, %s",
                walls.reason,
                ENABLE_HINT,
            )
        return walls

    def check_walls(self, plugin: PluginRecord) -> None:
        """Third-party code never runs without walls unless the user said so."""
        if plugin.builtin or self.sandbox_status == "on" or self.sandbox_status.startswith("disabled"):
            return
        raise errors.FailedPrecondition(
            f"refusing to start plugin {plugin.plugin_id} without a sandbox ({self.sandbox_status}); install "
            "bubblewrap, or restart the host with --unsafe-no-sandbox to run plugins without walls"
        )

    def _watch(self) -> None:
        """Gauges read at scrape time: nothing runs between scrapes to keep them current."""
        m = self.observer.metrics
        m.gauge("agenthost_runs_live", "Runs queued or running.", self.runs.in_flight)
        m.gauge(
            "agenthost_db_write_queue_jobs", "Writes waiting for the database writer.", lambda: self.db.pending_jobs
        )
        m.gauge(
            "agenthost_db_write_queue_bytes",
            "Bytes of writes waiting for the database writer.",
            lambda: self.db.pending_bytes,
        )
        m.gauge(
            "agenthost_plugins_ready",
            "Runner plugin processes ready to take runs.",
            lambda: sum(pp.state == "ready" for pp in self.supervisor.processes.values()),
        )

    async def _serve(self) -> None:
        for address in (self.api_address, self.admin_address):
            Path(address.removeprefix("unix:")).unlink(missing_ok=True)
        _, api_connections = limits.listener_caps()
        servicer = self._run_api_servicer()
        # Only when tracing is on: off, the run API's calls go through no interceptor at all.
        interceptors = [self.tracing.interceptor()] if self.tracing is not None and self.tracing.on else None
        # api.sock serves what the host itself attaches (in-process runners in tests); every plugin process it
        # starts gets a socket of its own instead, so the caps are per plugin (host/processes/plugin_sockets.py).
        # admin.sock, below, has no cap, so the operator's CLI gets in while plugins flood theirs.
        api_server = run_api_server(functools.partial(add_servicer, servicer), api_connections, interceptors)
        self.supervisor.api_sockets = self.plugin_sockets = PluginSockets(
            self.runtime_dir, functools.partial(add_servicer, servicer), interceptors
        )
        admin_interceptors = [AuthInterceptor(self.credentials, on_refused=self.observer.admin_refused)]
        admin_server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=admin_interceptors)
        admin_handlers = add_admin_servicer(self, admin_server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, admin_server)
        for server, address in ((api_server, self.api_address), (admin_server, self.admin_address)):
            server.add_insecure_port(address)
            await server.start()
            self._servers.append(server)
        # A burst of sends (thousands of clients at once) is taken up PREFETCH_SENDS at a time, so each learns at
        # once whether its run started or is queued (the run manager's admission answers), instead of waiting
        # in grpc-core for grpc's one-at-a-time accept. The admin server has no maximum_concurrent_rpcs.
        self.prefetch = prefetch(
            admin_server,
            {SEND_MESSAGE: admin_handlers[SEND_MESSAGE]},
            interceptors=admin_interceptors,
            depth=PREFETCH_SENDS,
        )
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if self.metrics_address:
            bind, port = parse_address(self.metrics_address, what="metrics", example="127.0.0.1:9464")
            self.metrics_server = MetricsServer(self.observer.metrics, bind, port)
            await self.metrics_server.start()
            log.info("metrics on http://%s/metrics", self.metrics_server.address)
        if self.gateway_address:
            from agenthost.host.api.gateway.app import Gateway
            from agenthost.protos.listeners import parse_networks

            proxies = parse_networks(self.gateway_trusted_proxies, what="--trusted-proxy")
            self.gateway = Gateway(self, self.gateway_address, proxies)
            await self.gateway.start()
            log.info("HTTP gateway on http://%s/v1", self.gateway.address)
        if self.workers_address:
            from agenthost.host.access.worker_pki import HostCA

            ca = await asyncio.to_thread(HostCA, self.data_dir)
            self.workers = WorkerHub(
                ca=ca,
                store=WorkerStore(self.db),
                address=self.workers_address,
                enrol_address=self.workers_enrol_address,
            )
            # The run API for workers' runners: the same servicer, stores, caps and audit as api.sock's, knowing
            # each call's worker by its certificate (a run is reachable only from the worker it was placed on).
            self.workers.add_handlers(run_api_handlers(self._run_api_servicer(worker_of=worker_caller)))
            self.workers.local_plugins = lambda: {
                p.plugin_id: (p.version, json.loads(p.manifests_json)) for p in self.registry.plugins()
            }
            self.runs.workers = self.workers
            await self.workers.start()
        (self.data_dir / "host.json").write_text(
            json.dumps({"pid": os.getpid(), "admin": self.admin_address, "api": self.api_address, "version": VERSION})
        )

    def _run_api_servicer(self, worker_of: Callable[[grpc.aio.ServicerContext], str] | None = None) -> RunAPIServicer:
        return RunAPIServicer(
            self.grants,
            self.run_store,
            self.conversations,
            self.artifacts,
            self.state,
            self.audit,
            observer=self.observer,
            knowledge=self.knowledge,
            approvals=self.runs.approvals,
            children=self.runs.children,
            worker_of=worker_of,
        )

    async def stop(self) -> None:
        """Graceful: health NOT_SERVING, runs interrupted and awaited, plugins shut down, servers, then the DB."""
        if self._lock_fd is None:
            return
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        await self.runs.shutdown()
        if self.gateway is not None:  # after the runs: open streams end with their runs' outcome
            await self.gateway.stop()
        for task in list(self._background):
            task.cancel()
        if self.workers is not None:
            await self.workers.stop()
        await self.supervisor.stop_all()
        if self.plugin_sockets is not None:
            await self.plugin_sockets.close_all()
        await asyncio.to_thread(self.resource_walls.close)
        for server in self._servers:
            await server.stop(grace=1.0)
        self._servers.clear()
        self.audit.flush()
        await self.db.close()
        await self._stop_observing()
        with contextlib.suppress(OSError):
            (self.data_dir / "host.json").unlink()
        self._release_lock()

    async def __aenter__(self) -> Host:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ---- plugins ----

    async def _register_builtin(self) -> None:
        existing = {p.plugin_id: p for p in self.registry.plugins()}
        current = existing.get(BUILTIN_PLUGIN)
        await self.registry.put_plugin(
            PluginRecord(
                plugin_id=BUILTIN_PLUGIN,
                distribution="agenthost",
                version=VERSION,
                source="built-in",
                builtin=True,
                enabled=current.enabled if current else True,
                python=sys.executable,
                manifests_json=current.manifests_json if current else "[]",
                description="agenthost's built-in runners",
            )
        )

    @property
    def admin_token(self) -> str:
        return self.credentials.admin_token

    def _spec(self, plugin: PluginRecord) -> PluginSpec:
        return PluginSpec(
            plugin.plugin_id,
            plugin.distribution,
            plugin.python,
            plugin.builtin,
            plugin.network,
            paths=functools.partial(self._bound_paths, plugin.plugin_id),
        )

    def _named_paths(self, binding: hpb.Binding) -> list[NamedPath]:
        manifest = self.runs.manifest_for(binding.runner_id)
        return binding_paths.named_paths(manifest.config_schema, json.loads(binding.config_json or "{}"))

    def _path_problems(self, named: list[NamedPath]) -> list[str]:
        return binding_paths.problems(named, data_dir=self.data_dir, private=[self.runtime_dir])

    def binding_path_problems(self, runner_id: str, config: dict[str, Any]) -> list[str]:
        """Why the host would refuse the host paths this config names (the console asks before saving)."""
        schema = self.runs.manifest_for(runner_id).config_schema
        return self._path_problems(binding_paths.named_paths(schema, config))

    def _bound_paths(self, plugin_id: str) -> list[NamedPath]:
        """The host paths a plugin's sandbox shows: those its bindings name that still pass the bind-time checks
        (a path removed, or swapped for a symlink, since is left out and the runner says so when a run needs it)."""
        bound = []
        for binding in self.registry.plugin_bindings(plugin_id):
            try:
                named = self._named_paths(binding)
            except (errors.AgentHostError, ValueError):
                continue  # a runner this plugin no longer describes
            for n in named:
                refused = self._path_problems([n])
                if refused:
                    log.warning("binding %s: not shown to %s: %s", binding.binding_id, plugin_id, refused[0])
                else:
                    bound.append(n)
        return bound

    async def _show_paths(self, binding: hpb.Binding) -> None:
        """Restarts the binding's plugin when its sandbox does not show a path the binding names yet: mounts are
        made when a sandbox starts. Runs in flight there end as runner_crashed (the same as a plugin restart)."""
        plugin_id, _ = parse_runner_id(binding.runner_id)
        pp = self.supervisor.processes.get(plugin_id)
        wanted = {(n.path, n.mode) for n in self._named_paths(binding) if os.path.isabs(n.path)}
        if (
            pp is None
            or pp.proc is None
            or pp.state != "ready"
            or wanted <= pp.bound_paths
            or not self.supervisor.sandboxed
        ):
            return
        log.info("restarting %s so its sandbox shows %s", plugin_id, sorted(p for p, _ in wanted - pp.bound_paths))
        await self.supervisor.stop(plugin_id)
        try:
            await self.supervisor.start(plugin_id)
        except PluginStartError as exc:
            raise errors.FailedPrecondition(
                f"the binding is saved, but {plugin_id} did not restart to show its paths: {exc}"
            ) from None

    def _supervise(self, plugin: PluginRecord) -> None:
        """Starts a plugin in the background at host start; a failure is kept as the plugin's last_error."""
        pp = self.supervisor.add(self._spec(plugin))
        try:
            self.check_walls(plugin)
        except errors.FailedPrecondition as exc:
            pp.last_error = exc.message
            log.error("%s", pp.last_error)
            return
        task = asyncio.create_task(self._start_quietly(plugin.plugin_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def start_in_background(self, plugin_id: str) -> None:
        """Starts a supervised process without waiting; a failure is kept as its last_error."""
        task = asyncio.create_task(self._start_quietly(plugin_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_quietly(self, plugin_id: str) -> None:
        try:
            await self.supervisor.start(plugin_id)
        except PluginStartError as exc:
            log.warning("plugin %s did not start: %s", plugin_id, exc)

    async def _record_manifests(self, plugin_id: str, manifests: dict[str, RunnerManifest]) -> None:
        raw = json.dumps([m.model_dump(mode="json") for m in manifests.values()])
        plugin = self.registry.plugin(plugin_id)
        if plugin.manifests_json != raw:
            await self.registry.put_plugin(PluginRecord(**{**plugin.__dict__, "manifests_json": raw}))

    def plugin_infos(self) -> list[hpb.PluginInfo]:
        infos = []
        for plugin in self.registry.plugins():
            pp = self.supervisor.processes.get(plugin.plugin_id)
            info = hpb.PluginInfo(
                plugin_id=plugin.plugin_id,
                distribution=plugin.distribution,
                version=plugin.version,
                source=plugin.source,
                enabled=plugin.enabled,
                builtin=plugin.builtin,
                state=pp.state if pp else "stopped",
                last_error=pp.last_error if pp else "",
                pid=pp.proc.pid if pp and pp.proc and pp.proc.returncode is None else 0,
                restarts=pp.restarts if pp else 0,
                description=plugin.description,
            )
            for raw in json.loads(plugin.manifests_json):
                info.runners.add(
                    runner_id=f"{plugin.plugin_id}/{raw['name']}",
                    plugin_id=plugin.plugin_id,
                    name=raw["name"],
                    description=raw.get("description", ""),
                    manifest_json=json.dumps(raw),
                )
            infos.append(info)
        return infos

    def _info(self, plugin_id: str) -> hpb.PluginInfo:
        for info in self.plugin_infos():
            if info.plugin_id == plugin_id:
                return info
        raise errors.NotFound(f"no plugin {plugin_id!r}")

    async def install_plugin(
        self, source: str, *, offline: bool = False, allow_network: bool = False, require_hashes: bool = False
    ) -> hpb.PluginInfo:
        if self.sandbox_status.startswith("off"):
            raise errors.FailedPrecondition(
                f"refusing to install third-party code without a sandbox ({self.sandbox_status}); install "
                "bubblewrap, or restart the host with --unsafe-no-sandbox"
            )
        # One group for the whole install, capped like a plugin process; removing it kills whatever a build script
        # left running.
        try:
            group = self.resource_walls.new_group("install")
        except OSError as exc:
            raise errors.FailedPrecondition(f"cannot make the install's cgroup: {exc}") from None
        try:
            installed = await installer.install(
                source,
                self.data_dir / "plugins",
                offline=offline,
                sandboxed=self.sandbox_status == "on",
                require_hashes=require_hashes,
                contain=lambda argv: ResourceWalls.command(argv, group),
            )
        finally:
            if group is not None:
                await asyncio.to_thread(group.remove)
        if installed.plugin_id in self.supervisor.processes:
            await self.supervisor.stop(installed.plugin_id)
        record = PluginRecord(
            plugin_id=installed.plugin_id,
            distribution=installed.distribution,
            version=installed.version,
            source=installed.source,
            builtin=False,
            enabled=True,
            python=installed.python,
            manifests_json=json.dumps([m.model_dump(mode="json") for m in installed.manifests]),
            description=installed.description,
            network=allow_network
            and (
                any(m.permissions.network for m in installed.manifests)
                or any(c.permissions.network for c in installed.channels)
            ),
        )
        await self.registry.put_plugin(record)
        self.observer.plugin_installed(record.plugin_id, record.version, record.source)
        if not installed.manifests:
            return self._info(
                record.plugin_id
            )  # channel adapters only: they run per channel (agenthost.host.processes.channels)
        self.supervisor.add(self._spec(record))
        try:
            await self.supervisor.start(record.plugin_id)
        except PluginStartError as exc:
            raise errors.FailedPrecondition(f"{record.plugin_id} installed but did not start: {exc}") from None
        return self._info(record.plugin_id)

    async def remove_plugin(self, plugin_id: str) -> None:
        plugin = self.registry.plugin(plugin_id)
        if plugin.builtin:
            raise errors.FailedPrecondition("built-in plugins cannot be removed; disable them instead")
        users = self.channels.using(plugin_id)
        if users:
            raise errors.FailedPrecondition(f"channels {users} use {plugin_id}; remove them first")
        await self.supervisor.stop(plugin_id)
        self.supervisor.processes.pop(plugin_id, None)
        await self.registry.delete_plugin(plugin_id)
        installer.remove(self.data_dir / "plugins", plugin_id)
        self.observer.plugin_removed(plugin_id)

    async def set_plugin_enabled(self, plugin_id: str, enabled: bool) -> hpb.PluginInfo:
        plugin = self.registry.plugin(plugin_id)
        await self.registry.set_plugin_enabled(plugin_id, enabled)
        if enabled and (plugin.builtin or plugin.manifests_json != "[]"):
            self.check_walls(plugin)
            self.supervisor.add(self._spec(plugin))
            try:
                await self.supervisor.start(plugin_id)
            except PluginStartError as exc:
                raise errors.FailedPrecondition(f"{plugin_id} is enabled but did not start: {exc}") from None
        else:
            await self.supervisor.stop(plugin_id)
        return self._info(plugin_id)

    async def create_binding(self, bot_ref: str, binding: hpb.Binding) -> hpb.Binding:
        bot = self.registry.bot(bot_ref)
        binding_config.validate_binding(binding)
        binding.bot_id = bot.bot_id
        await self._check_binding_config(binding)
        created = await self.registry.create_binding(binding)
        await self._show_paths(created)
        return created

    async def _check_binding_config(self, binding: hpb.Binding) -> None:
        if binding.pool and self.workers is None:  # every run would fail runner_unavailable: say so at bind time
            raise errors.FailedPrecondition(
                f"the binding runs on workers in pool {binding.pool!r}, but this host does not listen for workers;"
                " restart it with `agenthost serve --workers 0.0.0.0:7443`, or bind without --pool"
            )
        plugin_id, _ = parse_runner_id(binding.runner_id)
        plugin = self.registry.find_plugin(plugin_id)
        pp = self.supervisor.processes.get(plugin_id)
        # A runner only workers offer (plugin None) is checked against the manifest they offered; its runner's own
        # rules are checked on the worker when a run starts.
        if plugin is not None and (plugin.manifests_json == "[]" or (pp is not None and pp.state == "starting")):
            # A plugin whose first start has not described it yet, or that is starting: its runner checks the config.
            with contextlib.suppress(PluginStartError):
                await self.supervisor.wait_ready(plugin_id, self.policy.start_timeout)
        manifest = self.runs.manifest_for(binding.runner_id)
        # A worker's offer is the untrusted side's word: what the operator binds now is what every run is held to.
        binding.manifest_json = manifest.model_dump_json() if plugin is None else ""
        # Host paths the binding names: checked here, by the trusted side, before any runner sees them.
        paths = self._path_problems(self._named_paths(binding))
        await binding_config.check(
            self.supervisor, binding.runner_id, manifest.config_schema, binding.config_json, host_problems=paths
        )

    async def update_binding(self, request: hpb.UpdateBindingRequest) -> hpb.Binding:
        """Changes a binding in place; the result passes the same checks as a new binding."""
        binding = self.registry.binding(request.binding_id)
        if request.config_patch_json:
            config = json.loads(binding.config_json or "{}")
            binding.config_json = json.dumps(binding_config.merge_patch(config, request.config_patch_json))
        if request.HasField("priority"):
            binding.priority = request.priority
        if request.HasField("timeout_seconds"):
            binding.timeout_seconds = request.timeout_seconds
        if request.HasField("apis"):
            binding.resource_policy.ClearField("apis")
            binding.resource_policy.apis.extend(request.apis.values)
        if request.HasField("keys"):
            binding.resource_policy.ClearField("keys")
            binding.resource_policy.keys.extend(request.keys.values)
        binding_config.validate_binding(binding)
        await self._check_binding_config(binding)
        updated = await self.registry.update_binding(binding)
        await self._show_paths(updated)
        return updated

    def status(self) -> hpb.HostStatus:
        """Answered while the database is down too: it says so (and lists no plugins, which live there)."""
        try:
            plugins = self.plugin_infos()
            database = self.db.description
        except DatabaseDown as exc:
            plugins = []
            database = self.db.description if self.db.down else f"{self.db.description} UNREACHABLE: {exc.message}"
        return hpb.HostStatus(
            version=VERSION,
            data_dir=str(self.data_dir),
            pid=os.getpid(),
            started_at=self.started_at,
            plugins=plugins,
            sandbox=self.sandbox_status,
            runs_in_flight=self.runs.in_flight(),
            resource_limits=self._resource_limits_status(),
            database=database,
            kb_vectors=pgvector.PATH_IN_DATABASE if self.db.vectors_in_db else pgvector.PATH_IN_HOST,
        )

    def _resource_limits_status(self) -> hpb.ResourceLimits:
        walls, caps = self.resource_walls, Caps.current()
        status = hpb.ResourceLimits(on=walls.on, mechanism=walls.mechanism, open_files_max=caps.open_files_max)
        if walls.on:
            status.memory_max_bytes, status.pids_max = caps.memory_max_bytes, caps.pids_max
        else:
            status.reason = f"{walls.reason}; to turn them on, {ENABLE_HINT}"
        return status
