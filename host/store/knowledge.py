"""KnowledgeStore: the knowledge base's rows (documents, chunks with their vectors, embeddings settings).

Reads run on the event loop through the shared reader like every other store; every read is bounded (a bot's
chunk count is capped, keyword candidates are LIMITed). Writes go through the single writer, and the caps that
bound a bot (documents, chunks) are checked inside the write transaction, so two adds racing each other cannot
both squeeze under a cap. Orchestration (chunking, embedding, fusion) lives in agenthost.host.knowledge.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from agenthost.host.store.db import Database
from agenthost.host.store.pgvector import literal
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

HOST_WIDE = "*"


@dataclass(frozen=True)
class ChunkRow:
    chunk_id: int
    doc_id: str
    ordinal: int
    start_line: int
    end_line: int
    text: str
    document_name: str
    artifact_id: str


@dataclass(frozen=True)
class NewChunk:
    ordinal: int
    start_line: int
    end_line: int
    text: str
    embedding: bytes | None


_DOC_COLUMNS = "doc_id, bot_id, name, artifact_id, sha256, size_bytes, n_chunks, embedding_space, created_at"


def _document(row: Sequence[object]) -> hpb.KbDocument:
    return hpb.KbDocument(
        doc_id=row[0],
        bot_id=row[1],
        name=row[2],
        artifact_id=row[3],
        sha256=row[4],
        size_bytes=row[5],
        chunks=row[6],
        embedding_space=row[7],
        created_at=row[8],
    )


class KnowledgeStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ---- documents ----

    def documents(self, bot_id: str) -> list[hpb.KbDocument]:
        rows = self.db.query_tuples(
            f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE bot_id = ? ORDER BY created_at, doc_id", (bot_id,)
        )
        return [_document(r) for r in rows]

    def document(self, bot_id: str, doc_id: str) -> hpb.KbDocument | None:
        rows = self.db.query_tuples(
            f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE bot_id = ? AND doc_id = ?", (bot_id, doc_id)
        )
        return _document(rows[0]) if rows else None

    def chunk_count(self, bot_id: str) -> int:
        row = self.db.query_one("SELECT COALESCE(SUM(n_chunks), 0) FROM kb_documents WHERE bot_id = ?", (bot_id,))
        return int(row[0]) if row else 0

    def documents_without(self, bot_id: str, space: str) -> list[hpb.KbDocument]:
        """The bot's documents whose chunks have no vectors in `space`."""
        rows = self.db.query_tuples(
            f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE bot_id = ? AND embedding_space != ?"
            " ORDER BY created_at, doc_id",
            (bot_id, space),
        )
        return [_document(r) for r in rows]

    def count_without(self, bot_id: str, space: str) -> int:
        row = self.db.query_one(
            "SELECT COUNT(*) FROM kb_documents WHERE bot_id = ? AND embedding_space != ?", (bot_id, space)
        )
        return int(row[0]) if row else 0

    async def add(
        self,
        document: hpb.KbDocument,
        chunks: list[NewChunk],
        *,
        dims: int,
        max_documents: int,
        max_chunks: int,
    ) -> None:
        """Inserts a document and its chunks in one transaction, refusing it if the bot would pass a cap."""

        def insert(conn: sqlite3.Connection) -> None:
            n_docs, n_chunks = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(n_chunks), 0) FROM kb_documents WHERE bot_id = ?", (document.bot_id,)
            ).fetchone()
            if n_docs + 1 > max_documents:
                raise errors.ResourceExhausted(
                    f"bot has {n_docs} documents; the knowledge base holds at most {max_documents} per bot"
                )
            if n_chunks + len(chunks) > max_chunks:
                raise errors.ResourceExhausted(
                    f"this document's {len(chunks)} chunks would take the bot past {max_chunks} chunks"
                    f" (it has {n_chunks}); remove documents first"
                )
            conn.execute(
                f"INSERT INTO kb_documents({_DOC_COLUMNS}, dims) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    document.doc_id,
                    document.bot_id,
                    document.name,
                    document.artifact_id,
                    document.sha256,
                    document.size_bytes,
                    document.chunks,
                    document.embedding_space,
                    document.created_at,
                    dims,
                ),
            )
            rows = [
                (document.doc_id, document.bot_id, c.ordinal, c.start_line, c.end_line, c.text, c.embedding)
                for c in chunks
            ]
            if self.vectors_in_db:
                conn.executemany(
                    "INSERT INTO kb_chunks(doc_id, bot_id, ordinal, start_line, end_line, text, embedding, embedding_v)"
                    " VALUES (?,?,?,?,?,?,?,CAST(? AS vector))",
                    [
                        (*row, None if c.embedding is None else literal(c.embedding))
                        for row, c in zip(rows, chunks, strict=True)
                    ],
                )
            else:
                conn.executemany(
                    "INSERT INTO kb_chunks(doc_id, bot_id, ordinal, start_line, end_line, text, embedding)"
                    " VALUES (?,?,?,?,?,?,?)",
                    rows,
                )

        await self.db.write(insert, weight=sum(len(c.text) + len(c.embedding or b"") for c in chunks))

    async def forget_artifact(self, bot_id: str, artifact_id: str) -> None:
        """Drops the artifact row of a document whose insert was refused (its file stays, as every artifact's)."""
        await self.db.write(
            lambda conn: conn.execute(
                "DELETE FROM artifacts WHERE artifact_id = ? AND bot_id = ? AND artifact_id NOT IN"
                " (SELECT artifact_id FROM kb_documents)",
                (artifact_id, bot_id),
            )
        )

    async def remove(self, bot_id: str, doc_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT artifact_id FROM kb_documents WHERE bot_id = ? AND doc_id = ?", (bot_id, doc_id)
            ).fetchone()
            if row is None:
                return False
            # Chunks go by the foreign key's cascade, their FTS rows by kb_fts_delete. The artifact row goes too, so
            # an id a run learned from an earlier search stops working; its content-addressed file stays, like
            # every artifact file (others may share it).
            conn.execute("DELETE FROM kb_documents WHERE doc_id = ?", (doc_id,))
            conn.execute("DELETE FROM artifacts WHERE artifact_id = ? AND bot_id = ?", (row[0], bot_id))
            return True

        return await self.db.write(delete)

    async def set_vectors(self, bot_id: str, doc_id: str, space: str, dims: int, vectors: dict[int, bytes]) -> bool:
        """Replaces a document's vectors (chunk id → float32 bytes); False if the document is gone meanwhile."""

        def update(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                "UPDATE kb_documents SET embedding_space = ?, dims = ? WHERE bot_id = ? AND doc_id = ?",
                (space, dims, bot_id, doc_id),
            ).rowcount
            if not found:
                return False
            if self.vectors_in_db:
                conn.executemany(
                    "UPDATE kb_chunks SET embedding = ?, embedding_v = CAST(? AS vector)"
                    " WHERE chunk_id = ? AND doc_id = ?",
                    [(blob, literal(blob), chunk_id, doc_id) for chunk_id, blob in vectors.items()],
                )
            else:
                conn.executemany(
                    "UPDATE kb_chunks SET embedding = ? WHERE chunk_id = ? AND doc_id = ?",
                    [(blob, chunk_id, doc_id) for chunk_id, blob in vectors.items()],
                )
            return True

        return await self.db.write(update, weight=sum(len(v) for v in vectors.values()))

    # ---- chunks ----

    def chunk_texts(self, doc_id: str) -> list[tuple[int, str]]:
        return [
            (int(r[0]), str(r[1]))
            for r in self.db.query_tuples(
                "SELECT chunk_id, text FROM kb_chunks WHERE doc_id = ? ORDER BY ordinal", (doc_id,)
            )
        ]

    def keyword(self, bot_id: str, match: str, limit: int) -> list[int]:
        """Chunk ids of the bot matching an FTS5 query (built by the caller from words only), best first."""
        sql, params = self.db.dialect.kb_keyword(match)
        rows = self.db.query_tuples(sql, (*params, bot_id, limit))
        return [int(r[0]) for r in rows]

    def vectors(self, bot_id: str, space: str) -> tuple[list[int], list[bytes], int]:
        """(chunk ids, float32 vectors, dims) of the bot's chunks embedded in `space`, in chunk id order."""
        rows = self.db.query_tuples(
            "SELECT c.chunk_id, c.embedding, d.dims FROM kb_chunks c JOIN kb_documents d ON d.doc_id = c.doc_id"
            " WHERE c.bot_id = ? AND d.embedding_space = ? AND c.embedding IS NOT NULL ORDER BY c.chunk_id",
            (bot_id, space),
        )
        if not rows:
            return [], [], 0
        return [int(r[0]) for r in rows], [bytes(r[1]) for r in rows], int(rows[0][2])

    @property
    def vectors_in_db(self) -> bool:
        """True on PostgreSQL with pgvector: `nearest` searches in the server (host/store/pgvector.py)."""
        return self.db.vectors_in_db

    def space_dims(self, bot_id: str, space: str) -> int | None:
        """pgvector path: the length of the bot's vectors in `space` (its oldest embedded document's), None if it
        has none."""
        row = self.db.query_one(
            "SELECT d.dims FROM kb_documents d WHERE d.bot_id = ? AND d.embedding_space = ? AND EXISTS"
            " (SELECT 1 FROM kb_chunks c WHERE c.doc_id = d.doc_id AND c.embedding_v IS NOT NULL)"
            " ORDER BY d.created_at, d.doc_id LIMIT 1",
            (bot_id, space),
        )
        return int(row[0]) if row else None

    def nearest(self, bot_id: str, space: str, query: bytes, limit: int) -> list[int]:
        """pgvector path: chunk ids of the bot's vectors in `space` closest to the unit-length float32 `query`, best
        first (largest inner product; ties by chunk id), vectors of another length left out as the numpy path
        leaves them out."""
        dims = len(query) // 4
        rows = self.db.query_tuples(
            "SELECT c.chunk_id FROM kb_chunks c JOIN kb_documents d ON d.doc_id = c.doc_id"
            " WHERE c.bot_id = ? AND d.embedding_space = ? AND c.embedding_v IS NOT NULL"
            " AND vector_dims(c.embedding_v) = ?"
            " ORDER BY c.embedding_v <#> CAST(? AS vector), c.chunk_id LIMIT ?",
            (bot_id, space, dims, literal(query), limit),
        )
        return [int(r[0]) for r in rows]

    def chunks(self, bot_id: str, chunk_ids: Sequence[int]) -> dict[int, ChunkRow]:
        """The rows of these chunks that belong to the bot (an id of another bot's chunk is simply absent)."""
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self.db.query_tuples(
            "SELECT c.chunk_id, c.doc_id, c.ordinal, c.start_line, c.end_line, c.text, d.name, d.artifact_id"
            " FROM kb_chunks c JOIN kb_documents d ON d.doc_id = c.doc_id"
            f" WHERE c.bot_id = ? AND d.bot_id = ? AND c.chunk_id IN ({marks})",
            (bot_id, bot_id, *chunk_ids),
        )
        return {int(r[0]): ChunkRow(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows}

    # ---- embeddings settings ----

    def embeddings_config(self, scope: str) -> str | None:
        row = self.db.query_one("SELECT config_json FROM kb_embeddings WHERE scope = ?", (scope,))
        return str(row[0]) if row else None

    async def set_embeddings_config(self, scope: str, config_json: str | None) -> None:
        def write(conn: sqlite3.Connection) -> None:
            if config_json is None:
                conn.execute("DELETE FROM kb_embeddings WHERE scope = ?", (scope,))
            else:
                conn.execute(
                    "INSERT INTO kb_embeddings(scope, config_json, updated_at) VALUES (?,?,?)"
                    " ON CONFLICT(scope) DO UPDATE SET config_json = excluded.config_json,"
                    " updated_at = excluded.updated_at",
                    (scope, config_json, time.time()),
                )

        await self.db.write(write)
