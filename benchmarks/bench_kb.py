"""Knowledge-base benchmark: retrieval quality on a small labelled set, and search latency over 10k chunks.

    python benchmarks/bench_kb.py [--chunks 10000] [--queries 300]

1. recall@5 on tests/knowledge/corpus.py (32 documents, 24 labelled queries) for the keyword pass alone, the vector
   pass alone and both fused (RRF), with the deterministic bag-of-concepts embedder of
   tests/knowledge/fake_embeddings.py. The figure shows that fusion keeps what each pass finds; it says nothing about
   a real embedding model, whose synonyms are not a hand-written table.
2. latency of KnowledgeBase.search (the host's whole work for a KbSearch: FTS5 pass, vector pass, fusion, rows) over
   a bot with N chunks, p50 and p99, in process (no gRPC hop, no embeddings endpoint: the query vector is computed
   in process, so the figure is the host's own cost). Measured for keyword-only (the baseline), hybrid at 256
   dimensions and hybrid at 1536 dimensions (the size of common hosted models), with the ratio to the baseline; and
   the vector pass as numpy brute force against the same scan in pure Python (why numpy).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "knowledge"))

import numpy as np  # noqa: E402
from corpus import DOCUMENTS, QUERIES  # noqa: E402
from fake_embeddings import embed  # noqa: E402

from agenthost.host import knowledge  # noqa: E402
from agenthost.host.access.keys import KeyStore  # noqa: E402
from agenthost.host.knowledge import EmbeddingsConfig, KnowledgeBase, normalize  # noqa: E402
from agenthost.host.store.artifacts import ArtifactStore  # noqa: E402
from agenthost.host.store.db import Database  # noqa: E402
from agenthost.host.store.knowledge import KnowledgeStore  # noqa: E402
from agenthost.host.store.registry import Registry  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402


class ConceptEmbedder:
    """fake_embeddings.embed in process, at any dimension count."""

    def __init__(self, config: EmbeddingsConfig, _key: str = "") -> None:
        self.dims = config.dimensions or 256

    async def embed(self, texts: list[str]) -> np.ndarray:
        return normalize(np.array([embed(t, self.dims) for t in texts], dtype=np.float32))


class RandomEmbedder:
    """Random unit vectors: only the cost of the vector pass matters for latency at large dimensions."""

    def __init__(self, config: EmbeddingsConfig, _key: str = "") -> None:
        self.dims = config.dimensions
        self.rng = np.random.default_rng(7)

    async def embed(self, texts: list[str]) -> np.ndarray:
        return normalize(self.rng.standard_normal((len(texts), self.dims), dtype=np.float32))


async def open_kb(root: Path, embedder: Any) -> tuple[Database, KnowledgeBase, Registry]:
    root.mkdir(parents=True, exist_ok=True)
    db = Database(root / "kb.db")
    await db.open()
    kb = KnowledgeBase(KnowledgeStore(db), ArtifactStore(db, root / "artifacts"), KeyStore(root), embedder_for=embedder)
    return db, kb, Registry(db)


def endpoint(dims: int = 0) -> hpb.KbEmbeddings:
    return hpb.KbEmbeddings(provider="openai", url="http://127.0.0.1:1/v1", model="bench", dimensions=dims)


async def recall(root: Path) -> dict[str, float]:
    """Two bots with the same documents: one with no embeddings endpoint (the real keyword-only mode), one with
    the concept embedder (hybrid). The vector pass alone is read from the hybrid bot's index."""
    db, kb, registry = await open_kb(root, ConceptEmbedder)
    try:
        keyword_bot = (await registry.create_bot("keyword", "")).bot_id
        hybrid_bot = (await registry.create_bot("hybrid", "")).bot_id
        await kb.set_embeddings(hybrid_bot, endpoint())
        names = {}
        for name, text in DOCUMENTS.items():
            for bot in (keyword_bot, hybrid_bot):
                names[(await kb.add(bot, name, text.encode())).doc_id] = name
        config, _ = kb.effective_config(hybrid_bot)
        assert config is not None
        index = kb._index(hybrid_bot, config.space)
        assert index is not None
        chunk_doc = {cid: names[row.doc_id] for cid, row in kb.store.chunks(hybrid_bot, index.ids.tolist()).items()}
        found: dict[tuple[str, str], list[bool]] = {}
        for query, answer, kind in QUERIES:
            keyword = await kb.search(keyword_bot, query, 5)
            hybrid = await kb.search(hybrid_bot, query, 5)
            assert keyword.keyword_only and not hybrid.keyword_only
            vector = [chunk_doc[cid] for cid in index.top(await kb._query_vector(config, query), 5)]
            for mode, ranked in (
                ("keyword", [names[h.doc_id] for h in keyword.hits]),
                ("vector", vector),
                ("hybrid", [names[h.doc_id] for h in hybrid.hits]),
            ):
                for key in ((mode, kind), (mode, "all")):
                    found.setdefault(key, []).append(answer in ranked)
        kinds = sorted({k for _, _, k in QUERIES})
        print(f"recall@5 over {len(QUERIES)} queries, {len(DOCUMENTS)} documents (one relevant document each):")
        head = [f"all ({len(QUERIES)})"] + [f"{k} ({sum(q[2] == k for q in QUERIES)})" for k in kinds]
        print(f"  {'pass':8}" + "".join(f"{h:>17}" for h in head))
        for mode in ("keyword", "vector", "hybrid"):
            print(f"  {mode:8}" + "".join(f"{statistics.mean(found[(mode, k)]):17.2f}" for k in ["all", *kinds]))
        return {mode: statistics.mean(found[(mode, "all")]) for mode in ("keyword", "vector", "hybrid")}
    finally:
        await db.close()


WORDS = [f"w{i}" for i in range(5000)]


def synthetic_chunk(rng: random.Random) -> str:
    # Zipf-like word frequencies, lines of ~12 words, ~1.2 kB per chunk: the shape of prose for BM25.
    lines = []
    for _ in range(16):
        lines.append(" ".join(WORDS[min(int(rng.paretovariate(1.1)) - 1, len(WORDS) - 1)] for _ in range(12)))
    return "\n".join(lines)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def latency(root: Path, n_chunks: int, n_queries: int) -> None:
    rng = random.Random(1)
    docs: list[str] = []
    planned = 0
    while planned < n_chunks:  # documents of ~20 chunks, as many as it takes (counted by the real chunker)
        text = "\n".join(synthetic_chunk(rng) for _ in range(12))
        docs.append(text)
        planned += len(knowledge.chunk_text(text))
    queries = [" ".join(rng.choice(WORDS[:2000]) for _ in range(rng.randint(2, 8))) for _ in range(n_queries)]
    knowledge.MAX_CHUNKS_PER_BOT = max(knowledge.MAX_CHUNKS_PER_BOT, 2 * n_chunks)
    results: dict[str, tuple[float, float]] = {}
    for label, embedder, dims in (
        ("keyword only (baseline)", ConceptEmbedder, None),
        ("hybrid, 256 dims", ConceptEmbedder, 256),
        ("hybrid, 1536 dims", RandomEmbedder, 1536),
    ):
        sub = root / label.split()[0] / str(dims)
        db, kb, registry = await open_kb(sub, embedder)
        try:
            bot = (await registry.create_bot("latency", "")).bot_id
            if dims:
                await kb.set_embeddings(bot, endpoint(dims))
            started = time.perf_counter()
            total = 0
            for i, text in enumerate(docs):
                total += (await kb.add(bot, f"doc{i}.txt", text.encode())).chunks
            took = time.perf_counter() - started
            await kb.search(bot, "warm up the index", 5)  # the first search of a generation loads the matrix
            samples = []
            for query in queries:
                t = time.perf_counter()
                result = await kb.search(bot, query, 5)
                samples.append((time.perf_counter() - t) * 1000)
                assert result.keyword_only == (dims is None)
            results[label] = (percentile(samples, 50), percentile(samples, 99))
            print(
                f"  {label:26} {total} chunks (indexed in {took:.1f}s)  p50 {results[label][0]:6.2f} ms"
                f"  p99 {results[label][1]:6.2f} ms"
            )
        finally:
            await db.close()
    base = results["keyword only (baseline)"][0]
    for label, (p50, _) in results.items():
        print(f"  {label:26} p50 / baseline p50 = {p50 / base:.2f}")


def vector_pass(n_chunks: int) -> None:
    rng = np.random.default_rng(3)
    dims = 1536
    matrix = normalize(rng.standard_normal((n_chunks, dims), dtype=np.float32))
    query = normalize(rng.standard_normal((1, dims), dtype=np.float32))[0]
    index = knowledge.VectorIndex(np.arange(n_chunks, dtype=np.int64), matrix)
    numpy_ms = []
    for _ in range(50):
        t = time.perf_counter()
        index.top(query, knowledge.CANDIDATES)
        numpy_ms.append((time.perf_counter() - t) * 1000)
    rows = [list(map(float, r)) for r in matrix[:1000]]
    q = list(map(float, query))
    t = time.perf_counter()
    scores = [sum(a * b for a, b in zip(r, q, strict=True)) for r in rows]
    sorted(range(len(scores)), key=scores.__getitem__)[-knowledge.CANDIDATES :]
    python_ms = (time.perf_counter() - t) * 1000 * n_chunks / 1000
    p50 = statistics.median(numpy_ms)
    print(
        f"vector pass alone, {n_chunks} x {dims}: numpy p50 {p50:.2f} ms; pure Python (1000 rows, scaled)"
        f" {python_ms:.0f} ms; ratio {python_ms / p50:.0f}x"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await recall(Path(tmp) / "recall")
        print(f"\nKnowledgeBase.search over {args.chunks} chunks, {args.queries} distinct queries, top_k 5:")
        await latency(Path(tmp) / "latency", args.chunks, args.queries)
    vector_pass(args.chunks)


if __name__ == "__main__":
    asyncio.run(main())
