"""Webhook mode: Telegram posts updates to the adapter, which answers each with the status it deserves (see
channels/telegram/webhook.py). Posted here the way Telegram would, to the real adapter process."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


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
