"""The knowledge base's vectors inside PostgreSQL, where the server has the pgvector extension.

Where it does (the extension installed in the database, or available to the host's user to create), kb_chunks gets
a `vector` column beside the float32 bytes every backend keeps (`embedding`, still the record the SQLite path and
`db migrate-to` read), filled by the same writes, and a search's vector pass is one exact nearest-neighbour query
in the server (`ORDER BY embedding_v <#> query`: the vectors are unit length, so the inner product is the cosine
the numpy path scores) instead of a matrix the host builds from every row. Without it, nothing changes: the exact
numpy path in the host (host/knowledge.py). `agenthost status` says which path is used.

Debian's PostgreSQL packages of bookworm have no pgvector; the server of PyPI's `pgserver` (PostgreSQL 16 with
pgvector 0.6) has, and the knowledge base's tests run on it where it is installed (tests/pg_cluster.py).
"""

from __future__ import annotations

import logging
import sys
from array import array
from typing import Any

log = logging.getLogger(__name__)

PATH_IN_DATABASE = "pgvector in PostgreSQL (exact nearest neighbours in the server)"
PATH_IN_HOST = "exact (numpy, in the host)"

_BACKFILL_BATCH = 500


def literal(blob: bytes) -> str:
    """A vector as pgvector's text input takes it, from the little-endian float32 bytes the stores keep. Each
    float32 printed as the shortest float64 text reads back to the same float32."""
    values = array("f", blob)
    if sys.byteorder != "little":
        values.byteswap()
    return "[" + ",".join(map(repr, values.tolist())) + "]"


def enable(conn: Any) -> bool:
    """Run once the host holds the database (its writer connection, autocommit): True when vectors live in the
    database from now on. Creates the extension if the server offers it and the user may; adds the column and
    fills it for chunks embedded before (a database migrated from SQLite, or filled before pgvector came)."""
    installed = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    if installed is None:
        available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
        if available is None:
            return False
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except Exception as exc:  # noqa: BLE001 - e.g. a user that may not create it: the host keeps the numpy path
            log.warning("the server offers pgvector but it could not be created (%s): vectors stay in the host", exc)
            return False
    conn.execute("ALTER TABLE kb_chunks ADD COLUMN IF NOT EXISTS embedding_v vector")
    filled = 0
    while True:
        rows = conn.execute(
            "SELECT chunk_id, embedding FROM kb_chunks WHERE embedding IS NOT NULL AND embedding_v IS NULL"
            " ORDER BY chunk_id LIMIT ?",
            (_BACKFILL_BATCH,),
        ).fetchall()
        if not rows:
            break
        conn.executemany(
            "UPDATE kb_chunks SET embedding_v = ?::vector WHERE chunk_id = ?",
            [(literal(bytes(blob)), chunk_id) for chunk_id, blob in rows],
        )
        filled += len(rows)
    if filled:
        log.info("pgvector: %d stored vectors copied into the database's vector column", filled)
    return True
