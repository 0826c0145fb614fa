"""Worker enrolment and the workers port's walls, driven as an operator and an attacker would: the real CLI for
tokens and the worker, real gRPC clients with real (or forged) certificates for the attacks.

Each refusal happens before any request message is read: the TLS handshake stops plain TCP and certificates of
another CA before a handler exists (the hub's guard counts every call that reaches it, and none does), and the
guard refuses a revoked or replaced certificate before reading the request."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import stat
import sys
import time
from pathlib import Path

import grpc
import pytest

from agenthost.host.access.worker_pki import HostCA, cert_pem, common_name, key_pem, make_csr, new_key
from agenthost.host.server import Host
from agenthost.host.workers.agent import Identity, WorkerError, enrol, explain, load_identity
from agenthost.protos import worker_pb2 as wpb
from tests.cli_process import CLI, acli, cli_env
from tests.workers.helpers import address, token, wait_for

pytestmark = pytest.mark.slow


async def hello(identity: Identity) -> wpb.WorkerDown:
    """Opens the control stream with this identity and returns the host's first answer."""
    async with identity.channel() as channel:
        call = channel.stream_stream(
            "/agenthost.v1.WorkerHub/Connect",
            request_serializer=wpb.WorkerUp.SerializeToString,
            response_deserializer=wpb.WorkerDown.FromString,
        )(iter([wpb.WorkerUp(hello=wpb.WorkerHello())]))
        async for first in call:
            call.cancel()
            return first
    raise AssertionError("no answer")


async def test_enrolment_through_the_cli_then_mtls(host: Host, tmp_path: Path) -> None:
    join = await token(host, "--pool", "gpu", "--ttl", "10m")
    assert join.startswith("ahj1.")
    worker_dir = tmp_path / "worker"
    rc, out, err = await acli(
        worker_dir, "worker", "--host", address(host), "--join", join, "--name", "gpu-1", "--enrol-only"
    )
    assert rc == 0, err
    assert "enrolled as worker gpu-1 in pool gpu" in out
    # The worker's key was made on the worker and stays there, private; the host has none of it.
    for name in ("worker.key", "worker.crt", "ca.crt", "worker.json"):
        mode = stat.S_IMODE(os.stat(worker_dir / "worker" / name).st_mode)
        assert mode == 0o600, (name, oct(mode))
    key = (worker_dir / "worker" / "worker.key").read_bytes()
    assert not any(key in p.read_bytes() for p in (host.data_dir / "workers").iterdir())
    assert stat.S_IMODE(os.stat(host.data_dir / "workers" / "ca.key").st_mode) == 0o600
    identity = load_identity(worker_dir)
    assert identity is not None and common_name(identity.cert_pem) == "gpu-1"
    assert (await hello(identity)).welcome == "gpu-1"

    # The same token again: refused, and the worker says why.
    rc, _, err = await acli(
        tmp_path / "other", "worker", "--host", address(host), "--join", join, "--name", "gpu-2", "--enrol-only"
    )
    assert rc == 1 and "already used" in err, err
    rc, out, _ = await acli(host.data_dir, "workers", "list")
    assert "gpu-1" in out and "gpu-2" not in out


async def test_expired_token_is_refused(host: Host, tmp_path: Path) -> None:
    join = await token(host, "--ttl", "1s")
    made = time.time()
    await wait_for(lambda: time.time() > made + 1.5)
    rc, _, err = await acli(
        tmp_path / "w", "worker", "--host", address(host), "--join", join, "--name", "late", "--enrol-only"
    )
    assert rc == 1 and "expired" in err, err
    assert not (tmp_path / "w" / "worker" / "worker.crt").exists()


async def test_token_for_another_host_is_refused_before_it_is_presented(host: Host, tmp_path: Path) -> None:
    """A token whose pin does not match the enrolment port's certificate: the worker does not send it at all (an
    impostor at the host's address would otherwise collect a valid token)."""
    join = await token(host)
    prefix, port, pin, secret = join.split(".")
    forged = ".".join([prefix, port, "A" * len(pin), secret])
    with pytest.raises(WorkerError, match="not the host that made this join token"):
        await enrol(tmp_path / "w", address(host), forged, "w")
    # The real token still works: it was never presented.
    assert (await enrol(tmp_path / "w", address(host), join, "w")).name == "w"


async def test_plain_tcp_is_refused_before_any_request(host: Host) -> None:
    assert host.workers is not None
    async with grpc.aio.insecure_channel(address(host)) as channel:
        call = channel.stream_stream("/agenthost.v1.WorkerHub/Connect")(iter([b""]))
        with pytest.raises(grpc.RpcError) as caught:
            async for _ in call:
                pass
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # A raw HTTP/2 preface on the port: the server answers with a TLS alert or closes, never HTTP/2.
    reader, writer = await asyncio.open_connection("127.0.0.1", host.workers.port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 64)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(1024), 10)
    writer.close()
    assert b"HTTP/2" not in data and not data.startswith(b"\x00\x00")
    assert host.workers.calls == {"accepted": 0, "refused": 0}


async def test_certificate_of_another_ca_with_a_forged_name_is_refused(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    real = await enrol(tmp_path / "real", address(host), await token(host), "gpu-1")
    # An attacker's own CA, with a certificate naming the enrolled worker.
    (tmp_path / "rogue").mkdir()
    rogue_ca = HostCA(tmp_path / "rogue")
    key = new_key()
    cert = rogue_ca.sign_worker(make_csr(key, "gpu-1"), "gpu-1", 3600)
    forged = Identity(address(host), "gpu-1", "default", key_pem(key), cert_pem(cert), real.ca_pem)
    with pytest.raises(grpc.RpcError) as caught:
        await hello(forged)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "handshake" in explain(caught.value)
    assert host.workers.calls == {"accepted": 0, "refused": 0}
    # The worker's own certificate is accepted by the same port.
    assert (await hello(real)).welcome == "gpu-1"


async def enrol_raw(join: str, csr_pem: bytes, name: str = "w1") -> wpb.EnrolResponse:
    """Enrol as a client of our own making would: the token's port, its certificate trusted as found."""
    port = int(join.split(".")[1])
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials(root_certificates=pem.encode()),
        options=[("grpc.ssl_target_name_override", "agenthost-enrol")],
    ) as channel:
        reply: wpb.EnrolResponse = await channel.unary_unary(
            "/agenthost.v1.WorkerEnrolment/Enrol",
            request_serializer=wpb.EnrolRequest.SerializeToString,
            response_deserializer=wpb.EnrolResponse.FromString,
        )(wpb.EnrolRequest(join_token=join, name=name, csr_pem=csr_pem), timeout=30)
    return reply


async def test_csr_subject_is_ignored(host: Host, tmp_path: Path) -> None:
    """The host names the worker: a CSR asking for another common name gets the requested worker name."""
    join = await token(host)
    reply = await enrol_raw(join, make_csr(new_key(), "agenthost-host"))
    assert common_name(reply.certificate_pem) == "w1"


async def test_csr_extensions_are_ignored_the_host_sets_its_own(host: Host) -> None:
    """A CSR asking to be a CA, for the host's own server name and for server authentication: were any of it
    copied, a worker could sign certificates or serve as the host to the other workers (they check the host by
    the CA and the name agenthost-host). The certificate carries only what the host sets."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    join = await token(host)
    key = new_key()
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agenthost-host")]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("agenthost-host")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    reply = await enrol_raw(join, csr)
    cert = x509.load_pem_x509_certificate(reply.certificate_pem)
    assert common_name(reply.certificate_pem) == "w1"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert {ext.oid for ext in cert.extensions} == {
        x509.oid.ExtensionOID.BASIC_CONSTRAINTS,
        x509.oid.ExtensionOID.EXTENDED_KEY_USAGE,
    }


async def test_revoke_cuts_the_live_connection_and_refuses_the_certificate(host: Host, tmp_path: Path) -> None:
    assert host.workers is not None
    worker_dir = tmp_path / "worker"
    await enrol(worker_dir, address(host), await token(host), "w1")
    proc = await asyncio.create_subprocess_exec(
        *CLI, "--data-dir", str(worker_dir), "worker", "--host", address(host),
        env=cli_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await wait_for(lambda: "w1" in host.workers.sessions)
        rc, out, err = await acli(host.data_dir, "workers", "revoke", "w1")
        assert rc == 0 and "revoked" in out, err
        assert "w1" not in host.workers.sessions
        # The worker's live stream was cut at once with the reason; it stops, saying why.
        _, err_bytes = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 1
        assert "was revoked" in err_bytes.decode(), err_bytes.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # Its certificate is refused from then on, by the guard, before the request is read.
    old = load_identity(worker_dir)
    assert old is not None
    with pytest.raises(grpc.RpcError) as caught:
        await hello(old)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in (caught.value.details() or "")
    assert host.workers.calls["refused"] == 1
    # Re-enrolled under the same name: the new certificate is accepted, the old one (same name) is not.
    new = await enrol(tmp_path / "again", address(host), await token(host), "w1")
    assert (await hello(new)).welcome == "w1"
    with pytest.raises(grpc.RpcError) as caught:
        await hello(old)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not the one enrolled" in (caught.value.details() or "")


async def test_tls_version_is_1_3(host: Host) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    assert host.workers is not None
    with socket.create_connection(("127.0.0.1", host.workers.enrol_port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as tls:
            assert tls.version() == "TLSv1.3"


def test_worker_without_enrolment_says_what_to_do(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [*CLI, "--data-dir", str(tmp_path), "worker", "--host", "127.0.0.1:1"],
        env=cli_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "not enrolled" in proc.stderr and "workers token create" in proc.stderr
    assert sys.executable  # the CLI ran under this interpreter


async def test_calls_held_open_on_the_enrolment_port_are_capped_and_timed_out(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone on the network opens Enrol calls and never sends the request: each held ~22 KB of the host, without
    bound (5,000 held: +110 MB). Now a few are taken at once, the rest refused RESOURCE_EXHAUSTED at once (a real
    worker enrolling meanwhile is told the port is busy, its token unspent), and a held one ends when its request
    does not come; then the worker enrols as before."""
    from agenthost.host import limits

    join = await token(host)
    port = int(join.split(".")[1])
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    never = asyncio.Event()

    async def silence():  # noqa: ANN202 — a request stream that never yields
        await never.wait()
        yield wpb.EnrolRequest()

    held = limits.WORKER_ENROL_MAX_CALLS * 4
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials(root_certificates=pem.encode()),
        options=[("grpc.ssl_target_name_override", "agenthost-enrol")],
    ) as channel:
        enrol_call = channel.stream_unary(
            "/agenthost.v1.WorkerEnrolment/Enrol",
            request_serializer=wpb.EnrolRequest.SerializeToString,
            response_deserializer=wpb.EnrolResponse.FromString,
        )
        # The port full: the slots held by calls with a long read deadline.
        monkeypatch.setattr(limits, "WORKER_ENROL_READ_SECONDS", 300.0)
        filling = [enrol_call(silence(), timeout=300) for _ in range(held)]
        await wait_for(lambda: sum(call.done() for call in filling) >= held - limits.WORKER_ENROL_MAX_CALLS)
        with pytest.raises(WorkerError, match=r"enrolment port is busy .* the join token was not used"):
            await enrol(tmp_path / "w", address(host), join, "w1")
        for call in filling:
            call.cancel()
        # Calls that never send their request end on the host's deadline, not the client's.
        monkeypatch.setattr(limits, "WORKER_ENROL_READ_SECONDS", 2.0)
        calls = [enrol_call(silence(), timeout=60) for _ in range(held)]
        ends = []
        for call in calls:
            with pytest.raises(grpc.RpcError) as ended:
                await call
            ends.append((ended.value.code(), ended.value.details()))
        never.set()
    refused = [end for end in ends if end[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    timed_out = [end for end in ends if "no enrolment request within 2s" in (end[1] or "")]
    assert len(refused) >= held - limits.WORKER_ENROL_MAX_CALLS, ends
    assert len(refused) + len(timed_out) == held, ends  # none held until the client's own deadline
    assert timed_out, ends
    identity = await enrol(tmp_path / "w", address(host), join, "w1")  # the token was not spent by any of it
    assert identity.name == "w1"


async def test_refused_enrolments_cannot_flood_the_hosts_log(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    """Anyone who reaches the enrolment port could write a host log line per refused call (a guessed token, a bad
    name), without bound: enough of them roll `host.log` past every line before them. Refusals there are now
    logged like the run API's, at most REFUSALS_PER_WINDOW a kind a minute and then one line that sums them up;
    the refusal the caller gets is unchanged."""
    from agenthost.host.ops import logs

    join = await token(host)
    guessed = ".".join([*join.split(".")[:3], "guessed-secret"])
    caplog.set_level(logging.INFO)
    port = int(join.split(".")[1])
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    attempts = 300
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials(root_certificates=pem.encode()),
        options=[("grpc.ssl_target_name_override", "agenthost-enrol")],
    ) as channel:
        enrol_call = channel.unary_unary(
            "/agenthost.v1.WorkerEnrolment/Enrol",
            request_serializer=wpb.EnrolRequest.SerializeToString,
            response_deserializer=wpb.EnrolResponse.FromString,
        )
        csr = make_csr(new_key(), "x")
        for i in range(attempts):
            request = wpb.EnrolRequest(join_token=guessed, name=f"w{i}", csr_pem=csr)
            with pytest.raises(grpc.RpcError) as refused:
                await enrol_call(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    lines = [r for r in caplog.records if r.name.startswith("agenthost.host")]
    assert len(lines) <= 2 * logs.REFUSALS_PER_WINDOW, f"{len(lines)} host log lines for {attempts} refused calls"
    assert any("enrol" in r.getMessage() or "enrol" in str(getattr(r, "fields", "")) for r in lines)
    # The real token still enrols.
    assert (await enrol_raw(join, make_csr(new_key(), "w"))).name == "w1"
