"""TLS 1.3 only, on both worker ports, against a real TLS 1.2-only client.

grpc-core negotiates TLS 1.2 or 1.3 and grpcio's Python API cannot raise the minimum, so the host refuses every
call on a connection that negotiated anything but TLS 1.3 (the version is in the call's auth context) before any
request message is read. The client here is Python's ssl module with `maximum_version = TLSv1_2`: a loopback relay
takes a plain gRPC client's bytes and carries them over such a TLS connection to the host's port, so what reaches
the host is a real TLS 1.2 handshake followed by a real gRPC call.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host.server import Host
from agenthost.host.workers.agent import Identity, enrol
from agenthost.protos import worker_pb2 as wpb
from tests.workers.helpers import address, token

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def tls12_relay(port: int, identity: Identity | None, tmp: Path) -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback address whose connections reach 127.0.0.1:`port` over TLS capped at 1.2 (with `identity`'s client
    certificate when given), and the versions each connection negotiated."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the host's identity is not what this test is about
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    if identity is not None:
        (tmp / "client.key").write_bytes(identity.key_pem)
        (tmp / "client.crt").write_bytes(identity.cert_pem)
        ctx.load_cert_chain(tmp / "client.crt", tmp / "client.key")
    versions: list[str] = []
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="host")
        versions.append(up_writer.get_extra_info("ssl_object").version())
        for task in (pipe(reader, up_writer), pipe(up_reader, writer)):
            t = asyncio.create_task(task)
            pipes.add(t)
            t.add_done_callback(pipes.discard)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", versions
    finally:
        server.close()
        for t in list(pipes):
            t.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def test_enrolment_over_tls_1_2_is_refused_before_the_token_is_read(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    join = await token(host)
    async with (
        tls12_relay(host.workers.enrol_port, None, tmp_path) as (relay, versions),
        grpc.aio.insecure_channel(relay) as channel,
    ):
        call = channel.unary_unary(
            "/agenthost.v1.WorkerEnrolment/Enrol",
            request_serializer=wpb.EnrolRequest.SerializeToString,
            response_deserializer=wpb.EnrolResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            await call(wpb.EnrolRequest(join_token=join, name="old-tls", csr_pem=b"x"), timeout=30)
    assert versions == ["TLSv1.2"]  # the handshake itself succeeded: grpc-core allows 1.2; the host refuses
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "negotiated TLSv1.2; the host accepts TLS 1.3 only" in (caught.value.details() or "")
    # The token was not read, let alone used: the real worker (TLS 1.3) enrols with it.
    assert (await enrol(tmp_path / "w", address(host), join, "w")).name == "w"


async def test_a_worker_certificate_over_tls_1_2_is_refused_before_any_request(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    identity = await enrol(tmp_path / "w", address(host), await token(host), "gpu-1")
    async with (
        tls12_relay(host.workers.port, identity, tmp_path) as (relay, versions),
        grpc.aio.insecure_channel(relay) as channel,
    ):
        call = channel.stream_stream(
            "/agenthost.v1.WorkerHub/Connect",
            request_serializer=wpb.WorkerUp.SerializeToString,
            response_deserializer=wpb.WorkerDown.FromString,
        )(iter([wpb.WorkerUp(hello=wpb.WorkerHello())]))
        with pytest.raises(grpc.RpcError) as caught:
            async for _ in call:
                pass
    assert versions == ["TLSv1.2"]
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "the host accepts TLS 1.3 only" in (caught.value.details() or "")
    assert host.workers.calls == {"accepted": 0, "refused": 1}
    assert "gpu-1" not in host.workers.sessions
