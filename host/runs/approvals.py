"""Human approval of tool calls: the requests runners hold open, and the decisions people give.

A runner asks through the run API (`RequestApproval`); the host, not the runner, records and streams the
`approval_requested` event into the run, so every client streaming the run sees it live and `runs events` keeps it.
The request waits until someone decides (`DecideApproval`, from the CLI, a chat adapter or a script), the timeout
passes, or the run ends; whichever comes first resolves it exactly once, and an `approval_resolved` event records
who decided and how. Only "approved" lets the tool run: a timeout, a cancelled run, a runner that stops waiting
all end as not approved.

Pending approvals live in memory only: they die with their run, and a host restart ends every run. Requests are
bounded per run and host-wide (limits.APPROVALS_*), so a plugin cannot pin host resources by asking.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from agenthost.host import limits
from agenthost.host.access.grants import ActiveRun
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2 as api
from agenthost.protos.text import UNSAFE_IN_A_LINE

OPTIONS = (pb.ApprovalOption(id="approve", label="Approve"), pb.ApprovalOption(id="deny", label="Deny"))
DECISIONS = {"approve": "approved", "deny": "denied"}
# Decided approvals remembered so a late second decision is told "already decided" rather than "unknown".
_RESOLVED_KEPT = 4096

# Emits one host event into a live run's stream; False when the run is no longer live.
Emit = Callable[[str, pb.RunEvent], bool]


def clean(text: str, limit: int) -> str:
    """Runner-written text shown to a person: one line, no control or bidi-override characters, capped."""
    text = UNSAFE_IN_A_LINE.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Pending:
    info: hpb.ApprovalInfo
    done: asyncio.Future[hpb.ApprovalInfo] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Approvals:
    """Owned by the Host; `emit` is RunManager.host_event, `run_ended` is called by RunManager when a run ends."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._pending: dict[str, _Pending] = {}
        self._by_run: dict[str, set[str]] = {}
        self._resolved: OrderedDict[str, hpb.ApprovalInfo] = OrderedDict()
        # approval id -> the credential that started its run (ActiveRun.origin), pending and remembered ones alike.
        self._origins: dict[str, str] = {}

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # ---- the runner's side ----

    def _validate(
        self, run: ActiveRun, request: api.ApprovalRequest, from_sandbox: bool
    ) -> tuple[pb.ApprovalRequested, float]:
        if not request.tool_name or len(request.tool_name) > 128 or UNSAFE_IN_A_LINE.search(request.tool_name):
            raise errors.InvalidArgument("tool_name must be 1-128 characters without control characters")
        if len(request.tool_call_id) > 256 or UNSAFE_IN_A_LINE.search(request.tool_call_id):
            raise errors.InvalidArgument("tool_call_id must be at most 256 characters without control characters")
        if len(request.arguments_json) > limits.APPROVAL_MAX_ARGUMENTS_BYTES:
            raise errors.ResourceExhausted(
                f"arguments_json is larger than APPROVAL_MAX_ARGUMENTS_BYTES = {limits.APPROVAL_MAX_ARGUMENTS_BYTES}"
            )
        shown_args = ""
        truncated = False
        if request.arguments_json:
            try:
                json.loads(request.arguments_json)
            except (ValueError, RecursionError):
                raise errors.InvalidArgument("arguments_json is not valid JSON") from None
            shown_args = request.arguments_json
            if len(shown_args) > limits.APPROVAL_SHOWN_ARGUMENTS_CHARS:
                shown_args, truncated = shown_args[: limits.APPROVAL_SHOWN_ARGUMENTS_CHARS], True
        timeout = request.timeout_seconds
        if math.isnan(timeout) or timeout < 0:
            raise errors.InvalidArgument("timeout_seconds must be 0 (the host default) or positive")
        timeout = min(timeout or limits.APPROVAL_DEFAULT_SECONDS, limits.APPROVAL_MAX_SECONDS)
        if run.deadline_at:
            # Waiting past the run's deadline would only hand the decision to a run that is already over.
            timeout = min(timeout, run.deadline_at - time.time())
        if timeout <= 0:
            raise errors.FailedPrecondition("the run has no time left to wait for an approval")
        if len(self._by_run.get(run.run_id, ())) >= limits.APPROVALS_MAX_PENDING_PER_RUN:
            raise errors.ResourceExhausted(
                f"this run already waits on APPROVALS_MAX_PENDING_PER_RUN = {limits.APPROVALS_MAX_PENDING_PER_RUN}"
                " approvals"
            )
        if (
            sum(1 for p in self._pending.values() if p.info.bot_id == run.bot_id)
            >= limits.APPROVALS_MAX_PENDING_PER_BOT
        ):
            raise errors.ResourceExhausted(
                f"this bot already waits on APPROVALS_MAX_PENDING_PER_BOT = {limits.APPROVALS_MAX_PENDING_PER_BOT}"
                " approvals"
            )
        if len(self._pending) >= limits.APPROVALS_MAX_PENDING:
            raise errors.ResourceExhausted(
                f"the host already holds APPROVALS_MAX_PENDING = {limits.APPROVALS_MAX_PENDING} pending approvals"
            )
        requested = pb.ApprovalRequested(
            approval_id=f"apr_{uuid.uuid4().hex}",
            tool_name=request.tool_name,
            summary=clean(request.summary, limits.APPROVAL_MAX_TEXT_CHARS),
            arguments_json=shown_args,
            arguments_truncated=truncated,
            reason=clean(request.reason, limits.APPROVAL_MAX_TEXT_CHARS),
            expires_at=time.time() + timeout,
            options=OPTIONS,
            tool_call_id=request.tool_call_id,
            from_sandbox=from_sandbox,
        )
        return requested, timeout

    async def request(
        self, run: ActiveRun, request: api.ApprovalRequest, *, from_sandbox: bool = False
    ) -> api.ApprovalDecision:
        """Holds the runner's call until the approval resolves; answers how. `from_sandbox`: the caller presented
        the run's tool token (pb.ApprovalRequested.from_sandbox)."""
        requested, timeout = self._validate(run, request, from_sandbox)
        info = hpb.ApprovalInfo(
            approval_id=requested.approval_id,
            run_id=run.run_id,
            bot_id=run.bot_id,
            conversation_id=run.conversation_id,
            created_at=time.time(),
            status="pending",
            request=requested,
        )
        pending = _Pending(info)
        self._pending[requested.approval_id] = pending
        self._by_run.setdefault(run.run_id, set()).add(requested.approval_id)
        self._origins[requested.approval_id] = run.origin
        if not self._emit(run.run_id, pb.RunEvent(approval_requested=requested)):
            self._forget(requested.approval_id)
            self._origins.pop(requested.approval_id, None)
            raise errors.FailedPrecondition(f"run {run.run_id} is no longer live")
        try:
            async with asyncio.timeout(timeout):
                resolved = await asyncio.shield(pending.done)
        except TimeoutError:
            self._resolve(requested.approval_id, "timeout", note=f"no decision within {round(timeout, 1):g}s")
            resolved = pending.done.result()
        except asyncio.CancelledError:
            # The runner hung up (its run was cancelled, its process died): nobody is left to act on a decision.
            self._resolve(requested.approval_id, "cancelled", note="the runner stopped waiting")
            raise
        r = resolved.resolved
        return api.ApprovalDecision(
            approval_id=r.approval_id,
            approved=r.outcome == "approved",
            outcome=r.outcome,
            decided_by=r.decided_by,
            note=r.note,
            timeout_seconds=timeout,
        )

    def run_ended(self, run_id: str) -> None:
        """The run is ending: its open approvals resolve as cancelled (recorded before the run's end)."""
        for approval_id in list(self._by_run.get(run_id, ())):
            self._resolve(approval_id, "cancelled", note="the run ended")

    # ---- the people's side (admin API; the caller's bot scope is checked by the servicer) ----

    def list(self, *, bot_ids: set[str] | None, run_id: str = "", origin: str | None = None) -> list[hpb.ApprovalInfo]:
        """Pending approvals, oldest first; bot_ids None = every bot, origin None = whoever started the run."""
        out = [
            p.info
            for p in self._pending.values()
            if (bot_ids is None or p.info.bot_id in bot_ids)
            and (not run_id or p.info.run_id == run_id)
            and (origin is None or self._origins.get(p.info.approval_id) == origin)
        ]
        return sorted(out, key=lambda i: i.created_at)

    def origin(self, approval_id: str) -> str | None:
        """Who started the run of a pending or remembered approval (ActiveRun.origin); None: unknown."""
        return self._origins.get(approval_id)

    def find(self, approval_id: str) -> hpb.ApprovalInfo | None:
        pending = self._pending.get(approval_id)
        return pending.info if pending is not None else self._resolved.get(approval_id)

    def decide(self, approval_id: str, decision: str, note: str, decided_by: str) -> hpb.ApprovalInfo:
        outcome = DECISIONS.get(decision)
        if outcome is None:
            raise errors.InvalidArgument(f"decision must be one of {sorted(DECISIONS)}, not {decision[:32]!r}")
        if len(note) > limits.APPROVAL_MAX_TEXT_CHARS:
            raise errors.InvalidArgument(f"note is longer than {limits.APPROVAL_MAX_TEXT_CHARS} characters")
        if approval_id not in self._pending:
            done = self._resolved.get(approval_id)
            if done is None:
                raise errors.NotFound(f"no approval {approval_id[:64]!r}")
            raise errors.FailedPrecondition(f"approval {approval_id} is already {done.status}")
        return self._resolve(
            approval_id, outcome, decided_by=decided_by, note=clean(note, limits.APPROVAL_MAX_TEXT_CHARS)
        )

    # ---- internals ----

    def _resolve(self, approval_id: str, outcome: str, *, decided_by: str = "", note: str = "") -> hpb.ApprovalInfo:
        pending = self._pending.get(approval_id)
        if pending is None:  # already resolved (a decision and the timeout in the same loop turn)
            done = self._resolved.get(approval_id)
            assert done is not None
            return done
        info = pending.info
        resolved = pb.ApprovalResolved(
            approval_id=approval_id, outcome=outcome, decided_by=decided_by, note=note, decided_at=time.time()
        )
        info.status = outcome
        info.resolved.CopyFrom(resolved)
        self._forget(approval_id)
        # Remembered without the request's text (up to ~6 KiB each): a late decision needs only who and what.
        self._resolved[approval_id] = hpb.ApprovalInfo(
            approval_id=approval_id, run_id=info.run_id, bot_id=info.bot_id, status=outcome, resolved=resolved
        )
        while len(self._resolved) > _RESOLVED_KEPT:
            self._origins.pop(self._resolved.popitem(last=False)[0], None)
        self._emit(info.run_id, pb.RunEvent(approval_resolved=resolved))
        if not pending.done.done():
            pending.done.set_result(info)
        return info

    def _forget(self, approval_id: str) -> None:
        pending = self._pending.pop(approval_id, None)
        if pending is None:
            return
        ids = self._by_run.get(pending.info.run_id)
        if ids is not None:
            ids.discard(approval_id)
            if not ids:
                del self._by_run[pending.info.run_id]
