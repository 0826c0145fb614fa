"""The database layer on both backends (SQLite, PostgreSQL: `store_target`): group commit with per-job isolation,
migrations, cursors, state and artifact rules."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time

import pytest

from agenthost.host.store.artifacts import ArtifactStore
from agenthost.host.store.cursors import CursorCodec
from agenthost.host.store.db import Database, connect
from agenthost.host.store.migrations import MIGRATIONS, migrate
from agenthost.host.store.state import StateStore
from agenthost.protos import errors


@pytest.fixture
async def db(store_target):
    d = Database(store_target)
    await d.open()
    yield d
    await d.close()


async def test_group_commit_isolates_a_failing_job(db):
    def ok(i):
        return lambda c: c.execute("INSERT INTO meta(key, value) VALUES (?, 'v')", (f"k{i}",))

    def bad(c):
        c.execute("INSERT INTO meta(key, value) VALUES ('poison', 'v')")
        raise ValueError("job failed after writing")

    def bad_sql(c):
        # A statement the database refuses: on PostgreSQL it aborts the whole transaction until ROLLBACK TO.
        c.execute("INSERT INTO meta(key, value) VALUES ('k0', 'duplicate')")

    jobs = [db.write(ok(i)) for i in range(25)] + [db.write(bad), db.write(bad_sql)]
    jobs += [db.write(ok(i)) for i in range(25, 50)]
    results = await asyncio.gather(*jobs, return_exceptions=True)
    assert isinstance(results[25], ValueError)
    assert isinstance(results[26], db.errors)
    keys = {r[0] for r in db.query("SELECT key FROM meta")}
    assert keys == {f"k{i}" for i in range(50)}  # the others committed, the failed jobs' rows did not
    assert db.query_one("SELECT value FROM meta WHERE key = 'k0'")["value"] == "v"
    assert db.batches < 52  # they shared commits


async def test_integrity_and_durability_settings(tmp_path):
    db = Database(tmp_path / "t.db")
    await db.open()
    await db.close()
    conn = connect(db.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_migrations_are_idempotent_and_refuse_a_newer_schema(tmp_path):
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    assert migrate(conn) == len(MIGRATIONS)
    assert migrate(conn) == len(MIGRATIONS)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(RuntimeError, match="newer"):
        migrate(conn)


def test_postgresql_migrates_an_empty_database_and_refuses_a_newer_schema(pg_cluster, monkeypatch):
    from agenthost.host.store import migrations_pg, postgres

    pg_cluster.admin("CREATE DATABASE empty_migrated TEMPLATE template0")
    conn = postgres.connect(pg_cluster.dsn("empty_migrated"))
    try:
        # As a host of the first PostgreSQL version left it, with a row: the next versions apply over it.
        every = migrations_pg.MIGRATIONS
        monkeypatch.setattr(migrations_pg, "MIGRATIONS", every[:1])
        assert migrations_pg.migrate(conn) == 1
        conn.execute("INSERT INTO meta(key, value) VALUES ('cursor_secret', 'kept')")
        monkeypatch.setattr(migrations_pg, "MIGRATIONS", every)
        assert migrations_pg.migrate(conn) == len(migrations_pg.MIGRATIONS)
        assert conn.execute("SELECT value FROM meta").fetchone()[0] == "kept"
        assert conn.execute("SELECT COUNT(*) FROM artifact_chunks").fetchone()[0] == 0  # the second version's
        assert migrations_pg.migrate(conn) == len(migrations_pg.MIGRATIONS)
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        sqlite = sqlite3.connect(":memory:")
        migrate(sqlite)
        # Every table SQLite has (its FTS5 shadow tables aside: PostgreSQL indexes the tables themselves).
        wanted = {
            r[0]
            for r in sqlite.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not r[0].startswith(("sqlite_", "transcript_fts", "kb_fts"))
        }
        assert wanted <= tables, wanted - tables
        conn.execute(f"INSERT INTO schema_version(version) VALUES ({len(migrations_pg.MIGRATIONS) + 1})")
        with pytest.raises(RuntimeError, match="newer"):
            migrations_pg.migrate(conn)
    finally:
        conn.close()
        pg_cluster.drop(pg_cluster.dsn("empty_migrated"))


async def test_postgresql_connections_the_server_drops_are_opened_again(pg_dsn, pg_cluster):
    """A restart or failover drops the host's connections. Reads and the next batch go on over new ones; a job
    whose transaction was cut is not acknowledged, and nothing of it is kept."""
    db = Database(pg_dsn)
    await db.open()
    try:
        st = StateStore(db)
        await st.set("s", "k", "1")
        assert st.get("s", "cached") is None  # the state store keeps what it read (StateStore's docstring)
        name = pg_dsn.split("/")[3].split("?")[0]
        drop = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        pg_cluster.admin(drop)
        # The reader's statement, run again on a new connection.
        assert db.query_one("SELECT version FROM state WHERE scope_key = 's' AND key = 'k'")[0] == 1
        assert (await st.set("s", "k", "2", if_version=1)).version == 2  # the writer reconnected before its BEGIN

        def cut(c):
            c.execute("INSERT INTO meta(key, value) VALUES ('cut', 'v')")
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        with pytest.raises(db.errors):
            await db.write(cut)
        assert (await st.set("s", "k", "3", if_version=2)).version == 3
        assert db.query_one("SELECT COUNT(*) FROM meta WHERE key = 'cut'")[0] == 0

        # The database stays unreachable: writes and reads fail with the driver's error, and closing still stops.
        pg_cluster.admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        pg_cluster.admin(drop)
        with pytest.raises(db.errors):
            await st.set("s", "k", "4")
        with pytest.raises(db.errors):
            st.get("s", "k")
        with pytest.raises(db.errors):  # nothing answered from what the state store kept, while the database is down
            st.get("s", "cached")
    finally:
        await asyncio.wait_for(db.close(), 30)


async def test_a_state_write_whose_caller_stopped_waiting_is_read_back_once_committed(pg_dsn):
    """On PostgreSQL the state store answers reads of keys from what it last read or wrote. A StateSet whose caller
    is cancelled while its job waits in the writer's queue still commits; a read made meanwhile (the old value) must
    not be what later reads are answered with."""
    db = Database(pg_dsn)
    await db.open()
    try:
        st = StateStore(db)
        await st.set("s", "k", '"old"')
        assert st.get("s", "k").value_json == '"old"'
        gate = threading.Event()
        held = db.write(lambda conn: gate.wait(30))  # the writer is busy: the next jobs wait behind this one
        held_task = asyncio.ensure_future(held)
        caller = asyncio.ensure_future(st.set("s", "k", '"new"'))
        async with asyncio.timeout(60):
            while db.pending_jobs < 2:  # noqa: ASYNC110 - a count on the writer's queue: no event to wait on
                await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert st.get("s", "k").value_json == '"old"'  # not committed yet
        gate.set()
        await held_task
        await db.write(lambda conn: None)  # the cancelled caller's job committed before this one
        assert db.query_one("SELECT value_json FROM state WHERE scope_key = 's' AND key = 'k'")[0] == '"new"'
        got = st.get("s", "k")
        assert (got.value_json, got.version) == ('"new"', 2)
    finally:
        await asyncio.wait_for(db.close(), 30)


async def test_one_host_per_postgresql_database(pg_dsn, tmp_path, monkeypatch):
    """As host.lock makes it one host per data dir: a second host, or a migration into the database, is refused
    while a host holds it, with who holds it; once that host stops, the database is free."""
    from agenthost.host.store import postgres
    from agenthost.host.store.db import DatabaseUnavailable
    from agenthost.host.store.transfer import Transfer, TransferError

    monkeypatch.setattr(postgres, "LOCK_PATIENCE_SECONDS", 0.3)
    first = Database(pg_dsn)
    await first.open()
    try:
        second = Database(pg_dsn)
        with pytest.raises(DatabaseUnavailable, match="another agenthost .agenthost-writer [^ ]+ from a local socket"):
            await second.open()
        source = Database(tmp_path / "src.db")
        await source.open()
        await source.close()
        with pytest.raises(TransferError, match="another agenthost .* stop it first"):
            Transfer(tmp_path / "src.db", pg_dsn).run()
    finally:
        await first.close()
    await second.open()
    await second.close()


def test_cursors_are_bound_to_their_conversation():
    codec = CursorCodec(b"s" * 32)
    cursor = codec.encode("history", "bot\x1fc1", 42)
    assert codec.decode("history", "bot\x1fc1", cursor) == 42
    for scope, kind in (("bot\x1fc2", "history"), ("bot2\x1fc1", "history"), ("bot\x1fc1", "events")):
        with pytest.raises(errors.InvalidArgument):
            codec.decode(kind, scope, cursor)
    for junk in ("", "!!!", "x" * 500, "NDIuMDAwMA"):
        with pytest.raises(errors.InvalidArgument):
            codec.decode("history", "bot\x1fc1", junk)
    with pytest.raises(errors.InvalidArgument):
        CursorCodec(b"t" * 32).decode("history", "bot\x1fc1", cursor)  # another data dir's secret


async def test_state_rules(db):
    st = StateStore(db)
    assert (await st.set("s", "a.b", "1")).version == 1
    await st.set("s", "a_c", "2")
    await st.set("s", "ab", "3")
    keys, more = st.list("s", "a_", "", 10)
    assert keys == ["a_c"] and not more  # _ is literal, not a LIKE wildcard
    keys, more = st.list("s", "", "", 2)
    assert keys == ["a.b", "a_c"] and more
    keys, _ = st.list("s", "", "a_c", 10)
    assert keys == ["ab"]
    with pytest.raises(errors.InvalidArgument):
        await st.set("s", "a%b", "1")
    assert (await st.set("s", "ab", "4", if_version=1)).version == 2
    with pytest.raises(errors.Aborted):
        await st.set("s", "ab", "5", if_version=1)
    with pytest.raises(errors.Aborted):
        await st.set("s", "new", "5", if_version=3)
    assert (await st.set("s", "new", "6", if_version=0)).version == 1
    assert st.get("other-scope", "ab") is None
    assert await st.delete("s", "ab") and not await st.delete("s", "ab")


async def test_artifacts_dedupe_and_cut_uploads_leave_nothing(db, tmp_path):
    store = ArtifactStore(db, tmp_path / "art", max_bytes=1000)

    async def chunks(*parts, fail=False):
        for p in parts:
            yield p
        if fail:
            raise ConnectionError("client went away")

    kw = dict(name="n", mime_type="text/plain", metadata_json="{}", bot_id="b", conversation_id="c", run_id="r")
    a = await store.create(chunks(b"hello ", b"world"), **kw)
    b = await store.create(chunks(b"hello world"), **kw)
    assert a.artifact_id != b.artifact_id and a.sha256 == b.sha256
    if db.backend == "sqlite":
        assert len(list((tmp_path / "art" / "objects").rglob("*"))) == 2  # one dir + one object
    else:  # the bytes are in the database, once; no file
        assert db.query_one("SELECT COUNT(*) FROM artifact_chunks")[0] == 1
        assert not list((tmp_path / "art" / "objects").rglob("*"))
    assert store.read(a.sha256, 6, 100) == b"world"
    with pytest.raises(ConnectionError):
        await store.create(chunks(b"partial", fail=True), **kw)
    with pytest.raises(errors.ResourceExhausted):
        await store.create(chunks(b"x" * 600, b"y" * 600), **kw)
    with pytest.raises(errors.InvalidArgument):
        await store.create(chunks(b"abc"), **{**kw, "name": "a\x00b"})
    with pytest.raises(errors.InvalidArgument):
        await store.create(chunks(b"abc"), expected_size=5, **kw)
    assert list((tmp_path / "art" / "tmp").iterdir()) == []
    assert len(db.query("SELECT * FROM artifacts")) == 2


async def test_artifact_reads_cross_object_chunks_and_empty_objects_read_empty(db, tmp_path, monkeypatch):
    """Ranges that start, end or span the boundaries of the database's chunks read the same as from a file, for
    streamed uploads and for attachments stored with their row (store_object + insert_row)."""
    from agenthost.host.store import artifacts
    from agenthost.protos import common_pb2 as pb

    monkeypatch.setattr(artifacts, "CHUNK_BYTES", 1000)
    store = ArtifactStore(db, tmp_path / "art")
    data = bytes(range(256)) * 13  # 3328 bytes: three whole chunks and a part

    async def parts():
        yield data[:1500]
        yield data[1500:]

    kw = dict(name="n", mime_type="", metadata_json="", bot_id="b", conversation_id="c", run_id="r")
    ref = await store.create(parts(), **kw)
    for offset, length in ((0, 1000), (999, 2), (1000, 1000), (500, 3000), (3000, 1000), (3328, 10), (0, 0)):
        assert store.read(ref.sha256, offset, length) == data[offset : offset + length], (offset, length)
    empty = await store.create(_none(), **kw)
    assert empty.size_bytes == 0 and store.read(empty.sha256, 0, 100) == b""
    attached = b"attached " * 300
    sha = store.store_object(attached)
    att = pb.ArtifactRef(artifact_id="art_x", name="a", mime_type="text/plain", size_bytes=len(attached), sha256=sha)
    await db.write(lambda c: ArtifactStore.insert_row(c, att, "b", data=attached))
    assert store.read(sha, 990, 30) == attached[990:1020]


async def _none():
    return
    yield b""


async def test_conversation_stats_follow_the_transcript_and_survive_migration(tmp_path):
    from agenthost.host.store.conversations import Conversations, NewItem

    path = tmp_path / "s.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for statement in __import__("agenthost.host.store.migrations", fromlist=["x"])._statements(MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("COMMIT")
    conn.execute(  # a row written by a version-1 host, before the counters existed
        "INSERT INTO transcript(item_id, bot_id, conversation_id, run_id, event_id, role, item_type, text, data_json,"
        " tool_call_id, tool_name, is_error, attachments_json, created_at) VALUES"
        " ('it_old','b','c','r','e','user','message','old','{}','','',0,'[]',1.0)"
    )
    conn.close()
    db = Database(path)
    await db.open()  # migrates to the newest version, backfilling the counters
    conv = Conversations(db, CursorCodec(b"k" * 32))
    assert conv.history_stats("b", "c")[0] == 1
    items = [NewItem(role="user", item_type="message", text=f"m{i}") for i in range(3)]
    await db.write(
        lambda c: conv.insert_items(c, bot_id="b", conversation_id="c", run_id="r", event_id="e", items=items)
    )
    count, latest = conv.history_stats("b", "c")
    assert count == 4
    newest = conv.page_history("b", "c", cursor="", forward=False, limit=1).items[0]
    assert latest == newest.cursor and newest.text == "m2"
    assert conv.history_stats("b", "other") == (0, "")
    assert conv.list_conversations("b")[0][:2] == ("c", 4)
    await db.close()


async def test_transcript_items_learn_their_turn_on_migration(tmp_path):
    """Rows written before v8 get the seq of their event (0 when it is unknown, which every run sees), so a run
    reading as of its event (ActiveRun.horizon) leaves out older rows of later turns too."""
    from agenthost.host.store import migrations
    from agenthost.host.store.conversations import Conversations

    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for script in MIGRATIONS[:7]:
        for statement in migrations._statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 7")
    conn.execute("COMMIT")
    for n in (1, 2):
        conn.execute(
            "INSERT INTO events(event_id, bot_id, conversation_id, event_type, source, actor_json, text, data_json,"
            f" created_at) VALUES ('e{n}','b','c','message.received','api','{{}}','m{n}','{{}}',1.0)"
        )
    for item, event in (("i1", "e1"), ("i2", "e2"), ("i3", "gone")):
        conn.execute(
            "INSERT INTO transcript(item_id, bot_id, conversation_id, run_id, event_id, role, item_type, text,"
            " data_json, tool_call_id, tool_name, is_error, attachments_json, created_at) VALUES"
            f" ('{item}','b','c','r','{event}','user','message','{item}','{{}}','','',0,'[]',1.0)"
        )
    conn.close()
    db = Database(path)
    await db.open()
    conv = Conversations(db, CursorCodec(b"k" * 32))
    seen = conv.page_history("b", "c", cursor="", forward=True, limit=10, through_event=1).items
    # An item of no known turn precedes every turn, in the page order as in what every run sees.
    assert [i.text for i in seen] == ["i3", "i1"]
    assert conv.history_stats("b", "c", 1)[0] == 2
    assert [i.text for i in conv.page_history("b", "c", cursor="", forward=True, limit=10).items] == ["i3", "i1", "i2"]
    await db.close()


async def test_stored_items_read_as_the_items_their_columns_make(db):
    """Each transcript row stores its item serialized, seq and cursor included (migration _V12), and a page is those
    bytes joined; a row without them (an older host's) is built from its columns. Both read the same, to the byte,
    in pages, search and recent, and the response made of the stored bytes parses as the one built. The seqs written
    are AUTOINCREMENT's: never the seq of a deleted row, which an old cursor may still name."""
    from agenthost.host.store.conversations import Conversations, NewItem, conversation_scope
    from agenthost.protos import common_pb2 as pb
    from agenthost.protos import run_api_pb2 as api
    from agenthost.protos.wire import page_message

    conv = Conversations(db, CursorCodec(b"k" * 32))
    ref = pb.ArtifactRef(
        artifact_id="ar_1", name="a.png", mime_type="image/png", size_bytes=3, sha256="ab", conversation_id="c"
    )
    event = await db.write(
        lambda c: Conversations.insert_event(
            c,
            bot_id="b",
            conversation_id="c",
            event_type="message.received",
            source="test",
            actor=pb.Actor(actor_type="user", actor_id="u"),
            text="hello",
            data_json="{}",
        )
    )

    async def add(*items: NewItem) -> None:
        await db.write(
            lambda c: conv.insert_items(
                c, bot_id="b", conversation_id="c", run_id="r", event_id=event.event_id, items=items
            )
        )

    await add(NewItem(role="user", item_type="message", text="hello ünïcode", attachments=[ref]))
    await add(
        NewItem(role="tool", item_type="tool_result", text="x" * 300, data_json='{"k": 1}', tool_call_id="t1"),
        NewItem(role="assistant", item_type="message", text="gone", is_error=True),
    )
    await db.write(lambda c: c.execute("DELETE FROM transcript WHERE text = 'gone'"))
    await add(NewItem(role="assistant", item_type="message", text="hello again"))

    def read() -> tuple[object, ...]:
        first = conv.page_history_encoded("b", "c", cursor="", forward=True, limit=2)
        rest = conv.page_history_encoded("b", "c", cursor=first.next_cursor, forward=True, limit=2)
        return (
            first,
            rest,
            conv.page_history("b", "c", cursor="", forward=False, limit=10),
            conv.search("b", "c", "hello", roles=[], item_types=[], top_k=5),
            conv.recent("b", "c", 10),
        )

    stored = read()
    items = stored[2].items
    assert [i.text for i in items] == ["hello again", "x" * 300, "hello ünïcode"]
    assert items[0].seq == items[1].seq + 2  # past the deleted row's seq
    assert items[2].attachments[0].name == "a.png"
    scope = conversation_scope("b", "c")
    assert all(i.cursor == conv.cursors.encode("history", scope, event.seq, i.seq) for i in items)
    first = stored[0]
    assert api.HistoryPageResponse.FromString(
        page_message(first.items, first.next_cursor, first.has_more)
    ) == api.HistoryPageResponse(items=items[:0:-1], next_cursor=items[1].cursor, has_more=True)

    await db.write(lambda c: c.execute("UPDATE transcript SET item_pb = NULL"))  # as an older host left them
    assert read() == stored


async def test_history_search_keeps_one_contract_on_both_backends(db):
    """Every word must occur (as a phrase of its tokens), case folded; user text is never query syntax; best match
    first (more of the words, in a shorter item); roles and a run's horizon filter."""
    from agenthost.host.store.conversations import Conversations, NewItem
    from agenthost.protos import common_pb2 as pb

    conv = Conversations(db, CursorCodec(b"k" * 32))
    texts = [
        "apple pie",
        "an apple and then, much later and after a long detour through the orchard, one slice of pie",
        "banana pie",
        "send it by e-mail",
        "email later",
        "Pie pie pie, apple",
        'quote " and ) OR NOT * and :1 & | !',
    ]
    event = await db.write(
        lambda c: Conversations.insert_event(
            c, bot_id="b", conversation_id="c", event_type="message.received", source="test",
            actor=pb.Actor(actor_type="user", actor_id="u"), text="x", data_json="{}",
        )
    )  # fmt: skip
    items = [
        NewItem(role="assistant" if t.startswith("banana") else "user", item_type="message", text=t) for t in texts
    ]
    await db.write(
        lambda c: conv.insert_items(
            c, bot_id="b", conversation_id="c", run_id="r", event_id=event.event_id, items=items
        )
    )

    def found(query: str, **kw: object) -> list[str]:
        args = {"roles": [], "item_types": [], "top_k": 10, **kw}
        return [i.text for i in conv.search("b", "c", query, **args)]  # type: ignore[arg-type]

    assert set(found("APPLE pie")) == {texts[0], texts[1], texts[5]}  # every word, any case
    assert found("apple pie")[-1] == texts[1]  # the long item with the words far apart ranks last
    assert set(found("pie")) == {texts[0], texts[1], texts[2], texts[5]}
    assert found("pie", roles=["assistant"]) == ["banana pie"]
    assert found("e-mail") == [texts[3]]  # a phrase of its tokens, not "email"
    assert found("banana cherry") == []
    for hostile in ('"', ") OR NOT (", "*", ":1 & |", "!", "\x00apple"):
        found(hostile)  # never a syntax error
    assert found("apple", through_event=event.seq - 1) == []
    assert conv.search("b", "other", "apple", roles=[], item_types=[], top_k=5) == []


async def test_worker_enrolment_rules_on_both_backends(db):
    """A join token is single use; a name an enrolled worker holds is refused; a revoked worker's name enrols again
    with its new certificate (the row replaced in place, on either backend's upsert)."""
    from agenthost.host.store.workers import WorkerStore

    workers = WorkerStore(db)
    await workers.add_token("h1", "gpu", expires_at=1e12)
    await workers.add_token("h2", "gpu", expires_at=1e12)
    await workers.add_token("old", "gpu", expires_at=1.0)
    first = await workers.enrol("h1", "w1", "serial-1", 1e12)
    assert (first.pool, first.serial, first.draining) == ("gpu", "serial-1", False)
    with pytest.raises(errors.Unauthenticated, match="already used"):
        await workers.enrol("h1", "w2", "serial-2", 1e12)
    with pytest.raises(errors.Unauthenticated, match="expired"):
        await workers.enrol("old", "w3", "serial-3", 1e12)
    with pytest.raises(errors.AlreadyExists):
        await workers.enrol("h2", "w1", "serial-4", 1e12)
    await workers.set_draining("w1", True)
    await workers.revoke("w1")
    await workers.add_token("h3", "cpu", expires_at=1e12)
    again = await workers.enrol("h3", "w1", "serial-5", 1e12)
    assert workers.get("w1") == again
    assert (again.pool, again.serial, again.draining, again.revoked_at) == ("cpu", "serial-5", False, None)
    assert [w.name for w in workers.list()] == ["w1"]


async def test_worker_renewal_rules_on_both_backends(db):
    """A renewal keeps the certificate it was made with accepted until that one expires and no other earlier one;
    one made from the previous certificate (its first answer lost) keeps the previous; a revoked worker, or a
    certificate no longer accepted, renews nothing."""
    import time

    from agenthost.host.store.workers import WorkerStore

    workers = WorkerStore(db)
    await workers.add_token("h1", "gpu", expires_at=1e12)
    far = time.time() + 3600
    await workers.enrol("h1", "w1", "s1", far)
    second = await workers.renew("w1", "s1", far, "s2", far + 10)
    assert (second.serial, second.previous_serial, second.previous_expires_at) == ("s2", "s1", far)
    assert workers.get("w1") == second and second.renewed_at > 0
    assert second.accepts("s1", time.time()) and second.accepts("s2", time.time())
    assert not second.accepts("s1", far) and not second.accepts("s0", time.time())
    third = await workers.renew("w1", "s1", far, "s3", far + 20)  # from the previous one: it stays the previous
    assert (third.serial, third.previous_serial) == ("s3", "s1")
    assert not third.accepts("s2", time.time())
    with pytest.raises(errors.Unauthenticated, match="no longer accepted"):
        await workers.renew("w1", "s2", far + 10, "s4", far + 30)
    await workers.revoke("w1")
    with pytest.raises(errors.Unauthenticated, match="revoked"):
        await workers.renew("w1", "s3", far + 20, "s5", far + 40)
    assert workers.get("w1").serial == "s3"


async def test_a_worker_enrolled_before_renewal_existed_keeps_its_old_certificate_until_it_expires(db):
    """Its row has no expiry (0): the certificate it renews from stays accepted until the expiry the certificate
    itself bears (it was refused at once, cutting the runs still going over its old connection)."""
    import time

    from agenthost.host.store.workers import WorkerStore

    workers = WorkerStore(db)
    await workers.add_token("h1", "gpu", expires_at=1e12)
    await workers.enrol("h1", "w1", "old", 0)  # as a row migrated from before renewal reads
    bears = time.time() + 300 * 24 * 3600
    renewed = await workers.renew("w1", "old", bears, "new", time.time() + 3600)
    assert renewed.previous_expires_at == bears and renewed.accepts("old", time.time())


async def test_a_kept_page_is_served_until_its_conversation_changes(db):
    """The run API's pages (Conversations.page_history_message) on both backends: the same request again is the same
    bytes, the store's own page; once an item is added the next answer has it; another horizon is its own page."""
    from agenthost.host.store.conversations import Conversations, NewItem
    from agenthost.protos import common_pb2 as pb
    from agenthost.protos.wire import page_message

    conv = Conversations(db, CursorCodec(b"k" * 32))

    async def say(text: str) -> pb.EventRecord:
        event = await db.write(
            lambda c: Conversations.insert_event(
                c,
                bot_id="b",
                conversation_id="c",
                event_type="message.received",
                source="test",
                actor=pb.Actor(actor_type="user", actor_id="u"),
                text=text,
                data_json="{}",
            )
        )
        await add(event, NewItem(role="user", item_type="message", text=text))
        return event

    async def add(event: pb.EventRecord, item: NewItem) -> None:
        await db.write(
            lambda c: conv.insert_items(
                c, bot_id="b", conversation_id="c", run_id="r", event_id=event.event_id, items=[item]
            )
        )

    def page(event: pb.EventRecord) -> bytes:
        return conv.page_history_message("b", "c", cursor="", forward=False, limit=50, through_event=event.seq)

    def stored(event: pb.EventRecord) -> bytes:
        got = conv.page_history_encoded("b", "c", cursor="", forward=False, limit=50, through_event=event.seq)
        return page_message(got.items, got.next_cursor, got.has_more)

    first = await say("one")
    later = await say("two")
    assert page(first) == page(first) == stored(first)
    assert page(later) == stored(later) != page(first)
    await add(later, NewItem(role="assistant", item_type="message", text="reply to two"))  # within `later`'s view
    assert b"reply to two" in page(later) and page(later) == stored(later)
    assert page(first) == stored(first)
    newest = await say("three")
    assert page(newest) == stored(newest) and b"three" in page(newest)


def test_page_cache_keeps_to_its_byte_budget_and_never_serves_another_version():
    from agenthost.host.store.conversations import PageCache

    cache = PageCache(budget=100, entry_max=60)
    cache.put("a", 1, b"x" * 40)
    cache.put("b", 1, b"y" * 40)
    assert cache.get("a", 1) == b"x" * 40  # "b" is now the least recently used
    cache.put("c", 1, b"z" * 40)
    assert cache.get("b", 1) is None and cache.get("a", 1) == b"x" * 40 and cache.get("c", 1) == b"z" * 40
    cache.put("big", 1, b"w" * 61)  # larger than one entry may be: read from the store each time
    assert cache.get("big", 1) is None
    assert cache.get("a", 2) is None  # its conversation changed: dropped
    assert cache.get("a", 1) is None


async def _one_batch(db: Database, fns: list, *, committed: bool = True) -> list:
    """Runs `fns` as the jobs of one write batch: the writer is held in a job until they are all queued."""
    queued, release = threading.Event(), threading.Event()

    def hold(c):
        queued.set()
        assert release.wait(30)

    first = asyncio.ensure_future(db.write(hold))
    assert await asyncio.to_thread(queued.wait, 30)
    jobs = [asyncio.ensure_future(db.write(fn)) for fn in fns]
    await asyncio.sleep(0)  # every job in the queue before the writer takes its next batch
    release.set()
    await first
    batches = db.batches
    results = await asyncio.gather(*jobs, return_exceptions=True)
    assert db.batches == batches + committed, "the jobs did not share one batch"
    return results


async def test_a_pipelined_batch_keeps_each_jobs_failure_and_results_its_own(pg_dsn):
    """On PostgreSQL the writer sends a batch in pipeline mode (statements without waiting for each other). A job
    whose statement the server refuses fails alone and unacknowledged; the jobs around it commit and are answered
    with what they read: RETURNING, `rowcount` (which psycopg sets only once the answer arrived), counts."""
    db = Database(pg_dsn)
    await db.open()
    try:
        await db.write(lambda c: c.execute("INSERT INTO meta(key, value) VALUES ('taken', 'v'), ('u1', 'a')"))

        def insert(key):
            sql = "INSERT INTO meta(key, value) VALUES (?, 'v') RETURNING key"
            return lambda c: c.execute(sql, (key,)).fetchone()[0]

        def update(c):
            return c.execute("UPDATE meta SET value = 'b' WHERE key IN ('u1', 'k0')").rowcount

        def delete_none(c):
            return c.execute("DELETE FROM meta WHERE key = 'nothing'").rowcount

        def count(c):
            return c.execute("SELECT COUNT(*) FROM meta").fetchone()[0]

        conn = await db.write(lambda c: c)
        trips = conn.round_trips
        fns = [insert("k0"), update, delete_none, count]
        results = await _one_batch(db, fns)
        assert results == ["k0", 2, 0, 3]
        assert db.unpipelined == 0
        # The holding job's batch (2), then BEGIN with the fence, the four reads (RETURNING, two rowcounts, the
        # count), the rest up to COMMIT: a round trip each (unpipelined: 15 statements, 11 with RELEASE chained).
        assert conn.round_trips - trips == 2 + 1 + 4 + 1

        results = await _one_batch(db, [insert("k1"), insert("taken"), update, delete_none, count, insert("k2")])
        assert results[0] == "k1" and results[2] == 2 and results[3] == 0 and results[4] == 4 and results[5] == "k2"
        assert isinstance(results[1], db.errors) and "duplicate key" in str(results[1])
        assert db.unpipelined == 1  # found in the pipeline, given to its job by the batch run again unpipelined
        keys = {r[0] for r in db.query("SELECT key FROM meta")}
        assert keys == {"taken", "u1", "k0", "k1", "k2"}
    finally:
        await db.close()


async def test_a_pipelined_batch_that_lost_its_connection_or_lease_writes_nothing(pg_dsn):
    """A batch whose connection is cut mid-pipeline, or whose host lost the lease, commits none of its jobs and
    acknowledges none: every caller hears the error."""
    from agenthost.host.store.db import LeaseLostError

    db = Database(pg_dsn)
    await db.open()
    try:

        def insert(key):
            return lambda c: c.execute("INSERT INTO meta(key, value) VALUES (?, 'v')", (key,))

        def cut(c):
            c.execute("INSERT INTO meta(key, value) VALUES ('cut', 'v')")
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        results = await _one_batch(db, [insert("a"), cut, insert("b")], committed=False)
        assert all(isinstance(r, db.errors) for r in results), results
        assert db.query_one("SELECT COUNT(*) FROM meta WHERE key IN ('a', 'b', 'cut')")[0] == 0

        await db.write(insert("before"))  # the writer reconnected
        import psycopg

        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("UPDATE lease SET epoch = epoch + 1, holder = 'another host'")
        results = await asyncio.gather(*(db.write(insert(k)) for k in ("c", "d", "e")), return_exceptions=True)
        assert all(isinstance(r, (LeaseLostError, db.errors)) for r in results), results
        assert "another host" in str(results[0])
        assert db.query_one("SELECT COUNT(*) FROM meta WHERE key IN ('c', 'd', 'e')")[0] == 0
    finally:
        await db.close()


def _message_job(conv, text):
    """A send's writes: the message's event and its transcript item, the event's seq passed on (as RunManager)."""
    from agenthost.host.store.conversations import Conversations, NewItem
    from agenthost.protos import common_pb2 as pb

    def job(conn):
        event = Conversations.insert_event(
            conn,
            bot_id="b",
            conversation_id="c",
            event_type="message.received",
            source="test",
            actor=pb.Actor(actor_type="user", actor_id="u"),
            text=text,
            data_json="{}",
        )
        conv.insert_items(
            conn,
            bot_id="b",
            conversation_id="c",
            run_id="r",
            event_id=event.event_id,
            items=[NewItem(role="user", item_type="message", text=text)],
            event_seq=event.seq,
        )
        return event.seq

    return job


async def test_the_writer_numbers_events_and_items_itself_past_every_number_given_and_after_a_failover(pg_dsn):
    """On PostgreSQL the active host numbers events and transcript items itself (PgConnection.numbered): a send's
    job reads nothing back, so a pipelined batch of sends is two round trips. Numbers are never given twice: not
    after a batch that did not commit (a gap, which readers page across), not after the newest rows were deleted,
    not on the host that takes the lease over (it counts on from the database)."""
    from agenthost.host.store.conversations import Conversations

    db = Database(pg_dsn)
    await db.open()
    conv = Conversations(db, CursorCodec(b"k" * 32))
    try:
        first = await db.write(_message_job(conv, "m0"))  # the count starts from the database here
        conn = await db.write(lambda c: c)
        trips = conn.round_trips
        seqs = await _one_batch(db, [_message_job(conv, f"m{i}") for i in range(1, 6)])
        assert seqs == list(range(first + 1, first + 6))
        # The holding job's batch (2), then BEGIN with the fence, and the rest up to COMMIT: nothing read between.
        assert conn.round_trips - trips == 2 + 1 + 1

        def cut(c):
            _message_job(conv, "lost")(c)
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        lost = await _one_batch(db, [cut], committed=False)
        assert isinstance(lost[0], db.errors)
        after_gap = await db.write(_message_job(conv, "m6"))
        assert after_gap > seqs[-1] + 1  # the lost batch's number is skipped, not given again
        page = conv.page_history("b", "c", cursor="", forward=True, limit=3)
        items = [i.text for i in page.items]
        while page.has_more:
            page = conv.page_history("b", "c", cursor=page.next_cursor, forward=True, limit=3)
            items += [i.text for i in page.items]
        assert items == [f"m{i}" for i in range(7)]  # paged across the gap, nothing missed or repeated
        newest = db.query_one("SELECT MAX(seq) FROM transcript")[0]
        await db.write(lambda c: c.execute("DELETE FROM transcript WHERE seq = ?", (newest,)))
        await db.write(lambda c: c.execute("DELETE FROM events WHERE seq = ?", (after_gap,)))
    finally:
        await db.close()
    # The next holder of the lease counts on from the database: past every number given, deleted rows' too.
    db = Database(pg_dsn)
    await db.open()
    conv = Conversations(db, CursorCodec(b"k" * 32))
    try:
        assert await db.write(_message_job(conv, "m7")) == after_gap + 1
        seqs = [r[0] for r in db.query("SELECT seq FROM transcript ORDER BY seq")]
        assert seqs[-1] > newest and len(seqs) == len(set(seqs)) == 7
    finally:
        await db.close()


async def test_kept_pages_answer_without_a_round_trip_and_only_while_the_lease_is_proven(pg_dsn, monkeypatch):
    """On PostgreSQL a kept history page is served by the version the writer counts (no round trip for the
    conversation's count), read again after a commit into it or a batch that did not commit. A host that lost the
    lease without knowing it (nothing it wrote committed for LEASE_PROOF_SECONDS) answers neither kept pages nor kept
    state values: the new holder's writes are read from the database."""
    from agenthost.host import limits
    from agenthost.host.store import postgres
    from agenthost.host.store.conversations import Conversations, NewItem

    # Long enough that a loaded machine's pauses between two statements below never outlast the proof, short enough
    # to wait out once.
    monkeypatch.setattr(limits, "LEASE_PROOF_SECONDS", 3.0)
    db = Database(pg_dsn)
    await db.open()
    conv = Conversations(db, CursorCodec(b"k" * 32))
    st = StateStore(db)
    other = postgres.connect(pg_dsn)
    try:

        def texts():
            page = pb_page(conv.page_history_message("b", "c", cursor="", forward=True, limit=10))
            return [i.text for i in page.items]

        await db.write(_message_job(conv, "m0"))
        await st.set("s", "k", '"v1"')
        assert texts() == ["m0"]
        trips = db.reader.round_trips
        assert texts() == ["m0"] and st.get("s", "k").value_json == '"v1"'
        assert db.reader.round_trips == trips  # kept page, kept value: nothing read
        await db.write(_message_job(conv, "m1"))
        assert texts() == ["m0", "m1"]  # a commit into the conversation: read again

        def fails(c):
            _message_job(conv, "lost")(c)
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")

        generation = db.generation
        assert isinstance((await _one_batch(db, [fails], committed=False))[0], db.errors)
        assert db.generation > generation and texts() == ["m0", "m1"]
        await db.write(lambda c: None)  # the writer reconnected: the database is up again
        assert texts() == ["m0", "m1"]  # kept again

        # Cut off: this host writes nothing more (as a host partitioned from the database would), another takes
        # the lease and writes once this host's proof ran out (claim_lease's grace).
        assert db.proven
        other.execute("UPDATE lease SET epoch = epoch + 1, holder = 'another host'")
        await asyncio.sleep(limits.LEASE_PROOF_SECONDS + 0.2)
        conv.insert_items(
            other,
            bot_id="b",
            conversation_id="c",
            run_id="r2",
            event_id="e",
            items=[NewItem("user", "message", "m2")],
            event_seq=10**9,
        )
        other.execute("UPDATE state SET value_json = '\"v2\"', version = version + 1 WHERE key = 'k'")
        assert texts() == ["m0", "m1", "m2"]
        assert st.get("s", "k").value_json == '"v2"'
        with pytest.raises(db.errors, match="another host"):
            await db.write(lambda c: None)
        assert texts() == ["m0", "m1", "m2"] and st.get("s", "k").value_json == '"v2"'
    finally:
        other.close()
        await db.close()


def pb_page(message: bytes):
    from agenthost.protos import run_api_pb2

    return run_api_pb2.HistoryPageResponse.FromString(message)


async def test_a_host_taking_the_lease_from_one_that_did_not_release_it_waits_out_its_proof(pg_dsn, monkeypatch):
    """A host that stopped cleanly released the lease: the next one writes at once. One cut off (its session ended
    without a release) may still answer reads from memory until its proof runs out, so the next holder waits
    LEASE_TAKEOVER_GRACE_SECONDS before its first write."""
    from agenthost.host import limits

    assert limits.LEASE_TAKEOVER_GRACE_SECONDS > limits.LEASE_PROOF_SECONDS
    monkeypatch.setattr(limits, "LEASE_TAKEOVER_GRACE_SECONDS", 3.0)
    db = Database(pg_dsn)
    await db.open()
    await db.close()  # released
    t0 = time.monotonic()
    db = Database(pg_dsn)
    await db.open()
    assert time.monotonic() - t0 < 3.0
    conn = await db.write(lambda c: c)
    conn.raw.close()  # cut off: its session ends without a release (HOST_LOCK goes with it)
    t0 = time.monotonic()
    nxt = Database(pg_dsn)
    await nxt.open()
    try:
        assert time.monotonic() - t0 >= 3.0
    finally:
        await nxt.close()
        with contextlib.suppress(*db.errors):
            await db.close()
