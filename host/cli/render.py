"""A run's stream rendered for a terminal: what `agenthost send`, `agenthost chat` and `agenthost demo` print."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agenthost.host.api.client import HostClient
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.text import call_arguments, ident, terminal_safe


class Printer:
    """Renders a run's stream for a terminal: text as it arrives, tools and notes on their own lines."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout
        self.mid_line = False

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.write(terminal_safe(text) + "\n")

    def event(self, ev: pb.RunEvent) -> None:
        kind = ev.WhichOneof("kind")
        if kind == "text_delta":
            self.out.write(terminal_safe(ev.text_delta.text))
            self.mid_line = not ev.text_delta.text.endswith("\n")
        elif kind == "tool_started":
            started = ev.tool_started
            self._line(f"  ⚙ {ident(started.tool_name)}({ident(started.arguments_json[:200])})")
        elif kind == "tool_finished":
            mark = "✗" if ev.tool_finished.is_error else "✓"
            self._line(f"  {mark} {ev.tool_finished.result[:300].replace(chr(10), ' ')}")
        elif kind == "retry":
            self._line(f"  … retry {ev.retry.attempt} in {ev.retry.delay_seconds:.1f}s: {ev.retry.reason}")
        elif kind == "compaction":
            self._line(f"  … compacted context {ev.compaction.tokens_before} → {ev.compaction.tokens_after} tokens")
        elif kind == "progress":
            self._line(f"  … {ev.progress.message}")
        elif kind == "approval_requested":
            self._line(approval_line(ev.approval_requested))
        elif kind == "approval_resolved":
            r = ev.approval_resolved
            who = f" by {r.decided_by}" if r.decided_by else ""
            note = f": {r.note}" if r.note else ""
            self._line(f"  {'✓' if r.outcome == 'approved' else '✗'} approval {r.outcome}{who}{note}")
        self.out.flush()

    def queued(self, q: hpb.RunQueued) -> None:
        """A run waiting its turn: said at once, so a person knows the host took the message and why nothing comes."""
        if q.waiting_on == "conversation":
            why = f"behind earlier runs of this conversation (position {q.position})"
        else:
            others = f"; {q.bots_waiting - 1} other bots waiting take turns" if q.bots_waiting > 1 else ""
            why = f"every host slot is busy (position {q.position} among this bot's waiting runs{others})"
        self._line(f"[run {q.run.run_id} queued: {why}]")
        self.out.flush()

    def started(self, run: hpb.RunInfo, waited: bool) -> None:
        if waited:  # only after a `queued` line: an immediate start needs no line of its own
            self._line(f"[run {run.run_id} started]")
            self.out.flush()

    def finished(self, run: hpb.RunInfo, streamed_text: bool) -> None:
        if not streamed_text and run.text:
            self._line(run.text)
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        if run.status != "completed":
            self._line(f"[run {run.run_id} {run.status}: {run.error_code} {run.error_message}]")


def approval_line(req: pb.ApprovalRequested) -> str:
    """An approval request for a terminal. Summary and reason were written by the runner; the host has already
    stripped their control characters and capped them."""
    left = max(0, int(req.expires_at - time.time()))
    arguments = call_arguments(req.arguments_json, req.arguments_truncated, ARGUMENTS_CHARS)
    return (
        f"  ? approval needed for {ident(req.tool_name)}: {req.summary}\n"
        + (f"    arguments: {arguments}\n" if req.arguments_json else "")
        + (f"    ! {SANDBOX_LABEL}\n" if req.from_sandbox else "")
        + f"    why: {req.reason or '-'}; expires in {left}s\n"
        f"    agenthost approvals approve {req.approval_id}   (or: deny)"
    )


# The arguments shown under an approval request's summary (the host keeps a few KiB of them).
ARGUMENTS_CHARS = 4000

# What a person is told of a request marked from_sandbox (the Telegram adapter and the web console say the same).
SANDBOX_LABEL = (
    "asked from inside the run's sandbox (the agent's harness, or a command the model ran): nobody has checked "
    "this text"
)


# Called for each approval request while the stream is read (e.g. `chat` asks y/n); None only prints it.
AskApproval = Callable[[pb.ApprovalRequested], Awaitable[None]]


async def stream_reply(
    client: HostClient, request: hpb.SendMessageRequest, *, ask: AskApproval | None = None
) -> hpb.RunInfo:
    """Streams one message's run to the terminal and returns how it finished. Used by `send`, `chat` and the demo."""
    printer = Printer()
    streamed = False
    finished: hpb.RunInfo | None = None
    waited = False
    async for reply in client.stream(request):
        kind = reply.WhichOneof("kind")
        if kind == "queued":
            waited = True
            printer.queued(reply.queued)
        elif kind == "run_started":
            printer.started(reply.run_started, waited)
        elif kind == "events":
            for ev in reply.events.events:
                streamed |= ev.WhichOneof("kind") == "text_delta"
                printer.event(ev)
                if ask is not None and ev.WhichOneof("kind") == "approval_requested":
                    await ask(ev.approval_requested)
        elif kind == "run_finished":
            finished = reply.run_finished
    if finished is None:
        raise errors.Unavailable("the host ended the stream before the run finished")
    printer.finished(finished, streamed)
    return finished
