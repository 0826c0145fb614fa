"""What a run's subscribers (clients streaming SendMessage) receive: replies that pile up while a client is busy,
merged into as few gRPC messages as fit, and bounded so a slow client is dropped instead of holding the run."""

from __future__ import annotations

import asyncio

from agenthost.host import limits
from agenthost.host.store.text_deltas import TextDeltas
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.errors import AgentHostError, ResourceExhausted
from agenthost.protos.wire import MAX_BATCH as MAX_CLIENT_BATCH
from agenthost.protos.wire import events_reply

Published = hpb.SendMessageReply | TextDeltas | None  # None: the run's stream ends


class Inbox:
    """One subscriber's replies. `take` hands over everything that piled up, with consecutive event batches
    merged into one reply (up to MAX_CLIENT_BATCH events and limits.CLIENT_BATCH_BYTES): under load the client
    hop costs one gRPC message per burst, not per runner batch, and never one message too large to send. Text
    deltas numbered as bytes (TextDeltas) merge by concatenation, with each other only.

    Bounded: a subscriber that falls limits.INBOX_MAX_BYTES (or INBOX_MAX_REPLIES) behind is dropped, its
    backlog freed, and its next `take` raises ResourceExhausted. The run never waits for a subscriber."""

    def __init__(self, run_id: str = "") -> None:
        self._run_id = run_id
        self._items: list[tuple[Published, int]] = []
        self._bytes = 0
        # The one taker's wait, made only while it waits: an asyncio.Event would hold a deque (~700 bytes) for
        # every subscriber, and a queued run's subscriber waits for minutes.
        self._waiter: asyncio.Future[None] | None = None
        self.dropped: str = ""
        self.error: AgentHostError | None = None  # the stream ends with this error, after what piled up

    def put(self, reply: Published, size: int = 0) -> None:
        if self.dropped:
            return
        self._items.append((reply, size))
        self._bytes += size
        if self._bytes > limits.INBOX_MAX_BYTES or len(self._items) > limits.INBOX_MAX_REPLIES:
            self.dropped = (
                f"this client fell behind run {self._run_id} by more than INBOX_MAX_BYTES ="
                f" {limits.INBOX_MAX_BYTES} bytes or INBOX_MAX_REPLIES = {limits.INBOX_MAX_REPLIES} replies and"
                " was dropped; the run goes on (read its events with `agenthost runs events`)"
            )
            self._items.clear()
            self._bytes = 0
        self._wake()

    def end_with(self, error: AgentHostError) -> None:
        """Ends the stream with `error` once what piled up is taken (the run goes on without this subscriber)."""
        self.error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self, *, encoded: bool = False) -> list[hpb.SendMessageReply | bytes | None]:
        """What piled up since the last take, merged. `encoded`: event batches that arrived as bytes stay bytes
        (a serialized SendMessageReply, for a gRPC stream to send as it is); otherwise every reply is an object."""
        while not self._items and not self.dropped and self.error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.dropped:
            raise ResourceExhausted(self.dropped)
        if not self._items and self.error is not None:
            raise self.error
        items, self._items, self._bytes = self._items, [], 0
        out: list[hpb.SendMessageReply | bytes | None] = []
        merged = 0  # bytes in out[-1] when it is an event batch
        private = False  # whether out[-1] is our own copy (published replies are shared by subscribers)
        batches: list[bytes] = []  # consecutive TextDeltas not yet in `out`
        count = 0  # their events
        for reply, size in items:
            if isinstance(reply, TextDeltas):
                full = count + reply.count > MAX_CLIENT_BATCH or merged + size > limits.CLIENT_BATCH_BYTES
                if batches and full:
                    out.append(_events_reply(batches, encoded))
                if not batches or full:
                    batches, count, merged = [], 0, 0
                batches.append(reply.batch)
                count += reply.count
                merged += size
                continue
            if batches:
                out.append(_events_reply(batches, encoded))
                batches, count, private = [], 0, True
            last = out[-1] if out else None
            if (
                reply is not None
                and reply.HasField("events")
                and isinstance(last, hpb.SendMessageReply)
                and last.HasField("events")
                and len(last.events.events) + len(reply.events.events) <= MAX_CLIENT_BATCH
                and merged + size <= limits.CLIENT_BATCH_BYTES
            ):
                if not private:
                    last = out[-1] = hpb.SendMessageReply(events=pb.RunEventBatch(events=last.events.events))
                    private = True
                last.events.events.extend(reply.events.events)
                merged += size
            else:
                out.append(reply)
                merged = size
                private = False
        if batches:
            out.append(_events_reply(batches, encoded))
        return out


def _events_reply(batches: list[bytes], encoded: bool) -> hpb.SendMessageReply | bytes:
    batch = b"".join(batches)
    if encoded:
        return events_reply(batch)
    return hpb.SendMessageReply(events=pb.RunEventBatch.FromString(batch))


def split_events(events: list[pb.RunEvent], sizes: list[int]) -> list[list[pb.RunEvent]]:
    """Events cut into runs of at most limits.CLIENT_BATCH_BYTES (an event larger than that travels alone)."""
    out: list[list[pb.RunEvent]] = [[]]
    size = 0
    for event, n in zip(events, sizes, strict=True):
        if out[-1] and size + n > limits.CLIENT_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(event)
        size += n
    return out
