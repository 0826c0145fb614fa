"""Harness stream -> run events, from recorded-shape lines (no process)."""

from __future__ import annotations

from agenthost.runners.external_harness.claude_code import ClaudeCodeDriver
from agenthost.runners.external_harness.codex import CodexDriver
from agenthost.runners.external_harness.turn import TurnState
from agenthost.runners.sdk import events

from .helpers import host_view


def _kinds(events):
    return [e.WhichOneof("kind") for e in events]


def _feed(driver, lines):
    turn = TurnState()
    out = []
    for line in lines:
        out += driver.map_event(line, turn)
    return turn, out


SESSION = "52054925-92ff-4c79-af2c-e1b266196612"
CLAUDE_RUN = [
    {
        "type": "system",
        "subtype": "init",
        "session_id": SESSION,
        "model": "claude-opus-5-5",
        "mcp_servers": [{"name": "agenthost", "status": "connected"}],
    },
    {
        "type": "assistant",
        "message": {"id": "msg_1", "content": [{"type": "text", "text": "Let me read."}]},
        "parent_tool_use_id": None,
        "session_id": SESSION,
    },
    {
        "type": "assistant",
        "message": {
            "id": "msg_1",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/w/hello.txt"}}],
        },
        "parent_tool_use_id": None,
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [{"tool_use_id": "toolu_1", "type": "tool_result", "content": "1\tMARKER\n"}],
        },
        "parent_tool_use_id": None,
    },
    {
        "type": "assistant",
        "message": {"id": "msg_sub", "content": [{"type": "text", "text": "subagent chatter"}]},
        "parent_tool_use_id": "toolu_9",
    },
    {
        "type": "assistant",
        "message": {"id": "msg_2", "content": [{"type": "text", "text": "FINAL answer"}]},
        "parent_tool_use_id": None,
    },
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "FINAL answer",
        "session_id": SESSION,
        "total_cost_usd": 0.05,
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 2,
            "cache_creation_input_tokens": 1,
        },
    },
]


def test_claude_success_maps_text_tools_usage_and_never_repeats_the_answer() -> None:
    turn, out = _feed(ClaudeCodeDriver(), CLAUDE_RUN)
    assert _kinds(out) == ["text_delta", "tool_started", "tool_finished", "text_delta"]
    assert turn.session_id == SESSION and turn.finished and turn.error is None
    # The closing message carries only the text after the last tool call (the host already has the rest).
    assert turn.final_text == "FINAL answer"
    assert host_view([*out, events.message(turn.final_text)]) == "Let me read.\n\nFINAL answer"
    assert out[1].tool_started.tool_name == "Read" and '"file_path"' in out[1].tool_started.arguments_json
    assert out[2].tool_finished.tool_name == "Read" and "MARKER" in out[2].tool_finished.result
    assert turn.usage.usage.cost_usd == 0.05 and turn.usage.usage.cache_read_tokens == 2
    assert turn.usage.usage.model == "claude-opus-5-5"


def test_claude_partial_messages_stream_tokens_once() -> None:
    stream = [
        {"type": "system", "subtype": "init", "session_id": SESSION},
        {"type": "stream_event", "event": {"type": "message_start", "message": {"id": "msg_9", "model": "m"}}},
        {"type": "stream_event", "event": {"type": "content_block_start", "index": 0}},
        {
            "type": "stream_event",
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hel"}},
        },
        {
            "type": "stream_event",
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "lo"}},
        },
        {"type": "assistant", "message": {"id": "msg_9", "content": [{"type": "text", "text": "Hello"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "Hello", "usage": {}},
    ]
    turn, out = _feed(ClaudeCodeDriver(), stream)
    assert [e.text_delta.text for e in out] == ["Hel", "lo"]
    assert turn.final_text == "Hello"


def test_claude_result_only_text_is_used_when_no_block_arrived() -> None:
    turn, out = _feed(ClaudeCodeDriver(), [{"type": "result", "subtype": "success", "result": "only here"}])
    assert [e.text_delta.text for e in out] == ["only here"] and turn.final_text == "only here"


def test_claude_errors_become_typed_failures() -> None:
    turn, _ = _feed(
        ClaudeCodeDriver(),
        [
            {
                "type": "result",
                "subtype": "success",
                "is_error": True,
                "result": "API Error: 401 bad key",
                "api_error_status": 401,
                "usage": {},
            }
        ],
    )
    assert turn.error.code == "harness_error" and "401 bad key" in turn.error.message
    turn, _ = _feed(
        ClaudeCodeDriver(),
        [{"type": "result", "subtype": "error_max_turns", "is_error": True, "errors": ["Reached max turns (2)"]}],
    )
    assert turn.error.code == "harness_error_max_turns" and "max turns" in turn.error.message


def test_claude_retry_compaction_and_bridge_status() -> None:
    _, out = _feed(
        ClaudeCodeDriver(),
        [
            {
                "type": "system",
                "subtype": "init",
                "session_id": SESSION,
                "mcp_servers": [{"name": "agenthost", "status": "failed"}],
            },
            {"type": "system", "subtype": "api_retry", "attempt": 2, "retry_delay_ms": 1500, "error": "overloaded"},
            {
                "type": "system",
                "subtype": "compact_boundary",
                "compact_metadata": {"trigger": "auto", "pre_tokens": 9000},
            },
            {"type": "rate_limit_event"},
        ],
    )
    assert _kinds(out) == ["progress", "retry", "compaction"]
    assert out[1].retry.delay_seconds == 1.5 and out[2].compaction.tokens_before == 9000


def test_claude_session_lost_detection() -> None:
    driver = ClaudeCodeDriver()
    assert driver.session_lost("Error: No conversation found with session ID: abc", TurnState())
    assert not driver.session_lost("something else", TurnState())


CODEX_RUN = [
    {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "reasoning", "text": "thinking"}},
    {
        "type": "item.started",
        "item": {
            "id": "item_2",
            "type": "command_execution",
            "command": "bash -lc ls",
            "aggregated_output": "",
            "status": "in_progress",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_2",
            "type": "command_execution",
            "command": "bash -lc ls",
            "aggregated_output": "a.txt\n",
            "exit_code": 0,
            "status": "completed",
        },
    },
    {
        "type": "item.completed",
        "item": {
            "id": "item_3",
            "type": "mcp_tool_call",
            "server": "agenthost",
            "tool": "history_page",
            "arguments": {"limit": 2},
            "status": "completed",
            "result": {"content": [{"type": "text", "text": '{"items":[]}'}]},
        },
    },
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "Done."}},
    {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 7}},
]


def test_codex_maps_items_and_usage() -> None:
    turn, out = _feed(CodexDriver(), CODEX_RUN)
    assert _kinds(out) == ["progress", "tool_started", "tool_finished", "tool_started", "tool_finished", "text_delta"]
    assert turn.session_id == "0199a213-81c0-7800-8aa1-bbab2a035a53" and turn.finished
    assert out[2].tool_finished.result == "a.txt\n" and not out[2].tool_finished.is_error
    assert out[3].tool_started.tool_name == "agenthost.history_page"
    assert out[4].tool_finished.result == '{"items":[]}'
    assert turn.final_text == "Done."
    assert (turn.usage.usage.input_tokens, turn.usage.usage.cache_read_tokens) == (60, 40)


def test_codex_failure_and_session_lost() -> None:
    turn, _ = _feed(
        CodexDriver(),
        [
            {"type": "error", "message": "Reconnecting... 1/5"},
            {"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized"}},
        ],
    )
    assert turn.error.code == "harness_error" and "401" in turn.error.message
    failed_cmd = {
        "type": "item.completed",
        "item": {
            "id": "x",
            "type": "command_execution",
            "command": "false",
            "aggregated_output": "",
            "exit_code": 1,
            "status": "failed",
        },
    }
    _, out = _feed(CodexDriver(), [failed_cmd])
    assert out[-1].tool_finished.is_error
    assert CodexDriver().session_lost("Error: No saved session found with ID 123", TurnState())


def test_codex_thread_totals_become_per_turn_usage() -> None:
    from agenthost.runners.external_harness.codex import usage_event, usage_since

    previous = {"input_tokens": 100, "cached_input_tokens": 20, "output_tokens": 10}
    now = {"input_tokens": 300, "cached_input_tokens": 60, "output_tokens": 30}
    share = usage_since(now, previous)
    assert share == {"input_tokens": 200, "cached_input_tokens": 40, "output_tokens": 20}
    event = usage_event(share, model="m").usage
    assert (event.input_tokens, event.cache_read_tokens, event.output_tokens) == (160, 40, 20)
    assert usage_since(previous, now) == previous  # totals went backwards (a new thread): report them as they are


def test_claude_permission_denials_are_reported() -> None:
    turn, out = _feed(
        ClaudeCodeDriver(),
        [
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "could not write",
                "permission_denials": [{"tool_name": "Write", "tool_use_id": "t1", "tool_input": {}}],
            }
        ],
    )
    assert _kinds(out) == ["progress", "text_delta"] and "Write" in out[0].progress.message
