"""The knowledge base's vectors inside PostgreSQL where the server has pgvector (host/store/pgvector.py), against a
real server with the extension (PyPI's pgserver: PostgreSQL 16 + pgvector); the numpy path where it has none. The
whole knowledge-base suite also runs on the pgvector server (tests/knowledge/conftest.py `kb_database`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import psycopg

from agenthost.host.store import pgvector
from agenthost.host.store.db import Database
from agenthost.host.store.knowledge import KnowledgeStore, NewChunk
from agenthost.host.store.registry import Registry
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

from .conftest import KbProbe, add, search, use_endpoint
from .fake_embeddings import FakeEmbeddings
from .test_kb_admin import CRON, FLEET, REFUNDS


async def test_vectors_are_searched_in_the_server_where_pgvector_is_installed(
    tmp_path: Path, pgvector_dsn: str, embeddings: FakeEmbeddings
) -> None:
    async with HostHarness(tmp_path, runners=[KbProbe], host_options={"database": pgvector_dsn}) as h:
        status = await h.client.call("GetStatus", hpb.GetStatusRequest())
        assert status.kb_vectors == pgvector.PATH_IN_DATABASE
        await use_endpoint(h, embeddings)
        fleet = await add(h, "fleet.md", FLEET)
        await add(h, "refunds.md", REFUNDS)
        await add(h, "cron.md", CRON)
        found = await search(h, "automobile position history", top_k=3)
        assert not found.keyword_only
        assert found.hits[0].doc_id == fleet.doc_id
        assert (found.hits[0].keyword_rank, found.hits[0].vector_rank) == (0, 1)  # found by meaning only
        assert not h.host.knowledge._indexes  # no matrix of the bot's vectors was built in the host
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*), COUNT(embedding_v) FROM kb_chunks").fetchone()
    assert row is not None and row[0] == row[1] > 0  # every chunk's vector is in the server's column


async def test_without_pgvector_the_host_keeps_the_numpy_path(tmp_path: Path, pg_dsn: str) -> None:
    async with HostHarness(tmp_path, runners=[KbProbe], host_options={"database": pg_dsn}) as h:
        status = await h.client.call("GetStatus", hpb.GetStatusRequest())
        assert status.kb_vectors == pgvector.PATH_IN_HOST


async def test_vectors_stored_before_pgvector_are_copied_into_its_column_at_open(pgvector_dsn: str) -> None:
    """A database filled before the extension came (or migrated from SQLite): the host fills the column when it
    opens the database, and the server's nearest neighbours are the numpy path's, in the same order."""
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((40, 16)).astype("<f4")
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    db = Database(pgvector_dsn)
    await db.open()
    try:
        store = KnowledgeStore(db)
        bot = (await Registry(db).create_bot("b", "")).bot_id
        document = hpb.KbDocument(
            doc_id="d1", bot_id=bot, name="n", artifact_id="a1", sha256="0", size_bytes=1, chunks=40,
            embedding_space="space", created_at=time.time(),
        )  # fmt: skip
        chunks = [NewChunk(i, i, i, f"chunk {i}", matrix[i].tobytes()) for i in range(40)]
        await store.add(document, chunks, dims=16, max_documents=10, max_chunks=1000)
    finally:
        await db.close()
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        conn.execute("UPDATE kb_chunks SET embedding_v = NULL")
    db = Database(pgvector_dsn)
    await db.open()
    try:
        store = KnowledgeStore(db)
        assert store.vectors_in_db and store.space_dims(bot, "space") == 16
        query = rng.standard_normal(16).astype("<f4")
        query /= np.linalg.norm(query)
        ids, _, _ = store.vectors(bot, "space")
        expected = [ids[i] for i in np.argsort(-(matrix @ query), kind="stable")[:10]]
        assert store.nearest(bot, "space", query.tobytes(), 10) == expected
    finally:
        await db.close()
