from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.session import Session, safe_name


def test_roundtrip_preserves_provider_payloads(tmp_path: Path) -> None:
    s = Session.create(tmp_path, "conv/1")
    thinking = [{"type": "thinking", "thinking": "hmm", "signature": "sig=="}]
    s.append(UserMessage("héllo 你好", host_seq=3))
    s.append(
        AssistantMessage(
            "", [ToolCall("a", "read_file", '{"path": "x"}')], model="anthropic/m", reasoning="", thinking=thinking
        )
    )
    s.append(ToolResult("a", "read_file", "data", is_error=True, artifact_id="art1"))
    loaded, report = Session.load(tmp_path, "conv/1")
    assert loaded is not None and not report.healed
    assert loaded.messages == s.messages
    msg = loaded.messages[1]
    assert isinstance(msg, AssistantMessage) and msg.thinking == thinking and msg.reasoning == ""


def test_missing_session_is_none(tmp_path: Path) -> None:
    assert Session.load(tmp_path, "nope")[0] is None


def test_conversation_ids_cannot_escape_or_collide(tmp_path: Path) -> None:
    a = Session.path_for(tmp_path, "../../etc/passwd")
    assert a.parent == tmp_path / "sessions" and ".." not in a.name.split("-")[0][:2]
    assert safe_name("a/b") != safe_name("a_b")


def test_torn_tail_and_garbage_lines_are_healed(tmp_path: Path) -> None:
    s = Session.create(tmp_path, "c")
    s.append(UserMessage("q"), AssistantMessage("", [ToolCall("a", "shell", "{}")]))
    with s.path.open("ab") as f:
        f.write(b'{"t":"m","m":{"role":"tool","tool_call_id":"a","na')  # killed mid-write
    loaded, report = Session.load(tmp_path, "c")
    assert loaded is not None and report.torn_tail and report.repair.synthesized == ["a"]
    pairing.check(loaded.messages)
    # The healed file was written back and now loads clean.
    again, report2 = Session.load(tmp_path, "c")
    assert again is not None and not report2.healed and again.messages == loaded.messages
    raw = s.path.read_bytes()
    assert raw.endswith(b"\n") and all(json.loads(line) for line in raw.splitlines())


def test_foreign_file_is_not_trusted(tmp_path: Path) -> None:
    path = Session.path_for(tmp_path, "c")
    path.parent.mkdir(parents=True)
    path.write_text('{"t":"header","v":1,"conversation_id":"other"}\n')
    assert Session.load(tmp_path, "c")[0] is None


def test_rewrite_is_atomic_and_refuses_broken_pairing(tmp_path: Path) -> None:
    s = Session.create(tmp_path, "c", [UserMessage("a")])
    before = s.path.read_bytes()
    try:
        s.rewrite([AssistantMessage("", [ToolCall("x", "t", "{}")])])
    except pairing.PairingError:
        pass
    else:
        raise AssertionError("rewrite accepted an unpaired call")
    assert s.path.read_bytes() == before
    assert not [p for p in s.path.parent.iterdir() if p.name.endswith(".tmp")]
    s.rewrite([Summary("sum", "art", 7), UserMessage("b")])
    loaded, _ = Session.load(tmp_path, "c")
    assert loaded is not None and loaded.messages == [Summary("sum", "art", 7), UserMessage("b")]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_kill_at_any_byte_loads_a_valid_prefix(tmp_path_factory, cut: int) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("s")
    s = Session.create(root, "c")
    s.append(UserMessage("one"))
    s.append(AssistantMessage("", [ToolCall("a", "t", "{}"), ToolCall("b", "t", "{}")]))
    s.append(ToolResult("a", "t", "ra"))
    s.append(ToolResult("b", "t", "rb"))
    s.append(AssistantMessage("fin"))
    full = s.path.read_bytes()
    header_len = full.index(b"\n") + 1
    kept = full[: header_len + cut % (len(full) - header_len + 1)]
    s.path.write_bytes(kept)
    whole_lines = kept[header_len:].count(b"\n")  # one message per line; a cut tears at most the line it is in
    loaded, _ = Session.load(root, "c")
    assert loaded is not None
    pairing.check(loaded.messages)
    # Whatever survived is a prefix of what was written (plus synthesized results) ...
    real = [m for m in loaded.messages if not (isinstance(m, ToolResult) and m.is_error)]
    assert real == s.messages[: len(real)]
    # ... and nothing that survived whole is lost.
    assert len(real) == whole_lines
    # The healed session was written back: loading again gives the same messages.
    again, _ = Session.load(root, "c")
    assert again is not None and again.messages == loaded.messages
