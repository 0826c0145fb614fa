"""The channel SDK's platform-independent parts: splitting, pacing and mirroring a growing reply onto messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agenthost.channels.sdk import Limits, Pacer, ReplyStream, deliver, one_line, split_text
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

pytestmark = pytest.mark.timeout(30)
words = st.text(alphabet=st.sampled_from("ab \n"), max_size=400)


@given(words, st.integers(min_value=8, max_value=60))
def test_pieces_fit_and_keep_every_character(text: str, limit: int) -> None:
    pieces = split_text(text, limit)
    assert all(len(p) <= limit for p in pieces)
    assert "".join(pieces).replace("\n", "") == text.replace("\n", "")


@given(words, words, st.integers(min_value=8, max_value=60))
def test_pieces_of_a_prefix_are_stable(text: str, more: str, limit: int) -> None:
    before, after = split_text(text, limit), split_text(text + more, limit)
    assert after[: len(before) - 1] == before[:-1]


def test_split_prefers_paragraphs_then_lines_then_spaces() -> None:
    assert split_text("aaaa bbbb\n\ncccc dddd", 14) == ["aaaa bbbb", "cccc dddd"]
    assert split_text("aaaa bbbb\ncccc dddd", 14) == ["aaaa bbbb", "cccc dddd"]
    assert split_text("aaaa bbbb cccc", 12) == ["aaaa bbbb ", "cccc"]
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_one_line() -> None:
    assert one_line("\n  boom\x1b[31m\nsecond line") == "boom[31m"
    assert one_line("y" * 400, 10) == "y" * 9 + "…"


def test_pacer_spaces_calls_per_chat_and_honours_retry_after() -> None:
    now = [100.0]
    pacer = Pacer(Limits(per_chat_interval=1.0, per_group_minute=3), clock=lambda: now[0])
    assert pacer.delay("a") == 0
    pacer._chat("a").next_at = now[0] + 1.0
    assert pacer.delay("a") == pytest.approx(1.0) and pacer.delay("b") == 0
    pacer.retry_after("b", 7)
    assert pacer.delay("b") == pytest.approx(7.0)
    state = pacer._chat("g")
    state.recent.extend([now[0] - 50, now[0] - 40, now[0] - 30])
    assert pacer.delay("g", group=True) == pytest.approx(10.0)  # the oldest of 3 in the last minute leaves in 10 s
    assert pacer.delay("g", group=False) == 0


class Sink:
    max_chars = 20
    can_edit = True

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.calls: list[tuple[str, Any]] = []
        self.events: list[str] = []

    async def send_text(self, text: str) -> int:
        self.messages.append(text)
        self.calls.append(("send", text))
        return len(self.messages) - 1

    async def edit_text(self, handle: int, text: str) -> None:
        self.messages[handle] = text
        self.calls.append(("edit", text))

    async def notice(self, line: str) -> None:
        await self.send_text(line)

    async def event(self, event: pb.RunEvent) -> None:
        self.events.append(event.WhichOneof("kind"))


async def test_reply_stream_grows_then_splits_then_settles() -> None:
    sink = Sink()
    stream = ReplyStream(sink)
    for part in ("Hello ", "there, ", "this reply ", "outgrows one message."):
        stream.append(part)
        await asyncio.sleep(0)  # let the flusher run between deltas, as network latency would
    await stream.finish()
    assert " ".join(m.strip() for m in sink.messages) == "Hello there, this reply outgrows one message."
    assert all(len(m) <= 20 for m in sink.messages) and len(sink.messages) == 3
    assert sink.calls[0] == ("send", "Hello ")


async def test_a_final_message_replaces_longer_streamed_text() -> None:
    sink = Sink()
    stream = ReplyStream(sink)
    stream.append("draft " * 8)
    await asyncio.sleep(0)
    await stream.finish("short")
    assert sink.messages[0] == "short" and all(m == "…" for m in sink.messages[1:])


async def _replies(*items: Any):  # type: ignore[no-untyped-def]
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


async def test_deliver_renders_unknown_events_and_reports_refusals() -> None:
    run = hpb.RunInfo(run_id="r", status="completed", text="hi")
    sink = Sink()
    events = hpb.SendMessageReply(
        events=pb.RunEventBatch(
            events=[
                pb.RunEvent(text_delta=pb.TextDelta(text="hi")),
                pb.RunEvent(progress=pb.Progress(message="x")),
                pb.RunEvent(usage=pb.Usage(input_tokens=1)),
            ]
        )
    )
    started = []

    async def on_started(info: hpb.RunInfo) -> None:
        started.append(info.run_id)

    got = await deliver(
        _replies(hpb.SendMessageReply(run_started=run), events, hpb.SendMessageReply(run_finished=run)),
        sink,
        on_started=on_started,
    )
    assert got == run and started == ["r"] and sink.messages == ["hi"] and sink.events == ["progress"]

    sink = Sink()
    busy = errors.ResourceExhausted("queue full", retry_after_ms=3000)
    assert await deliver(_replies(busy), sink) is None
    assert sink.messages == ["⚠️ The bot is busy right now; please try again in 3 s."]


def test_the_adapter_log_masks_its_secrets() -> None:
    import logging

    from agenthost.channels.sdk.__main__ import MaskingFormatter

    token = "123456:SECRET-token-value"
    try:
        raise RuntimeError(f"GET https://api.telegram.org/bot{token}/getUpdates failed")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom %s", (token,), sys.exc_info())
    line = MaskingFormatter([token, "short"]).format(record)
    assert token not in line and line.count("[redacted]") == 2
