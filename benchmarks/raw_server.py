"""The raw grpc.aio baselines for bench_host.py and bench_peer.py: the same protos served from memory, with no auth,
no audit and no storage.

    python benchmarks/raw_server.py unix:/path.sock                          one hop: serves the deltas itself
    python benchmarks/raw_server.py unix:/relay.sock --relay unix:/path.sock  two hops: forwards every batch it reads
                                                                             from the one-hop server, as they arrive

The relay is the raw counterpart of agenthost's own path (runner process → host process → client), so a delta
figure can be set against a baseline with the same number of processes and hops. Serves until killed.

    --tls-server KEY,CRT,CA   listen with mutual TLS (a client certificate signed by CA required), as the host's
                              workers port does (bench_workers.py passes the host's own hub key and CA)
    --tls-client KEY,CRT,CA   the relay dials its upstream with these client credentials (a worker's)
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import grpc

from agenthost.host.access.worker_pki import HUB_SERVER_NAME
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

    def __init__(self, upstream: str, tls_client: str | None = None) -> None:
        if tls_client:
            self.channel = grpc.aio.secure_channel(
                upstream, client_credentials(tls_client), options=[*CHANNEL_OPTIONS, *TLS_TARGET]
            )
        else:
            self.channel = grpc.aio.insecure_channel(upstream, options=CHANNEL_OPTIONS)
        self.stub = runner_pb2_grpc.RunnerStub(self.channel)

    async def Run(self, request, context):
        async for batch in self.stub.Run(request):
            yield batch


def _read(triple: str) -> tuple[bytes, bytes, bytes]:
    key, crt, ca = (Path(p).read_bytes() for p in triple.split(","))
    return key, crt, ca


def client_credentials(triple: str) -> grpc.ChannelCredentials:
    key, crt, ca = _read(triple)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=crt)


# The name in the host's workers-port certificate, as a worker checks it (agenthost.host.workers.agent).
TLS_TARGET = [("grpc.ssl_target_name_override", HUB_SERVER_NAME)]


async def main(address: str, relay: str | None, tls_server: str | None = None, tls_client: str | None = None) -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    if relay:
        runner_pb2_grpc.add_RunnerServicer_to_server(RawRelay(relay, tls_client), server)
    else:
        run_api_pb2_grpc.add_AgentRunAPIProxyServicer_to_server(RawAPI(), server)
        runner_pb2_grpc.add_RunnerServicer_to_server(RawRunner(), server)
    if tls_server:
        key, crt, ca = _read(tls_server)
        creds = grpc.ssl_server_credentials([(key, crt)], root_certificates=ca, require_client_auth=True)
        server.add_secure_port(address, creds)
    else:
        server.add_insecure_port(address)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--relay", metavar="UPSTREAM", help="serve as a relay in front of this one-hop server")
    parser.add_argument("--tls-server", metavar="KEY,CRT,CA")
    parser.add_argument("--tls-client", metavar="KEY,CRT,CA")
    args = parser.parse_args()
    asyncio.run(main(args.address, args.relay, args.tls_server, args.tls_client))
