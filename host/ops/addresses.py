"""The operator's `HOST:PORT` for every TCP listener the host opens (`serve --gateway`, `serve --metrics`).

One parser, so every listener takes the same forms and says the same thing about a bad one."""

from __future__ import annotations

LOOPBACK = "127.0.0.1"


def parse_address(text: str, *, what: str, example: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT` (both loopback), `[::1]:PORT` for IPv6. Port 0 picks a free port.

    `what` names the listener in the error (`gateway`), `example` shows a good value (`127.0.0.1:8080`)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or LOOPBACK
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{what} address must look like {example}, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{what} port out of range in {text!r}")
    return host, number
