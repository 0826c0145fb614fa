"""Compaction inside one long turn, driven end to end (runner + FakeRunAPI + scripted model over loopback HTTP).

The failure these guard against: a turn of many tool calls compacted so that the next request held only a
"reference only — do not re-execute" summary of the user's instruction, and the model stopped before finishing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agenthost.runners.local_agent.compaction import SUMMARIZER_SYSTEM
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.messages import UserMessage
from agenthost.runners.local_agent.session import Session
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    Recorded,
    openai_text,
    openai_tool_calls,
)

from .helpers import new_runner, send, server_config, session_key, terminal

WRITE_INSTRUCTION = "Create the ten report files part0.txt to part9.txt, each about 2.4 KB of text."
READ_INSTRUCTION = "Read data.txt again and again until you are sure, then tell me the checksum line."


def _chat_requests(server: FakeProviderServer) -> list[list[dict[str, Any]]]:
    """The agent's own model requests (summarizer calls left out)."""
    out = []
    for r in server.model_requests:
        body = r.json()
        system = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
        if SUMMARIZER_SYSTEM[:40] not in system:
            out.append(body["messages"])
    return out


def _has_instruction(messages: list[dict[str, Any]], instruction: str) -> bool:
    return any(m["role"] == "user" and m["content"] == instruction for m in messages)


def _estimate_request(r: Recorded) -> int:
    # The same chars/4 rule the runner uses for ASCII, over the whole wire body (schemas included), as a
    # deliberately generous upper bound on what the server had to hold.
    return len(r.body) // 4


async def test_ten_writes_at_8k_all_happen_and_the_instruction_survives(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        cfg = server_config(server, context_window=8192)
        for i in range(10):
            body = f"part {i}\n" + ("lorem ipsum dolor sit amet " * 90)[:2400]
            # usage (100, 10) is a server under-reporting its prompt size; the runner must not trust it.
            server.push(openai_tool_calls([(f"w{i}", "write_file", {"path": f"part{i}.txt", "content": body})]))
        server.push(openai_text("All ten files are written."))
        evs = await send(runner, api, WRITE_INSTRUCTION, cfg)

        assert terminal(evs).completed.finish_reason == "stop"
        compactions = [e.compaction for e in evs if e.WhichOneof("kind") == "compaction"]
        assert compactions, "the scenario must actually compact"
        ws = runner._workspace(LocalAgentConfig.parse(cfg), session_key(api))
        written = sorted(p.name for p in ws.glob("part*.txt"))
        assert written == [f"part{i}.txt" for i in range(10)]  # the tenth file IS written
        requests = _chat_requests(server)
        assert len(requests) == 11
        for n, msgs in enumerate(requests):
            assert _has_instruction(msgs, WRITE_INSTRUCTION), f"request {n} lost the instruction"
            assert msgs[1] == {"role": "user", "content": WRITE_INSTRUCTION}  # right after the system prompt
            assert not any("CONTEXT SUMMARY" in str(m.get("content")) for m in msgs)
        # Compaction did shorten what was sent: old write_file contents were stubbed in later requests.
        last_calls = [c for m in requests[-1] for c in m.get("tool_calls", [])]
        assert len(last_calls) == 10
        stubbed = [c for c in last_calls if "chars omitted" in c["function"]["arguments"]]
        assert stubbed and json.loads(stubbed[0]["function"]["arguments"])["path"].startswith("part")
        assert all(_estimate_request(r) < 8192 for r in server.model_requests)
        print(
            f"\n10 writes @8192: {len(compactions)} compaction(s) "
            + ", ".join(f"{c.tokens_before}->{c.tokens_after}" for c in compactions)
            + f"; {len(stubbed)} of 10 call arguments stubbed in the last request"
        )
    await runner.close()


async def _reads(tmp_path: Path, *, reads: int, keep_fraction: float) -> tuple[list[Any], FakeProviderServer, Any]:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    server = FakeProviderServer()
    async with server:
        cfg = server_config(server, context_window=4096, keep_recent_fraction=keep_fraction)
        ws = runner._workspace(LocalAgentConfig.parse(cfg), session_key(api))
        lines = [f"row {n:03d}: " + "abcdefghij" * 4 for n in range(34)] + ["checksum: 9f3a"]
        (ws / "data.txt").write_text("\n".join(lines) + "\n")
        assert 1700 <= (ws / "data.txt").stat().st_size <= 1900  # ~1.8 KB
        for i in range(reads):
            server.push(openai_tool_calls([(f"r{i}", "read_file", {"path": "data.txt"})]))
        server.push(openai_text("The checksum line is `checksum: 9f3a`."))
        evs = await send(runner, api, READ_INSTRUCTION, cfg)
    await runner.close()
    return evs, server, api


def _verbatim_reads(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m["role"] == "tool" and "checksum: 9f3a" in m["content"])


async def test_eight_reads_at_4k_finish_with_the_instruction_in_every_request(tmp_path: Path) -> None:
    evs, server, _ = await _reads(tmp_path, reads=8, keep_fraction=0.25)
    assert terminal(evs).completed.finish_reason == "stop"
    assert "compaction" in [e.WhichOneof("kind") for e in evs]
    requests = _chat_requests(server)
    assert len(requests) == 9
    for n, msgs in enumerate(requests):
        assert msgs[1] == {"role": "user", "content": READ_INSTRUCTION}, f"request {n}"
    assert all(_estimate_request(r) < 4096 for r in server.model_requests)
    # The latest read the model asked for is always in front of it verbatim.
    assert requests[-1][-1]["role"] == "tool" and "checksum: 9f3a" in requests[-1][-1]["content"]


def _after_compaction(evs: list[Any], requests: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The requests sent right after each compaction (one model reply, hence one usage event, per request)."""
    out = []
    replies = 0
    for e in evs:
        kind = e.WhichOneof("kind")
        if kind == "usage":
            replies += 1
        elif kind == "compaction":
            out.append(requests[replies])
    return out


async def test_keep_recent_fraction_is_visible_at_4k(tmp_path: Path) -> None:
    kept = {}
    for fraction in (0.05, 0.25, 0.6):
        evs, server, _ = await _reads(tmp_path / str(fraction), reads=8, keep_fraction=fraction)
        assert terminal(evs).completed.finish_reason == "stop"
        compacted = _after_compaction(evs, _chat_requests(server))
        assert compacted
        kept[fraction] = sorted({_verbatim_reads(msgs) for msgs in compacted})
    print(f"\nverbatim read results right after each compaction @4096, by keep_recent_fraction: {kept}")
    assert kept[0.05] == [1]  # the floor still keeps the result just asked for
    assert min(kept[0.25]) >= 2
    # 0.6 of 4096 does not fit beside the tool schemas: capped, it keeps at least what 0.25 keeps.
    assert min(kept[0.6]) >= min(kept[0.25])


async def test_a_long_turn_at_4k_folds_its_old_steps_into_a_progress_note(tmp_path: Path) -> None:
    evs, server, api = await _reads(tmp_path, reads=24, keep_fraction=0.25)
    assert terminal(evs).completed.finish_reason == "stop"
    requests = _chat_requests(server)
    assert len(requests) == 25
    for msgs in requests:
        assert msgs[1] == {"role": "user", "content": READ_INSTRUCTION}
    last = requests[-1]
    # The fold sits right after the instruction, framed as work done, never as a "do not re-execute" summary.
    assert last[2]["role"] == "user" and last[2]["content"].startswith("[PROGRESS NOTE")
    assert "read_file" in last[2]["content"] and "CONTEXT SUMMARY" not in last[2]["content"]
    assert all(_estimate_request(r) < 4096 for r in server.model_requests)
    # The persisted session keeps the same shape for the next run.
    session, _ = Session.load(tmp_path, session_key(api))
    assert session is not None
    assert isinstance(session.messages[0], UserMessage) and session.messages[0].content == READ_INSTRUCTION


async def test_a_current_turn_that_cannot_fit_fails_clearly_and_is_not_kept(tmp_path: Path) -> None:
    runner = new_runner(tmp_path)
    api = FakeRunAPI()
    async with FakeProviderServer() as server:
        cfg = server_config(server, context_window=4096)
        server.push(openai_text("first answer"))
        await send(runner, api, "hello", cfg)
        huge = "please analyse this: " + "data " * 3000  # ~3750 tokens: cannot fit a 4096 window with the tools
        evs = await send(runner, api, huge, cfg)
        failed = terminal(evs).failed
        assert failed.code == "context_overflow"
        assert "window" in failed.message and "not sent to the model" in failed.message
        assert len(server.model_requests) == 1  # the model was never asked to act on a summary of it
        # The next run sees that it was there (a marked stand-in, not its text) and does not fail on it again.
        server.push(openai_text("second answer"))
        evs = await send(runner, api, "short question", cfg)
        assert terminal(evs).completed.finish_reason == "stop"
        msgs = server.model_requests[-1].json()["messages"]
        users = [m["content"] for m in msgs if m["role"] == "user"]
        assert users[0] == "hello" and users[-1] == "short question" and len(users) == 3
        assert users[1].startswith("[A message of ~") and "data data" not in users[1]
    await runner.close()
