"""The worker process's side (`agenthost worker --host HOST:PORT`): enrolment with a join token, then one
long-lived mutual-TLS channel to the host.

Files, in the worker's data dir under `worker/` (0700, each 0600): worker.key (made here; it never leaves the
machine), worker.crt (signed by the host's CA at enrolment), ca.crt (the host's CA: the only authority this worker
trusts for the host), worker.json (host address, name, pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agenthost.host.access.private_files import make_private_dir
from agenthost.host.access.worker_pki import (
    ENROL_SERVER_NAME,
    HUB_SERVER_NAME,
    JoinToken,
    key_pem,
    make_csr,
    new_key,
    pin_of,
    read_private,
    write_private,
)
from agenthost.host.workers.hub import split_address
from agenthost.protos import errors
from agenthost.protos import worker_pb2 as wpb
from agenthost.protos.wire import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

ENROL_TIMEOUT = 30.0


class WorkerError(RuntimeError):
    """What stops a worker, said so that its operator knows what to do."""


@dataclass(frozen=True)
class Identity:
    host: str
    name: str
    pool: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def channel(self) -> grpc.aio.Channel:
        """The one channel to the host's workers port. The host is checked against its CA and the name its
        certificate carries, not the address dialled (NAT, load balancers)."""
        return grpc.aio.secure_channel(
            self.host,
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
    hostname, _ = split_address(host)
    try:
        pem = await asyncio.to_thread(_fetch_enrol_certificate, hostname, token.enrol_port)
    except (OSError, ssl.SSLError) as exc:
        raise WorkerError(
            f"cannot reach the host's enrolment port {hostname}:{token.enrol_port} ({exc}); is the host serving"
            " with --workers, and is that port open to this machine?"
        ) from None
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
        raise WorkerError(f"the host refused enrolment: {exc.code().name}: {exc.details()}") from None
    d = identity_dir(data_dir)
    write_private(d / "worker.key", key_pem(key))
    write_private(d / "worker.crt", reply.certificate_pem)
    write_private(d / "ca.crt", reply.ca_pem)
    doc = {"host": host, "name": reply.name, "pool": reply.pool}
    write_private(d / "worker.json", json.dumps(doc).encode())
    return Identity(host, reply.name, reply.pool, key_pem(key), reply.certificate_pem, reply.ca_pem)


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


class Worker:
    """One worker process: its identity, its plugins (item 2) and its connection to the host."""

    def __init__(self, identity: Identity, *, capacity: int = 4) -> None:
        self.identity = identity
        self.capacity = capacity
        self.connected = asyncio.Event()
        self.draining = False
        self.offers: list[wpb.WorkerOffer] = []

    def hello(self) -> wpb.WorkerUp:
        return wpb.WorkerUp(hello=wpb.WorkerHello(offers=self.offers, capacity=self.capacity))

    async def session(self, channel: grpc.aio.Channel) -> None:
        """One control stream, until it breaks: hello, then heartbeats; assignments are served as they come."""
        outbox: asyncio.Queue[wpb.WorkerUp] = asyncio.Queue()
        outbox.put_nowait(self.hello())

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
                await self.on_message(channel, down)
        finally:
            beating.cancel()
            call.cancel()
            self.connected.clear()

    def in_flight(self) -> int:
        return 0

    async def on_message(self, channel: grpc.aio.Channel, down: wpb.WorkerDown) -> None:
        kind = down.WhichOneof("kind")
        if kind == "welcome":
            log.info("connected to %s as %s", self.identity.host, down.welcome)
            self.connected.set()
        elif kind == "drain":
            self.draining = True
            log.info("the host drains this worker: no new runs")

    async def serve(self, stop: asyncio.Event) -> None:
        """Stays connected until `stop`: reconnects with jittered exponential backoff (a host restart, a partition),
        and raises WorkerError when the host refuses this worker (revoked, a certificate it does not accept)."""
        failures = 0
        ever = False
        while not stop.is_set():
            async with self.identity.channel() as channel:
                task = asyncio.create_task(self.session(channel))
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not task.done():
                    task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    if stop.is_set():
                        return
                except grpc.RpcError as exc:
                    ever = ever or self.connected.is_set()
                    refused = exc.code() == grpc.StatusCode.UNAUTHENTICATED
                    handshake = exc.code() == grpc.StatusCode.UNAVAILABLE and _handshake_failed(exc.details() or "")
                    if refused or (handshake and not ever):
                        raise WorkerError(explain(exc)) from None
                    log.warning("connection to the host lost: %s", explain(exc))
                else:
                    log.warning("the host ended this worker's session")
            failures = 0 if self.connected.is_set() else failures + 1
            delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** min(failures, 10)) * random.uniform(0.5, 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


async def run_worker(args: Any, data_dir: Path) -> int:
    """`agenthost worker`: enrols when given --join, then serves until SIGINT/SIGTERM."""
    import signal
    import socket
    import sys

    # The CLI set up warnings-only logging for its client commands; a worker is a service and says more.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    try:
        if args.join:
            identity = await enrol(data_dir, args.host, args.join, args.name or socket.gethostname())
            print(f"enrolled as worker {identity.name} in pool {identity.pool}", flush=True)
        else:
            found = load_identity(data_dir)
            if found is None:
                raise WorkerError(
                    f"this worker is not enrolled (nothing in {data_dir / 'worker'}); make a join token on the host"
                    " with `agenthost workers token create` and pass it with --join"
                )
            identity = dataclasses.replace(found, host=args.host)
        if args.enrol_only:
            return 0
        worker = Worker(identity, capacity=args.capacity)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await worker.serve(stop)
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
