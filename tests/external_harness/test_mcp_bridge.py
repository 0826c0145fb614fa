"""The bridge as a harness sees it: a subprocess speaking MCP over stdio, backed by the (fake) host."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from agenthost.runners.external_harness import mcp_bridge
from agenthost.runners.external_harness.projection import BridgeLaunch


class BridgeClient:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        assert self.proc.stdout
        line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
        reply = json.loads(line)
        assert reply["id"] == self.next_id
        return reply

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        return (await self.request("tools/call", {"name": tool, "arguments": args}))["result"]


async def _spawn(env_extra: dict[str, str]) -> BridgeClient:
    launch = BridgeLaunch()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **launch.env, **env_extra}
    proc = await asyncio.create_subprocess_exec(
        launch.command,
        *launch.args,
        env=env,
        cwd="/",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return BridgeClient(proc)


async def _close(client: BridgeClient) -> None:
    assert client.proc.stdin
    client.proc.stdin.close()
    try:
        await asyncio.wait_for(client.proc.wait(), 5)
    except TimeoutError:
        client.proc.kill()
        await client.proc.wait()


def _creds(fake_host, **override: str) -> dict[str, str]:
    creds = {
        "AGENTHOST_HOST_ADDRESS": fake_host.address,
        "AGENTHOST_RUN_ID": fake_host.data.run_id,
        # The tool token, presented alone: the bridge never holds the runner plugin's secret.
        "AGENTHOST_RUN_TOKEN": fake_host.data.tool_token,
        "AGENTHOST_DEADLINE_AT": "0",
        "AGENTHOST_EVENT_ID": "evt-1",
    }
    creds.update(override)
    return creds


@pytest.mark.slow
async def test_bridge_serves_host_data_over_stdio(fake_host) -> None:
    fake_host.data.add_item("user", "what is MARKER-42?")
    fake_host.data.add_item("assistant", "an answer")
    fake_host.data.add_event("the current message", "evt-1")
    client = await _spawn(_creds(fake_host))
    try:
        init = await client.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        )
        assert init["result"]["protocolVersion"] == "2025-06-18"
        assert init["result"]["serverInfo"]["name"] == "agenthost"
        await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert (await client.request("ping"))["result"] == {}
        tools = (await client.request("tools/list"))["result"]["tools"]
        assert [t["name"] for t in tools] == list(mcp_bridge.TOOL_NAMES)
        # Each in Claude Code's first request without the server's `alwaysLoad` (which would hold its start-up).
        assert all(t["_meta"] == {"anthropic/alwaysLoad": True} for t in tools)

        page = await client.call("history_page", limit=1)
        assert not page["isError"] and page["structuredContent"]["items"][0]["text"] == "an answer"
        older = await client.call("history_page", limit=1, cursor=page["structuredContent"]["next_cursor"])
        assert "MARKER-42" in older["content"][0]["text"]
        assert (await client.call("history_search", query="marker-42"))["structuredContent"]["items"]
        event = await client.call("current_event")
        assert event["structuredContent"]["event"]["text"] == "the current message"

        assert (await client.call("state_set", scope="conversation", key="note", value={"a": 1}))[
            "structuredContent"
        ] == {"version": 1}
        got = (await client.call("state_get", scope="conversation", key="note"))["structuredContent"]
        assert got == {"found": True, "value": {"a": 1}, "version": 1}
        stale = await client.call("state_set", scope="conversation", key="note", value=2, if_version=0)
        assert stale["isError"] and "Aborted" in stale["content"][0]["text"]

        from agenthost.protos import common_pb2 as pb

        fake_host.data.artifacts["art-1"] = (
            pb.ArtifactRef(artifact_id="art-1", name="notes.txt", mime_type="text/plain", size_bytes=11),
            b"hello world",
        )
        art = (await client.call("artifact_read", artifact_id="art-1", offset=6, length=5))["structuredContent"]
        assert art["text"] == "world" and art["eof"] and art["artifact"]["name"] == "notes.txt"
        fake_host.data.artifacts["art-2"] = (pb.ArtifactRef(artifact_id="art-2", name="b.bin"), b"\xff\x00")
        assert (await client.call("artifact_read", artifact_id="art-2"))["structuredContent"]["base64"] == "/wA="

        # Bad input is a tool error the model can read, never a dead server.
        bad = await client.call("state_get", scope="galaxy", key="k")
        assert bad["isError"] and "scope" in bad["content"][0]["text"]
        missing = await client.call("event_get", event_id="nope")
        assert missing["isError"] and "NotFound" in missing["content"][0]["text"]
        unknown = await client.request("tools/call", {"name": "rm_rf", "arguments": {}})
        assert unknown["error"]["code"] == -32602  # the spec's "Unknown tool": a protocol error, not a tool result
        assert (await client.request("no/such/method"))["error"]["code"] == -32601

        # The host revokes the token when the run ends: the tools stop working.
        fake_host.data.revoked = True
        revoked = await client.call("history_page")
        assert revoked["isError"] and "Unauthenticated" in revoked["content"][0]["text"]
    finally:
        await _close(client)
    assert "HistoryPage" in fake_host.data.calls
    assert set(fake_host.data.callers) == {"tool"}  # every call came with the tool token, none as the runner


@pytest.mark.slow
async def test_bridge_without_credentials_still_answers(fake_host) -> None:
    client = await _spawn({})
    try:
        assert (await client.request("initialize", {"protocolVersion": "1999-01-01"}))["result"][
            "protocolVersion"
        ] == mcp_bridge.LATEST_PROTOCOL
        result = await client.call("history_page")
        assert result["isError"] and "AGENTHOST_RUN_TOKEN" in result["content"][0]["text"]
    finally:
        await _close(client)


async def test_bridge_handles_parse_errors_in_process() -> None:
    server = mcp_bridge.McpServer(None, unavailable_reason="test")
    assert (await server.handle({"jsonrpc": "1.0"}))["error"]["code"] == -32600
    assert await server.handle({"jsonrpc": "2.0", "method": "notifications/cancelled"}) is None
    assert (await server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": []}))["error"][
        "code"
    ] == -32602


def test_bridge_module_runs_as_main() -> None:
    assert BridgeLaunch().args == ("-m", "agenthost.runners.external_harness.mcp_bridge")
    assert sys.executable == BridgeLaunch().command


@pytest.mark.slow
async def test_bridge_offers_only_granted_tools(fake_host) -> None:
    client = await _spawn(_creds(fake_host, AGENTHOST_APIS="history.page,state.read"))
    try:
        await client.request("initialize", {"protocolVersion": "2025-06-18"})
        tools = (await client.request("tools/list"))["result"]["tools"]
        assert [t["name"] for t in tools] == ["history_page", "state_get"]
        refused = await client.request("tools/call", {"name": "state_set", "arguments": {"scope": "run"}})
        assert refused["error"]["code"] == -32602 and "Unknown tool" in refused["error"]["message"]
        assert not (await client.call("history_page"))["isError"]
    finally:
        await _close(client)
    assert "StateSet" not in fake_host.data.calls
