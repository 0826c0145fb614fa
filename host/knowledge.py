"""The knowledge base: documents a user adds to a bot, searched by keywords and by meaning, served to runs.

    agenthost kb add support docs/*.md      # stored as artifacts of the bot, chunked, indexed, embedded
    agenthost kb search support "how do I rotate a key"

Host-owned on purpose: the index, the embeddings endpoint and its key stay with the host, and every runner (the local
agent, a harness through the MCP bridge, a third-party plugin) reaches the same search through the run API's
`KbSearch`, under the `kb` grant and scoped to the run's bot.

* Chunking: whole lines, up to CHUNK_CHARS per chunk, each chunk repeating the last ~CHUNK_OVERLAP_CHARS of lines of
  the previous one, so a passage cut at a chunk border is still whole in one of them. A line longer than a chunk
  (minified files, tables) is cut.
* Keyword pass: FTS5 with porter stemming, BM25 order. The query's words become an OR of quoted terms, so user text
  is never parsed as FTS syntax and a question does not need every word to appear.
* Vector pass: the chunks' unit-length float32 vectors, held per bot as one numpy matrix and scored by a single
  matrix-vector product (exact nearest neighbours). The SQLite vector extension (sqlite-vec) was the first choice,
  but loading any SQLite extension needs an interpreter built with loadable-extension support, which this
  machine's (pyenv) and many others' are not (`Connection.load_extension` is missing); and up to the per-bot cap
  (MAX_CHUNKS_PER_BOT) brute force is fast enough to need no approximate index (benchmarks/bench_kb.py measures it).
* Fusion: Reciprocal Rank Fusion (score = sum over passes of 1 / (RRF_K + rank)), which needs no score calibration
  between BM25 and cosine similarity.
* Embeddings: an OpenAI-compatible `/embeddings` or an Ollama `/api/embed` endpoint, configured per bot or host-wide
  (`kb embeddings set`), its key named from the host's key store. The host embeds chunks when a document is added and
  the query at search time. Without an endpoint (or when it fails at search time) the keyword pass runs alone and the
  response says so (`keyword_only`). Vectors remember the endpoint's model (`embedding_space`): after a model change,
  old documents are searched by keywords until `kb reindex`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agenthost.host.access.keys import KeyStore, check_name
from agenthost.host.ops.logs import RefusalLimiter, log_limited
from agenthost.host.store.artifacts import ArtifactStore
from agenthost.host.store.knowledge import HOST_WIDE, KnowledgeStore, NewChunk
from agenthost.plugins.manifest import validation_problems
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2 as api

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# ---- caps (each answers a typed error naming it) ----

# One document, as sent in one admin call (under the 8 MiB message size with room to spare).
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_DOCUMENT_NAME_CHARS = 255
# Per bot: what the vector matrix of one bot may grow to (20k x 1536 float32 = 123 MB) and what a brute-force pass
# scans per query.
MAX_DOCUMENTS_PER_BOT = 5000
MAX_CHUNKS_PER_BOT = 20_000
MAX_QUERY_CHARS = 2000
MAX_QUERY_TERMS = 64
MAX_TOP_K = 50
DEFAULT_TOP_K = 5
MAX_DIMS = 8192
# Bytes of one embeddings response: 64 inputs x 8192 dims of JSON floats fit with room to spare.
MAX_EMBED_RESPONSE_BYTES = 64 * 1024 * 1024

# ---- tuning ----

CHUNK_CHARS = 1500
CHUNK_OVERLAP_CHARS = 300
CANDIDATES = 50  # per pass, before fusion
RRF_K = 60  # the constant of Cormack et al.; damps the weight of the very first ranks
EMBED_BATCH = 64
DEFAULT_TIMEOUT_SECONDS = 30.0
# A search waits at most this long for its query vector before answering from keywords alone.
QUERY_EMBED_SECONDS = 10.0
# Embedding calls in flight host-wide: runs searching in a loop must not turn the host into a flood on the endpoint.
# Queries and document adds have separate slots, so a large add (minutes of batches) never starves searches.
MAX_CONCURRENT_QUERY_EMBEDS = 4
MAX_CONCURRENT_ADD_EMBEDS = 2
QUERY_CACHE_ENTRIES = 512
VECTOR_CACHE_BYTES = 512 * 1024 * 1024

_WORD = re.compile(r"[^\W_]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# ---- chunking ----


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    start_line: int  # 1-based, inclusive
    end_line: int
    text: str


def chunk_text(text: str, max_chars: int = CHUNK_CHARS, overlap_chars: int = CHUNK_OVERLAP_CHARS) -> list[Chunk]:
    """Splits text on line boundaries into chunks of at most max_chars, each starting with the trailing lines (up to
    overlap_chars) of the one before. Whitespace-only chunks are dropped."""
    if max_chars < 1 or not 0 <= overlap_chars < max_chars:
        raise ValueError("need max_chars >= 1 and 0 <= overlap_chars < max_chars")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()  # the final newline ends the last line; it does not start another
    pieces: list[tuple[int, str]] = []  # (line number, text with its newline)
    for number, line in enumerate(lines, start=1):
        line += "\n"
        while len(line) > max_chars:
            pieces.append((number, line[:max_chars]))
            line = line[max_chars:]
        pieces.append((number, line))
    chunks: list[Chunk] = []
    start = 0
    while start < len(pieces):
        end, size = start, 0
        while end < len(pieces) and (end == start or size + len(pieces[end][1]) <= max_chars):
            size += len(pieces[end][1])
            end += 1
        body = "".join(p[1] for p in pieces[start:end]).rstrip("\n")
        if body.strip():
            chunks.append(Chunk(len(chunks), pieces[start][0], pieces[end - 1][0], body))
        if end >= len(pieces):
            break
        # The next chunk starts inside this one, but always past its first piece, so the walk moves on.
        back, size = end, 0
        while back - 1 > start and size + len(pieces[back - 1][1]) <= overlap_chars:
            back -= 1
            size += len(pieces[back][1])
        start = back
    return chunks


# ---- keyword query and fusion ----


# English function words, left out of the keyword query when it has other words: OR-ed in, they match nearly every
# chunk, and through fusion those matches crowd out what the vector pass found.
STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from get got had has have how i if in into is it"
    " its me my no not of on or our so than that the their them then there these they this to was we were what"
    " when where which who why will with would you your".split()
)


def fts_match(query: str) -> str:
    """An FTS5 query OR-ing the query's distinct words as quoted terms ('' when it has none), stopwords left out
    unless there is nothing else. Words are letters and digits only (what the unicode61 tokenizer keeps), so
    nothing of the user's text is read as FTS5 syntax."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))
    words = [w for w in words if w not in STOPWORDS] or words
    return " OR ".join(f'"{w}"' for w in words[:MAX_QUERY_TERMS])


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal Rank Fusion: (id, score) best first; ties go to the id ranked better anywhere, then the smaller id."""
    scores: dict[int, float] = {}
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
            best[item] = min(best.get(item, rank), rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]], kv[0]))


# ---- embeddings ----


class EmbeddingError(Exception):
    """The embeddings endpoint failed or answered something unusable; the message says which."""


class EmbeddingsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Literal["openai", "ollama", "none"]
    url: str = ""
    model: str = ""
    key: str = ""
    dimensions: int = Field(0, ge=0, le=MAX_DIMS)
    timeout_seconds: float = Field(DEFAULT_TIMEOUT_SECONDS, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not url:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials; name a stored key with `key` instead")
        if len(url) > 2000 or _CONTROL.search(url):
            raise ValueError("must be at most 2000 characters without control characters")
        return url.rstrip("/")

    @field_validator("model")
    @classmethod
    def _model(cls, model: str) -> str:
        if len(model) > 200 or _CONTROL.search(model):
            raise ValueError("must be at most 200 characters without control characters")
        return model

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        if key:
            try:
                check_name(key)
            except errors.InvalidArgument as exc:
                raise ValueError(exc.message) from None
        return key

    @model_validator(mode="after")
    def _complete(self) -> EmbeddingsConfig:
        if self.provider != "none" and not (self.url and self.model):
            raise ValueError(f"provider {self.provider!r} needs a url and a model")
        return self

    @property
    def active(self) -> bool:
        return self.provider != "none"

    @property
    def space(self) -> str:
        """Which vectors are comparable: the same provider kind, model and requested dimensions."""
        return f"{self.provider}:{self.model}:{self.dimensions or ''}"

    @classmethod
    def from_proto(cls, message: hpb.KbEmbeddings) -> EmbeddingsConfig:
        try:
            return cls(
                provider=message.provider,  # type: ignore[arg-type]
                url=message.url,
                model=message.model,
                key=message.key,
                dimensions=message.dimensions,
                timeout_seconds=message.timeout_seconds or DEFAULT_TIMEOUT_SECONDS,
            )
        except ValidationError as exc:
            problems = validation_problems(exc, root="embeddings")
            raise errors.InvalidArgument(f"invalid embeddings settings: {problems}") from None

    def to_proto(self, scope: str) -> hpb.KbEmbeddings:
        return hpb.KbEmbeddings(
            provider=self.provider,
            url=self.url,
            model=self.model,
            key=self.key,
            dimensions=self.dimensions,
            timeout_seconds=self.timeout_seconds,
            scope=scope,
        )


class Embedder(Protocol):
    async def embed(self, texts: list[str]) -> np.ndarray:
        """One unit-length float32 row per text (zero rows stay zero)."""
        ...


def normalize(matrix: np.ndarray) -> np.ndarray:
    import numpy as np

    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


@functools.cache
def _tls(trust_env: bool) -> Any:
    """The TLS context of the endpoint's clients, made once per process. httpx builds a new one (loading the whole
    CA bundle: ~40 ms of CPU, 200+ on a loaded machine) for every client it makes, and a search makes one. Built as
    httpx would: certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR when the environment is trusted."""
    import httpx

    return httpx.create_ssl_context(trust_env=trust_env)


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpEmbedder:
    """Talks to an OpenAI-compatible or Ollama embeddings endpoint. Everything it reads back is checked (shape,
    count, finite numbers, size), since a misconfigured or hostile endpoint must not corrupt the index."""

    def __init__(self, config: EmbeddingsConfig, api_key: str = "") -> None:
        self.config = config
        self._api_key = api_key

    async def embed(self, texts: list[str]) -> np.ndarray:
        import httpx
        import numpy as np

        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        # Environment proxies are for the outside world; a local endpoint (Ollama, a test server) is dialled directly.
        trust_env = not _is_loopback(self.config.url)
        async with httpx.AsyncClient(
            timeout=self.config.timeout_seconds, trust_env=trust_env, verify=_tls(trust_env), follow_redirects=False
        ) as client:
            parts = []
            for start in range(0, len(texts), EMBED_BATCH):
                batch = texts[start : start + EMBED_BATCH]
                try:
                    async with asyncio.timeout(self.config.timeout_seconds):
                        parts.append(await self._post(client, batch))
                except TimeoutError:
                    raise EmbeddingError(f"no answer within {self.config.timeout_seconds:g}s") from None
        dims = {p.shape[1] for p in parts}
        if len(dims) != 1:
            raise EmbeddingError(f"the endpoint answered vectors of different lengths {sorted(dims)}")
        return normalize(np.vstack(parts))

    async def _post(self, client: Any, batch: list[str]) -> np.ndarray:
        import httpx
        import numpy as np

        c = self.config
        payload: dict[str, Any] = {"model": c.model, "input": batch}
        if c.provider == "openai":
            url = f"{c.url}/embeddings"
            payload["encoding_format"] = "float"
            if c.dimensions:
                payload["dimensions"] = c.dimensions
        else:
            url = f"{c.url}/api/embed"
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        body = bytearray()
        try:
            async with client.stream("POST", url, json=payload, headers=headers) as resp:
                async for part in resp.aiter_bytes():
                    body += part
                    if len(body) > MAX_EMBED_RESPONSE_BYTES:
                        raise EmbeddingError(f"the answer is larger than {MAX_EMBED_RESPONSE_BYTES} bytes")
                status = resp.status_code
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"{type(exc).__name__}: {exc}") from None
        if status != 200:
            snippet = body[:300].decode("utf-8", "replace").strip()
            raise EmbeddingError(f"HTTP {status} from {url}: {snippet}")
        try:
            data = json.loads(body)
            if c.provider == "openai":
                rows = sorted(data["data"], key=lambda d: int(d["index"]))
                vectors = [row["embedding"] for row in rows]
            else:
                vectors = data["embeddings"]
            matrix = np.array(vectors, dtype=np.float32)
        except (ValueError, TypeError, KeyError) as exc:
            raise EmbeddingError(f"the answer is not an embeddings response: {type(exc).__name__}: {exc}") from None
        if matrix.ndim != 2 or matrix.shape[0] != len(batch):
            raise EmbeddingError(f"asked for {len(batch)} vectors, got an array of shape {matrix.shape}")
        if not 1 <= matrix.shape[1] <= MAX_DIMS:
            raise EmbeddingError(f"vectors of {matrix.shape[1]} dimensions (at most {MAX_DIMS})")
        if c.dimensions and matrix.shape[1] != c.dimensions:
            raise EmbeddingError(f"asked for {c.dimensions} dimensions, got {matrix.shape[1]}")
        if not np.isfinite(matrix).all():
            raise EmbeddingError("the vectors hold NaN or infinite numbers")
        return matrix


EmbedderFactory = Callable[[EmbeddingsConfig, str], Embedder]


# ---- the in-memory vector index ----


class VectorIndex:
    """A bot's vectors of one space as one matrix: a query is a single matrix-vector product."""

    def __init__(self, ids: np.ndarray, matrix: np.ndarray) -> None:
        self.ids = ids
        self.matrix = matrix

    @property
    def dims(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes + self.ids.nbytes)

    def top(self, query: np.ndarray, n: int) -> list[int]:
        import numpy as np

        scores = self.matrix @ query
        n = min(n, len(scores))
        if n <= 0:
            return []
        best = np.argpartition(-scores, n - 1)[:n]
        order = best[np.argsort(-scores[best], kind="stable")]
        return [int(i) for i in self.ids[order]]


# ---- the service ----


def check_query(query: str) -> str:
    if not query.strip():
        raise errors.InvalidArgument("query must not be empty")
    if len(query) > MAX_QUERY_CHARS:
        raise errors.InvalidArgument(f"query is longer than MAX_QUERY_CHARS = {MAX_QUERY_CHARS} characters")
    return query


def check_top_k(top_k: int) -> int:
    if top_k == 0:
        return DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise errors.OutOfRange(f"top_k must be between 1 and {MAX_TOP_K}, got {top_k}")
    return top_k


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


class KnowledgeBase:
    """Owned by the Host; the admin servicer and the run API call it. `embedder_for` builds the client of an
    endpoint from its settings and resolved key (tests and the benchmark hand in in-process ones)."""

    def __init__(
        self,
        store: KnowledgeStore,
        artifacts: ArtifactStore,
        keys: KeyStore,
        *,
        embedder_for: EmbedderFactory | None = None,
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.keys = keys
        self._embedder_for: EmbedderFactory = embedder_for or HttpEmbedder
        # Bumped by every change to a bot's chunks; a cached index of an older generation is rebuilt.
        self._generation: dict[str, int] = collections.defaultdict(int)
        self._indexes: collections.OrderedDict[tuple[str, str], tuple[int, VectorIndex | None]] = (
            collections.OrderedDict()
        )
        self._query_vectors: collections.OrderedDict[tuple[str, str], np.ndarray] = collections.OrderedDict()
        self._query_slots = asyncio.Semaphore(MAX_CONCURRENT_QUERY_EMBEDS)
        self._add_slots = asyncio.Semaphore(MAX_CONCURRENT_ADD_EMBEDS)
        self._warnings = RefusalLimiter()  # lines a searching runner can repeat at will (log_limited)

    # ---- embeddings settings ----

    def _stored_config(self, scope: str) -> EmbeddingsConfig | None:
        raw = self.store.embeddings_config(scope)
        if raw is None:
            return None
        try:
            return EmbeddingsConfig.model_validate_json(raw)
        except ValidationError:
            log.error("stored embeddings settings of %s do not validate; ignoring them", scope)
            return None

    def effective_config(self, bot_id: str) -> tuple[EmbeddingsConfig | None, str]:
        """(settings, scope they come from): the bot's own, else the host-wide ones, else (None, '')."""
        for scope in (bot_id, HOST_WIDE):
            config = self._stored_config(scope)
            if config is not None:
                return config, scope
        return None, ""

    async def set_embeddings(self, bot_id: str, message: hpb.KbEmbeddings | None) -> hpb.KbEmbeddings:
        """bot_id '' = host-wide; message None clears. Returns what the scope uses afterwards."""
        scope = bot_id or HOST_WIDE
        if message is None:
            await self.store.set_embeddings_config(scope, None)
        else:
            config = EmbeddingsConfig.from_proto(message)
            if config.key and config.key not in {k.name for k in self.keys.list()}:
                raise errors.FailedPrecondition(
                    f"the host has no key {config.key!r}; store it first with `agenthost keys set {config.key}`"
                )
            await self.store.set_embeddings_config(scope, config.model_dump_json())
        self._indexes.clear()  # a host-wide change reaches every bot
        return self.get_embeddings(bot_id)

    def get_embeddings(self, bot_id: str) -> hpb.KbEmbeddings:
        if bot_id:
            config, scope = self.effective_config(bot_id)
        else:
            config, scope = self._stored_config(HOST_WIDE), HOST_WIDE
        return config.to_proto(scope) if config is not None else hpb.KbEmbeddings(provider="none")

    def _embedder(self, config: EmbeddingsConfig) -> Embedder:
        api_key = self.keys.resolve([config.key])[config.key] if config.key else ""
        return self._embedder_for(config, api_key)

    async def _embed(self, embedder: Embedder, texts: list[str], slots: asyncio.Semaphore) -> np.ndarray:
        async with slots:
            return await embedder.embed(texts)

    # ---- documents ----

    async def add(self, bot_id: str, name: str, content: bytes) -> hpb.KbDocument:
        name = name.strip()
        if not name or len(name) > MAX_DOCUMENT_NAME_CHARS or _CONTROL.search(name):
            raise errors.InvalidArgument(
                f"document name must be 1-{MAX_DOCUMENT_NAME_CHARS} characters without control characters"
            )
        if len(content) > MAX_DOCUMENT_BYTES:
            raise errors.ResourceExhausted(
                f"document is {len(content)} bytes; MAX_DOCUMENT_BYTES = {MAX_DOCUMENT_BYTES} (split it)"
            )
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.InvalidArgument(
                f"document {name!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None
        if "\x00" in text:
            raise errors.InvalidArgument(f"document {name!r} holds NUL bytes; only text documents are indexed")
        chunks = chunk_text(text)
        if not chunks:
            raise errors.InvalidArgument(f"document {name!r} has no text")
        # Checked here to fail before paying for embeddings, and again in the write transaction (which decides).
        documents = self.store.documents(bot_id)
        have = sum(d.chunks for d in documents)
        if len(documents) + 1 > MAX_DOCUMENTS_PER_BOT:
            raise errors.ResourceExhausted(f"bot has MAX_DOCUMENTS_PER_BOT = {MAX_DOCUMENTS_PER_BOT} documents")
        if have + len(chunks) > MAX_CHUNKS_PER_BOT:
            raise errors.ResourceExhausted(
                f"this document's {len(chunks)} chunks would take the bot past MAX_CHUNKS_PER_BOT ="
                f" {MAX_CHUNKS_PER_BOT} (it has {have}); remove documents first"
            )
        config, _ = self.effective_config(bot_id)
        blobs: list[bytes | None] = [None] * len(chunks)
        space, dims = "", 0
        if config is not None and config.active:
            embedder = self._embedder(config)
            try:
                matrix = await self._embed(embedder, [c.text for c in chunks], self._add_slots)
            except EmbeddingError as exc:
                raise errors.Unavailable(
                    f"the embeddings endpoint failed, so nothing was stored: {exc}. Fix the endpoint, or set this"
                    " bot's provider to none to add documents for keyword search only"
                ) from None
            if matrix.shape[0] != len(chunks):
                raise errors.Unavailable(f"the embedder returned {matrix.shape[0]} vectors for {len(chunks)} chunks")
            space, dims = config.space, int(matrix.shape[1])
            blobs = [row.astype("<f4").tobytes() for row in matrix]
        ref = await self.artifacts.create(
            _once(content),
            name=name,
            mime_type="text/plain",
            metadata_json=json.dumps({"knowledge_base": True}),
            bot_id=bot_id,
            conversation_id="",
            run_id="",
            expected_size=len(content),
        )
        document = hpb.KbDocument(
            doc_id=f"doc_{uuid.uuid4().hex[:20]}",
            bot_id=bot_id,
            name=name,
            artifact_id=ref.artifact_id,
            sha256=ref.sha256,
            size_bytes=ref.size_bytes,
            chunks=len(chunks),
            embedding_space=space,
            created_at=time.time(),
        )
        try:
            await self.store.add(
                document,
                [
                    NewChunk(c.ordinal, c.start_line, c.end_line, c.text, blob)
                    for c, blob in zip(chunks, blobs, strict=True)
                ],
                dims=dims,
                max_documents=MAX_DOCUMENTS_PER_BOT,
                max_chunks=MAX_CHUNKS_PER_BOT,
            )
        except BaseException:
            # Refused by the caps in the transaction (an add racing this one won) or failed: the artifact written
            # above belongs to no document, so it goes (a crash right here leaves an unreachable row, nothing more).
            await asyncio.shield(self.store.forget_artifact(bot_id, ref.artifact_id))
            raise
        self._changed(bot_id)
        return document

    def documents(self, bot_id: str) -> list[hpb.KbDocument]:
        return self.store.documents(bot_id)

    async def remove(self, bot_id: str, doc_id: str) -> None:
        if not doc_id or len(doc_id) > 128:
            raise errors.InvalidArgument("doc_id must be 1-128 characters")
        if not await self.store.remove(bot_id, doc_id):
            raise errors.NotFound(f"bot has no document {doc_id!r}")
        self._changed(bot_id)

    async def reindex(self, bot_id: str) -> tuple[int, int]:
        """Embeds every document of the bot without vectors in the configured space; (documents, chunks) done."""
        config, _ = self.effective_config(bot_id)
        if config is None or not config.active:
            raise errors.FailedPrecondition("no embeddings endpoint is configured for this bot (kb embeddings set)")
        embedder = self._embedder(config)
        done_docs = done_chunks = 0
        try:
            for document in self.store.documents_without(bot_id, config.space):
                rows = self.store.chunk_texts(document.doc_id)
                if not rows:
                    continue
                try:
                    matrix = await self._embed(embedder, [text for _, text in rows], self._add_slots)
                except EmbeddingError as exc:
                    raise errors.Unavailable(
                        f"the embeddings endpoint failed at document {document.name!r} after {done_docs} were"
                        f" embedded: {exc}"
                    ) from None
                vectors = {cid: row.astype("<f4").tobytes() for (cid, _), row in zip(rows, matrix, strict=True)}
                if await self.store.set_vectors(bot_id, document.doc_id, config.space, int(matrix.shape[1]), vectors):
                    done_docs += 1
                    done_chunks += len(rows)
        finally:
            self._changed(bot_id)
        return done_docs, done_chunks

    def _changed(self, bot_id: str) -> None:
        self._generation[bot_id] += 1

    # ---- search ----

    def _index(self, bot_id: str, space: str) -> VectorIndex | None:
        import numpy as np

        key = (bot_id, space)
        generation = self._generation[bot_id]
        cached = self._indexes.get(key)
        if cached is not None and cached[0] == generation:
            self._indexes.move_to_end(key)
            return cached[1]
        ids, blobs, dims = self.store.vectors(bot_id, space)
        index = None
        if ids:
            # Every row of one space has the same length unless an endpoint changed its answer under the same
            # settings; such rows cannot be compared with the rest, so they are left to the keyword pass.
            keep = [i for i, b in enumerate(blobs) if len(b) == 4 * dims]
            if len(keep) < len(ids):
                log.warning("%d vectors of bot %s have the wrong length", len(ids) - len(keep), bot_id)
            matrix = np.frombuffer(b"".join(blobs[i] for i in keep), dtype="<f4").reshape(len(keep), dims)
            index = VectorIndex(np.array([ids[i] for i in keep], dtype=np.int64), matrix)
        self._indexes[key] = (generation, index)
        self._indexes.move_to_end(key)
        total = sum(i.nbytes for _, i in self._indexes.values() if i is not None)
        while total > VECTOR_CACHE_BYTES and len(self._indexes) > 1:
            _, (_, evicted) = self._indexes.popitem(last=False)
            total -= evicted.nbytes if evicted is not None else 0
        return index

    async def _query_vector(self, config: EmbeddingsConfig, query: str) -> np.ndarray:
        key = (config.space, query)
        cached = self._query_vectors.get(key)
        if cached is not None:
            self._query_vectors.move_to_end(key)
            return cached
        embedder = self._embedder(config)
        async with asyncio.timeout(min(QUERY_EMBED_SECONDS, config.timeout_seconds)):
            matrix = await self._embed(embedder, [query], self._query_slots)
        if matrix.shape[0] != 1:
            raise EmbeddingError(f"asked for one vector, got {matrix.shape[0]}")
        vector = matrix[0]
        self._query_vectors[key] = vector
        while len(self._query_vectors) > QUERY_CACHE_ENTRIES:
            self._query_vectors.popitem(last=False)
        return vector

    async def search(self, bot_id: str, query: str, top_k: int) -> api.KbSearchResponse:
        """The bot's best chunks for the query: both passes fused, or the keyword pass alone (and flagged)."""
        query = check_query(query)
        top_k = check_top_k(top_k)
        response = api.KbSearchResponse()
        match = fts_match(query)
        keyword_ids = self.store.keyword(bot_id, match, CANDIDATES) if match else []
        vector_ids: list[int] = []
        config, _ = self.effective_config(bot_id)
        if config is None or not config.active:
            response.keyword_only = True
            response.keyword_only_reason = "no embeddings endpoint is configured for this bot"
        else:
            response.documents_without_vectors = self.store.count_without(bot_id, config.space)
            # pgvector: the server searches its own column; otherwise the matrix this host keeps per bot.
            in_db = self.store.vectors_in_db
            index = None if in_db else self._index(bot_id, config.space)
            dims = self.store.space_dims(bot_id, config.space) if in_db else index.dims if index else None
            if dims is None:
                response.keyword_only = True
                response.keyword_only_reason = "no document of this bot has vectors for its embeddings endpoint yet"
            else:
                try:
                    vector = await self._query_vector(config, query)
                except (EmbeddingError, TimeoutError, errors.FailedPrecondition) as exc:
                    # The caller may be an untrusted runner: the endpoint's own words (its URL, its error page) stay
                    # in the host log.
                    # A runner may search again and again while the endpoint fails: a few lines a minute.
                    log_limited(
                        self._warnings,
                        log,
                        "kb:embeddings_failed",
                        logging.WARNING,
                        "kb search for bot %s searched by keywords only: embeddings failed: %s",
                        bot_id,
                        exc,
                    )
                    response.keyword_only = True
                    response.keyword_only_reason = "the embeddings endpoint failed for this query (see the host log)"
                else:
                    if vector.shape[0] != dims:
                        log_limited(
                            self._warnings,
                            log,
                            "kb:vector_length",
                            logging.WARNING,
                            "kb query vector has %d dims, the stored ones %d",
                            vector.shape[0],
                            dims,
                        )
                        response.keyword_only = True
                        response.keyword_only_reason = "the embeddings endpoint changed its vector length; reindex"
                    elif index is not None:
                        vector_ids = index.top(vector, CANDIDATES)
                    else:
                        query_vector = vector.astype("<f4").tobytes()
                        vector_ids = self.store.nearest(bot_id, config.space, query_vector, CANDIDATES)
        keyword_rank = {cid: r for r, cid in enumerate(keyword_ids, start=1)}
        vector_rank = {cid: r for r, cid in enumerate(vector_ids, start=1)}
        fused = rrf([keyword_ids, vector_ids])
        rows = self.store.chunks(bot_id, [cid for cid, _ in fused[: top_k * 2]])
        for cid, score in fused:
            row = rows.get(cid)
            if row is None:  # removed since the index was read, or (never) another bot's id
                continue
            response.hits.add(
                doc_id=row.doc_id,
                document_name=row.document_name,
                artifact_id=row.artifact_id,
                chunk_index=row.ordinal,
                start_line=row.start_line,
                end_line=row.end_line,
                text=row.text,
                score=score,
                keyword_rank=keyword_rank.get(cid, 0),
                vector_rank=vector_rank.get(cid, 0),
            )
            if len(response.hits) >= top_k:
                break
        return response
