"""The metrics endpoint has no authentication (any local process that can reach its port reads it), so what it
says must identify nobody: after runs of a named bot, in named conversations, by a named person, with a failing
runner's own error text, the page names none of them — only the host's aggregates by runner, plugin and method."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agenthost.host import limits
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness
from tests.gateway.helpers import until
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


async def test_a_flood_of_connections_from_one_address_leaves_the_scraper_a_way_in(tmp_path: Path) -> None:
    """Anyone who reaches the port (another local user) held every one of its 64 connections with silent sockets,
    and the scraper's connection was closed unanswered. On the shared capped listener one address holds at most
    METRICS_MAX_CONNECTIONS_PER_ADDRESS (the rest answered 429 and closed at once), a silent one is closed after
    the request-head timeout, and a scrape from another address is answered meanwhile."""
    options = {"log_level": logging.INFO, "metrics_address": "127.0.0.1:0"}
    async with HostHarness(tmp_path, runners=[Leaky], host_options=options) as h:
        assert h.host.metrics_server is not None
        port = h.host.metrics_server.port
        flood = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)) for _ in range(100)]
        try:
            ends = [asyncio.ensure_future(reader.read()) for reader, _ in flood]
            refused_at_least = 100 - limits.METRICS_MAX_CONNECTIONS_PER_ADDRESS
            await until(lambda: sum(e.done() for e in ends) >= refused_at_least, "the flood past its cap was refused")
            refused = [e.result() for e in ends if e.done()]
            assert all(b.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in b for b in refused), refused[:1]
            assert b"METRICS_MAX_CONNECTIONS_PER_ADDRESS = 8" in refused[0], refused[0]
            status, body = await _scrape(port)
            assert status == "HTTP/1.1 200 OK" and "agenthost_runs_live 0" in body, (status, body[:200])
            # The silent ones the cap let in are closed once the request-head timeout passes.
            await until(lambda: all(e.done() for e in ends), "the silent connections were closed", timeout=60)
        finally:
            for _, writer in flood:
                writer.close()
