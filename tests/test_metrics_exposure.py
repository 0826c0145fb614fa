"""The metrics endpoint has no authentication (any local process that can reach its port reads it), so what it
says must identify nobody: after runs of a named bot, in named conversations, by a named person, with a failing
runner's own error text, the page names none of them — only the host's aggregates by runner, plugin and method."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness
from tests.test_observability import Leaky, _scrape

pytestmark = pytest.mark.timeout(60)


async def test_the_metrics_page_names_no_bot_conversation_person_or_text(tmp_path: Path) -> None:
    bot = "alice-private-bot"
    options = {"log_level": logging.INFO, "metrics_address": "127.0.0.1:0"}
    async with HostHarness(tmp_path, runners=[Leaky], bot=bot, host_options=options) as h:
        actor = pb.Actor(actor_type="user", actor_id="tg-user-424242", display_name="Alice Example")
        runs = []
        for conversation, text in (("tg:dm:alice", "my diagnosis is private"), ("tg:dm:bob", "fail")):
            request = hpb.SendMessageRequest(bot=bot, conversation_id=conversation, text=text, actor=actor)
            replies = [reply async for reply in h.client.stream(request)]
            assert replies[-1].WhichOneof("kind") == "run_finished"
            runs.append(replies[-1].run_finished)
        assert {r.status for r in runs} == {"completed", "failed"}
        assert h.host.metrics_server is not None
        _, body = await _scrape(h.host.metrics_server.port)
    bot_id = runs[0].bot_id
    assert 'agenthost_runs_total{runner="test/leaky",status="failed"} 1' in body  # the page is the real one
    for private in (bot, bot_id, "tg:dm", "alice", "bob", "424242", "Alice", "diagnosis", "failing with"):
        assert private not in body, private
    for r in runs:
        assert r.run_id not in body
