"""A binding's own MCP server reached by the real, pinned Claude Code and Codex CLIs (fake model APIs on loopback):
the fixture server (tests/fixtures/mcp_server, official SDK) registered beside the host bridge, started by the
harness inside its sandbox, its secret from the binding's keys. Skips without the CLIs, like test_real_clis.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner

from .fake_apis import FakeAnthropic, FakeOpenAI, Request
from .helpers import kinds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_server" / "server.py"
# Inline source: the harness sandbox shows the interpreter and its site-packages, not the tests folder.
SERVER = {
    "name": "fx",
    "transport": "stdio",
    "command": sys.executable,
    "args": ["-c", FIXTURE.read_text()],
    "env": {"FIXTURE_TOKEN": "${FX_KEY}"},
}
SECRET = "tok-real-cli-4242"


def _script(tool: str):
    def script(req: Request) -> list[dict[str, Any]]:
        if req.steps == 0:
            return [{"type": "tool", "name": tool, "input": {}}]
        return [{"type": "text", "text": f"FINAL {req.last_tool_result[:2000]}"}]

    return script


def _finished(events) -> list[Any]:
    return [e.tool_finished for e in events if e.WhichOneof("kind") == "tool_finished"]


async def _collect(runner, rc) -> list:
    return [e async for e in runner.run(rc)]


async def test_claude_code_calls_a_user_server(tmp_path, fake_host, clean_env, claude_bin, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(_script("mcp__fx__whoami")) as fake:
        config = {"base_url": f"http://127.0.0.1:{fake.port}", "command": claude_bin, "mcp_servers": [SERVER]}
        rc = fake_host.run_context("who is the server?", config=config)
        rc.secrets = {"FX_KEY": SECRET}
        runner = ClaudeCodeRunner(tmp_path / "data")
        events = await _collect(runner, rc)
        assert kinds(events)[-1] == "completed", events[-1]
        # The server runs beside the harness for its whole life, so the harness is still kept for the next message.
        assert len(runner.kept) == 1
        assert "mcp__fx__whoami" in fake.requests[0].tools and "mcp__agenthost__history_page" in fake.requests[0].tools
        [done] = _finished(events)
        assert done.tool_name == "mcp__fx__whoami" and not done.is_error
        assert f"token={SECRET}" in done.result
        # Only the workspaces: the kept harness is alive and makes and removes lock files in its own home meanwhile.
        mcp_json = next((tmp_path / "data" / "workspaces").rglob(".agenthost/mcp.json")).read_text()
        assert SECRET not in mcp_json


async def test_codex_calls_a_user_server(tmp_path, fake_host, clean_env, codex_bin, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    with FakeOpenAI(_script("mcp__fx.whoami")) as fake:
        config = {
            "base_url": f"http://127.0.0.1:{fake.port}/v1",
            "model": "gpt-fake",
            "command": codex_bin,
            "mcp_servers": [SERVER],
        }
        rc = fake_host.run_context("who is the server?", config=config)
        rc.secrets = {"FX_KEY": SECRET}
        events = await _collect(CodexRunner(tmp_path / "data"), rc)
        assert kinds(events)[-1] == "completed", events[-1]
        [done] = _finished(events)
        assert done.tool_name == "fx.whoami" and not done.is_error, done
        assert f"token={SECRET}" in done.result


async def test_codex_names_a_user_server_that_cannot_start(
    tmp_path, fake_host, clean_env, codex_bin, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    with FakeOpenAI(_script("mcp__fx.whoami")) as fake:
        broken = {"name": "broken", "transport": "stdio", "command": "/nonexistent/mcp-server"}
        config = {
            "base_url": f"http://127.0.0.1:{fake.port}/v1",
            "model": "gpt-fake",
            "command": codex_bin,
            "mcp_servers": [broken],
        }
        events = await _collect(CodexRunner(tmp_path / "data"), fake_host.run_context("hello", config=config))
        assert kinds(events)[-1] == "failed", events[-1]
        failed = events[-1].failed
        assert (
            failed.code == "harness_crashed" and "required MCP servers failed to initialize: broken" in failed.message
        )
        assert not fake.requests  # the turn never reached the model without the server
