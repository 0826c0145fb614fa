"""The host's side of runner workers: the two TCP listeners (`serve --workers HOST:PORT`), enrolment, the identity
check every worker call passes, certificate renewal, and the live sessions (`workers list`, drain, revoke, rotate).

Ports. The workers port serves WorkerHub (and, for item 2, the run API) under mutual TLS: grpc-core refuses in the
handshake a client with no certificate, with one not signed by the host's CA, or speaking plain TCP, so none of
those ever reaches a handler. The enrolment port (the workers port + 1 unless named) serves WorkerEnrolment with
server-authenticated TLS only: a worker has no certificate yet. It is a second port because a gRPC server either
requires client certificates or does not request them at all; a join token pins its certificate.

Identity. Every call on the workers port goes through `_Guard`, which, before any request message is read, takes
the client certificate from the call's auth context and accepts it only if it has not expired, its serial is one
recorded for the worker its common name names (the current one, or the one its last renewal replaced until that
one expires), and that worker is not revoked.

Renewal. A worker renews its certificate with `Renew` over that authenticated connection (at 2/3 of its lifetime,
or when `workers rotate` tells it to): the host signs a new key's CSR in the name of the certificate the call
presented, then the worker connects again with it and its live session's runs move to the new connection
(`WorkerHello.renewed`). A session whose certificate expires is cut.

Every method is served as a request-streaming one to make the identity check run first (gRPC reads a unary request
before calling its handler; the wire does not differ).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
from cryptography import x509

from agenthost.host import limits
from agenthost.host.access.grants import hash_secret
from agenthost.host.access.worker_pki import (
    WORKER_NAME,
    HostCA,
    JoinToken,
    cert_pem,
    refuse_other_names,
    require_tls13,
    serial_hex,
)
from agenthost.host.ops.logs import RefusalLimiter, log_limited
from agenthost.host.store.workers import WorkerRecord, WorkerStore
from agenthost.host.workers.mux import CALLS_METHOD, serve_calls
from agenthost.plugins.manifest import MAX_RUNNERS_PER_PLUGIN, ManifestError, RunnerManifest
from agenthost.protos import errors, runner_pb2
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import worker_pb2 as wpb
from agenthost.protos.wire import SERVER_OPTIONS

log = logging.getLogger(__name__)

DEFAULT_TOKEN_TTL = 600.0
MAX_TOKEN_TTL = 24 * 3600.0
DEFAULT_POOL = "default"
# A worker heartbeats every HEARTBEAT_SECONDS (agent.py); one silent for LOST_AFTER_SECONDS is taken as gone: its
# session is cut and its runs end `runner_lost`, within LOST_AFTER_SECONDS + WATCH_SECONDS of its last word.
LOST_AFTER_SECONDS = 6.0
WATCH_SECONDS = 1.0
# A worker must open the Run stream of a run it was assigned within this long, or the run ends `runner_lost`.
TAKE_SECONDS = 15.0
# Batches of one run held between the worker's stream and the run's consumer: past this, HTTP/2 flow control holds
# that worker's runner back, and no other run waits on it.
RUN_QUEUE_BATCHES = 16
DEFAULT_CAPACITY = 4
AFFINITY_MAX = 65536
# How long a cut session's control stream waits to hand the worker its in-band reason (WorkerDown.cut) before it
# ends anyway: a worker that reads nothing must not keep the stream.
CUT_WRITE_SECONDS = 5.0


class WorkerLost(Exception):
    """The worker serving a run went away (disconnected, silent past LOST_AFTER_SECONDS, revoked, replaced)."""


@dataclass
class RunSlot:
    """A run placed on a worker: what its Run stream is handed, and what comes back up it."""

    run_id: str
    request: runner_pb2.RunRequest
    batches: asyncio.Queue[bytes | None] = field(default_factory=lambda: asyncio.Queue(RUN_QUEUE_BATCHES))
    opened: bool = False
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the host is done with it (finished, cancelled)
    session: Session | None = None  # the session holding it now (a renewal moves it to the worker's new one)

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass
class Session:
    """A connected worker: its control stream and what it said in its hello."""

    record: WorkerRecord
    peer: str
    offers: list[wpb.WorkerOffer] = field(default_factory=list)
    capacity: int = 0
    in_flight: int = 0
    last_heartbeat: float = 0.0
    # What the control stream sends next; None ends it (and the worker's run streams) with `cut_reason`.
    outbox: asyncio.Queue[wpb.WorkerDown | None] = field(default_factory=asyncio.Queue)
    cut_reason: str = ""
    cut_error: type[errors.AgentHostError] = errors.Unauthenticated
    cut_event: asyncio.Event = field(default_factory=asyncio.Event)
    runs: dict[str, RunSlot] = field(default_factory=dict)
    messages: int = 0  # read off its control stream after the hello
    serial: str = ""  # of the certificate its control stream was opened with
    cert_expires_at: float = 0.0  # of that certificate: past it, the session is cut
    issuer: x509.Name | None = None  # that certificate's CA: a session of a CA rolled out is cut
    # The offers' runners, parsed (and their config schemas checked) once at the hello, not at every placement:
    # a manifest's schema check costs milliseconds, and the offers do not change during a session (`offered_runners`).
    runners: dict[str, RunnerManifest] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.record.name

    def runner_ids(self) -> set[str]:
        return set(self.runners)

    def cut(self, reason: str, error: type[errors.AgentHostError] = errors.Unavailable) -> None:
        """Ends this worker's control stream now with `error` and `reason` (a gRPC handler's task cancelled from
        outside would leave the client's stream open: the status must be sent), and its runs with WorkerLost.
        UNAUTHENTICATED tells the worker it is refused for good (revoked, replaced); UNAVAILABLE to reconnect."""
        self.cut_reason = reason
        self.cut_error = error
        self.cut_event.set()
        self.outbox.put_nowait(None)
        for slot in self.runs.values():
            slot.lose(f"worker {self.name!r}: {reason}")


def _same_plugin(local: tuple[str, list[Any]], offer: wpb.WorkerOffer) -> bool:
    version, manifests = local
    try:
        offered = [json.loads(raw) for raw in offer.manifests_json]
    except ValueError:
        return False
    return offer.version == version and offered == manifests


def _listen(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials, what: str) -> int:
    """The port `server` listens on at `address`; OSError saying which listener when it cannot (grpc raises a bare
    RuntimeError, which `serve` would show as a traceback)."""
    try:
        port = server.add_secure_port(address, creds)
    except RuntimeError:
        port = 0
    if not port:
        raise OSError(f"cannot listen for {what} on {address}: the port is in use, or not an address of this machine")
    return port


def offered_runners(offers: list[wpb.WorkerOffer]) -> dict[str, RunnerManifest]:
    """The runners of a hello's (already capped) offers whose manifests validate, by runner id; CPU-bound (each
    config schema is checked), so WorkerHub runs it off the event loop."""
    out: dict[str, RunnerManifest] = {}
    for offer in offers:
        for raw in offer.manifests_json:
            try:
                manifest = RunnerManifest.parse_json(raw)
            except ManifestError:
                continue
            out.setdefault(f"{offer.plugin_id}/{manifest.name}", manifest)
    return out


class WorkerHub:
    _guard: _Guard  # set by start

    def __init__(self, *, ca: HostCA, store: WorkerStore, address: str, enrol_address: str | None = None) -> None:
        self.ca = ca
        self.store = store
        self.address = address
        self.enrol_address = enrol_address
        self.port = 0
        self.enrol_port = 0
        self.sessions: dict[str, Session] = {}
        # Calls that passed the TLS handshake and reached the guard, by outcome: what the refusal tests read.
        self.calls = {"accepted": 0, "refused": 0}
        # The enrolment port is open to anyone on the network, and a revoked worker still reaches the workers
        # port's guard: their refusals are logged a few a minute per kind, the rest summed up (see `refused`).
        self.refusals = RefusalLimiter()
        self._hellos: set[str] = set()  # workers whose hello is being validated (one at a time each)
        self._servers: list[grpc.aio.Server] = []
        self._serials: dict[bytes, tuple[str, str, float, x509.Name]] = {}
        # Per worker name, its current certificate's serial once a call has presented it (see `_not_replaced`).
        self._in_use: dict[str, str] = {}
        self._writes: set[asyncio.Task[Any]] = set()  # `mark_in_use` writes under way
        # Per worker name, set when its next renewal is recorded (what `workers rotate` waits on).
        self._renewed: dict[str, asyncio.Event] = {}
        self._renewals: dict[str, list[float]] = {}  # per worker name, when its recent renewals were asked
        self._extra: dict[str, grpc.RpcMethodHandler] = {}
        self._calls_streams: dict[str, int] = {}  # per worker name, its Calls streams open (WORKER_CALLS_STREAMS)
        # Set (and replaced) whenever a worker may have room for another run: one connected, a run ended on one.
        self._room = asyncio.Event()
        self.grace_until = 0.0  # set by start (limits.WORKER_RECONNECT_GRACE_SECONDS)
        self._watch: asyncio.Task[None] | None = None
        # The plugins the host runs itself, by id: (version, manifests). A worker's offer under one of those ids is
        # taken only when it is that same plugin (see _accepted).
        self.local_plugins: Callable[[], dict[str, tuple[str, list[Any]]]] = dict
        # The worker that served each conversation last (bot, conversation): its next runs prefer it, since it
        # holds the conversation's working context (a harness's session, a warm process). Bounded, oldest out.
        self._affinity: dict[tuple[str, str], str] = {}

    def add_handlers(self, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        """More methods for the workers port (the run API, from the composition root), behind the same guard;
        before `start`. A handler knows its caller by `caller(context)`."""
        self._extra.update(handlers)

    # ---- listeners ----

    async def start(self) -> None:
        # Until then a run a previous host left queued waits for a worker offering its runner (wait_place's grace).
        self.grace_until = time.monotonic() + limits.WORKER_RECONNECT_GRACE_SECONDS
        bind, port = split_address(self.address)
        server = grpc.aio.server(options=[*SERVER_OPTIONS, ("grpc.http2.bdp_probe", 0)])
        self._guard = _Guard(self, self._handlers())
        server.add_generic_rpc_handlers((self._guard,))
        # Dynamic: a CA roll changes what new handshakes present and trust without a restart (connections made
        # before are checked per call by `identify`).
        served = self.ca.generation

        def tls_config() -> Any:
            nonlocal served
            served = self.ca.generation
            return grpc.ssl_server_certificate_configuration(
                [(self.ca.hub_key_pem, self.ca.hub_cert_pem)], root_certificates=self.ca.trust_pem
            )

        creds = grpc.dynamic_ssl_server_credentials(
            tls_config(),
            lambda: tls_config() if self.ca.generation != served else None,
            require_client_authentication=True,
        )
        self.port = _listen(server, f"{bind}:{port}", creds, "workers")
        if self.enrol_address:
            enrol_bind, enrol_port = split_address(self.enrol_address)
        else:
            enrol_bind, enrol_port = bind, (port + 1 if port else 0)
        enrol = grpc.aio.server(options=SERVER_OPTIONS, maximum_concurrent_rpcs=limits.WORKER_ENROL_MAX_CALLS)
        enrol.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "agenthost.v1.WorkerEnrolment",
                    {
                        # Request-streaming on the server (the wire is unary): the TLS version is checked before the
                        # token is read, and the read is given a deadline.
                        "Enrol": grpc.stream_unary_rpc_method_handler(
                            self._enrol_call,
                            request_deserializer=wpb.EnrolRequest.FromString,
                            response_serializer=wpb.EnrolResponse.SerializeToString,
                        )
                    },
                ),
            )
        )
        self.enrol_port = _listen(
            enrol,
            f"{enrol_bind}:{enrol_port}",
            grpc.ssl_server_credentials([(self.ca.enrol_key_pem, self.ca.enrol_cert_pem)]),
            "worker enrolment",
        )
        for s in (server, enrol):
            await s.start()
            self._servers.append(s)
        self._watch = asyncio.create_task(self._watch_heartbeats(), name="workers:heartbeats")
        log.info("listening for workers on %s:%d (enrolment on port %d)", bind, self.port, self.enrol_port)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for session in list(self.sessions.values()):
            session.cut("the host is stopping")
        for server in self._servers:
            await server.stop(grace=1.0)
        self._servers.clear()

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "/agenthost.v1.WorkerHub/Connect": grpc.stream_stream_rpc_method_handler(
                self._connect,
                request_deserializer=wpb.WorkerUp.FromString,
                response_serializer=wpb.WorkerDown.SerializeToString,
            ),
            "/agenthost.v1.WorkerHub/Run": grpc.stream_stream_rpc_method_handler(
                self._run,
                request_deserializer=wpb.WorkerRunUp.FromString,
                response_serializer=wpb.WorkerRunDown.SerializeToString,
            ),
            "/agenthost.v1.WorkerHub/Renew": grpc.unary_unary_rpc_method_handler(
                self._renew,
                request_deserializer=wpb.RenewRequest.FromString,
                response_serializer=wpb.RenewResponse.SerializeToString,
            ),
            CALLS_METHOD: grpc.stream_stream_rpc_method_handler(self._calls),
            **self._extra,
        }

    async def _calls(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """`WorkerHub.Calls`: the worker's unary run API calls as frames (host/workers/mux.py), each served by the
        same handler and checks as the call would be, and each counted as an open call of this worker."""
        unary = {method: h for method, h in self._extra.items() if h.unary_unary is not None}
        worker = _worker().name
        streams = self._calls_streams.get(worker, 0)
        if streams >= limits.WORKER_CALLS_STREAMS:
            # Each such stream is always reading its next frame, which grpc-core holds until it is whole.
            raise errors.ResourceExhausted(
                f"worker {worker!r} has {streams} Calls streams open, the most one worker may hold at once"
                " (WORKER_CALLS_STREAMS); a worker needs one per connection"
            )
        self._calls_streams[worker] = streams + 1
        try:
            async for reply in self._serve_calls(requests, context, unary):
                yield reply
        finally:
            left = self._calls_streams.pop(worker, 1) - 1
            if left > 0:
                self._calls_streams[worker] = left

    async def _serve_calls(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, unary: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        def admit() -> Callable[[], None]:
            try:
                name = self.identify(context).name
                self._guard.take(name)
            except errors.AgentHostError as exc:
                self.calls["refused"] += 1
                self.refused("worker call", context, exc)
                raise
            self.calls["accepted"] += 1
            return functools.partial(self._guard.leave, name)

        async for reply in serve_calls(requests, context, handlers=unary, admit=admit):
            yield reply

    async def _watch_heartbeats(self) -> None:
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            now = time.time()
            for session in list(self.sessions.values()):
                if session.cert_expires_at and now >= session.cert_expires_at:
                    # A live stream outlasting its certificate would make expiry mean nothing to a connected
                    # worker; a healthy worker renewed and moved long before this.
                    log.warning("worker %s: its connection's certificate expired; its session is cut", session.name)
                    self.sessions.pop(session.name, None)
                    session.cut(
                        f"the certificate of worker {session.name!r} expired before it was renewed; enrol again"
                        " with a new join token",
                        errors.Unauthenticated,
                    )
                    continue
                if now - session.last_heartbeat > LOST_AFTER_SECONDS:
                    log.warning(
                        "worker %s silent for %.0fs: taken as lost; its %d runs end runner_lost",
                        session.name,
                        now - session.last_heartbeat,
                        len(session.runs),
                    )
                    self._drop_session(session, f"no heartbeat for {now - session.last_heartbeat:.0f}s")

    def _drop_session(self, session: Session, reason: str) -> None:
        if self.sessions.get(session.name) is session:
            del self.sessions[session.name]
        session.cut(reason)

    # ---- enrolment and tokens ----

    async def create_token(self, pool: str, ttl: float) -> hpb.CreatedWorkerToken:
        pool = pool or DEFAULT_POOL
        if not WORKER_NAME.fullmatch(pool):
            raise errors.InvalidArgument("a pool name is 1-63 letters, digits, '.', '_' or '-'")
        ttl = ttl or DEFAULT_TOKEN_TTL
        if not 0 < ttl <= MAX_TOKEN_TTL:
            raise errors.InvalidArgument(f"--ttl must be between 1 second and {MAX_TOKEN_TTL / 3600:.0f} hours")
        token = JoinToken(self.enrol_port, self.ca.enrol_pin, JoinToken.new_secret())
        expires_at = time.time() + ttl
        await self.store.add_token(hash_secret(token.secret), pool, expires_at)
        return hpb.CreatedWorkerToken(
            token=str(token),
            pool=pool,
            expires_at=expires_at,
            workers_address=f"{self.address.rpartition(':')[0]}:{self.port}",
        )

    async def _enrol_call(
        self, requests: AsyncIterator[wpb.EnrolRequest], context: grpc.aio.ServicerContext
    ) -> wpb.EnrolResponse:
        """The enrolment port is unauthenticated: a call whose request does not arrive in
        WORKER_ENROL_READ_SECONDS is ended, so calls held open cannot pile up (nor hold the port's few slots). The TLS
        version is checked before the token is read."""
        try:
            require_tls13(context.auth_context())
        except errors.AgentHostError as exc:
            self.refused("worker enrolment", context, exc)
            await errors.abort_with(context, exc)
            raise
        try:
            request = await asyncio.wait_for(anext(requests, None), limits.WORKER_ENROL_READ_SECONDS)
        except TimeoutError:
            request = None
            refusal: errors.AgentHostError = errors.DeadlineExceeded(
                f"no enrolment request within {limits.WORKER_ENROL_READ_SECONDS:.0f}s"
            )
        else:
            refusal = errors.InvalidArgument("the call carried no enrolment request")
        if request is None:
            self.refused("worker enrolment", context, refusal)
            await errors.abort_with(context, refusal)
            raise refusal
        return await self._enrol(request, context)

    async def _enrol(self, request: wpb.EnrolRequest, context: grpc.aio.ServicerContext) -> wpb.EnrolResponse:
        try:
            if not WORKER_NAME.fullmatch(request.name):
                raise errors.InvalidArgument("a worker name is 1-63 letters, digits, '.', '_' or '-'")
            token = JoinToken.parse(request.join_token)
            self.store.check_token(hash_secret(token.secret))  # nothing is signed for a token that cannot be used
            cert = self.ca.sign_worker(request.csr_pem, request.name, limits.WORKER_CERT_SECONDS)
            record = await self.store.enrol(
                hash_secret(token.secret), request.name, serial_hex(cert), cert.not_valid_after_utc.timestamp()
            )
        except errors.AgentHostError as exc:
            self.refused("worker enrolment", context, exc)
            await errors.abort_with(context, exc)
            raise
        log.info("worker %s enrolled in pool %s from %s", record.name, record.pool, context.peer())
        old = self.sessions.pop(record.name, None)
        if old is not None:  # the name's earlier certificate is no longer accepted: its session goes now
            old.cut(f"worker {record.name!r} enrolled again with a new certificate", errors.Unauthenticated)
        return wpb.EnrolResponse(
            name=record.name,
            pool=record.pool,
            certificate_pem=cert_pem(cert),
            ca_pem=self.ca.trust_pem,
            server_name="agenthost-host",
        )

    def refused(self, what: str, context: grpc.aio.ServicerContext, exc: errors.AgentHostError) -> None:
        """Logs a refused call on the enrolment or workers port, limited per kind (what, status code) like the run
        API's refusals: a caller refused again and again costs the log a few lines a minute, not one a call."""
        self.limited(
            f"{what}:{exc.code.name}", logging.WARNING, "%s refused (%s): %s", what, context.peer(), exc.message
        )

    def limited(self, kind: str, level: int, message: str, *args: object) -> None:
        """A log line of something a worker (or anyone reaching the ports) can repeat at will: at most
        REFUSALS_PER_WINDOW a minute of `kind` (the host's own string), then one line that counts the rest."""
        log_limited(self.refusals, log, kind, level, message, *args)

    # ---- identity ----

    def presented(self, context: grpc.aio.ServicerContext) -> tuple[str, str, float, x509.Name]:
        """(common name, serial, not_after, issuer) of the client certificate this call presents, on TLS 1.3
        only."""
        auth = context.auth_context()
        require_tls13(auth)
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            raise errors.Unauthenticated("no client certificate")
        pem = pems[0]
        found = self._serials.get(pem)
        if found is None:
            cert = x509.load_pem_x509_certificate(pem)
            attrs = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
            found = (
                str(attrs[0].value) if attrs else "",
                serial_hex(cert),
                cert.not_valid_after_utc.timestamp(),
                cert.issuer,
            )
            if len(self._serials) > 1024:
                self._serials.clear()
            self._serials[pem] = found
        return found

    def identify(self, context: grpc.aio.ServicerContext) -> WorkerRecord:
        """The enrolled, unrevoked worker whose certificate this call presents; Unauthenticated otherwise. The
        handshake already proved the certificate is the CA's and the key is the worker's; a connection made before
        the certificate expired is refused here after it has."""
        name, number, not_after, issuer = self.presented(context)
        now = time.time()
        if issuer not in self.ca.trusted_issuers:
            raise errors.Unauthenticated(
                f"certificate {number} of worker {name!r} is signed by a CA this host no longer trusts (its CA was"
                " rolled); enrol again with a new join token"
            )
        if now >= not_after:
            raise errors.Unauthenticated(
                f"certificate {number} of worker {name!r} expired; a worker renews its certificate before then"
                " while connected: enrol again with a new join token"
            )
        record = self.store.get(name)
        if record is None or not record.accepts(number, now):
            raise errors.Unauthenticated(
                f"certificate {number} is not the one enrolled for worker {name!r}, nor the one its last renewal"
                " replaced while that is unexpired (replaced, expired or never enrolled); enrol again with a new"
                " join token"
            )
        if record.revoked:
            raise errors.Unauthenticated(f"worker {name!r} was revoked; enrol again with a new join token")
        if number == record.serial and self._in_use.get(name) != number:
            self._in_use[name] = number
            if not record.serial_used_at:  # and kept, so that a restart does not accept the replaced one again
                self._background(self.store.mark_in_use(name, number), f"record worker {name!r}'s certificate used")
        return record

    def _background(self, write: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.create_task(write, name=f"workers:{what}")
        self._writes.add(task)
        task.add_done_callback(functools.partial(self._written, what))

    def _written(self, what: str, task: asyncio.Task[Any]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not %s: %s", what, task.exception())

    def _not_replaced(self, record: WorkerRecord, serial: str, what: str) -> None:
        """Refuses `what` (a renewal, a new session) on the certificate a renewal replaced once the renewed one has
        been used. The replaced one stays accepted until it expires only so that its connection finishes what it
        carries (run streams, run-API calls); a copy of its key taken before the renewal must not renew again (a
        fresh certificate, and the worker's real one refused) nor take the worker's session and runs. Until the
        renewed one is used, the worker may not have it (the renewal's answer lost) and renews again from this one.
        Kept in the workers store (`serial_used_at`), so a host restart does not accept the replaced one again."""
        if serial != record.serial and (record.serial_used_at or self._in_use.get(record.name) == record.serial):
            raise errors.Unauthenticated(
                f"certificate {serial} of worker {record.name!r} was replaced by a renewal whose certificate is in"
                f" use: it may finish what its connection carries, not {what}; a worker uses its renewed certificate"
                " (if this is not the worker, its old key was copied: revoke it and enrol again)"
            )

    # ---- renewal ----

    def _renewal_room(self, name: str, *, take: bool = True) -> None:
        """Counts a renewal of worker `name` against WORKER_RENEWALS_PER_WINDOW (`take`; else only checks);
        ResourceExhausted past it."""
        now = time.monotonic()
        # A lifetime shorter than three windows renews more often by design: the window shrinks with it.
        window = min(limits.WORKER_RENEWAL_WINDOW_SECONDS, limits.WORKER_CERT_SECONDS / 3)
        recent = [t for t in self._renewals.get(name, ()) if now - t < window]
        if len(recent) >= limits.WORKER_RENEWALS_PER_WINDOW:
            wait = window - (now - recent[0])
            raise errors.ResourceExhausted(
                f"worker {name!r} renewed its certificate {len(recent)} times in {window:.0f} s; renew again in"
                f" {wait:.0f} s",
                retry_after_ms=int(wait * 1000) + 1,
            )
        if take:
            recent.append(now)
            self._renewals[name] = recent

    async def _renew(self, request: wpb.RenewRequest, context: grpc.aio.ServicerContext) -> wpb.RenewResponse:
        """A new certificate for the calling worker. The name is the record's of the certificate this call
        authenticated with; the CSR only carries the new public key."""
        record = _worker()
        _, presented, presented_expires, _ = self.presented(context)
        try:
            self._not_replaced(record, presented, "renew")
            refuse_other_names(request.csr_pem, record.name)
            self._renewal_room(record.name)
            cert = self.ca.sign_worker(request.csr_pem, record.name, limits.WORKER_CERT_SECONDS)
            not_after = cert.not_valid_after_utc.timestamp()
            await self.store.renew(record.name, presented, presented_expires, serial_hex(cert), not_after)
        except errors.AgentHostError as exc:
            self.limited(
                f"renew:{record.name}",
                logging.WARNING,
                "worker %s: renewal refused (%s): %s",
                record.name,
                context.peer(),
                exc.message,
            )
            raise
        log.info(
            "worker %s renewed its certificate: %s (was %s), expires %s",
            record.name,
            serial_hex(cert),
            presented,
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(not_after)),
        )
        event = self._renewed.pop(record.name, None)
        if event is not None:
            event.set()
        return wpb.RenewResponse(certificate_pem=cert_pem(cert), ca_pem=self.ca.trust_pem, not_after=not_after)

    # ---- the control stream ----

    async def _connect(
        self, request_iterator: AsyncIterator[wpb.WorkerUp], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[wpb.WorkerDown]:
        record = _worker()
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise errors.InvalidArgument("the first message on Connect must be the worker's hello")
        hello = first.hello
        if record.name in self._hellos:
            # A worker reconnects one stream at a time; several hellos at once would each take a validation thread.
            raise errors.ResourceExhausted(
                f"worker {record.name!r} is already connecting; wait for that hello's answer"
            )
        self._hellos.add(record.name)
        try:
            offers = self._accepted(record.name, hello)
            runners = await asyncio.to_thread(offered_runners, offers)
        finally:
            self._hellos.discard(record.name)
        record = self.identify(context)  # revoked or enrolled again while its offers were read: not taken
        capacity = min(hello.capacity or DEFAULT_CAPACITY, limits.RUNS_MAX_ACTIVE)
        session = Session(record=record, peer=context.peer(), offers=offers, runners=runners, capacity=capacity)
        session.last_heartbeat = time.time()
        _, session.serial, session.cert_expires_at, session.issuer = self.presented(context)
        self._not_replaced(record, session.serial, "open a session")
        old = self.sessions.get(record.name)
        # Runs move only to the certificate that replaced the old session's, never back to an older one.
        if old is not None and hello.renewed and session.serial == record.serial != old.serial:
            self._move(old, session)
        elif old is not None:  # a reconnect after a partition: the old stream is dead even if TCP has not said so
            old.cut("this worker connected again")
        self.sessions[record.name] = session
        self._roomier()
        for run_id in hello.held_runs[: limits.RUNS_MAX_ACTIVE]:
            if run_id in session.runs:
                continue  # moved from its session before the renewal: still running
            # Whatever a worker still holds from an earlier session was ended by the host when that session was
            # lost (runner_lost): it drops them rather than finishing them a second time.
            session.outbox.put_nowait(wpb.WorkerDown(drop=wpb.RunAssignment(run_id=run_id)))
        self.limited(
            f"connect:{record.name}",
            logging.INFO,
            "worker %s connected from %s offering %d plugins",
            record.name,
            session.peer,
            len(hello.offers),
        )
        reader = asyncio.create_task(self._read_control(session, request_iterator))
        try:
            yield wpb.WorkerDown(welcome=record.name)
            while True:
                get = asyncio.ensure_future(session.outbox.get())
                done, _ = await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    break
                down = get.result()
                if down is None:
                    # Said in-band first: grpc.aio can replace a status sent while the worker writes with a bare
                    # INTERNAL. A worker that reads nothing holds this write for at most CUT_WRITE_SECONDS.
                    handler = asyncio.current_task()
                    assert handler is not None
                    timer = asyncio.get_running_loop().call_later(CUT_WRITE_SECONDS, handler.cancel)
                    try:
                        yield wpb.WorkerDown(
                            cut=wpb.WorkerCut(code=session.cut_error.code.name, reason=session.cut_reason)
                        )
                    finally:
                        timer.cancel()
                    raise session.cut_error(session.cut_reason)
                yield down
        finally:
            reader.cancel()
            self._drop_session(session, "its connection ended")
            self.limited(f"disconnect:{record.name}", logging.INFO, "worker %s disconnected", record.name)

    @staticmethod
    def _move(old: Session, new: Session) -> None:
        """The same worker, connected again with its renewed certificate: its runs and what its old control stream
        had still to send go to the new session, then the old one is cut with nothing left to lose."""
        for run_id, slot in old.runs.items():
            slot.session = new
            new.runs[run_id] = slot
        old.runs.clear()
        while not old.outbox.empty():
            down = old.outbox.get_nowait()
            if down is not None:
                new.outbox.put_nowait(down)
        old.cut("this worker moved to its renewed certificate")
        log.info("worker %s moved %d runs to its renewed certificate's connection", new.name, len(new.runs))

    async def _read_control(self, session: Session, request_iterator: AsyncIterator[wpb.WorkerUp]) -> None:
        """A worker heartbeats every 2 s; one sending faster is read at WORKER_CONTROL_MESSAGES_PER_SECOND, and
        HTTP/2 flow control holds it back meanwhile: a flood of heartbeats took ~0.7 of a core of the host."""
        window, taken = time.monotonic(), 0
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            async for message in request_iterator:
                session.messages += 1
                taken += 1
                if taken > limits.WORKER_CONTROL_MESSAGES_PER_SECOND:
                    wait = window + 1.0 - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    window, taken = time.monotonic(), 1
                if message.WhichOneof("kind") == "heartbeat":
                    session.last_heartbeat = time.time()
                    session.in_flight = message.heartbeat.in_flight

    def _accepted(self, name: str, hello: wpb.WorkerHello) -> list[wpb.WorkerOffer]:
        """The offers of a hello the host takes: at most limits.WORKER_MAX_OFFERS plugins of MAX_RUNNERS_PER_PLUGIN
        runners each, limits.WORKER_MAX_RUNNERS in all; none under the id of a plugin the host runs itself unless it is
        that same plugin (version and manifests): a binding of that runner would otherwise reach code the operator
        never installed on the host."""
        local = self.local_plugins()
        kept = []
        room = limits.WORKER_MAX_RUNNERS
        offered = sum(len(offer.manifests_json) for offer in hello.offers)
        for offer in hello.offers[: limits.WORKER_MAX_OFFERS]:
            if offer.plugin_id in local and not _same_plugin(local[offer.plugin_id], offer):
                self.limited(
                    f"offer:{name}",
                    logging.WARNING,
                    "worker %s offers plugin %r, which this host runs itself in another version or with other"
                    " runners: that offer is refused",
                    name,
                    offer.plugin_id,
                )
                offered -= len(offer.manifests_json)
                continue
            if not room:
                break
            del offer.manifests_json[min(MAX_RUNNERS_PER_PLUGIN, room) :]
            room -= len(offer.manifests_json)
            kept.append(offer)
        if offered > sum(len(offer.manifests_json) for offer in kept):
            self.limited(
                f"offer:{name}",
                logging.WARNING,
                "worker %s offered %d plugins; only the first %d plugins and %d runners in all are taken",
                name,
                len(hello.offers),
                limits.WORKER_MAX_OFFERS,
                limits.WORKER_MAX_RUNNERS,
            )
        return kept

    # ---- placement and runs ----

    def manifest(self, runner_id: str) -> RunnerManifest | None:
        """The manifest of a runner some connected worker offers (the first found)."""
        for session in self.sessions.values():
            manifest = session.runners.get(runner_id)
            if manifest is not None:
                return manifest
        return None

    def place(self, runner_id: str, pool: str = "", conversation: tuple[str, str] | None = None) -> Session | None:
        """The connected, undrained worker (of `pool`, when named) offering `runner_id` with room for one more
        run: the one that served `conversation` last if it qualifies, else the least in flight; None when there
        is none."""
        best: Session | None = None
        sticky = self._affinity.get(conversation) if conversation is not None else None
        for session in self.sessions.values():
            if session.record.draining or self._draining(session.name) or len(session.runs) >= session.capacity:
                continue
            if (pool and session.record.pool != pool) or runner_id not in session.runners:
                continue
            if session.name == sticky:
                best = session
                break
            if best is None or len(session.runs) < len(best.runs):
                best = session
        if best is not None and conversation is not None:
            self._affinity.pop(conversation, None)
            self._affinity[conversation] = best.name
            if len(self._affinity) > AFFINITY_MAX:
                del self._affinity[next(iter(self._affinity))]
        return best

    def offered(self, runner_id: str, pool: str = "") -> bool:
        """Whether any connected worker (of `pool`, when named) offers `runner_id`, full or draining or not."""
        return any(
            runner_id in session.runners and (not pool or session.record.pool == pool)
            for session in self.sessions.values()
        )

    def _roomier(self) -> None:
        self._room.set()
        self._room = asyncio.Event()

    async def wait_place(
        self,
        runner_id: str,
        timeout: float,
        pool: str = "",
        conversation: tuple[str, str] | None = None,
        *,
        grace: bool = False,
    ) -> Session | None:
        """`place`, waiting up to `timeout` for a worker with room while some connected worker offers the runner
        (all full or draining: the run waits its turn as on a busy host); None at once when none offers it, or
        with `grace` (a run a previous host left queued) once `grace_until` has passed: workers reconnect."""
        deadline = time.monotonic() + timeout
        while True:
            session = self.place(runner_id, pool, conversation)
            if session is not None:
                return session
            until = deadline if self.offered(runner_id, pool) else min(deadline, self.grace_until if grace else 0.0)
            remaining = until - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), min(remaining, WATCH_SECONDS))

    def _draining(self, name: str) -> bool:
        record = self.store.get(name)
        return record is None or record.draining or record.revoked

    async def run(self, session: Session, request: runner_pb2.RunRequest) -> AsyncIterator[bytes]:
        """Runs `request` on `session`'s worker: yields the serialized RunEventBatch messages its runner sends.
        Raises WorkerLost when the worker goes away first. Closing the iterator (the run ended, was cancelled)
        ends the worker's Run stream, which cancels the run there."""
        run_id = request.context.run_id
        slot = RunSlot(run_id, request, session=session)
        session.runs[run_id] = slot
        try:
            if session.cut_event.is_set():
                raise WorkerLost(f"worker {session.name!r} is gone: {session.cut_reason}")
            session.outbox.put_nowait(wpb.WorkerDown(assign=wpb.RunAssignment(run_id=run_id)))
            lost = asyncio.ensure_future(slot.lost.wait())
            try:
                while True:
                    if not slot.batches.empty():
                        item = slot.batches.get_nowait()
                    else:
                        get = asyncio.ensure_future(slot.batches.get())
                        timeout = None if slot.opened else TAKE_SECONDS
                        done, _ = await asyncio.wait({get, lost}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                        if get not in done:
                            get.cancel()
                            if lost in done:
                                raise WorkerLost(slot.lost_reason)
                            if not slot.opened:
                                raise WorkerLost(f"worker {session.name!r} did not take the run in {TAKE_SECONDS:.0f}s")
                            continue
                        item = get.result()
                    if item is None:
                        return
                    yield item
            finally:
                lost.cancel()
        finally:
            slot.ended.set()
            holder = slot.session or session
            if holder.runs.get(run_id) is slot:
                del holder.runs[run_id]
            self._roomier()

    async def _run(
        self, request_iterator: AsyncIterator[wpb.WorkerRunUp], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[wpb.WorkerRunDown]:
        worker = _worker()
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "run_id":
            raise errors.InvalidArgument("the first message on Run must name the run")
        session = self.sessions.get(worker.name)
        slot = session.runs.get(first.run_id) if session is not None else None
        if slot is None:
            # Not a run placed on this worker (another worker's, one that ended, or none): nothing of it is given.
            raise errors.NotFound(f"no run {first.run_id[:64]!r} is assigned to worker {worker.name!r}")
        if slot.opened:
            raise errors.FailedPrecondition(f"run {first.run_id} was already taken")  # nothing runs twice
        slot.opened = True
        yield wpb.WorkerRunDown(request=slot.request)

        async def forward() -> None:
            try:
                async for up in request_iterator:
                    kind = up.WhichOneof("kind")
                    if kind == "batch":
                        await slot.batches.put(up.batch)
                    elif kind == "end":
                        await slot.batches.put(None)
                        return
                slot.lose(f"worker {worker.name!r}: the run's stream broke off")
            except grpc.RpcError as exc:
                slot.lose(f"the worker's run stream broke: {exc.code().name}")

        reader = asyncio.create_task(forward())
        ended = asyncio.ensure_future(slot.ended.wait())
        try:
            await asyncio.wait({reader, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            ended.cancel()
        if not reader.done() or slot.ended.is_set():
            return  # the host is done with the run: ending the stream cancels it on the worker

    # ---- admin ----

    def infos(self) -> list[hpb.WorkerInfo]:
        out = []
        for record in self.store.list():
            session = self.sessions.get(record.name)
            info = hpb.WorkerInfo(
                name=record.name,
                pool=record.pool,
                enrolled_at=record.enrolled_at,
                serial=record.serial,
                cert_expires_at=record.expires_at,
                renewed_at=record.renewed_at,
            )
            if record.revoked:
                info.state = "revoked"
            elif session is None:
                info.state = "disconnected"
            else:
                info.state = "draining" if record.draining else "connected"
            if session is not None:
                info.address = session.peer
                info.in_flight = len(session.runs)
                info.capacity = session.capacity
                info.last_heartbeat = session.last_heartbeat
                # The runners parsed at the hello: what the worker sent may not even be JSON, and must not break
                # the operator's view of every worker.
                versions = {offer.plugin_id: offer.version for offer in session.offers}
                for runner_id in session.runners:
                    version = versions.get(runner_id.rpartition("/")[0], "")
                    info.runners.append(hpb.WorkerRunnerInfo(runner_id=runner_id, version=version))
            out.append(info)
        return out

    def info(self, name: str) -> hpb.WorkerInfo:
        for info in self.infos():
            if info.name == name:
                return info
        raise errors.NotFound(f"no worker named {name!r}; see `agenthost workers list`")

    async def drain(self, name: str) -> hpb.WorkerInfo:
        await self.store.set_draining(name, True)
        session = self.sessions.get(name)
        if session is not None:
            session.outbox.put_nowait(wpb.WorkerDown(drain=True))
        return self.info(name)

    async def rotate(self, name: str) -> hpb.WorkerInfo:
        """Tells worker `name` to renew its certificate now, and answers once it has (its new serial and expiry);
        the worker must be connected: renewal goes over its authenticated connection."""
        record = self.store.get(name)
        if record is None:
            raise errors.NotFound(f"no worker named {name!r}; see `agenthost workers list`")
        if record.revoked:
            raise errors.FailedPrecondition(f"worker {name!r} is revoked; it cannot renew: enrol it again")
        self._renewal_room(name, take=False)  # said now, not as a renewal that never comes
        session = self.sessions.get(name)
        if session is None:
            raise errors.FailedPrecondition(
                f"worker {name!r} is not connected; a worker renews over its connection, so start it (it renews by"
                " itself when its certificate is past 2/3 of its lifetime) or enrol it again"
            )
        event = self._renewed.setdefault(name, asyncio.Event())
        session.outbox.put_nowait(wpb.WorkerDown(rotate=True))
        try:
            await asyncio.wait_for(event.wait(), limits.WORKER_ROTATE_WAIT_SECONDS)
        except TimeoutError:
            self._renewed.pop(name, None)
            raise errors.DeadlineExceeded(
                f"worker {name!r} did not renew its certificate within {limits.WORKER_ROTATE_WAIT_SECONDS:.0f}s;"
                " see the worker's log (an older agenthost worker does not renew: upgrade it)"
            ) from None
        return self.info(name)

    async def roll_ca(self, step: str, force: bool = False) -> hpb.WorkerCAStatus:
        """`workers ca begin-roll` / `finish-roll` / `show`. Finishing refuses while an unrevoked worker has not
        renewed since the roll began (it would be refused from then on) unless forced; forced, their sessions are
        cut now."""
        if step == "begin":
            await asyncio.to_thread(self.ca.begin_roll)
            log.warning("worker CA roll begun: workers' certificates are signed by the next CA from now on")
        elif step == "finish":
            behind = self._not_renewed()
            if behind and not force:
                raise errors.FailedPrecondition(
                    f"{len(behind)} worker(s) have not renewed since the CA roll began and would be refused:"
                    f" {', '.join(behind[:20])}; run `agenthost workers rotate NAME` for each, or finish with --force"
                )
            await asyncio.to_thread(self.ca.finish_roll)
            log.warning("worker CA roll finished: certificates of the old CA are refused (%d not renewed)", len(behind))
            for session in list(self.sessions.values()):
                if session.issuer is not None and session.issuer not in self.ca.trusted_issuers:
                    self.sessions.pop(session.name, None)
                    session.cut(
                        f"worker {session.name!r} holds a certificate of the CA this host rolled out; enrol again",
                        errors.Unauthenticated,
                    )
        elif step:
            raise errors.InvalidArgument(f"unknown CA step {step!r}: begin, finish, or empty to show")
        next_ca = self.ca.next_ca
        return hpb.WorkerCAStatus(
            ca=self.ca.ca_cert.subject.rfc4514_string(),
            ca_expires_at=self.ca.ca_cert.not_valid_after_utc.timestamp(),
            next_ca=next_ca.subject.rfc4514_string() if next_ca is not None else "",
            rolling_since=self.ca.rolling_since,
            not_renewed=self._not_renewed(),
        )

    def _not_renewed(self) -> list[str]:
        """Unrevoked workers whose certificate predates the CA roll under way (none when there is none)."""
        since = self.ca.rolling_since
        if not since:
            return []
        return [r.name for r in self.store.list() if not r.revoked and max(r.enrolled_at, r.renewed_at) < since]

    async def revoke(self, name: str) -> hpb.WorkerInfo:
        await self.store.revoke(name)
        session = self.sessions.pop(name, None)
        if session is not None:
            session.cut(f"worker {name!r} was revoked; enrol again with a new join token", errors.Unauthenticated)
        log.warning("worker %s revoked; its connections were cut", name)
        return self.info(name)


# The worker whose certificate the call being served presented, set by _Guard before the handler runs (each call
# runs in its own task): what the hub's own handlers and the run API served to workers know the caller by.
current_worker: contextvars.ContextVar[WorkerRecord | None] = contextvars.ContextVar("agenthost_worker", default=None)


def caller(context: grpc.aio.ServicerContext) -> str:
    """The worker name of the call being served on the workers port (the run API's `worker_of`)."""
    record = current_worker.get()
    return record.name if record is not None else ""


def _worker() -> WorkerRecord:
    record = current_worker.get()
    assert record is not None, "a workers-port handler runs behind _Guard"
    return record


class _Guard(grpc.GenericRpcHandler):
    """Every workers-port method, served request-streaming so that `WorkerHub.identify` runs before any request
    message is read (a unary request is read from the stream after the check; the wire is the same), and so that a
    worker's calls open at once are counted and capped (limits.WORKER_MAX_CALLS) before it can hold one: an
    enrolled worker that is compromised must not pile up calls in the host nor take the port from the others.

    A worker's calls read their request (a stream its first message) only while fewer than WORKER_READS of its
    calls are reading theirs, each for at most RUN_API_READ_SECONDS: grpc-core holds a message being read until it
    is whole (up to MAX_MESSAGE_BYTES), and a worker's calls that each declared 8 MiB and never sent the last byte
    held 8 MiB of the host each. A call waiting its turn has asked for no message, so grpc-core lets in no more than
    its stream's window (run_api._Gate does the same for a plugin socket's calls)."""

    def __init__(self, hub: WorkerHub, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._hub = hub
        self._handlers = {method: self._guarded(handler) for method, handler in handlers.items()}
        self._open: dict[str, int] = {}
        self._reads: dict[str, asyncio.Semaphore] = {}  # per worker with calls open (dropped with its last call)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)

    async def _enter(self, context: grpc.aio.ServicerContext) -> WorkerRecord:
        """The caller, admitted and counted (the caller must `_leave`); the call aborted otherwise."""
        try:
            record = self._hub.identify(context)
            self.take(record.name)
        except errors.AgentHostError as exc:
            self._hub.calls["refused"] += 1
            self._hub.refused("worker call", context, exc)
            await errors.abort_with(context, exc)
            raise
        self._hub.calls["accepted"] += 1
        current_worker.set(record)
        return record

    def take(self, name: str) -> None:
        """One more open call of worker `name` (a call on this port, or a call forwarded on its Calls stream)."""
        held = self._open.get(name, 0)
        if held >= limits.WORKER_MAX_CALLS:
            raise errors.ResourceExhausted(
                f"worker {name!r} has {held} calls open on the workers port, the most one worker may"
                " hold at once; finish some first"
            )
        self._open[name] = held + 1

    def _leave(self, record: WorkerRecord) -> None:
        self.leave(record.name)

    def leave(self, name: str) -> None:
        held = self._open.pop(name, 1) - 1
        if held > 0:
            self._open[name] = held
        else:
            self._reads.pop(name, None)  # no call of it waits on it

    async def _read(self, name: str, messages: AsyncIterator[Any]) -> Any:
        """The next message of `messages` (None at its end), read in worker `name`'s turn (see the class)."""
        reads = self._reads.get(name)
        if reads is None:
            reads = self._reads[name] = asyncio.Semaphore(limits.WORKER_READS)
        async with reads:
            try:
                async with asyncio.timeout(limits.RUN_API_READ_SECONDS):
                    return await anext(messages, None)
            except TimeoutError:
                raise errors.DeadlineExceeded(
                    f"the request did not arrive within RUN_API_READ_SECONDS = {limits.RUN_API_READ_SECONDS}s"
                ) from None

    async def _rest(self, name: str, request_iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A stream's messages, its first read in turn (`_read`); the rest are bounded by what each method reads."""
        messages = aiter(request_iterator)
        first = await self._read(name, messages)
        if first is None:
            return
        yield first
        async for message in messages:
            yield message

    async def _request(
        self, name: str, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext, unary: bool
    ) -> Any:
        if not unary:
            return self._rest(name, request_iterator)
        request = await self._read(name, aiter(request_iterator))
        if request is None:
            await errors.abort_with(context, errors.InvalidArgument("the call carried no request message"))
        return request

    def _guarded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner: Any = handler.stream_stream or handler.stream_unary or handler.unary_stream or handler.unary_unary
        unary = not handler.request_streaming
        codecs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }

        if handler.response_streaming:

            async def streaming(
                request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                record = await self._enter(context)
                try:
                    request = await self._request(record.name, request_iterator, context, unary)
                    async for reply in inner(request, context):
                        yield reply
                except errors.AgentHostError as exc:
                    await errors.abort_with(context, exc)
                finally:
                    self._leave(record)

            return grpc.stream_stream_rpc_method_handler(streaming, **codecs)

        async def single(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            record = await self._enter(context)
            try:
                request = await self._request(record.name, request_iterator, context, unary)
                return await inner(request, context)
            except errors.AgentHostError as exc:
                await errors.abort_with(context, exc)
            finally:
                self._leave(record)

        return grpc.stream_unary_rpc_method_handler(single, **codecs)
