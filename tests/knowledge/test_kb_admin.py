"""The knowledge base through the admin API (what `agenthost kb ...` calls), on a real host, with the fake
embeddings endpoint on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from pathlib import Path

import pytest

from agenthost.host import knowledge as kb_module
from agenthost.host.api.client import HostClient
from agenthost.host.cli import main as cli
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

from .conftest import add, search, use_endpoint
from .fake_embeddings import FakeEmbeddings

pytestmark = pytest.mark.timeout(60)

FLEET = "# Fleet tracking\nFleet tracking records each vehicle's location every 30 seconds.\nTrips are stored a year."
REFUNDS = "# Refunds\nRefunds are issued to the original card within 5 business days."
CRON = "# Scheduled jobs\nScheduled jobs use cron syntax.\nThe shortest interval is one minute."


def rows(h: HostHarness, sql: str, *params: object) -> list[tuple]:
    return [tuple(r) for r in h.host.db.query_tuples(sql, params)]


def indexed(h: HostHarness, word: str) -> int:
    """How many chunks the keyword index finds for a word (FTS5's table; PostgreSQL's tsvector column)."""
    if h.host.db.backend == "sqlite":
        return rows(h, "SELECT COUNT(*) FROM kb_fts WHERE kb_fts MATCH ?", word)[0][0]
    return rows(h, "SELECT COUNT(*) FROM kb_chunks WHERE text_tsv @@ to_tsquery('agenthost_kb', ?)", word)[0][0]


async def test_add_list_search_remove_keyword_only(host: HostHarness) -> None:
    h = host
    fleet = await add(h, "fleet.md", FLEET)
    refunds = await add(h, "refunds.md", REFUNDS)
    assert fleet.chunks == 1 and fleet.embedding_space == ""  # no endpoint anywhere: keyword search only
    # the bytes are an artifact of the bot, content-addressed
    assert fleet.sha256 == hashlib.sha256(FLEET.encode()).hexdigest() and fleet.size_bytes == len(FLEET.encode())
    art = h.host.artifacts.get(fleet.artifact_id)
    assert art is not None and art[1] == h.host.registry.bot(h.bot).bot_id
    listed = await h.client.call("KbListDocuments", hpb.BotRequest(bot=h.bot))
    assert [d.doc_id for d in listed.documents] == [fleet.doc_id, refunds.doc_id] and listed.chunks == 2

    found = await search(h, "where is each vehicle? tracking")
    assert found.keyword_only and "no embeddings endpoint" in found.keyword_only_reason
    assert [hit.doc_id for hit in found.hits] == [fleet.doc_id]
    hit = found.hits[0]
    assert (hit.document_name, hit.start_line, hit.end_line, hit.keyword_rank, hit.vector_rank) == (
        "fleet.md",
        1,
        3,
        1,
        0,
    )
    assert hit.text == FLEET and hit.artifact_id == fleet.artifact_id
    # a paraphrase shares no word with the document: keywords alone cannot find it
    assert not (await search(h, "automobile position history")).hits

    assert indexed(h, "vehicle") == 1
    await h.client.call("KbRemoveDocument", hpb.KbRemoveDocumentRequest(bot=h.bot, doc_id=fleet.doc_id))
    assert not (await search(h, "vehicle tracking")).hits
    assert rows(h, "SELECT COUNT(*) FROM kb_chunks WHERE doc_id = ?", fleet.doc_id) == [(0,)]
    assert indexed(h, "vehicle") == 0  # the index forgot it too
    assert h.host.artifacts.get(fleet.artifact_id) is None  # and the document's artifact is gone
    assert h.host.artifacts.get(refunds.artifact_id) is not None
    with pytest.raises(errors.NotFound):
        await h.client.call("KbRemoveDocument", hpb.KbRemoveDocumentRequest(bot=h.bot, doc_id=fleet.doc_id))
    listed = await h.client.call("KbListDocuments", hpb.BotRequest(bot=h.bot))
    assert [d.doc_id for d in listed.documents] == [refunds.doc_id]


async def test_hybrid_finds_paraphrases_and_sends_the_stored_key(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    with pytest.raises(errors.FailedPrecondition, match="keys set EMBED_KEY"):
        await use_endpoint(h, embeddings, key="EMBED_KEY")  # a key the host does not have is refused up front
    await h.client.call("SetKey", hpb.SetKeyRequest(name="EMBED_KEY", value="sk-embed-123"))
    shown = await use_endpoint(h, embeddings, key="EMBED_KEY")
    assert (shown.scope, shown.provider, shown.key) == ("*", "openai", "EMBED_KEY")  # host-wide
    fleet = await add(h, "fleet.md", FLEET)
    await add(h, "refunds.md", REFUNDS)
    await add(h, "cron.md", CRON)
    assert fleet.embedding_space == "openai:fake-concepts:"
    assert embeddings.requests[-1].headers["authorization"] == "Bearer sk-embed-123"
    assert embeddings.requests[-1].path == "/v1/embeddings"

    found = await search(h, "automobile position history", top_k=3)
    assert not found.keyword_only and found.documents_without_vectors == 0
    assert found.hits[0].doc_id == fleet.doc_id
    assert (found.hits[0].keyword_rank, found.hits[0].vector_rank) == (0, 1)  # found by meaning only
    assert math.isclose(found.hits[0].score, 1 / 61)
    # the same query again is answered from the host's query cache: no second request to the endpoint
    before = len(embeddings.requests)
    await search(h, "automobile position history", top_k=3)
    assert len(embeddings.requests) == before

    # a bot can opt out of the host-wide endpoint
    await h.client.call(
        "KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(bot=h.bot, embeddings=hpb.KbEmbeddings(provider="none"))
    )
    opted_out = await search(h, "automobile position history")
    assert opted_out.keyword_only and not opted_out.hits
    await h.client.call("KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(bot=h.bot, clear=True))
    effective = await h.client.call("KbGetEmbeddings", hpb.KbGetEmbeddingsRequest(bot=h.bot))
    assert effective.scope == "*" and effective.model == "fake-concepts"


async def test_ollama_endpoint_per_bot(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    await h.client.call(
        "KbSetEmbeddings",
        hpb.KbSetEmbeddingsRequest(
            bot=h.bot,
            embeddings=hpb.KbEmbeddings(provider="ollama", url=embeddings.ollama_url + "/", model="nomic"),
        ),
    )
    shown = await h.client.call("KbGetEmbeddings", hpb.KbGetEmbeddingsRequest(bot=h.bot))
    assert shown.scope == h.host.registry.bot(h.bot).bot_id and shown.url == embeddings.ollama_url
    fleet = await add(h, "fleet.md", FLEET)
    assert embeddings.requests[-1].path == "/api/embed" and "authorization" not in embeddings.requests[-1].headers
    assert fleet.embedding_space == "ollama:nomic:"
    assert (await search(h, "truck whereabouts")).hits[0].doc_id == fleet.doc_id
    host_wide = await h.client.call("KbGetEmbeddings", hpb.KbGetEmbeddingsRequest())
    assert host_wide.provider == "none" and host_wide.scope == ""  # set for the bot only


async def test_caps_and_bad_input_are_typed_and_store_nothing(
    host: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = host
    call = h.client.call
    big = b"x\n" * (kb_module.MAX_DOCUMENT_BYTES // 2 + 1)
    with pytest.raises(errors.ResourceExhausted, match="MAX_DOCUMENT_BYTES"):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="big.txt", content=big))
    with pytest.raises(errors.InvalidArgument, match="not UTF-8"):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="bin", content=b"\xff\xfe\x00"))
    with pytest.raises(errors.InvalidArgument, match="NUL"):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="nul", content=b"a\x00b"))
    with pytest.raises(errors.InvalidArgument, match="no text"):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="blank", content=b"\n  \n"))
    with pytest.raises(errors.InvalidArgument, match="name"):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="a\nb", content=b"text"))
    with pytest.raises(errors.NotFound):
        await call("KbAddDocument", hpb.KbAddDocumentRequest(bot="nobody", name="a", content=b"text"))
    await add(h, "cron.md", CRON)
    with pytest.raises(errors.InvalidArgument, match="MAX_QUERY_CHARS"):
        await search(h, "x" * (kb_module.MAX_QUERY_CHARS + 1))
    with pytest.raises(errors.InvalidArgument, match="empty"):
        await search(h, "   ")
    with pytest.raises(errors.OutOfRange, match="top_k"):
        await search(h, "cron", top_k=kb_module.MAX_TOP_K + 1)
    with pytest.raises(errors.OutOfRange, match="top_k"):
        await search(h, "cron", top_k=-1)
    assert len((await search(h, "cron", top_k=0)).hits) == 1  # 0 = the default

    monkeypatch.setattr(kb_module, "MAX_CHUNKS_PER_BOT", 3)
    many = "\n".join(f"line {i} of a longer document " + "z" * 60 for i in range(80))  # several chunks
    with pytest.raises(errors.ResourceExhausted, match="MAX_CHUNKS_PER_BOT"):
        await add(h, "many.md", many)
    monkeypatch.setattr(kb_module, "MAX_DOCUMENTS_PER_BOT", 1)
    with pytest.raises(errors.ResourceExhausted, match="MAX_DOCUMENTS_PER_BOT"):
        await add(h, "second.md", REFUNDS)
    assert rows(h, "SELECT name FROM kb_documents") == [("cron.md",)]
    assert rows(h, "SELECT COUNT(*) FROM artifacts") == [(1,)]  # refused adds left no artifact either

    with pytest.raises(errors.InvalidArgument, match="url"):
        await call(
            "KbSetEmbeddings",
            hpb.KbSetEmbeddingsRequest(embeddings=hpb.KbEmbeddings(provider="openai", url="ftp://x", model="m")),
        )
    with pytest.raises(errors.InvalidArgument, match="credentials"):
        await call(
            "KbSetEmbeddings",
            hpb.KbSetEmbeddingsRequest(
                embeddings=hpb.KbEmbeddings(provider="openai", url="http://u:p@127.0.0.1/v1", model="m")
            ),
        )
    with pytest.raises(errors.InvalidArgument, match="provider"):
        await call("KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(embeddings=hpb.KbEmbeddings(provider="magic")))
    with pytest.raises(errors.InvalidArgument):
        await call("KbSetEmbeddings", hpb.KbSetEmbeddingsRequest())


async def test_a_failing_endpoint(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    """At add time nothing is stored and the admin hears why; at search time the keyword pass answers alone and
    the caller (possibly an untrusted runner) hears only that the endpoint failed."""
    h = host
    await use_endpoint(h, embeddings)
    cron = await add(h, "cron.md", CRON)
    embeddings.fail_with = 503
    with pytest.raises(errors.Unavailable, match="HTTP 503"):
        await add(h, "refunds.md", REFUNDS)
    found = await search(h, "cron syntax interval")
    assert found.keyword_only and [hit.doc_id for hit in found.hits] == [cron.doc_id]
    assert "failed" in found.keyword_only_reason and "127.0.0.1" not in found.keyword_only_reason
    embeddings.fail_with = 0
    for answer in (
        b'{"data": [{"index": 0, "embedding": [1.0, "x"]}]}',  # not numbers
        b'{"data": [{"index": 0, "embedding": [1.0, NaN]}]}',  # not finite
        b'{"data": []}',  # too few vectors
        b"<html>gateway</html>",
    ):
        embeddings.answer = answer
        with pytest.raises(errors.Unavailable):
            await add(h, "refunds.md", REFUNDS)
    embeddings.answer = None
    assert rows(h, "SELECT name FROM kb_documents") == [("cron.md",)]
    # an endpoint that does not answer in time
    embeddings.release = asyncio.Event()
    await use_endpoint(h, embeddings, timeout_seconds=0.3)
    with pytest.raises(errors.Unavailable, match="no answer"):
        await add(h, "refunds.md", REFUNDS)
    embeddings.release.set()
    # a dead endpoint (nothing listens)
    await h.client.call(
        "KbSetEmbeddings",
        hpb.KbSetEmbeddingsRequest(
            embeddings=hpb.KbEmbeddings(provider="openai", url="http://127.0.0.1:9/v1", model="m")
        ),
    )
    with pytest.raises(errors.Unavailable, match="ConnectError"):
        await add(h, "refunds.md", REFUNDS)


async def test_reindex_after_configuring_an_endpoint(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    fleet = await add(h, "fleet.md", FLEET)  # keyword only: no endpoint yet
    with pytest.raises(errors.FailedPrecondition, match="no embeddings endpoint"):
        await h.client.call("KbReindex", hpb.BotRequest(bot=h.bot))
    await use_endpoint(h, embeddings)
    pending = await search(h, "automobile position")
    assert pending.keyword_only and pending.documents_without_vectors == 1 and not pending.hits
    done = await h.client.call("KbReindex", hpb.BotRequest(bot=h.bot))
    assert (done.documents, done.chunks) == (1, 1)
    after = await search(h, "automobile position")
    assert not after.keyword_only and after.documents_without_vectors == 0
    assert after.hits[0].doc_id == fleet.doc_id
    # another model: the old vectors are not compared with the new ones until reindexed
    await use_endpoint(h, embeddings, model="other-model", dimensions=64)
    stale = await search(h, "automobile position")
    assert stale.keyword_only and stale.documents_without_vectors == 1
    assert (await h.client.call("KbReindex", hpb.BotRequest(bot=h.bot))).documents == 1
    assert embeddings.requests[-1].body["dimensions"] == 64
    assert (await search(h, "automobile position")).hits[0].vector_rank == 1


async def test_deleting_a_bot_deletes_its_knowledge_base(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    await h.client.call("CreateBot", hpb.CreateBotRequest(name="gone"))
    await use_endpoint(h, embeddings, bot="gone")
    await add(h, "fleet.md", FLEET, bot="gone")
    await h.client.call("DeleteBot", hpb.BotRequest(bot="gone"))
    assert rows(h, "SELECT COUNT(*) FROM kb_documents") == [(0,)]
    assert rows(h, "SELECT COUNT(*) FROM kb_chunks") == [(0,)]
    assert indexed(h, "vehicle") == 0
    assert rows(h, "SELECT COUNT(*) FROM kb_embeddings") == [(0,)]


async def test_scoped_credentials_cannot_touch_the_knowledge_base(host: HostHarness) -> None:
    h = host
    created = await h.client.call(
        "CreateCredential", hpb.CreateCredentialRequest(name="gw", scope="send", bots=[h.bot])
    )
    async with HostClient(h.host.admin_address, token=created.token) as scoped:
        for method, request in (
            ("KbAddDocument", hpb.KbAddDocumentRequest(bot=h.bot, name="x", content=b"x")),
            ("KbListDocuments", hpb.BotRequest(bot=h.bot)),
            ("KbSearch", hpb.KbAdminSearchRequest(bot=h.bot, query="x")),
            ("KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(embeddings=hpb.KbEmbeddings(provider="none"))),
        ):
            with pytest.raises(errors.PermissionDenied):
                await scoped.call(method, request)
    assert rows(h, "SELECT COUNT(*) FROM kb_documents") == [(0,)]


async def test_cli_kb_commands(host: HostHarness, embeddings: FakeEmbeddings, tmp_path: Path, capsys) -> None:
    h = host
    data = ["--data-dir", str(h.host.data_dir)]

    async def run(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(cli.main, [*data, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fleet.md").write_text(FLEET)
    (docs / "cron.md").write_text(CRON)
    (docs / "binary.bin").write_bytes(b"\xff\xfe")
    code, out, err = await run(
        "kb", "embeddings", "--provider", "ollama", "--url", embeddings.ollama_url, "--model", "nomic"
    )
    assert code == 0 and "host-wide" in out, err
    files = [str(docs / name) for name in ("fleet.md", "binary.bin", "cron.md")]
    code, out, err = await run("kb", "add", h.bot, *files)
    assert code == 1  # one file failed; the others were added
    assert "binary.bin: INVALID_ARGUMENT" in err and out.count("added doc_") == 2 and "vectors: ollama:nomic:" in out
    code, out, _ = await run("kb", "list", h.bot, "--json")
    listed = json.loads(out)
    assert code == 0 and [d["name"] for d in listed["documents"]] == [str(docs / "fleet.md"), str(docs / "cron.md")]
    code, out, _ = await run("kb", "search", h.bot, "automobile position", "--top-k", "1")
    assert code == 0 and "fleet.md:1-3" in out and "vector #1" in out
    code, out, _ = await run("kb", "search", h.bot, "cron", "--json")
    assert json.loads(out)["hits"][0]["keyword_rank"] == 1
    doc_id = listed["documents"][0]["doc_id"]
    code, out, _ = await run("kb", "remove", h.bot, doc_id)
    assert code == 0 and f"removed {doc_id}" in out
    code, _, err = await run("kb", "remove", h.bot, doc_id)
    assert code == 1 and "NOT_FOUND" in err
    code, out, _ = await run("kb", "embeddings", "--bot", h.bot, "--provider", "none")
    assert code == 0 and "keyword search only" in out
    code, out, _ = await run("kb", "search", h.bot, "cron")
    assert "(keyword search only" in out


async def test_a_slow_endpoint_at_search_time_falls_back_to_keywords(
    host: HostHarness, embeddings: FakeEmbeddings, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = host
    await use_endpoint(h, embeddings)
    cron = await add(h, "cron.md", CRON)
    monkeypatch.setattr(kb_module, "QUERY_EMBED_SECONDS", 0.2)
    embeddings.release = asyncio.Event()  # the endpoint now holds every request
    try:
        found = await asyncio.wait_for(search(h, "cron interval"), 5)
        assert found.keyword_only and [x.doc_id for x in found.hits] == [cron.doc_id]
    finally:
        embeddings.release.set()


async def test_racing_adds_cannot_both_squeeze_under_the_chunk_cap(
    host: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both adds pass the early check (neither is stored yet); the transaction decides, and the loser leaves
    nothing behind, not even its artifact row."""
    h = host
    monkeypatch.setattr(kb_module, "MAX_CHUNKS_PER_BOT", 3)
    two_chunks = "\n".join(f"line {i} " + "q" * 100 for i in range(20))
    assert len(kb_module.chunk_text(two_chunks)) == 2
    bot_id = h.host.registry.bot(h.bot).bot_id
    outcomes = await asyncio.gather(
        h.host.knowledge.add(bot_id, "a.md", two_chunks.encode()),
        h.host.knowledge.add(bot_id, "b.md", (two_chunks + "!").encode()),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], errors.ResourceExhausted), outcomes
    assert "(it has 2)" in refused[0].message  # the transaction's check refused it, not the early one
    assert rows(h, "SELECT COUNT(*), SUM(n_chunks) FROM kb_documents") == [(1, 2)]
    assert rows(h, "SELECT COUNT(*) FROM artifacts") == [(1,)]
