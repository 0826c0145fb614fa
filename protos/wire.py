"""The wire contract beyond the .proto files: what both ends of every connection must agree on. The host, the
runner SDK and clients import these from here, so neither side reaches into the other for them.
"""

from __future__ import annotations

from importlib import metadata

from agenthost.protos import common_pb2 as pb

# The version of agenthost, as installed (pyproject.toml is the one place it is written).
try:
    VERSION = metadata.version("agenthost")
except metadata.PackageNotFoundError:  # running from a tree that was never installed
    VERSION = "0+unknown"

# A runner process announces itself on stdout with `AGENTHOST|<PROTOCOL_VERSION>|<address>`.
PROTOCOL_VERSION = 1
HANDSHAKE_PREFIX = "AGENTHOST"

# Symmetric on every channel and server: a message either side may send, the other may receive.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# A runner's event batch is cut at this many events and bytes: two 5 MiB tool results must travel as two
# messages, and the host re-sends batches to its clients with a few bytes more per event (seq, time).
MAX_BATCH = 64
MAX_BATCH_BYTES = 4 * 1024 * 1024
# The largest single event a runner may emit: it must fit one message on both hops with room for the envelope.
# A larger one ends the run with `event_too_large` rather than being cut: silently shortening a tool result or a
# message would hand the model and the transcript something the runner never said (the local agent bounds its
# tool results long before this).
MAX_EVENT_BYTES = MAX_MESSAGE_BYTES - 64 * 1024

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
# grpc-core cancels (CANCELLED, no details) calls that arrive while more than `max_pending_requests` (default
# 1000) are waiting for the asyncio server to pick them up: a burst of ~1000 runs starting at once did that.
# Servers (host and runner) allow as many pending calls as the host allows concurrent ones.
MAX_PENDING_CALLS = 4096
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
    # A connection that finishes no handshake, or carries no call for five minutes, is closed: idle local
    # connections must not pile up until the process runs out of descriptors. Clients reconnect on their next
    # call without noticing (the host's channels to runners and the runners' channels to the host alike).
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 5 * 60 * 1000),
]

# State scope names and their wire values; the one table the SDK, the host's grants and the CLI share.
STATE_SCOPES: dict[str, int] = {
    "run": pb.RUN,
    "conversation": pb.CONVERSATION,
    "actor": pb.ACTOR,
    "binding": pb.BINDING,
    "runner": pb.RUNNER,
}
