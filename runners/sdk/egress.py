"""Network for a sandbox that needs some (a harness's model API, a shell command granted `network: true`): a
network namespace of its own, whose only way out is a proxy the runner runs, which lets through what the
binding allows and nothing else. The host's loopback (the gateway, a database, a metrics endpoint) and its
abstract unix sockets (which belong to a network namespace) are never reachable from inside.

How a connection leaves:

1. The sandbox gets `--unshare-net`: a loopback of its own and no other interface.
2. The sandbox's first process is `egress_forward.py` (stdlib only, the runner's Python), which then execs the
   command. It listens on 127.0.0.1:<port> in the sandbox's namespace and relays each connection to a unix socket
   bound into the sandbox as a single file: the runner's egress proxy, or (for the harness's MCP endpoint) the
   endpoint's own socket. A forward may open with a `CONNECT host:port` to the proxy itself, so a configured
   endpoint on the host's loopback (a local gateway, the tests' fake APIs) stays at its own URL inside.
3. The command gets HTTPS_PROXY / HTTP_PROXY / ALL_PROXY (both cases) = http://127.0.0.1:<proxy port>, and
   NO_PROXY naming loopback only when something is forwarded there.
4. The proxy (`EgressProxy`, in the runner's event loop, one per allow list) speaks HTTP CONNECT and absolute-form
   plain HTTP. It lets through a host:port the policy allows, resolves the name itself, refuses loopback,
   private, link-local and other non-public addresses unless that exact host:port is one of the binding's
   configured endpoints, and connects to the address it checked (a name that resolves differently a moment later
   changes nothing). Everything else gets a 403 whose body names the host and the setting that would allow it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agenthost.plugins.sandbox import Sandbox

log = logging.getLogger("agenthost.egress")

FORWARDER = str(Path(__file__).with_name("egress_forward.py"))
# The forwarder's pid inside the sandbox: bwrap's init is 1, the command (exec'd by the forwarder) 2, and the
# forwarder's serving child, the namespace's first fork, 3.
FORWARDER_PID = 3
# Where the proxy listens inside a sandbox. Any port works there (the namespace is empty); one that no
# configured endpoint uses is picked, and it is the same every time so a kept process's fingerprint holds.
PROXY_PORT = 3128
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 30.0
RELAY_CHUNK = 64 * 1024
# Connections one proxy relays at once: a sandbox opening sockets in a loop stops here, not at the runner's fds.
MAX_CONNECTIONS = 256
_HOST_NAME = re.compile(r"^[a-z0-9._-]{1,253}$")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"upgrade"})


def split_host(host: str) -> str:
    """A host as the policy compares it: lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().strip("[]").rstrip(".").lower()


def url_endpoint(url: str) -> tuple[str, int] | None:
    """(host, port) of an http(s) URL (default ports filled in), or None when it names none."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return split_host(parts.hostname), port or (443 if parts.scheme == "https" else 80)


def is_loopback_name(host: str) -> bool:
    host = split_host(host)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


# IPv6 prefixes whose last 32 bits are an IPv4 address that a gateway or the kernel may deliver to: NAT64's
# well-known and local-use prefixes (RFC 6052, 8215: an IPv6-only network's NAT64 translates 64:ff9b::10.0.0.1 to
# 10.0.0.1), IPv4-compatible (::/96) and SIIT's IPv4-translated (::ffff:0:0:0/96). Python 3.11 calls them global.
_EMBEDS_IPV4 = tuple(ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96"))


def _public(address: str) -> bool:
    """Whether an address is public, and so is every IPv4 address it carries (mapped, NAT64, 6to4, Teredo …):
    a private or loopback address is never reached through a translation of it."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
        if any(ip in net for net in _EMBEDS_IPV4):
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if any(v4 is not None and not _public(str(v4)) for v4 in embedded):
            return False
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_domain_pattern(pattern: str) -> str:
    """A valid allow-list entry (`host`, `*.suffix`, either with `:port`), normalised; ValueError otherwise."""
    value = pattern.strip().lower()
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise ValueError(f"{pattern!r}: the port must be a number from 1 to 65535")
    bare = host[2:] if host.startswith("*.") else host
    labels = bare.split(".")
    if not _HOST_NAME.match(bare) or any(not label or len(label) > 63 for label in labels):
        raise ValueError(f"{pattern!r} is not a host name, `*.example.com`, or either with `:port`")
    return value


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach through the proxy."""

    # host:port pairs the binding itself configured (the model endpoint, its MCP servers): allowed on any address,
    # the host's loopback included, because the binding's administrator named them.
    endpoints: tuple[tuple[str, int], ...] = ()
    # Allow-list entries (`host`, `*.suffix`; `:port`, else 80 and 443): public addresses only.
    domains: tuple[str, ...] = ()
    # No domain list at all: any public host (ports 80 and 443). Loopback and private addresses stay closed.
    any_public: bool = False
    # The binding setting a refusal names, so the user knows what to change.
    setting: str = "network.allowed_domains"

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:20]

    def is_endpoint(self, host: str, port: int) -> bool:
        return (split_host(host), port) in self.endpoints

    def refusal(self, host: str, port: int) -> str | None:
        """Why `host:port` is not allowed by name, or None when it is (its addresses are checked later)."""
        if self.is_endpoint(host, port):
            return None
        host = split_host(host)
        with contextlib.suppress(ValueError):
            if not _public(host):
                return _NOT_PUBLIC.format(what="it is")
        for pattern in self.domains:
            name, _, want = pattern.rpartition(":") if pattern.count(":") == 1 else (pattern, "", "")
            ports = (int(want),) if want else (80, 443)
            hit = host.endswith(name[1:]) if name.startswith("*.") else host == name
            if hit and port in ports:
                return None
        if self.any_public and port in (80, 443):
            return None
        allowed = [f"{h}:{p}" for h, p in self.endpoints] + list(self.domains)
        if self.any_public:
            allowed.append("any public host on ports 80 and 443")
        listed = ", ".join(allowed) if allowed else "nothing"
        return f"not on this sandbox's allow list ({listed}). To allow it, add it to `{self.setting}` in the binding"


_NOT_PUBLIC = (
    "{what} a loopback, private or link-local address, which a sandbox never reaches (only an endpoint the binding "
    "itself configures, such as a harness's base_url, may be one)"
)


def _response(status: str, message: str) -> bytes:
    body = (message + "\n").encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\nX-Agenthost-Egress: refused\r\n\r\n"
    ).encode() + body


class EgressProxy:
    """One allow list's proxy on a unix socket. Every connection is one request: a CONNECT, or an absolute-form
    plain-HTTP request (sent on with `Connection: close`, so the next request comes on a new connection and is
    checked again)."""

    def __init__(self, policy: EgressPolicy, path: str) -> None:
        self.policy = policy
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._accept, self.path, limit=HEAD_LIMIT)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tasks) >= MAX_CONNECTIONS:
            writer.write(
                _response(
                    "503 Service Unavailable",
                    f"agenthost egress proxy: over {MAX_CONNECTIONS} "
                    "connections at once from this sandbox's binding; close some and retry",
                )
            )
            writer.close()
            return
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, asyncio.LimitOverrunError):
            pass
        except Exception:  # noqa: BLE001 — one bad connection never takes the proxy down
            log.warning("egress proxy: connection failed", exc_info=True)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3:
            writer.write(_response("400 Bad Request", "agenthost egress proxy: malformed request line"))
            return
        method, target, version = parts
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            if not host or not port_text.isdigit():
                writer.write(_response("400 Bad Request", f"agenthost egress proxy: bad CONNECT target {target!r}"))
                return
            host, port, path = split_host(host), int(port_text), ""
        else:
            endpoint = url_endpoint(target) if target.startswith("http://") else None
            if endpoint is None:
                writer.write(
                    _response(
                        "400 Bad Request",
                        "agenthost egress proxy: only CONNECT and absolute http:// requests go through this proxy",
                    )
                )
                return
            host, port = endpoint
            split = urlsplit(target)
            path = (split.path or "/") + (f"?{split.query}" if split.query else "")
        address, why = await self._resolve(host, port)
        if address is None:
            message = f"agenthost egress proxy refused {host}:{port}: {why}."
            log.info("%s", message)
            writer.write(_response("403 Forbidden", message))
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(open_upstream(address, port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            writer.write(_response("502 Bad Gateway", f"agenthost egress proxy: cannot reach {host}:{port}: {exc}"))
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                kept = [
                    line
                    for line in rest.split(b"\r\n")
                    if line and line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS
                ]
                up_writer.write(
                    b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *kept, b"Connection: close"])
                    + b"\r\n\r\n"
                )
            await _relay(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _resolve(self, host: str, port: int) -> tuple[str | None, str]:
        """The address to connect to, or None and why not."""
        why = self.policy.refusal(host, port)
        if why is not None:
            return None, why
        try:
            addresses = await lookup(host, port)
        except OSError as exc:
            return None, f"the name does not resolve ({exc})"
        if self.policy.is_endpoint(host, port):
            return (addresses[0], "") if addresses else (None, "the name does not resolve")
        for address in addresses:
            if _public(address):
                return address, ""
        return None, _NOT_PUBLIC.format(what=f"it resolves to {', '.join(sorted(set(addresses)))},")


async def lookup(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, in the resolver's order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def open_upstream(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the address the proxy checked (never the name again: it could resolve elsewhere now)."""
    return await asyncio.open_connection(address, port, limit=RELAY_CHUNK)


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(RELAY_CHUNK):
                dst.write(chunk)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.transport.abort()

    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


# ---- the runner's proxies ----


class _Registry:
    """The proxies of one event loop, by policy. Proxies live as long as the loop (a runner's); their sockets sit
    in a directory only this process's uid can enter."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.proxies: dict[str, EgressProxy] = {}
        self.lock = asyncio.Lock()


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Registry] = weakref.WeakKeyDictionary()
_private_dir: str | None = None


def private_dir() -> str:
    """This process's directory for egress and bridge sockets (short: unix socket paths cap at ~107 bytes)."""
    global _private_dir
    if _private_dir is None or not os.path.isdir(_private_dir):
        _private_dir = tempfile.mkdtemp(prefix="ah-egress-")
        atexit.register(shutil.rmtree, _private_dir, True)
    return _private_dir


async def proxy_for(policy: EgressPolicy) -> EgressProxy:
    """The running proxy for `policy` in this event loop, started on first use."""
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = _Registry(tempfile.mkdtemp(prefix="l", dir=private_dir()))
    async with registry.lock:
        proxy = registry.proxies.get(policy.key)
        if proxy is None:
            proxy = EgressProxy(policy, os.path.join(registry.directory, f"{policy.key}.sock"))
            await proxy.start()
            registry.proxies[policy.key] = proxy
    return proxy


# ---- the sandbox side ----


def forwarder_paths() -> list[str]:
    """What the sandbox must show for the forwarder to run: the runner's Python installation and the script."""
    return [sys.base_prefix, os.path.realpath(sys.executable), FORWARDER]


@dataclass
class EgressSandbox(Sandbox):
    """A Sandbox whose command reaches the network only through the runner's egress proxy (module docstring).
    Its fields are plain data, so equal settings give an equal repr (a kept process's fingerprint)."""

    egress_socket: str = ""
    proxy_port: int = PROXY_PORT
    # Processes of the sandbox's own, by pid inside it: not the command's, whatever it left behind.
    helper_pids: tuple[int, ...] = (FORWARDER_PID,)
    # (port inside, unix socket outside, CONNECT target through it or "" for a raw relay)
    forwards: tuple[tuple[int, str, str], ...] = field(default_factory=tuple)

    def with_forward(self, port: int, socket_path: str, target: str = "") -> EgressSandbox:
        return dataclasses.replace(self, forwards=(*self.forwards, (port, socket_path, target)))

    def argv(self, command: list[str], *, bwrap: str | None = None) -> list[str]:
        spec = [[self.proxy_port, self.egress_socket, ""], *[list(f) for f in self.forwards]]
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        no_proxy = ",".join(_LOOPBACK_NAMES) if self.forwards else ""
        env = [(name, proxy) for name in _PROXY_VARS] + [("NO_PROXY", no_proxy), ("no_proxy", no_proxy)]
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(Sandbox)}
        base["network"] = False  # its own namespace: the forwarder is the only way out
        base["ro"] = [*self.ro, *forwarder_paths(), *{s for _, s, _ in spec}]
        base["extra"] = (*self.extra, *(arg for name, value in env for arg in ("--setenv", name, value)))
        forwarder = [os.path.realpath(sys.executable), "-I", "-S", FORWARDER]
        forwarder += [str(arg) or "-" for entry in spec for arg in entry] + ["--"]
        return Sandbox(**base).argv([*forwarder, *command], bwrap=bwrap)


def free_port(taken: Iterable[int], start: int = PROXY_PORT) -> int:
    used = set(taken)
    port = start
    while port in used:
        port += 1
    return port


async def egress_sandbox(sandbox: Sandbox, policy: EgressPolicy) -> EgressSandbox:
    """`sandbox` with the network replaced by the proxy for `policy`; every configured endpoint on the host's
    loopback is forwarded at its own port, so its URL works unchanged inside."""
    proxy = await proxy_for(policy)
    # One forward per port: two names of the loopback at one port are the same service.
    loopback = {p: h for h, p in sorted(policy.endpoints, reverse=True) if is_loopback_name(h)}
    forwards = tuple((p, proxy.path, f"[{h}]:{p}" if ":" in h else f"{h}:{p}") for p, h in sorted(loopback.items()))
    base = {f.name: getattr(sandbox, f.name) for f in dataclasses.fields(Sandbox)}
    return EgressSandbox(
        **base,
        egress_socket=proxy.path,
        proxy_port=free_port(loopback),
        forwards=forwards,
    )
