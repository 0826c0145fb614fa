"""The local agent's search_knowledge tool end to end: a scripted model on loopback asks for it, the real host
answers through the run API, and the passage reaches the model's next request."""

from __future__ import annotations

from pathlib import Path

import pytest

from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

from .conftest import add, use_endpoint
from .fake_embeddings import FakeEmbeddings

pytestmark = pytest.mark.timeout(90)

FLEET = "# Fleet tracking\nFleet tracking records each vehicle's location every 30 seconds.\nTrips are kept a year."


def cfg(server: FakeProviderServer) -> dict[str, object]:
    return {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1}


def offered(request: object) -> set[str]:
    return {t["function"]["name"] for t in request.json()["tools"]}  # type: ignore[attr-defined]


async def test_search_knowledge_end_to_end(tmp_path: Path, embeddings: FakeEmbeddings) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            await use_endpoint(h, embeddings)
            fleet = await add(h, "fleet.md", FLEET)
            server.push(
                openai_tool_calls([("k1", "search_knowledge", {"query": "automobile whereabouts", "top_k": 2})]),
                openai_text("Every 30 seconds, per fleet.md."),
            )
            r = await h.send("how often is my truck's position recorded?", conversation_id="kb")
            assert r.run.status == "completed", r.run.error_message
            assert r.text == "Every 30 seconds, per fleet.md."
            assert "search_knowledge" in offered(server.model_requests[0])
            (finished,) = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert not finished.is_error, finished.result
            assert finished.result.startswith(f"[1] fleet.md lines 1-3 (doc {fleet.doc_id}, artifact ")
            assert "every 30 seconds" in finished.result and "keyword search only" not in finished.result
            tool_messages = [m for m in server.model_requests[1].json()["messages"] if m["role"] == "tool"]
            assert len(tool_messages) == 1 and "every 30 seconds" in tool_messages[0]["content"]

            # keyword-only mode, said to the model as such
            await h.client.call("KbSetEmbeddings", hpb.KbSetEmbeddingsRequest(clear=True))
            server.push(
                openai_tool_calls([("k2", "search_knowledge", {"query": "fleet tracking"})]),
                openai_text("ok"),
            )
            r = await h.send("and the fleet?", conversation_id="kb")
            (finished,) = [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]
            assert finished.result.startswith("(keyword search only: no embeddings endpoint is configured")
            assert "fleet.md lines 1-3" in finished.result


async def test_search_knowledge_is_not_offered_without_the_grant(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(server)) as h:
            apis = ["history.page", "history.search", "artifacts.read", "state.read", "state.write"]
            await h.bind("test/local-agent", cfg(server), conversation_pattern="nokb", priority=5, apis=apis)
            server.push(openai_text("hi"), openai_text("hi"))
            assert (await h.send("hello", conversation_id="nokb")).run.status == "completed"
            assert (await h.send("hello", conversation_id="withkb")).run.status == "completed"
            assert "search_knowledge" not in offered(server.model_requests[0])
            assert "search_knowledge" in offered(server.model_requests[1])
