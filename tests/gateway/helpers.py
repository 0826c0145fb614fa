"""The gateway tests' world: an in-process runner that streams deltas and reports usage,
a "send" credential for one bot, and a second bot that key may not use."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

DELTAS = ("Hel", "lo", " world")
USAGE = {"input_tokens": 11, "output_tokens": 3, "cache_read_tokens": 4}


class Talker(Runner):
    """Streams DELTAS and USAGE. Message text steers it: "fail" fails the run, "hold" parks after the first delta
    until the test opens `release`, "flood N" streams N deltas of 4 KiB; "remember X" keeps X in the actor's state
    (the sender's personal memory) and "recall" answers with it. Every run it sees is recorded."""

    manifest = RunnerManifest(name="talker")
    seen: list[tuple[str, str, int]] = []  # (conversation, text, transcript items the host reports)
    release: asyncio.Event
    holding: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        Talker.seen.append((run.conversation_id, run.text, run.context.context.transcript_count))
        if run.text.startswith(("remember ", "recall")):
            if run.text.startswith("remember "):
                await run.api.state_set("actor", "note", run.text.removeprefix("remember "))
            yield events.text(f"note: {await run.api.state_get('actor', 'note', '')}")
            yield events.completed()
            return
        if run.text == "fail":
            yield events.text("partial")
            yield events.failed("boom", "the runner broke")
            return
        if run.text.startswith("flood"):
            for _ in range(int(run.text.split()[1])):
                yield events.text("x" * 4096)
            yield events.completed()
            return
        yield events.text(DELTAS[0])
        if run.text == "hold":
            Talker.holding.set()
            await Talker.release.wait()
        for delta in DELTAS[1:]:
            yield events.text(delta)
        yield events.usage(**USAGE, model="fake-model")
        yield events.completed()


@dataclass
class World:
    harness: HostHarness
    key: str  # a send credential for `testbot` only
    admin: str
    base_url: str

    @property
    def host(self):  # type: ignore[no-untyped-def]
        return self.harness.host

    def runs(self, bot: str = "testbot") -> list[hpb.RunInfo]:
        bot_id = self.host.registry.bot(bot).bot_id
        return self.host.run_store.list(bot_id=bot_id, conversation_id="", status="", limit=1000)

    async def wait_finished(self, run_id: str, timeout: float = 20.0) -> hpb.RunInfo:
        """Until the run's outcome is recorded (a bounded wait on the run store, not a tuned sleep)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.host.run_store.get(run_id)
            if info is not None and info.status not in ("queued", "running"):
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} did not finish within {timeout}s: {info}")
            await asyncio.sleep(0.02)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Until `predicate()` holds: a bounded wait on a condition, not a tuned sleep."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)
