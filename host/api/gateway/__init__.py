"""The host's HTTP gateway: OpenAI-compatible endpoints in front of the host's bots (`serve --gateway HOST:PORT`).

Off unless configured. It runs inside the host process, on the host's event loop, and calls the host's own objects
(`host.runs.send`, the registry, the run store): no hop through gRPC to itself. Its bearer keys are the admin
surface's credentials (agenthost.host.access.credentials): a "send" credential reaches the bots it names, the full-admin
token every bot.

    app.py         the aiohttp server: authentication, body limits, routing, error mapping, the run loops
    openai_api.py  the OpenAI wire shapes: request parsing, response objects and stream chunks, text assembly
    sse.py         server-sent events with bounded, stall-limited writes
    errors.py      OpenAI's error JSON and the mapping from agenthost's typed errors to HTTP statuses
    console_api.py the web console under /console/: its JSON API and static pages (console_static/)
    console_auth.py the console's sessions, CSRF checks and security headers (admin credentials only)
    admin_calls.py admin operations called in-process, through the same AdminServicer as the CLI's

This module imports nothing heavy: the host imports `app` (and with it aiohttp) only when the gateway is enabled.
"""

from __future__ import annotations

DEFAULT_BIND = "127.0.0.1"


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` or `PORT` (both loopback), `[::1]:PORT` for IPv6. Port 0 picks a free port."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or DEFAULT_BIND
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"gateway address must look like 127.0.0.1:8080, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"gateway port out of range in {text!r}")
    return host, number
