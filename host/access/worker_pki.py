"""The certificates of runner workers (`agenthost worker`): the host's own CA, the certificates the host serves
its two worker ports with, the client certificates it signs for enrolled workers, and the worker's side of it (its
key, its CSR, the pin of the enrolment certificate). All of it through the `cryptography` library, in PEM.

Host files, under `<data>/workers/` (0700), each written 0600 once and kept:
  ca.key, ca.crt           the CA (EC P-256, 10 years): signs the hub certificate and workers' client certificates
  ca-next.key, ca-next.crt the next CA, while the CA is rolled (HostCA.begin_roll): signs workers' certificates
  hub.key, hub.crt         the workers port's server certificate (CA-signed, DNS name HUB_SERVER_NAME)
  enrol.key, enrol.crt     the enrolment port's self-signed certificate; a join token carries its SHA-256, so a
                           worker that has nothing yet still authenticates the host before presenting its token

A worker's certificate names it in its common name, set by the host at enrolment (a name in the CSR is ignored),
and its serial number is what revocation refuses. It lives `limits.WORKER_CERT_SECONDS` (30 days by default); the
worker renews it over its authenticated connection at RENEW_AT of its lifetime (`renew_at`), with a new key.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agenthost.host.access.private_files import make_private_dir, read_private, write_private
from agenthost.protos import errors

# The names the workers port's and the enrolment port's certificates carry; the worker checks the host against
# them (and the CA, or the pin), never against the DNS name or address it dialled, which a worker behind NAT or a
# host behind a load balancer would not share.
HUB_SERVER_NAME = "agenthost-host"
ENROL_SERVER_NAME = "agenthost-enrol"
CA_DAYS = 3650
HUB_DAYS = 825
# Certificates start this long before they are signed: a worker's clock a little behind still accepts them.
BACKDATE = datetime.timedelta(minutes=5)
# A worker renews its certificate once this share of its lifetime (from signing, the backdating aside) has passed.
RENEW_AT = 2 / 3
# A worker's name: its certificate's common name, in `workers list` and on every run it serves.
WORKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
JOIN_PREFIX = "ahj1"
# The only TLS version either worker port accepts. grpcio's Python API sets no minimum version (grpc-core offers
# TLS 1.2 and 1.3, and `grpc.ssl_server_credentials` has no knob for it), so a peer that negotiated anything else
# is refused on its first call, before any request message is read, from the version grpc-core records in the
# call's auth context.
TLS_VERSION = b"TLSv1.3"


def require_tls13(auth_context: dict[str, list[bytes]]) -> None:
    """Unauthenticated unless the call's connection negotiated TLS 1.3. A missing version (a grpcio too old to
    record it) is refused too: the rule must not hold only when it can be checked."""
    versions = auth_context.get("ssl_tls_version") or [b"unknown"]
    if versions[0] != TLS_VERSION:
        raise errors.Unauthenticated(
            f"this connection negotiated {versions[0].decode(errors='replace')}; the host accepts TLS 1.3 only"
            " (upgrade the TLS library of the client)"
        )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: float
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _server_cert(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey, days: int
) -> x509.Certificate:
    return (
        _builder(name, issuer, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(signer, hashes.SHA256())
    )


def pin_of(cert_pem_bytes: bytes) -> str:
    """The SHA-256 of a certificate's DER encoding, base64url without padding: what a join token pins."""
    der = x509.load_pem_x509_certificate(cert_pem_bytes).public_bytes(serialization.Encoding.DER)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class JoinToken:
    """What `workers token create` prints: `ahj1.<enrolment port>.<pin>.<secret>`. The port and the pin let a
    worker that holds nothing but the token reach the enrolment port and know it is this host's."""

    enrol_port: int
    pin: str
    secret: str

    def __str__(self) -> str:
        return f"{JOIN_PREFIX}.{self.enrol_port}.{self.pin}.{self.secret}"

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        parts = text.strip().split(".")
        if len(parts) != 4 or parts[0] != JOIN_PREFIX or not parts[1].isdigit() or not parts[2] or not parts[3]:
            raise errors.InvalidArgument(
                "this is not an agenthost join token (ahj1.PORT.PIN.SECRET); make one on the host with"
                " `agenthost workers token create`"
            )
        return cls(int(parts[1]), parts[2], parts[3])

    @staticmethod
    def new_secret() -> str:
        return secrets.token_urlsafe(32)


class HostCA:
    """The host's CA and its two server identities, created at first use and kept in `<data>/workers/`.

    Rolling the CA (`agenthost workers ca begin-roll`, then `finish-roll`): `begin_roll` makes the next CA
    (`ca-next.key`, `ca-next.crt`). From then on workers' certificates are signed by it, the workers port accepts
    client certificates of either CA, and workers are given both as their trust bundle, while the workers port's
    own certificate is still the current CA's. Once every worker has renewed (`workers rotate`), `finish_roll` makes
    the next CA the CA: the old key is deleted, the workers port gets a certificate of the new CA, and a client
    certificate of the old one is refused. Each step is two file moves, key first; a stop between them is finished
    at the next load."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = make_private_dir(data_dir / "workers")
        # Bumped at each change of what the workers port presents or trusts (hub.py serves new handshakes with it).
        self.generation = 0
        self._load()
        self.enrol_key_pem, self.enrol_cert_pem = self._load_or_make_server("enrol", ENROL_SERVER_NAME, signed=False)
        self.enrol_pin = pin_of(self.enrol_cert_pem)

    def _load(self) -> None:
        self._finish_moves()
        self._key, self.ca_cert = self._load_ca("ca") or self._make_ca("ca")
        self.ca_pem = cert_pem(self.ca_cert)
        self._next = self._load_ca("ca-next")
        # What the workers port trusts for client certificates, and what workers are given to trust the host by.
        self.trust_pem = self.ca_pem + (cert_pem(self._next[1]) if self._next else b"")
        self.trusted_issuers = {self.ca_cert.subject} | ({self._next[1].subject} if self._next else set())
        self.hub_key_pem, self.hub_cert_pem = self._load_or_make_server("hub", HUB_SERVER_NAME, signed=True)
        self.generation += 1

    def _finish_moves(self) -> None:
        """A roll step stopped between its two moves: a `.key` without its `.crt` is a step not taken (dropped), a
        `.crt` whose key has moved is moved after it."""
        key, cert = self.dir / "ca-next.key", self.dir / "ca-next.crt"
        if cert.exists() and not key.exists():
            os.replace(cert, self.dir / "ca.crt")
        elif key.exists() and not cert.exists():
            key.unlink()

    def _load_ca(self, stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
        key_path, cert_path = self.dir / f"{stem}.key", self.dir / f"{stem}.crt"
        if not (key_path.exists() and cert_path.exists()):
            return None
        key = serialization.load_pem_private_key(read_private(key_path), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC key")
        return key, x509.load_pem_x509_certificate(read_private(cert_path))

    def _make_ca(self, stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = new_key()
        name = _name(f"agenthost workers CA {secrets.token_hex(4)}")
        cert = (
            _builder(name.rfc4514_string().removeprefix("CN="), name, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_private(self.dir / f"{stem}.key", key_pem(key))  # the key first: a crt without its key is made again
        write_private(self.dir / f"{stem}.crt", cert_pem(cert))
        return key, cert

    def _load_or_make_server(self, stem: str, name: str, *, signed: bool) -> tuple[bytes, bytes]:
        key_path, cert_path = self.dir / f"{stem}.key", self.dir / f"{stem}.crt"
        if key_path.exists() and cert_path.exists():
            cert_bytes = read_private(cert_path)
            cert = x509.load_pem_x509_certificate(cert_bytes)
            fresh = cert.not_valid_after_utc - _now() > datetime.timedelta(days=30)
            if fresh and (not signed or cert.issuer == self.ca_cert.subject):
                return read_private(key_path), cert_bytes
        key = new_key()
        if signed:
            cert = _server_cert(name, key, self.ca_cert.subject, self._key, HUB_DAYS)
        else:
            cert = _server_cert(name, key, _name(name), key, HUB_DAYS)
        write_private(key_path, key_pem(key))
        write_private(cert_path, cert_pem(cert))
        return key_pem(key), cert_pem(cert)

    # ---- rolling the CA ----

    @property
    def next_ca(self) -> x509.Certificate | None:
        return self._next[1] if self._next else None

    @property
    def rolling_since(self) -> float:
        """When the roll under way began (its CA's signing time); 0 when none is."""
        if self._next is None:
            return 0.0
        return self._next[1].not_valid_before_utc.timestamp() + BACKDATE.total_seconds()

    def begin_roll(self) -> None:
        if self._next is not None:
            raise errors.FailedPrecondition(
                "a CA roll is already under way; renew every worker (`agenthost workers rotate NAME`), then"
                " `agenthost workers ca finish-roll`"
            )
        self._make_ca("ca-next")
        self._load()

    def finish_roll(self) -> None:
        if self._next is None:
            raise errors.FailedPrecondition("no CA roll is under way; begin one with `agenthost workers ca begin-roll`")
        os.replace(self.dir / "ca-next.key", self.dir / "ca.key")
        os.replace(self.dir / "ca-next.crt", self.dir / "ca.crt")
        self._load()

    def sign_worker(self, csr_pem: bytes, name: str, lifetime_seconds: float) -> x509.Certificate:
        """A client certificate for worker `name` over the CSR's public key, valid `lifetime_seconds`. The CSR must
        be signed by that key (the worker holds it) and be EC P-256; its subject is ignored: the host names the
        worker."""
        public = load_csr(csr_pem).public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)  # load_csr refuses any other
        # During a roll, by the next CA: the certificate outlives the current one.
        key, ca = self._next or (self._key, self.ca_cert)
        return (
            _builder(name, ca.subject, public, lifetime_seconds / 86400)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256())
        )


def load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """A worker's CSR, refused unless it is PEM, signed by its own key, and for an EC P-256 key."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise errors.InvalidArgument(f"csr_pem is not a PEM certificate request: {exc}") from None
    if not csr.is_signature_valid:
        raise errors.InvalidArgument("the certificate request is not signed by its own key")
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise errors.InvalidArgument("the certificate request must be for an EC P-256 key")
    return csr


def refuse_other_names(csr_pem: bytes, name: str) -> None:
    """A renewal's CSR may name its worker or nobody: a common name or a subject alternative name of anything else
    is refused (the certificate is named from the host's record either way; a request for another name is a worker
    trying, and is said so rather than quietly signed)."""
    csr = load_csr(csr_pem)
    named = [str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        pass
    else:
        named += [str(getattr(entry, "value", entry)) for entry in san]
    others = sorted({n for n in named if n != name})
    if others:
        raise errors.InvalidArgument(
            f"worker {name!r} asked for a certificate naming {', '.join(map(repr, others))[:200]}; a worker renews"
            " only its own certificate"
        )


def validity(cert_pem_bytes: bytes) -> tuple[float, float]:
    """(not_before, not_after) of a certificate, UNIX seconds."""
    cert = x509.load_pem_x509_certificate(cert_pem_bytes)
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def renew_at(cert_pem_bytes: bytes) -> float:
    """When a worker renews this certificate: RENEW_AT of the way from its signing to its expiry."""
    not_before, not_after = validity(cert_pem_bytes)
    signed = min(not_after, not_before + BACKDATE.total_seconds())
    return signed + RENEW_AT * (not_after - signed)


def make_csr(key: ec.EllipticCurvePrivateKey, name: str) -> bytes:
    """The worker's certificate request: its public key, signed by its key (which never leaves the worker)."""
    csr = x509.CertificateSigningRequestBuilder().subject_name(_name(name)).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def common_name(cert_pem_bytes: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem_bytes)
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def serial_hex(cert: x509.Certificate | bytes) -> str:
    if isinstance(cert, bytes):
        cert = x509.load_pem_x509_certificate(cert)
    return format(cert.serial_number, "x")
