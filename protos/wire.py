"""The wire contract beyond the .proto files: what both ends of every connection must agree on. The host, the
runner SDK and clients import these from here, so neither side reaches into the other for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agenthost.protos import common_pb2 as pb

if TYPE_CHECKING:  # a runner process never loads the host API's descriptors
    from agenthost.protos import host_pb2 as hpb


def __getattr__(name: str) -> Any:
    # VERSION, the version of agenthost as installed (pyproject.toml is the one place it is written), is read on
    # first use: importlib.metadata costs an idle runner process ~2 MiB, and it imports this module for the rest.
    if name != "VERSION":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("agenthost")
    except metadata.PackageNotFoundError:  # running from a tree that was never installed
        version = "0+unknown"
    globals()["VERSION"] = version
    return version


# Set by the host in a plugin process's environment when its cgroup has a tools sub-group: the cgroup.procs files
# (":"-separated) a command the plugin starts for a model joins first (agenthost.runners.sdk.tool_walls).
TOOLS_CGROUP_ENV = "AGENTHOST_TOOLS_CGROUP"

# A runner process announces itself on stdout with `AGENTHOST|<PROTOCOL_VERSION>|<address>`.
PROTOCOL_VERSION = 1
HANDSHAKE_PREFIX = "AGENTHOST"

# Symmetric on every channel and server: a message either side may send, the other may receive.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# A runner's event batch is cut at this many events and bytes: two 5 MiB tool results must travel as two
# messages, and the host re-sends batches to its clients with a few bytes more per event (seq, time). The count
# only bounds what piled up while the previous message was being sent (the SDK never waits to fill a batch), so a
# larger one costs no latency; 256 rather than 64 lifts a saturated stream from ~190 k to ~270 k deltas/s
# persisted (bench_host.py), and the host's merged replies to clients are cut at the same count.
MAX_BATCH = 256
MAX_BATCH_BYTES = 4 * 1024 * 1024
# The largest single event a runner may emit: it must fit one message on both hops with room for the envelope.
# A larger one ends the run with `event_too_large` rather than being cut: silently shortening a tool result or a
# message would hand the model and the transcript something the runner never said (the local agent bounds its
# tool results long before this).
MAX_EVENT_BYTES = MAX_MESSAGE_BYTES - 64 * 1024

# The tag of RunEventBatch.events (field 1, length-delimited) and a short entry's length (under 128 bytes, which
# most text deltas are), precomputed: batch_entry runs once per streamed event.
SHORT_ENTRY_PREFIX = [bytes((0x0A, n)) for n in range(128)]


# A text delta of 1 to SHORT_TEXT_BYTES bytes of UTF-8 is encoded with one-byte lengths: `0A n+2 0A n <text>` as a
# RunEvent (text_delta, then TextDelta.text, both field 1), `0A n+4` before that as a batch entry. The SDK frames a
# yielded `str` so directly, and the host numbers batches of nothing else without parsing them
# (agenthost.host.store.text_deltas).
SHORT_TEXT_BYTES = 123
# The event's first four bytes, `0A n+2 0A n`, by n (index 0 unused: an empty text is encoded another way).
SHORT_TEXT_HEADS = [bytes((0x0A, n + 2, 0x0A, n)) for n in range(SHORT_TEXT_BYTES + 1)]


def varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch_entry(event: bytes) -> bytes:
    """A serialized RunEvent as one `events` entry of a serialized RunEventBatch: concatenated entries are a
    RunEventBatch. The runner SDK sends batches built so; the host stores runs of text deltas so. (Any serialized
    message as an entry of a repeated field 1: page_message uses it for items.)"""
    n = len(event)
    if n < 128:
        return SHORT_ENTRY_PREFIX[n] + event
    return b"\x0a" + varint(n) + event


def page_message(entries: Iterable[bytes], next_cursor: str, has_more: bool) -> bytes:
    """A serialized HistoryPageResponse (GetHistoryResponse has the same fields: items = 1, next_cursor = 2,
    has_more = 3) from its items already serialized as `items` entries (batch_entry), as the host stores them: no
    item is parsed or rebuilt."""
    parts = list(entries)
    if next_cursor:
        cursor = next_cursor.encode()
        parts.append(b"\x12" + varint(len(cursor)) + cursor)
    if has_more:
        parts.append(b"\x18\x01")
    return b"".join(parts)


def events_reply(batch: bytes) -> bytes:
    """A serialized RunEventBatch as the serialized SendMessageReply that carries it (`events`, field 2): how the
    host sends clients the batches it numbered as bytes."""
    return b"\x12" + varint(len(batch)) + batch


CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
# Calls one host server runs at once (its maximum_concurrent_rpcs), a backstop under the run API's own caps.
MAX_CONCURRENT_CALLS = 4096
# The asyncio server takes up new calls one at a time per method, a few loop iterations each (the host's admin
# SendMessage keeps more requests outstanding: agenthost.protos.prefetch); a burst arrives faster. The calls not
# yet taken up wait in grpc-core, which sheds them with a bare CANCELLED (no details, no
# retry hint) by random early drop once more than `max_pending_requests` wait (certain past the hard limit), and
# once one has waited `max_unrequested_time` seconds. Both sit well above what the host's own admission
# (agenthost.host.limits.RUNS_MAX_*) lets in, so a burst is answered by the host, queued or refused with
# RESOURCE_EXHAUSTED and a retry hint; grpc-core's shedding is left for floods far past that (16k calls at once,
# or a host unable to take up a call for two minutes).
MAX_PENDING_CALLS = 16384
MAX_UNREQUESTED_SECONDS = 120
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
    ("grpc.server_max_unrequested_time_in_server", MAX_UNREQUESTED_SECONDS),
    # A connection that finishes no handshake, or carries no call for five minutes, is closed: idle local
    # connections must not pile up until the process runs out of descriptors. Clients reconnect on their next
    # call without noticing (the host's channels to runners and the runners' channels to the host alike).
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 5 * 60 * 1000),
]

# The gRPC health service name a plugin process reports SERVING under, by plugin kind.
RUNNER_HEALTH_SERVICE = "agenthost.v1.Runner"
CHANNEL_HEALTH_SERVICE = "agenthost.v1.Channel"

# How long an approval request waits when the runner names no timeout, and the longest it may name (the run's
# deadline caps both): the host enforces them, the SDK and the binding configs are shaped by them.
APPROVAL_DEFAULT_SECONDS = 300.0
APPROVAL_MAX_SECONDS = 3600.0

# State scope names and their wire values; the one table the SDK, the host's grants and the CLI share.
STATE_SCOPES: dict[str, pb.StateScope] = {
    "run": pb.RUN,
    "conversation": pb.CONVERSATION,
    "actor": pb.ACTOR,
    "binding": pb.BINDING,
    "runner": pb.RUNNER,
}


def accepted_run(reply: hpb.SendMessageReply) -> hpb.RunInfo:
    """The run a SendMessage stream's first reply names: it is recorded, and either waits (`queued`) or started
    (`run_started`), or, for a repeated idempotency key whose run ended, is over (`run_finished`). Every client
    that needs the run id before the run's output reads it through here."""
    if reply.HasField("queued"):
        return reply.queued.run
    return reply.run_finished if reply.HasField("run_finished") else reply.run_started


# A client's name for one message (SendMessageRequest.idempotency_key, the gateway's Idempotency-Key header, the
# CLI's --idempotency-key), matched whole: 1-128 printable ASCII characters, no spaces.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,128}")
IDEMPOTENCY_KEY_RULE = "1-128 printable ASCII characters without spaces"
