"""Claude Code's permission prompts reach a person through the host: the real, pinned `claude` CLI against the
fake Anthropic API, driven through a real host. The fake model asks for a Bash call that Claude Code's own rules
would refuse; `--permission-prompt-tool` sends it to the bridge's `approve` tool, which asks the host; the test
decides through the admin API, as `agenthost approvals` or a chat adapter would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.external_harness.runner import ClaudeCodeRunner
from agenthost.runners.sdk.testing import HostHarness

from .fake_apis import FakeAnthropic, Request
from .test_real_clis import _claude_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def script(req: Request) -> list[dict[str, Any]]:
    if req.prompt.startswith("RUN "):
        if req.steps == 0:
            return [{"type": "tool", "name": "Bash", "input": {"command": req.prompt[4:].strip()}}]
        return [{"type": "text", "text": f"TOOL-SAID {req.last_tool_result[:500]}"}]
    return [{"type": "text", "text": "hello"}]


async def _send_and_decide(h: HostHarness, text: str, decision: str | None, note: str = "") -> tuple[Any, list]:
    """Sends `text`; when the approval request shows up in the stream, decides it (None: lets it time out)."""
    seen: list[pb.RunEvent] = []
    finished = None
    request = hpb.SendMessageRequest(bot=h.bot, text=text, conversation_id="c1")
    async for reply in h.client.stream(request):
        kind = reply.WhichOneof("kind")
        if kind == "events":
            for ev in reply.events.events:
                seen.append(ev)
                if ev.WhichOneof("kind") == "approval_requested" and decision is not None:
                    await h.client.call(
                        "DecideApproval",
                        hpb.DecideApprovalRequest(
                            approval_id=ev.approval_requested.approval_id, decision=decision, note=note
                        ),
                    )
        elif kind == "run_finished":
            finished = reply.run_finished
    return finished, seen


def _requests(seen: list[pb.RunEvent]) -> list[pb.ApprovalRequested]:
    return [e.approval_requested for e in seen if e.WhichOneof("kind") == "approval_requested"]


def _resolved(seen: list[pb.RunEvent]) -> list[str]:
    return [e.approval_resolved.outcome for e in seen if e.WhichOneof("kind") == "approval_resolved"]


@pytest.mark.parametrize("transport", ["sdk", "http", "stdio"])
async def test_claude_bash_needs_a_persons_yes(tmp_path: Path, clean_env, claude_bin, monkeypatch, transport) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(script) as fake:
        config = _claude_config(
            fake,
            command=claude_bin,
            mcp_transport=transport,
            approvals={"commands": ["echo *"], "timeout_seconds": 2},
        )
        async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config=config) as h:
            run, seen = await _send_and_decide(h, "RUN echo MARKER-APPROVED > approved.txt", "approve")
            assert run.status == "completed", (run.error_code, run.error_message)
            (req,) = _requests(seen)
            assert req.tool_name == "Bash" and req.summary == "echo MARKER-APPROVED > approved.txt"
            assert "approvals.commands 'echo *'" in req.reason
            assert _resolved(seen) == ["approved"]
            # Claude Code keeps its permission prompt tool away from the model: only the harness calls it.
            assert fake.requests[0].tools and not any(t.endswith("__approve") for t in fake.requests[0].tools)
            written = list(tmp_path.rglob("approved.txt"))
            assert written, fake.requests[-1].last_tool_result
            assert [p.read_text().strip() for p in written] == ["MARKER-APPROVED"]  # the command ran

            run, seen = await _send_and_decide(h, "RUN echo MARKER-DENIED > denied.txt", "deny", "not now")
            assert run.status == "completed", run.error_message
            assert _resolved(seen) == ["denied"]
            assert not list(tmp_path.rglob("denied.txt"))  # refused: never ran
            assert "not now" in fake.requests[-1].last_tool_result  # the model was told why

            run, seen = await _send_and_decide(h, "RUN echo MARKER-LATE > late.txt", None)
            assert run.status == "completed", run.error_message
            assert _resolved(seen) == ["timeout"]
            assert not list(tmp_path.rglob("late.txt"))

            # Not matching the approvals: refused as before, and nobody is asked.
            run, seen = await _send_and_decide(h, "RUN touch MARKER-OTHER.txt", "approve")
            assert run.status == "completed", run.error_message
            assert _requests(seen) == []
            assert not list(tmp_path.rglob("MARKER-OTHER.txt"))
            assert (await h.client.call("ListApprovals", hpb.ListApprovalsRequest())).approvals == []
    await asyncio.sleep(0)


# ---- without a process: config, command line, the bridge's `approve` tool ----


def test_config_refuses_approvals_that_could_never_ask() -> None:
    from agenthost.runners.external_harness.config import ClaudeCodeConfig, parse_config
    from agenthost.runners.external_harness.errors import HarnessConfigError

    for extra, needle in (
        ({"permission_mode": "bypassPermissions"}, "never asks"),
        ({"permission_mode": "dontAsk"}, "never asks"),
        ({"mcp_bridge": False}, "set mcp_bridge"),
        ({"approvals": {"commands": ["re:("]}}, "not a valid regular expression"),
    ):
        raw = {"approvals": {"tools": ["Bash"]}, **extra}
        with pytest.raises(HarnessConfigError, match=needle):
            parse_config(ClaudeCodeConfig, raw)


def test_prompt_tool_only_with_approvals(tmp_path: Path) -> None:
    from agenthost.runners.external_harness.claude_code import ClaudeCodeDriver
    from agenthost.runners.external_harness.config import ClaudeCodeConfig, parse_config

    from .test_commands import _plan

    plain = ClaudeCodeDriver().command(_plan(tmp_path, parse_config(ClaudeCodeConfig, {}))).argv
    assert "--permission-prompt-tool" not in plain
    config = parse_config(ClaudeCodeConfig, {"approvals": {"tools": ["Bash"]}})
    argv = ClaudeCodeDriver().command(_plan(tmp_path, config)).argv
    assert argv[argv.index("--permission-prompt-tool") + 1] == "mcp__agenthost__approve"


class _Api:
    def __init__(self, outcome: str | Exception) -> None:
        self.outcome = outcome
        self.asked: list[dict[str, Any]] = []

    async def request_approval(self, tool_name: str, **kw: Any) -> Any:
        from agenthost.protos import run_api_pb2 as api

        self.asked.append({"tool_name": tool_name, **kw})
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return api.ApprovalDecision(approved=self.outcome == "approved", outcome=self.outcome, timeout_seconds=5)


async def test_bridge_approve_tool_fails_closed() -> None:
    import json

    from agenthost.protos import errors
    from agenthost.runners.external_harness.mcp_bridge import ApprovalPolicy, Bridge, McpServer, tools_for

    policy = ApprovalPolicy(tools=[], commands=["git push*"], timeout_seconds=5)
    assert "approve" not in tools_for("*") and tools_for("*", '{"tools": []}')[-1] == "approve"

    async def answer(api: _Api, tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
        server = McpServer(Bridge(api, approvals=policy), tools=tools_for("*", "x"))
        reply = await server.handle(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "approve", "arguments": {"tool_name": tool, "input": tool_input}},
            }
        )
        (block,) = reply["result"]["content"]  # a single text block, as Claude Code requires
        assert "structuredContent" not in reply["result"]
        return json.loads(block["text"])

    push = {"command": "git push origin main"}
    assert await answer(_Api("approved"), "Bash", push) == {"behavior": "allow", "updatedInput": push}
    api = _Api("approved")
    refused = await answer(api, "Bash", {"command": "ls"})  # not in approvals: refused as before, nobody asked
    assert refused["behavior"] == "deny" and api.asked == []
    assert (await answer(_Api("denied"), "Bash", push))["behavior"] == "deny"
    assert "5s" in (await answer(_Api("timeout"), "Bash", push))["message"]
    broken = await answer(_Api(errors.ResourceExhausted("too many")), "Bash", push)
    assert broken["behavior"] == "deny" and "too many" in broken["message"]
