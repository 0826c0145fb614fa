from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.messages import AssistantMessage, Message, Summary, ToolCall, ToolResult, UserMessage


def call(cid: str, name: str = "t") -> ToolCall:
    return ToolCall(cid, name, "{}")


def res(cid: str, text: str = "ok") -> ToolResult:
    return ToolResult(cid, "t", text)


def test_valid_history_is_unchanged() -> None:
    msgs: list[Message] = [
        UserMessage("hi"),
        AssistantMessage("", [call("a"), call("b")]),
        res("a"),
        res("b"),
        AssistantMessage("done"),
    ]
    out, report = pairing.repair(msgs)
    assert out == msgs and not report.changed
    pairing.check(out)


def test_missing_result_gets_interrupted_error() -> None:
    msgs: list[Message] = [
        UserMessage("hi"),
        AssistantMessage("", [call("a"), call("b")]),
        res("a"),
        UserMessage("next"),
    ]
    out, report = pairing.repair(msgs)
    pairing.check(out)
    assert report.synthesized == ["b"]
    synthetic = out[3]
    assert isinstance(synthetic, ToolResult) and synthetic.is_error and "interrupted" in synthetic.content
    assert isinstance(out[4], UserMessage)


def test_orphan_and_duplicate_results_dropped_and_order_restored() -> None:
    msgs: list[Message] = [
        res("ghost"),
        UserMessage("hi"),
        AssistantMessage("", [call("a"), call("b")]),
        res("b"),
        res("a"),
        res("a", "dup"),
        AssistantMessage("x"),
        res("late"),
    ]
    out, report = pairing.repair(msgs)
    pairing.check(out)
    assert [m.tool_call_id for m in out if isinstance(m, ToolResult)] == ["a", "b"]
    assert sorted(report.dropped) == ["a", "ghost", "late"]
    assert report.reordered == 1
    assert [m.content for m in out if isinstance(m, ToolResult)] == ["ok", "ok"]


def test_check_rejects_violations() -> None:
    with pytest.raises(pairing.PairingError):
        pairing.check([AssistantMessage("", [call("a")]), UserMessage("x")])
    with pytest.raises(pairing.PairingError):
        pairing.check([UserMessage("x"), res("a")])
    with pytest.raises(pairing.PairingError):
        pairing.check([AssistantMessage("", [call("a"), call("b")]), res("b"), res("a")])


# ---- property: any interruption point, any corruption, repair yields a valid history ----


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    msgs: list[Message] = []
    n_turns = draw(st.integers(1, 6))
    counter = 0
    for _ in range(n_turns):
        msgs.append(UserMessage(f"u{counter}"))
        for _ in range(draw(st.integers(0, 3))):
            k = draw(st.integers(1, 3))
            ids = [f"c{counter + i}" for i in range(k)]
            counter += k
            msgs.append(AssistantMessage("", [call(i) for i in ids]))
            msgs.extend(res(i) for i in ids)
        msgs.append(AssistantMessage("answer"))
    return msgs


@settings(max_examples=300, deadline=None)
@given(histories(), st.data())
def test_repair_restores_invariant_under_random_interruption(full: list[Message], data: st.DataObject) -> None:
    pairing.check(full)
    # A process killed after any write: every prefix of the written log.
    cut = data.draw(st.integers(0, len(full)))
    prefix = full[:cut]
    # Plus corruption a crash or a buggy writer can cause: dropped, duplicated and shuffled records.
    ops = data.draw(st.lists(st.tuples(st.sampled_from(["drop", "dup", "swap"]), st.integers(0, 1000)), max_size=4))
    mutated = list(prefix)
    for op, pos in ops:
        if not mutated:
            break
        i = pos % len(mutated)
        if op == "drop":
            del mutated[i]
        elif op == "dup":
            mutated.insert(i, mutated[i])
        elif op == "swap" and i + 1 < len(mutated):
            mutated[i], mutated[i + 1] = mutated[i + 1], mutated[i]
    out, _ = pairing.repair(mutated)
    pairing.check(out)
    # Repair never invents or loses a call, and never touches non-tool messages.
    calls_in = [c.id for m in mutated if isinstance(m, AssistantMessage) for c in m.tool_calls]
    calls_out = [c.id for m in out if isinstance(m, AssistantMessage) for c in m.tool_calls]
    assert calls_in == calls_out
    assert [m for m in out if not isinstance(m, ToolResult)] == [m for m in mutated if not isinstance(m, ToolResult)]
    # Idempotent.
    again, report = pairing.repair(out)
    assert again == out and not report.changed


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(0, 1000))
def test_compaction_cut_never_orphans(full: list[Message], pick: int) -> None:
    from agenthost.runners.local_agent.compaction import clean_cuts

    cuts = clean_cuts(full)
    if not cuts:
        return
    cut = cuts[pick % len(cuts)]
    tail = [Summary("s"), *full[cut:]]
    pairing.check(tail)  # a clean cut needs no repair at all
