"""A channel adapter's credential, and a user-made `send` credential not granted all conversations, reads and acts
only on the runs it started, and writes only into conversations it started: not those of the CLI, a script, or
another channel of the same bot. The adapter is untrusted (a plugin; anyone on its chat platform drives it), and so
is an application holding a send key. Runs it did not start answer NOT_FOUND, as another bot's runs do to a scoped
credential, so it learns nothing of them; the admin, and a send credential made with `all_conversations`, see every
run of their bots. (The same rules through the HTTP gateway: tests/gateway/test_gateway_walls.py.)"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agenthost.host.access.credentials import CHANNEL_PREFIX
from agenthost.host.api.client import HostClient, SendResult
from agenthost.host.store import migrations
from agenthost.host.store.conversations import Conversations
from agenthost.host.store.db import Database
from agenthost.host.store.runs import RunStore
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(90)


class Walled(Runner):
    """`make`: writes a file and opens a child run; `hold`: runs until cancelled; anything else is echoed."""

    manifest = RunnerManifest(name="walled")
    held: asyncio.Queue[str]

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        if run.text == "make":
            made = await run.api.artifact_create(b"secret of " + run.conversation_id.encode(), name="out.txt")
            yield events.artifact_created(made)
            async with run.child_run("look around", subagent_type="explore") as child:
                await child.emit(events.message("found it"))
            yield events.text(f"made in {run.conversation_id}")
            return
        if run.text == "hold":
            Walled.held.put_nowait(run.run_id)
            await asyncio.Event().wait()
        yield events.text(f"echo {run.text}")


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[HostHarness]:
    Walled.held = asyncio.Queue()
    async with HostHarness(tmp_path, runners=[Walled]) as harness:
        yield harness


def _client(h: HostHarness, name: str, *, all_conversations: bool = False, chats: str = "") -> HostClient:
    # What Channels does at each adapter start (`channel.` names), or a user's CreateCredential (any other name):
    # a `send` credential for the harness's bot alone. Creating a channel's again rotates its token.
    channel = name.startswith(CHANNEL_PREFIX)
    # A channel's chats are `tg:` (Telegram's) or `<channel name>:` (Channels' chat_prefix): `<name>:` for both here.
    _, token = h.host.credentials.create(
        name,
        "send",
        [h.host.registry.bot(h.bot).bot_id],
        replace=channel,
        all_conversations=all_conversations,
        chats=(chats or f"{name.removeprefix(CHANNEL_PREFIX)}:") if channel else "",
    )
    return HostClient(h.host.admin_address, token=token)


@dataclass
class Made:
    result: SendResult

    @property
    def run_id(self) -> str:
        return self.result.run.run_id

    @property
    def artifact_id(self) -> str:
        (made,) = [e.artifact_created.artifact for e in self.result.events if e.HasField("artifact_created")]
        return made.artifact_id


async def _make(client: HostClient, bot: str, conversation: str) -> Made:
    result = await client.send(bot, "make", conversation_id=conversation)
    assert result.run.status == "completed", result.run
    return Made(result)


async def _child_of(client: HostClient, run_id: str) -> str:
    (child,) = (await client.call("GetRun", hpb.RunRequestById(run_id=run_id))).child_run_ids
    return child


async def _reads(client: HostClient, run: Made, child: str) -> None:
    """Every read a send credential may make of a run, each expected to succeed."""
    info = await client.call("GetRun", hpb.RunRequestById(run_id=run.run_id))
    assert info.run_id == run.run_id and list(info.child_run_ids) == [child]
    assert (await client.call("GetRun", hpb.RunRequestById(run_id=child))).parent_run_id == run.run_id
    listed = await client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=run.run_id))
    assert "artifact_created" in [e.WhichOneof("kind") for e in listed.events]
    assert (await client.call("ListRunEvents", hpb.ListRunEventsRequest(run_id=child))).events
    read = hpb.ReadRunArtifactRequest(run_id=run.run_id, artifact_id=run.artifact_id)
    assert (await client.call("ReadRunArtifact", read)).data.startswith(b"secret of ")


async def _refused(client: HostClient, method: str, request: object, run_id: str) -> None:
    """NOT_FOUND with the very words a run that never existed gets: nothing tells the two apart."""
    with pytest.raises(errors.NotFound) as caught:
        await client.call(method, request)
    assert caught.value.message == f"no run {run_id!r}"


async def _all_reads_refused(client: HostClient, run: Made, child: str) -> None:
    for run_id in (run.run_id, child):
        await _refused(client, "GetRun", hpb.RunRequestById(run_id=run_id), run_id)
        await _refused(client, "ListRunEvents", hpb.ListRunEventsRequest(run_id=run_id), run_id)
    read = hpb.ReadRunArtifactRequest(run_id=run.run_id, artifact_id=run.artifact_id)
    await _refused(client, "ReadRunArtifact", read, run.run_id)


async def _listed(client: HostClient, bot: str, conversation: str = "") -> set[str]:
    reply = await client.call("ListRuns", hpb.ListRunsRequest(bot=bot, conversation_id=conversation, limit=1000))
    return {r.run_id for r in reply.runs}


async def test_a_channel_or_send_key_reads_only_the_runs_it_started(h: HostHarness) -> None:
    async with (
        _client(h, "channel.tg") as tg,
        _client(h, "channel.slack") as slack,
        _client(h, "script") as script,
        _client(h, "ops-script", all_conversations=True) as granted,
    ):
        runs = {
            "admin": await _make(h.client, h.bot, "cli:1"),
            "tg": await _make(tg, h.bot, "tg:1"),
            "slack": await _make(slack, h.bot, "slack:1"),
            "script": await _make(script, h.bot, "script-1"),
        }
        children = {who: await _child_of(h.client, run.run_id) for who, run in runs.items()}
        # Each run, and its child, names who sent the message it answers.
        senders = {"admin": "admin", "tg": "channel.tg", "slack": "channel.slack", "script": "script"}
        for who, run in runs.items():
            assert run.result.run.origin == senders[who]
            for run_id in (run.run_id, children[who]):
                assert (await h.client.call("GetRun", hpb.RunRequestById(run_id=run_id))).origin == senders[who]
        everything = set().union(*({r.run_id, children[w]} for w, r in runs.items()))

        for who, channel in (("tg", tg), ("slack", slack), ("script", script)):
            await _reads(channel, runs[who], children[who])
            for other in runs.keys() - {who}:
                await _all_reads_refused(channel, runs[other], children[other])
            assert await _listed(channel, h.bot) == {runs[who].run_id, children[who]}
            assert await _listed(channel, h.bot, "cli:1") == set()
            await _refused(channel, "GetRun", hpb.RunRequestById(run_id="run_none"), "run_none")

        # The admin, and a send credential the operator granted all conversations: every run of their bots.
        for client in (h.client, granted):
            assert await _listed(client, h.bot) == everything
            for who, run in runs.items():
                await _reads(client, run, children[who])

        # A restarted adapter gets a fresh token under the same name: its runs stay its own.
        async with _client(h, "channel.tg") as tg_again:
            with pytest.raises(errors.Unauthenticated):  # the rotated-out token
                await tg.call("GetRun", hpb.RunRequestById(run_id=runs["tg"].run_id))
            await _reads(tg_again, runs["tg"], children["tg"])
            assert await _listed(tg_again, h.bot) == {runs["tg"].run_id, children["tg"]}
            await _all_reads_refused(tg_again, runs["slack"], children["slack"])


async def test_a_channel_cancels_only_the_runs_it_started(h: HostHarness) -> None:
    async with _client(h, "channel.tg") as tg, _client(h, "channel.slack") as slack:
        sends = {
            who: asyncio.create_task(client.send(h.bot, "hold", conversation_id=f"{who}:hold"))
            for who, client in (("admin", h.client), ("tg", tg), ("slack", slack))
        }
        held = {await asyncio.wait_for(Walled.held.get(), 20) for _ in sends}
        by = {r.conversation_id.split(":")[0]: r.run_id for r in await _running(h)}
        assert set(by.values()) == held

        for other in ("admin", "slack"):
            await _refused(tg, "CancelRun", hpb.RunRequestById(run_id=by[other]), by[other])
        assert {r.run_id for r in await _running(h)} == held  # nothing was cancelled

        cancelled = await tg.call("CancelRun", hpb.RunRequestById(run_id=by["tg"]))
        assert cancelled.status == "cancelled"
        assert (await sends["tg"]).run.status == "cancelled"
        assert (await slack.call("CancelRun", hpb.RunRequestById(run_id=by["slack"]))).status == "cancelled"
        assert (await h.client.call("CancelRun", hpb.RunRequestById(run_id=by["admin"]))).status == "cancelled"
        await asyncio.gather(sends["slack"], sends["admin"])


async def _running(h: HostHarness) -> list[hpb.RunInfo]:
    return list((await h.client.call("ListRuns", hpb.ListRunsRequest(bot=h.bot, status="running"))).runs)


async def test_a_channel_writes_only_into_conversations_it_started(h: HostHarness) -> None:
    """A message is answered by a run that reads its conversation: into another's conversation, it would read
    that conversation out to the channel."""
    async with (
        _client(h, "channel.tg") as tg,
        _client(h, "channel.slack") as slack,
        _client(h, "script") as script,
        _client(h, "ops-script", all_conversations=True) as granted,
    ):
        await h.client.send(h.bot, "from the cli", conversation_id="ops")
        await tg.send(h.bot, "hello", conversation_id="tg:1")
        await script.send(h.bot, "from a script", conversation_id="script-1")
        for conversation in ("ops", "script-1"):
            with pytest.raises(errors.PermissionDenied):
                await tg.send(h.bot, "tell me everything said here", conversation_id=conversation)
        for conversation in ("ops", "tg:1"):
            with pytest.raises(errors.PermissionDenied):
                await script.send(h.bot, "tell me everything said here", conversation_id=conversation)
        with pytest.raises(errors.PermissionDenied):
            await slack.send(h.bot, "and here?", conversation_id="tg:1")
        # Nothing of the refused messages was recorded: no run, no event, no transcript item.
        assert len(await _listed(h.client, h.bot, "ops")) == 1
        page = await h.client.call("GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="ops", limit=100))
        assert [i.text for i in page.items if i.role == "user"] == ["from the cli"]

        # Its own conversations, old and new; the admin (trusted) may write into any, which takes nothing away.
        assert (await tg.send(h.bot, "again", conversation_id="tg:1")).text == "echo again"
        assert (await tg.send(h.bot, "fresh", conversation_id="tg:2")).text == "echo fresh"
        await h.client.send(h.bot, "the admin looks in", conversation_id="tg:1")
        assert (await tg.send(h.bot, "still mine", conversation_id="tg:1")).text == "echo still mine"
        # A send credential granted all conversations writes wherever its bots are.
        assert (await granted.send(h.bot, "hi", conversation_id="ops")).text == "echo hi"
        assert (await granted.send(h.bot, "hi", conversation_id="tg:1")).text == "echo hi"
        # A channel's credential is never granted them.
        with pytest.raises(errors.InvalidArgument):
            h.host.credentials.create(
                "channel.tg", "send", [h.host.registry.bot(h.bot).bot_id], replace=True, all_conversations=True
            )

        # Conversations themselves are not a send credential's to read at all.
        for client in (tg, script, granted):
            with pytest.raises(errors.PermissionDenied):
                await client.call("ListConversations", hpb.BotRequest(bot=h.bot))
            with pytest.raises(errors.PermissionDenied):
                await client.call("GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="tg:1"))

        async with _client(h, "channel.tg") as tg_again:  # restarted: the same sender
            assert (await tg_again.send(h.bot, "back", conversation_id="tg:1")).text == "echo back"
            with pytest.raises(errors.PermissionDenied):
                await tg_again.send(h.bot, "and now?", conversation_id="ops")


async def test_records_of_an_older_host_are_no_channels(tmp_path: Path) -> None:
    """Runs and conversations recorded before the sender was (schema v8) have no known sender: no channel's."""
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for script in migrations.MIGRATIONS[:8]:
        for statement in migrations._statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 8")
    conn.execute("COMMIT")
    conn.execute(
        "INSERT INTO runs(run_id, bot_id, conversation_id, binding_id, runner_id, plugin_id, event_id, status,"
        " token_hash, grant_json, created_at, deadline_at) VALUES ('run_old','b','tg:1','x','x','x','e','completed',"
        " '','{}',1.0,2.0)"
    )
    conn.execute(
        "INSERT INTO events(event_id, bot_id, conversation_id, event_type, source, actor_json, text, data_json,"
        " created_at) VALUES ('e','b','tg:1','message.received','telegram','{}','hi','{}',1.0)"
    )
    conn.close()
    db = Database(path)
    await db.open()
    try:
        runs = RunStore(db)
        assert runs.get("run_old") is not None and runs.get("run_old", origin="") is not None
        assert runs.get("run_old", origin="channel.tg") is None
        assert [r.run_id for r in runs.list(bot_id="b")] == ["run_old"]
        assert runs.list(bot_id="b", origin="channel.tg") == []
        assert Conversations.starter(db.reader, "b", "tg:1") == ""
        assert Conversations.starter(db.reader, "b", "tg:2") is None
        # A channel's listing walks its own rows of the index, not the bot's.
        plan = db.query(
            "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE bot_id = ? AND origin = ? ORDER BY created_at DESC",
            ("b", "channel.tg"),
        )
        assert "runs_origin" in " ".join(str(tuple(r)) for r in plan)
    finally:
        await db.close()


async def test_two_channels_racing_into_a_new_conversation_do_not_both_get_in(h: HostHarness) -> None:
    """Whose a conversation is gets settled in the transaction that records its first message. (Two channels of one
    bot may both start a name only if given the same chats, which Channels refuses; the transaction still holds.)"""
    async with _client(h, "channel.tg", chats="race:") as tg, _client(h, "channel.slack", chats="race:") as slack:
        for i in range(5):
            outcomes = await asyncio.gather(
                *(c.send(h.bot, "first!", conversation_id=f"race:{i}") for c in (tg, slack)), return_exceptions=True
            )
            refused = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(refused) == 1 and isinstance(refused[0], errors.PermissionDenied), outcomes
