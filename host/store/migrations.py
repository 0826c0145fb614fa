"""Schema migrations, applied in order, each with its `user_version` bump in one BEGIN IMMEDIATE transaction.

Append new migrations to MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

CREATE TABLE plugins (
    plugin_id TEXT PRIMARY KEY,
    distribution TEXT NOT NULL,
    version TEXT NOT NULL,
    source TEXT NOT NULL,
    builtin INTEGER NOT NULL DEFAULT 0,
    enabled INTEGER NOT NULL DEFAULT 1,
    python TEXT NOT NULL,
    manifests_json TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    installed_at REAL NOT NULL
);

CREATE TABLE bots (
    bot_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);

CREATE TABLE bindings (
    binding_id TEXT PRIMARY KEY,
    bot_id TEXT NOT NULL REFERENCES bots(bot_id) ON DELETE CASCADE,
    event_pattern TEXT NOT NULL,
    conversation_pattern TEXT NOT NULL,
    priority INTEGER NOT NULL,
    runner_id TEXT NOT NULL,
    config_json TEXT NOT NULL,
    resource_policy_json TEXT NOT NULL,
    delivery_policy_json TEXT NOT NULL,
    timeout_seconds REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX bindings_bot ON bindings(bot_id);

CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    bot_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    source TEXT NOT NULL,
    actor_json TEXT NOT NULL,
    text TEXT NOT NULL,
    data_json TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX events_conversation ON events(bot_id, conversation_id, seq);

CREATE TABLE transcript (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id TEXT NOT NULL UNIQUE,
    bot_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    role TEXT NOT NULL,
    item_type TEXT NOT NULL,
    text TEXT NOT NULL,
    data_json TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    is_error INTEGER NOT NULL,
    attachments_json TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX transcript_conversation ON transcript(bot_id, conversation_id, seq);
CREATE VIRTUAL TABLE transcript_fts USING fts5(text, content='transcript', content_rowid='seq');
CREATE TRIGGER transcript_fts_insert AFTER INSERT ON transcript BEGIN
    INSERT INTO transcript_fts(rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER transcript_fts_delete AFTER DELETE ON transcript BEGIN
    INSERT INTO transcript_fts(transcript_fts, rowid, text) VALUES ('delete', old.seq, old.text);
END;

CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    bot_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    binding_id TEXT NOT NULL,
    runner_id TEXT NOT NULL,
    plugin_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    status TEXT NOT NULL,
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    token_hash TEXT NOT NULL,
    grant_json TEXT NOT NULL,
    usage_json TEXT NOT NULL DEFAULT '{}',
    text TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0,
    deadline_at REAL NOT NULL
);
CREATE INDEX runs_conversation ON runs(bot_id, conversation_id, created_at);
CREATE INDEX runs_status ON runs(status);

CREATE TABLE run_events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE artifacts (
    artifact_id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    name TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    bot_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    metadata_json TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX artifacts_sha ON artifacts(sha256);

CREATE TABLE state (
    scope_key TEXT NOT NULL,
    key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    version INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope_key, key)
) WITHOUT ROWID;

CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    run_id TEXT NOT NULL,
    plugin_id TEXT NOT NULL,
    method TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX audit_run ON audit(run_id);

CREATE TABLE plugin_processes (
    plugin_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    start_time TEXT NOT NULL
);
"""

# Per-conversation counters, so starting a run (ContextAccess needs the count and the newest cursor) and listing
# conversations stay O(1) per conversation instead of scanning a transcript that may hold a million items.
_V2 = """
CREATE TABLE conversation_stats (
    bot_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    item_count INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (bot_id, conversation_id)
) WITHOUT ROWID;
CREATE INDEX conversation_stats_updated ON conversation_stats(bot_id, updated_at);
INSERT INTO conversation_stats(bot_id, conversation_id, item_count, last_seq, updated_at)
    SELECT bot_id, conversation_id, COUNT(*), MAX(seq), MAX(created_at) FROM transcript
    GROUP BY bot_id, conversation_id;
CREATE TRIGGER conversation_stats_insert AFTER INSERT ON transcript BEGIN
    INSERT INTO conversation_stats(bot_id, conversation_id, item_count, last_seq, updated_at)
        VALUES (new.bot_id, new.conversation_id, 1, new.seq, new.created_at)
        ON CONFLICT(bot_id, conversation_id) DO UPDATE SET item_count = item_count + 1,
            last_seq = MAX(last_seq, new.seq), updated_at = new.created_at;
END;
"""

# Whether the user accepted a plugin's request for network access (at install; built-ins have it).
_V3 = """
ALTER TABLE plugins ADD COLUMN network INTEGER NOT NULL DEFAULT 0;
"""

# Quotas (host/limits.py). state_usage keeps each state scope's key count and bytes (key + JSON value, UTF-8) so
# a write checks its scope's quota in O(1); upserts fire the UPDATE trigger, not the INSERT one. Artifacts get the
# indexes the per-run and per-conversation byte sums read (covering: the sums never touch the table). The
# full-text index sees only the first 32768 characters of an item (limits.FTS_INDEXED_CHARS; the full text stays
# in `transcript`): the triggers are recreated to index a prefix, and rows indexed in full before are re-indexed
# the same way so the delete trigger always removes exactly what was indexed.
_V4 = """
CREATE TABLE state_usage (
    scope_key TEXT PRIMARY KEY,
    n_keys INTEGER NOT NULL,
    n_bytes INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO state_usage(scope_key, n_keys, n_bytes)
    SELECT scope_key, COUNT(*), SUM(length(CAST(key AS BLOB)) + length(CAST(value_json AS BLOB))) FROM state
    GROUP BY scope_key;
CREATE TRIGGER state_usage_insert AFTER INSERT ON state BEGIN
    INSERT INTO state_usage(scope_key, n_keys, n_bytes)
        VALUES (new.scope_key, 1, length(CAST(new.key AS BLOB)) + length(CAST(new.value_json AS BLOB)))
        ON CONFLICT(scope_key) DO UPDATE SET n_keys = n_keys + 1, n_bytes = n_bytes + excluded.n_bytes;
END;
CREATE TRIGGER state_usage_update AFTER UPDATE OF value_json ON state BEGIN
    UPDATE state_usage SET n_bytes = n_bytes - length(CAST(old.value_json AS BLOB))
        + length(CAST(new.value_json AS BLOB)) WHERE scope_key = new.scope_key;
END;
CREATE TRIGGER state_usage_delete AFTER DELETE ON state BEGIN
    UPDATE state_usage SET n_keys = n_keys - 1,
        n_bytes = n_bytes - length(CAST(old.key AS BLOB)) - length(CAST(old.value_json AS BLOB))
        WHERE scope_key = old.scope_key;
END;

CREATE INDEX artifacts_run ON artifacts(run_id, size_bytes);
CREATE INDEX artifacts_conversation ON artifacts(bot_id, conversation_id, size_bytes);

DROP TRIGGER transcript_fts_insert;
DROP TRIGGER transcript_fts_delete;
INSERT INTO transcript_fts(transcript_fts, rowid, text)
    SELECT 'delete', seq, text FROM transcript WHERE length(text) > 32768;
INSERT INTO transcript_fts(rowid, text) SELECT seq, substr(text, 1, 32768) FROM transcript WHERE length(text) > 32768;
CREATE TRIGGER transcript_fts_insert AFTER INSERT ON transcript BEGIN
    INSERT INTO transcript_fts(rowid, text) VALUES (new.seq, substr(new.text, 1, 32768));
END;
CREATE TRIGGER transcript_fts_delete AFTER DELETE ON transcript BEGIN
    INSERT INTO transcript_fts(transcript_fts, rowid, text) VALUES ('delete', old.seq, substr(old.text, 1, 32768));
END;
"""

# The knowledge base (host/knowledge.py). A document's bytes are an artifact; its chunks are rows here, indexed by
# FTS5 (porter stemming, so "deploying" finds "deploy") and holding their vector as a float32 BLOB (unit length,
# little-endian; NULL when the document was added without an embeddings endpoint). `embedding_space` names the
# endpoint's model, so vectors of two models are never compared. Deleting a bot deletes its documents, chunks and
# embeddings setting; kb_embeddings.scope is a bot id or '*' (the host-wide default).
_V5 = """
CREATE TABLE kb_documents (
    doc_id TEXT PRIMARY KEY,
    bot_id TEXT NOT NULL REFERENCES bots(bot_id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    n_chunks INTEGER NOT NULL,
    embedding_space TEXT NOT NULL DEFAULT '',
    dims INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX kb_documents_bot ON kb_documents(bot_id, created_at);
CREATE TABLE kb_chunks (
    chunk_id INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id TEXT NOT NULL REFERENCES kb_documents(doc_id) ON DELETE CASCADE,
    bot_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    text TEXT NOT NULL,
    embedding BLOB
);
CREATE INDEX kb_chunks_doc ON kb_chunks(doc_id, ordinal);
CREATE INDEX kb_chunks_bot ON kb_chunks(bot_id, chunk_id);
CREATE VIRTUAL TABLE kb_fts USING fts5(
    text, content='kb_chunks', content_rowid='chunk_id', tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER kb_fts_insert AFTER INSERT ON kb_chunks BEGIN
    INSERT INTO kb_fts(rowid, text) VALUES (new.chunk_id, new.text);
END;
CREATE TRIGGER kb_fts_delete AFTER DELETE ON kb_chunks BEGIN
    INSERT INTO kb_fts(kb_fts, rowid, text) VALUES ('delete', old.chunk_id, old.text);
END;
CREATE TABLE kb_embeddings (
    scope TEXT PRIMARY KEY,
    config_json TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TRIGGER kb_embeddings_bot_delete AFTER DELETE ON bots BEGIN
    DELETE FROM kb_embeddings WHERE scope = old.bot_id;
END;
"""

# Message attachments (host/runs/attachments.py): the refs of the artifacts a message event carries, a JSON list of
# ArtifactRef fields (the transcript has had the same column, unused, since v1).
_V6 = """
ALTER TABLE events ADD COLUMN attachments_json TEXT NOT NULL DEFAULT '[]';
"""

# Child runs (subagents recorded through the run API's ChildRun): the run that opened one. The partial index serves
# "the children of this run" without growing with the (far more numerous) top-level runs.
_V7 = """
ALTER TABLE runs ADD COLUMN parent_run_id TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_parent ON runs(parent_run_id, created_at) WHERE parent_run_id != '';
"""

# Each transcript item carries the seq of the event whose turn it belongs to (its run's event), so a run reads its
# conversation as of its own event (host/api/run_api.py): a message queued behind it is recorded when it arrives, but
# is the run's future. Items of unknown events get 0 (visible to every run). The index serves counting what lies
# past a run's event, and every page: SQLite ends an index with the rowid, so it is (bot, conversation, event_seq,
# seq), the transcript's turn order (Conversations.page_history).
_V8 = """
ALTER TABLE transcript ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;
UPDATE transcript SET event_seq = COALESCE((SELECT e.seq FROM events e WHERE e.event_id = transcript.event_id), 0);
CREATE INDEX transcript_turn ON transcript(bot_id, conversation_id, event_seq);
"""

# Who sent what: the admin-API credential name ("admin", "channel.tg", a send credential's name) that sent the
# message a run answers, and that sent each message event. A channel adapter's credential sees only its own runs
# and writes only into conversations it started (host/api/admin.py). Rows of older hosts have '' (sender unknown):
# no channel's. The index serves a channel listing its runs (bot, origin, newest first).
_V9 = """
ALTER TABLE runs ADD COLUMN origin TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_origin ON runs(bot_id, origin, created_at);
ALTER TABLE events ADD COLUMN origin TEXT NOT NULL DEFAULT '';
"""

# The transcript is read in turn order off transcript_turn (V8) since this version; the seq-ordered index of V1 only
# cost every insert an index update.
_V10 = """
DROP INDEX IF EXISTS transcript_conversation;
"""

# The runs of a conversation that have not ended, found without walking its finished ones: a forward read of
# people's history stops at the first turn still open (Conversations.page_history).
_V11 = """
CREATE INDEX runs_open ON runs(bot_id, conversation_id) WHERE status IN ('queued', 'running');
"""

# Each transcript item stored serialized as well, its seq and cursor included, framed as an entry of a list of items
# (Conversations.insert_items): a history page is then its rows' bytes joined, not fifty items built and MAC-ed on
# every read. Rows of older hosts keep NULL and are built from their columns when read. Anything that ever changes a
# stored item's columns (or the cursor secret in meta) must set it to NULL.
_V12 = """
ALTER TABLE transcript ADD COLUMN item_pb BLOB;
"""

# Runner workers on other machines (host/workers): join tokens (hashed, single use, with an expiry) and the enrolled
# workers, each with the serial of the one certificate the host accepts for it (re-enrolling replaces it; revoking
# refuses it for good).
_V13 = """
CREATE TABLE worker_tokens (
    token_hash TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    used_at REAL,
    used_by TEXT
);
CREATE TABLE workers (
    name TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    serial TEXT NOT NULL,
    enrolled_at REAL NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0,
    revoked_at REAL
);
ALTER TABLE bindings ADD COLUMN pool TEXT NOT NULL DEFAULT '';
"""

# A binding to a runner only workers offer keeps the manifest the operator bound (its permissions make the runs'
# grants), so a worker offering the same runner id later cannot widen them (host/runs/manager.py).
_V14 = """
ALTER TABLE bindings ADD COLUMN manifest_json TEXT NOT NULL DEFAULT '';
"""

# A client's idempotency key per run (SendMessageRequest.idempotency_key), unique per bot and sender: a retried send
# finds the run its first attempt recorded.
_V15 = """
ALTER TABLE runs ADD COLUMN idempotency_key TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX runs_idempotency ON runs(bot_id, origin, idempotency_key) WHERE idempotency_key != '';
"""

# Worker certificate renewal (host/workers): the accepted certificate's expiry, and the one it replaced, still
# accepted until its own expiry (a renewing worker's old connection finishes what it carries).
_V16 = """
ALTER TABLE workers ADD COLUMN expires_at REAL NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN previous_serial TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN previous_expires_at REAL NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN renewed_at REAL NOT NULL DEFAULT 0;
"""

# When the accepted certificate was first used (0: not yet): from then on, the one it replaced may not renew nor open
# a session (WorkerHub._not_replaced), across host restarts.
_V17 = """
ALTER TABLE workers ADD COLUMN serial_used_at REAL NOT NULL DEFAULT 0;
"""

MIGRATIONS: list[str] = [
    _V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12, _V13, _V14, _V15, _V16, _V17,
]  # fmt: skip


def migrate(conn: sqlite3.Connection) -> int:
    """Brings the file to the newest schema; returns the version it is at. Called by the writer at open."""
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    if current > len(MIGRATIONS):
        raise RuntimeError(
            f"database schema version {current} is newer than this agenthost understands ({len(MIGRATIONS)})"
        )
    for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(MIGRATIONS)


def _statements(script: str) -> list[str]:
    """Splits a script on complete statements (executescript would COMMIT our transaction behind our back)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return [s for s in out if s]
