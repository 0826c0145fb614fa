"""B7 #16: a graceful host stop while a run is writing through the run API: the stop is bounded, the run ends as
interrupted, and every write the runner saw acknowledged is in the database afterwards."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(60)


class Writer(Runner):
    manifest = RunnerManifest(name="writer")
    acked: list[int] = []
    started: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        i = 0
        Writer.started.set()
        try:
            while True:
                await run.api.state_set("conversation", "counter", i)
                Writer.acked.append(i)
                i += 1
        except errors.AgentHostError:
            pass  # the host went away under us: expected
        yield events.text(f"stopped at {i}")


async def test_graceful_stop_with_writes_in_flight(tmp_path):
    Writer.acked = []
    Writer.started = asyncio.Event()
    h = HostHarness(tmp_path, runners=[Writer])
    await h.__aenter__()
    send = asyncio.create_task(h.send("go"))
    await asyncio.wait_for(Writer.started.wait(), 10)
    await asyncio.sleep(0.5)  # a few hundred acknowledged writes
    run_id = next(iter(h.host.runs._live))
    t0 = time.monotonic()
    await h.__aexit__(None, None, None)
    assert time.monotonic() - t0 < 10
    send.cancel()
    await asyncio.gather(send, return_exceptions=True)
    assert len(Writer.acked) > 10
    db = sqlite3.connect(h.host.data_dir / "agenthost.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        status = db.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
        assert status == "interrupted"
        (value,) = db.execute("SELECT value_json FROM state WHERE key = 'counter'").fetchone()
        assert json.loads(value) >= Writer.acked[-1], "an acknowledged write is missing after the stop"
    finally:
        db.close()
