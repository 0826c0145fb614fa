"""Every resource cap the host enforces against runners and local clients, in one place, each with why it exists.

Code reads these as `limits.NAME` at the moment it checks, never `from ... import NAME`, so a test can lower a cap
with monkeypatch and watch it bite in seconds. A cap that is hit answers RESOURCE_EXHAUSTED (or, for a run's own
event stream, ends the run with error code `quota_exceeded`) with a message naming the cap and its value.

Wire sizes the runner SDK must agree on (message size, batch bytes, largest event) live in
`agenthost.runners.sdk.server`, because the SDK runs in plugin environments and must not import the host; they are
re-exported here so the whole budget reads in one file.
"""

from __future__ import annotations

import logging
import os
import resource

from agenthost.protos import media, wire
from agenthost.protos.wire import MAX_BATCH_BYTES, MAX_EVENT_BYTES, MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

__all__ = ["MAX_BATCH_BYTES", "MAX_EVENT_BYTES", "MAX_MESSAGE_BYTES", "listener_caps", "raise_fd_limit"]


def _env_int(name: str, default: int, *, minimum: int) -> int:
    """An integer cap the user may set in the host's environment; a value that does not parse (or is too small to
    start anything) is logged and ignored."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        log.error("ignoring %s=%r: not an integer; using %d", name, raw, default)
        return default
    if value < minimum:
        log.error("ignoring %s=%d: below the least that works, %d; using %d", name, value, minimum, default)
        return default
    return value


# ---- state (per scope: a run's, a conversation's, an actor's, a binding's, a runner's) ----

# One value must fit a reply with room to spare, and a run's start-up snapshot is assembled from these.
STATE_MAX_VALUE_BYTES = 256 * KiB
# Rows cost beyond their bytes (index entries, per-row overhead): tiny keys must not flood a scope either.
# Generous, because STATE_MAX_BYTES_PER_SCOPE is what bounds the disk.
STATE_MAX_KEYS_PER_SCOPE = 100_000
# Total JSON bytes of one scope: the disk a single plugin may claim through one scope.
STATE_MAX_BYTES_PER_SCOPE = 64 * MiB

# ---- artifacts ----

# One artifact: the largest file a runner may hand the host in one upload.
ARTIFACT_MAX_BYTES = 256 * MiB
# Bytes of artifacts one run creates (deduplicated content still counts: the run asked for it).
ARTIFACT_MAX_BYTES_PER_RUN = 512 * MiB
# Bytes of artifacts one conversation holds, over all its runs: the disk one chat may ever claim.
ARTIFACT_MAX_BYTES_PER_CONVERSATION = 4 * GiB
# Uploads in flight at once, host-wide: each holds a temp file, a descriptor and a task.
MAX_CONCURRENT_UPLOADS = 64
# Uploads in flight for one run, so one plugin cannot take every host-wide slot.
MAX_UPLOADS_PER_RUN = 4
# The header (first message) of an upload must arrive this soon after the call opens, or the call is refused.
UPLOAD_HEADER_SECONDS = 10.0
# Streaming calls without a valid run token whose opening messages one run-API listener (one plugin process) reads,
# at once, before refusing them (so a client whose token expired gets UNAUTHENTICATED rather than gRPC's bare
# INTERNAL); past this, refused unread. Per listener: one plugin's callers cannot use up another's.
REFUSED_STREAMS_READ = 64
# Bytes one such refusal reads at most (the last message read may pass it by up to MAX_MESSAGE_BYTES): an upload
# that large from a client whose token is gone may see gRPC's bare INTERNAL; a caller without a token uploading at
# full speed had the host read ~400 MiB a refusal in its 5 s.
REFUSED_STREAM_READ_BYTES = 1 * MiB
# Calls of one run-API listener (one plugin process) reading their request message at once, and how long each may
# take to arrive: grpc-core holds a message being read in memory until it is whole (up to MAX_MESSAGE_BYTES), so
# this bounds what one plugin's half-sent requests hold of the host to RUN_API_READS x 8 MiB (see run_api._Gate).
RUN_API_READS = 32
RUN_API_READ_SECONDS = 10.0
# Longest pause between two chunks of an upload: a trickling client must not hold a slot forever.
UPLOAD_IDLE_SECONDS = 30.0

# ---- message attachments (SendMessageRequest.attachments, agenthost.host.runs.attachments) ----

# The wire contract's (agenthost.protos.media: channels and runners shape what they send by them), named here with
# every other cap. Attachments also count, while the run is queued, against RUNS_MAX_QUEUED_INPUT_BYTES.
ATTACHMENT_MAX_BYTES = media.ATTACHMENT_MAX_BYTES
ATTACHMENTS_MAX_PER_MESSAGE = media.ATTACHMENTS_MAX_PER_MESSAGE
ATTACHMENTS_MAX_BYTES_PER_MESSAGE = media.ATTACHMENTS_MAX_BYTES_PER_MESSAGE

# ---- a run's event stream ----

# Events one run may emit; a million one-character deltas is a flood, not a reply.
RUN_MAX_EVENTS = 200_000
# Serialized bytes of one run's events (they are all persisted and replayable): the disk one run may claim.
RUN_MAX_EVENT_BYTES = 256 * MiB
# artifact_created events of one run naming an artifact it may not read (or none at all) that the host looks up in
# the database; later ones are dropped without a lookup. A runner announces what it made: it never misses.
RUN_MAX_ARTIFACT_MISSES = 64
# Verdicts on the artifacts one run announced, kept so the same ref announced again is not looked up again.
RUN_ARTIFACT_VERDICTS = 256
# The run's final text kept in the runs table and sent in RunInfo; longer text is cut with RUN_TEXT_MARKER
# (every message is still whole in the transcript).
RUN_MAX_TEXT_CHARS = 1 * MiB
# A runner's failure message, code and model name are shown in `runs list`; they are cut to these on arrival.
RUN_MAX_ERROR_CHARS = 16 * KiB
RUN_MAX_CODE_CHARS = 128
RUN_MAX_MODEL_CHARS = 256
RUN_TEXT_MARKER = "\n[… truncated by the host]"
# Characters of one transcript item that the full-text index sees. The whole text is stored and returned by
# history reads; indexing 5 MiB tool outputs would make every such append cost tens of milliseconds of
# tokenizing and bloat the index with noise. Baked into schema migration 4 (a change needs a new migration).
FTS_INDEXED_CHARS = 32 * KiB

# ---- the run API's audit log (agenthost.host.store.runs.AuditLog) ----

# Rows the audit table keeps: every run-API call, allowed or refused, is one, and a plugin calls as often as it
# likes (a refused call costs it a few microseconds): without a bound its rows grew the database until the disk was
# full. The oldest rows go first; at ~200 bytes a row this is ~200 MB.
AUDIT_MAX_ROWS = 1_000_000

# ---- RunInfo as the CLI reads it ----

# `runs list` returns up to 1000 runs in one reply: each run's text fields are cut to this many characters so
# the reply always fits one message, whatever a runner wrote.
RUNINFO_LIST_TEXT_CHARS = 2 * KiB
# `runs get` returns one run: its text fields are cut to this (under the message size with room to spare).
RUNINFO_GET_TEXT_CHARS = 1 * MiB
# ListRunEvents pages are cut at this many serialized bytes (at least one event is always returned).
RUN_EVENTS_PAGE_BYTES = 4 * MiB

# ---- the host → client hop (SendMessage replies) ----

# Bytes merged into one SendMessageReply: two large events must travel as two replies, never one oversize one.
CLIENT_BATCH_BYTES = 4 * MiB
# A subscriber that falls this far behind (bytes of replies not yet sent) is dropped with RESOURCE_EXHAUSTED;
# the run goes on and its events stay readable with `runs events`.
INBOX_MAX_BYTES = 64 * MiB
# The same bound in replies, for floods of tiny events (each reply costs memory beyond its bytes).
INBOX_MAX_REPLIES = 100_000

# ---- run admission (agenthost.host.runs.manager) ----

# Runs executing at once, host-wide. Each holds a runner RPC, a task, its grant and stream buffers, and takes
# event-loop time from every other; one host process gains no throughput past a few hundred (bench_load.py, 5,000
# runs on 2 cores: ~150 runs/s at 256, ~136 at 128). Beyond this, runs wait in `queued`: their record, the
# client's open SendMessage call and a small QueuedStart (references to records already loaded); no task, no RPC.
RUNS_MAX_ACTIVE = 256
# Runs waiting (for a slot, or for earlier runs of their conversation), host-wide. Each keeps its client's
# SendMessage stream open; past this, a new run is refused with RESOURCE_EXHAUSTED and a retry hint.
RUNS_MAX_QUEUED = 8192
# Of those, one bot may hold this many, so one busy bot cannot take the whole queue from the others (slots are
# also handed out round-robin across bots).
RUNS_MAX_QUEUED_PER_BOT = 4096
# Of those, one conversation may hold this many: its runs execute one at a time, so a deeper queue only makes
# its last message wait longer.
RUNS_MAX_QUEUED_PER_CONVERSATION = 256
# Bytes of input (message text, event data and attachments) that queued runs carry: what a burst of large messages
# may make the host hold before their runs start.
RUNS_MAX_QUEUED_INPUT_BYTES = 256 * MiB
# Of those, one bot's queued runs may hold a quarter: a bot whose runs are slow and whose senders attach large
# files fills its own share and is refused, while the other bots' messages still queue.
RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT = 64 * MiB
# One sender (the credential a message came with: an HTTP key, a channel's, a scoped CLI credential) may hold this
# many queued runs and this many bytes of their input, whichever bots they are for: one key cannot take a bot's whole
# share. An admin credential (the operator's CLI, a benchmark: trusted) has no sender share; its bots' still apply.
RUNS_MAX_QUEUED_PER_SENDER = 1024
RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER = 32 * MiB
# Of a sender's share, one end user it names (a channel's chat user, tg:<id>; a gateway key's `user`) may hold this
# many queued runs and bytes: a channel is one sender for all its chats, so one chat user writing fast (opening new
# conversations with /new, or forum topics, past RUNS_MAX_QUEUED_PER_CONVERSATION) took the channel's whole share and
# every other chat's message was refused. A sender naming no end user (a script's key) keeps its whole share.
RUNS_MAX_QUEUED_PER_END_USER = 64
RUNS_MAX_QUEUED_INPUT_BYTES_PER_END_USER = 8 * MiB
# The retry hint of an admission refusal (trailing metadata `retry-after-ms`) stays within these bounds.
RUNS_RETRY_MIN_MS = 250
RUNS_RETRY_MAX_MS = 60_000

# ---- the HTTP gateway (agenthost.host.api.gateway) ----

# A request body larger than this is parsed off the event loop (in a parser process) and needs a large-body slot:
# parsing 12 MiB of JSON takes 20-150 ms of CPU and the parsed object several times its bytes in memory.
GATEWAY_LARGE_BODY_BYTES = 256 * KiB
# So is a smaller body that may hold more JSON values than this (its commas and opening brackets, counted in one
# pass, strings' too: an overestimate): parsing costs about 70-230 ns a value, so 256 KiB of `[0,0,...]` or
# `[{},{},...]` (87,000-131,000 values) held the loop 10-30 ms, and a key sending many at once stalled every other
# client for the sum. A body under this many values parses on the loop in about 2 ms at most; a chat history of
# prose needs about 500 KB to reach it.
GATEWAY_LOOP_PARSE_VALUES = 8192
# Large bodies being read and parsed at once, host-wide and per key: past either, 429 with Retry-After, so what a
# burst makes the gateway hold is bounded (a few times 12 MiB raw plus its parsed objects), and one key's burst
# leaves slots for the others.
GATEWAY_MAX_LARGE_BODIES = 4
GATEWAY_MAX_LARGE_BODIES_PER_KEY = 2
# Processes that parse large bodies (json.loads holds the GIL for a whole document: in a thread it would still
# stall the loop). Each is a spare Python process of about 40 MiB, started at the first large body.
GATEWAY_BODY_PARSERS = 2
# HTTP connections open at once. Past this a new connection is answered 503 (Retry-After) and closed at once, so
# a flood of idle connections costs the host at most this many descriptors. Lowered at start to a quarter of the
# process's descriptor limit (listener_caps), leaving the rest to runs, plugins and the operator's admin.sock.
GATEWAY_MAX_CONNECTIONS = 1024
# Of those, one client address may hold this many (its address: the peer's, or behind a proxy named with
# `serve --trusted-proxy` the one the proxy forwards; gateway/connections.py), so one client cannot take the rest
# from everyone else. Past it, 429 with Retry-After and closed.
GATEWAY_MAX_CONNECTIONS_PER_ADDRESS = 256
# And this many that have not shown a valid key (or console session) yet: every connection starts so, and one whose
# request did not authenticate is closed after its response. As many as one key may have requests open at once.
GATEWAY_MAX_UNAUTHENTICATED_PER_ADDRESS = 64
# Requests one non-admin key may have open on the gateway at once (from its key being checked to the end of its
# response: a stream held open, a body trickled in). Past it, 429 with Retry-After: a key whose runs stream for a
# long time, or which trickles its bodies, cannot take every connection under GATEWAY_MAX_CONNECTIONS from the
# other keys and the console.
GATEWAY_MAX_OPEN_REQUESTS_PER_KEY = 64
# A connection must send a complete request head within this many seconds of opening (or of its previous
# response): a client that connects and stays silent, or trickles its headers (slowloris), is closed.
GATEWAY_HEADER_SECONDS = 15.0

# ---- the gRPC listeners ----

# Connections open at once to one plugin process's run API socket (each has its own: agenthost.host.processes.
# plugin_sockets), and to the host's api.sock. A runner needs a couple, plus one per MCP bridge of a run in flight.
# Plugins are untrusted: past this, grpc-core closes new connections at once, so a plugin that floods its socket
# starves only its own runs. Lowered at start like the gateway's. admin.sock (reachable by this user only: its
# directory is 0700) has no cap, so the operator's CLI still gets in when the gateway and the run API are flooded.
API_MAX_CONNECTIONS = 1024
# Connections open at once to the Prometheus endpoint (--metrics), in all and per client address: a scraper needs
# one; past either, 503/429 with Retry-After and closed (the shared capped listener, protos/listeners.py).
METRICS_MAX_CONNECTIONS = 64
METRICS_MAX_CONNECTIONS_PER_ADDRESS = 8

# ---- human approval of tool calls (agenthost.host.runs.approvals) ----

# Approvals one run may hold open at once. Each is a held-open RequestApproval call (a gRPC slot, a task) and a
# prompt in front of a person; a model asking for a dozen tools in one step still fits, a plugin flooding does not.
APPROVALS_MAX_PENDING_PER_RUN = 4
# Approvals pending host-wide: far under the run API's concurrent-call cap, so waiting calls cannot crowd out
# the calls runs make to do their work.
APPROVALS_MAX_PENDING = 256
# Approvals pending for one bot: a quarter of the host's, so one bot's runs (whose messages may come from anyone on
# a chat platform) cannot take every slot and leave other bots' gated tools refused.
APPROVALS_MAX_PENDING_PER_BOT = 64
# How long a request waits when the runner names no timeout, and the longest it may name (the wire contract's: the
# SDK's config is shaped by them). No decision in time = denied.
APPROVAL_DEFAULT_SECONDS = wire.APPROVAL_DEFAULT_SECONDS
APPROVAL_MAX_SECONDS = wire.APPROVAL_MAX_SECONDS
# Summary, reason and note: what a person reads in one glance (longer is cut, or refused for a note).
APPROVAL_MAX_TEXT_CHARS = 1000
# A request's arguments as received, and the part of them shown in the event (the rest is marked truncated).
APPROVAL_MAX_ARGUMENTS_BYTES = 256 * KiB
APPROVAL_SHOWN_ARGUMENTS_CHARS = 4 * KiB

# ---- child runs (subagents, AgentRunAPIProxy.ChildRun) ----

# Children one run may open over its life, and hold open at once. Each child is a runs row, its events (each child
# has the per-run event quotas above) and an open call; the parent's deadline bounds them all.
CHILD_RUNS_MAX_PER_RUN = 32
CHILD_RUNS_MAX_CONCURRENT = 4
# Children open at once, host-wide.
CHILD_RUNS_MAX_ACTIVE = 512
# Children open at once for one bot: a quarter of the host's, so one bot's runs cannot leave others none.
CHILD_RUNS_MAX_ACTIVE_PER_BOT = 128
# Sizes of a child's header fields.
CHILD_RUN_MAX_DESCRIPTION = 200
CHILD_RUN_MAX_TYPE = 64

# ---- the single writer ----

# Jobs waiting for the writer thread; past this, producers that can wait (state writes, a run's stream) wait.
WRITE_QUEUE_MAX_JOBS = 8192
# Bytes those jobs carry (run events mostly): what a slow disk may make the host hold in memory.
WRITE_QUEUE_MAX_BYTES = 64 * MiB
# How long the writer holds a batch made only of writes nobody awaits (streamed run events, audit rows) open for
# more before committing. Every commit syncs the WAL (synchronous=FULL): without the window a fast stream paid one
# fsync per runner message. An awaited write arriving meanwhile is committed at once, with what is already there.
WRITE_GROUP_COMMIT_SECONDS = 0.003
# A write transaction PostgreSQL refused as losing a race with another session (a deadlock, a serialization failure:
# host/store/faults.py) is run again this many times, after a jittered pause growing from the base; then its
# callers get ABORTED (WriteConflict).
WRITE_CONFLICT_RETRIES = 5
WRITE_CONFLICT_BACKOFF_SECONDS = 0.05
# How often the end of a run is tried again while the database is unreachable (its client was told at once).
RUN_END_RETRY_SECONDS = 1.0


# ---- plugin processes (agenthost.host.processes.resource_walls) ----

# Each plugin process, with everything it starts (bwrap, tool commands, harness CLIs), lives in its own cgroup
# when the host can manage cgroups. Memory (RAM and swap) it may use: past this the kernel's OOM killer ends its
# largest process, and a run whose runner it was fails with `runner_out_of_memory`. Claude Code or Codex (node)
# take about 0.5 GiB, the local agent far less; the rest is room for what their commands build and run.
# Override per host with AGENTHOST_PLUGIN_MEMORY_MAX_BYTES.
PLUGIN_MEMORY_MAX_BYTES = _env_int("AGENTHOST_PLUGIN_MEMORY_MAX_BYTES", 4 * GiB, minimum=32 * MiB)
# Processes and threads at once: a fork bomb inside a sandbox stops here (forks fail with EAGAIN) while the host
# and other plugins go on. node alone runs ~15 threads; a build with parallel jobs a few hundred.
# Override per host with AGENTHOST_PLUGIN_PIDS_MAX.
PLUGIN_PIDS_MAX = _env_int("AGENTHOST_PLUGIN_PIDS_MAX", 1024, minimum=16)
# The commands a plugin starts for a model (shell tool commands, MCP servers, harness CLIs) share a sub-group of the
# plugin's with this share of its memory and processes: a fork bomb or a memory hog in a command meets its own cap
# while the runner keeps the rest, so the runner, and the other conversations it serves, go on.
PLUGIN_TOOLS_SHARE = 0.75
# CPU weight (cgroup v2 scale, 100 = the default; v1 shares are scaled from it). Every plugin group sits under one
# group for the host's plugins, so under contention all plugins together get about as much CPU as the host.
PLUGIN_CPU_WEIGHT = 100
# Open descriptors per process of a plugin (RLIMIT_NOFILE, no privilege needed: applies even without cgroups).
# The host raises its own limit very high (raise_fd_limit); a plugin does not inherit that.
PLUGIN_OPEN_FILES_MAX = 65536


def raise_fd_limit() -> tuple[int, int]:
    """Raises this process's soft descriptor limit to its hard limit; returns (soft, hard) after the change.

    Every connection, upload temp file, plugin pipe and SQLite file costs descriptors; the usual soft limit of
    1024 lets a handful of idle local connections starve live runs. Call once at host start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. a hard limit above the kernel's nr_open
        log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
        return soft, hard
    return target, hard


def listener_caps(open_files: int | None = None) -> tuple[int, int]:
    """(gateway connections, api.sock connections) for a process allowed `open_files` descriptors (default: its
    soft RLIMIT_NOFILE now). Each listener gets at most a quarter, so even both flooded at once leave half the
    descriptors to the database, plugins' pipes, uploads and the operator's admin.sock."""
    if open_files is None:
        open_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if open_files == resource.RLIM_INFINITY:
        open_files = 1 << 20
    share = max(16, open_files // 4)
    return min(GATEWAY_MAX_CONNECTIONS, share), min(API_MAX_CONNECTIONS, share)


# A runner worker's hello (host/workers/hub.py): at most this many plugins, of MAX_RUNNERS_PER_PLUGIN runners each
# (agenthost.plugins.manifest, as for a local plugin), are taken from its offers; the rest are dropped with a
# warning, so a flood of offers costs the host a bounded list.
WORKER_MAX_OFFERS = 64
# And at most this many runners in all. Each runner's manifest is validated, its config schema checked: a few
# milliseconds each (jsonschema), and a cache of verdicts does not help against schemas made to differ. 64 × 64 of
# them took 17 CPU-s of the host per hello, on its event loop (every run, the admin API and the gateway stood still,
# and an active host could miss its lease heartbeat). They are validated off the loop too (WorkerHub._connect).
WORKER_MAX_RUNNERS = 256

# The enrolment port (host/workers/hub.py) answers anyone who can reach it: at most this many Enrol calls at once
# (more are refused RESOURCE_EXHAUSTED at once), and a call's request must arrive within this many seconds. A client
# holding calls open without ever sending one cost the host ~22 KB each, without bound (5,000 held: +110 MB RSS).
WORKER_ENROL_MAX_CALLS = 32
WORKER_ENROL_READ_SECONDS = 10.0
# Calls one enrolled worker may hold open at once on the workers port: its control stream, a Run stream per run
# (at most RUNS_MAX_ACTIVE) and its runners' run-API calls fit well under it. Past it a call is refused
# RESOURCE_EXHAUSTED before its request is read, so a compromised worker holds a bounded share of the host.
WORKER_MAX_CALLS = 1024
# Of those, the ones reading their request (a unary call's, a stream's first message) at once, each for at most
# RUN_API_READ_SECONDS; and the `Calls` streams (host/workers/mux.py) one worker holds open, each always reading its
# next frame. grpc-core holds a message being read until it is whole (up to MAX_MESSAGE_BYTES): a worker opening
# calls that each declared an 8 MiB request and sent all but a byte held 8 MiB of the host per call, ~8 GiB in all.
# Now what one worker's half-sent requests hold is about (WORKER_READS + WORKER_CALLS_STREAMS) x 8 MiB, plus its
# Run streams' (one per run placed on it). A call waiting its turn asks for no message, so grpc-core lets in only
# its stream's window.
WORKER_READS = 16
WORKER_CALLS_STREAMS = 4
# Messages read per second off one worker's control stream (it heartbeats every 2 s); faster, flow control holds it.
WORKER_CONTROL_MESSAGES_PER_SECOND = 10
# After a host starts (a restart, a standby taking over), its workers are still reconnecting (their backoff is
# 0.25-0.5 s after a lost connection, doubling per round of addresses that failed): for this long from the start,
# a run the previous host left queued, of a runner no connected worker offers yet, waits for one that does instead
# of failing `runner_unavailable` at once. A new message is not held: its sender is told at once.
WORKER_RECONNECT_GRACE_SECONDS = 15.0
# A worker's client certificate lives this long; the worker renews it over its mTLS connection at 2/3 of that
# (worker_pki.RENEW_AT), so a worker that stays away longer than a third of it must enrol again. Set in the host's
# environment; short lifetimes bound what a stolen worker key is worth.
WORKER_CERT_SECONDS = _env_int("AGENTHOST_WORKER_CERT_SECONDS", 30 * 24 * 3600, minimum=30)
# Renewals one worker may make in WORKER_RENEWAL_WINDOW_SECONDS: each is a signature by the host's CA and a write,
# and a worker renews once in a lifetime's two thirds (or when told to), plus a retry if an answer was lost. Past
# it a renewal is refused RESOURCE_EXHAUSTED with a retry hint, so an enrolled worker cannot keep the CA signing.
# The window is at most a third of WORKER_CERT_SECONDS (a short lifetime renews that often).
WORKER_RENEWALS_PER_WINDOW = 5
WORKER_RENEWAL_WINDOW_SECONDS = 600.0
# `agenthost workers rotate NAME` waits this long for the worker's renewal before saying it did not come.
WORKER_ROTATE_WAIT_SECONDS = 20.0

# The active host's lease on a PostgreSQL database (docs/operating/standby.md): the heartbeat written to the lease row
# (for humans; each beat is also a fenced write, so a deposed idle host stops within a beat or so).
LEASE_HEARTBEAT_SECONDS = 1.0
# What a host remembers of a PostgreSQL database (its state and history-page caches) answers reads only while a
# write transaction that began less than this long ago committed under its lease (Database.proven). A host that
# takes the lease from one that did not release it waits LEASE_TAKEOVER_GRACE_SECONDS, longer, before its first
# write: a deposed host has stopped answering from memory by then, even one that does not know yet it lost the lease.
LEASE_PROOF_SECONDS = 1.5
LEASE_TAKEOVER_GRACE_SECONDS = 2.0
