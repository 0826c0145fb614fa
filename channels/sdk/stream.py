"""A run's replies delivered to a platform: streamed by editing a message where the platform can, split into
several messages when the text outgrows one, and sent whole (in pieces) where it cannot edit.

A platform adapter implements `ReplySink` (send a message, edit one, send a one-line notice, and optionally render
the run's other events: artifacts, approval requests, anything a newer host sends); `deliver` drives it from the
host's SendMessage stream. Pacing is the sink's business (see throttle.Pacer): `ReplyStream` only asks for an
update when the text changed and the last one finished, so a slow platform gets fewer, larger edits rather than a
queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from agenthost.channels.sdk.text import one_line, split_text
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import accepted_run

log = logging.getLogger(__name__)
# The run's bookkeeping: the SDK handles the end itself and no chat has a use for the rest (a subagent's work
# shows in its final answer). Every other kind goes to the adapter's sink, which renders it or says it cannot.
NOT_FOR_CHATS = frozenset(
    {"completed", "failed", "usage", "retry", "compaction", "state_updated", "subagent_started", "subagent_finished"}
)


class ReplySink(Protocol):
    """One reply's destination on the platform (a chat, a thread)."""

    max_chars: int  # the most text one platform message holds
    can_edit: bool

    async def send_text(self, text: str) -> Any:
        """Sends a new message; returns a handle `edit_text` understands."""

    async def edit_text(self, handle: Any, text: str) -> None:
        """Replaces the text of a message this sink sent."""

    async def notice(self, line: str) -> None:
        """Shows the user a one-line notice (an error, a refusal)."""

    async def event(self, event: pb.RunEvent) -> None:
        """Any run event other than text: ArtifactCreated (send the file), and kinds this SDK does not know yet
        (approval requests, say) — render them generically or ignore them; never fail on them."""


class ReplyStream:
    """The text of one reply as it grows, mirrored onto the platform as messages."""

    def __init__(self, sink: ReplySink, *, streaming: bool = True) -> None:
        self.sink = sink
        self.streaming = streaming and sink.can_edit
        self.text = ""
        self._sent: list[tuple[Any, str]] = []  # (handle, text shown) per platform message, in order
        self._dirty = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def append(self, delta: str) -> None:
        self.text += delta
        if self.streaming:
            self._dirty.set()
            if self._flusher is None:
                self._flusher = asyncio.create_task(self._flush_loop())

    def replace(self, text: str) -> None:
        """A whole message superseded the deltas so far (the host's `message` event)."""
        self.text = text
        if self.streaming:
            self.append("")

    async def _flush_loop(self) -> None:
        while not self._closed:
            await self._dirty.wait()
            self._dirty.clear()
            if self._closed:
                return
            await self._sync(self.text, final=False)

    async def _sync(self, text: str, *, final: bool) -> None:
        """Makes the platform show `text`: edits the messages whose piece changed, sends the missing ones. While
        streaming, the last piece is shown as it grows; earlier pieces are settled (split_text is prefix-stable)."""
        pieces = split_text(text, self.sink.max_chars) if text else []
        for i, piece in enumerate(pieces):
            if not piece.strip():
                continue
            if i < len(self._sent):
                handle, shown = self._sent[i]
                if shown != piece:
                    await self.sink.edit_text(handle, piece)
                    self._sent[i] = (handle, piece)
            else:
                handle = await self.sink.send_text(piece)
                self._sent.append((handle, piece))
        if final and len(self._sent) > len(pieces):
            # The final text is shorter than what was streamed (a `message` replaced the deltas): empty the rest.
            for i in range(len(pieces), len(self._sent)):
                handle, shown = self._sent[i]
                if shown != "…":
                    await self.sink.edit_text(handle, "…")
                    self._sent[i] = (handle, "…")

    async def finish(self, final_text: str | None = None) -> None:
        """Shows the final text (the run's, when given: it is what the host recorded) and stops streaming."""
        self._closed = True
        self._dirty.set()
        if self._flusher is not None:
            for outcome in await asyncio.gather(self._flusher, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.warning("a streamed update failed (the final text is sent anyway): %r", outcome)
        if final_text is not None:
            self.text = final_text
        await self._sync(self.text, final=True)

    async def abort(self) -> None:
        self._closed = True
        self._dirty.set()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)


def refusal_line(error: errors.AgentHostError) -> str:
    """What a user is told when the host refused a message (nothing was run)."""
    if isinstance(error, errors.ResourceExhausted):
        if error.retry_after_ms > 0:
            return f"⚠️ The bot is busy right now; please try again in {max(1, round(error.retry_after_ms / 1000))} s."
        return "⚠️ The bot is busy right now; please try again in a little while."
    if isinstance(error, errors.FailedPrecondition):
        return "⚠️ The bot is not available right now."
    if isinstance(error, errors.InvalidArgument):
        return f"⚠️ The message was refused: {one_line(error.message, 200)}"
    if isinstance(error, errors.PermissionDenied):  # the host's wall: a conversation this channel did not start
        return "⚠️ This conversation was started elsewhere and cannot be continued here; please start a new one."
    return f"⚠️ The message could not be delivered ({type(error).__name__})."


def failure_line(run: hpb.RunInfo) -> str:
    if run.status == "timed_out":
        return "⚠️ The bot took too long and was stopped."
    if run.status == "cancelled":
        return "⚠️ The reply was cancelled."
    if run.status == "interrupted":
        return "⚠️ The reply was interrupted (the host restarted); please send it again."
    reason = one_line(run.error_message or run.error_code or "unknown error", 200)
    return f"⚠️ The bot failed: {reason}"


async def deliver(
    replies: AsyncIterator[hpb.SendMessageReply],
    sink: ReplySink,
    *,
    streaming: bool = True,
    on_started: Any = None,
) -> hpb.RunInfo | None:
    """Drives `sink` from one SendMessage stream. `on_started(run)` is awaited when the host accepted the message
    and created its run (persist "delivered to the host" there). Returns the finished run, or None when the host
    refused the message (the user was told in one line)."""
    stream = ReplyStream(sink, streaming=streaming)
    run: hpb.RunInfo | None = None
    started = False
    try:
        async for reply in replies:
            kind = reply.WhichOneof("kind")
            if kind in ("queued", "run_started"):
                # The first of these says the host recorded the message (a queued run starts later by itself).
                if not started and on_started is not None:
                    await on_started(accepted_run(reply))
                started = True
            elif kind == "events":
                for event in reply.events.events:
                    which = event.WhichOneof("kind")
                    if which == "text_delta":
                        stream.append(event.text_delta.text)
                    elif which == "message":
                        if event.message.role in ("", "assistant"):
                            stream.replace(event.message.text)
                    elif which in NOT_FOR_CHATS:
                        continue
                    else:
                        try:
                            await sink.event(event)
                        except Exception:  # noqa: BLE001 — one unrenderable event must not lose the reply
                            log.exception("could not render a %s event", which)
            elif kind == "run_finished":
                run = reply.run_finished
    except errors.AgentHostError as exc:
        await stream.abort()
        if not started:
            await sink.notice(refusal_line(exc))
            return None
        await stream.finish()
        await sink.notice(f"⚠️ The reply was cut off: {one_line(exc.message, 200)}")
        return run
    if run is None:
        await stream.finish()
        await sink.notice("⚠️ The host ended the reply before the run finished.")
        return None
    await stream.finish(run.text if run.text else None)
    if run.status != "completed":
        await sink.notice(failure_line(run))
    return run
