"""`agenthost channels add|list|remove` as a user runs them (a real CLI process against a real host), and the
settings the host refuses: secrets in the config, keys it does not have, unknown adapters, bad settings."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from conftest import Scripted, World

from agenthost.host.processes.channels import PROCESS_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST")}
    env["AGENTHOST_HOME"] = str(world.host.data_dir)
    argv = [sys.executable, "-m", "agenthost.host.cli", *args]
    return await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=90)


async def test_add_list_remove(world: World) -> None:
    config = json.dumps({"api_url": world.fake.url, "poll_timeout": 1})
    added = await cli(
        world, "channels", "add", "support", "telegram", "--name", "tg", "--config", config,
        "--set", "token_key=TELEGRAM_BOT_TOKEN",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("channel tg: agenthost/telegram for bot ")
    await world.ready()
    listed = await cli(world, "channels", "list", "--json")
    (info,) = json.loads(listed.stdout)
    assert (info["name"], info["adapter"], info["state"], info["keys"]) == (
        "tg",
        "agenthost/telegram",
        "ready",
        ["TELEGRAM_BOT_TOKEN"],
    )
    assert "123456:" not in listed.stdout  # the token is a key's value: never shown
    busy = await cli(world, "bots", "delete", "support")
    assert busy.returncode == 1 and "channels ['tg'] connect bot support; remove them first" in busy.stderr
    again = await cli(world, "channels", "add", "support", "telegram", "--name", "tg", "--set", "token_key=X")
    assert again.returncode == 1 and "ALREADY_EXISTS" in again.stderr
    removed = await cli(world, "channels", "remove", "tg")
    assert removed.returncode == 0 and removed.stdout.strip() == "removed channel tg"
    assert PROCESS_PREFIX + "tg" not in world.host.supervisor.processes
    assert json.loads((await cli(world, "channels", "list", "--json")).stdout) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--config", '{"bot_token": "123:abc"}'], "INVALID_ARGUMENT"),  # refused by the schema or as a secret
        (["--config", '{"token_key": "NOT_SET"}'], "the binding names key(s) ['NOT_SET']"),
        (["--set", "token_key=T", "--config", '{"poll_timeout": 900}'], "poll_timeout: 900 is greater than the"),
        (["--config", "[1]"], "config must be a JSON object"),
        (["--name", "Bad Name"], "channel name"),
        # The operator names the key the adapter gets; without it the refusal says what to pass.
        ([], "name it with `--set token_key=NAME`"),
    ],
)
async def test_bad_settings_are_refused(world: World, args: list[str], error: str) -> None:
    proc = await cli(world, "channels", "add", "support", "telegram", *args)
    assert proc.returncode == 1 and error in proc.stderr, proc.stderr
    assert not world.host.channels.list()


async def test_unknown_adapter_and_bot(world: World) -> Any:
    proc = await cli(world, "channels", "add", "support", "agenthost/whatsapp")
    assert proc.returncode == 1 and "has no channel adapter 'whatsapp'" in proc.stderr
    proc = await cli(world, "channels", "add", "nobody", "telegram")
    assert proc.returncode == 1 and "no bot 'nobody'" in proc.stderr


async def test_a_second_telegram_bot_on_one_bot_is_refused_and_an_existing_chat_stays_reachable(world: World) -> None:
    """Two Telegram bots' chats with one user have the same chat id: two Telegram channels on one agenthost bot
    would share `tg:<chat>`. The second is refused at `channels add`, saying what to do; a chat the first channel
    started before the rule (named `tg:<chat>`, as always) is still its own."""
    await world.add_channel("tg")
    await world.fake.push(world.fake.message("before", chat_id=42))
    await world.fake.wait_for(lambda f: f.chat_text(42) == ["You said: before"])
    second = await cli(
        world, "channels", "add", "support", "telegram", "--name", "tg2", "--config",
        json.dumps({"api_url": world.fake.url}), "--set", "token_key=TELEGRAM_BOT_TOKEN",
    )  # fmt: skip
    assert second.returncode == 1, second.stderr
    assert "bot 'support' already has channel 'tg', whose chats are its conversations tg:<id>" in second.stderr
    assert "Give it a bot of its own" in second.stderr
    assert [c.name for c in world.host.channels.list()] == ["tg"]
    # On a bot of its own it is accepted.
    assert (await cli(world, "bots", "create", "support2")).returncode == 0
    assert (await cli(world, "bots", "bind", "support2", "--runner", "test/scripted")).returncode == 0
    third = await cli(
        world, "channels", "add", "support2", "telegram", "--name", "tg2", "--config",
        json.dumps({"api_url": world.fake.url}), "--set", "token_key=TELEGRAM_BOT_TOKEN",
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    # The first channel's chat goes on in the same conversation.
    await world.fake.push(world.fake.message("after", chat_id=42))
    await world.fake.wait_for(lambda f: f.chat_text(42)[-1:] == ["You said: after"])
    assert [(s.conversation_id, s.text) for s in Scripted.seen] == [("tg:42", "before"), ("tg:42", "after")]


async def test_two_telegram_channels_on_one_bot_made_before_the_rule_start_only_the_older(world: World) -> None:
    """A data dir from before `channels add` refused the pair: at start the older keeps its chats, the newer does not
    start and `channels list` says why and what to do."""
    await world.add_channel("tg")
    doc = world.host.channels._doc
    doc["tg2"] = {**doc["tg"], "created_at": doc["tg"]["created_at"] + 1}
    world.host.channels._save(doc)
    await world.host.supervisor.stop(PROCESS_PREFIX + "tg")
    world.host.channels.start_all()
    tg = world.host.supervisor.processes[PROCESS_PREFIX + "tg"]
    await asyncio.wait_for(tg.wait_for_state("ready"), 30)
    listed = {c["name"]: c for c in json.loads((await cli(world, "channels", "list", "--json")).stdout)}
    assert listed["tg"]["state"] == "ready"
    assert listed["tg2"]["state"] == "stopped"
    assert "channel 'tg' of the same bot names its chats tg:<id> too" in listed["tg2"]["last_error"]
