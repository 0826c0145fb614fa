"""The `world` fixture: a real host with the gateway on a loopback port (see helpers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import TEST_PLUGIN, HostHarness

from .helpers import Talker, World


@pytest.fixture
def gateway_limits() -> None:
    """Caps the host reads once, at start, set before it starts: a test module overrides this fixture."""


@pytest.fixture
def gateway_options() -> dict[str, Any]:
    """More Host options for the gateway (a test module overrides this fixture: trusted proxies)."""
    return {}


@pytest.fixture
async def world(tmp_path: Path, gateway_limits: None, gateway_options: dict[str, Any]) -> AsyncIterator[World]:
    Talker.seen = []
    Talker.release = asyncio.Event()
    Talker.holding = asyncio.Event()
    async with HostHarness(
        tmp_path, runners=[Talker], host_options={"gateway_address": "127.0.0.1:0", **gateway_options}
    ) as h:
        await h.client.call("CreateBot", hpb.CreateBotRequest(name="otherbot"))
        await h.client.bind("otherbot", f"{TEST_PLUGIN}/talker")
        created = await h.client.call(
            "CreateCredential", hpb.CreateCredentialRequest(name="app", scope="send", bots=["testbot"])
        )
        yield World(h, created.token, h.host.admin_token, f"http://{h.host.gateway.address}/v1")
        Talker.release.set()
