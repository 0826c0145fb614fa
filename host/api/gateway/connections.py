"""The gateway's listener: agenthost.protos.listeners (the one rule for an HTTP listener untrusted clients reach)
with the gateway's caps from host/limits.py, its refusals in the OpenAI error shape and logged through the host's
refusal limiter.

A flood of thousands of silent connections used to run the host out of descriptors (the gateway, the run API and
the operator's admin.sock with it); and one address, or a client with no key sending a request every few seconds
on each connection, could hold every connection under the cap. See docs/operating/walls.md."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from agenthost.host import limits
from agenthost.host.ops.logs import RefusalLimiter, log_limited
from agenthost.protos.listeners import CappedSite, Caps, Clients, Network

log = logging.getLogger(__name__)

__all__ = ["CLIENTS", "CappedSite", "authenticated", "gateway_clients", "openai_refusal"]

CLIENTS = web.AppKey("clients", Clients)


def caps() -> Caps:
    total, _ = limits.listener_caps()
    return Caps(
        total,
        limits.GATEWAY_MAX_CONNECTIONS_PER_ADDRESS,
        limits.GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS,
        (
            "GATEWAY_MAX_CONNECTIONS, at most a quarter of the descriptor limit",
            "GATEWAY_MAX_CONNECTIONS_PER_ADDRESS",
            "GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS",
        ),
        "`Authorization: Bearer <key>`",
    )


def gateway_clients(trusted_proxies: tuple[Network, ...]) -> Clients:
    refusals = RefusalLimiter()

    def logged(address: str, why: str) -> None:
        log_limited(refusals, log, "gateway-address-cap", logging.WARNING, "gateway: refused %s: %s", address, why)

    return Clients(caps, trusted_proxies, logged)


def openai_refusal(status: int, message: str, code: str) -> bytes:
    kind = "server_error" if status >= 500 else "rate_limit_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def authenticated(request: web.Request) -> None:
    """Marks the request's connection as one that showed a key (Clients.authenticated), from any sub-app."""
    clients = request.config_dict.get(CLIENTS)
    if clients is not None:
        clients.authenticated(request)
