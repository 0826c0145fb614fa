"""The worker process's side (`agenthost worker --host HOST:PORT`): enrolment with a join token, then one
long-lived mutual-TLS channel to the host.

Files, in the worker's data dir under `worker/` (0700, each 0600): worker.key (made here; it never leaves the
machine), worker.crt (signed by the host's CA at enrolment), ca.crt (the host's CA: the only authority this worker
trusts for the host), worker.json (host addresses, name, pool).

Renewal. The worker renews its certificate over its mTLS connection (`WorkerHub.Renew`) at 2/3 of its lifetime, or
at once when the host says `rotate`: a new key made here, a CSR the host signs in the name it has on record. The new
key and certificate are written beside the old (`.new`) and moved into place, key first; a worker stopped between
the two moves finishes them at its next start. It then connects again with the new certificate, and the host moves
its runs to that connection; runs already streaming on the old one finish there (the old certificate is accepted
until it expires).

Several host addresses (`--host A --host B`, or `A,B`): an active host and its standbys (docs/operating/standby.md),
which share the CA. A standby listens on no port until it takes over, so the worker dials the addresses in turn
until one answers, and after losing a host goes round them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import ssl
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agenthost.host import limits
from agenthost.host.access.grants import hash_secret
from agenthost.host.access.private_files import make_private_dir, read_private, write_private
from agenthost.host.access.worker_pki import (
    ENROL_SERVER_NAME,
    HUB_SERVER_NAME,
    JoinToken,
    key_pem,
    make_csr,
    new_key,
    pin_of,
    renew_at,
    validity,
)
from agenthost.host.processes.plugin_sockets import PluginSockets, run_api_server
from agenthost.host.processes.supervisor import PluginSpec, PluginStartError, Supervisor
from agenthost.host.store.registry import Registry
from agenthost.host.workers.hub import split_address
from agenthost.host.workers.mux import CallFailed, Multiplexer
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, runner_pb2
from agenthost.protos import run_api_pb2 as api_pb
from agenthost.protos import worker_pb2 as wpb
from agenthost.protos.wire import CHANNEL_OPTIONS, VERSION

BUILTIN_PLUGIN = "agenthost"

log = logging.getLogger(__name__)

ENROL_TIMEOUT = 30.0


class WorkerError(RuntimeError):
    """What stops a worker, said so that its operator knows what to do."""


def host_addresses(hosts: str | list[str]) -> list[str]:
    """`--host A --host B` or `--host A,B` (or worker.json's "A,B"): the addresses in order, each HOST:PORT."""
    items = [hosts] if isinstance(hosts, str) else hosts
    out = [a.strip() for item in items for a in item.split(",") if a.strip()]
    if not out:
        raise WorkerError("--host needs at least one HOST:PORT (the host's workers port)")
    for address in out:
        try:
            split_address(address)
        except ValueError as exc:
            raise WorkerError(f"--host: {exc}") from None
    return out


@dataclass(frozen=True)
class Identity:
    host: str  # the host's workers address, or several comma-separated: an active host and its standbys
    name: str
    pool: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    @property
    def addresses(self) -> list[str]:
        return host_addresses(self.host)

    def channel(self, address: str | None = None) -> grpc.aio.Channel:
        """The one channel to a host's workers port (the first address unless named). The host is checked against
        its CA and the name its certificate carries, not the address dialled (NAT, load balancers, standbys)."""
        return grpc.aio.secure_channel(
            address or self.addresses[0],
            self.credentials(),
            options=[
                *CHANNEL_OPTIONS,
                ("grpc.ssl_target_name_override", HUB_SERVER_NAME),
                ("grpc.keepalive_time_ms", 5000),
                ("grpc.keepalive_timeout_ms", 5000),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )


def identity_dir(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return make_private_dir(data_dir / "worker")


def load_identity(data_dir: Path) -> Identity | None:
    d = data_dir / "worker"
    _finish_renewal(d)
    try:
        doc = json.loads(read_private(d / "worker.json"))
        return Identity(
            host=doc["host"],
            name=doc["name"],
            pool=doc["pool"],
            key_pem=read_private(d / "worker.key"),
            cert_pem=read_private(d / "worker.crt"),
            ca_pem=read_private(d / "ca.crt"),
        )
    except FileNotFoundError:
        return None


def _finish_renewal(d: Path) -> None:
    """Completes a renewal a stop interrupted: a renewed certificate on disk means its key is too (written first),
    so both move into place; a new key without its certificate is a renewal that never got an answer."""
    key_new, cert_new = d / "worker.key.new", d / "worker.crt.new"
    if cert_new.exists():
        if key_new.exists():
            os.replace(key_new, d / "worker.key")
        os.replace(cert_new, d / "worker.crt")
    else:
        key_new.unlink(missing_ok=True)


def save_renewal(data_dir: Path, key: bytes, cert: bytes, ca: bytes) -> None:
    d = identity_dir(data_dir)
    write_private(d / "worker.key.new", key)
    write_private(d / "worker.crt.new", cert)
    write_private(d / "ca.crt", ca)
    _finish_renewal(d)


def _fetch_enrol_certificate(host: str, port: int) -> str:
    # No verification here on purpose: the certificate is checked against the token's pin right after.
    return ssl.get_server_certificate((host, port), timeout=10)


async def enrol(data_dir: Path, host: str, join_token: str, name: str) -> Identity:
    """Presents the join token once, with a CSR for a key made here, and keeps what the host signs. Raises
    WorkerError saying what went wrong (a host that is not the token's, a token used or expired, ...)."""
    try:
        token = JoinToken.parse(join_token)
    except errors.AgentHostError as exc:
        raise WorkerError(exc.message) from None
    # The token names the enrolment port; of several host addresses (a standby listens on none), the first that
    # answers there is the active host.
    unreachable = []
    for address in host_addresses(host):
        hostname, _ = split_address(address)
        try:
            pem = await asyncio.to_thread(_fetch_enrol_certificate, hostname, token.enrol_port)
            break
        except (OSError, ssl.SSLError) as exc:
            unreachable.append(f"{hostname}:{token.enrol_port} ({exc})")
    else:
        raise WorkerError(
            f"cannot reach the host's enrolment port: {'; '.join(unreachable)}; is the host serving with --workers,"
            " and is that port open to this machine?"
        )
    if pin_of(pem.encode()) != token.pin:
        raise WorkerError(
            f"the server at {hostname}:{token.enrol_port} is not the host that made this join token (its"
            " certificate does not match the token's pin); refusing to enrol"
        )
    key = new_key()
    channel = grpc.aio.secure_channel(
        f"{hostname}:{token.enrol_port}",
        grpc.ssl_channel_credentials(root_certificates=pem.encode()),
        options=[*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", ENROL_SERVER_NAME)],
    )
    try:
        async with channel:
            call = channel.unary_unary(
                "/agenthost.v1.WorkerEnrolment/Enrol",
                request_serializer=wpb.EnrolRequest.SerializeToString,
                response_deserializer=wpb.EnrolResponse.FromString,
            )
            reply: wpb.EnrolResponse = await call(
                wpb.EnrolRequest(join_token=join_token.strip(), name=name, csr_pem=make_csr(key, name)),
                timeout=ENROL_TIMEOUT,
            )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise WorkerError(
                "the host's enrolment port is busy (more enrolments at once than it takes, or someone flooding it);"
                " the join token was not used: try again shortly"
            ) from None
        raise WorkerError(f"the host refused enrolment: {exc.code().name}: {exc.details()}") from None
    d = identity_dir(data_dir)
    write_private(d / "worker.key", key_pem(key))
    write_private(d / "worker.crt", reply.certificate_pem)
    write_private(d / "ca.crt", reply.ca_pem)
    doc = {"host": host, "name": reply.name, "pool": reply.pool}
    write_private(d / "worker.json", json.dumps(doc).encode())
    return Identity(host, reply.name, reply.pool, key_pem(key), reply.certificate_pem, reply.ca_pem)


class Cut(grpc.RpcError):
    """The host ended this worker's session, in its words (WorkerDown.cut): handled as the status it names."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self._code = getattr(grpc.StatusCode, code, grpc.StatusCode.UNAVAILABLE)
        self._reason = reason

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._reason


def _handshake_failed(details: str) -> bool:
    # Under TLS 1.3 a client whose certificate the server refuses finishes its own side of the handshake first, and
    # then sees the connection closed: "Socket closed" is how that refusal reaches it (a host that is down refuses
    # the TCP connection instead).
    lowered = details.lower()
    return any(word in lowered for word in ("handshake", "ssl", "tls", "socket closed"))


def explain(exc: grpc.RpcError) -> str:
    """A refused connection, in words a worker's operator can act on."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"the host refused this worker: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and _handshake_failed(details):
        return (
            "the TLS handshake with the host failed: the host does not accept this worker's certificate (not"
            " signed by its CA), or the address is not the host's workers port; enrol again with a new join"
            f" token ({details})"
        )
    return f"{code.name}: {details}"


HEARTBEAT_SECONDS = 2.0
BACKOFF_BASE = 0.5
BACKOFF_MAX = 30.0
RUNNER_READY_SECONDS = 30.0
# Batches of one run between its local runner and the host: past this the runner is held back by flow control.
RUN_UP_QUEUE = 16
_RUN_METHOD = "/agenthost.v1.Runner/Run"
_API_SERVICE = "agenthost.v1.AgentRunAPIProxy"


@dataclass
class LocalRun:
    run_id: str
    plugin_id: str
    token_hashes: tuple[str, str]  # (run token, tool token)
    task: asyncio.Task[None] | None = None
    channel: grpc.aio.Channel | None = None  # the connection its Run stream is on


# How long after a failed renewal the worker tries again (at most; sooner when the certificate expires sooner).
RENEW_RETRY_SECONDS = 60.0


class Worker:
    """One worker process: its identity, its supervised runner plugins, the run API socket its runners reach, and
    its connection to the host (one channel: the control stream, one Run stream per run, the run API calls)."""

    def __init__(
        self,
        identity: Identity,
        supervisor: Supervisor | None = None,
        *,
        capacity: int = 4,
        data_dir: Path | None = None,
    ) -> None:
        self.identity = identity
        self.data_dir = data_dir  # where a renewed certificate is kept (None: in memory only)
        # Set by the host's `rotate`: renew now. `renewed` is set once a renewal is kept: connect again with it.
        self.rotate_now = asyncio.Event()
        self.renewed = asyncio.Event()
        self.renewals = 0
        self._retiring: set[asyncio.Task[None]] = set()
        self.supervisor = supervisor
        self.capacity = capacity
        self.connected = asyncio.Event()
        self.welcomed = asyncio.Event()  # set at each welcome (a renewal waits on it to move its runs)
        # Welcomes received, ever: how `serve` knows an attempt got through (`connected` is already cleared when
        # the session that set it has ended).
        self.welcomes = 0
        self.draining = False
        self.offers: list[wpb.WorkerOffer] = []
        self.runs: dict[str, LocalRun] = {}
        self._by_token: dict[str, LocalRun] = {}
        self.channel: grpc.aio.Channel | None = None
        self._calls: Multiplexer | None = None  # the unary calls stream on `channel`
        self.address = ""  # the host address of the current (or last) connection

    def hello(self, renewed: bool = False) -> wpb.WorkerUp:
        return wpb.WorkerUp(
            hello=wpb.WorkerHello(
                offers=self.offers,
                capacity=self.capacity,
                held_runs=list(self.runs),
                version=VERSION,
                renewed=renewed,
            )
        )

    def in_flight(self) -> int:
        return len(self.runs)

    # ---- plugins ----

    async def start_plugins(self, data_dir: Path | None = None, *, no_sandbox: str = "") -> None:
        """Starts the runner plugins this machine serves and makes the offers: the built-in plugin, and the enabled
        runner plugins installed in this worker's data dir (`agenthost plugins install … --data-dir D` on this
        machine), Python or not, each sandboxed as the host sandboxes its own. One that does not start is logged
        and left out of the offers. `no_sandbox` (why none works here, when the user did not pass
        --unsafe-no-sandbox): third-party plugins are not started at all, as on the host."""
        assert self.supervisor is not None
        specs = [(PluginSpec(BUILTIN_PLUGIN, "agenthost", sys.executable, builtin=True), VERSION)]
        if data_dir is not None:
            for record in Registry.installed(data_dir / "agenthost.db"):
                if record.builtin or not record.enabled or record.manifests_json in ("", "[]"):
                    continue  # channel adapters only, or turned off
                if no_sandbox:
                    log.error(
                        "refusing to start plugin %s without a sandbox (%s): not offered; install bubblewrap, or"
                        " restart the worker with --unsafe-no-sandbox to run plugins without walls",
                        record.plugin_id,
                        no_sandbox,
                    )
                    continue
                spec = PluginSpec(record.plugin_id, record.distribution, record.python, network=record.network)
                specs.append((spec, record.version))
        self.offers = []
        for spec, version in specs:
            self.supervisor.add(spec)
            try:
                pp = await self.supervisor.start(spec.plugin_id)
            except PluginStartError as exc:
                if spec.builtin:
                    raise
                log.error("plugin %s did not start: not offered (%s)", spec.plugin_id, exc)
                continue
            manifests = [json.dumps(m.model_dump(mode="json")) for m in pp.manifests.values()]
            self.offers.append(wpb.WorkerOffer(plugin_id=spec.plugin_id, version=version, manifests_json=manifests))

    # ---- the control stream ----

    async def session(self, channel: grpc.aio.Channel, renewed: bool = False) -> None:
        """One control stream, until it breaks: hello, then heartbeats; assignments are served as they come.
        `renewed`: this worker's earlier session is live on its old certificate, and its runs move here."""
        outbox: asyncio.Queue[wpb.WorkerUp] = asyncio.Queue()
        outbox.put_nowait(self.hello(renewed))

        async def up() -> AsyncIterator[wpb.WorkerUp]:
            while True:
                yield await outbox.get()

        async def beat() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_SECONDS)
                outbox.put_nowait(wpb.WorkerUp(heartbeat=wpb.WorkerHeartbeat(in_flight=self.in_flight())))

        connect = channel.stream_stream(
            "/agenthost.v1.WorkerHub/Connect",
            request_serializer=wpb.WorkerUp.SerializeToString,
            response_deserializer=wpb.WorkerDown.FromString,
        )
        call = connect(up())
        beating = asyncio.create_task(beat())
        try:
            async for down in call:
                self.on_message(channel, down)
        finally:
            beating.cancel()
            call.cancel()
            if self.channel is channel:  # not a session its renewal has replaced
                self.connected.clear()

    def on_message(self, channel: grpc.aio.Channel, down: wpb.WorkerDown) -> None:
        kind = down.WhichOneof("kind")
        if kind == "welcome":
            log.info("connected to %s as %s", self.address, down.welcome)
            self.welcomes += 1
            self.connected.set()
            self.welcomed.set()
        elif kind == "drain":
            self.draining = True
            log.info("the host drains this worker: no new runs")
        elif kind == "rotate":
            log.info("the host asks this worker to renew its certificate now")
            self.rotate_now.set()
        elif kind == "cut":  # acted on as the status it precedes, which may reach this worker as a bare INTERNAL
            raise Cut(down.cut.code, down.cut.reason)
        elif kind == "assign":
            run_id = down.assign.run_id
            if run_id not in self.runs:
                run = LocalRun(run_id, "", ("", ""), channel=channel)
                self.runs[run_id] = run
                run.task = asyncio.create_task(self._serve_run(channel, run), name=f"run:{run_id}")
        elif kind == "drop":
            run = self.runs.get(down.drop.run_id)
            if run is not None and run.task is not None:
                log.info("run %s was ended by the host while this worker was away: dropped", run.run_id)
                run.task.cancel()

    # ---- runs ----

    async def _serve_run(self, channel: grpc.aio.Channel, run: LocalRun) -> None:
        """Takes an assigned run: its RunRequest comes down the Run stream, its local runner's batches go up it as
        they came. The host ending the stream (the run ended or was cancelled there) cancels the local call."""
        up: asyncio.Queue[bytes | None] = asyncio.Queue(RUN_UP_QUEUE)

        async def ups() -> AsyncIterator[wpb.WorkerRunUp]:
            yield wpb.WorkerRunUp(run_id=run.run_id)
            while (item := await up.get()) is not None:
                yield wpb.WorkerRunUp(batch=item)
            yield wpb.WorkerRunUp(end=True)

        call = channel.stream_stream(
            "/agenthost.v1.WorkerHub/Run",
            request_serializer=wpb.WorkerRunUp.SerializeToString,
            response_deserializer=wpb.WorkerRunDown.FromString,
        )(ups())
        local: Any = None
        try:
            first = await call.read()
            if first is grpc.aio.EOF or first.WhichOneof("kind") != "request":
                return
            request: runner_pb2.RunRequest = first.request
            run.plugin_id = request.context.runtime.plugin_id
            run.token_hashes = (hash_secret(request.run_token), hash_secret(request.tool_token))
            for token_hash in run.token_hashes:
                self._by_token[token_hash] = run
            assert self.supervisor is not None
            try:
                pp = await self.supervisor.wait_ready(run.plugin_id, RUNNER_READY_SECONDS)
            except PluginStartError as exc:
                await up.put(_failed("runner_unavailable", f"on worker {self.identity.name}: {exc}"))
                await up.put(None)
                await call.read()
                return
            assert pp.channel is not None
            remaining = max(0.1, request.context.runtime.deadline_at - time.time())
            local = pp.channel.unary_stream(_RUN_METHOD, request_serializer=runner_pb2.RunRequest.SerializeToString)(
                request, timeout=remaining
            )

            async def pump() -> None:
                try:
                    async for data in local:
                        await up.put(data)  # as the runner sent it: no decoding here
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.CANCELLED:
                        detail = f"on worker {self.identity.name}: {exc.code().name}: {exc.details()}"
                        await up.put(_failed("runner_crashed", detail))
                await up.put(None)

            pumping = asyncio.create_task(pump())
            try:
                # The host answers nothing more: its stream ending means it is done with the run.
                await call.read()
            finally:
                local.cancel()
                pumping.cancel()
        except grpc.RpcError as exc:
            log.info("run %s: the host's stream ended: %s", run.run_id, exc.code().name)
        finally:
            if local is not None:
                local.cancel()
            call.cancel()
            for token_hash in run.token_hashes:
                self._by_token.pop(token_hash, None)
            self.runs.pop(run.run_id, None)

    # ---- the run API, forwarded ----

    def calls(self) -> Multiplexer:
        """The unary run API calls stream on the current channel (a new one after a reconnect or a renewal; the
        old one's calls in flight fail UNAVAILABLE when its channel closes)."""
        channel = self.channel
        if channel is None:
            raise errors.Unavailable("this worker is not connected to its host; try again shortly")
        if self._calls is None or self._calls.channel is not channel:
            self._calls = Multiplexer(channel)
        return self._calls

    def local_run(self, metadata: Any) -> tuple[LocalRun | None, str]:
        """The run whose token a local call presents, checked as the host checks its own plugin processes: a run
        token only with the secret of the plugin process serving the run, a tool token alone."""
        token = secret = None
        for key, value in metadata or ():
            if key == "authorization":
                token = value
            elif key == "x-agenthost-plugin":
                secret = value
        if not isinstance(token, str) or not token.startswith("Bearer "):
            return None, "missing run token (authorization: Bearer <token>)"
        presented = hash_secret(token[7:])
        run = self._by_token.get(presented)
        if run is None:
            return None, "run token is not valid (unknown, forged, or revoked when its run ended)"
        if presented == run.token_hashes[1]:
            return run, ""
        assert self.supervisor is not None
        owner = self.supervisor.registry.plugin_of_secret(secret) if isinstance(secret, str) else None
        if owner != run.plugin_id:
            return None, "this run belongs to another runner process"
        return run, ""

    # ---- certificate renewal ----

    async def renew(self, channel: grpc.aio.Channel) -> None:
        """Renews this worker's certificate over `channel` (authenticated by the current one) with a key made
        here, keeps it (on disk when there is a data dir), and sets `renewed`."""
        key = new_key()
        reply: wpb.RenewResponse = await channel.unary_unary(
            "/agenthost.v1.WorkerHub/Renew",
            request_serializer=wpb.RenewRequest.SerializeToString,
            response_deserializer=wpb.RenewResponse.FromString,
        )(wpb.RenewRequest(csr_pem=make_csr(key, self.identity.name)), timeout=ENROL_TIMEOUT)
        pem = key_pem(key)
        if self.data_dir is not None:
            await asyncio.to_thread(save_renewal, self.data_dir, pem, reply.certificate_pem, reply.ca_pem)
        self.identity = dataclasses.replace(
            self.identity, key_pem=pem, cert_pem=reply.certificate_pem, ca_pem=reply.ca_pem
        )
        self.renewals += 1
        log.info(
            "renewed this worker's certificate; it expires %s",
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(reply.not_after)),
        )
        self.renewed.set()

    async def _renewing(self, channel: grpc.aio.Channel) -> None:
        """While connected over `channel`: renews at 2/3 of the certificate's lifetime or when the host says so;
        a failure is logged and tried again (sooner as expiry nears)."""
        while True:
            wait = renew_at(self.identity.cert_pem) - time.time()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.rotate_now.wait(), wait)
            self.rotate_now.clear()
            try:
                await self.renew(channel)
                return
            except grpc.RpcError as exc:
                left = validity(self.identity.cert_pem)[1] - time.time()
                log.error(
                    "renewing this worker's certificate failed (%s: %s); it expires in %.0fs",
                    exc.code().name,
                    exc.details(),
                    left,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.rotate_now.wait(), min(RENEW_RETRY_SECONDS, max(1.0, left / 10)))

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        """Closes a connection the worker moved off once no run streams on it (its certificate is still accepted
        until it expires, by when the host ends those runs anyway)."""
        tasks = [run.task for run in self.runs.values() if run.channel is channel and run.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close()

    async def serve(self, stop: asyncio.Event) -> None:
        """Stays connected until `stop`: reconnects with jittered exponential backoff (a host restart, a partition),
        going round the host addresses (the next one after each failed or lost connection, so a standby that took
        over is found at once), and raises WorkerError when a host refuses this worker (revoked, a certificate it
        does not accept): hosts sharing a CA and a database refuse alike."""
        addresses = self.identity.addresses
        index = failures = 0
        while not stop.is_set():
            address = self.address = addresses[index]
            welcomes = self.welcomes
            channel = self.channel = self.identity.channel(address)
            try:
                task = asyncio.create_task(self.session(channel))
                while True:
                    renewing = asyncio.create_task(self._renewing(channel))
                    stopping = asyncio.create_task(stop.wait())
                    await asyncio.wait({task, stopping, renewing}, return_when=asyncio.FIRST_COMPLETED)
                    stopping.cancel()
                    if renewing.done() and not renewing.cancelled() and renewing.exception() is not None:
                        log.error("renewing this worker's certificate failed: %r", renewing.exception())
                    if not self.renewed.is_set() or task.done() or stop.is_set():
                        renewing.cancel()
                        break
                    # Renewed: a new connection with the new certificate and a session that takes over this one's
                    # runs; this one is cut by the host once it has, and closed when its run streams are done.
                    self.renewed.clear()
                    old_task, old_channel = task, channel
                    channel = self.channel = self.identity.channel(address)
                    self.welcomed.clear()
                    task = asyncio.create_task(self.session(channel, renewed=True))
                    welcomed = asyncio.create_task(self.welcomed.wait())
                    await asyncio.wait({task, welcomed}, return_when=asyncio.FIRST_COMPLETED)
                    welcomed.cancel()
                    old_task.cancel()
                    await asyncio.gather(old_task, return_exceptions=True)
                    retiring = asyncio.create_task(self._retire(old_channel))
                    self._retiring.add(retiring)
                    retiring.add_done_callback(self._retiring.discard)
                was_connected = self.welcomes > welcomes
                if not task.done():
                    task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    if stop.is_set():
                        return
                except grpc.RpcError as exc:
                    refused = exc.code() == grpc.StatusCode.UNAUTHENTICATED
                    handshake = exc.code() == grpc.StatusCode.UNAVAILABLE and _handshake_failed(exc.details() or "")
                    if refused or (handshake and not self.welcomes):
                        raise WorkerError(explain(exc)) from None
                    if was_connected:  # a host that dies closes the socket: not a refused handshake
                        log.warning(
                            "connection to the host at %s lost: %s: %s", address, exc.code().name, exc.details()
                        )
                    else:
                        log.warning(
                            "the host at %s does not answer (down, or a standby not active yet): %s",
                            address,
                            explain(exc),
                        )
                else:
                    log.warning("the host at %s ended this worker's session", address)
            finally:
                await channel.close()
            failures = 0 if was_connected else failures + 1
            index = (index + 1) % len(addresses)
            # Exponential per round of the addresses, not per address: a standby's turn comes without a wait
            # grown by the dead host's refusals.
            rounds = failures // len(addresses)
            delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** min(rounds, 10)) * random.uniform(0.5, 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


def _failed(code: str, message: str) -> bytes:
    return pb.RunEventBatch(events=[pb.RunEvent(failed=pb.Failed(code=code, message=message))]).SerializeToString()


class _Forward(grpc.GenericRpcHandler):
    """The run API socket of the worker's runners: every AgentRunAPIProxy call, checked against the worker's own
    runs and plugin secrets, goes to the host over the worker's channel as bytes (nothing parsed here), with the
    run's token and nothing else; the host checks it again, and checks that the run is this worker's."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        service = api_pb.DESCRIPTOR.services_by_name["AgentRunAPIProxy"]
        self.shapes = {f"/{_API_SERVICE}/{m.name}": (m.client_streaming, m.server_streaming) for m in service.methods}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        shape = self.shapes.get(details.method)
        if shape is None:
            return None
        method = details.method
        run, refusal = self.worker.local_run(details.invocation_metadata)
        if run is None:
            return grpc.stream_unary_rpc_method_handler(functools.partial(_refuse, refusal))
        metadata = [(k, v) for k, v in details.invocation_metadata or () if k == "authorization"]
        worker = self.worker
        client_streaming, server_streaming = shape
        if not client_streaming and not server_streaming:
            authorization = str(metadata[0][1]) if metadata else ""

            async def uu(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                try:
                    calls = worker.calls()
                    return await calls.call(method, authorization, request, context.time_remaining())
                except errors.AgentHostError as exc:
                    await errors.abort_with(context, exc)
                except CallFailed as exc:
                    if exc.retry_after_ms > 0:
                        context.set_trailing_metadata(((errors.RETRY_AFTER_KEY, str(exc.retry_after_ms)),))
                    await context.abort(exc.code, exc.details)
                raise AssertionError("unreachable: abort raises")

            return grpc.unary_unary_rpc_method_handler(uu)

        def target(context: grpc.aio.ServicerContext, kind: str) -> Any:
            if worker.channel is None:
                raise errors.Unavailable("this worker is not connected to its host; try again shortly")
            remaining = context.time_remaining()
            factory = getattr(worker.channel, kind)(method)
            return functools.partial(factory, metadata=metadata, timeout=remaining)

        if not client_streaming:

            async def us(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
                async for reply in _relay_stream(context, target(context, "unary_stream")(request)):
                    yield reply

            return grpc.unary_stream_rpc_method_handler(us)
        if not server_streaming:

            async def su(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
                return await _relay(context, target(context, "stream_unary")(requests))

            return grpc.stream_unary_rpc_method_handler(su)

        async def ss(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for reply in _relay_stream(context, target(context, "stream_stream")(requests)):
                yield reply

        return grpc.stream_stream_rpc_method_handler(ss)


async def _refuse(message: str, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)


async def _relay(context: grpc.aio.ServicerContext, call: Any) -> bytes:
    try:
        return await call
    except grpc.RpcError as exc:
        await context.abort(exc.code(), exc.details() or "")
        raise


async def _relay_stream(context: grpc.aio.ServicerContext, call: Any) -> AsyncIterator[bytes]:
    try:
        async for reply in call:
            yield reply
    except grpc.RpcError as exc:
        await context.abort(exc.code(), exc.details() or "")


def _runtime_dir(data_dir: Path) -> Path:
    # A unix socket name is at most 108 bytes: a deep data dir gets its sockets under the temp dir.
    candidate = data_dir / "run"
    if len(str(candidate)) < 70:
        return make_private_dir(candidate)
    import hashlib
    import tempfile

    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return make_private_dir(Path(tempfile.gettempdir()) / f"agenthost-worker-{os.getuid()}-{digest}")


@contextlib.asynccontextmanager
async def running(data_dir: Path, identity: Identity, *, capacity: int = 4, unsafe_no_sandbox: bool = False) -> Any:
    """A Worker with its plugins started and its run API socket served, stopped on the way out."""
    from agenthost.host.access.grants import RunRegistry
    from agenthost.host.processes.resource_walls import ResourceWalls
    from agenthost.host.store.db import Database
    from agenthost.plugins import sandbox

    os.umask(0o077)
    sandbox.harden_process()
    reason = sandbox.probe()
    if reason is not None and unsafe_no_sandbox:
        log.error("RUNNING EVERY PLUGIN WITHOUT A SANDBOX (--unsafe-no-sandbox): %s", reason)
    elif reason is not None:
        log.error("no sandbox here, so only the built-in runners will start, unsandboxed: %s", reason)
    runtime = _runtime_dir(data_dir)
    api_address = f"unix:{runtime / 'api.sock'}"
    Path(api_address.removeprefix("unix:")).unlink(missing_ok=True)
    db = Database(identity_dir(data_dir) / "worker.db")
    await db.open()
    walls = ResourceWalls.setup()
    supervisor = Supervisor(
        db=db,
        registry=RunRegistry(),
        runtime_dir=runtime,
        data_dir=data_dir,
        host_address=api_address,
        sandboxed=reason is None,
        walls=walls,
    )
    await supervisor.sweep_orphans()
    worker = Worker(identity, supervisor, capacity=capacity, data_dir=data_dir)

    def forward(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((_Forward(worker),))

    # Each plugin process reaches the run API through a socket and a connection cap of its own, as on the host, so
    # one plugin flooding it cannot starve the worker's other plugins; api.sock is bound into no sandbox.
    supervisor.api_sockets = sockets = PluginSockets(runtime, forward)
    _, connections = limits.listener_caps()
    server = run_api_server(forward, connections)
    server.add_insecure_port(api_address)
    await server.start()
    try:
        await worker.start_plugins(data_dir, no_sandbox="" if unsafe_no_sandbox else (reason or ""))
        yield worker
    finally:
        for run in list(worker.runs.values()):
            if run.task is not None:
                run.task.cancel()
        await supervisor.stop_all()
        await sockets.close_all()
        await server.stop(grace=1.0)
        await asyncio.to_thread(walls.close)
        await db.close()


async def run_worker(args: Any, data_dir: Path) -> int:
    """`agenthost worker`: enrols when given --join, then serves until SIGINT/SIGTERM."""
    import signal
    import socket

    # The CLI set up warnings-only logging for its client commands; a worker is a service and says more.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    try:
        if args.join:
            hosts = ",".join(host_addresses(args.host))
            identity = await enrol(data_dir, hosts, args.join, args.name or socket.gethostname())
            print(f"enrolled as worker {identity.name} in pool {identity.pool}", flush=True)
        else:
            found = load_identity(data_dir)
            if found is None:
                raise WorkerError(
                    f"this worker is not enrolled (nothing in {data_dir / 'worker'}); make a join token on the host"
                    " with `agenthost workers token create` and pass it with --join"
                )
            identity = dataclasses.replace(found, host=",".join(host_addresses(args.host)))
        if args.enrol_only:
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with running(
            data_dir, identity, capacity=args.capacity, unsafe_no_sandbox=args.unsafe_no_sandbox
        ) as worker:
            print(f"worker {identity.name} serving {', '.join(o.plugin_id for o in worker.offers)}", flush=True)
            await worker.serve(stop)
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except PluginStartError as exc:
        print(f"error: the worker's runner plugin did not start: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
