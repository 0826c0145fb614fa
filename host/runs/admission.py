"""Admission: which recorded runs execute now, which wait in `queued`, and which new runs are refused."""

from __future__ import annotations

import contextlib
import random
import time
from collections import deque
from typing import NamedTuple, TypeVar

from agenthost.host import limits
from agenthost.host.runs.state import RunState
from agenthost.protos.errors import ResourceExhausted

_K = TypeVar("_K")


class Place(NamedTuple):
    """Where a run joined the queue: what it waits on ("host" or "conversation") and its 1-based place in that
    line (see hpb.RunQueued); `bots_waiting`: bots with runs waiting for a slot. A run given a slot at once
    never learns its place: it starts."""

    waiting_on: str
    position: int
    bots_waiting: int


class Admission:
    """Which recorded runs execute now and which wait, and which new runs are refused.

    At most limits.RUNS_MAX_ACTIVE runs execute at once. A run waits in `queued` until it is the oldest run of its
    conversation (they execute one at a time, in arrival order) and a slot is free; ready runs of different bots
    get the free slots round-robin, so a bot with a thousand queued runs delays a bot with one by at most one
    run per other bot. A waiting run is a RunState with its QueuedStart: no task, no RPC.

    The queue is bounded host-wide, per bot, per sender (credential) and per conversation, in runs and in the bytes
    of input it holds (host-wide, per bot, per sender): one tenant's backlog refuses that tenant only. A run
    past a bound is refused with ResourceExhausted carrying a retry hint (`retry_after_ms`), derived from how
    fast runs have been finishing. The refusal comes before anything is recorded, so a refused run leaves no
    trace but the client's error: it never existed.
    """

    def __init__(self) -> None:
        self.running = 0
        self.queued = 0  # admitted, not yet executing (including runs still being recorded)
        self.queued_input_bytes = 0
        self._queued_by_bot: dict[str, int] = {}
        self._queued_by_conversation: dict[tuple[str, str], int] = {}
        self._queued_by_sender: dict[str, int] = {}
        self._bytes_by_bot: dict[str, int] = {}
        self._bytes_by_sender: dict[str, int] = {}
        # Per (sender, end user it names): its chat users' (tg:<id>) or its end users' (<key>/<user>) runs and bytes.
        self._queued_by_user: dict[tuple[str, str], int] = {}
        self._bytes_by_user: dict[tuple[str, str], int] = {}
        # Per conversation, its recorded runs in arrival order; the head is executing or ready. Lists, not deques:
        # most lines hold one run, and a deque costs a 600-byte block from its first item (popping the head of a
        # list is O(n), and n is at most RUNS_MAX_QUEUED_PER_CONVERSATION).
        self._conversations: dict[tuple[str, str], list[RunState]] = {}
        # Per bot, the conversation heads waiting for a slot; the dict's order is the round-robin order.
        self._ready: dict[str, deque[RunState]] = {}
        self._ended: deque[tuple[float, float]] = deque(maxlen=512)  # (monotonic end, seconds it executed)

    def reserve(
        self,
        bot_id: str,
        conversation: tuple[str, str],
        input_bytes: int,
        sender: str,
        *,
        end_user: str = "",
        accepted: bool = False,
    ) -> None:
        """Counts a new run as queued, or refuses it. Called before the run is recorded; `release` undoes it.
        `sender`: the credential the message came with (the run's origin); "" for an admin credential, which is
        trusted (the operator's CLI, a benchmark) and has no sender share (its bots' shares still apply).
        `end_user`: the end user of that sender the message came from (a channel's chat user, a key's `user`), ""
        when it names none; one end user holds at most its share of its sender's (RUNS_MAX_QUEUED_PER_END_USER).
        `accepted`: a run a previous host already accepted (taken over at start), counted and never refused: its
        sender was told it is queued, and the bounds held when it was."""
        queued_conv = self._queued_by_conversation.get(conversation, 0)
        shared = bool(sender)
        queued_sender = self._queued_by_sender.get(sender, 0) if shared else 0
        bot_bytes = self._bytes_by_bot.get(bot_id, 0)
        sender_bytes = self._bytes_by_sender.get(sender, 0) if shared else 0
        user = (sender, end_user) if shared and end_user else None
        queued_user = self._queued_by_user.get(user, 0) if user else 0
        user_bytes = self._bytes_by_user.get(user, 0) if user else 0
        refusal = ""
        if accepted:
            pass
        elif self.queued >= limits.RUNS_MAX_QUEUED:
            refusal = f"the host has {self.queued} runs queued (RUNS_MAX_QUEUED = {limits.RUNS_MAX_QUEUED})"
            ahead = max(1, limits.RUNS_MAX_QUEUED // 10)
        elif self._queued_by_bot.get(bot_id, 0) >= limits.RUNS_MAX_QUEUED_PER_BOT:
            refusal = (
                f"this bot has {self._queued_by_bot[bot_id]} runs queued"
                f" (RUNS_MAX_QUEUED_PER_BOT = {limits.RUNS_MAX_QUEUED_PER_BOT})"
            )
            ahead = max(1, limits.RUNS_MAX_QUEUED_PER_BOT // 10)
        elif shared and queued_sender >= limits.RUNS_MAX_QUEUED_PER_SENDER:
            refusal = (
                f"sender {sender!r} has {queued_sender} runs queued"
                f" (RUNS_MAX_QUEUED_PER_SENDER = {limits.RUNS_MAX_QUEUED_PER_SENDER})"
            )
            ahead = max(1, queued_sender // 10)
        elif queued_user >= limits.RUNS_MAX_QUEUED_PER_END_USER:
            refusal = (
                f"you have {queued_user} messages waiting for this bot"
                f" (RUNS_MAX_QUEUED_PER_END_USER = {limits.RUNS_MAX_QUEUED_PER_END_USER}); wait for their answers"
            )
            ahead = max(1, queued_user // 10)
        elif queued_conv >= limits.RUNS_MAX_QUEUED_PER_CONVERSATION:
            refusal = (
                f"this conversation has {queued_conv} runs queued"
                f" (RUNS_MAX_QUEUED_PER_CONVERSATION = {limits.RUNS_MAX_QUEUED_PER_CONVERSATION})"
            )
            ahead = 0
        # A run alone in its scope is let in whatever its size (a message is already capped on its own), so a
        # scope's bytes cap never refuses the only run that could drain it.
        elif self.queued and self.queued_input_bytes + input_bytes > limits.RUNS_MAX_QUEUED_INPUT_BYTES:
            refusal = (
                f"queued runs hold {self.queued_input_bytes} bytes of input"
                f" (RUNS_MAX_QUEUED_INPUT_BYTES = {limits.RUNS_MAX_QUEUED_INPUT_BYTES})"
            )
            ahead = max(1, self.queued // 10)
        elif bot_bytes and bot_bytes + input_bytes > limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT:
            refusal = (
                f"this bot's queued runs hold {bot_bytes} bytes of input"
                f" (RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT = {limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_BOT})"
            )
            ahead = max(1, self._queued_by_bot.get(bot_id, 0) // 10)
        elif sender_bytes and sender_bytes + input_bytes > limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER:
            refusal = (
                f"queued runs of sender {sender!r} hold {sender_bytes} bytes of input"
                f" (RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER = {limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_SENDER})"
            )
            ahead = max(1, queued_sender // 10)
        elif user_bytes and user_bytes + input_bytes > limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_END_USER:
            refusal = (
                f"your messages waiting for this bot hold {user_bytes} bytes of input"
                f" (RUNS_MAX_QUEUED_INPUT_BYTES_PER_END_USER = {limits.RUNS_MAX_QUEUED_INPUT_BYTES_PER_END_USER});"
                " wait for their answers"
            )
            ahead = max(1, queued_user // 10)
        if refusal:
            hint = self.retry_after_ms(ahead)
            raise ResourceExhausted(
                f"run refused, the host is at capacity: {refusal}; retry in {hint} ms", retry_after_ms=hint
            )
        self.queued += 1
        self.queued_input_bytes += input_bytes
        _add(self._queued_by_bot, bot_id, 1)
        _add(self._queued_by_conversation, conversation, 1)
        _add(self._bytes_by_bot, bot_id, input_bytes)
        if shared:
            _add(self._queued_by_sender, sender, 1)
            _add(self._bytes_by_sender, sender, input_bytes)
        if user:
            _add(self._queued_by_user, user, 1)
            _add(self._bytes_by_user, user, input_bytes)

    def release(
        self, bot_id: str, conversation: tuple[str, str], input_bytes: int, sender: str, end_user: str = ""
    ) -> None:
        """A run leaves the queue: it starts, ends while queued, or was never recorded."""
        self.queued -= 1
        self.queued_input_bytes -= input_bytes
        _add(self._queued_by_bot, bot_id, -1)
        _add(self._queued_by_conversation, conversation, -1)
        _add(self._bytes_by_bot, bot_id, -input_bytes)
        if sender:
            _add(self._queued_by_sender, sender, -1)
            _add(self._bytes_by_sender, sender, -input_bytes)
            if end_user:
                _add(self._queued_by_user, (sender, end_user), -1)
                _add(self._bytes_by_user, (sender, end_user), -input_bytes)

    def retry_after_ms(self, ahead: int) -> int:
        """About how long until `ahead` runs have finished (0: until the oldest running run of a conversation
        has, taken as the recent mean run time), jittered by ±20% so refused clients do not all come back in
        the same instant. With nothing finished in the last minute the queue is not moving: the longest hint."""
        now = time.monotonic()
        recent = [(end, took) for end, took in self._ended if now - end < 60.0]
        if len(recent) < 2:
            ms = float(limits.RUNS_RETRY_MAX_MS)
        elif ahead == 0:
            ms = 1000.0 * sum(took for _, took in recent) / len(recent)
        else:
            rate = len(recent) / max(now - recent[0][0], 0.001)
            ms = 1000.0 * ahead / rate
        ms *= random.uniform(0.8, 1.2)
        return int(min(max(ms, limits.RUNS_RETRY_MIN_MS), limits.RUNS_RETRY_MAX_MS))

    def enqueue(self, st: RunState) -> Place:
        """A recorded run joins its conversation's line (and the ready line, if it is the head). Returns where it
        stands (O(1): a queued reply per send must not cost the length of the queue)."""
        key = (st.info.bot_id, st.info.conversation_id)
        line = self._conversations.setdefault(key, [])
        line.append(st)
        if len(line) > 1:
            return Place("conversation", len(line) - 1, 0)
        ready = self._ready.setdefault(st.info.bot_id, deque())
        ready.append(st)
        return Place("host", len(ready), len(self._ready))

    def next_to_start(self) -> RunState | None:
        """The next ready run if a slot is free (the slot is taken), round-robin over bots; else None."""
        if self.running >= limits.RUNS_MAX_ACTIVE or not self._ready:
            return None
        bot_id = next(iter(self._ready))
        line = self._ready.pop(bot_id)
        st = line.popleft()
        if line:
            self._ready[bot_id] = line  # to the back of the round
        self.running += 1
        return st

    def ended(self, st: RunState, started: float | None) -> None:
        """A run left its conversation's line: it executed (`started`: its monotonic start) or ended queued
        (`remove` first). The next run of the conversation becomes ready."""
        if started is not None:
            self.running -= 1
            self._ended.append((time.monotonic(), time.monotonic() - started))
        key = (st.info.bot_id, st.info.conversation_id)
        line = self._conversations.get(key)
        if not line:
            return
        if line[0] is st:
            del line[0]
            if line:
                self._ready.setdefault(line[0].info.bot_id, deque()).append(line[0])
        else:
            with contextlib.suppress(ValueError):
                line.remove(st)
        if not line:
            del self._conversations[key]

    def remove(self, st: RunState) -> None:
        """A queued run ends before it started (cancelled, host stopping): out of every line."""
        ready = self._ready.get(st.info.bot_id)
        if ready is not None:
            with contextlib.suppress(ValueError):
                ready.remove(st)
            if not ready:
                del self._ready[st.info.bot_id]
        self.ended(st, None)


def end_user_of(share: str, actor_id: str) -> str:
    """The end user a sender's message came from, for its share (reserve): the actor it is recorded under, unless
    that is the sender itself (a key or channel naming no end user) or the sender has no share (admin)."""
    return actor_id if share and actor_id != share else ""


def _add(counts: dict[_K, int], key: _K, delta: int) -> None:
    """Adds to a per-scope count; a scope back at zero leaves the dict (a finished tenant costs nothing)."""
    left = counts.get(key, 0) + delta
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)
