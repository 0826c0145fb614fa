"""The streaming fast path for the commonest runner message: a batch of nothing but short text deltas.

The host numbers each event it streams (seq, created_at) and keeps the text for the transcript. Done through upb
objects that is a wrapper per event and four field accesses from Python, which was the largest share of the host's
CPU per streamed delta. Here a qualifying batch is read, checked, numbered and re-encoded with a few C-level maps,
slices and joins over the encoded events instead, and what comes out is bytes that clients and the database take
as they are.

A batch qualifies when it holds at most wire.MAX_BATCH events and every one is exactly
`RunEvent{text_delta: TextDelta{text: s}}` with 1 to wire.SHORT_TEXT_BYTES (123) bytes of valid UTF-8 in `s`:
what the runner SDK sends for a yielded `str`, and what any protobuf encoder makes of such an event. Anything else
(another kind, a field more, a longer text, an encoder that writes the same event another way) takes the general
path, which reads every event. Both give clients and the database the same events
(tests/test_text_deltas.py holds them to it)."""

from __future__ import annotations

import struct
from itertools import repeat
from operator import add, itemgetter
from typing import NamedTuple

from google.protobuf.message import DecodeError

from agenthost.protos import common_pb2 as pb
from agenthost.protos.wire import MAX_BATCH, SHORT_TEXT_BYTES, SHORT_TEXT_HEADS, varint

# A short text delta `0A <n+2> 0A <n> <text>` (wire.SHORT_TEXT_BYTES) is n + 4 bytes long: the first four bytes it
# must have, by its length; None where n is out of range (0, or too long for one-byte lengths).
_LONGEST = SHORT_TEXT_BYTES + 4
# Where n is out of range, a prefix longer than any such event, which no event of that length starts with.
_NEVER = b"\xff" * 8
_HEAD: list[bytes] = [_NEVER] * 5 + SHORT_TEXT_HEADS[1:]
_text = itemgetter(slice(4, None))

# RunEvent.seq (field 20, varint) and RunEvent.created_at (field 21, fixed64 double), appended to each event: a
# field's position does not matter to a parser. seq < 128 is one varint byte; above, its low seven bits with the
# continuation bit, then the varint of the rest (shared by 128 consecutive numbers).
_SEQ_TAG = b"\xa0\x01"
_SMALL_SEQ = [_SEQ_TAG + bytes((n,)) for n in range(128)]
_LOW_SEQ = [_SEQ_TAG + bytes((n | 0x80,)) for n in range(128)]
_CREATED_AT_TAG = b"\xa9\x01"
# RunEventBatch.events (field 1, length-delimited) with the entry's length, by the length of the event and its seq
# field together (at most _LONGEST + 12): the created_at field's 10 bytes are counted in.
_ENTRY_OF_EVENT_AND_SEQ = [b"\x0a" + varint(n) for n in range(10, 10 + 256)]
# No qualifying batch is longer: each entry is its 2-byte framing and at most _LONGEST bytes of event.
_LARGEST_BATCH = MAX_BATCH * (2 + _LONGEST)


class TextDeltas(NamedTuple):
    """A runner's batch of plain text deltas, numbered: what the host publishes and stores instead of objects."""

    count: int  # events
    text: str  # their texts, joined: all the host keeps of them beside the batch (the run's text)
    batch: bytes  # the numbered events, a serialized RunEventBatch
    first_seq: int


def _seq_fields(first: int, count: int) -> list[bytes]:
    """The encoded seq field of each of `count` consecutive numbers from `first`."""
    out: list[bytes] = []
    seq, end = first, first + count
    while seq < end:
        high, low = divmod(seq, 128)
        stop = min(end, (high + 1) * 128)
        if high == 0:
            out += _SMALL_SEQ[low:stop]
        else:
            out += map(add, _LOW_SEQ[low : low + stop - seq], repeat(varint(high)))
        seq = stop
    return out


def number(data: bytes, first_seq: int, created_at: float) -> TextDeltas | None:
    """`data`, a runner's serialized RunEventBatch, numbered from `first_seq` at `created_at` when it qualifies
    (see the module's docstring); None when it does not, and the caller reads it the general way. Called by
    RunManager for each message off a runner's Run stream."""
    if len(data) > _LARGEST_BATCH:  # a tool result, a flood: not worth a copy of every event to find out
        return None
    try:
        events = list(pb.EncodedRunEventBatch.FromString(data).events)
    except DecodeError:
        return None
    if not events or len(events) > MAX_BATCH:
        return None
    lengths = list(map(len, events))
    # The batch must be its entries and nothing else (no unknown field between them, no length written long):
    # the UTF-8 check below reads it whole.
    if sum(lengths) + 2 * len(events) != len(data):
        return None
    if max(lengths) > _LONGEST or not all(map(bytes.startswith, events, map(_HEAD.__getitem__, lengths))):
        return None
    # Each text must be valid UTF-8 on its own, as a parser checks a string field. Every byte around the texts is
    # below 0x80 (a tag, or a length under 128), and no UTF-8 sequence spans such a byte, so the
    # batch decodes as a whole exactly when each text does: one check instead of one per event (none when ASCII).
    if not data.isascii():
        try:
            data.decode()
        except UnicodeDecodeError:
            return None
    text = b"".join(map(_text, events)).decode()
    # Each entry is four pieces: its framing, the event as the runner sent it, its seq, its created_at (the same
    # ten bytes for all). Filled in by slice assignment, the cheapest interleave in CPython.
    seqs = _seq_fields(first_seq, len(events))
    pieces = [_CREATED_AT_TAG + struct.pack("<d", created_at)] * (4 * len(events))
    pieces[0::4] = list(map(_ENTRY_OF_EVENT_AND_SEQ.__getitem__, map(add, lengths, map(len, seqs))))
    pieces[1::4] = events
    pieces[2::4] = seqs
    return TextDeltas(len(events), text, b"".join(pieces), first_seq)
