"""Transient Bot API failures (a 502 from a proxy in front of Telegram) lose no reply: each call is tried again
with bounded exponential backoff, and a reply still owed after that is delivered by the adapter's background
loop while it runs, not only at its next start. A reply confirmed delivered is never sent again."""

from __future__ import annotations

import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
# Small delays so the test needs no long waits; every wait below is on a condition.
FAST = {"retry_delay": 0.05, "redeliver_interval": 0.3}


def _replies(world: World, text: str) -> list[str]:
    return [t for t in world.fake.chat_text(42) if t == text]


async def test_two_502s_on_send_message_are_retried(world: World) -> None:
    # The owed-reply loop is kept out of it (an hour): only the call's own retries can deliver this reply.
    await world.add_channel(retry_delay=0.2, redeliver_interval=3600)
    fake = world.fake
    fake.fail_next("sendMessage", status=502, count=2)
    await fake.push(fake.message("hello", chat_id=42))
    await fake.wait_for(lambda f: "You said: hello" in f.chat_text(42))
    await world.settled()
    first, second, sent = fake.of("sendMessage")[:3]
    assert (first.status, second.status, sent.status) == (502, 502, 200)
    # Backoff, doubled each time (lower bounds only: a loaded machine only makes the gaps longer).
    assert second.at - first.at >= 0.2 and sent.at - second.at >= 0.4
    assert _replies(world, "You said: hello") == ["You said: hello"]  # once: a 502 sent nothing
    assert len(Scripted.seen) == 1


async def test_a_reply_owed_past_the_retries_is_delivered_while_running(world: World) -> None:
    await world.add_channel(**FAST, streaming=False)
    fake = world.fake
    fake.fail_next("sendMessage", status=502, count=7)  # more than one call's 5 attempts
    await fake.push(fake.message("hello", chat_id=42))
    await fake.wait_for(lambda f: "You said: hello" in f.chat_text(42))
    await world.settled()
    pid = world.process.proc.pid
    assert "delivered the owed reply of run" in world.log()
    assert [c.status for c in fake.of("sendMessage")].count(502) == 7
    # Delivered and confirmed: the loop goes on running (several of its intervals pass, polls are ~1 s apart) and
    # never sends that reply again; the same process did it all (no restart was needed).
    polls = len(fake.of("getUpdates"))
    await fake.wait_for(lambda f: len(f.of("getUpdates")) >= polls + 2)
    assert _replies(world, "You said: hello") == ["You said: hello"]
    assert world.process.proc.pid == pid and world.process.restarts == 0
    assert len(Scripted.seen) == 1
