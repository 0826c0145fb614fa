"""One conformance suite, written once against the gRPC contract, run against a runner on each SDK through a real
host: the Python SDK's (tests/conformance/py_runner.py, served in process by the test harness) and the TypeScript
SDK's (sdk/typescript/examples/conformance-runner, installed as a plugin and started in its sandbox). Each runner
obeys a script carried in the run's input and reports what it observed; every scenario asserts the same outcome
for both."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk.testing import HostHarness
from tests.conformance.py_runner import Conformance
from tests.test_approvals import Stream, decide
from tests.typescript import CONFORMANCE, build

# The Python SDK's half is a contract test `make check` runs (the host and the runner in this process); the
# TypeScript half installs and starts a sandboxed Node plugin: end-to-end and slow.
pytestmark = [pytest.mark.timeout(180)]

TS_RUNNER = "agenthost-conformance-runner/conformance"


class Target:
    """A host with a conformance runner bound to its bot."""

    def __init__(self, harness: HostHarness, runner_id: str) -> None:
        self.h = harness
        self.runner_id = runner_id

    async def send(self, *steps: dict[str, Any], conversation: str = "c1") -> Any:
        result = await self.h.send(json.dumps({"steps": list(steps)}), conversation_id=conversation)
        return result

    def stream(self, *steps: dict[str, Any], conversation: str = "c1") -> Stream:
        return Stream(self.h.client, self.h.bot, {"steps": list(steps)}, conversation)


def observed(result: Any) -> list[Any]:
    """What the runner reported: its last message (the run's text also holds the deltas streamed before it)."""
    assert result.run.status == "completed", (result.run.status, result.run.error_code, result.run.error_message)
    return json.loads([e.message.text for e in result.events if e.WhichOneof("kind") == "message"][-1])


@pytest.fixture(params=["python", pytest.param("typescript", marks=[pytest.mark.e2e, pytest.mark.slow])])
async def target(request, tmp_path) -> AsyncIterator[Target]:
    if request.param == "python":
        async with HostHarness(tmp_path, runners=[Conformance]) as h:
            yield Target(h, "test/conformance")
        return
    build()
    async with HostHarness(tmp_path) as h:
        info = await h.host.install_plugin(str(CONFORMANCE), offline=True)
        assert info.state == "ready", info.last_error
        await h.client.bind(h.bot, TS_RUNNER)
        yield Target(h, TS_RUNNER)


# ---- run lifecycle and streaming ----


async def test_lifecycle_and_coalesced_streaming(target):
    result = await target.send({"op": "deltas", "n": 2000, "text": "abc "}, {"op": "tool", "id": "t1", "name": "x"})
    assert observed(result) == [2000, "tool"]
    kinds = result.kinds()
    assert kinds.count("text_delta") == 2000
    assert "".join(e.text_delta.text for e in result.events if e.WhichOneof("kind") == "text_delta") == "abc " * 2000
    assert kinds[-1] == "completed" and kinds.count("completed") == 1
    assert kinds.index("tool_started") < kinds.index("tool_finished") < kinds.index("message")
    run = result.run
    assert run.status == "completed"


@pytest.mark.parametrize("text", ["é—☃ ", "x" * 123, "y" * 124, "z" * 5000])
async def test_deltas_of_every_size_and_alphabet(target, text):
    """Non-ASCII text, the largest delta framed with one-byte lengths, the smallest that is not, and a long one."""
    result = await target.send({"op": "deltas", "n": 3, "text": text})
    assert observed(result) == [3]
    assert [e.text_delta.text for e in result.events if e.WhichOneof("kind") == "text_delta"] == [text] * 3


async def test_a_runner_that_throws_fails_the_run(target):
    result = await target.send({"op": "deltas", "n": 1, "text": "a"}, {"op": "fail", "message": "boom"})
    assert result.run.status == "failed" and result.run.error_code == "runner_error"
    assert "boom" in result.run.error_message
    assert result.kinds()[-1] == "failed"


async def test_cancel(target):
    s = target.stream({"op": "park"})
    await s.wait_for("progress")
    assert s.started is not None
    await target.h.client.call("CancelRun", hpb.RunRequestById(run_id=s.started.run_id))
    run = await s.finished()
    assert run.status == "cancelled"


async def test_deadline(target):
    await target.h.client.bind(target.h.bot, target.runner_id, priority=1, timeout_seconds=2)
    s = target.stream({"op": "park"})
    run = await s.finished()
    assert run.status == "timed_out"


# ---- state, history, events, artifacts ----


async def test_state_with_compare_and_set(target):
    result = await target.send(
        {"op": "state_get", "scope": "conversation", "key": "n"},
        {"op": "state_set", "scope": "conversation", "key": "n", "value": {"a": [1, 2]}, "if_version": 0},
        {"op": "state_set", "scope": "conversation", "key": "n", "value": 2, "if_version": 0},
        {"op": "state_set", "scope": "conversation", "key": "n", "value": 3, "if_version": 1},
        {"op": "state_get", "scope": "conversation", "key": "n"},
        {"op": "state_set", "scope": "run", "key": "n.b", "value": "x"},
        {"op": "state_list", "scope": "run", "prefix": "n."},
        {"op": "state_delete", "scope": "run", "key": "n.b"},
        {"op": "state_delete", "scope": "run", "key": "n.b"},
    )
    assert observed(result) == [
        {"found": False, "value": None, "version": 0},
        {"version": 1},
        {"error": "Aborted"},
        {"version": 2},
        {"found": True, "value": 3, "version": 2},
        {"version": 1},
        {"keys": ["n.b"]},
        {"deleted": True},
        {"deleted": False},
    ]
    # Conversation state outlives the run; the next run reads it.
    again = await target.send({"op": "state_get", "scope": "conversation", "key": "n"})
    assert observed(again) == [{"found": True, "value": 3, "version": 2}]


async def test_history_and_events(target):
    first = await target.send({"op": "deltas", "n": 1, "text": "x"})
    first_text = json.dumps({"steps": [{"op": "deltas", "n": 1, "text": "x"}]})
    assert observed(first) == [1]
    steps = (
        {"op": "history", "limit": 2, "direction": "backward"},
        {"op": "event_get_trigger"},
        {"op": "event_page", "limit": 5},
        {"op": "history_search", "query": "deltas"},
    )
    result = await target.send(*steps)
    history, trigger, page, search = observed(result)
    this_text = json.dumps({"steps": list(steps)})
    assert history == {"items": [["user", this_text], ["assistant", "[1]"]], "has_more": True}
    assert trigger == {"type": "message.received", "text": this_text}
    assert page["types"][:2] == ["message.received", "message.received"]
    assert first_text in search["texts"]


async def test_artifacts(target):
    result = await target.send({"op": "artifact", "name": "notes.txt", "data": "hello artifact", "mime": "text/plain"})
    (seen,) = observed(result)
    assert seen == {
        "name": "notes.txt",
        "mime": "text/plain",
        "size": 14,
        "sha256": True,
        "read": "hello artifact",
        "range": "ell",
    }
    (created,) = [e.artifact_created for e in result.events if e.WhichOneof("kind") == "artifact_created"]
    assert created.artifact.name == "notes.txt" and created.artifact.size_bytes == 14


# ---- approvals, child runs, rejections ----


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_approvals(target, decision):
    s = target.stream({"op": "approval", "tool": "shell", "summary": "rm -rf /tmp/x", "timeout": 60})
    (req,) = await s.wait_for("approval_requested")
    assert (req.tool_name, req.summary) == ("shell", "rm -rf /tmp/x")
    await decide(target.h.client, req.approval_id, decision, "because")
    run = await s.finished()
    assert run.status == "completed"
    outcome = "approved" if decision == "approve" else "denied"
    expected = [{"outcome": outcome, "approved": decision == "approve", "note": "because"}]
    assert json.loads(s.of("message")[-1].text) == expected


async def test_approval_timeout(target):
    result = await target.send({"op": "approval", "tool": "shell", "timeout": 0.5})
    assert observed(result) == [{"outcome": "timeout", "approved": False, "note": "no decision within 0.5s"}]


async def test_child_runs(target):
    result = await target.send({"op": "child", "description": "look around", "text": "found it"})
    assert observed(result) == [{"status": "completed"}]
    started = [e.subagent_started for e in result.events if e.WhichOneof("kind") == "subagent_started"]
    finished = [e.subagent_finished for e in result.events if e.WhichOneof("kind") == "subagent_finished"]
    assert [s.description for s in started] == ["look around"] and [f.status for f in finished] == ["completed"]
    child = await target.h.client.call("GetRun", hpb.RunRequestById(run_id=started[0].child_run_id))
    assert child.status == "completed" and child.text == "found it"


async def test_a_child_run_the_host_timed_out(target):
    result = await target.send({"op": "child_timeout", "timeout": 0.3})
    assert observed(result) == [{"error": "DeadlineExceeded"}]
    (finished,) = [e.subagent_finished for e in result.events if e.WhichOneof("kind") == "subagent_finished"]
    assert finished.status == "timed_out"


REJECTIONS = {
    "bad_token": "Unauthenticated",
    "other_run": "NotFound",  # the token names its own run; an id no run has is not found
    "foreign_conversation": "PermissionDenied",
    "limit_out_of_range": "OutOfRange",
    "stale_version": "Aborted",
    "missing_artifact": "NotFound",
    "empty_tool_name": "InvalidArgument",
}


async def test_every_rejection_is_the_same_typed_error(target):
    result = await target.send(*({"op": "reject", "case": case} for case in REJECTIONS))
    assert observed(result) == [{"error": name} for name in REJECTIONS.values()]


async def test_an_api_the_binding_does_not_grant_is_refused(target):
    await target.h.client.bind(target.h.bot, target.runner_id, priority=1, apis=["state.read"])
    result = await target.send({"op": "reject", "case": "state_write_not_granted"}, {"op": "kb_search", "query": "x"})
    assert result.run.status == "failed" and result.run.error_code == "host_permission_denied"
    result = await target.send({"op": "reject", "case": "state_write_not_granted"})
    assert observed(result) == [{"error": "PermissionDenied"}]


async def test_kb_search(target):
    result = await target.send({"op": "kb_search", "query": "anything"})
    (seen,) = observed(result)
    assert seen["hits"] == 0


# ---- the Runner service's other calls: ValidateConfig and ListModels ----


async def test_the_runners_own_config_check_and_its_models(target):
    from agenthost.protos import errors

    with pytest.raises(errors.InvalidArgument, match="refuse: not today"):
        await target.h.client.bind(target.h.bot, target.runner_id, {"refuse": "not today"}, priority=2)
    await target.h.client.bind(target.h.bot, target.runner_id, {"model": "m7"}, priority=2)
    listed = await target.h.client.call("ListModels", hpb.ListModelsAdminRequest(bot=target.h.bot))
    models = sorted((m.provider, m.model) for b in listed.bindings for m in b.models)
    assert ("conformance", "m7") in models and ("conformance", "m1") in models
