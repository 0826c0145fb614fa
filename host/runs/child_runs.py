"""Child runs: a runner's subagents, recorded by the host under the run that opened them.

A runner opens a child through the run API's ChildRun call, authorized by the parent run's own token: the child
gets a runs row (`parent_run_id` set, the parent's frozen grant recorded, no token of its own), its deadline is the
parent's or earlier, and its events go through the same numbering, quotas and ledger as any run's — but never into
the conversation's transcript, which holds only the parent's turns (the parent's tool call and its result). The
parent's own stream gets two host-written events, `subagent_started` and `subagent_finished`, linking the child.

A child cannot outlive its parent: when the parent ends for any reason, every child still open is ended with it
(cancelled, timed_out or interrupted like its parent), its end written before the parent's, and its call ended.
Every end the host records is told to the runner in-band, as the call's last reply (`finished`), and the call then
ends OK: a status the host ends the call with while the runner writes can reach the runner as grpcio's own
INTERNAL instead (grpc/grpc#36066), so the status code cannot say why a child ended. Only a runner that breaks the
protocol has its call refused with a status.
The child's usage is added to the parent's when the child ends, so a run's usage is what it cost in all; each child
row keeps its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agenthost.host import limits
from agenthost.host.access.grants import ActiveRun
from agenthost.host.runs.state import RunState
from agenthost.host.store.runs import RunStore
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2 as api

if TYPE_CHECKING:
    from agenthost.host.ops.observability import Observer
    from agenthost.host.store.registry import Registry


class RunPath(Protocol):
    """The part of the RunManager (agenthost.host.runs.manager) that child runs share: its numbering and ledger,
    its outcomes and quotas. Child runs are a piece of the manager's run path, not a client of it, so they use its
    internals; naming them here keeps this module from importing the manager that imports it."""

    observer: Observer
    registry: Registry
    runs: RunStore

    def running_state(self, run_id: str) -> RunState | None: ...

    def _ingest_batch(self, st: RunState, batch: pb.RunEventBatch, *, from_host: bool = False) -> None: ...

    def _set_outcome(self, st: RunState, status: str, code: str = "", message: str = "") -> None: ...

    def _over_quota(self, st: RunState, events: int, size: int) -> str: ...

    async def _finish(self, st: RunState) -> None: ...


_TYPE = re.compile(r"^[A-Za-z0-9_.-]*$")


@dataclass
class Child:
    st: RunState
    parent: RunState
    tool_call_id: str
    recorded: asyncio.Future[None]  # the row's insert
    # Set when the host ends the child itself (its parent ended, a cancel request), its outcome already set.
    stop: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ending: asyncio.Future[None] | None = None


def _check_header(header: api.ChildRunHeader) -> None:
    if not 1 <= len(header.description) <= limits.CHILD_RUN_MAX_DESCRIPTION:
        raise errors.InvalidArgument(f"description must be 1-{limits.CHILD_RUN_MAX_DESCRIPTION} characters")
    if len(header.subagent_type) > limits.CHILD_RUN_MAX_TYPE or not _TYPE.match(header.subagent_type):
        raise errors.InvalidArgument(
            f"subagent_type must be at most {limits.CHILD_RUN_MAX_TYPE} characters of letters, digits, '_.-'"
        )
    if len(header.tool_call_id) > 128:
        raise errors.InvalidArgument("tool_call_id is at most 128 characters")
    if not math.isfinite(header.timeout_seconds) or header.timeout_seconds < 0:
        raise errors.InvalidArgument("timeout_seconds must be a finite number >= 0 (0 = the parent's deadline)")


def _parent_outcome(parent: hpb.RunInfo) -> tuple[str, str, str]:
    """What a child still open when its parent ends becomes: (status, error_code, error_message)."""
    if parent.status == "timed_out":
        return "timed_out", "deadline_exceeded", "the parent run passed its deadline"
    if parent.status == "interrupted":
        return "interrupted", "host_shutdown", "the host stopped while the parent run was in progress"
    if parent.status == "cancelled":
        return "cancelled", "parent_cancelled", "the parent run was cancelled"
    return "cancelled", "parent_ended", f"the parent run ended ({parent.status}) before this child did"


class ChildRuns:
    """The open children of every run. Owned by the RunManager, whose event path and ledger they share."""

    def __init__(self, manager: RunPath) -> None:
        self.manager = manager
        self._by_id: dict[str, Child] = {}
        self._open: dict[str, dict[str, Child]] = {}  # parent run id -> its open children
        self._opened: dict[str, int] = {}  # parent run id -> children opened over its life (while it is live)

    def get(self, child_run_id: str) -> Child | None:
        return self._by_id.get(child_run_id)

    def open_for(self, parent_run_id: str) -> bool:
        return bool(self._open.get(parent_run_id)) or parent_run_id in self._opened

    # ---- opening ----

    async def open(self, parent: ActiveRun, header: api.ChildRunHeader) -> Child:
        """Records a new child of `parent` (already authorized for ChildRun) and links it on the parent's stream."""
        _check_header(header)
        manager = self.manager
        parent_st = manager.running_state(parent.run_id)
        if parent_st is None:
            raise errors.FailedPrecondition(f"run {parent.run_id} is not running; it cannot open a child run")
        siblings = self._open.get(parent.run_id, {})
        if self._opened.get(parent.run_id, 0) >= limits.CHILD_RUNS_MAX_PER_RUN:
            raise errors.ResourceExhausted(
                f"this run has opened CHILD_RUNS_MAX_PER_RUN = {limits.CHILD_RUNS_MAX_PER_RUN} child runs"
            )
        if len(siblings) >= limits.CHILD_RUNS_MAX_CONCURRENT:
            raise errors.ResourceExhausted(
                f"this run has CHILD_RUNS_MAX_CONCURRENT = {limits.CHILD_RUNS_MAX_CONCURRENT} child runs open"
            )
        if len(self._by_id) >= limits.CHILD_RUNS_MAX_ACTIVE:
            raise errors.ResourceExhausted(
                f"the host has CHILD_RUNS_MAX_ACTIVE = {limits.CHILD_RUNS_MAX_ACTIVE} child runs open; retry"
            )
        if sum(1 for c in self._by_id.values() if c.st.info.bot_id == parent.bot_id) >= (
            limits.CHILD_RUNS_MAX_ACTIVE_PER_BOT
        ):
            raise errors.ResourceExhausted(
                f"this bot has CHILD_RUNS_MAX_ACTIVE_PER_BOT = {limits.CHILD_RUNS_MAX_ACTIVE_PER_BOT} child runs open;"
                " retry"
            )
        now = time.time()
        deadline = parent.deadline_at
        if header.timeout_seconds > 0:
            deadline = min(deadline, now + header.timeout_seconds)
        pinfo = parent_st.info
        info = hpb.RunInfo(
            run_id=f"run_{uuid.uuid4().hex}",
            bot_id=pinfo.bot_id,
            conversation_id=pinfo.conversation_id,
            binding_id=pinfo.binding_id,
            runner_id=pinfo.runner_id,
            event_id=pinfo.event_id,
            status="running",
            created_at=now,
            started_at=now,
            deadline_at=deadline,
            parent_run_id=parent.run_id,
            origin=parent.origin,
        )
        # The parent's grant, recorded as such: the child acts only through the parent's token, so it can never
        # hold more (and the host never issues it a token of its own).
        grant_json = json.dumps({**parent.grant.to_json(), "inherited_from": parent.run_id})

        def insert(conn: sqlite3.Connection) -> None:
            # The parent's sender's, like the rest of its record: whoever may see the parent sees its children.
            RunStore.insert(
                conn, info, plugin_id=parent.plugin_id, token_hash="", grant_json=grant_json, origin=parent.origin
            )

        child = Child(
            st=RunState(info=info, project=False),
            parent=parent_st,
            tool_call_id=header.tool_call_id,
            recorded=asyncio.ensure_future(manager.registry.db.write(insert)),
        )
        # Counted before the insert is awaited, so concurrent opens cannot pass the caps, and the parent ending
        # meanwhile finds (and ends) this child.
        self._by_id[info.run_id] = child
        self._open.setdefault(parent.run_id, {})[info.run_id] = child
        self._opened[parent.run_id] = self._opened.get(parent.run_id, 0) + 1
        try:
            await asyncio.shield(child.recorded)
        except BaseException:
            self._forget(child)
            raise
        manager.observer.run_started(info)
        started = pb.RunEvent(
            subagent_started=pb.SubagentStarted(
                child_run_id=info.run_id,
                tool_call_id=header.tool_call_id,
                subagent_type=header.subagent_type,
                description=header.description,
            )
        )
        manager._ingest_batch(parent_st, pb.RunEventBatch(events=[started]), from_host=True)
        return child

    # ---- the child's events ----

    async def stream(self, child: Child, messages: AsyncIterator[Any]) -> errors.AgentHostError | None:
        """Takes the child's event batches until its terminal event, the runner's half-close, the host ending it or
        its deadline (None: its outcome is set), or until the runner breaks the protocol (the error to refuse the
        call with)."""
        manager, st = self.manager, child.st
        while st.terminal is None:
            read = asyncio.ensure_future(anext(messages, None))
            remaining = max(0.0, st.info.deadline_at - time.time())
            done, _ = await asyncio.wait({read, child.stop}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                if not child.stop.done():
                    message = f"the child run passed its deadline of {st.info.deadline_at - st.info.started_at:.0f}s"
                    manager._set_outcome(st, "timed_out", "deadline_exceeded", message)
                return None
            request = read.result()
            if request is None:
                manager._set_outcome(
                    st, "failed", "runner_protocol", "the runner ended the child's stream without a terminal event"
                )
                return None
            if not isinstance(request, api.ChildRunRequest):  # run_api.Malformed
                message = getattr(request, "message", "malformed request")
                manager._set_outcome(st, "failed", "runner_protocol", message)
                return errors.InvalidArgument(message)
            if request.WhichOneof("part") != "events":
                message = "only event batches may follow the header"
                manager._set_outcome(st, "failed", "runner_protocol", message)
                return errors.InvalidArgument(message)
            manager._ingest_batch(st, self._charged(child, request.events))
            if manager.registry.db.congested:
                await manager.registry.db.backpressure()
        return None

    def _charged(self, child: Child, batch: pb.RunEventBatch) -> pb.RunEventBatch:
        """The batch, counted against the parent's event quotas too: a run's quota covers what its children send,
        or a runner could store CHILD_RUNS_MAX_PER_RUN times more by moving its events into children. A batch the
        parent's quota cannot take fails the child (the parent goes on; its runner sees the subagent fail)."""
        parent = child.parent
        count, size = len(batch.events), batch.ByteSize()
        over = self.manager._over_quota(parent, count, size)
        if over:
            message = f"{over}, counting its parent run's and its siblings' events"
            return pb.RunEventBatch(events=[pb.RunEvent(failed=pb.Failed(code="quota_exceeded", message=message))])
        parent.event_count += count
        parent.event_bytes += size
        return batch

    # ---- ending ----

    def end(self, child: Child) -> asyncio.Future[None]:
        """Writes the child's end (idempotent); its outcome must be set, or it ends as failed."""
        if child.ending is None:
            child.ending = asyncio.ensure_future(self._end(child))
        return child.ending

    async def _end(self, child: Child) -> None:
        manager, info = self.manager, child.st.info
        try:
            await asyncio.shield(child.recorded)  # the row exists before its end is written
        except Exception:
            self._forget(child)
            return
        try:
            await manager._finish(child.st)
        finally:
            self._forget(child)
        parent = child.parent
        u, cu = parent.info.usage, info.usage
        u.input_tokens += cu.input_tokens
        u.output_tokens += cu.output_tokens
        u.cache_read_tokens += cu.cache_read_tokens
        u.cache_write_tokens += cu.cache_write_tokens
        u.cost_usd += cu.cost_usd
        finished = pb.RunEvent(
            subagent_finished=pb.SubagentFinished(
                child_run_id=info.run_id,
                tool_call_id=child.tool_call_id,
                status=info.status,
                error_code=info.error_code,
                usage=cu,
            )
        )
        manager._ingest_batch(parent, pb.RunEventBatch(events=[finished]), from_host=True)

    def _forget(self, child: Child) -> None:
        info = child.st.info
        self._by_id.pop(info.run_id, None)
        siblings = self._open.get(info.parent_run_id)
        if siblings is not None:
            siblings.pop(info.run_id, None)
            if not siblings:
                del self._open[info.parent_run_id]

    def runner_cancelled(self, child: Child) -> None:
        """The runner cancelled the call (its subagent was cancelled, or the runner went away)."""
        self.manager._set_outcome(child.st, "cancelled", "cancelled", "the runner cancelled the child run")
        self.end(child)

    async def end_for_parent(self, parent: RunState) -> None:
        """The parent is ending: every child still open ends with it, written before the parent's end."""
        status, code, message = _parent_outcome(parent.info)
        children = list(self._open.get(parent.info.run_id, {}).values())
        for child in children:
            self.manager._set_outcome(child.st, status, code, message)
            if not child.stop.done():
                child.stop.set_result(None)
        endings = [self.end(c) for c in children]
        await asyncio.shield(asyncio.gather(*endings, return_exceptions=True))
        self._opened.pop(parent.info.run_id, None)

    async def cancel(self, child_run_id: str) -> hpb.RunInfo:
        """CancelRun on a child: it ends cancelled, which its call's last reply tells the runner; the parent goes on
        (the runner sees its subagent fail)."""
        child = self._by_id[child_run_id]
        self.manager._set_outcome(child.st, "cancelled", "cancelled", "cancelled by request")
        if not child.stop.done():
            child.stop.set_result(None)
        await asyncio.shield(self.end(child))
        return self.manager.runs.get(child_run_id) or child.st.info
