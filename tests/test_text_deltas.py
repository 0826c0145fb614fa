"""The host's fast path for batches of plain text deltas (host/store/text_deltas.py) against the general path it
stands in for: for any runner message, it either declines or gives exactly the events, seq numbers, created_at and
texts the general path would; it takes every batch the runner SDK makes of yielded `str` deltas (else streaming silently
loses its speed); and it declines anything a hostile runner could hide behind a text delta."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.host.store import text_deltas
from agenthost.protos import common_pb2 as pb
from agenthost.protos.wire import MAX_BATCH, SHORT_TEXT_BYTES, batch_entry
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk import server as sdk_server

CREATED_AT = 1_790_000_000.25


def _general(data: bytes, first_seq: int) -> list[pb.RunEvent] | None:
    """What the host's general path makes of `data`: None where it does not parse."""
    try:
        batch = pb.RunEventBatch.FromString(data)
    except DecodeError:
        return None
    for seq, event in enumerate(batch.events, start=first_seq):
        event.seq = seq
        event.created_at = CREATED_AT
    return list(batch.events)


def _plain_short_delta(entry: bytes) -> bool:
    """Whether an encoded event is exactly RunEvent{text_delta{text}} with 1-123 bytes of UTF-8: the fast path's
    condition, stated the slow way."""
    try:
        event = pb.RunEvent.FromString(entry)
    except DecodeError:
        return False
    if event.WhichOneof("kind") != "text_delta" or event.seq or event.created_at:
        return False
    text = event.text_delta.text.encode()
    return 1 <= len(text) <= SHORT_TEXT_BYTES and entry == events.text(event.text_delta.text).SerializeToString()


def _framed(data: bytes) -> bytes:
    return bytes((0x0A, len(data))) + data


# Encoded events: what the SDK sends, what other encoders may, and what a hostile runner could try.
_texts = st.text(max_size=140) | st.sampled_from(["é", "日本語", "🙂" * 31, "x" * 123, "x" * 124])
_sdk_event = _texts.map(lambda s: events.text(s).SerializeToString())
_other_event = st.sampled_from(
    [
        events.usage(3, 4, model="m").SerializeToString(),
        events.tool_started("c1", "lookup", {"q": 1}).SerializeToString(),
        events.completed().SerializeToString(),
        pb.RunEvent(approval_requested=pb.ApprovalRequested(tool_call_id="c")).SerializeToString(),
        pb.RunEvent(seq=7, text_delta=pb.TextDelta(text="numbered by the runner")).SerializeToString(),
        b"",  # an empty event
    ]
)
_tampered = st.one_of(
    # A text delta followed by another member of the oneof: a parser keeps the last, `completed`.
    _texts.map(lambda s: events.text(s).SerializeToString() + events.completed().SerializeToString()),
    # An unknown field inside the TextDelta, and one after it in the event.
    _texts.map(lambda s: _framed(_framed(s.encode()[:100]) + b"\x10\x01")),
    _texts.map(lambda s: events.text(s).SerializeToString() + b"\x98\x06\x01"),
    st.binary(min_size=1, max_size=8).map(lambda b: bytes((0x0A, len(b) + 2, 0x0A, len(b))) + b),  # any bytes
    st.binary(max_size=12),  # not an event at all
)
_event = st.one_of(_sdk_event, _sdk_event, _sdk_event, _other_event, _tampered)


@settings(max_examples=400, deadline=None)
@given(
    entries=st.lists(_event, min_size=1, max_size=MAX_BATCH + 4),
    first_seq=st.sampled_from([1, 2, 127, 128, 129, 16_383, 16_384, 2_097_151, 2**40]) | st.integers(1, 10**7),
)
def test_the_fast_path_numbers_exactly_what_the_general_path_would_or_declines(
    entries: list[bytes], first_seq: int
) -> None:
    data = b"".join(batch_entry(e) for e in entries)
    fast = text_deltas.number(data, first_seq, CREATED_AT)
    general = _general(data, first_seq)
    qualifies = len(entries) <= MAX_BATCH and all(_plain_short_delta(e) for e in entries)
    assert (fast is not None) == qualifies
    if fast is None:
        return
    assert general is not None
    assert list(pb.RunEventBatch.FromString(fast.batch).events) == general
    assert fast.text == "".join(e.text_delta.text for e in general)
    assert fast.count == len(general)
    assert fast.first_seq == first_seq


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=MAX_BATCH))
def test_every_batch_the_sdk_makes_of_yielded_strings_takes_the_fast_path(texts: list[str]) -> None:
    data = b"".join(sdk_server._text_entry(t) for t in texts)
    fast = text_deltas.number(data, 1, CREATED_AT)
    assert fast is not None
    assert fast.text == "".join(texts) and fast.count == len(texts)
    assert list(pb.RunEventBatch.FromString(data).events) == [events.text(t) for t in texts]


def test_a_character_split_across_deltas_is_refused_by_both_paths() -> None:
    # Each delta must be valid UTF-8 on its own, as a parser requires of a string field; the two halves of "é"
    # joined would be valid, and the fast path must not accept them just because the joined text would decode.
    halves = [bytes((0x0A, 5, 0x0A, 3, 0x0A, 1, b)) for b in "é".encode()]
    data = b"".join(halves)
    assert text_deltas.number(data, 1, CREATED_AT) is None
    with pytest.raises(DecodeError):
        pb.RunEventBatch.FromString(data)


def test_bytes_between_the_entries_cannot_make_a_split_character_whole() -> None:
    # The fast path checks UTF-8 over the whole batch at once, which holds only when nothing but the entries'
    # ASCII framing sits between the texts. An unknown batch field whose tag is a UTF-8 continuation byte (0xA9,
    # field 21, fixed64) after a text ending in a lead byte (0xC3) would decode as "é" if it were let in.
    first = bytes((0x0A, 6, 0x0A, 4, 0x0A, 2)) + b"a\xc3"
    unknown = b"\xa9\x01" + b"12345678"
    data = batch_entry(first) + unknown + sdk_server._text_entry("b")
    data.decode()  # as a whole it is valid UTF-8
    with pytest.raises(DecodeError):
        pb.RunEventBatch.FromString(data)
    assert text_deltas.number(data, 1, CREATED_AT) is None


def test_the_largest_qualifying_batch_takes_the_fast_path_and_one_delta_more_does_not() -> None:
    # MAX_BATCH deltas of SHORT_TEXT_BYTES each: the size guard that skips big messages must not reach it.
    longest = "é" * (SHORT_TEXT_BYTES // 2) + "x"
    data = b"".join(sdk_server._text_entry(longest) for _ in range(MAX_BATCH))
    fast = text_deltas.number(data, 1, CREATED_AT)
    assert fast is not None and fast.text == longest * MAX_BATCH and fast.count == MAX_BATCH
    assert text_deltas.number(data + sdk_server._text_entry("x"), 1, CREATED_AT) is None


class _Recording:
    """Stands in for the SDK's event channel: keeps every framed event the run loop pushes."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def push(self, item: object) -> bool:
        self.items.append(item)
        return False

    async def full(self) -> None:
        pass

    async def put(self, item: object) -> None:
        self.items.append(item)


@pytest.mark.parametrize("terminal", [events.completed(), events.failed("x", "y")])
async def test_event_objects_are_framed_as_their_str_twins_and_a_short_terminal_still_ends_the_run(
    terminal: pb.RunEvent,
) -> None:
    """The SDK's fast path for text deltas made as objects (events.text): the same bytes as a yielded `str` of the
    same text, the general encoding for anything else (empty, long, a runner-set field), and a short event of
    another kind, such as a terminal one of a few bytes, is still looked at: the run ends there."""
    texts = ["a", "é" * 61 + "x", "x" * SHORT_TEXT_BYTES, "x" * (SHORT_TEXT_BYTES + 1), "", "x" * 300]
    odd = pb.RunEvent(seq=7, text_delta=pb.TextDelta(text="seq set by the runner"))
    sent = [*(events.text(t) for t in texts), odd, terminal, events.text("after the end")]

    class Objects(Runner):
        manifest = RunnerManifest(name="objects")

        async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
            for event in sent:
                yield event

    channel = _Recording()
    await sdk_server._drive(Objects(Path("/nonexistent")), None, channel)  # type: ignore[arg-type]
    assert channel.items[-1] is sdk_server._END
    framed = channel.items[:-1]
    assert framed == [batch_entry(e.SerializeToString()) for e in [*sent[:-1]]]
    assert framed[:4] == [sdk_server._text_entry(t) for t in texts[:4]]
