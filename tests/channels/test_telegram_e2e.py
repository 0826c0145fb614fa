"""The Telegram adapter end to end: a fake Bot API on loopback, the real adapter in its sandboxed process, a real
host and a scripted runner. Every assertion is about what Telegram was asked to do (the fake's transcript) and
what the host ran."""

from __future__ import annotations

import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def test_private_chat_round_trip_streams_by_editing(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    await fake.push(fake.message("slow please", chat_id=42))
    await fake.wait_for(lambda f: f.chat_text(42) == ["Streaming this reply word by word."])
    # One run, in the chat's conversation, as the Telegram user, from the telegram source.
    assert len(Scripted.seen) == 1
    seen = Scripted.seen[0]
    assert (seen.conversation_id, seen.text, seen.actor_id, seen.display_name, seen.source) == (
        "tg:42",
        "slow please",
        "tg:42",
        "Ada",
        "telegram",
    )
    # Streamed: the first message went out before the run finished, then grew by edits, at most ~4 per second.
    sends, edits = fake.of("sendMessage"), fake.of("editMessageText")
    assert len(sends) == 1 and sends[0].params["text"] != "Streaming this reply word by word."
    assert 1 <= len(edits) <= 8
    texts = [sends[0].params["text"]] + [e.params["text"] for e in edits]
    assert all(b.startswith(a.rstrip()) for a, b in zip(texts, texts[1:], strict=False))
    times = [c.at for c in sends + edits]
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:], strict=False))
    assert fake.of("sendChatAction")


async def test_group_needs_a_mention_or_a_reply(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    group = -1001
    await fake.push(fake.message("just chatting among humans", chat_id=group, chat_type="supergroup"))
    await fake.push(fake.message("@agenthost_test_bot what time is it", chat_id=group, chat_type="supergroup"))
    await fake.push(
        fake.message("and the date?", chat_id=group, chat_type="supergroup", reply_to=fake.bot_message(group))
    )
    await fake.wait_for(lambda f: len(f.chat_text(group)) == 2)
    assert [s.text for s in Scripted.seen] == ["what time is it", "and the date?"]
    assert {s.conversation_id for s in Scripted.seen} == {f"tg:{group}"}
    assert fake.chat_text(group) == ["You said: what time is it", "You said: and the date?"]
    # In a group the answer quotes the message it answers.
    assert fake.of("sendMessage")[0].params["reply_parameters"]["message_id"]


async def test_new_starts_a_fresh_conversation(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    await fake.push(fake.message("hello", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    await fake.push(fake.message("/new", chat_id=42))
    await fake.push(fake.message("hello again", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 3)
    assert [s.conversation_id for s in Scripted.seen] == ["tg:42", "tg:42#1"]
    assert fake.chat_text(42)[1] == "🆕 Started a new conversation."


async def test_long_reply_is_split_at_paragraphs(world: World) -> None:
    await world.add_channel(streaming=False)
    fake = world.fake
    await fake.push(fake.message("long 10000", chat_id=42))
    await fake.wait_for(lambda f: sum(len(t) for t in f.chat_text(42)) >= 9900)
    texts = fake.chat_text(42)
    assert len(texts) == 3 and all(len(t) <= 4096 for t in texts)
    assert all(t.endswith(".") for t in texts[:-1])  # cut after a paragraph, not mid-word
    assert not fake.of("editMessageText")


async def test_run_failure_is_one_line(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    await fake.push(fake.message("fail", chat_id=42))
    await fake.wait_for(lambda f: any(t.startswith("⚠️") for t in f.chat_text(42)))
    notice = next(t for t in fake.chat_text(42) if t.startswith("⚠️"))
    assert "\n" not in notice and "the model exploded" in notice and "traceback" not in notice


async def test_forum_topics_are_conversations_of_their_own(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    group = -1002
    for thread in (7, 9):
        await fake.push(fake.message("@agenthost_test_bot hi", chat_id=group, chat_type="supergroup", thread_id=thread))
    await fake.wait_for(lambda f: len(f.chat_text(group)) == 2)
    assert sorted(s.conversation_id for s in Scripted.seen) == [f"tg:{group}:7", f"tg:{group}:9"]
    assert sorted(c.params["message_thread_id"] for c in fake.of("sendMessage")) == [7, 9]


async def test_a_long_streamed_reply_continues_in_new_messages(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    await fake.push(fake.message("long 9000", chat_id=42))
    await fake.wait_for(lambda f: sum(len(t) for t in f.chat_text(42)) >= 8900)
    await world.settled()
    texts = fake.chat_text(42)
    assert len(texts) == 3 and all(len(t) <= 4096 for t in texts)
    assert all(len(c.params["text"]) <= 4096 for c in fake.of("sendMessage", "editMessageText"))


async def test_a_user_who_blocked_the_bot_costs_nothing_but_a_log_line(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    fake.blocked_by.add(555)
    await fake.push(fake.message("hello?", chat_id=555))
    await fake.wait_for(lambda f: any(c.status == 403 for c in f.calls))
    await fake.push(fake.message("still working?", chat_id=42))
    await fake.wait_for(lambda f: f.chat_text(42) == ["You said: still working?"])
    await world.settled()  # the refused reply is not owed forever
    assert world.process.restarts == 0 and "Forbidden" in world.log()
