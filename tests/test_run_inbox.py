"""A subscriber's inbox (host/runs/inbox.py) merges what piled up into few replies: events as objects and text deltas
numbered as bytes, in any order. Whatever the mix, the client gets every event once, in order, each reply within
the caps, and the bytes a gRPC stream sends parse to the same replies the in-process consumers get."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.host.runs.inbox import Inbox, Published
from agenthost.host.store import text_deltas
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.wire import MAX_BATCH, batch_entry

# ("objects", n): a reply of n usage events; ("deltas", n): n text deltas numbered as bytes; ("finished", 0).
_step = st.one_of(
    st.tuples(st.just("objects"), st.integers(1, MAX_BATCH)),
    st.tuples(st.just("deltas"), st.integers(1, MAX_BATCH)),
    st.tuples(st.just("finished"), st.just(0)),
)


def _published(steps: list[tuple[str, int]]) -> tuple[list[tuple[Published, int]], list[pb.RunEvent]]:
    items: list[tuple[Published, int]] = []
    sent: list[pb.RunEvent] = []
    seq = 0
    for kind, n in steps:
        if kind == "objects":
            batch = pb.RunEventBatch(
                events=[pb.RunEvent(seq=seq + i + 1, usage=pb.Usage(input_tokens=i)) for i in range(n)]
            )
            items.append((hpb.SendMessageReply(events=batch), batch.ByteSize()))
            sent += batch.events
        elif kind == "deltas":
            data = b"".join(
                batch_entry(pb.RunEvent(text_delta=pb.TextDelta(text=f"t{i}")).SerializeToString()) for i in range(n)
            )
            numbered = text_deltas.number(data, seq + 1, 5.0)
            assert numbered is not None
            items.append((numbered, len(numbered.batch)))
            sent += pb.RunEventBatch.FromString(numbered.batch).events
        else:
            items.append((hpb.SendMessageReply(run_finished=hpb.RunInfo(run_id="r")), 10))
        seq += n
    return items, sent


async def _take(items: list[tuple[Published, int]], encoded: bool) -> list[hpb.SendMessageReply | bytes | None]:
    inbox = Inbox("r")
    for reply, size in items:
        inbox.put(reply, size)
    return await inbox.take(encoded=encoded)


def _flattened(replies: list[hpb.SendMessageReply | bytes | None]) -> list[pb.RunEvent | str]:
    """The events in order, with "finished" where a run_finished reply was."""
    out: list[pb.RunEvent | str] = []
    for reply in replies:
        parsed = hpb.SendMessageReply.FromString(reply) if isinstance(reply, bytes) else reply
        assert parsed is not None
        if parsed.HasField("run_finished"):
            out.append("finished")
        else:
            assert 1 <= len(parsed.events.events) <= MAX_BATCH
            out += parsed.events.events
    return out


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_step, min_size=1, max_size=30))
def test_merged_replies_carry_every_event_once_in_order_within_the_caps(steps: list[tuple[str, int]]) -> None:
    items, sent = _published(steps)
    expected = [*sent]
    for i, (kind, _) in enumerate(steps):  # run_finished replies in their places
        if kind == "finished":
            expected.insert(sum(n for _, n in steps[:i]) + sum(k == "finished" for k, _ in steps[:i]), "finished")
    as_objects = asyncio.run(_take(items, encoded=False))
    as_bytes = asyncio.run(_take(items, encoded=True))
    assert all(isinstance(r, hpb.SendMessageReply) for r in as_objects)
    assert _flattened(as_objects) == expected
    assert _flattened(as_bytes) == expected
    # Consecutive batches that fit one message together travel as one.
    for (a, _), (b, _) in zip(items, items[1:], strict=False):
        if isinstance(a, text_deltas.TextDeltas) and isinstance(b, text_deltas.TextDeltas):
            if a.count + b.count <= MAX_BATCH:
                assert len(as_bytes) < len(items)
