"""The Telegram adapter behind the host's channel walls, end to end: a chat whose conversation someone else started
(here the CLI) is refused with one line, and `/new` carries on."""

from __future__ import annotations

import pytest
from conftest import Scripted, World

from agenthost.protos import host_pb2 as hpb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def test_a_chat_cannot_continue_a_conversation_started_elsewhere(world: World) -> None:
    await world.add_channel()
    fake, client = world.fake, world.harness.client
    cli = await client.send("support", "a secret plan", conversation_id="tg:42")
    await fake.push(fake.message("what was the plan?", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    assert fake.chat_text(42) == [
        "⚠️ This conversation was started elsewhere and cannot be continued here; please start a new one."
    ]
    assert [s.text for s in Scripted.seen] == ["a secret plan"]  # no run read the CLI's conversation out

    await fake.push(fake.message("/new", chat_id=42))
    await fake.push(fake.message("hello", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 3)
    assert fake.chat_text(42)[2] == "You said: hello"
    assert Scripted.seen[-1].conversation_id == "tg:42#1"
    await world.settled()
    runs = (await client.call("ListRuns", hpb.ListRunsRequest(bot="support", limit=100))).runs
    assert sorted(r.conversation_id for r in runs) == ["tg:42", "tg:42#1"]  # the refused message started none
    assert cli.run.run_id in {r.run_id for r in runs}
    assert world.process.restarts == 0
