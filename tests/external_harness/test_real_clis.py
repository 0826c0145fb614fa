"""The harness runners driving the real, pinned Claude Code and Codex CLIs against fake model APIs on loopback.

Install the CLIs with `scripts/install_harness_clis.sh` (or point AGENTHOST_CLAUDE_BIN / AGENTHOST_CODEX_BIN at
them); without them these tests skip and say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agenthost.plugins.sandbox import INSIDE_ENV
from agenthost.runners.external_harness import runner as runner_mod
from agenthost.runners.external_harness.mcp_control import McpControl
from agenthost.runners.external_harness.mcp_http import McpHttpEndpoint
from agenthost.runners.external_harness.projection import READ_ONLY_NOTE
from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner
from agenthost.runners.external_harness.warm import BETWEEN_TURNS

from .fake_apis import FakeAnthropic, FakeOpenAI, Request
from .helpers import group_alive, host_view, kinds
from .test_mcp_http import Raw

pytestmark = pytest.mark.slow


SKILL = {
    "name": "greeter",
    "description": "MARKER-SKILL-DESC greets people warmly",
    "body": "# Greeter\nMARKER-SKILL-BODY always greet with a haiku.",
}
INSTRUCTIONS = "MARKER-INSTRUCTIONS answer like a pirate."


def claude_script(req: Request) -> list[dict[str, Any]]:
    prompt = req.prompt
    if "HISTORY-PLEASE" in prompt:
        if req.steps == 0:
            return [
                {"type": "text", "text": "Checking the host records."},
                {"type": "tool", "name": "mcp__agenthost__history_page", "input": {"limit": 10}},
            ]
        return [{"type": "text", "text": f"FINAL-HISTORY {req.last_tool_result[:2000]}"}]
    if "SKILL-PLEASE" in prompt:
        if req.steps == 0:
            return [{"type": "tool", "name": "Skill", "input": {"skill": "greeter"}}]
        return [{"type": "text", "text": "FINAL-SKILL done"}]
    if "HANG-PLEASE" in prompt:
        return [{"type": "hang"}]
    if "BAD-KEY" in prompt:
        return [
            {"type": "http_error", "status": 401, "error_type": "authentication_error", "message": "invalid x-api-key"}
        ]
    if "BAD-REQUEST" in prompt:
        return [
            {
                "type": "http_error",
                "status": 400,
                "error_type": "invalid_request_error",
                "message": "MARKER-BAD-REQUEST the model field is invalid",
            }
        ]
    return [{"type": "text", "text": f"ANSWER to {prompt[:40]!r} seeing {len(req.body.get('messages', []))} messages"}]


def codex_script(req: Request) -> list[dict[str, Any]]:
    prompt = req.prompt
    if "SHELL-PLEASE" in prompt:
        if req.steps == 0:
            # What a model does first: read the message's context, then try to change the working directory.
            command = "cat .agenthost/context.json; touch x && echo MARKER-WROTE || echo MARKER-WRITE-FAILED"
            return [{"type": "tool", "name": "exec_command", "input": {"cmd": command}}]
        return [{"type": "text", "text": f"FINAL-SHELL {req.last_tool_result[:4000]}"}]
    if "HISTORY-PLEASE" in prompt:
        if req.steps == 0:
            return [{"type": "tool", "name": "mcp__agenthost.history_page", "input": {"limit": 10}}]
        return [{"type": "text", "text": f"FINAL-HISTORY {req.last_tool_result[:2000]}"}]
    if "HANG-PLEASE" in prompt:
        return [{"type": "hang"}]
    if "BAD-KEY" in prompt:
        return [{"type": "http_error", "status": 401, "message": "Incorrect API key provided"}]
    return [{"type": "text", "text": f"ANSWER to {prompt[:40]!r}"}]


async def _collect(runner, rc) -> list:
    return [e async for e in runner.run(rc)]


def _text(events) -> str:
    return "".join(e.text_delta.text for e in events if e.WhichOneof("kind") == "text_delta")


def _message(events) -> str:
    (msg,) = [e.message.text for e in events if e.WhichOneof("kind") == "message"]
    return msg


def _claude_config(fake: FakeAnthropic, **extra: Any) -> dict[str, Any]:
    return {
        # No ENABLE_TOOL_SEARCH here: the bridge marks each of its tools `anthropic/alwaysLoad`, so the
        # bridge's tools are in the first request for the fake to call.
        "base_url": f"http://127.0.0.1:{fake.port}",
        "instructions": INSTRUCTIONS,
        "skills": [SKILL],
        "allowed_tools": ["Skill"],
        "streaming": True,
        "interrupt_grace_seconds": 1.0,
        **extra,
    }


def _codex_config(fake: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    return {
        "base_url": f"http://127.0.0.1:{fake.port}/v1",
        "model": "gpt-fake",
        "instructions": INSTRUCTIONS,
        "skills": [SKILL],
        # The safe default sandbox (read-only) stays on: MCP calls do not need more.
        "interrupt_grace_seconds": 1.0,
        **extra,
    }


async def _no_process_left(token: str, pid: int) -> None:
    await asyncio.sleep(0.2)
    assert not group_alive(pid)
    # Nothing that carries the run's credentials (the harness, the MCP bridge) survives, whatever its group.
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            assert token.encode() not in environ, f"process {entry.name} still holds the run token"


async def _cancel_mid_request(runner, rc, fake, token: str) -> None:
    task = asyncio.create_task(_collect(runner, rc))
    for _ in range(600):
        if fake.requests and runner_mod._LIVE:
            break
        await asyncio.sleep(0.05)
    assert fake.requests, "the harness never reached the model"
    (proc,) = runner_mod._LIVE
    pid = proc.pid
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _no_process_left(token, pid)


# ---- Claude Code ----


@pytest.mark.parametrize("transport", ["sdk", "http", "stdio"])
async def test_claude_projection_bridge_resume_and_skill(
    transport, tmp_path, fake_host, clean_env, claude_bin, monkeypatch
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-77")
    fake_host.data.add_item("assistant", "an earlier answer")
    runner = ClaudeCodeRunner(tmp_path / "data")
    with FakeAnthropic(claude_script) as fake:
        config = _claude_config(fake, command=claude_bin, mcp_transport=transport)

        first = await _collect(runner, fake_host.run_context("HISTORY-PLEASE what did I ask?", config=config))
        assert kinds(first)[-1] == "completed", first[-1]
        request = fake.requests[0]
        assert "MARKER-INSTRUCTIONS" in request.raw  # CLAUDE.md managed block
        assert "MARKER-SKILL-DESC" in request.raw  # skill listing
        assert "mcp__agenthost__history_page" in request.tools
        tool = [e for e in first if e.WhichOneof("kind") == "tool_finished"]
        assert tool and tool[0].tool_finished.tool_name == "mcp__agenthost__history_page"
        assert "MARKER-HOST-HISTORY-77" in tool[0].tool_finished.result  # the bridge reached the host
        assert "MARKER-HOST-HISTORY-77" in _message(first)
        # Streamed once and delivered once: the text before the tool call, then the answer.
        assert host_view(first) == "Checking the host records.\n\n" + _message(first)
        assert _message(first).startswith("FINAL-HISTORY")
        assert sum(1 for k in kinds(first) if k == "text_delta") > 3  # token deltas, not one block
        assert "HistoryPage" in fake_host.data.calls
        session = fake_host.data.get_state("conversation", "external.session_id")
        workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
        assert (workdir / ".claude/skills/greeter/SKILL.md").exists()

        n = len(fake.requests)
        second = await _collect(runner, fake_host.run_context("SECOND question", config=config))
        assert kinds(second)[-1] == "completed"
        resumed = fake.requests[n]
        assert "HISTORY-PLEASE what did I ask?" in resumed.raw and "FINAL-HISTORY" in resumed.raw
        assert fake_host.data.get_state("conversation", "external.session_id") == session

        n = len(fake.requests)
        third = await _collect(runner, fake_host.run_context("SKILL-PLEASE greet me", config=config))
        assert kinds(third)[-1] == "completed"
        assert any("MARKER-SKILL-BODY" in r.raw for r in fake.requests[n:])

        # The harness loses the session (cleanup, another machine): the next message starts fresh. The runner
        # restarts too, or its kept process (warm.py) would go on with the session it holds in memory.
        await runner.close()
        (config_dir,) = (tmp_path / "data" / "harness").glob("*/conversations/*/claude")  # the conversation's own
        transcripts = list(config_dir.rglob(f"{session}.jsonl"))
        assert transcripts
        for transcript in transcripts:
            transcript.unlink()
        fourth = await _collect(runner, fake_host.run_context("after the loss", config=config))
        assert kinds(fourth)[0] == "progress" and session in fourth[0].progress.message
        assert kinds(fourth)[-1] == "completed"
        assert fake_host.data.get_state("conversation", "external.session_id") != session


async def _call_between_turns(bridge: McpControl | McpHttpEndpoint, call: dict[str, Any]) -> dict[str, Any]:
    """A tools/call sent to a kept process's bridge the way its harness would send it, over the bridge's transport."""
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    if isinstance(bridge, McpHttpEndpoint):
        # A sandboxed harness's endpoint listens on no TCP port of the machine, only on its unix socket.
        assert bridge.unix_path
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", bridge.port), timeout=5).close()
        transport = httpx.AsyncHTTPTransport(uds=bridge.unix_path)
        async with httpx.AsyncClient(timeout=30, trust_env=False, transport=transport) as client:
            raw = Raw(bridge, client)
            await raw.initialize("2025-11-25")
            return (await raw.post(message)).json()
    answered: asyncio.Queue[bytes] = asyncio.Queue()
    send, bridge.send = bridge.send, answered.put
    try:
        request = {"subtype": "mcp_message", "server_name": "agenthost", "message": message}
        bridge.receive({"type": "control_request", "request_id": "probe-1", "request": request})
        response = json.loads(await asyncio.wait_for(answered.get(), 30))["response"]
    finally:
        bridge.send = send
    assert response["request_id"] == "probe-1" and response["subtype"] == "success"
    return response["response"]["mcp_response"]


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_claude_kept_process_answers_the_next_message_with_that_runs_bridge(
    transport, tmp_path, fake_host, clean_env, claude_bin, monkeypatch
):
    """The conversation's Claude Code process is kept after a message (warm.py): the next message goes to it, and
    its bridge calls reach the host as the next run, whose token is not the first one's."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-77")
    runner = ClaudeCodeRunner(tmp_path / "data")
    with FakeAnthropic(claude_script) as fake:
        config = _claude_config(fake, command=claude_bin, mcp_transport=transport)
        first = await _collect(runner, fake_host.run_context("HISTORY-PLEASE first", config=config))
        assert kinds(first)[-1] == "completed", first[-1]
        assert "MARKER-HOST-HISTORY-77" in _message(first)
        (kept,) = runner.kept._kept.values()
        # Between the messages its bridge reaches nothing, though the first run's token is still valid here.
        reply = await _call_between_turns(kept.bridge, {"name": "history_page", "arguments": {"limit": 1}})
        assert reply["result"]["isError"] and BETWEEN_TURNS in json.dumps(reply)
        # A new run: its own id and tool token; the first run's no longer open anything at the host.
        fake_host.data.run_id, fake_host.data.tool_token = "run-second", "tool-token-of-the-second-run"
        n = len(fake.requests)
        second = await _collect(runner, fake_host.run_context("HISTORY-PLEASE second", config=config))
        assert kinds(second)[-1] == "completed", second[-1]
        assert "MARKER-HOST-HISTORY-77" in _message(second)  # reached the host with the second run's token
        (again,) = runner.kept._kept.values()
        assert again.proc is kept.proc  # one CLI process answered both messages
        # The same session, continued in memory: the second request carries the first exchange.
        assert "HISTORY-PLEASE first" in fake.requests[n].raw and "HISTORY-PLEASE second" in fake.requests[n].raw
        # A changed binding replaces the process within the turn; the new one gets the same bridge, afresh.
        changed = config | {"append_system_prompt": "MARKER-NEW-PROMPT"}
        third = await _collect(runner, fake_host.run_context("HISTORY-PLEASE third", config=changed))
        assert kinds(third)[-1] == "completed", third[-1]
        assert "MARKER-HOST-HISTORY-77" in _message(third)
        (replaced,) = runner.kept._kept.values()
        assert replaced.proc is not kept.proc and replaced.bridge is kept.bridge


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_claude_spare_answers_a_new_conversations_first_message_with_that_runs_bridge(
    transport, tmp_path, fake_host, clean_env, claude_bin, monkeypatch
):
    """After a message, a spare Claude Code process starts for the binding (warm.py); a new conversation's first
    message goes to it: it read the bot's managed block and skills at start-up, holds nothing of the first
    conversation, and its bridge calls reach the host as the new conversation's run."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-88")
    runner = ClaudeCodeRunner(tmp_path / "data")
    with FakeAnthropic(claude_script) as fake:
        config = _claude_config(fake, command=claude_bin, mcp_transport=transport)
        first = await _collect(runner, fake_host.run_context("MARKER-FIRST-CONVERSATION hello", config=config))
        assert kinds(first)[-1] == "completed", first[-1]
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while len(runner.spares) == 0:  # it starts in the background, after the turn
            assert loop.time() < end, "no spare started"
            await asyncio.sleep(0.05)
        (spare,) = runner.spares._kept.values()
        # Between its start and its first message the spare reaches nothing at the host.
        reply = await _call_between_turns(spare.bridge, {"name": "history_page", "arguments": {"limit": 1}})
        assert reply["result"]["isError"] and BETWEEN_TURNS in json.dumps(reply)
        fake_host.data.conversation_id, fake_host.data.run_id = "conv-second", "run-second"
        fake_host.data.tool_token = "tool-token-of-the-second-run"
        fake_host.data.state.clear()
        n = len(fake.requests)
        second = await _collect(runner, fake_host.run_context("HISTORY-PLEASE second", config=config))
        assert kinds(second)[-1] == "completed", second[-1]
        assert "MARKER-HOST-HISTORY-88" in _message(second)  # reached the host with the second run's token
        kept = runner.kept._kept[("bot-1", "conv-second")]
        assert kept.proc is spare.proc and spare.proc.running  # the spare answered, and is now the kept one
        request = fake.requests[n].raw
        assert "MARKER-FIRST-CONVERSATION" not in request  # nothing of the other conversation
        assert INSTRUCTIONS in request and "greeter" in request  # the managed block and skill it read at start
    await runner.close()


async def test_claude_speaks_mcp_2026_07_28_to_the_turn_endpoint(
    tmp_path, fake_host, clean_env, claude_bin, monkeypatch
):
    """The pinned CLI probes server/discover first; answered as 2026-07-28, it skips the initialize handshake (and
    its second connection, notifications/initialized and GET stream) and still calls the host's tools."""
    from agenthost.runners.external_harness import mcp_http

    seen: list[tuple[str, str, str]] = []
    route, read_json = mcp_http.McpHttpEndpoint._route, mcp_http.McpHttpEndpoint._read_json

    async def logged_route(self, conn, reader, request):
        version = dict(request.headers).get(b"mcp-protocol-version", b"").decode()
        seen.append((request.method.decode(), version, ""))
        return await route(self, conn, reader, request)

    async def logged_read_json(self, conn, reader, headers):
        payload = await read_json(self, conn, reader, headers)
        verb, version, _ = seen[-1]
        seen[-1] = (verb, version, payload.get("method", "") if isinstance(payload, dict) else "?")
        return payload

    monkeypatch.setattr(mcp_http.McpHttpEndpoint, "_route", logged_route)
    monkeypatch.setattr(mcp_http.McpHttpEndpoint, "_read_json", logged_read_json)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-2026")
    runner = ClaudeCodeRunner(tmp_path / "data")
    with FakeAnthropic(claude_script) as fake:
        config = _claude_config(fake, command=claude_bin, mcp_transport="http")
        events = await _collect(runner, fake_host.run_context("HISTORY-PLEASE what did I ask?", config=config))
    assert kinds(events)[-1] == "completed", events[-1]
    assert "MARKER-HOST-HISTORY-2026" in _message(events)  # the tool call went through the 2026-07-28 endpoint
    # The bridge's tools are in the first request (`anthropic/alwaysLoad`) while tool search still defers the rarely
    # used built-in tools: inlining those too cost ~7 % of a trivial turn.
    first = fake.requests[0].tools
    assert "mcp__agenthost__history_page" in first and "ToolSearch" in first and "WebSearch" not in first
    assert seen == [
        ("POST", "2026-07-28", "server/discover"),
        ("POST", "2026-07-28", "tools/list"),
        ("POST", "2026-07-28", "tools/call"),
    ]


async def test_claude_cancel_leaves_no_process(tmp_path, fake_host, clean_env, claude_bin, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(claude_script) as fake:
        rc = fake_host.run_context("HANG-PLEASE", config=_claude_config(fake, command=claude_bin))
        await _cancel_mid_request(ClaudeCodeRunner(tmp_path / "data"), rc, fake, fake_host.data.tool_token)


async def test_claude_api_error_fails_the_run(tmp_path, fake_host, clean_env, claude_bin, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(claude_script) as fake:
        events = await _collect(
            ClaudeCodeRunner(tmp_path / "data"),
            fake_host.run_context("BAD-REQUEST", config=_claude_config(fake, command=claude_bin)),
        )
    assert kinds(events)[-1] == "failed" and "message" not in kinds(events)
    assert events[-1].failed.code == "harness_error"
    assert "MARKER-BAD-REQUEST" in events[-1].failed.message and "400" in events[-1].failed.message


@pytest.mark.skipif(os.geteuid() != 0, reason="Claude Code refuses bypassPermissions only as root")
async def test_claude_crash_gives_a_clear_error(tmp_path, fake_host, clean_env, claude_bin, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(claude_script) as fake:
        # Unsandboxed on purpose: inside the sandbox the harness runs as an unprivileged uid and has no root to
        # refuse, and this refusal is the one reliable way to make the real CLI exit early.
        config = _claude_config(fake, command=claude_bin, permission_mode="bypassPermissions", process_sandbox=False)
        events = await _collect(ClaudeCodeRunner(tmp_path / "data"), fake_host.run_context("hello", config=config))
    assert kinds(events)[-1] == "failed" and events[-1].failed.code == "harness_crashed"
    assert "root/sudo" in events[-1].failed.message and "exited with code 1" in events[-1].failed.message


async def test_claude_base_url_and_key_errors(tmp_path, fake_host, clean_env, claude_bin):
    runner = ClaudeCodeRunner(tmp_path / "data")
    with FakeAnthropic(claude_script) as fake:
        # A base_url written the OpenAI way (with /v1) works too: the runner hands Claude Code the form it needs.
        config = _claude_config(fake, command=claude_bin, base_url=f"http://127.0.0.1:{fake.port}/v1/")
        missing = await _collect(runner, fake_host.run_context("hello", config=config))
        assert missing[-1].failed.code == "harness_auth", missing[-1]
        message = missing[-1].failed.message
        assert "ANTHROPIC_API_KEY is not set" in message and "agenthost keys set ANTHROPIC_API_KEY" in message
        assert "--key ANTHROPIC_API_KEY" in message and "Not logged in" in message  # and the harness's own words

        rc = fake_host.run_context("hello", config=config)
        rc.secrets = {"ANTHROPIC_API_KEY": "sk-ant-stored-0123456789"}  # from the host's key store
        ok = await _collect(runner, rc)
        assert kinds(ok)[-1] == "completed" and _message(ok).startswith("ANSWER to"), ok[-1]
        assert fake.requests[-1].tools and "mcp__agenthost__history_page" in fake.requests[-1].tools

        rc = fake_host.run_context("BAD-KEY", config=config)
        rc.secrets = {"ANTHROPIC_API_KEY": "sk-ant-stored-0123456789"}
        started = time.monotonic()
        rejected = await _collect(runner, rc)
        elapsed = time.monotonic() - started
    assert rejected[-1].failed.code == "harness_auth", rejected[-1]
    message = rejected[-1].failed.message
    assert "rejected the stored key ANTHROPIC_API_KEY" in message and "401" in message
    assert "sk-ant-stored" not in message
    # Two retries (the binding default), not Claude Code's ten: the run fails in seconds, not minutes.
    assert kinds(rejected).count("retry") == 2 and elapsed < 30, (kinds(rejected), elapsed)


# ---- Codex ----


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_codex_projection_bridge_and_resume(transport, tmp_path, fake_host, clean_env, codex_bin, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-88")
    runner = CodexRunner(tmp_path / "data")
    with FakeOpenAI(codex_script) as fake:
        config = _codex_config(fake, command=codex_bin, mcp_transport=transport)

        first = await _collect(runner, fake_host.run_context("HISTORY-PLEASE what did I ask?", config=config))
        assert kinds(first)[-1] == "completed", first[-1]
        request = fake.requests[0]
        assert "MARKER-INSTRUCTIONS" in request.raw  # AGENTS.md
        assert "MARKER-SKILL-DESC" in request.raw  # .agents/skills listing
        finished = [e.tool_finished for e in first if e.WhichOneof("kind") == "tool_finished"]
        assert finished and finished[0].tool_name == "agenthost.history_page"
        assert "MARKER-HOST-HISTORY-88" in finished[0].result
        assert "MARKER-HOST-HISTORY-88" in _message(first) and host_view(first) == _message(first)
        usage = [e.usage for e in first if e.WhichOneof("kind") == "usage"]
        assert usage and usage[0].output_tokens > 0
        thread = fake_host.data.get_state("conversation", "external.session_id")
        assert thread

        n = len(fake.requests)
        second = await _collect(runner, fake_host.run_context("SECOND question", config=config))
        assert kinds(second)[-1] == "completed"
        assert "HISTORY-PLEASE what did I ask?" in fake.requests[n].raw
        assert "FINAL-HISTORY" in fake.requests[n].raw
        assert fake_host.data.get_state("conversation", "external.session_id") == thread

        # A thread Codex no longer has starts fresh, with a note.
        # The conversation's own (a spare waiting for the next new conversation has another).
        codex_home = runner.workspaces.workspace("bot-1", fake_host.data.conversation_id).codex_home
        rollouts = list((codex_home / "sessions").rglob(f"*{thread}*.jsonl"))
        assert rollouts
        for rollout in rollouts:
            rollout.unlink()
        third = await _collect(runner, fake_host.run_context("after the loss", config=config))
        notes = [e.progress.message for e in third if e.WhichOneof("kind") == "progress"]
        assert any(thread in note and "new session" in note for note in notes), notes
        assert kinds(third)[-1] == "completed"
        assert fake_host.data.get_state("conversation", "external.session_id") != thread


@pytest.mark.parametrize("operator_edit", [False, True], ids=["spare", "config-changed"])
async def test_codex_spare_answers_a_new_conversations_first_message_with_that_runs_bridge(
    operator_edit, tmp_path, fake_host, clean_env, codex_bin, monkeypatch
):
    """After a message, a spare `codex exec` starts for the binding (warm.py), its start-up in a new Codex home done
    while it waits for its prompt on stdin; a new conversation's first message goes to it: it holds nothing of the
    first conversation (its own directory and home), and its bridge calls reach the host as the new run. An
    operator's new default config.toml, written after the spare started, is not missed: a new process answers."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    started: list[Path] = []
    start = runner_mod.HarnessProcess.start

    async def recording_start(self: runner_mod.HarnessProcess) -> None:
        started.append(Path(self.cwd))
        await start(self)

    monkeypatch.setattr(runner_mod.HarnessProcess, "start", recording_start)
    fake_host.data.add_item("user", "an earlier question with MARKER-HOST-HISTORY-99")
    runner = CodexRunner(tmp_path / "data")
    with FakeOpenAI(codex_script) as fake:
        config = _codex_config(fake, command=codex_bin)
        first = await _collect(runner, fake_host.run_context("MARKER-FIRST-CONVERSATION hello", config=config))
        assert kinds(first)[-1] == "completed", first[-1]
        first_home = runner.workspaces.workspace("bot-1", fake_host.data.conversation_id).codex_home
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while len(runner.spares) == 0:  # it starts in the background, after the turn
            assert loop.time() < end, "no spare started"
            await asyncio.sleep(0.05)
        (spare,) = runner.spares._kept.values()
        assert spare.slot is not None and spare.proc.running
        # Its start-up is done before any prompt: its state databases are there, no thread yet.
        spare_home = spare.slot.workspace.codex_home
        while not list(spare_home.glob("state_*.sqlite")):
            assert loop.time() < end and spare.proc.running, "the spare never set up its Codex home"
            await asyncio.sleep(0.05)
        assert spare_home != first_home and not (spare_home / "sessions").exists()
        # Between its start and its first message the spare reaches nothing at the host.
        reply = await _call_between_turns(spare.bridge, {"name": "history_page", "arguments": {"limit": 1}})
        assert reply["result"]["isError"] and BETWEEN_TURNS in json.dumps(reply)
        if operator_edit:
            defaults = spare.slot.workspace.defaults_dir / "codex"
            defaults.mkdir(parents=True, exist_ok=True)
            (defaults / "config.toml").write_text("hide_agent_reasoning = true\n")
        fake_host.data.conversation_id, fake_host.data.run_id = "conv-second", "run-second"
        fake_host.data.tool_token = "tool-token-of-the-second-run"
        fake_host.data.state.clear()
        n = len(fake.requests)
        second = await _collect(runner, fake_host.run_context("HISTORY-PLEASE second", config=config))
        assert kinds(second)[-1] == "completed", second[-1]
        assert "MARKER-HOST-HISTORY-99" in _message(second)  # reached the host with the second run's token
        # The conversation's directory is the spare's slot, and the spare has ended with the turn.
        slot_dir = spare.slot.workspace.working_dir
        assert fake_host.data.get_state("conversation", "external.working_directory") == str(slot_dir)
        assert not spare.proc.running
        # The spare answered (one process ever started there), unless its start-up files changed (a new one did).
        assert started.count(slot_dir) == (2 if operator_edit else 1), started
        request = fake.requests[n].raw
        assert "MARKER-FIRST-CONVERSATION" not in request  # nothing of the other conversation
        assert INSTRUCTIONS in request and "MARKER-SKILL-DESC" in request  # the managed block and skill
        thread = fake_host.data.get_state("conversation", "external.session_id")
        assert list((spare_home / "sessions").rglob(f"*{thread}*.jsonl"))  # its thread, in its own home
        assert not list((first_home / "sessions").rglob(f"*{thread}*.jsonl"))


async def test_codex_cancel_leaves_no_process(tmp_path, fake_host, clean_env, codex_bin, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    with FakeOpenAI(codex_script) as fake:
        rc = fake_host.run_context("HANG-PLEASE", config=_codex_config(fake, command=codex_bin))
        await _cancel_mid_request(CodexRunner(tmp_path / "data"), rc, fake, fake_host.data.tool_token)


async def test_codex_crash_gives_a_clear_error(tmp_path, fake_host, clean_env, codex_bin, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    with FakeOpenAI(codex_script) as fake:
        config = _codex_config(fake, command=codex_bin, config_overrides={"approval_policy": "bogus"})
        events = await _collect(CodexRunner(tmp_path / "data"), fake_host.run_context("hello", config=config))
    assert kinds(events)[-1] == "failed" and events[-1].failed.code == "harness_crashed"
    assert "unknown variant `bogus`" in events[-1].failed.message
    garbage = [c for c in events[-1].failed.message if (ord(c) < 32 and c not in "\n\t") or ord(c) == 0x7F]
    assert not garbage, f"control characters (ANSI escapes included) in the error: {garbage!r}"


async def test_codex_base_url_model_and_key_errors(tmp_path, fake_host, clean_env, codex_bin):
    runner = CodexRunner(tmp_path / "data")
    with FakeOpenAI(codex_script) as fake:
        # A base_url written the Anthropic way (no /v1) works too.
        config = _codex_config(fake, command=codex_bin, base_url=f"http://127.0.0.1:{fake.port}")
        missing = await _collect(runner, fake_host.run_context("hello", config=config))
        assert missing[-1].failed.code == "harness_auth", missing[-1]
        assert "OPENAI_API_KEY is not set" in missing[-1].failed.message
        assert "agenthost keys set OPENAI_API_KEY" in missing[-1].failed.message

        rc = fake_host.run_context("hello", config=config)
        rc.secrets = {"OPENAI_API_KEY": "sk-openai-stored-0123456789"}
        ok = await _collect(runner, rc)
        assert kinds(ok)[-1] == "completed", ok[-1]
        (usage,) = [e.usage for e in ok if e.WhichOneof("kind") == "usage"]
        assert usage.model == "gpt-fake" and usage.output_tokens > 0  # Codex's events never name it

        n = len(fake.requests)
        rc = fake_host.run_context("BAD-KEY", config=config)
        rc.secrets = {"OPENAI_API_KEY": "sk-openai-stored-0123456789"}
        rejected = await _collect(runner, rc)
        assert len(fake.requests) - n <= 3  # at most the binding's two retries
    assert rejected[-1].failed.code == "harness_auth", rejected[-1]
    message = rejected[-1].failed.message
    assert "rejected the stored key OPENAI_API_KEY" in message and "401" in message
    assert "sk-openai-stored" not in message


@pytest.mark.parametrize("sandbox", [None, "workspace-write", "danger-full-access"])
async def test_codex_commands_run_inside_agenthosts_walls(
    sandbox, tmp_path, fake_host, clean_env, codex_bin, monkeypatch
):
    """A model's shell command answers at once through a Codex binding, the default (`sandbox: read-only`) above
    all, and the binding's `sandbox` holds: agenthost's sandbox enforces it, with Codex's own off inside it. Codex's
    own bubblewrap cannot start inside agenthost's when that one is nested (the runner runs in the host's plugin
    sandbox, so the harness's binds the outer /proc read-only): each command then waited 10 s and came back as
    "Process running with session ID …" with no output, and the model could not even read its context."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    monkeypatch.setenv(INSIDE_ENV, "1")  # nested, as under `agenthost serve`: what the host sets for its plugins
    extra = {} if sandbox is None else {"sandbox": sandbox}
    with FakeOpenAI(codex_script) as fake:
        config = _codex_config(fake, command=codex_bin, **extra)
        events = await _collect(CodexRunner(tmp_path / "data"), fake_host.run_context("SHELL-PLEASE", config=config))
    assert kinds(events)[-1] == "completed", events[-1]
    # The command's output reached the model's next request, at once (Codex waits 10 s for a command it cannot
    # see finish, then hands the model a session id instead of output).
    output = fake.requests[1].last_tool_result
    assert "agenthost.external_harness_context.v1" in output and "Process running with session ID" not in output
    wall = re.search(r"Wall time: ([0-9.]+) seconds", output)
    assert wall and float(wall.group(1)) < 10, output
    # The binding's sandbox holds: under read-only the working directory cannot be written, otherwise it can.
    workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
    if sandbox is None:
        assert "MARKER-WRITE-FAILED" in output and "Read-only file system" in output, output
        assert not (workdir / "x").exists()
    else:
        assert "MARKER-WROTE" in output and (workdir / "x").exists(), output
    # Codex tells the model it runs unsandboxed; the managed block says what the walls hold.
    assert (READ_ONLY_NOTE in fake.requests[0].raw) == (sandbox is None)
    # Whatever Codex says about its sandbox maps cleanly: one shell call, its output, and the reply once.
    (started,) = [e.tool_started for e in events if e.WhichOneof("kind") == "tool_started"]
    (finished,) = [e.tool_finished for e in events if e.WhichOneof("kind") == "tool_finished"]
    assert started.tool_name == finished.tool_name == "shell"
    assert "cat .agenthost/context.json" in started.arguments_json
    assert "agenthost.external_harness_context.v1" in finished.result
    assert _message(events).startswith("FINAL-SHELL") and host_view(events) == _message(events)


# ---- the network: only through the runner's egress proxy ----

MODEL_HOST = "model-api.agenthost.test"  # resolvable by the runner's proxy alone (below), never in the sandbox


@pytest.fixture
def proxy_resolves_model_host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The egress proxy (in this process: the runner is) resolves MODEL_HOST to the fake API on loopback, as DNS
    would resolve a real API host; every name it resolves is recorded."""
    from agenthost.runners.sdk import egress

    asked: list[str] = []
    real = egress.lookup

    async def lookup(host: str, port: int) -> list[str]:
        asked.append(host)
        return await real("127.0.0.1" if host == MODEL_HOST else host, port)

    monkeypatch.setattr(egress, "lookup", lookup)
    return asked


@pytest.mark.parametrize("harness", ["claude", "codex"])
async def test_the_cli_reaches_a_named_model_api_only_through_the_egress_proxy(
    harness, tmp_path, fake_host, clean_env, claude_bin, codex_bin, monkeypatch, proxy_resolves_model_host
):
    """The real CLIs honour the sandbox's HTTPS_PROXY/HTTP_PROXY: a base_url naming a host the sandbox cannot
    resolve (it has no network but its own loopback) is reached through the runner's egress proxy, which
    resolves it and lets it through as the binding's endpoint."""
    if harness == "claude":
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
        runner: Any = ClaudeCodeRunner(tmp_path / "data")
        fake: Any = FakeAnthropic(claude_script)
        make = _claude_config
        command, path = claude_bin, ""
    else:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
        runner, fake, make, command, path = (
            CodexRunner(tmp_path / "data"),
            FakeOpenAI(codex_script),
            _codex_config,
            codex_bin,
            "/v1",
        )
    with fake:
        config = make(fake, command=command, base_url=f"http://{MODEL_HOST}:{fake.port}{path}", keep_warm_seconds=0)
        if harness == "codex":
            config.pop("keep_warm_seconds")
        events = await _collect(runner, fake_host.run_context("hello through the proxy", config=config))
        assert kinds(events)[-1] == "completed", events[-1]
        assert "ANSWER to 'hello through the proxy'" in _message(events)
        assert fake.requests and MODEL_HOST in proxy_resolves_model_host
