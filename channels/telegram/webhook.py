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
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY = 1024 * 1024  # an update is a few KiB; a file's bytes never travel in one


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host or "127.0.0.1", int(port)


class Webhook:
    def __init__(self, handle: Callable[[Any], Awaitable[str]], listen: str) -> None:
        self.handle = handle
        self.listen = listen
        self.secret = secrets.token_urlsafe(32)
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/{path:.*}", self._update)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = parse_listen(self.listen)
        await web.TCPSite(self._runner, host, port).start()
        log.info("webhook listening on %s:%d", host, port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _update(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            return web.json_response({"ok": False, "description": "Unauthorized"}, status=401)
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
