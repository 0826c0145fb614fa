"""A real host with the gateway (and so the console) on a loopback port, and the Helper runner bound to `testbot`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from agenthost.runners.sdk.testing import HostHarness

from .helpers import Helper

CSRF = "X-Agenthost-CSRF"


@dataclass
class Console:
    harness: HostHarness
    url: str  # http://127.0.0.1:PORT/console

    @property
    def host(self):  # type: ignore[no-untyped-def]
        return self.harness.host

    def session(self) -> aiohttp.ClientSession:
        # A cookie jar that keeps cookies set by an IP address (aiohttp's default drops them).
        return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def sign_in(self, client: aiohttp.ClientSession, token: str | None = None) -> str:
        async with client.post(
            f"{self.url}/api/session", json={"token": token or self.host.admin_token}, headers={CSRF: "sign-in"}
        ) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["csrf"]


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[Console]:
    Helper.release = asyncio.Event()
    Helper.holding = asyncio.Event()
    Helper.decisions = []
    async with HostHarness(tmp_path, runners=[Helper], host_options={"gateway_address": "127.0.0.1:0"}) as h:
        yield Console(h, f"http://{h.host.gateway.address}/console")
        Helper.release.set()
