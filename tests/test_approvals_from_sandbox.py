"""An approval request made with the run's tool token — what every process inside the run's sandbox can present: an
external harness's permission prompt, but also any command the model runs there — is marked by the host as coming
from inside the sandbox, and every renderer (CLI, Telegram, web console) says so: a person can tell a prompt the
model's side wrote from one the runner process asked (ApprovalRequest has no field to set or clear the mark)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host.cli.render import approval_line
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import run_api_pb2_grpc as api_grpc
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.api import RunAPI
from agenthost.runners.sdk.testing import HostHarness
from tests.test_approvals import Stream, decide

pytestmark = pytest.mark.timeout(60)

LABEL = "inside the run's sandbox"


class TwoDoors(Runner):
    """{"via": "sandbox"}: asks as a model-run command would, with the tool token alone; otherwise as the runner."""

    manifest = RunnerManifest(name="two-doors")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        spec = json.loads(run.text)
        ask = {"summary": "host maintenance: approve to continue", "arguments": {"command": "true"}}
        if spec["via"] == "sandbox":
            async with grpc.aio.insecure_channel(run.api.host_address) as channel:
                api = RunAPI(
                    api_grpc.AgentRunAPIProxyStub(channel),
                    run_id=run.run_id,
                    run_token=run.tool_token,
                    deadline_at=run.deadline_at,
                )
                decision = await api.request_approval("Bash", **ask)
        else:
            decision = await run.request_approval("shell", **ask)
        yield events.text(decision.outcome)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[HostHarness]:
    async with HostHarness(tmp_path, runners=[TwoDoors]) as harness:
        yield harness


async def test_a_tool_token_request_is_marked_and_shown_as_from_the_sandbox(h: HostHarness) -> None:
    sandbox = Stream(h.client, h.bot, {"via": "sandbox"}, conversation="s")
    runner = Stream(h.client, h.bot, {"via": "runner"}, conversation="r")
    (from_sandbox,) = await sandbox.wait_for("approval_requested")
    (from_runner,) = await runner.wait_for("approval_requested")
    assert from_sandbox.from_sandbox and not from_runner.from_sandbox
    listed = {a.approval_id: a for a in (await h.client.call("ListApprovals", hpb.ListApprovalsRequest())).approvals}
    assert listed[from_sandbox.approval_id].request.from_sandbox
    assert not listed[from_runner.approval_id].request.from_sandbox

    assert LABEL in approval_line(from_sandbox) and LABEL not in approval_line(from_runner)
    from agenthost.channels.telegram.approvals import render_request

    assert LABEL in render_request(from_sandbox) and LABEL not in render_request(from_runner)
    script = (Path(__file__).parents[1] / "host" / "api" / "gateway" / "console_static" / "approvals.js").read_text()
    assert "request.from_sandbox" in script and LABEL in script

    await decide(h.client, from_sandbox.approval_id, "deny")
    await decide(h.client, from_runner.approval_id, "approve")
    assert (await sandbox.finished()).text == "denied" and (await runner.finished()).text == "approved"
