"""The host MCP bridge over Claude Code's control protocol (mcp_control.py), driven as an untrusted harness would drive
it: the real CLI's part is in test_real_clis.py; here, what a harness could send that the CLI never does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agenthost.runners.external_harness import mcp_bridge, mcp_control
from agenthost.runners.external_harness.mcp_control import McpControl

from .fake_run_api import HOLD_QUERY
from .test_mcp_http import APIS, _creds

pytestmark = [pytest.mark.timeout(60)]


class Harness:
    """The harness's side of the pipes: control lines in, control responses out."""

    def __init__(self, control: McpControl) -> None:
        self.control = control
        self.responses: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        control.send = self._read

    async def _read(self, data: bytes) -> None:
        assert data.endswith(b"\n") and data.count(b"\n") == 1  # one JSON line per response
        line = json.loads(data)
        assert line["type"] == "control_response"
        await self.responses.put(line["response"])

    def request(self, request_id: Any, request: Any) -> None:
        self.control.receive({"type": "control_request", "request_id": request_id, "request": request})

    def mcp(self, request_id: str, message: dict[str, Any], server: str = "agenthost") -> None:
        self.request(request_id, {"subtype": "mcp_message", "server_name": server, "message": message})

    async def response(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.responses.get(), 15)


def _call(msg_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.fixture
async def harness(fake_host):
    control = McpControl(tools=mcp_bridge.tools_for(APIS))
    creds = _creds(fake_host)
    await control.attach(lambda: mcp_bridge.bridge_from_env(creds))
    yield Harness(control)
    await control.close()


async def test_the_handshake_and_a_call(harness: Harness) -> None:
    client = {"name": "claude-code", "version": "x"}
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client}
    harness.mcp("r1", {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
    init = await harness.response()
    assert init == {"subtype": "success", "request_id": "r1", "response": init["response"]}
    assert init["response"]["mcp_response"]["result"]["protocolVersion"] == "2025-11-25"
    # A notification has no MCP reply, but its control request still gets its response.
    harness.mcp("r2", {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert (await harness.response())["response"]["mcp_response"] == {"jsonrpc": "2.0", "result": {}}
    harness.mcp("r3", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    listed = (await harness.response())["response"]["mcp_response"]["result"]["tools"]
    assert {t["name"] for t in listed} == set(mcp_bridge.tools_for(APIS))
    harness.mcp("r4", _call(2, "history_search", {"query": "conformance"}))
    answered = await harness.response()
    assert answered["request_id"] == "r4" and not answered["response"]["mcp_response"]["result"]["isError"]


@pytest.mark.parametrize(
    "request_body, error",
    [
        # What the CLI sends an SDK that asked for it, never this runner: nothing to grant or run through it.
        ({"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "id"}}, "unsupported control request"),
        ({"subtype": "hook_callback", "callback_id": "hook_0", "input": {}}, "unsupported control request"),
        ("not an object", "unsupported control request"),
        ({"subtype": "mcp_message", "server_name": "someone-else", "message": {"jsonrpc": "2.0", "id": 1}}, "no such"),
        ({"subtype": "mcp_message", "server_name": "agenthost", "message": "not an object"}, "no such"),
    ],
)
async def test_what_the_runner_did_not_ask_for_is_refused(harness: Harness, request_body: Any, error: str) -> None:
    harness.request("x1", request_body)
    answered = await harness.response()
    assert answered["subtype"] == "error" and answered["request_id"] == "x1" and error in answered["error"]


async def test_requests_without_an_id_to_answer_are_dropped(harness: Harness) -> None:
    for bad in (None, 7, "", ["r"]):
        harness.mcp(bad, _call(1, "history_search", {"query": "x"}))  # type: ignore[arg-type]
    harness.mcp("after", {"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert (await harness.response())["request_id"] == "after"
    assert harness.responses.empty()


async def test_a_cancelled_request_is_stopped_at_the_host_and_not_answered(harness: Harness, fake_host) -> None:
    harness.mcp("held", _call(1, "history_search", {"query": HOLD_QUERY}))
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    harness.control.receive({"type": "control_cancel_request", "request_id": "held"})
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
    harness.mcp("next", {"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert (await harness.response())["request_id"] == "next"  # and nothing for "held", ever
    assert harness.responses.empty()


async def test_detaching_the_run_stops_its_calls_and_refuses_the_next(harness: Harness, fake_host) -> None:
    from agenthost.runners.external_harness.warm import BETWEEN_TURNS

    harness.mcp("held", _call(1, "history_search", {"query": HOLD_QUERY}))
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    await harness.control.attach(None, unavailable_reason=BETWEEN_TURNS)  # the turn ended
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)
    stopped = await harness.response()
    assert stopped["request_id"] == "held" and stopped["subtype"] == "error"  # never the call's result
    fake_host.data.gate.set()
    calls = len(fake_host.data.callers)
    harness.mcp("between", _call(2, "history_search", {"query": "x"}))
    between = (await harness.response())["response"]["mcp_response"]["result"]
    assert between["isError"] and BETWEEN_TURNS in json.dumps(between)
    assert len(fake_host.data.callers) == calls  # nothing reached the host


async def test_requests_in_flight_are_capped(harness: Harness, fake_host, monkeypatch) -> None:
    monkeypatch.setattr(mcp_control, "MAX_INFLIGHT", 3)
    for n in range(3):
        harness.mcp(f"held-{n}", _call(n, "history_search", {"query": HOLD_QUERY}))
    harness.mcp("over", _call(9, "history_search", {"query": "x"}))
    refused = await harness.response()
    assert refused["request_id"] == "over" and "in flight" in refused["error"]
    fake_host.data.gate.set()
    answered = {(await harness.response())["request_id"] for _ in range(3)}
    assert answered == {"held-0", "held-1", "held-2"}


async def test_a_harness_that_reads_no_answers_cannot_pile_up_work(fake_host) -> None:
    """A harness that floods control requests and never reads its stdin: each answer would wait on a full pipe
    forever. What the runner holds for it stays bounded, whatever it sends."""
    blocked = asyncio.Event()

    async def full_pipe(_: bytes) -> None:
        await blocked.wait()  # never set: the harness reads nothing

    control = McpControl(full_pipe, tools=mcp_bridge.tools_for(APIS))
    try:
        for n in range(5_000):
            request = {"subtype": "can_use_tool"} if n % 2 else {"subtype": "mcp_message", "server_name": "x"}
            control.receive({"type": "control_request", "request_id": f"r{n}", "request": request})
        await asyncio.sleep(0)
        assert len(control._tasks) == mcp_control.MAX_PENDING
    finally:
        await control.close()
