"""A credential's walls hold through the HTTP gateway as on the gRPC admin surface (both ask agenthost.host.api.access):
a channel adapter's or an application's key writes only into the conversations it started and continues, reads and
answers only its own runs, unless the operator granted it all of its bots' conversations; and the end users a key
names (`user`) are its own, in memory as in conversations. Driven with the official `openai` client and gRPC."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from agenthost.host.access.credentials import CHANNEL_PREFIX, Credentials
from agenthost.host.access.private_files import write_json
from agenthost.host.api.client import HostClient
from agenthost.host.api.gateway.openai_api import response_id
from agenthost.host.processes.channels import chat_prefix
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

from .helpers import World

pytestmark = pytest.mark.timeout(60)


def client(world: World, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=world.base_url, api_key=key, timeout=20, max_retries=0)


async def _key(world: World, name: str, *, all_conversations: bool = False) -> str:
    """A send key for testbot, as `agenthost credentials create NAME --bot testbot [--all-conversations]` makes."""
    request = hpb.CreateCredentialRequest(
        name=name, scope="send", bots=["testbot"], all_conversations=all_conversations
    )
    return (await world.harness.client.call("CreateCredential", request)).token


def _channel_key(world: World, name: str, plugin_id: str = "agenthost", adapter: str = "telegram") -> str:
    # What Channels does at an adapter's start (agenthost's Telegram adapter by default).
    bot_id = world.host.registry.bot("testbot").bot_id
    chats = chat_prefix(name, {"plugin_id": plugin_id, "adapter": adapter})
    return world.host.credentials.create(CHANNEL_PREFIX + name, "send", [bot_id], replace=True, chats=chats)[1]


def _in(world: World, conversation: str) -> list[hpb.RunInfo]:
    return [r for r in world.runs() if r.conversation_id == conversation]


async def _chat(c: AsyncOpenAI, text: str, conversation: str | None = None, **kw: Any) -> Any:
    headers = {"X-Agenthost-Conversation": conversation} if conversation else None
    return await c.chat.completions.create(
        model="testbot", messages=[{"role": "user", "content": text}], extra_headers=headers, **kw
    )


async def test_a_channel_key_keeps_its_walls_through_the_gateway(world: World) -> None:
    """A `channel.<name>` credential presented to the gateway: the CLI's conversation is not its to write into (its
    run would read that history out), nor the CLI's run its to continue by response id."""
    cli = await world.harness.client.send("testbot", "hello from the cli", conversation_id="cli:1")
    tg = _channel_key(world, "tg")
    async with client(world, tg) as c:
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await _chat(c, "tell me everything said here", "cli:1")
        # Refused as a name a channel may not start, whether or not it exists (it does): no oracle.
        assert "not 'cli:1'" in caught.value.message and "another sender" not in caught.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            await c.responses.create(previous_response_id=response_id(cli.run.run_id), input="and then?")  # type: ignore[call-overload]
        assert missing.value.code == "previous_response_not_found"
        # Its own conversations work as ever, by header and by response id.
        first = await c.responses.create(
            model="testbot", input="hi", extra_headers={"X-Agenthost-Conversation": "tg:1"}
        )
        again = await c.responses.create(previous_response_id=first.id, input="again")  # type: ignore[call-overload]
        assert again.status == "completed"
    assert [r.origin for r in _in(world, "cli:1")] == ["admin"]  # nothing recorded for the refusals
    assert [r.origin for r in _in(world, "tg:1")] == [CHANNEL_PREFIX + "tg"] * 2


async def test_a_send_key_reaches_only_its_own_conversations_unless_granted(world: World) -> None:
    """A send key may not name another sender's conversation (a Telegram chat, the CLI's, another application's) and
    read it back through the bot's replies, nor continue, read or cancel another's runs; a key granted
    `--all-conversations` may, and the admin may."""
    tg = HostClient(world.host.admin_address, token=_channel_key(world, "tg"))
    app2 = await _key(world, "app2")
    granted = await _key(world, "ops-app", all_conversations=True)
    async with tg:
        chat = await tg.send("testbot", "my Telegram secret", conversation_id="tg:42")
    cli = await world.harness.client.send("testbot", "the CLI's", conversation_id="cli:1")
    async with client(world, app2) as c2:
        await _chat(c2, "app2's", "app2-1")
        await _chat(c2, "alice's", user="alice")  # conversation user:app2/alice
    theirs = {"tg:42": chat.run.run_id, "cli:1": cli.run.run_id, "app2-1": _in(world, "app2-1")[0].run_id}

    async with client(world, world.key) as app:
        for conversation in (*theirs, "user:app2/alice"):
            with pytest.raises(openai.PermissionDeniedError) as caught:
                await _chat(app, "read it all back to me", conversation)
            # A name the key may not start (a chat's, another key's end user's) is refused as such whether or not
            # it exists; a free name another sender took, as taken.
            reserved = conversation in ("tg:42", "cli:1", "user:app2/alice")  # cli:1 has a chat's shape
            assert ("may not start it" if reserved else "may write only into conversations it started") in (
                caught.value.message
            )
            assert "--all-conversations" in caught.value.message  # what the operator can do about it
        for run_id in theirs.values():
            with pytest.raises(openai.NotFoundError):
                await app.responses.create(previous_response_id=response_id(run_id), input="go on")  # type: ignore[call-overload]
        # Its own: a new conversation it names, continued by header and by response id.
        await _chat(app, "mine", "app-1")
        await _chat(app, "mine again", "app-1")
        mine = await app.responses.create(model="testbot", input="x")
        assert (await app.responses.create(previous_response_id=mine.id, input="y")).status == "completed"  # type: ignore[call-overload]
    for conversation, run_id in theirs.items():
        assert [r.run_id for r in _in(world, conversation)] == [run_id]  # nothing recorded for the refusals
    assert len(_in(world, "app-1")) == 2

    # The same key on gRPC: the others' runs do not exist to it.
    async with HostClient(world.host.admin_address, token=world.key) as app_grpc:
        for run_id in theirs.values():
            with pytest.raises(errors.NotFound):
                await app_grpc.call("GetRun", hpb.RunRequestById(run_id=run_id))
            with pytest.raises(errors.NotFound):
                await app_grpc.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=run_id))
            with pytest.raises(errors.NotFound):
                await app_grpc.call("CancelRun", hpb.RunRequestById(run_id=run_id))
        listed = await app_grpc.call("ListRuns", hpb.ListRunsRequest(bot="testbot", limit=1000))
        assert {r.origin for r in listed.runs} == {"app"} and len(listed.runs) == 4
        with pytest.raises(errors.PermissionDenied):
            await app_grpc.send("testbot", "via gRPC", conversation_id="tg:42")

    # Granted all conversations (and the admin): every conversation and run of the bot.
    for key in (granted, world.admin):
        async with client(world, key) as c:
            await _chat(c, "hello", "tg:42")
            continued = await c.responses.create(previous_response_id=response_id(cli.run.run_id), input="more")  # type: ignore[call-overload]
            assert continued.status == "completed"
    assert len(_in(world, "tg:42")) == 3


async def test_a_keys_end_users_are_its_own_in_memory_too(world: World) -> None:
    """Two applications' keys for one bot both sending `user: alice`: each alice is an actor of her key's own
    (`<key>/alice`), so the bot's personal memory of one is not read to the other; nor can a key name a Telegram
    user's actor (`tg:<id>`), by `user` or over gRPC."""
    app2 = await _key(world, "app2")
    async with client(world, world.key) as a, client(world, app2) as b:
        said = await _chat(a, "remember alice's card is 4242", user="alice")
        assert said.choices[0].message.content == "note: alice's card is 4242"
        assert (await _chat(b, "recall", user="alice")).choices[0].message.content == "note: "
        assert (await _chat(a, "recall", user="alice")).choices[0].message.content == "note: alice's card is 4242"
        # With no `user`, the key itself is the actor: still not another key's.
        await _chat(a, "remember the app's own note")
        assert (await _chat(b, "recall")).choices[0].message.content == "note: "
    events = {
        json.loads(row[0])["actor_id"]
        for row in world.host.db.query("SELECT actor_json FROM events WHERE source = 'gateway'", ())
    }
    assert events == {"app/alice", "app2/alice", "app", "app2"}

    tg_user = pb.Actor(actor_type="user", actor_id="tg:42")
    async with HostClient(world.host.admin_address, token=_channel_key(world, "tg")) as tg:
        # A channel names its platform's users outright.
        said = await tg.send("testbot", "remember my address", conversation_id="tg:42", actor=tg_user)
        assert said.text == "note: my address"
    async with client(world, world.key) as a:
        assert (await _chat(a, "recall", user="tg:42")).choices[0].message.content == "note: "
    async with HostClient(world.host.admin_address, token=world.key) as app_grpc:
        assert (await app_grpc.send("testbot", "recall", conversation_id="g-1", actor=tg_user)).text == "note: "


def test_send_credentials_stored_before_the_grant_are_own_only(tmp_path: Path) -> None:
    """credentials.json written by an older host has no `all_conversations`: its send keys reach only their own."""
    created = Credentials(tmp_path)
    _, token = created.create("legacy", "send", ["bot_1"])
    stored = json.loads((tmp_path / "credentials.json").read_text())
    del stored["credentials"]["legacy"]["all_conversations"]
    write_json(tmp_path / "credentials.json", stored)
    principal = Credentials(tmp_path).authenticate((("authorization", f"Bearer {token}"),))
    assert principal.own_only == "legacy" and not principal.all_conversations
    (info,) = Credentials(tmp_path).list()
    assert not info.all_conversations


async def test_a_key_cannot_take_the_name_the_cli_sends_or_acts_under(world: World) -> None:
    """The CLI's messages are recorded as sent by "admin" and, naming no actor, as actor "local": a send key of either
    name would own the CLI's conversations, or read the CLI user's memory."""
    cli = await world.harness.client.send("testbot", "the CLI's", conversation_id="cli:1")
    assert cli.run.origin == "admin"
    for name in ("admin", "local"):
        with pytest.raises(errors.InvalidArgument, match="is the host's own"):
            await _key(world, name)


async def test_a_channel_names_only_its_platforms_users_not_the_hosts_or_a_keys(world: World) -> None:
    """A channel adapter is an untrusted plugin: it names its platform's users (`tg:<id>`), but not the CLI's actor
    (`local`, also what a message naming no actor would get), nor a key's end users (`<key>/<id>`) or a key itself,
    whose personal memory its run would otherwise read — over gRPC or by the gateway's `user`."""
    await world.harness.client.send("testbot", "remember the operator's PIN is 1234", conversation_id="cli:1")
    async with client(world, world.key) as a:
        await _chat(a, "remember alice's card is 4242", user="alice")
    tg = _channel_key(world, "tg")
    async with HostClient(world.host.admin_address, token=tg) as grpc_tg:
        for n, actor_id in enumerate(("local", "app/alice", "app", "channel.other", "admin")):
            actor = pb.Actor(actor_type="user", actor_id=actor_id)
            with pytest.raises(errors.InvalidArgument, match="<platform>:<id>"):
                await grpc_tg.send("testbot", "recall", conversation_id=f"tg:{n}", actor=actor)
        # Naming no actor, the channel is its own (not the CLI's `local`).
        assert (await grpc_tg.send("testbot", "recall", conversation_id="tg:9")).text == "note: "
        said = await grpc_tg.send(
            "testbot", "recall", conversation_id="tg:8", actor=pb.Actor(actor_type="user", actor_id="tg:42")
        )
        assert said.text == "note: "
    async with client(world, tg) as c:
        with pytest.raises(openai.BadRequestError, match="<platform>:<id>"):
            await _chat(c, "recall", "tg:10", user="local")
        assert (await _chat(c, "recall", "tg:11")).choices[0].message.content == "note: "
    # Nothing recorded under the refused names.
    actors = {
        json.loads(row[0])["actor_id"]
        for row in world.host.db.query("SELECT actor_json FROM events WHERE origin = ?", ("channel.tg",))
    }
    assert actors == {"channel.tg", "tg:42"}


async def test_no_other_sender_takes_a_keys_end_user_conversation_first(world: World) -> None:
    """`user:<key>/<user>` is the conversation the gateway gives a key's end user (no header): the only one that user
    has. Another key, a key granted all conversations, or a channel starting it first (by header or over gRPC) would
    make it another's for good, and the user's every message refused; they may not start it."""
    app2 = await _key(world, "app2")
    granted = await _key(world, "ops-app", all_conversations=True)
    for key in (app2, granted):
        async with client(world, key) as c:
            with pytest.raises(openai.PermissionDeniedError, match="another key's end user's conversation"):
                await _chat(c, "squat", "user:app/alice")
        async with HostClient(world.host.admin_address, token=key) as grpc_client:
            with pytest.raises(errors.PermissionDenied, match="another key's end user's conversation"):
                await grpc_client.send("testbot", "squat", conversation_id="user:app/bob")
    async with HostClient(world.host.admin_address, token=_channel_key(world, "tg")) as tg:
        with pytest.raises(errors.PermissionDenied, match="another key's end user's conversation"):
            await tg.send("testbot", "squat", conversation_id="user:app/carol")
    assert _in(world, "user:app/alice") == _in(world, "user:app/bob") == _in(world, "user:app/carol") == []
    async with client(world, world.key) as a:
        for user in ("alice", "bob", "carol"):
            said = await _chat(a, "hi", user=user)
            assert said.choices[0].message.content == "Hello world"
        # The key itself may name its own users' conversations by header too.
        await _chat(a, "again", "user:app/alice")
    assert [r.origin for r in _in(world, "user:app/alice")] == ["app", "app"]


async def test_no_key_takes_a_chats_conversation_first_and_no_channel_takes_a_keys(world: World) -> None:
    """The first sender of a conversation owns it. A key that started `tg:77` before that Telegram chat did would lock
    the chat out of its own conversation for good (the channel, an own-only sender, is refused in a conversation it did
    not start), so a name of a chat's form is the channels' to start; and a channel, an untrusted plugin, starts only
    such names, never one a key or the CLI uses. Refused over gRPC and the gateway's header alike, nothing recorded."""
    granted = await _key(world, "ops-app", all_conversations=True)
    for key in (world.key, granted):
        async with client(world, key) as c:
            with pytest.raises(openai.PermissionDeniedError, match="named as a chat's"):
                await _chat(c, "squat", "tg:77")
        async with HostClient(world.host.admin_address, token=key) as grpc_client:
            with pytest.raises(errors.PermissionDenied, match="named as a chat's"):
                await grpc_client.send("testbot", "squat", conversation_id="slack:C01")
    assert _in(world, "tg:77") == _in(world, "slack:C01") == []
    async with HostClient(world.host.admin_address, token=_channel_key(world, "tg")) as tg:
        for name in ("support-1", "orders"):
            with pytest.raises(errors.PermissionDenied, match="a channel names its chats' conversations"):
                await tg.send("testbot", "squat", conversation_id=name)
        assert (await tg.send("testbot", "hi", conversation_id="tg:77")).text == "Hello world"
    assert _in(world, "support-1") == _in(world, "orders") == []
    assert [r.origin for r in _in(world, "tg:77")] == ["channel.tg"]
    # A plugin's adapter ("slack") starts only its own channel's names, never a Telegram chat's first.
    async with HostClient(world.host.admin_address, token=_channel_key(world, "slack", "acme", "slack")) as slack:
        with pytest.raises(errors.PermissionDenied, match="names its chats' conversations slack:<id>"):
            await slack.send("testbot", "squat", conversation_id="tg:78")
        assert (await slack.send("testbot", "hi", conversation_id="slack:C01")).text == "Hello world"
    assert _in(world, "tg:78") == []
    # A key still names its own conversations freely, and the CLI (admin) any.
    async with client(world, world.key) as a:
        assert (await _chat(a, "hi", "support-1")).choices[0].message.content == "Hello world"
    await world.harness.client.send("testbot", "hi", conversation_id="web:1")


async def test_no_other_key_takes_or_probes_a_keyed_requests_conversation(world: World) -> None:
    """A request with an Idempotency-Key and no conversation gets one named by its key holder and that key. The name
    was `conv_` + sha256(key name, key): another key that guessed the Idempotency-Key (order-1234) started it
    first, and every send of that key was refused for good (403), and its 403 or 200 told whether the key was sent.
    Now the name lies in the key's own namespace (user:app/…): nobody else may start it, and the answer is the same
    whether it exists or not."""
    app2 = await _key(world, "app2")
    idempotency = {"Idempotency-Key": "order-1234"}
    async with client(world, world.key) as a, client(world, app2) as b:
        probe = "user:app/idempotency:" + hashlib.sha256(b"app\0order-1234").hexdigest()[:32]
        old_name = "conv_" + hashlib.sha256(b"app\0order-1234").hexdigest()[:32]
        await _chat(b, "squat", old_name)  # the old name is any sender's now: nothing of app's is there
        with pytest.raises(openai.PermissionDeniedError) as before:
            await _chat(b, "squat", probe)
        first = await a.chat.completions.with_raw_response.create(
            model="testbot", messages=[{"role": "user", "content": "pay"}], extra_headers=idempotency
        )
        assert first.status_code == 200 and first.headers["x-agenthost-conversation"] == probe
        again = await a.chat.completions.with_raw_response.create(
            model="testbot", messages=[{"role": "user", "content": "pay"}], extra_headers=idempotency
        )
        assert again.headers["x-agenthost-run"] == first.headers["x-agenthost-run"]
        with pytest.raises(openai.PermissionDeniedError) as after:
            await _chat(b, "probe", probe)
    assert before.value.message == after.value.message and "another key's end user's conversation" in str(
        after.value.message
    )
    assert [r.origin for r in _in(world, probe)] == ["app"]


async def test_a_keyed_request_sent_before_its_conversation_was_renamed_is_retried_into_its_run(world: World) -> None:
    """A keyed request's conversation was `conv_<hash>` before the last stop and is `user:<key>/idempotency:<hash>`
    now: a retry of a request sent before the change named another conversation than its run's, and the host refused
    it 400 as another message under a used key. Now the run the caller recorded with that key keeps its old name, so
    the retry follows it; another key's run under the old name brings nothing back."""
    named = hashlib.sha256(b"app\0order-77").hexdigest()[:32]
    old_name, new_name = f"conv_{named}", f"user:app/idempotency:{named}"
    async with client(world, world.key) as a:
        # What a keyed request recorded before the change: its run under the old name, with its key (sent here
        # naming the conversation outright, as the gateway then named it).
        before = await a.chat.completions.with_raw_response.create(
            model="testbot",
            messages=[{"role": "user", "content": "pay"}],
            extra_headers={"Idempotency-Key": "order-77", "X-Agenthost-Conversation": old_name},
        )
        assert before.status_code == 200 and before.headers["x-agenthost-conversation"] == old_name
        retried = await a.chat.completions.with_raw_response.create(
            model="testbot",
            messages=[{"role": "user", "content": "pay"}],
            extra_headers={"Idempotency-Key": "order-77"},
        )
        assert retried.status_code == 200, retried.text
        assert retried.headers["x-agenthost-run"] == before.headers["x-agenthost-run"]
        assert retried.headers["x-agenthost-conversation"] == old_name
        # A new key goes to the new name; the same key with another text is still the client's mistake (400, saying
        # what to do).
        fresh = await a.chat.completions.with_raw_response.create(
            model="testbot",
            messages=[{"role": "user", "content": "pay"}],
            extra_headers={"Idempotency-Key": "order-78"},
        )
        assert fresh.headers["x-agenthost-conversation"].startswith("user:app/idempotency:")
        with pytest.raises(openai.BadRequestError) as other_text:
            await a.chat.completions.create(
                model="testbot",
                messages=[{"role": "user", "content": "refund"}],
                extra_headers={"Idempotency-Key": "order-77"},
            )
        assert "a new message needs a new key" in other_text.value.message
    assert [r.origin for r in _in(world, old_name)] == ["app"] and not _in(world, new_name)
