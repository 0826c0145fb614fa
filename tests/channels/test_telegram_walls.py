"""The Telegram adapter behind the host's channel walls, end to end: a chat whose conversation someone else started
(here the CLI) is refused with one line, and `/new` carries on; a link a model writes is never fetched by Telegram
to preview it."""

from __future__ import annotations

import pytest
from aiohttp import web
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


async def test_a_link_the_model_writes_is_not_fetched_for_a_preview(world: World) -> None:
    """Telegram previews a message's first link by fetching it from its own servers, with nobody clicking: a model
    steered into writing a link with the conversation in its query would carry it off past every egress wall of
    the run's sandbox. The adapter asks for no previews, on every message and edit."""
    fetched: list[str] = []

    async def page(request: web.Request) -> web.Response:
        fetched.append(str(request.rel_url))
        return web.Response(text="<title>attacker</title>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await world.add_channel()
        fake = world.fake
        link = f"http://127.0.0.1:{port}/collect"
        await fake.push(fake.message(f"link {link}", chat_id=42))
        expected = f"Here is your summary: {link}?notes=a+secret+plan"
        await fake.wait_for(lambda f: f.chat_text(42) == [expected])
        await world.settled()
        assert fetched == [] and fake.previews == []
        texts = fake.of("sendMessage", "editMessageText")
        assert texts and all(c.params.get("link_preview_options") == {"is_disabled": True} for c in texts)
    finally:
        await runner.cleanup()


async def test_a_stranger_cannot_flood_the_adapters_log(world: World) -> None:
    """Each message of a user the bot does not serve, and each button press with data the adapter never made (a
    modified client sends any), was a line in the adapter's log: any Telegram user could write it without limit and
    roll its history (5 MiB x 3) away. Now 20 lines a kind a minute, then one line counting the rest."""
    await world.add_channel(allowed_users=[42])
    fake = world.fake
    for i in range(150):
        await fake.push(fake.message(f"let me in {i}", chat_id=777))
        await fake.press(chat_id=777, message_id=1, data=f"ap:forged{i}", user=fake.user(777))
    await fake.push(fake.message("hello", chat_id=42))  # handled after all of them: updates arrive in order
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    log = world.log()
    strangers = [line for line in log.splitlines() if "is not allowed to use this bot" in line]
    forged = [line for line in log.splitlines() if "did not make" in line]
    assert 0 < len(strangers) <= 20 and 0 < len(forged) <= 20, (len(strangers), len(forged))


async def test_one_chat_user_cannot_take_the_channels_queue_from_the_other_chats(world: World, monkeypatch) -> None:
    """A channel is one sender for all its chats: one user writing fast (opening conversation after conversation
    with /new, past the per-conversation cap) filled the channel's whole queue share (RUNS_MAX_QUEUED_PER_SENDER),
    and every other chat's message was refused "busy". Now one chat user holds at most RUNS_MAX_QUEUED_PER_END_USER
    of it (here 3 of 6): their own next messages are refused, another chat is still answered."""
    from agenthost.host import limits

    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_PER_SENDER", 6)
    monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_PER_END_USER", 3)
    await world.add_channel()
    fake = world.fake
    for text in ["wait"] * 4 + ["/new"] + ["wait"] * 4:  # each conversation: one running, the rest queued
        await fake.push(fake.message(text, chat_id=777))
    await fake.push(fake.message("hello", chat_id=42))  # handled after all of them: updates arrive in order

    def answered(f) -> bool:  # type: ignore[no-untyped-def]
        seen = f.chat_text(42)
        return bool(seen) and (seen[0].startswith("⚠️") or seen[0] == "You said: hello")

    await fake.wait_for(answered)
    assert world.fake.chat_text(42) == ["You said: hello"]
    busy = [line for line in fake.chat_text(777) if "busy" in line]
    assert len(busy) == 4, fake.chat_text(777)  # the second conversation's four: the user's share was full
    assert Scripted.gate is not None
    Scripted.gate.set()
    await world.settled()
