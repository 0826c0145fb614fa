"""The host MCP bridge against the MCP spec, for every protocol version it negotiates.

Two halves: the official `mcp` client SDK (a dev dependency; the bridge itself never imports it) drives the bridge
as a subprocess over stdio the way a harness would; raw JSON lines then cover what that client never sends:
batches, ids it would not use, cancellation races and oversize input.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agenthost.runners.external_harness import mcp_bridge

from .fake_run_api import HOLD_QUERY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

VERSIONS = mcp_bridge.SUPPORTED_PROTOCOLS
MODULE = ["-m", "agenthost.runners.external_harness.mcp_bridge"]


def _env(fake_host) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AGENTHOST_HOST_ADDRESS": fake_host.address,
        "AGENTHOST_RUN_ID": fake_host.data.run_id,
        "AGENTHOST_RUN_TOKEN": fake_host.data.tool_token,
        "AGENTHOST_DEADLINE_AT": "0",
        "AGENTHOST_EVENT_ID": "evt-1",
        "AGENTHOST_APIS": "history.page,history.search,state.read,state.write",
    }


# ---- the official client SDK ----


@pytest.mark.parametrize("version", VERSIONS)
async def test_sdk_client_session(version: str, fake_host, monkeypatch) -> None:
    mcp = pytest.importorskip("mcp", reason="the conformance test needs the dev extra (pip install mcp)")
    import mcp.client.session as client_session
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError

    # The SDK offers its newest handshake version; pinning it here makes the bridge negotiate each version.
    monkeypatch.setattr(client_session, "LATEST_HANDSHAKE_VERSION", version)
    fake_host.data.add_item("user", "MARKER-CONFORMANCE-1")
    params = mcp.StdioServerParameters(command=sys.executable, args=MODULE, env=_env(fake_host))
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with mcp.ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.protocol_version == version
                caps = init.capabilities
                assert caps.tools is not None and caps.resources is None and caps.prompts is None
                assert init.server_info.name == "agenthost"
                await session.send_ping()

                tools = (await session.list_tools()).tools
                assert [t.name for t in tools] == ["history_page", "history_search", "state_get", "state_set"]
                page = await session.call_tool("history_page", {"limit": 5})
                assert not page.is_error and "MARKER-CONFORMANCE-1" in page.content[0].text
                # structuredContent exists from 2025-06-18 on; older versions get the JSON as text only.
                assert (page.structured_content is not None) == (version >= "2025-06-18")

                bad_args = await session.call_tool("state_get", {"scope": "galaxy", "key": "k"})
                assert bad_args.is_error and "scope" in bad_args.content[0].text  # a tool error the model reads

                with pytest.raises(MCPError) as unknown:
                    await session.call_tool("rm_rf", {})
                assert unknown.value.error.code == -32602
                with pytest.raises(MCPError) as ungranted:  # a tool outside the run's grant does not exist
                    await session.call_tool("event_get", {"event_id": "evt-1"})
                assert ungranted.value.error.code == -32602
                for undeclared in (session.list_resources, session.list_prompts):
                    with pytest.raises(MCPError) as err:
                        await undeclared()
                    assert err.value.error.code == -32601

                # The SDK gives up on a slow call and sends notifications/cancelled; the bridge must stop the
                # host call (seen by the fake host as a gRPC cancel) and still serve the session.
                with pytest.raises(MCPError):
                    await session.call_tool("history_search", {"query": HOLD_QUERY}, read_timeout_seconds=1.0)
                await asyncio.wait_for(fake_host.data.held_gone.wait(), 10)
                await session.send_ping()
                assert not (await session.call_tool("history_search", {"query": "conformance"})).is_error


# ---- raw JSON lines ----


class Raw:
    """A bridge subprocess driven line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, message: Any) -> None:
        await self.write(json.dumps(message).encode() + b"\n")

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def read(self, timeout: float = 15) -> Any:
        assert self.proc.stdout
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert line, "the bridge closed its stdout"
        return json.loads(line)

    async def initialize(self, version: str) -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": "init",
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
        )
        assert (await self.read())["result"]["protocolVersion"] == version
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def rest(self) -> list[Any]:
        """Closes stdin and returns every line the bridge still writes before it exits."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.close()
        data = await asyncio.wait_for(self.proc.stdout.read(), 15)
        await asyncio.wait_for(self.proc.wait(), 15)
        return [json.loads(line) for line in data.splitlines() if line.strip()]


@pytest.fixture
async def raw(fake_host) -> AsyncIterator[Raw]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *MODULE,
        env=_env(fake_host),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=64 * 1024 * 1024,
    )
    try:
        yield Raw(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _ping(msg_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "ping"}


async def test_batches_only_in_2025_03_26(raw: Raw) -> None:
    # Before any version is negotiated, a batch is refused like any other invalid request.
    await raw.send([_ping(1)])
    refused = await raw.read()
    assert refused["id"] is None and refused["error"]["code"] == -32600
    await raw.initialize("2025-03-26")
    await raw.send([_ping(2), {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, {"jsonrpc": "2.0", "method": "x"}])
    replies = await raw.read()
    assert isinstance(replies, list) and sorted(r["id"] for r in replies) == [2, 3]  # nothing for the notification
    assert next(r for r in replies if r["id"] == 3)["result"]["tools"]
    # Per JSON-RPC: a bad member gets its own error inside the batch reply; an empty batch one error; a batch of
    # notifications no reply at all (the next line is the ping after it).
    await raw.send([1, _ping(4), {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {}}])
    mixed = {json.dumps(r["id"]): r for r in await raw.read()}
    assert mixed["null"]["error"]["code"] == -32600 and "result" in mixed["4"]
    assert mixed["5"]["error"]["code"] == -32600  # initialize MUST NOT be part of a batch
    await raw.send([])
    assert (await raw.read())["error"]["code"] == -32600
    await raw.send([{"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}])
    await raw.send(_ping(6))
    assert (await raw.read())["id"] == 6


@pytest.mark.parametrize("version", [v for v in VERSIONS if v != "2025-03-26"])
async def test_batches_refused_where_the_version_has_none(version: str, raw: Raw) -> None:
    await raw.initialize(version)
    await raw.send([_ping(1), _ping(2)])
    refused = await raw.read()
    assert isinstance(refused, dict) and refused["id"] is None and refused["error"]["code"] == -32600
    assert version in refused["error"]["message"]
    await raw.send(_ping(3))
    assert (await raw.read()) == {"jsonrpc": "2.0", "id": 3, "result": {}}


@pytest.mark.parametrize("version", ["2025-03-26", "2025-11-25"])
async def test_a_cancelled_call_gets_no_response(version: str, raw: Raw, fake_host) -> None:
    await raw.initialize(version)
    held = {"name": "history_search", "arguments": {"query": HOLD_QUERY}}
    await raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": held})
    await asyncio.wait_for(fake_host.data.held.wait(), 15)
    await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "t"}})
    await asyncio.wait_for(fake_host.data.held_gone.wait(), 15)  # the host call was cancelled too
    fake_host.data.gate.set()  # a call that kept running would now finish and answer
    # Cancelling an unknown id, or one of another type ("7" is not 7), is no error and changes nothing.
    await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "7"}})
    await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}})
    if version == "2025-03-26":  # a cancelled member of a batch is left out of the batch's reply
        fake_host.data.gate.clear()
        fake_host.data.held.clear()
        await raw.send([{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": held}, _ping(9)])
        await asyncio.wait_for(fake_host.data.held.wait(), 15)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 8}})
        assert [r["id"] for r in await raw.read()] == [9]
        fake_host.data.gate.set()
    await raw.send(_ping(10))
    assert (await raw.read())["id"] == 10
    assert all(r.get("id") not in (7, 8) for r in await raw.rest())


async def test_protocol_errors(raw: Raw) -> None:
    await raw.initialize("2025-11-25")
    await raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "rm_rf", "arguments": {}}})
    assert (await raw.read())["error"]["code"] == -32602
    await raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"arguments": {}}})
    assert (await raw.read())["error"]["code"] == -32602
    for method in ("resources/list", "resources/templates/list", "prompts/list", "logging/setLevel"):
        await raw.send({"jsonrpc": "2.0", "id": method, "method": method, "params": {}})
        assert (await raw.read()) == {
            "jsonrpc": "2.0",
            "id": method,
            "error": {"code": -32601, "message": f"method not found: {method}"},
        }
    # An id MCP forbids (null; also not a string or integer) is an invalid request, answered with id null; it is
    # never run as the request it claims to be.
    for bad_id in (None, 1.5, True, {"a": 1}, [1]):
        await raw.send({"jsonrpc": "2.0", "id": bad_id, "method": "tools/list"})
        reply = await raw.read()
        assert reply["id"] is None and reply["error"]["code"] == -32600 and "result" not in reply
    await raw.write(b'{"jsonrpc": "2.0", "id": 3, "method": \n')
    assert (await raw.read()) == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
    await raw.send({"jsonrpc": "1.0", "id": 4, "method": "ping"})
    assert (await raw.read())["error"]["code"] == -32600
    await raw.send({"jsonrpc": "2.0", "id": 5})  # neither a request nor a response
    assert (await raw.read())["error"]["code"] == -32600
    # Notifications and responses are never answered: the next line is the ping's.
    await raw.send({"jsonrpc": "2.0", "method": "no/such/notification"})
    await raw.send({"jsonrpc": "2.0", "id": 6, "result": {}})
    await raw.send(_ping(7))
    assert (await raw.read())["id"] == 7


async def test_oversize_line_is_answered_and_skipped(raw: Raw) -> None:
    await raw.initialize("2025-06-18")
    head = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "state_set", "arguments": '
    await raw.write(head + b'{"value": "' + b"x" * mcp_bridge.MAX_LINE)
    # Answered as soon as the line crosses the limit, before it even ends: the client is waiting for a reply.
    refused = await raw.read()
    assert refused["id"] is None and refused["error"]["code"] == -32600 and "longer than" in refused["error"]["message"]
    await raw.write(b"y" * (1024 * 1024) + b'"}}}\n')  # the rest of that line is skipped, not parsed
    await raw.send(_ping(2))
    assert (await raw.read()) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert await raw.rest() == []


# ---- MCP 2026-07-28 over stdio: the first request picks the era ----

MODERN = "2026-07-28"


def _modern(msg_id: Any, method: str, params: dict[str, Any] | None = None, version: str = MODERN) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": version, "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {**(params or {}), "_meta": meta}}


async def test_sdk_client_speaks_2026_07_28(fake_host) -> None:
    mcp = pytest.importorskip("mcp", reason="the conformance test needs the dev extra (pip install mcp)")
    from mcp.client.client import Client
    from mcp.shared.exceptions import MCPError

    fake_host.data.add_item("user", "MARKER-CONFORMANCE-2026")
    params = mcp.StdioServerParameters(command=sys.executable, args=MODULE, env=_env(fake_host))
    # mode="auto" sends server/discover first and keeps 2026-07-28 only if the bridge answers it as such.
    async with Client(params, mode="auto", cache=None) as client:
        assert client.protocol_version == MODERN
        assert client.server_info is not None and client.server_info.name == "agenthost"
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == ["history_page", "history_search", "state_get", "state_set"]
        page = await client.call_tool("history_page", {"limit": 5})
        assert not page.is_error and "MARKER-CONFORMANCE-2026" in page.content[0].text
        assert page.structured_content is not None
        bad_args = await client.call_tool("state_get", {"scope": "galaxy", "key": "k"})
        assert bad_args.is_error and "scope" in bad_args.content[0].text
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("rm_rf", {})
        assert unknown.value.error.code == -32602
        with pytest.raises(MCPError) as undeclared:
            await client.list_resources()
        assert undeclared.value.error.code == -32601
        # stdio keeps notifications/cancelled in 2026-07-28: the host call stops and the session goes on.
        with pytest.raises(MCPError):
            await client.call_tool("history_search", {"query": HOLD_QUERY}, read_timeout_seconds=1.0)
        await asyncio.wait_for(fake_host.data.held_gone.wait(), 10)
        assert not (await client.call_tool("history_search", {"query": "conformance"})).is_error


async def test_2026_07_28_session_rules(raw: Raw) -> None:
    # A version it does not speak is refused with the list it does, and picks no era: initialize still works after.
    await raw.send(_modern(1, "server/discover", version="2099-01-01"))
    future = await raw.read()
    assert future["error"]["code"] == -32022
    assert future["error"]["data"] == {"supported": [MODERN], "requested": "2099-01-01"}
    no_caps = _modern(2, "server/discover")
    del no_caps["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    await raw.send(no_caps)
    assert (await raw.read())["error"]["code"] == -32602

    await raw.send(_modern(3, "server/discover"))
    discover = (await raw.read())["result"]
    assert discover["supportedVersions"] == [MODERN] and discover["resultType"] == "complete"
    assert discover["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agenthost"
    # The session is now 2026-07-28: no handshake, no ping, and every request names its version.
    await raw.send({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}})
    refused = await raw.read()
    assert refused["error"]["code"] == -32022 and refused["error"]["data"]["supported"] == [MODERN]
    await raw.send(_modern(5, "ping"))
    assert (await raw.read())["error"]["code"] == -32601
    await raw.send({"jsonrpc": "2.0", "id": 6, "method": "tools/list"})
    assert (await raw.read())["error"]["code"] == -32602
    await raw.send([_modern(7, "tools/list")])
    assert (await raw.read())["error"]["code"] == -32600  # no batches
    await raw.write(b"x" * (mcp_bridge.MAX_LINE + 10) + b"\n")
    assert (await raw.read(timeout=60))["error"]["code"] == -32600  # oversize input is refused, the session goes on
    await raw.send(_modern(8, "tools/list"))
    listing = (await raw.read())["result"]
    assert listing["resultType"] == "complete" and listing["ttlMs"] == 0 and len(listing["tools"]) == 4


async def test_a_handshake_session_refuses_2026_07_28_requests(raw: Raw) -> None:
    await raw.initialize("2025-11-25")
    await raw.send(_modern(1, "tools/list"))
    refused = await raw.read()
    assert refused["error"]["code"] == -32600 and "2025-11-25" in refused["error"]["message"]
    await raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {"progressToken": 1}}})
    assert "resultType" not in (await raw.read())["result"]  # a bare _meta is no 2026 envelope
