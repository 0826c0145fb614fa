"""`agenthost db migrate-to`: a data dir a real host wrote on SQLite, copied into PostgreSQL by the real CLI, cut
mid-copy and resumed, run again (nothing copied, verified), then served by a host on PostgreSQL that reads the old
history with the old cursors and numbers new rows after the old."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.store import transfer
from agenthost.host.store.conversations import Conversations, NewItem
from agenthost.host.store.transfer import Transfer
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.testing import HostHarness
from tests.cli_process import acli
from tests.pg_cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


class Writer(Runner):
    """Touches every store a run can: streamed deltas (delta-run rows), state, an artifact, the transcript."""

    manifest = RunnerManifest(name="writer", permissions=RunnerPermissions(state_scopes=("conversation",)))

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        for word in run.text.split():
            yield events.text(word + " ")
        count = await run.api.state_get("conversation", "count", default=0)
        await run.api.state_set("conversation", "count", count + 1)
        await run.api.artifact_create(run.text.encode(), name="said.txt", mime_type="text/plain")
        yield events.message(f"heard {run.text}")


async def test_a_real_data_dir_migrates_resumes_verifies_and_serves(
    tmp_path: Path, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostHarness(tmp_path, runners=[Writer]) as h:
        for i in range(6):
            await h.send(f"message number {i} about apples", conversation_id=f"c{i % 2}")
        await h.client.call(
            "KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="a.md", content=b"# Apples\nApples are red.\n")
        )
        before = await h.client.call("GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="c0", limit=4))
    data_dir = tmp_path / "host"
    pg_cluster.admin("CREATE DATABASE migrated TEMPLATE template0")
    dsn = pg_cluster.dsn("migrated")

    # Cut during the third batch of two rows: what two batches committed stays, and is where the copy goes on.
    monkeypatch.setattr(transfer, "BATCH_ROWS", 2)
    batches = 0

    def cut(table: str) -> None:
        nonlocal batches
        batches += 1
        if batches == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Transfer, "_batch_committing", staticmethod(cut))
    with pytest.raises(KeyboardInterrupt):
        Transfer(data_dir / "agenthost.db", dsn).run()

    code, out, err = await acli(data_dir, "db", "migrate-to", dsn, "--json")
    assert code == 0, err
    first = {r["table"]: r for r in json.loads(out)}
    assert "verified" in err and all(r["ok"] for r in first.values())
    for table in ("events", "transcript", "runs", "run_events", "state", "artifacts", "audit", "kb_chunks"):
        assert first[table]["source_rows"] > 0, table
    # six messages' artifacts and the knowledge-base document, their bytes now in the database
    assert first["artifact objects"]["target_rows"] == 7 and first["artifact objects"]["copied"] == 7
    # meta (1 row) and plugins (1) were copied before the cut, bots in its batch was rolled back
    assert first["meta"]["copied"] == 0 and first["plugins"]["copied"] == 0
    assert first["events"]["copied"] == first["events"]["source_rows"] == 6

    code, out, err = await acli(data_dir, "db", "migrate-to", dsn, "--json")
    assert code == 0, err
    again = json.loads(out)
    assert all(r["ok"] and r["copied"] == 0 for r in again)  # idempotent: nothing copied twice
    assert [r["target_checksum"] for r in again] == [first[r["table"]]["target_checksum"] for r in again]

    # (No run here: the migrated registry names the harness's in-process plugin, which a new host cannot start.)
    async with HostHarness(tmp_path, bot="second", host_options={"database": dsn}) as h:
        old = h.host.registry.bot("testbot")
        page = await h.client.call(
            "GetHistory",
            hpb.GetHistoryRequest(bot=old.bot_id, conversation_id="c0", cursor=before.next_cursor, limit=10),
        )
        assert [i.text for i in page.items] and page.items[0].seq < before.items[-1].seq  # the old cursor pages on
        art = h.host.db.query_one("SELECT artifact_id, sha256 FROM artifacts WHERE name = 'said.txt' LIMIT 1")
        ref, _ = h.host.artifacts.get(art[0])
        assert h.host.artifacts.read(art[1], 0, 100).startswith(b"message number") and ref.size_bytes > 0
        # New rows are numbered after the migrated ones: events, transcript items, audit rows.
        conv = h.host.conversations
        event = await h.host.db.write(
            lambda c: Conversations.insert_event(
                c, bot_id=old.bot_id, conversation_id="c0", event_type="message.received", source="test",
                actor=pb.Actor(actor_type="user", actor_id="u"), text="one more", data_json="{}",
            )
        )  # fmt: skip
        await h.host.db.write(
            lambda c: conv.insert_items(
                c, bot_id=old.bot_id, conversation_id="c0", run_id="r", event_id=event.event_id,
                items=[NewItem(role="user", item_type="message", text="one more")],
            )
        )  # fmt: skip
        newest = await h.client.call("GetHistory", hpb.GetHistoryRequest(bot=old.bot_id, conversation_id="c0", limit=1))
        assert newest.items[0].text == "one more" and newest.items[0].seq > before.items[0].seq
        assert event.seq == 7
        # c0's state went on from the migrated version (three messages wrote it)
        scope = h.host.db.query_one("SELECT scope_key FROM state WHERE key = 'count' AND value_json = '3'")[0]
        assert (await h.host.state.set(scope, "count", "4", if_version=3)).version == 4


async def test_migrate_to_refuses_a_running_host_and_a_password_in_argv(tmp_path: Path) -> None:
    async with HostHarness(tmp_path, runners=[Writer]) as h:
        code, _, err = await acli(h.host.data_dir, "db", "migrate-to", "postgresql://a@127.0.0.1/x")
        assert code == 2 and "a host is serving" in err
    code, _, err = await acli(tmp_path / "host", "db", "migrate-to", "postgresql://a:pw@127.0.0.1/x")
    assert code == 2 and "carries a password" in err
