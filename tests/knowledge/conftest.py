"""Fixtures of the knowledge-base tests: a real host with a probe runner that searches the knowledge base from
inside its run, and the fake embeddings endpoint on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors, run_api_pb2_grpc
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import CHANNEL_OPTIONS
from agenthost.runners.external_harness.mcp_bridge import Bridge
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.testing import HostHarness

from .fake_embeddings import FakeEmbeddings


class KbProbe(Runner):
    """Searches the knowledge base for the message text and answers with what came back, as JSON.

    Config `read`: an artifact id to read instead. Config `times`: how many times to search (the last one answers).
    Config `via`: "sdk" (RunAPI.kb_search with the run token and plugin secret) or "bridge" (the MCP bridge's
    kb_search tool over a RunAPI holding only the run's tool token, as a harness's bridge does)."""

    manifest = RunnerManifest(name="kbprobe")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        top_k = int(run.config.get("top_k", 10))
        if "read" in run.config:  # reads an artifact (a hit's artifact_id) instead of searching
            try:
                chunk = await run.api.artifact_read_range(run.config["read"], 0, 4096)
                yield events.text(json.dumps({"read": chunk.data.decode()}))
            except errors.AgentHostError as exc:
                yield events.text(json.dumps({"error": exc.code.name}))
            return
        try:
            if run.config.get("via") == "bridge":
                channel = grpc.aio.insecure_channel(run.api.host_address, options=CHANNEL_OPTIONS)
                try:
                    api = RunAPI(
                        run_api_pb2_grpc.AgentRunAPIProxyStub(channel),
                        run_id=run.run_id,
                        run_token=run.tool_token,
                        deadline_at=run.deadline_at,
                    )
                    out: dict[str, Any] = await Bridge(api).call("kb_search", {"query": run.text, "top_k": top_k})
                finally:
                    await channel.close()
            else:
                for _ in range(int(run.config.get("times", 1)) - 1):  # the same search again first, as often as asked
                    await run.api.kb_search(run.text, top_k=top_k)
                result = await run.api.kb_search(run.text, top_k=top_k)
                out = {
                    "hits": [{"doc_id": h.doc_id, "text": h.text, "vector_rank": h.vector_rank} for h in result.hits],
                    "keyword_only": result.keyword_only,
                    "keyword_only_reason": result.keyword_only_reason,
                }
        except errors.AgentHostError as exc:
            out = {"error": exc.code.name, "message": exc.message}
        yield events.text(json.dumps(out))


async def ask(h: HostHarness, text: str, *, conversation_id: str = "default") -> dict[str, Any]:
    result = await h.send(text, conversation_id=conversation_id)
    assert result.run.status == "completed", result.run.error_message
    return json.loads(result.text)


async def add(h: HostHarness, name: str, text: str, *, bot: str | None = None) -> hpb.KbDocument:
    return await h.client.call(
        "KbAddDocument", hpb.KbAddDocumentRequest(bot=bot or h.bot, name=name, content=text.encode())
    )


async def search(h: HostHarness, query: str, *, bot: str | None = None, top_k: int = 5) -> Any:
    return await h.client.call("KbSearch", hpb.KbAdminSearchRequest(bot=bot or h.bot, query=query, top_k=top_k))


async def use_endpoint(h: HostHarness, server: FakeEmbeddings, *, bot: str = "", **fields: Any) -> hpb.KbEmbeddings:
    settings = {"provider": "openai", "url": server.openai_url, "model": "fake-concepts", **fields}
    return await h.client.call(
        "KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(bot=bot, embeddings=hpb.KbEmbeddings(**settings))
    )


@pytest.fixture
async def embeddings() -> AsyncIterator[FakeEmbeddings]:
    async with FakeEmbeddings() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql", "pgvector"])
def kb_database(request: pytest.FixtureRequest) -> dict[str, Any]:
    """HostHarness `host_options` for each backend: SQLite, PostgreSQL (vectors searched in the host), and
    PostgreSQL with pgvector (vectors searched in the server; skipped where no such server is installed)."""
    if request.param == "sqlite":
        return {}
    return {"database": request.getfixturevalue("pg_dsn" if request.param == "postgresql" else "pgvector_dsn")}


@pytest.fixture
async def host(tmp_path: Path, kb_database: dict[str, Any]) -> AsyncIterator[HostHarness]:
    """A host on each backend: the knowledge base's suite runs on SQLite, on PostgreSQL, and on PostgreSQL with
    pgvector."""
    async with HostHarness(tmp_path, runners=[KbProbe], host_options=kb_database) as h:
        yield h
