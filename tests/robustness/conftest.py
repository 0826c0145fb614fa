"""Shared helpers for the robustness suite: a real host on its own event-loop thread, raw sync stubs, DB digests.

The host (stores, grants, run API, orchestration) runs in a background thread's event loop, so a test can drive
it with plain synchronous gRPC stubs — which is also what lets hypothesis (a sync library) fuzz it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2_grpc
from agenthost.protos.wire import CHANNEL_OPTIONS
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events
from agenthost.runners.sdk.testing import HostHarness

ROOT = Path(__file__).resolve().parents[2]
FAULTY = str(ROOT / "tests" / "fixtures" / "faulty-plugin")
SC = grpc.StatusCode


class Parked(Runner):
    """Parks each run until released, handing its RunContext to the test thread."""

    manifest = RunnerManifest(name="parked", permissions=RunnerPermissions(cross_conversation=True))
    live: asyncio.Queue[RunContext]
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await Parked.live.put(run)
        await Parked.release.wait()
        yield events.text("released")


class LoopThread:
    """An asyncio loop on a daemon thread; `call(coro)` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="robustness-host", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class World:
    """A real host with the Parked runner bound, two parked runs (conversations c1, c2) and a third, finished run."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lt = LoopThread()
        self.sends: list[asyncio.Future[Any]] = []

    def start(self) -> None:
        async def up() -> None:
            Parked.live = asyncio.Queue()
            Parked.release = asyncio.Event()
            self.h = HostHarness(self.tmp, runners=[Parked])
            await self.h.__aenter__()
            # a finished run first (its token is revoked), then two parked ones
            fin = asyncio.ensure_future(self.h.send("finished run", conversation_id="c0"))
            self.r0 = await asyncio.wait_for(Parked.live.get(), 10)
            Parked.release.set()
            self.r0_result = await fin
            Parked.release.clear()
            for c in ("c1", "c2"):
                self.sends.append(asyncio.ensure_future(self.h.send(f"hello from {c}", conversation_id=c)))
                run = await asyncio.wait_for(Parked.live.get(), 10)
                setattr(self, "r" + c[1], run)
            self.art2 = await self.r2.api.artifact_create(b"secret of c2", name="s.txt")
            self.art1 = await self.r1.api.artifact_create(b"mine" * 100, name="m.txt")
            await self.r1.api.state_set("conversation", "k", "original")
            await self.h.host.db.flush()

        self.lt.call(up())
        self.channel = grpc.insecure_channel(self.h.host.api_address, options=CHANNEL_OPTIONS)
        self.stub = run_api_pb2_grpc.AgentRunAPIProxyStub(self.channel)
        self.db_path = self.h.host.data_dir / "agenthost.db"

    def stop(self) -> None:
        async def down() -> None:
            Parked.release.set()
            await asyncio.wait_for(asyncio.gather(*self.sends, return_exceptions=True), 20)
            await self.h.__aexit__(None, None, None)

        try:
            self.channel.close()
            self.lt.call(down())
        finally:
            self.lt.close()

    def md(self, run: RunContext, token: str | None = None, secret: str | None = None) -> tuple[tuple[str, str], ...]:
        out = []
        if token != "":
            out.append(("authorization", f"Bearer {run.api.run_token if token is None else token}"))
        if secret != "":
            out.append(("x-agenthost-plugin", run.api.plugin_secret if secret is None else secret))
        return tuple(out)

    def flush_audit(self) -> list[sqlite3.Row]:
        async def go() -> list[sqlite3.Row]:
            self.h.host.audit.flush()
            await self.h.host.db.flush()
            return self.h.host.audit.rows()

        return self.lt.call(go())

    def host_serving(self) -> bool:
        from agenthost.protos import run_api_pb2 as api

        resp = self.stub.StateGet(
            api.StateGetRequest(run_id=self.r1.run_id, scope=pb.CONVERSATION, key="k"),
            metadata=self.md(self.r1),
            timeout=10,
        )
        return resp.found and resp.value_json == '"original"'


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    w = World(tmp_path_factory.mktemp("world"))
    w.start()
    yield w
    w.stop()


def status_of(fn: Callable[[], Any]) -> SC:
    try:
        result = fn()
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            for _ in result:  # drain server streams
                pass
    except grpc.RpcError as exc:
        return exc.code()
    return SC.OK


DATA_TABLES = ("events", "transcript", "runs", "run_events", "artifacts", "state", "bots", "bindings", "plugins")


def db_digest(path: Path, tables: tuple[str, ...] = DATA_TABLES) -> str:
    """A digest of every data table (the audit log excluded): equal digests mean nothing changed."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        for table in tables:
            for row in sorted(repr(r) for r in conn.execute(f"SELECT * FROM {table}")):
                h.update(row.encode())
        return h.hexdigest()
    finally:
        conn.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
