"""Webhook mode: Telegram posts updates to the adapter, which answers each with the status it deserves (see
channels/telegram/webhook.py). Posted here the way Telegram would, to the real adapter process."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
SECRET = "X-Telegram-Bot-Api-Secret-Token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_webhook_answers_every_update_with_its_status(world: World) -> None:
    port = free_port()
    await world.add_channel(
        mode="webhook", webhook_url="https://bot.example.org/tg", webhook_listen=f"127.0.0.1:{port}"
    )
    fake = world.fake
    await fake.wait_for(lambda f: bool(f.webhook))
    assert fake.webhook["url"] == "https://bot.example.org/tg" and fake.webhook["max_connections"] == 1
    secret = fake.webhook["secret_token"]
    url = f"http://127.0.0.1:{port}/tg"
    good = {"update_id": 5000, "message": fake.message("hello by webhook", chat_id=42)}

    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:

        async def post(body: object, token: str = secret, raw: bytes | None = None) -> httpx.Response:
            content = raw if raw is not None else json.dumps(body).encode()
            headers = {"X-Telegram-Bot-Api-Secret-Token": token, "Content-Type": "application/json"}
            return await client.post(url, content=content, headers=headers)

        assert (await post(good, token="guessed")).status_code == 401
        assert (await post(None, raw=b"{not json")).status_code == 400
        assert (await post(None, raw=b"x" * (2 * 1024 * 1024))).status_code == 413
        assert (await post({"message": {"text": "no update id"}})).status_code == 400
        assert (await post({"update_id": 4999, "message": "junk"})).status_code == 400
        first = await post(good)
        assert first.status_code == 200 and first.json()["result"] == "sent"
        again = await post(good)  # Telegram resends what it thinks undelivered
        assert again.status_code == 200 and again.json()["result"] == "duplicate"
        other = {"update_id": 5001, "message": fake.message("from a stranger", chat_id=777)}
        assert (await post(other)).json()["result"] == "sent"
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1 and len(f.chat_text(777)) == 1)
    assert [s.text for s in Scripted.seen] == ["hello by webhook", "from a stranger"]
    assert not fake.of("getUpdates")[1:]  # no polling in webhook mode (only none, or the first before setWebhook)


async def test_a_flood_of_connections_leaves_telegrams_update_a_way_in(world: World) -> None:
    """The listener had no cap: anyone reaching the port held as many connections as they liked, each for aiohttp's
    75 s. Now one address holds at most MAX_UNAUTHENTICATED_PER_ADDRESS connections that have not sent the secret
    (the rest answered 429 and closed at once), a request without the secret closes its connection, and an update
    posted meanwhile from another address is handled."""
    from agenthost.channels.telegram import webhook

    port = free_port()
    await world.add_channel(
        mode="webhook",
        webhook_url="https://bot.example.org/tg",
        webhook_listen=f"127.0.0.1:{port}",
        webhook_trusted_proxies=["127.0.0.9"],  # a proxy elsewhere: the flood's peers are their own clients
    )
    fake = world.fake
    await fake.wait_for(lambda f: bool(f.webhook))
    secret = fake.webhook["secret_token"]
    flood = []
    try:
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(100):
                flood.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
        ends = [asyncio.ensure_future(r.read()) for r, _ in flood]
        refused_at_least = 200 - 2 * webhook.MAX_UNAUTHENTICATED_PER_ADDRESS
        deadline = time.monotonic() + 30
        while sum(e.done() for e in ends) < refused_at_least:
            assert time.monotonic() < deadline, f"{sum(e.done() for e in ends)} of 200 refused"
            await asyncio.sleep(0.05)
        refused = [e.result() for e in ends if e.done()]
        assert all(b.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in b for b in refused), refused[:1]
        assert b"MAX_UNAUTHENTICATED_PER_ADDRESS = 8" in refused[0] and SECRET.encode() in refused[0], refused[0]
        # Telegram, from its own address, still gets its update through; a guess at the secret does not keep its
        # connection.
        url = f"http://127.0.0.1:{port}/tg"
        update = {"update_id": 6000, "message": fake.message("through the flood", chat_id=42)}
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            r = await client.post(url, json=update, headers={SECRET: secret})
            assert r.status_code == 200 and r.json()["result"] == "sent", r.text
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(timeout=30, trust_env=False, transport=transport) as client:
            r = await client.post(url, json=update, headers={SECRET: "guessed"})
            assert r.status_code in (401, 429) and r.headers["connection"] == "close", r.text
        await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    finally:
        for _, w in flood:
            w.close()
