"""agenthost's run-scoped API and event streaming side by side with bare grpc.aio and LangBot's plugin transport.

    python benchmarks/bench_peer.py [--calls 1000] [--deltas 20000] [--rounds 3] [--backends sqlite,postgresql]

Needs `pip install langbot-plugin==0.7.18` (benchmark-only). Every variant is a separate server process and this
script is the client; all timing happens here around the awaited client call, interleaved in rounds so the
machine's drift hits every variant alike.

  agenthost      `agenthost serve` + the faulty test plugin. A run is parked ("park") so its token exists; this
                 script presents that run's token and plugin secret on the host's run-API socket, exactly the
                 metadata the runner process would send. Unary: StateGet (~1 KiB value), HistoryPage (50 items).
                 Streaming: SendMessage → runner streams deltas → host numbers, persists, projects → this client
                 (two hops, like LangBot's real path).
  agenthost PG   the same, the host's stores on PostgreSQL: a throwaway cluster this script starts (fsync and
                 synchronous commit on), reached over loopback TCP as a database on another machine is.
  raw grpc.aio   benchmarks/raw_server.py: the same protos answered from memory (no auth, no storage), one hop;
                 and for deltas also through raw_server.py --relay (two hops, nothing added): the baseline with
                 agenthost's own shape.
  LangBot 1 hop  langbot-plugin's own classes: this script spawns the peer with StdioClientController (how its
                 runtime spawns plugin workers); the peer serves with StdioServerController (the plugin worker's
                 path). Actions registered with Handler.action on an ActionType subclass, called with
                 Handler.call_action / call_action_generator. Both sides install
                 configure_bounded_default_executor_from_env, as LangBot's runtime and plugin worker do. Payloads
                 are the same content as JSON (the ~1 KiB value; the 50 items of agenthost's HistoryPage answer).
  LangBot 2 hops caller -stdio→ relay -stdio→ peer, the relay forwarding each action and re-yielding each item,
                 as LangBot's runtime does between LangBot and a plugin.

Prints p50/p99 per call, deltas/s per stream, and ratios (LangBot cost / agenthost cost; agenthost / raw).
Deltas are compared like with like: agenthost and raw gRPC at the same deltas per message (1, 16, 64); LangBot's
transport sends one item per message, so it is compared with agenthost at one per message. What batching adds on
top of that is printed on its own line, labelled as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VALUE = "v" * 1000
DELTA = "x" * 48 + " \n"
BATCHES = (1, 16, 64)  # deltas per gRPC message, the same on every gRPC side


# ---------------------------------------------------------------- LangBot side (peer and relay processes)


def _langbot():  # noqa: ANN202
    """Imports langbot-plugin's transport; raises ImportError with the install hint."""
    # Its stdio connection logs every pipe closed at teardown as an error; a benchmark's peers exit on purpose.
    logging.getLogger("langbot_plugin.runtime.io.connections.stdio").setLevel(logging.CRITICAL)
    try:
        from langbot_plugin.entities.io.actions.enums import ActionType
        from langbot_plugin.entities.io.resp import ActionResponse
        from langbot_plugin.runtime.bounded_executor import configure_bounded_default_executor_from_env
        from langbot_plugin.runtime.io.controllers.stdio.client import StdioClientController
        from langbot_plugin.runtime.io.controllers.stdio.server import StdioServerController
        from langbot_plugin.runtime.io.handler import Handler
    except ImportError as exc:
        raise ImportError(f"langbot-plugin is not importable ({exc}); pip install langbot-plugin==0.7.18") from exc

    class PeerAction(ActionType):
        STATE_GET = "peerbench_state_get"
        HISTORY_PAGE = "peerbench_history_page"
        DELTAS = "peerbench_deltas"

    class PeerHandler(Handler):
        name = "PeerBenchHandler"

    return (
        PeerAction,
        PeerHandler,
        ActionResponse,
        configure_bounded_default_executor_from_env,
        StdioClientController,
        StdioServerController,
    )


def _storage_dir() -> str:
    return tempfile.mkdtemp(prefix="lbpeer-files-")


async def langbot_peer(history_json: str) -> None:
    """The plugin side: answers the three actions from memory."""
    PeerAction, PeerHandler, ActionResponse, configure, _, StdioServerController = _langbot()
    configure(thread_name_prefix="peerbench-plugin")
    history = json.loads(history_json)

    async def on_connection(connection: Any) -> None:
        handler = PeerHandler(connection, file_storage_dir=_storage_dir())

        @handler.action(PeerAction.STATE_GET)
        async def state_get(data: dict[str, Any]) -> Any:
            return ActionResponse.success({"found": True, "value_json": json.dumps(VALUE), "version": 1})

        @handler.action(PeerAction.HISTORY_PAGE)
        async def history_page(data: dict[str, Any]) -> Any:
            return ActionResponse.success(history)

        @handler.action(PeerAction.DELTAS)
        async def deltas(data: dict[str, Any]) -> Any:
            for _ in range(int(data["n"])):
                yield ActionResponse.success({"text": DELTA})

        await handler.run()

    await StdioServerController().run(on_connection)


async def langbot_relay(history_json_path: str) -> None:
    """The runtime in the middle: serves the caller over stdio, forwards every action to its own peer."""
    PeerAction, PeerHandler, ActionResponse, configure, StdioClientController, StdioServerController = _langbot()
    configure(thread_name_prefix="peerbench-runtime")
    upstream_ready = asyncio.Event()
    upstream: list[Any] = []

    async def on_peer(connection: Any) -> None:
        handler = PeerHandler(connection, file_storage_dir=_storage_dir())
        upstream.append(handler)
        upstream_ready.set()
        await handler.run()

    client = StdioClientController(
        sys.executable, [__file__, "--langbot-peer", history_json_path], env=dict(os.environ)
    )
    peer_task = asyncio.create_task(client.run(on_peer))
    await upstream_ready.wait()
    plugin = upstream[0]

    async def on_caller(connection: Any) -> None:
        handler = PeerHandler(connection, file_storage_dir=_storage_dir())

        @handler.action(PeerAction.STATE_GET)
        async def state_get(data: dict[str, Any]) -> Any:
            return ActionResponse.success(await plugin.call_action(PeerAction.STATE_GET, data))

        @handler.action(PeerAction.HISTORY_PAGE)
        async def history_page(data: dict[str, Any]) -> Any:
            return ActionResponse.success(await plugin.call_action(PeerAction.HISTORY_PAGE, data))

        @handler.action(PeerAction.DELTAS)
        async def deltas(data: dict[str, Any]) -> Any:
            async for item in plugin.call_action_generator(PeerAction.DELTAS, data, timeout=600):
                yield ActionResponse.success(item)

        await handler.run()

    try:
        await StdioServerController().run(on_caller)
    finally:
        peer_task.cancel()


class LangBotCaller:
    """The caller side (LangBot / its runtime): spawns `--langbot-peer` or `--langbot-relay` over stdio."""

    def __init__(self, mode: str, history_path: Path) -> None:
        self.mode, self.history_path = mode, history_path
        self.handler: Any = None
        self._done = asyncio.Event()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.PeerAction, PeerHandler, _, configure, StdioClientController, _ = _langbot()
        try:
            configure(thread_name_prefix="peerbench-caller")
        except RuntimeError:
            pass  # configured by the first caller of this process already

        async def on_connection(connection: Any) -> None:
            self.handler = PeerHandler(connection, file_storage_dir=_storage_dir())
            run = asyncio.create_task(self.handler.run())
            self._ready.set()
            await self._done.wait()
            run.cancel()

        client = StdioClientController(
            sys.executable, [__file__, self.mode, str(self.history_path)], env=dict(os.environ)
        )
        self._task = asyncio.create_task(client.run(on_connection))
        await asyncio.wait_for(self._ready.wait(), 30)
        await self.state_get()  # the first call also proves the peer is up

    async def state_get(self) -> Any:
        return await self.handler.call_action(self.PeerAction.STATE_GET, {"scope": "conversation", "key": "blob"})

    async def history_page(self) -> Any:
        return await self.handler.call_action(self.PeerAction.HISTORY_PAGE, {"limit": 50})

    async def deltas(self, n: int) -> int:
        got = 0
        async for _ in self.handler.call_action_generator(self.PeerAction.DELTAS, {"n": n}, timeout=600):
            got += 1
        return got

    async def close(self) -> None:
        self._done.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 15)
            except (TimeoutError, Exception):  # noqa: BLE001 - best effort teardown of a benchmark peer
                self._task.cancel()


# ---------------------------------------------------------------- agenthost and raw gRPC sides


class AgentHostSide:
    """`database`: a PostgreSQL DSN for the host's stores; empty, the SQLite file in its data dir."""

    def __init__(self, work: Path, tag: str = "sqlite", database: str = "") -> None:
        self.home, self.leak = work / f"home-{tag}", work / f"leak-{tag}"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AGENTHOST_TEST", "ANTHROPIC", "OPENAI", "AGENTHOST_DATABASE"))
        }
        self.env["AGENTHOST_HOME"] = str(self.home)
        self.env["AGENTHOST_TEST_LEAK_DIR"] = str(self.leak)
        self.env["AGENTHOST_SANDBOX_RW"] = str(self.leak)
        if database:
            self.env["AGENTHOST_DATABASE_URL"] = database
        self.leak.mkdir()
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        import grpc

        from agenthost.host.api.client import HostClient
        from agenthost.protos import common_pb2 as pb
        from agenthost.protos import host_pb2 as hpb
        from agenthost.protos import run_api_pb2 as api
        from agenthost.protos import run_api_pb2_grpc
        from agenthost.protos.wire import CHANNEL_OPTIONS

        self.hpb, self.api = hpb, api
        self.proc = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "agenthost.host.cli", "serve"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host_json = self.home / "host.json"
        for _ in range(300):
            if host_json.exists():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        self.client = HostClient.for_data_dir(host_json.parent, timeout=600)
        await self.client.call(
            "InstallPlugin",
            hpb.InstallPluginRequest(source=str(ROOT / "tests" / "fixtures" / "faulty-plugin"), offline=True),
        )
        await self.client.call("CreateBot", hpb.CreateBotRequest(name="peer"))
        await self.client.bind("peer", "agenthost-faulty/faulty", timeout_seconds=3600)
        for i in range(30):  # 60 transcript items, so a page of 50 is full
            await self.client.send("peer", f"seed {i}", conversation_id="peer")
        for stale in self.leak.glob("run_*.json"):  # every seed run left its record
            stale.unlink()
        self.parked = asyncio.create_task(self.client.send("peer", "park", conversation_id="peer"))
        for _ in range(300):
            found = list(self.leak.glob("run_*.json"))
            if found:
                break
            await asyncio.sleep(0.05)
        record = json.loads(found[0].read_text())
        self.run_id = record["run_id"]
        self.md = (("authorization", f"Bearer {record['token']}"), ("x-agenthost-plugin", record["secret"]))
        info = json.loads(host_json.read_text())
        self.channel = grpc.aio.insecure_channel(info["api"], options=CHANNEL_OPTIONS)
        self.stub = run_api_pb2_grpc.AgentRunAPIProxyStub(self.channel)
        await self.stub.StateSet(
            api.StateSetRequest(run_id=self.run_id, scope=pb.CONVERSATION, key="blob", value_json=json.dumps(VALUE)),
            metadata=self.md,
            timeout=10,
        )
        self.get_req = api.StateGetRequest(run_id=self.run_id, scope=pb.CONVERSATION, key="blob")
        self.page_req = api.HistoryPageRequest(run_id=self.run_id, limit=50)
        page = await self.history_page()
        assert len(page.items) == 50, len(page.items)
        self.history_dict = _history_as_json(page)

    async def state_get(self) -> Any:
        return await self.stub.StateGet(self.get_req, metadata=self.md, timeout=10)

    async def history_page(self) -> Any:
        return await self.stub.HistoryPage(self.page_req, metadata=self.md, timeout=10)

    async def deltas(self, n: int, batch: int) -> int:
        got = 0
        status = ""
        req = self.hpb.SendMessageRequest(bot="peer", text=f"deltas {n} {batch}", conversation_id="deltas")
        async for reply in self.client.stream(req, timeout=600):
            kind = reply.WhichOneof("kind")
            if kind == "events":
                got += sum(1 for e in reply.events.events if e.WhichOneof("kind") == "text_delta")
            elif kind == "run_finished":
                status = reply.run_finished.status
        assert status == "completed", status
        return got

    async def close(self) -> None:
        if self.proc is None:
            return
        with _suppress():
            await self.channel.close()
            await self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class RawSide:
    """The one-hop raw server; with `relay_to` (another RawSide's address), a relay in front of it (two hops)."""

    def __init__(self, work: Path, name: str = "raw", relay_to: str = "") -> None:
        self.address = f"unix:{work / (name + '.sock')}"
        self.relay_to = relay_to
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        import grpc

        from agenthost.protos import run_api_pb2 as api
        from agenthost.protos import run_api_pb2_grpc, runner_pb2, runner_pb2_grpc
        from agenthost.protos.wire import CHANNEL_OPTIONS

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        relay = ["--relay", self.relay_to] if self.relay_to else []
        self.proc = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, str(ROOT / "benchmarks" / "raw_server.py"), self.address, *relay],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert self.proc.stdout.readline().strip() == b"ready"
        self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self.stub = run_api_pb2_grpc.AgentRunAPIProxyStub(self.channel)
        self.runner = runner_pb2_grpc.RunnerStub(self.channel)
        self.runner_pb2 = runner_pb2
        self.get_req = api.StateGetRequest(run_id="run_x", key="blob")
        self.page_req = api.HistoryPageRequest(run_id="run_x", limit=50)

    async def state_get(self) -> Any:
        return await self.stub.StateGet(self.get_req, timeout=10)

    async def history_page(self) -> Any:
        return await self.stub.HistoryPage(self.page_req, timeout=10)

    async def deltas(self, n: int, batch: int) -> int:
        rp = self.runner_pb2
        req = rp.RunRequest(context=rp.AgentRunContext(input=rp.RunInput(text=f"deltas {n} {batch}")))
        got = 0
        async for b in self.runner.Run(req, timeout=600):
            got += len(b.events)
        return got

    async def close(self) -> None:
        if self.proc is not None:
            with _suppress():
                await self.channel.close()
            self.proc.terminate()
            self.proc.wait(10)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _history_as_json(page: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(page, preserving_proto_field_name=True)


# ---------------------------------------------------------------- measurement


def pct(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s) * 1e6, s[max(0, int(len(s) * 0.99) - 1)] * 1e6


async def timed(call: Any, n: int, out: list[float]) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t0)


PG = "agenthost PG"  # the same host with its stores on PostgreSQL


async def main(args: argparse.Namespace) -> int:
    backends = args.backends.split(",")
    if "postgresql" not in backends:
        return await compare(args, backends, "")
    from tests.pg_cluster import bench_database

    with bench_database() as dsn:
        return await compare(args, backends, dsn)


async def compare(args: argparse.Namespace, backends: list[str], dsn: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="ahpeer-"))
    sides: dict[str, Any] = {}
    hosts: dict[str, AgentHostSide] = {}
    langbot_error = ""
    try:
        if "sqlite" in backends:
            hosts["agenthost"] = AgentHostSide(work)
        if "postgresql" in backends:
            hosts[PG] = AgentHostSide(work, "postgresql", dsn)
        raw = RawSide(work)
        relay = RawSide(work, "relay", relay_to=raw.address)
        for host in hosts.values():
            await host.start()
        await raw.start()
        await relay.start()
        sides = {**hosts, "raw grpc.aio": raw, "raw 2 hops": relay}
        history_path = work / "history.json"
        history_path.write_text(json.dumps(next(iter(hosts.values())).history_dict))
        try:
            for label, mode in (("LangBot 1 hop", "--langbot-peer"), ("LangBot 2 hops", "--langbot-relay")):
                caller = LangBotCaller(mode, history_path)
                await caller.start()
                sides[label] = caller
        except Exception as exc:  # noqa: BLE001 - reported, and the rest still runs
            langbot_error = f"{type(exc).__name__}: {exc}"
            print(f"LangBot variants skipped: {langbot_error}")
        names = list(sides)
        streams: dict[tuple[str, str], list[float]] = {}
        unary_names = [n for n in names if n != "raw 2 hops"]  # the relay forwards only Run
        unary = {(n, c): [] for n in unary_names for c in ("state_get", "history_page")}
        for name in unary_names:  # warm up
            await timed(sides[name].state_get, 50, [])
            await timed(sides[name].history_page, 50, [])
        for r in range(args.rounds):
            for name in unary_names:
                for c in ("state_get", "history_page"):
                    await timed(getattr(sides[name], c), args.calls, unary[(name, c)])
            for name in names:
                side = sides[name]
                if name.startswith("LangBot"):
                    n = args.langbot_deltas
                    t0 = time.perf_counter()
                    got = await side.deltas(n)
                    streams.setdefault((name, "1 per message"), []).append(got / (time.perf_counter() - t0))
                    assert got == n, (name, got)
                    continue
                for batch in BATCHES:
                    label = f"{batch} per message"
                    n = args.deltas if batch > 1 else max(2000, args.deltas // 10)
                    t0 = time.perf_counter()
                    got = await side.deltas(n, batch)
                    streams.setdefault((name, label), []).append(got / (time.perf_counter() - t0))
                    assert got == n, (name, label, got)
            print(f"round {r + 1}/{args.rounds} done", flush=True)

        n_calls = args.calls * args.rounds
        print(f"\n== unary calls, client process -> server process over its own transport; {n_calls} each ==")
        print(f"{'variant':16} {'StateGet p50':>13} {'p99':>8} {'HistoryPage50 p50':>18} {'p99':>8}   µs")
        fig: dict[tuple[str, str], tuple[float, float]] = {}
        for name in unary_names:
            a = fig[(name, "state_get")] = pct(unary[(name, "state_get")])
            b = fig[(name, "history_page")] = pct(unary[(name, "history_page")])
            print(f"{name:16} {a[0]:13.0f} {a[1]:8.0f} {b[0]:18.0f} {b[1]:8.0f}")
        print("\n== text deltas, ~50 B each, deltas/s (median of rounds) ==")
        rates = {k: statistics.median(v) for k, v in streams.items()}
        for (name, label), rate in rates.items():
            print(f"{name:16} {label:18} {rate:12.0f}")

        print("\n== ratios ==")
        for ah in hosts:
            for c in ("state_get", "history_page"):
                print(
                    f"{c:13} {ah} / raw grpc.aio p50: {fig[(ah, c)][0] / fig[('raw grpc.aio', c)][0]:.2f}x"
                    f"  ({fig[(ah, c)][0] - fig[('raw grpc.aio', c)][0]:+.0f} µs)"
                )
                for lb in ("LangBot 1 hop", "LangBot 2 hops"):
                    if (lb, c) in fig:
                        print(f"{'':13} {lb} / {ah} p50: {fig[(lb, c)][0] / fig[(ah, c)][0]:.2f}x slower")
            for batch in BATCHES:
                label = f"{batch} per message"
                ah_rate = rates[(ah, label)]
                print(
                    f"deltas, {label:>15}: {ah} (2 hops, persisted) / raw 1 hop: "
                    f"{ah_rate / rates[('raw grpc.aio', label)]:.2f}x;"
                    f"  / raw 2 hops: {ah_rate / rates[('raw 2 hops', label)]:.2f}x"
                )
        if PG in hosts:
            for c in ("state_get", "history_page"):
                over = fig[(PG, c)][0] - fig[("raw grpc.aio", c)][0]
                verdict = "met" if over <= 500 else "missed"
                print(f"target, PostgreSQL {c} p50 within raw + 500 µs: {over:+.0f} ({verdict})")
        if PG in hosts and "agenthost" in hosts:
            ratio = rates[(PG, "64 per message")] / rates[("agenthost", "64 per message")]
            print(
                f"target, PostgreSQL / SQLite deltas persisted at 64 per message >= 0.5x: {ratio:.2f}x"
                f" ({'met' if ratio >= 0.5 else 'missed'})"
            )
        ah = next(iter(hosts))
        one = rates[(ah, "1 per message")]
        for lb in ("LangBot 1 hop", "LangBot 2 hops"):
            if (lb, "1 per message") in rates:
                lb_rate = rates[(lb, "1 per message")]
                print(f"deltas, 1 per message on both sides: agenthost / {lb}: {one / lb_rate:.1f}x")
                for batch in BATCHES[1:]:
                    batched = rates[(ah, f"{batch} per message")]
                    print(
                        f"        with batching on top (agenthost @{batch}; LangBot's transport has none): "
                        f"{batched / lb_rate:.1f}x"
                    )
        if langbot_error:
            print(f"\nLangBot could not be driven: {langbot_error}")
        return 0
    finally:
        for side in sides.values():
            with _suppress():
                await side.close()
        for host in hosts.values():
            if host not in sides.values():
                with _suppress():
                    await host.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--langbot-peer":
        asyncio.run(langbot_peer(Path(sys.argv[2]).read_text()))
        sys.exit(0)
    if len(sys.argv) >= 2 and sys.argv[1] == "--langbot-relay":
        asyncio.run(langbot_relay(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--deltas", type=int, default=20000)
    parser.add_argument("--langbot-deltas", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--backends",
        default="sqlite,postgresql",
        help="agenthost's stores, comma-separated: sqlite, postgresql (a throwaway cluster, fsync on, loopback TCP)",
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
