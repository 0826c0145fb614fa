"""The local agent's `approvals` config end to end: real host, SDK server, LocalAgentRunner, scripted model on
loopback. A gated tool call waits for DecideApproval; approve runs it, deny / timeout / cancel never do, and the
model reads why in the tool result."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.approvals import approval_reason
from agenthost.runners.local_agent.config import ApprovalsConfig, ConfigError, LocalAgentConfig
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(90)


def cfg(server: FakeProviderServer, tmp_path: Path, **approvals: Any) -> dict[str, Any]:
    (tmp_path / "ws").mkdir(exist_ok=True)  # a binding's workspace must exist: the host checks it at bind time
    return {
        "model": "vllm/m",
        "base_url": server.url + "/v1",
        "context_window": 32_000,
        "max_retries": 0,
        "workspace": str(tmp_path / "ws"),
        "approvals": approvals,
    }


class Watch:
    """A send streamed in the background, so the test can act on the approval request when it appears."""

    def __init__(self, h: HostHarness, text: str, conversation: str) -> None:
        self.events: list[pb.RunEvent] = []
        self.run: hpb.RunInfo | None = None
        self.run_id = ""
        self._seen = asyncio.Event()
        request = hpb.SendMessageRequest(bot=h.bot, text=text, conversation_id=conversation)
        self.task = asyncio.create_task(self._pump(h, request))

    async def _pump(self, h: HostHarness, request: hpb.SendMessageRequest) -> None:
        async for reply in h.client.stream(request):
            kind = reply.WhichOneof("kind")
            if kind == "run_started":
                self.run_id = reply.run_started.run_id
            elif kind == "events":
                self.events.extend(reply.events.events)
                if any(e.WhichOneof("kind") == "approval_requested" for e in reply.events.events):
                    self._seen.set()
            elif kind == "run_finished":
                self.run = reply.run_finished

    async def request(self) -> pb.ApprovalRequested:
        await asyncio.wait_for(self._seen.wait(), 30)
        return next(e.approval_requested for e in self.events if e.WhichOneof("kind") == "approval_requested")

    async def finished(self) -> hpb.RunInfo:
        await asyncio.wait_for(self.task, 60)
        assert self.run is not None
        return self.run

    def results(self) -> list[pb.ToolFinished]:
        return [e.tool_finished for e in self.events if e.WhichOneof("kind") == "tool_finished"]


async def decide(h: HostHarness, approval_id: str, decision: str, note: str = "") -> None:
    await h.client.call(
        "DecideApproval", hpb.DecideApprovalRequest(approval_id=approval_id, decision=decision, note=note)
    )


def last_tool_message(server: FakeProviderServer) -> str:
    msgs = server.model_requests[-1].json()["messages"]
    return next(m["content"] for m in reversed(msgs) if m["role"] == "tool")


async def test_approved_call_runs_denied_call_does_not_and_the_model_is_told(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = cfg(server, tmp_path, tools=["write_*"])
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            server.push(
                openai_tool_calls([("c1", "write_file", {"path": "yes.txt", "content": "ok"})]),
                openai_text("Done."),
            )
            w = Watch(h, "write yes.txt", "a")
            req = await w.request()
            assert req.tool_name == "write_file" and req.tool_call_id == "c1"
            assert "write_file" in req.summary and "matches approvals.tools 'write_*'" in req.reason
            assert json.loads(req.arguments_json) == {"path": "yes.txt", "content": "ok"}
            assert not list((tmp_path / "ws").rglob("yes.txt"))  # nothing ran before the decision
            await decide(h, req.approval_id, "approve")
            run = await w.finished()
            assert run.status == "completed" and run.text.endswith("Done.")
            assert [p.read_text() for p in (tmp_path / "ws").rglob("yes.txt")] == ["ok"]
            assert not w.results()[0].is_error

            server.push(
                openai_tool_calls([("c2", "write_file", {"path": "no.txt", "content": "x"})]),
                openai_text("Understood."),
            )
            w = Watch(h, "write no.txt", "a")
            req = await w.request()
            await decide(h, req.approval_id, "deny", "not today")
            run = await w.finished()
            assert run.status == "completed"  # a denial is information for the model, not a failed run
            assert not list((tmp_path / "ws").rglob("no.txt"))
            told = last_tool_message(server)
            assert "the user denied it" in told and "not today" in told
            assert w.results()[0].is_error


async def test_unanswered_request_times_out_as_denied(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = cfg(server, tmp_path, tools=["write_file"], timeout_seconds=0.5)
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            server.push(
                openai_tool_calls([("c1", "write_file", {"path": "t.txt", "content": "x"})]),
                openai_text("I'll wait."),
            )
            w = Watch(h, "write t.txt", "t")
            await w.request()
            run = await w.finished()
            assert run.status == "completed"
            assert "nobody answered the approval request within 0.5s" in last_tool_message(server)
            assert "treated as denied" in last_tool_message(server)
            assert not list((tmp_path / "ws").rglob("t.txt"))
            resolved = [e.approval_resolved for e in w.events if e.WhichOneof("kind") == "approval_resolved"]
            assert [r.outcome for r in resolved] == ["timeout"]


async def test_shell_command_patterns_and_cancel_while_waiting(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        config = cfg(server, tmp_path, commands=["rm *"], timeout_seconds=120)
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            # a compound command still asks: the pattern is matched against each part
            server.push(openai_tool_calls([("c1", "shell", {"command": "echo hi; rm -rf important"})]))
            w = Watch(h, "clean up", "s")
            req = await w.request()
            assert req.summary == "echo hi; rm -rf important" and "'rm *'" in req.reason
            cancelled = await h.client.call("CancelRun", hpb.RunRequestById(run_id=w.run_id))
            assert cancelled.status == "cancelled"
            run = await w.finished()
            assert run.status == "cancelled"
            resolved = [e.approval_resolved for e in w.events if e.WhichOneof("kind") == "approval_resolved"]
            assert [r.outcome for r in resolved] == ["cancelled"]
            pending = await h.client.call("ListApprovals", hpb.ListApprovalsRequest())
            assert list(pending.approvals) == []


async def test_a_command_hidden_in_an_if_still_asks_and_does_not_run_when_denied(tmp_path: Path) -> None:
    """The line is parsed, not split on operators: `if …; then rm x; fi` has no part that starts with `rm`."""
    async with FakeProviderServer() as server:
        config = cfg(server, tmp_path, commands=["rm *"], timeout_seconds=120)
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            line = "touch keep; if true; then rm keep; fi"
            server.push(openai_tool_calls([("c1", "shell", {"command": line})]), openai_text("Understood."))
            w = Watch(h, "clean up", "i")
            req = await w.request()
            assert req.summary == line and req.reason == "command matches approvals.commands 'rm *' ('rm keep')"
            await decide(h, req.approval_id, "deny")
            run = await w.finished()
            assert run.status == "completed" and "the user denied it" in last_tool_message(server)
            assert not list((tmp_path / "ws").rglob("keep"))  # nothing of the line ran, not even its `touch`


def test_matching_rules() -> None:
    c = ApprovalsConfig(tools=["write_*", "re:^mcp__"], commands=["rm *", "git push*", "re:curl\\s"])
    assert approval_reason(c, "write_file", {})
    assert approval_reason(c, "mcp__gh__create_issue", {})
    assert not approval_reason(c, "read_file", {})
    for command in ("rm -rf x", "ls && rm x", "ls | rm x", "(rm x)", "echo `rm x`", "echo $(rm x)", "a\nrm x"):
        assert approval_reason(c, "shell", {"command": command}), command
    assert approval_reason(c, "shell", {"command": "git push origin main"})
    assert approval_reason(c, "shell", {"command": "x=1 curl http://x"})
    assert not approval_reason(c, "shell", {"command": "ls -la; echo rm"})
    assert not approval_reason(c, "read_file", {"command": "rm x"})  # commands apply to the shell tool only
    assert not approval_reason(ApprovalsConfig(), "shell", {"command": "rm x"})


def test_config_errors_are_clear() -> None:
    for bad, needle in (
        ({"commands": ["re:("]}, "not a valid regular expression"),
        ({"tools": [" "]}, "not blank"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"tool": ["x"]}, "approvals.tool"),
    ):
        with pytest.raises(ConfigError, match=needle):
            LocalAgentConfig.parse({"approvals": bad})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("touch keep; env --split-string='rm keep'", "command matches approvals.commands 'rm *' ('rm keep')"),
        ("touch keep; env -iS'rm keep'", "may carry a command to run"),
        ("touch keep; LD_PRELOAD=./evil.so ls", "it sets LD_PRELOAD"),
        ("touch keep; bash -lc 'tidy keep'", "reads startup files"),
    ],
)
async def test_a_command_run_through_a_wrapper_option_or_startup_files_asks(
    tmp_path: Path, line: str, reason: str
) -> None:
    """Each ran `rm` (or code of the line's choosing) unapproved: a wrapper's option holding the command, a library
    the loader injects, a login shell reading a ~/.profile an earlier call wrote (`tidy() { rm "$@"; }`)."""
    async with FakeProviderServer() as server:
        config = cfg(server, tmp_path, commands=["rm *"], timeout_seconds=120)
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            server.push(openai_tool_calls([("c1", "shell", {"command": line})]), openai_text("Understood."))
            w = Watch(h, "clean up", "i")
            req = await w.request()
            assert req.summary == line and reason in req.reason, req.reason
            await decide(h, req.approval_id, "deny")
            run = await w.finished()
            assert run.status == "completed" and "the user denied it" in last_tool_message(server)
            assert not list((tmp_path / "ws").rglob("keep"))  # nothing of the line ran
