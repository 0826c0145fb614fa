"""What the run orchestrator holds per run: the references a queued run needs to start, and what it accumulates
while the run streams. Shared by runs (the orchestrator), admission (the queue) and child_runs (subagents)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agenthost.host.access.grants import ActiveRun
from agenthost.host.runs.inbox import Inbox
from agenthost.host.runs.writer import RunWriter
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb


@dataclass
class QueuedStart:
    """What a queued run needs to start, dropped when it does: references to records already loaded, no RPC, no
    task, no buffers (the message text is in `event`, counted against limits.RUNS_MAX_QUEUED_INPUT_BYTES). The
    grant is frozen again at start from the same manifest and binding (a frozen Grant costs ~2 KiB)."""

    bot: hpb.Bot
    binding: hpb.Binding
    manifest: RunnerManifest
    event: pb.EventRecord
    actor: pb.Actor
    token: str
    timeout: float
    input_bytes: int
    origin: str = ""
    share: str = ""  # the sender whose queue share the run counts against; "" for an admin credential's (none)
    end_user: str = ""  # of that sender, the end user whose share of it the run counts against (admission.end_user_of)


@dataclass
class RunState:
    """What the orchestrator accumulates while a run streams."""

    info: hpb.RunInfo
    start: QueuedStart | None = None  # set while queued
    resumed: bool = False  # accepted by a previous host (RunManager.resume_queued)
    ending: asyncio.Future[None] | None = None  # the write of its end, once begun
    active: ActiveRun | None = None
    seq: int = 0
    text_parts: list[str] = field(default_factory=list)
    text_len: int = 0
    final_message: str | None = None
    event_count: int = 0  # events the runner sent, and their serialized bytes (limits.RUN_MAX_EVENT*)
    # What the host found for the artifacts the runner announced (artifact_created), by id: the stored ref, or None
    # (none, or one it may not read); and how many it looked up in vain (limits.RUN_MAX_ARTIFACT_MISSES).
    artifact_verdicts: dict[str, pb.ArtifactRef | None] = field(default_factory=dict)
    artifact_misses: int = 0
    event_bytes: int = 0
    terminal: pb.RunEvent | None = None
    subscribers: list[Inbox] = field(default_factory=list)
    writer: RunWriter | None = None  # its events on their way to the database, from its first batch
    task: asyncio.Task[None] | None = None
    cancel_reason: str = ""
    # False for a child run (a subagent): its events are its own record, not turns of the conversation.
    project: bool = True
