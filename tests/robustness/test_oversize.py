"""B7 #10: oversized messages both ways. A runner whose event exceeds the 8 MiB cap gets a clear failure; pages
of long items are cut by bytes (has_more + cursor) instead of becoming a response gRPC refuses to send; the
host stays healthy and the next call on the same channel works."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agenthost.host.store.conversations import MAX_PAGE_BYTES
from agenthost.protos import common_pb2 as pb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(90)
MiB = 1024 * 1024


class Big(Runner):
    manifest = RunnerManifest(name="big")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        if run.text == "long":
            yield events.message("m" * (3 * MiB))
        elif run.text == "oversize":
            yield events.text("h" * (9 * MiB))
        elif run.text == "walk":
            seen, cursor, pages = 0, "", 0
            while True:
                page = await run.api.history_page(limit=50, cursor=cursor)
                pages += 1
                seen += len(page.items)
                if not page.has_more:
                    break
                cursor = page.next_cursor
            yield events.text(f"{seen} {pages}")
        else:
            yield events.text("ok")


async def test_oversize_both_ways(tmp_path):
    async with HostHarness(tmp_path, runners=[Big]) as h:
        for _ in range(5):
            assert (await h.send("long")).run.status == "completed"
        walked = await h.send("walk")
        assert walked.run.status == "completed", walked.run.error_message
        seen, pages = (int(x) for x in walked.text.split())
        assert seen == 11  # 5 x (user + 3 MiB assistant) + this run's user item
        assert pages >= 4  # never more than MAX_PAGE_BYTES of text per page
        assert MAX_PAGE_BYTES < 8 * MiB
        # runner -> host: one event over the cap fails the run with a clear reason; the host keeps serving
        over = await h.send("oversize")
        assert over.run.status == "failed" and "RESOURCE_EXHAUSTED" in over.run.error_message
        assert (await h.send("fine")).text == "ok"
