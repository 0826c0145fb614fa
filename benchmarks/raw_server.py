"""The raw grpc.aio baseline for bench_host.py: the same protos served from memory, with no auth, no audit and no
storage. `python benchmarks/raw_server.py unix:/path.sock` serves until killed."""

from __future__ import annotations

import asyncio
import sys

import grpc

from agenthost.protos import common_pb2 as pb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos import run_api_pb2_grpc, runner_pb2_grpc
from agenthost.runners.sdk.server import CHANNEL_OPTIONS

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
    async def Run(self, request, context):
        n, batch = (int(x) for x in request.context.input.text.split()[1:3])
        sent = 0
        while sent < n:
            k = min(batch, n - sent)
            yield pb.RunEventBatch(events=[pb.RunEvent(text_delta=pb.TextDelta(text=DELTA)) for _ in range(k)])
            sent += k


async def main(address: str) -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    run_api_pb2_grpc.add_AgentRunAPIProxyServicer_to_server(RawAPI(), server)
    runner_pb2_grpc.add_RunnerServicer_to_server(RawRunner(), server)
    server.add_insecure_port(address)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
