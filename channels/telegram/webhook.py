"""Webhook mode: Telegram POSTs each update to a URL the adapter registered (`setWebhook`); the adapter serves it
on a local address (behind the reverse proxy that terminates TLS for that URL) and answers each request with the
status the update deserves, so Telegram knows what happened to it:

  401  the request does not carry the secret token this process registered (not from Telegram)
  413  a body over the size limit (refused from Content-Length before reading, or while reading)
  400  not JSON, not an update, or an update that does not parse (Telegram retries a few times, then drops it)
  200  handled, a duplicate of one already handled, ignored (not for the bot, a blocked user), or refused with a
       one-line reply to the user (too long): nothing for Telegram to resend

The secret token is made afresh at every start and registered with `setWebhook` (with `max_connections=1`, so
updates arrive one at a time, in order, and the same offset bookkeeping as long polling holds).

Anyone who reaches the port may connect, so the listener is capped like the host's gateway (one rule:
agenthost.protos.listeners): MAX_CONNECTIONS in all, MAX_CONNECTIONS_PER_ADDRESS per client address and of those
MAX_UNAUTHENTICATED_PER_ADDRESS that have not sent the secret yet; a request without the secret closes its
connection, and a connection must send its request head within HEADER_SECONDS (aiohttp's default is 75 s). Telegram
keeps one connection (`max_connections=1`), so a flood from one address leaves it room. Behind the TLS proxy the
client address is the proxy's unless `webhook_trusted_proxies` names it (then X-Forwarded-For's).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from agenthost.protos.listeners import RETRY_SECONDS, CappedSite, Caps, Clients, Refused, json_body, parse_networks

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY = 1024 * 1024  # an update is a few KiB; a file's bytes never travel in one
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_ADDRESS = 16
MAX_UNAUTHENTICATED_PER_ADDRESS = 8
HEADER_SECONDS = 10.0
CAPS = Caps(
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_UNAUTHENTICATED_PER_ADDRESS,
    (
        "the webhook's MAX_CONNECTIONS",
        "the webhook's MAX_CONNECTIONS_PER_ADDRESS",
        "the webhook's MAX_UNAUTHENTICATED_PER_ADDRESS",
    ),
    f"the {SECRET_HEADER} header",
)


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "127.0.0.1", int(port)


class Webhook:
    def __init__(
        self, handle: Callable[[Any], Awaitable[str]], listen: str, trusted_proxies: Sequence[str] = ()
    ) -> None:
        self.handle = handle
        self.listen = listen
        self.clients = Clients(lambda: CAPS, parse_networks(trusted_proxies, what="webhook_trusted_proxies"))
        self.secret = secrets.token_urlsafe(32)
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._client])
        app.router.add_post("/{path:.*}", self._update)
        # keepalive_timeout is also the request-head timeout: aiohttp arms it when a connection opens.
        self._runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=HEADER_SECONDS, logger=self.clients.server_log
        )
        await self._runner.setup()
        host, port = parse_listen(self.listen)
        await CappedSite(self._runner, host, port, clients=self.clients, render=json_body, reuse_address=True).start()
        log.info("webhook listening on %s:%d", host, port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _client(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The caps of the request's client (Clients); a connection whose request lacked the secret is closed."""
        try:
            client = self.clients.request(request)
        except Refused as exc:
            refused = web.json_response(
                {"ok": False, "description": exc.message}, status=429, headers={"Retry-After": str(RETRY_SECONDS)}
            )
            refused.force_close()
            return refused
        response = await handler(request)
        if not client.authenticated:
            response.force_close()
        return response

    async def _update(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            return web.json_response({"ok": False, "description": "Unauthorized"}, status=401)
        self.clients.authenticated(request)
        if (request.content_length or 0) > MAX_BODY:
            return web.json_response({"ok": False, "description": "Request Entity Too Large"}, status=413)
        try:
            raw = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return web.json_response({"ok": False, "description": "Request Entity Too Large"}, status=413)
        except (ValueError, UnicodeDecodeError):
            log.warning("webhook: a body that is not JSON; refused")
            return web.json_response({"ok": False, "description": "Bad Request: not JSON"}, status=400)
        async with self._lock:  # one update at a time, in arrival order (max_connections=1 makes that Telegram's)
            outcome = await self.handle(raw)
        if outcome == "malformed":
            return web.json_response({"ok": False, "description": "Bad Request: malformed update"}, status=400)
        return web.json_response({"ok": True, "result": outcome})
