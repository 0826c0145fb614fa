"""A client no gRPC library would be: over one raw HTTP/2 connection to a unix socket it opens N gRPC calls, each
declaring a request of nearly MAX_MESSAGE_BYTES, and sends every byte of them but the last as fast as the server's
flow-control windows let it, then holds them (over TCP with the client certificate given, for the workers port's
mTLS). What it could send is what the server took in and keeps: grpc-core holds a message it is reading until it is
whole. Run as a script (its own process, so the test's host does not share its loop); prints the bytes sent as JSON
once nothing more is let in for a second (`held`), and again when nothing more is for `quiet` seconds (`sent`), then
ends."""

from __future__ import annotations

import json
import select
import socket
import ssl
import struct
import sys
import time

DECLARED = 8 * 1024 * 1024 - 64 * 1024
FRAME = 16384


def _int(value: int, prefix_bits: int) -> bytes:
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([value])
    out, value = [top], value - top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes([*out, value])


def _header(name: str, value: str) -> bytes:  # HPACK: a literal without indexing, new name, no Huffman
    n, v = name.encode(), value.encode()
    return b"\x00" + _int(len(n), 7) + n + _int(len(v), 7) + v


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _connect(path: str, tls: list[str]) -> socket.socket:
    """A unix socket's path, or HOST:PORT with [cert, key, ca, server name] files for mTLS."""
    if not tls:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return sock
    cert, key, ca, server_name = tls
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    host, port = path.rsplit(":", 1)
    return context.wrap_socket(socket.create_connection((host, int(port))), server_hostname=server_name)


def flood(
    path: str, method: str, metadata: list[tuple[str, str]], calls: int, quiet: float, limit: float, tls: list[str]
) -> int:
    sock = _connect(path, tls)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b""))
    headers = b"".join(
        _header(k, v)
        for k, v in [
            (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata,
        ]
    )  # fmt: skip
    initial, connection, window, sent, buffer = 65535, 65535, {}, {}, b""
    for i in range(calls):
        stream = 1 + 2 * i
        sock.sendall(_frame(1, 4, stream, headers) + _frame(0, 0, stream, b"\x00" + struct.pack(">I", DECLARED)))
        window[stream], sent[stream] = initial - 5, 0
        connection -= 5
    started = last = time.monotonic()
    ready = False
    while time.monotonic() - last < quiet and time.monotonic() - started < limit:
        if not ready and time.monotonic() - last > 1:  # the server lets in nothing more for now: say so once
            print(json.dumps({"held": sum(sent.values())}), flush=True)
            ready = True
        moved = False
        for stream in list(window):
            room = min(window[stream], connection, DECLARED - 1 - sent[stream], FRAME)
            if room > 0:
                sock.sendall(_frame(0, 0, stream, bytes(room)))
                window[stream] -= room
                connection -= room
                sent[stream] += room
                moved = True
        if moved:
            last = time.monotonic()
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
        if not pending and not select.select([sock], [], [], 0 if moved else 0.1)[0]:
            continue
        try:
            data = sock.recv(1 << 20)
        except ssl.SSLWantReadError:
            continue
        if not data:
            break
        buffer += data
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            size, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
            stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            payload, buffer = buffer[9 : 9 + size], buffer[9 + size :]
            if kind == 4 and not flags & 1:  # SETTINGS: a new initial window moves every open stream's
                for at in range(0, len(payload), 6):
                    ident, value = struct.unpack(">HI", payload[at : at + 6])
                    if ident == 4:
                        for open_stream in window:
                            window[open_stream] += value - initial
                        initial = value
                sock.sendall(_frame(4, 1, 0, b""))
            elif kind == 8:
                grant = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                if stream == 0:
                    connection += grant
                elif stream in window:
                    window[stream] += grant
            elif kind == 6 and not flags & 1:
                sock.sendall(_frame(6, 1, 0, payload))
            elif kind == 3 or (kind == 1 and flags & 1):  # the call ended (reset, or trailers)
                window.pop(stream, None)
    sock.close()
    return sum(sent.values())


if __name__ == "__main__":
    path, method, metadata, calls, quiet, limit = sys.argv[1:7]
    pairs = [tuple(pair) for pair in json.loads(metadata)]
    sent = flood(path, method, pairs, int(calls), float(quiet), float(limit), sys.argv[7:])  # type: ignore[arg-type]
    print(json.dumps({"sent": sent}))
