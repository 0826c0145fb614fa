"""The runner side of benchmarks/bench_host.py. Commands (the message text):

api <raw address> <n>   time n StateGet (~1 KiB) and n HistoryPage(50) calls against the host and against the
                        raw grpc.aio baseline server; reply with the samples' percentiles as JSON
deltas <n> <batch>      stream n ~50-byte text deltas, at most <batch> per gRPC message, yielded as `str`
delta-events <n> <b>    the same, yielded as RunEvent objects (events.text)
"""

from __future__ import annotations

import json
import statistics
import time

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events, hookimpl
from agenthost.runners.sdk import server as sdk_server

DELTA = "x" * 48 + " \n"


def _stats(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {"p50_us": statistics.median(samples) * 1e6, "p99_us": samples[int(len(samples) * 0.99) - 1] * 1e6}


class Bench(Runner):
    manifest = RunnerManifest(name="bench", description="benchmark helper")

    async def run(self, run: RunContext):
        command, *args = run.text.split()
        if command == "api":
            address, n = args[0], int(args[1])
            await run.api.state_set("conversation", "blob", "v" * 1000)
            raw = grpc.aio.insecure_channel(address, options=sdk_server.CHANNEL_OPTIONS)
            raw_stub = run_api_pb2_grpc.AgentRunAPIProxyStub(raw)
            get = api.StateGetRequest(run_id=run.run_id, scope=pb.CONVERSATION, key="blob")
            page = api.HistoryPageRequest(run_id=run.run_id, limit=50)
            results: dict[str, dict[str, float]] = {}
            cases = {
                "state_get/host": lambda: run.api.state_get_versioned("conversation", "blob"),
                "state_get/raw": lambda: raw_stub.StateGet(get, timeout=10),
                "history_page50/host": lambda: run.api.history_page(limit=50),
                "history_page50/raw": lambda: raw_stub.HistoryPage(page, timeout=10),
            }
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for call in cases.values():  # warm up
                for _ in range(50):
                    await call()
            for _ in range(n // 100):  # interleave in rounds so drift hits both sides alike
                for name, call in cases.items():
                    for _ in range(100):
                        t0 = time.perf_counter()
                        await call()
                        samples[name].append(time.perf_counter() - t0)
            for name, s in samples.items():
                results[name] = _stats(s)
            await raw.close()
            yield events.message(json.dumps(results))
        elif command in ("deltas", "delta-events"):
            n, batch = int(args[0]), int(args[1])
            sdk_server.MAX_BATCH = batch
            if command == "deltas":
                for _ in range(n):
                    yield DELTA  # a str is a text delta: the SDK's fast path for streamed text
            else:
                for _ in range(n):
                    yield events.text(DELTA)  # the same deltas as RunEvent objects
        else:
            yield events.text("ok")


@hookimpl
def agenthost_register_runners(register):  # noqa: ANN001
    register(Bench)
