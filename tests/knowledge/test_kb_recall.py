"""recall@5 on the labelled set (corpus.py), keyword-only against hybrid, through the real host and the fake
embeddings endpoint over HTTP. benchmarks/bench_kb.py prints the same table with the vector pass alone as well."""

from __future__ import annotations

import statistics

import pytest

from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

from .conftest import add, search, use_endpoint
from .corpus import DOCUMENTS, QUERIES
from .fake_embeddings import FakeEmbeddings

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
async def test_recall_at_5_keyword_only_vs_hybrid(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    assert len(DOCUMENTS) >= 30 and len(QUERIES) >= 20
    await h.client.call("CreateBot", hpb.CreateBotRequest(name="kwonly"))
    await use_endpoint(h, embeddings, bot=h.bot)
    names: dict[str, str] = {}
    for name, text in DOCUMENTS.items():
        for bot in (h.bot, "kwonly"):
            names[(await add(h, name, text, bot=bot)).doc_id] = name
    found: dict[tuple[str, str], list[bool]] = {}
    for query, answer, kind in QUERIES:
        keyword = await search(h, query, bot="kwonly", top_k=5)
        hybrid = await search(h, query, top_k=5)
        assert keyword.keyword_only and not hybrid.keyword_only
        for mode, result in (("keyword", keyword), ("hybrid", hybrid)):
            hit = answer in [names[x.doc_id] for x in result.hits]
            found.setdefault((mode, kind), []).append(hit)
            found.setdefault((mode, "all"), []).append(hit)
    table = {key: statistics.mean(hits) for key, hits in found.items()}
    print("\nrecall@5", {f"{m}/{k}": round(v, 2) for (m, k), v in sorted(table.items())})
    # Keywords find what is worded like the documents; only fusion also finds paraphrases and keeps identifiers.
    assert table[("keyword", "keyword")] == 1.0 and table[("hybrid", "keyword")] == 1.0
    assert table[("hybrid", "identifier")] == 1.0
    assert table[("keyword", "paraphrase")] < 0.5 < 0.9 <= table[("hybrid", "paraphrase")]
    assert table[("hybrid", "all")] >= table[("keyword", "all")] + 0.2
