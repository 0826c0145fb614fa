"""The host's extra SendMessage requests (agenthost.protos.prefetch) at host stop: grpc-core holds pointers into
each outstanding request until it completes it, so a request freed under it crashes a later garbage collection
(a segfault, seen once when the extra requests were cancelled at stop). The stops run in a process of their own,
so that a crash is its exit status and not the test run's."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(400)]

STOPS = 12

_STOPPING = """
import asyncio, gc, sys
from pathlib import Path

from agenthost.runners.sdk import Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness


class Slow(Runner):
    manifest = RunnerManifest(name="slow")

    async def run(self, run):
        await asyncio.sleep(0.05)  # the runner's own pace: sends pile up in the queue meanwhile
        yield events.text("x")


async def one(h, i):
    try:
        await h.client.send(h.bot, f"m{i}", conversation_id=f"c{i}", timeout=120)
    except Exception:  # the host stopped under it: any answer will do, a crash will not
        pass


async def main(root, stops):
    taken = 0
    for n in range(stops):
        async with HostHarness(root / str(n), runners=[Slow]) as h:
            assert h.host.prefetch is not None, "grpc's private API is not the one prefetch knows"
            sends = [asyncio.ensure_future(one(h, i)) for i in range(400)]
            # Stop while the burst is being taken up: some sends answered, most still arriving.
            await asyncio.wait(sends, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            taken += h.host.prefetch.taken
        for s in sends:
            s.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        gc.collect()
    gc.collect()
    print(f"{stops} stops, {taken} sends taken up by the extra requests")


asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
"""


@pytest.mark.slow
def test_a_host_stopped_during_a_burst_of_sends_exits_cleanly_every_time(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _STOPPING, str(tmp_path), str(STOPS)], capture_output=True, text=True, timeout=360
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-4000:])
    stops, _, rest = proc.stdout.strip().partition(" stops, ")
    assert stops == str(STOPS), proc.stdout
    assert int(rest.split()[0]) > 0, proc.stdout  # the extra requests took part in the bursts
