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

from agenthost.host.ops.addresses import parse_address as _parse_address


def parse_address(text: str) -> tuple[str, int]:
    """The gateway's `--gateway` value; the forms are `host.ops.addresses.parse_address`'s."""
    return _parse_address(text, what="gateway", example="127.0.0.1:8080")
