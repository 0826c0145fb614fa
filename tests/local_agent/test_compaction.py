from __future__ import annotations

import json

import pytest

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.compaction import (
    CompactionFailed,
    Compactor,
    choose_cut,
    stub_old_results,
)
from agenthost.runners.local_agent.messages import AssistantMessage, Message, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.demo import DemoProvider
from agenthost.runners.local_agent.testing import FakeRunAPI
from agenthost.runners.local_agent.tokens import TokenCounter, estimate_messages, estimate_text


def test_cjk_counts_far_more_than_chars_over_four() -> None:
    en = "hello world " * 100
    zh = "你好世界" * 300
    assert estimate_text(en) == (len(en) + 3) // 4
    assert estimate_text(zh) >= len(zh)  # ~1 token per ideograph, not 1 per 4 chars
    assert estimate_text("こんにちは") == 5 and estimate_text("안녕하세요") == 5
    mixed = "abcd" * 10 + "中" * 10
    assert estimate_text(mixed) == 10 + 10


def test_counter_anchors_on_reported_usage() -> None:
    msgs: list[Message] = [UserMessage("a" * 400)]
    c = TokenCounter()
    raw = c.estimate("sys", [], msgs)
    c.record(5000, 1)  # the provider says the prompt was 5000 tokens
    msgs.append(AssistantMessage("b" * 40))
    assert c.estimate("sys", [], msgs) == 5000 + estimate_messages(msgs[1:])
    c.invalidate()
    assert c.estimate("sys", [], msgs) == raw + estimate_messages(msgs[1:])


def turn(i: int, big: int = 0, pad: int = 0) -> list[Message]:
    cid = f"c{i}"
    return [
        UserMessage(f"question {i}", host_seq=10 * i + 1),
        AssistantMessage("", [ToolCall(cid, "read_file", json.dumps({"path": f"f{i}"}))]),
        ToolResult(cid, "read_file", "x" * big if big else f"content {i}"),
        AssistantMessage(f"answer {i}" + "y" * pad),
    ]


def test_cheap_pass_stubs_only_old_large_results() -> None:
    msgs = [m for i in range(6) for m in turn(i, big=1000)]
    out, n = stub_old_results(msgs, keep_recent=3)
    assert n == 3
    results = [m for m in out if isinstance(m, ToolResult)]
    assert all(r.content.startswith("[old tool output cleared") for r in results[:3])
    assert all(r.content == "x" * 1000 for r in results[3:])
    pairing.check(out)
    assert stub_old_results(out, keep_recent=3)[1] == 0  # already stubbed: not counted again


def test_cut_prefers_turn_boundary_and_never_splits_a_tool_group() -> None:
    msgs = [m for i in range(10) for m in turn(i)]
    cut = choose_cut(msgs, keep_tokens=60)
    assert cut is not None and isinstance(msgs[cut], (UserMessage, AssistantMessage))
    pairing.check(msgs[cut:])
    # A single oversized turn still gets a clean cut inside it (before the final assistant message).
    one = turn(0, big=100_000)
    cut = choose_cut(one, keep_tokens=10)
    assert cut is not None and not isinstance(one[cut], ToolResult)
    assert choose_cut([Summary("s"), UserMessage("only")], keep_tokens=1) is None


async def test_cheap_pass_alone_when_it_is_enough() -> None:
    msgs = [m for i in range(40) for m in turn(i, big=800)]
    api = FakeRunAPI()
    compactor = Compactor(window=8000, watermark=0.7, keep_fraction=0.25, max_output_tokens=1000)
    outcome = await compactor.compact(msgs, overhead_tokens=300, provider=DemoProvider(), api=api, run_id="r1")
    # keep_recent_fraction 0.25 of 8000: the last ~2000 tokens stay verbatim (8 turns here), the rest is stubbed.
    keep = compactor.keep_tokens(300)
    assert keep == 2000
    verbatim = [m for m in outcome.messages if isinstance(m, ToolResult) and not m.content.startswith("[old")]
    assert outcome.stubbed == 40 - len(verbatim) and 6 <= len(verbatim) <= 9
    assert outcome.summarized == 0 and outcome.checkpoint is None
    assert len(outcome.messages) == len(msgs) and not api.artifacts
    assert outcome.tokens_after < 8000 * 0.7 * 0.8


async def test_compaction_summarizes_saves_artifact_and_checkpoint() -> None:
    msgs = [m for i in range(40) for m in turn(i, big=800, pad=400)]
    api = FakeRunAPI()
    compactor = Compactor(window=8000, watermark=0.7, keep_fraction=0.25, max_output_tokens=1000)
    before = estimate_messages(msgs)
    outcome = await compactor.compact(msgs, overhead_tokens=300, provider=DemoProvider(), api=api, run_id="r1")
    pairing.check(outcome.messages)
    assert isinstance(outcome.messages[0], Summary)
    assert outcome.tokens_after < outcome.tokens_before and outcome.tokens_after < 8000 * 0.7
    assert outcome.tokens_before == before + 300
    # The full pre-compaction context is an artifact the summary names.
    ((aid, (data, ref)),) = api.artifacts.items()
    assert aid in outcome.summary and ref.mime_type == "application/x-ndjson"
    assert len(data.splitlines()) == len(msgs)
    assert outcome.checkpoint is not None and outcome.checkpoint.artifact_id == aid
    # The checkpoint names the host position just before the first kept user turn.
    first_kept_user = next(m for m in outcome.messages if isinstance(m, UserMessage))
    assert outcome.checkpoint.through_seq == first_kept_user.host_seq - 1
    # Summarizing again folds in the previous summary, never leaving two.
    more = outcome.messages + [m for i in range(40, 70) for m in turn(i, big=800, pad=400)]
    again = await compactor.compact(more, overhead_tokens=300, provider=DemoProvider(), api=api, run_id="r1")
    assert sum(isinstance(m, Summary) for m in again.messages) == 1
    assert again.checkpoint and again.checkpoint.through_seq > outcome.checkpoint.through_seq


async def test_summarizer_failure_falls_back_to_mechanical_summary() -> None:
    class Broken(DemoProvider):
        async def complete(self, request):  # type: ignore[no-untyped-def]
            from agenthost.runners.local_agent.errors import ErrorKind, ProviderError

            raise ProviderError(ErrorKind.SERVER, "down")

    msgs = [m for i in range(40) for m in turn(i, big=800, pad=400)]
    compactor = Compactor(window=8000, watermark=0.7, keep_fraction=0.25, max_output_tokens=1000)
    outcome = await compactor.compact(
        msgs, overhead_tokens=0, provider=Broken(), api=FakeRunAPI(denied={"artifact_create"}), run_id="r"
    )
    assert "question 0" in outcome.summary and "read_file" in outcome.summary
    assert outcome.artifact is None and "artifact" not in outcome.summary.split("(Automatic")[0]


async def test_unshrinkable_turn_fails_clearly_and_ineffective_compactions_stop() -> None:
    huge = [UserMessage("z" * 200_000)]
    compactor = Compactor(window=8000, watermark=0.7, keep_fraction=0.25, max_output_tokens=1000)
    with pytest.raises(CompactionFailed, match="window"):
        await compactor.compact(huge, overhead_tokens=0, provider=DemoProvider(), api=FakeRunAPI(), run_id="r")
    assert compactor.may_compact()
    with pytest.raises(CompactionFailed):
        await compactor.compact(huge, overhead_tokens=0, provider=DemoProvider(), api=FakeRunAPI(), run_id="r")
    assert not compactor.may_compact()  # two compactions that freed nothing: stop trying


def test_checkpoint_position_never_skips_an_unsummarized_turn() -> None:
    from agenthost.runners.local_agent.compaction import _through_seq

    turn_a = [UserMessage("a", host_seq=10), AssistantMessage("ra")]
    turn_b = [
        UserMessage("b", host_seq=12),
        AssistantMessage("", [ToolCall("x", "t", "{}")]),
        ToolResult("x", "t", "r"),
        AssistantMessage("rb"),
    ]
    assert _through_seq(turn_a, turn_b) == 11  # at a turn boundary: up to just before b
    assert _through_seq(turn_a + turn_b[:3], turn_b[3:]) == 11  # inside b: b is re-read whole
    assert _through_seq([Summary("s", through_seq=9), *turn_a], [UserMessage("c")]) == 9  # unknown seq: a re-read
    assert _through_seq([Summary("s", through_seq=30)], turn_b) == 30  # never moves backwards


def test_counter_takes_the_larger_of_report_and_estimate() -> None:
    msgs: list[Message] = [UserMessage("a" * 4000)]
    tools = [{"name": "t", "description": "d" * 2000, "parameters": {"type": "object"}}]
    c = TokenCounter()
    own = c.estimate("sys", tools, msgs)
    assert own > 1000 + 500  # the tool schemas are counted, not only the messages
    c.record(100, 1)  # a server that leaves out the schemas, counts only uncached tokens, or sends a constant
    assert c.estimate("sys", tools, msgs) == own
    c.record(own * 3, 1)  # a heavier tokenizer than ours: the report wins
    assert c.estimate("sys", tools, msgs) == own * 3


def test_cached_tokens_reported_apart_are_added_back() -> None:
    from agenthost.runners.local_agent.providers.openai import _usage

    inside = _usage({"prompt_tokens": 5000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4000}})
    apart = _usage({"prompt_tokens": 300, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4700}})
    assert inside is not None and inside.input_tokens == 5000 and inside.cache_read_tokens == 4000
    assert apart is not None and apart.input_tokens == 5000 and apart.cache_read_tokens == 4700


def test_long_call_arguments_are_stubbed_as_valid_objects_outside_the_tail() -> None:
    from agenthost.runners.local_agent.compaction import stub_arguments

    big = json.dumps({"path": "a.txt", "content": "x" * 3000, "opts": {"note": "y" * 500, "n": 1}})
    call = ToolCall("c1", "write_file", big)
    short = stub_arguments(call)
    assert short is not None
    value = json.loads(short.arguments)
    assert value["path"] == "a.txt" and value["opts"]["n"] == 1
    assert "3000 chars omitted" in value["content"] and "500 chars omitted" in value["opts"]["note"]
    assert stub_arguments(short) is None  # idempotent
    assert json.loads(stub_arguments(ToolCall("c2", "x", "not json " * 50)).arguments)  # type: ignore[union-attr]
    msgs: list[Message] = [UserMessage("go")]
    for i in range(6):
        msgs += [AssistantMessage("", [ToolCall(f"w{i}", "write_file", big)]), ToolResult(f"w{i}", "write_file", "ok")]
    out, n = stub_old_results(msgs, keep_tokens=2000)
    calls = [m.tool_calls[0].arguments for m in out if isinstance(m, AssistantMessage)]
    assert n == 4 and all("omitted" in a for a in calls[:4]) and calls[4:] == [big, big]
    assert out[0] is msgs[0]
    pairing.check(out)


def test_keep_tokens_has_a_floor_and_honours_the_fraction() -> None:
    small = Compactor(window=4096, watermark=0.7, keep_fraction=0.25, max_output_tokens=1024)
    assert small.keep_tokens(overhead_tokens=1500) == 1024  # the fraction, not 0 (main computed 0 here)
    assert small.keep_tokens(overhead_tokens=3000) == 256  # no room at all: still the floor
    assert Compactor(window=4096, watermark=0.7, keep_fraction=0.05, max_output_tokens=1024).keep_tokens(1500) == 256
    assert Compactor(window=4096, watermark=0.7, keep_fraction=0.6, max_output_tokens=1024).keep_tokens(1500) == 1179


async def test_compaction_never_summarizes_the_pinned_turn() -> None:
    older = [m for i in range(20) for m in turn(i, big=800, pad=400)]
    user = UserMessage("do the big task", host_seq=999)
    current: list[Message] = [user]
    for i in range(6):
        current += [
            AssistantMessage("", [ToolCall(f"k{i}", "read_file", "{}")]),
            ToolResult(f"k{i}", "read_file", "z" * 1500),
        ]
    compactor = Compactor(window=8000, watermark=0.7, keep_fraction=0.25, max_output_tokens=1000)
    outcome = await compactor.compact(
        older + current, overhead_tokens=1500, provider=DemoProvider(), api=FakeRunAPI(), run_id="r", pinned=user
    )
    msgs = outcome.messages
    assert isinstance(msgs[0], Summary) and msgs[1] is user  # summary of older turns, then the instruction itself
    assert "do the big task" not in outcome.summary
    assert outcome.checkpoint is not None and outcome.checkpoint.through_seq == 998
    assert msgs[-1].content == "z" * 1500  # the latest result verbatim
    pairing.check(msgs)
