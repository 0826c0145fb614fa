"""Bad input from the platform: updates delivered twice, malformed, too large, from blocked users; Telegram's
429s; the adapter killed and restarted mid-stream of updates. No update starts two runs, none is lost."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def test_a_redelivered_update_starts_no_second_run(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    first = fake.message("first", chat_id=42)
    update_id = await fake.push(first)
    await fake.wait_for(lambda f: f.chat_text(42) == ["You said: first"])
    await fake.redeliver(update_id, first)
    await fake.push(fake.message("second", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 2)
    assert [s.text for s in Scripted.seen] == ["first", "second"]
    assert "already handled" in world.log()


async def test_malformed_updates_are_skipped_and_do_not_block_the_rest(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    bad = [
        await fake.push(raw={"message": "not an object"}),
        await fake.push(raw={"message": {"message_id": "x", "date": 0, "chat": 5}}),
        await fake.push(raw={"message": {"message_id": 1, "date": 0, "chat": {"id": 42, "type": "private"}}}),
    ]
    await fake.push(raw={"no_update_id": True})
    await fake.push(fake.message("still here", chat_id=42))
    await fake.wait_for(lambda f: f.chat_text(42) == ["You said: still here"])
    assert [s.text for s in Scripted.seen] == ["still here"]
    assert world.log().count("is malformed") >= 2
    # Every malformed update with an id was confirmed (the offset moved past it): Telegram will not resend them.
    await fake.wait_for(lambda f: f.confirmed_below > max(bad))


async def test_429_retry_after_is_honoured(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    fake.fail_next("sendMessage", retry_after=1)
    await fake.push(fake.message("hello", chat_id=42))
    await fake.wait_for(lambda f: f.chat_text(42) == ["You said: hello"])
    refused, sent = fake.of("sendMessage")
    assert refused.status == 429 and sent.status == 200
    assert sent.at - refused.at >= 1.0
    assert len(Scripted.seen) == 1


async def test_blocked_and_unlisted_users_are_ignored(world: World) -> None:
    await world.add_channel(blocked_users=[666], allowed_users=[42, 666])
    fake = world.fake
    await fake.push(fake.message("let me in", chat_id=666))
    await fake.push(fake.message("me too", chat_id=777))
    await fake.push(fake.message("hi", chat_id=42))
    await fake.wait_for(lambda f: f.chat_text(42) == ["You said: hi"])
    assert [s.text for s in Scripted.seen] == ["hi"]
    assert fake.chat_text(666) == [] and fake.chat_text(777) == []
    assert world.log().count("not allowed to use this bot") == 2


async def test_an_oversize_message_is_refused_in_one_line(world: World) -> None:
    await world.add_channel(max_input_chars=100)
    fake = world.fake
    await fake.push(fake.message("x" * 500, chat_id=42))
    await fake.push(fake.message("short", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 2)
    assert fake.chat_text(42) == [
        "⚠️ That message is too long (500 characters; the limit is 100).",
        "You said: short",
    ]
    assert [s.text for s in Scripted.seen] == ["short"]


async def test_a_killed_adapter_restarts_and_resumes_without_duplicates(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    first = fake.message("before the crash", chat_id=42)
    first_id = await fake.push(first)
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    await world.settled()  # a crash between replies (one during a reply is the test below)
    pid = world.process.proc.pid
    os.killpg(pid, signal.SIGKILL)
    await world.process.wait_for_state("backoff", "starting")
    # Telegram redelivers what it thinks unconfirmed; a new message arrives while the adapter is down.
    await fake.redeliver(first_id, first)
    await fake.push(fake.message("after the crash", chat_id=42))
    await world.host.supervisor.wait_ready("channel.tg", 30)
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 2)
    assert [s.text for s in Scripted.seen] == ["before the crash", "after the crash"]
    assert world.process.restarts == 1 and world.process.proc.pid != pid


async def test_a_message_in_flight_at_a_crash_is_neither_lost_nor_run_twice(world: World) -> None:
    """The window between "recorded as in flight" and "the host created its run", from both sides."""
    await world.add_channel()
    fake = world.fake
    sent = fake.message("accepted before the crash", chat_id=42)
    sent_id = await fake.push(sent)
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 1)
    await world.settled()
    state_path = world.host.data_dir / "channels" / "tg" / "state.json"

    async def restart_with(inflight: dict, offset: int) -> None:
        await world.settled()
        await world.host.supervisor.stop("channel.tg")
        state = json.loads(state_path.read_text())
        state_path.write_text(json.dumps({**state, "offset": offset, "inflight": inflight}))
        await world.host.supervisor.start("channel.tg")

    # 1. The host had created the run when the process died: the update is settled, its redelivery ignored, and
    #    the reply the dead process owed is delivered from the run's record.
    where = {"chat_id": 42, "thread_id": None, "group": False, "reply_to": sent["message_id"]}
    started = time.time() - 30
    await restart_with({"update_id": sent_id, "conversation": "tg:42", "at": started, "where": where}, sent_id)
    await fake.redeliver(sent_id, sent)
    await fake.push(fake.message("next", chat_id=42))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 3)
    assert [s.text for s in Scripted.seen] == ["accepted before the crash", "next"]
    assert sorted(fake.chat_text(42)) == sorted(["You said: accepted before the crash"] * 2 + ["You said: next"])

    # 2. The host never saw it: Telegram's redelivery is honoured, once.
    lost = fake.message("lost in the crash", chat_id=42)
    lost_id = await fake.push(lost)
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 4)
    inflight = {"update_id": lost_id + 1, "conversation": "tg:42", "at": time.time() + 5, "where": where}
    await restart_with(inflight, lost_id + 1)
    unsent = fake.message("never reached the host", chat_id=42)
    await fake.redeliver(lost_id + 1, unsent)
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 5)
    assert [s.text for s in Scripted.seen][-1] == "never reached the host"
    assert len(Scripted.seen) == 4


async def test_a_reply_cut_off_by_a_crash_is_delivered_after_the_restart(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    await fake.push(fake.message("wait", chat_id=42))
    await fake.wait_for(lambda f: bool(f.of("sendChatAction")) and len(Scripted.seen) == 1)
    os.killpg(world.process.proc.pid, signal.SIGKILL)
    await world.process.wait_for_state("backoff", "starting")
    await world.host.supervisor.wait_ready("channel.tg", 30)
    Scripted.gate.set()  # the run, which outlived the adapter, finishes now
    await fake.wait_for(lambda f: f.chat_text(42) == ["done waiting"])
    assert len(Scripted.seen) == 1
    state = json.loads((world.host.data_dir / "channels" / "tg" / "state.json").read_text())
    await fake.wait_for(
        lambda f: not json.loads((world.host.data_dir / "channels" / "tg" / "state.json").read_text()).get("pending")
    )
    assert state["offset"] > 0
