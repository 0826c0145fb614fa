"""The raw grpc.aio baselines for bench_host.py and bench_peer.py: the same protos served from memory, with no auth,
no audit and no storage.

    python benchmarks/raw_server.py unix:/path.sock                          one hop: serves the deltas itself
    python benchmarks/raw_server.py unix:/relay.sock --relay unix:/path.sock  two hops: forwards every batch it reads
                                                                             from the one-hop server, as they arrive

The relay is the raw counterpart of agenthost's own path (runner process → host process → client), so a delta
figure can be set against a baseline with the same number of processes and hops. Serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc, runner_pb2_grpc
from agenthost.protos.wire import CHANNEL_OPTIONS

ITEM = pb.TranscriptItem(
    item_id="it_" + "0" * 32,
    conversation_id="default",
    role="user",
    item_type="message",
    text="y" * 60,
    cursor="MTIzLmFiY2RlZjAxMjM0NTY3ODk",
    seq=123,
)
DELTA = "x" * 48 + " \n"


class RawAPI(run_api_pb2_grpc.AgentRunAPIProxyServicer):
    async def StateGet(self, request, context):
        return api.StateValue(found=True, value_json='"' + "v" * 1000 + '"', version=1)

    async def HistoryPage(self, request, context):
        return api.HistoryPageResponse(items=[ITEM] * 50, next_cursor="abc", has_more=True)


class RawRunner(runner_pb2_grpc.RunnerServicer):
    """`deltas <n> <batch>`: n text deltas, `batch` per message."""

    async def Run(self, request, context):
        n, batch = (int(x) for x in request.context.input.text.split()[1:3])
        sent = 0
        while sent < n:
            k = min(batch, n - sent)
            yield pb.RunEventBatch(events=[pb.RunEvent(text_delta=pb.TextDelta(text=DELTA)) for _ in range(k)])
            sent += k


class RawRelay(runner_pb2_grpc.RunnerServicer):
    """Forwards a Run to the upstream server and re-yields each batch: a second hop with nothing else added."""

    def __init__(self, upstream: str) -> None:
        self.channel = grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS)
        self.stub = runner_pb2_grpc.RunnerStub(self.channel)

    async def Run(self, request, context):
        async for batch in self.stub.Run(request):
            yield batch


async def main(address: str, relay: str | None) -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    if relay:
        runner_pb2_grpc.add_RunnerServicer_to_server(RawRelay(relay), server)
    else:
        run_api_pb2_grpc.add_AgentRunAPIProxyServicer_to_server(RawAPI(), server)
        runner_pb2_grpc.add_RunnerServicer_to_server(RawRunner(), server)
    server.add_insecure_port(address)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--relay", metavar="UPSTREAM", help="serve as a relay in front of this one-hop server")
    args = parser.parse_args()
    asyncio.run(main(args.address, args.relay))
