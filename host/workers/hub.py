"""The host's side of runner workers: the two TCP listeners (`serve --workers HOST:PORT`), enrolment, the identity
check every worker call passes, and the live sessions (`workers list`, drain, revoke).

Ports. The workers port serves WorkerHub (and, for item 2, the run API) under mutual TLS: grpc-core refuses in the
handshake a client with no certificate, with one not signed by the host's CA, or speaking plain TCP, so none of
those ever reaches a handler. The enrolment port (the workers port + 1 unless named) serves WorkerEnrolment with
server-authenticated TLS only: a worker has no certificate yet. It is a second port because a gRPC server either
requires client certificates or does not request them at all; a join token pins its certificate.

Identity. Every call on the workers port goes through `_Guard`, which, before any request message is read, takes
the client certificate from the call's auth context and accepts it only if its serial is the one recorded for the
worker its common name names, and that worker is not revoked. Every method is served as a request-streaming one to
make that possible (gRPC reads a unary request before calling its handler; the wire does not differ).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from cryptography import x509

from agenthost.host.access.grants import hash_secret
from agenthost.host.access.worker_pki import WORKER_NAME, HostCA, JoinToken, cert_pem, serial_hex
from agenthost.host.store.workers import WorkerRecord, WorkerStore
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import worker_pb2 as wpb
from agenthost.protos.wire import SERVER_OPTIONS

log = logging.getLogger(__name__)

DEFAULT_TOKEN_TTL = 600.0
MAX_TOKEN_TTL = 24 * 3600.0
DEFAULT_POOL = "default"


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
    cut_event: asyncio.Event = field(default_factory=asyncio.Event)

    def cut(self, reason: str) -> None:
        """Ends this worker's calls now, each with UNAUTHENTICATED and `reason` (a gRPC handler's task cancelled
        from outside would leave the client's stream open: the status must be sent)."""
        self.cut_reason = reason
        self.cut_event.set()
        self.outbox.put_nowait(None)


class WorkerHub:
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
        self._servers: list[grpc.aio.Server] = []
        self._serials: dict[bytes, str] = {}

    # ---- listeners ----

    async def start(self) -> None:
        bind, port = split_address(self.address)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((_Guard(self, self._handlers()),))
        creds = grpc.ssl_server_credentials(
            [(self.ca.hub_key_pem, self.ca.hub_cert_pem)], root_certificates=self.ca.ca_pem, require_client_auth=True
        )
        self.port = server.add_secure_port(f"{bind}:{port}", creds)
        if not self.port:
            raise OSError(f"cannot listen for workers on {self.address}")
        if self.enrol_address:
            enrol_bind, enrol_port = split_address(self.enrol_address)
        else:
            enrol_bind, enrol_port = bind, (port + 1 if port else 0)
        enrol = grpc.aio.server(options=SERVER_OPTIONS)
        enrol.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "agenthost.v1.WorkerEnrolment",
                    {
                        "Enrol": grpc.unary_unary_rpc_method_handler(
                            self._enrol,
                            request_deserializer=wpb.EnrolRequest.FromString,
                            response_serializer=wpb.EnrolResponse.SerializeToString,
                        )
                    },
                ),
            )
        )
        self.enrol_port = enrol.add_secure_port(
            f"{enrol_bind}:{enrol_port}", grpc.ssl_server_credentials([(self.ca.enrol_key_pem, self.ca.enrol_cert_pem)])
        )
        if not self.enrol_port:
            raise OSError(f"cannot listen for worker enrolment on {enrol_bind}:{enrol_port}")
        for s in (server, enrol):
            await s.start()
            self._servers.append(s)
        log.info("listening for workers on %s:%d (enrolment on port %d)", bind, self.port, self.enrol_port)

    async def stop(self) -> None:
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
        }

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

    async def _enrol(self, request: wpb.EnrolRequest, context: grpc.aio.ServicerContext) -> wpb.EnrolResponse:
        try:
            if not WORKER_NAME.fullmatch(request.name):
                raise errors.InvalidArgument("a worker name is 1-63 letters, digits, '.', '_' or '-'")
            token = JoinToken.parse(request.join_token)
            cert = self.ca.sign_worker(request.csr_pem, request.name)
            record = await self.store.enrol(hash_secret(token.secret), request.name, serial_hex(cert))
        except errors.AgentHostError as exc:
            log.warning("worker enrolment refused (%s): %s", context.peer(), exc.message)
            await errors.abort_with(context, exc)
            raise
        log.info("worker %s enrolled in pool %s from %s", record.name, record.pool, context.peer())
        old = self.sessions.pop(record.name, None)
        if old is not None:  # the name's earlier certificate is no longer accepted: its session goes now
            old.cut(f"worker {record.name!r} enrolled again with a new certificate")
        return wpb.EnrolResponse(
            name=record.name,
            pool=record.pool,
            certificate_pem=cert_pem(cert),
            ca_pem=self.ca.ca_pem,
            server_name="agenthost-host",
        )

    # ---- identity ----

    def identify(self, context: grpc.aio.ServicerContext) -> WorkerRecord:
        """The enrolled, unrevoked worker whose certificate this call presents; Unauthenticated otherwise. The
        handshake already proved the certificate is the CA's and the key is the worker's."""
        auth = context.auth_context()
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            raise errors.Unauthenticated("no client certificate")
        pem = pems[0]
        serial = self._serials.get(pem)
        if serial is None:
            cert = x509.load_pem_x509_certificate(pem)
            attrs = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
            serial = f"{attrs[0].value if attrs else ''}\x1f{serial_hex(cert)}"
            if len(self._serials) > 1024:
                self._serials.clear()
            self._serials[pem] = serial
        name, _, number = serial.partition("\x1f")
        record = self.store.get(name)
        if record is None or record.serial != number:
            raise errors.Unauthenticated(
                f"certificate {number} is not the one enrolled for worker {name!r} (replaced or never enrolled);"
                " enrol again with a new join token"
            )
        if record.revoked:
            raise errors.Unauthenticated(f"worker {name!r} was revoked; enrol again with a new join token")
        return record

    # ---- the control stream ----

    async def _connect(
        self, request_iterator: AsyncIterator[wpb.WorkerUp], context: grpc.aio.ServicerContext, record: WorkerRecord
    ) -> AsyncIterator[wpb.WorkerDown]:
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            raise errors.InvalidArgument("the first message on Connect must be the worker's hello")
        hello = first.hello
        old = self.sessions.get(record.name)
        if old is not None:  # a reconnect after a partition: the old stream is dead even if TCP has not said so
            old.cut("this worker connected again")
        session = Session(record=record, peer=context.peer(), offers=list(hello.offers), capacity=hello.capacity)
        session.last_heartbeat = time.time()
        self.sessions[record.name] = session
        log.info("worker %s connected from %s offering %d plugins", record.name, session.peer, len(hello.offers))
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
                    raise errors.Unauthenticated(session.cut_reason)
                yield down
        finally:
            reader.cancel()
            if self.sessions.get(record.name) is session:
                del self.sessions[record.name]
            log.info("worker %s disconnected", record.name)

    async def _read_control(self, session: Session, request_iterator: AsyncIterator[wpb.WorkerUp]) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            async for message in request_iterator:
                if message.WhichOneof("kind") == "heartbeat":
                    session.last_heartbeat = time.time()
                    session.in_flight = message.heartbeat.in_flight

    # ---- admin ----

    def infos(self) -> list[hpb.WorkerInfo]:
        out = []
        for record in self.store.list():
            session = self.sessions.get(record.name)
            info = hpb.WorkerInfo(
                name=record.name, pool=record.pool, enrolled_at=record.enrolled_at, serial=record.serial
            )
            if record.revoked:
                info.state = "revoked"
            elif session is None:
                info.state = "disconnected"
            else:
                info.state = "draining" if record.draining else "connected"
            if session is not None:
                info.address = session.peer
                info.in_flight = session.in_flight
                info.capacity = session.capacity
                info.last_heartbeat = session.last_heartbeat
                for offer in session.offers:
                    for raw in offer.manifests_json:
                        name = json.loads(raw).get("name", "")
                        runner_id = f"{offer.plugin_id}/{name}"
                        info.runners.append(hpb.WorkerRunnerInfo(runner_id=runner_id, version=offer.version))
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

    async def revoke(self, name: str) -> hpb.WorkerInfo:
        await self.store.revoke(name)
        session = self.sessions.pop(name, None)
        if session is not None:
            session.cut(f"worker {name!r} was revoked; enrol again with a new join token")
        log.warning("worker %s revoked; its connections were cut", name)
        return self.info(name)


class _Guard(grpc.GenericRpcHandler):
    """Every workers-port method, served request-streaming so that `WorkerHub.identify` runs before any request
    message is read; the handler is handed the caller's WorkerRecord."""

    def __init__(self, hub: WorkerHub, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._hub = hub
        self._handlers = {method: self._guarded(handler) for method, handler in handlers.items()}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)

    def _check(self, context: grpc.aio.ServicerContext) -> WorkerRecord | errors.AgentHostError:
        try:
            record = self._hub.identify(context)
        except errors.AgentHostError as exc:
            self._hub.calls["refused"] += 1
            log.warning("worker call refused (%s): %s", context.peer(), exc.message)
            return exc
        self._hub.calls["accepted"] += 1
        return record

    def _guarded(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner: Callable[..., Any] = handler.stream_stream  # type: ignore[assignment]

        async def behaviour(
            request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            checked = self._check(context)
            if isinstance(checked, errors.AgentHostError):
                await errors.abort_with(context, checked)
                return
            try:
                async for reply in inner(request_iterator, context, checked):
                    yield reply
            except errors.AgentHostError as exc:
                await errors.abort_with(context, exc)

        return grpc.stream_stream_rpc_method_handler(
            functools.wraps(inner)(behaviour),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
