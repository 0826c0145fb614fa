"""KbSearch through a run: granted like every other run API (the `kb` API), always scoped to the run's bot, and
reachable from a harness's MCP bridge holding only the run's tool token."""

from __future__ import annotations

import pytest

from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness

from .conftest import add, ask, use_endpoint
from .fake_embeddings import FakeEmbeddings

pytestmark = pytest.mark.timeout(60)

OURS = "# Vehicles\nFleet tracking records each vehicle's location every 30 seconds."
THEIRS = "# Vehicles (other bot)\nEvery vehicle location of the other bot, secret route plans."


async def audit_outcomes(h: HostHarness, method: str) -> list[str]:
    h.host.audit.flush()
    await h.host.db.flush()
    return [r["outcome"] for r in h.host.audit.rows() if r["method"] == method]


async def test_granted_run_searches_its_own_bot_only(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    await use_endpoint(h, embeddings)  # host-wide: both bots get the vector pass too
    ours = await add(h, "vehicles.md", OURS)
    await h.client.call("CreateBot", hpb.CreateBotRequest(name="other"))
    theirs = [await add(h, f"theirs-{i}.md", THEIRS, bot="other") for i in range(5)]
    # the other bot's documents match the query better, by both passes; the run must still never see them
    out = await ask(h, "vehicle location route plans secret")
    assert "error" not in out, out
    assert not out["keyword_only"]
    assert [hit["doc_id"] for hit in out["hits"]] == [ours.doc_id]
    assert out["hits"][0]["vector_rank"] == 1
    assert {t.doc_id for t in theirs}.isdisjoint(hit["doc_id"] for hit in out["hits"])
    assert await audit_outcomes(h, "KbSearch") == ["OK"]
    # a hit's artifact is the whole document, readable with artifacts.read; the other bot's is not
    await h.bind("test/kbprobe", {"read": ours.artifact_id}, conversation_pattern="read-ours", priority=5)
    await h.bind("test/kbprobe", {"read": theirs[0].artifact_id}, conversation_pattern="read-theirs", priority=6)
    assert (await ask(h, "read", conversation_id="read-ours"))["read"] == OURS
    assert (await ask(h, "read", conversation_id="read-theirs"))["error"] == "PERMISSION_DENIED"


async def test_run_without_the_kb_grant_is_denied(host: HostHarness) -> None:
    h = host
    await add(h, "vehicles.md", OURS)
    apis = ["history.page", "history.search", "state.read", "state.write"]
    await h.bind("test/kbprobe", conversation_pattern="nokb", priority=5, apis=apis)
    out = await ask(h, "vehicle", conversation_id="nokb")
    assert out["error"] == "PERMISSION_DENIED" and "KbSearch is not granted" in out["message"]
    granted = await ask(h, "vehicle", conversation_id="withkb")
    assert len(granted["hits"]) == 1 and granted["keyword_only"]
    assert await audit_outcomes(h, "KbSearch") == ["PERMISSION_DENIED", "OK"]


async def test_bad_arguments_from_a_run_are_typed(host: HostHarness) -> None:
    h = host
    await h.bind("test/kbprobe", {"top_k": 999}, conversation_pattern="big", priority=5)
    assert (await ask(h, "vehicle", conversation_id="big"))["error"] == "OUT_OF_RANGE"
    assert (await ask(h, "x" * 2001))["error"] == "INVALID_ARGUMENT"
    assert (await ask(h, "vehicle"))["hits"] == []  # an empty knowledge base is no error


async def test_the_mcp_bridge_tool_with_the_tool_token(host: HostHarness, embeddings: FakeEmbeddings) -> None:
    h = host
    await use_endpoint(h, embeddings)
    ours = await add(h, "vehicles.md", OURS)
    await h.bind("test/kbprobe", {"via": "bridge", "top_k": 3}, conversation_pattern="harness", priority=5)
    out = await ask(h, "automobile whereabouts", conversation_id="harness")
    assert "keyword_only" not in out  # the bridge's JSON leaves out false flags: the vector pass ran
    assert [hit["doc_id"] for hit in out["hits"]] == [ours.doc_id]
    assert out["hits"][0]["start_line"] == 1 and out["hits"][0]["end_line"] == 2
    # narrowed: the bridge offers no kb_search without the grant, and the host refuses it all the same
    await h.bind("test/kbprobe", {"via": "bridge"}, conversation_pattern="narrow", priority=6, apis=["state.read"])
    assert (await ask(h, "vehicle", conversation_id="narrow"))["error"] == "PERMISSION_DENIED"


async def test_a_run_searching_while_the_endpoint_fails_cannot_flood_the_hosts_log(
    host: HostHarness, embeddings: FakeEmbeddings, caplog: pytest.LogCaptureFixture
) -> None:
    """With the bot's embeddings endpoint failing, every KbSearch wrote a host warning with the endpoint's own words
    (kept out of the runner's answer): a runner searching in a loop wrote the log as fast as it liked. Those lines
    are now limited per kind, as refusals are; every answer still says the keyword pass answered alone."""
    import logging

    from agenthost.host.ops import logs

    h = host
    await use_endpoint(h, embeddings)
    await add(h, "ours.md", OURS)
    embeddings.fail_with = 503
    caplog.set_level(logging.WARNING, logger="agenthost.host.knowledge")
    await h.bind("test/kbprobe", {"times": 200}, conversation_pattern="loop", priority=5)
    found = await ask(h, "vehicle location", conversation_id="loop")
    assert found["keyword_only"] and "failed" in found["keyword_only_reason"], found
    lines = [r for r in caplog.records if r.name == "agenthost.host.knowledge"]
    assert 0 < len(lines) <= logs.REFUSALS_PER_WINDOW + 1, f"{len(lines)} host log lines for 200 searches"
