"""A binding's own MCP servers as the local agent's tools, end to end: real host, scripted model on loopback, the
fixture server (tests/fixtures/mcp_server, built with the official SDK) over stdio in the shell tool's sandbox and
over streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agenthost.plugins import sandbox as sandboxing
from agenthost.protos import errors as host_errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.local_agent.tools.mcp import namespaced, parameters, render
from agenthost.runners.sdk.testing import HostHarness

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_server"
needs_sandbox = pytest.mark.skipif(sandboxing.probe() is not None, reason=f"no sandbox here: {sandboxing.probe()}")


def stdio_server(name: str = "fx", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(FIXTURE / "server.py")],
        # The interpreter, its venv and the fixture: all the sandbox needs to see besides the system.
        "ro_paths": [*sandboxing.python_paths(), str(FIXTURE)],
        **extra,
    }


def cfg(model: FakeProviderServer, *servers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "vllm/m",
        "base_url": model.url + "/v1",
        "context_window": 32_000,
        "max_retries": 0,
        "mcp_servers": list(servers),
        **extra,
    }


def finished(r: Any) -> list[Any]:
    return [e.tool_finished for e in r.events if e.WhichOneof("kind") == "tool_finished"]


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.json().get("tools", [])]


def server_processes() -> list[int]:
    """Live processes running the fixture server from this checkout (inside or outside a sandbox)."""
    marker = str(FIXTURE / "server.py").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


async def wait_for_file(root: Path, name: str, timeout: float = 20.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(root.rglob(name))
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} did not appear under {root}")


# ---- stdio, through a real host ----


@needs_sandbox
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_model_sees_namespaced_tools_and_calls_one(tmp_path: Path) -> None:
    async with FakeProviderServer() as model:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(model, stdio_server())) as h:
            model.push(openai_tool_calls([("c1", "mcp__fx__echo", {"text": "hi"})]), openai_text("It said echo:hi."))
            r = await h.send("echo hi", conversation_id="a")
            assert r.run.status == "completed", r.run.error_message
            [done] = finished(r)
            assert (done.tool_name, done.result, done.is_error) == ("mcp__fx__echo", "echo:hi", False)
            first = model.model_requests[0]
            names = tool_names(first)
            mcp_names = [n for n in names if n.startswith("mcp__")]
            assert (
                mcp_names
                == sorted(mcp_names)
                == [
                    "mcp__fx__add",
                    "mcp__fx__connect",
                    "mcp__fx__crash",
                    "mcp__fx__echo",
                    "mcp__fx__fail",
                    "mcp__fx__picture",
                    "mcp__fx__read_path",
                    "mcp__fx__slow",
                    "mcp__fx__whoami",
                ]
            )
            echo = next(t for t in first.json()["tools"] if t["function"]["name"] == "mcp__fx__echo")["function"]
            assert echo["description"].startswith("[MCP server fx] Repeat the text")
            assert echo["parameters"]["properties"]["text"]["type"] == "string" and "$schema" not in echo["parameters"]
            # The result went back to the model as the tool message.
            tool_msg = model.model_requests[1].json()["messages"][-1]
            assert tool_msg["role"] == "tool" and tool_msg["content"] == "echo:hi"

            # The next run reuses the warm session (same server process) and sends byte-identical tools.
            model.push(openai_tool_calls([("c2", "mcp__fx__whoami", {})]), openai_text("ok"))
            model.push(openai_tool_calls([("c3", "mcp__fx__whoami", {})]), openai_text("ok"))
            instances = []
            for _ in range(2):
                r = await h.send("who are you", conversation_id="a")
                assert r.run.status == "completed", r.run.error_message
                instances.append(finished(r)[0].result.split()[0])
            assert instances[0] == instances[1]
            tools_json = [json.dumps(req.json()["tools"]) for req in model.model_requests]
            assert len(set(tools_json)) == 1
            assert server_processes(), "the warm session's server runs between runs"
        # The runner closed its sessions when it shut down: no server process is left.
        for _ in range(400):  # bounded: 20 s
            if not server_processes():
                break
            await asyncio.sleep(0.05)
        assert not server_processes()


@needs_sandbox
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_error_result_image_note_and_timeout(tmp_path: Path) -> None:
    async with FakeProviderServer() as model:
        server = stdio_server(timeout_s=3, tools=["fail", "picture", "slow", "echo"])
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(model, server)) as h:
            model.push(
                openai_tool_calls(
                    [
                        ("c1", "mcp__fx__fail", {"message": "no such widget"}),
                        ("c2", "mcp__fx__picture", {}),
                        ("c3", "mcp__fx__slow", {"seconds": 60}),
                        ("c4", "mcp__fx__echo", {"text": "still alive"}),
                        ("c5", "mcp__fx__echo", {"wrong": 1}),
                    ]
                ),
                openai_text("done"),
            )
            r = await h.send("try things", conversation_id="b")
            assert r.run.status == "completed", r.run.error_message
            fail, picture, slow, echo, bad = finished(r)
            assert (
                fail.is_error
                and fail.result.startswith("error: MCP server fx, tool fail:")
                and "no such widget" in fail.result
            )
            # The image reaches the model like a read_file image (OpenAI-compatible: in the user message after
            # the tool results, since tool messages hold text only).
            assert not picture.is_error and picture.result.startswith("[image 1 (image/png")
            assert "data:image/png;base64," in json.dumps(model.model_requests[1].json())
            assert slow.is_error and "did not answer within 3s" in slow.result
            # The timed-out call was cancelled, not the session: the next call on it works.
            assert (echo.is_error, echo.result) == (False, "echo:still alive")
            # Arguments are checked against the server's schema on the one dispatch path, before the server.
            assert bad.is_error and "invalid arguments" in bad.result
            # The timeout cancelled the call on the server too (MCP cancellation), not just on our side.
            await wait_for_file(tmp_path / "runner-data", "cancelled-slow.txt")
            # The allowlist: only the listed tools are offered.
            names = [n for n in tool_names(model.model_requests[0]) if n.startswith("mcp__")]
            assert names == ["mcp__fx__echo", "mcp__fx__fail", "mcp__fx__picture", "mcp__fx__slow"]


@needs_sandbox
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_server_crash_mid_run_and_recovery_on_next_run(tmp_path: Path) -> None:
    async with FakeProviderServer() as model:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(model, stdio_server())) as h:
            model.push(openai_tool_calls([("w0", "mcp__fx__whoami", {})]), openai_text("ok"))
            r = await h.send("who", conversation_id="c")
            pid_before = finished(r)[0].result.split()[0]
            model.push(
                openai_tool_calls([("c1", "mcp__fx__crash", {})]),
                openai_tool_calls([("c2", "mcp__fx__echo", {"text": "x"})]),
                openai_text("it broke"),
            )
            r = await h.send("crash it", conversation_id="c")
            assert r.run.status == "completed", r.run.error_message
            crash, echo = finished(r)
            assert crash.is_error and "MCP server fx stopped during the call" in crash.result
            assert echo.is_error and "MCP server fx is not running" in echo.result

            model.push(openai_tool_calls([("c3", "mcp__fx__whoami", {})]), openai_text("back"))
            r = await h.send("again", conversation_id="c")
            assert r.run.status == "completed", r.run.error_message
            [who] = finished(r)
            assert not who.is_error and who.result.split()[0] != pid_before


@needs_sandbox
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_run_cancellation_cancels_the_server_call(tmp_path: Path) -> None:
    async with FakeProviderServer() as model:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(model, stdio_server())) as h:
            model.push(openai_tool_calls([("c1", "mcp__fx__slow", {"seconds": 60, "tag": "run"})]))
            request = hpb.SendMessageRequest(bot=h.bot, text="wait", conversation_id="k", source="api")
            run_id, status = "", ""
            async for reply in h.client.stream(request, timeout=60):
                kind = reply.WhichOneof("kind")
                if kind == "run_started":
                    run_id = reply.run_started.run_id
                elif kind == "events" and any(e.WhichOneof("kind") == "tool_started" for e in reply.events.events):
                    await h.client.call("CancelRun", hpb.RunRequestById(run_id=run_id))
                elif kind == "run_finished":
                    status = reply.run_finished.status
                    break
            assert status == "cancelled"
            await wait_for_file(tmp_path / "runner-data", "cancelled-run.txt")
            # The session survives the cancelled call: the next run uses it.
            model.push(openai_tool_calls([("c2", "mcp__fx__echo", {"text": "after"})]), openai_text("ok"))
            r = await h.send("again", conversation_id="k")
            assert [f.result for f in finished(r)] == ["echo:after"]


@needs_sandbox
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_stdio_server_is_sandboxed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-should-not-leak")
    async with FakeProviderServer() as model:
        server = stdio_server(env={"FIXTURE_TOKEN": "${FX_TOKEN}", "PLAIN": "1"})
        async with HostHarness(tmp_path, runners=[LocalAgentRunner]) as h:
            await h.client.call("SetKey", hpb.SetKeyRequest(name="FX_TOKEN", value="tok-123"))
            await h.client.call("SetKey", hpb.SetKeyRequest(name="OTHER_KEY", value="other"))
            await h.bind("test/local-agent", cfg(model, server), priority=5, keys=["FX_TOKEN", "OTHER_KEY"])
            # Conversation "other" leaves a file in its workspace; the runner's data dir holds its session.
            model.push(
                openai_tool_calls([("s1", "write_file", {"path": "private.txt", "content": "other-secret"})]),
                openai_text("saved"),
            )
            assert (await h.send("save", conversation_id="other")).run.status == "completed"
            model.push(openai_tool_calls([("w1", "mcp__fx__whoami", {})]), openai_text("ok"))
            r = await h.send("who", conversation_id="mine")
            who = finished(r)[0].result
            cwd = Path(who.split("cwd=")[1].split()[0])
            env_names = who.split("env=")[1].split()[0].split(",")
            assert "OPENAI_API_KEY" not in env_names and "OTHER_KEY" not in env_names
            assert "PLAIN" in env_names and who.endswith("token=tok-123")
            data_dir = cwd.parent.parent  # <runner data>/workspaces/<conversation>
            other_ws = next(p for p in cwd.parent.iterdir() if p != cwd and (p / "private.txt").exists())
            (cwd / "mine.txt").write_text("mine-ok")
            sessions = sorted(str(p) for p in data_dir.rglob("*.jsonl"))
            assert sessions, "the runner keeps session files in its data dir"
            assert (h.host.data_dir / "keys.json").exists()
            model.push(
                openai_tool_calls(
                    [
                        ("r1", "mcp__fx__read_path", {"path": str(other_ws / "private.txt")}),
                        ("r2", "mcp__fx__read_path", {"path": sessions[0]}),
                        ("r3", "mcp__fx__read_path", {"path": str(h.host.data_dir / "keys.json")}),
                        ("r4", "mcp__fx__read_path", {"path": "mine.txt"}),
                    ]
                ),
                openai_text("read"),
            )
            r = await h.send("read", conversation_id="mine")
            results = [f.result for f in finished(r)]
            assert results[:3] == ["unreadable:FileNotFoundError"] * 3, results
            assert results[3] == "content:mine-ok"


@needs_sandbox
@pytest.mark.e2e
async def test_a_stdio_server_granted_network_still_never_reaches_the_hosts_loopback(tmp_path: Path) -> None:
    """`network: true` on a stdio server is the shell's network: the runner's egress proxy, never the host's
    loopback (before, the server shared the runner's namespace and reached any port there)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        async with FakeProviderServer() as model:
            config = cfg(model, stdio_server(network=True))
            async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
                model.push(openai_tool_calls([("c1", "mcp__fx__connect", {"port": port})]), openai_text("done"))
                r = await h.send("connect")
                assert r.run.status == "completed", r.run.error_message
                socket.create_connection(("127.0.0.1", port), timeout=5).close()  # control: open from out here
        assert finished(r)[0].result == "refused:Connection refused", finished(r)
    finally:
        listener.close()


# ---- streamable HTTP on loopback ----


@contextlib.asynccontextmanager
async def http_fixture(token: str) -> AsyncIterator[tuple[str, list[str], set[str]]]:
    """The fixture server over streamable HTTP on a loopback port; refuses requests without the bearer token."""
    import uvicorn
    from starlette.responses import PlainTextResponse

    sys.path.insert(0, str(FIXTURE))
    try:
        from server import build_server  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(FIXTURE))
    inner = build_server().streamable_http_app()
    seen: list[str] = []
    sessions: set[str] = set()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"").decode()
            seen.append(auth)
            if b"mcp-session-id" in headers:
                sessions.add(headers[b"mcp-session-id"].decode())
            if auth != f"Bearer {token}":
                await PlainTextResponse("no", status_code=401)(scope, receive, send)
                return
        await inner(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # Listening before uvicorn starts: early connections wait in the backlog until it accepts (after its startup).
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}/mcp", seen, sessions
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_http_server_with_header_from_binding_key(tmp_path: Path) -> None:
    async with FakeProviderServer() as model, http_fixture("s3cret") as (url, seen, _):
        server = {"name": "remote", "transport": "http", "url": url, "headers": {"Authorization": "Bearer ${RT}"}}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner]) as h:
            await h.client.call("SetKey", hpb.SetKeyRequest(name="RT", value="s3cret"))
            await h.bind("test/local-agent", cfg(model, server), priority=5, keys=["RT"])
            model.push(openai_tool_calls([("c1", "mcp__remote__add", {"a": 2, "b": 40})]), openai_text("42"))
            r = await h.send("add", conversation_id="h")
            assert r.run.status == "completed", r.run.error_message
            assert [(f.tool_name, f.result) for f in finished(r)] == [("mcp__remote__add", "42")]
            assert seen and set(seen) == {"Bearer s3cret"}

            # A binding that names no key for the reference: the server is left out, with a note saying why.
            await h.bind("test/local-agent", cfg(model, server), priority=9)
            model.push(openai_text("no tools"))
            r = await h.send("add", conversation_id="h2")
            assert r.run.status == "completed", r.run.error_message
            notes = [e.progress.message for e in r.events if e.WhichOneof("kind") == "progress"]
            assert any("refers to key 'RT'" in n and "not offered" in n for n in notes), notes
            assert not [n for n in tool_names(model.model_requests[-1]) if n.startswith("mcp__")]


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_concurrent_runs_share_one_warm_session(tmp_path: Path) -> None:
    async with FakeProviderServer() as model, http_fixture("t") as (url, _, sessions):
        server = {"name": "remote", "transport": "http", "url": url, "headers": {"Authorization": "Bearer ${RT}"}}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner]) as h:
            await h.client.call("SetKey", hpb.SetKeyRequest(name="RT", value="t"))
            await h.bind("test/local-agent", cfg(model, server), priority=5, keys=["RT"])
            # Warm it up, then two conversations call it at once (each holds its call open for a moment).
            model.push(openai_tool_calls([("w", "mcp__remote__echo", {"text": "warm"})]), openai_text("ok"))
            assert (await h.send("warm", conversation_id="p0")).run.status == "completed"
            model.push(openai_tool_calls([("c1", "mcp__remote__slow", {"seconds": 0.5})]))
            model.push(openai_tool_calls([("c2", "mcp__remote__slow", {"seconds": 0.5})]))
            model.push(openai_text("one"), openai_text("two"))
            results = await asyncio.gather(h.send("a", conversation_id="p1"), h.send("b", conversation_id="p2"))
            assert all(r.run.status == "completed" for r in results), [r.run.error_message for r in results]
            # Which run got which scripted reply depends on timing; the two calls together do not.
            assert [f.result for r in results for f in finished(r)] == ["done sleeping"] * 2
            assert len(sessions) == 1, sessions


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_unreachable_server_is_left_out_and_backs_off(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    async with FakeProviderServer() as model:
        server = {"name": "gone", "transport": "http", "url": f"http://127.0.0.1:{port}/mcp"}
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=cfg(model, server)) as h:
            model.push(openai_text("a"), openai_text("b"))
            first = await h.send("one", conversation_id="u")
            second = await h.send("two", conversation_id="u")
            assert first.run.status == second.run.status == "completed"
            notes = [
                [e.progress.message for e in r.events if e.WhichOneof("kind") == "progress"] for r in (first, second)
            ]
            assert any("MCP server gone could not be started" in n for n in notes[0]), notes
            assert any("next attempt in" in n for n in notes[1]), notes


# ---- config errors at bind time ----


@pytest.mark.timeout(60)
async def test_bad_server_configs_are_refused_at_bind_time(tmp_path: Path) -> None:
    base = {"name": "s", "transport": "stdio", "command": "srv"}
    cases = [
        ([{**base, "name": "Bad Name"}], "must be 1-32 chars"),
        ([base, base], "duplicate MCP server names ['s']"),
        ([{"name": "h", "transport": "http", "url": "ftp://x/mcp"}], "http:// or https://"),
        ([{"name": "h", "transport": "http", "url": "http://u:p@x/mcp"}], "no credentials"),
        ([{"name": "h", "transport": "http", "url": "http://x", "headers": {"Authorization": "Bearer abc"}}], "keys"),
        ([{**base, "env": {"GITHUB_TOKEN": "ghp_literal"}}], "looks like a credential"),
        ([{**base, "url": "http://x"}], "url and headers are for http"),
        ([{"name": "h", "transport": "http"}], "needs a url"),
        ([{"name": "s", "transport": "stdio"}], "needs a command"),
        ([{**base, "cwd": "../up"}], "cwd must be relative"),
        ([{**base, "ro_paths": ["/"]}], "ro_paths"),
    ]
    async with HostHarness(tmp_path, runners=[LocalAgentRunner]) as h:
        runner_data = tmp_path / "runner-data"
        cases.append(([{**base, "ro_paths": [str(runner_data)]}], "overlaps the runner's data dir"))
        for servers, expected in cases:
            with pytest.raises(host_errors.AgentHostError) as err:
                await h.bind("test/local-agent", {"mcp_servers": servers}, priority=3)
            assert expected in str(err.value), (servers, str(err.value))
        ok = await h.bind("test/local-agent", {"mcp_servers": [{**base, "env": {"API_KEY": "${K}"}}]}, priority=3)
        assert ok.binding_id


# ---- the pieces ----


def test_names_are_sanitized_bounded_and_deterministic() -> None:
    pairs = [("a", "b__c"), ("a__b", "c"), ("s", "do.thing"), ("s", "do_thing"), ("s", "x" * 80)]
    names = namespaced(pairs)
    assert names == namespaced(list(reversed(pairs)))  # order of listing does not matter
    assert len(set(names.values())) == len(pairs)
    assert all(len(n) <= 64 and n.replace("_", "").replace("-", "").isalnum() for n in names.values())
    assert names[("a", "b__c")] == "mcp__a__b__c" and names[("a__b", "c")].startswith("mcp__a__b__c_")
    assert names[("s", "do.thing")] == "mcp__s__do_thing" and names[("s", "do_thing")].startswith("mcp__s__do_thing_")


def test_parameters_and_results_mapping() -> None:
    assert parameters({"$schema": "x", "type": "object", "properties": {"a": {}}}) == {
        "type": "object",
        "properties": {"a": {}},
    }
    assert parameters({"type": "string"}) == {"type": "object", "properties": {}}
    assert parameters(None) == {"type": "object", "properties": {}}

    class Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    res = Obj(
        content=[
            Obj(type="text", text="a"),
            Obj(type="resource", resource=Obj(uri="file:///x", text="inline")),
            Obj(type="resource", resource=Obj(uri="file:///b", blob="AA==", mime_type="application/zip")),
            Obj(type="resource_link", uri="file:///y", name="y"),
        ],
        structured_content=None,
        is_error=False,
    )
    assert render(res) == (
        "a\ninline\n[binary resource file:///b (application/zip)]\n[resource link: file:///y (y)]",
        False,
        [],
    )
    assert render(Obj(content=[], structured_content={"n": 1}, is_error=True)) == ('{"n": 1}', True, [])
    # An "image" whose bytes are not an image the models take is a note, never sent as one.
    fake = Obj(content=[Obj(type="image", data="bm90IGFuIGltYWdl", mime_type="image/png")], is_error=False)
    assert render(fake) == ("[image (image/png, 12 bytes) returned by the tool; not shown]", False, [])


@pytest.mark.e2e
def test_bindings_without_servers_do_not_load_the_sdk() -> None:
    code = (
        "import sys\n"
        "from agenthost.runners.local_agent.runner import LocalAgentRunner\n"
        "from agenthost.runners.local_agent.config import LocalAgentConfig\n"
        "LocalAgentConfig.parse({'model': 'vllm/m'})\n"
        "LocalAgentConfig.parse({'mcp_servers': [{'name': 'a', 'transport': 'http', 'url': 'http://x'}]})\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'httpx2', 'starlette'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_server_schema_the_validator_cannot_apply_leaves_checks_to_the_server() -> None:
    from agenthost.runners.local_agent.messages import ToolCall
    from agenthost.runners.local_agent.tools.base import ToolRegistry
    from agenthost.runners.local_agent.tools.mcp import McpTool
    from agenthost.runners.sdk.approvals import ApprovalsConfig

    calls: list[dict[str, Any]] = []

    async def call(tool: str, args: dict[str, Any]) -> Any:
        calls.append(args)
        return type("R", (), {"content": [], "structured_content": {"ok": True}, "is_error": False})()

    schemas = {
        "remote_ref": {"type": "object", "properties": {"x": {"$ref": "https://schemas.example.test/x.json"}}},
        "broken": {"type": "object", "properties": {"x": {"type": 7}}},
        "strict": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    }
    tools = [
        McpTool(exposed=f"mcp__s__{n}", server="s", tool=n, description="", schema=sc, call=call)
        for n, sc in schemas.items()
    ]
    registry = ToolRegistry(tools)
    # A run's context with no approvals configured: nothing but the tool itself is involved.
    ctx = SimpleNamespace(api=None, config=SimpleNamespace(approvals=ApprovalsConfig()), images={})
    for name in ("remote_ref", "broken"):
        result = await registry.run(ToolCall(id=name, name=f"mcp__s__{name}", arguments='{"x": "a"}'), ctx)  # type: ignore[arg-type]
        assert not result.is_error and result.content == '{"ok": true}'
    bad = await registry.run(ToolCall(id="s", name="mcp__s__strict", arguments='{"x": "a"}'), ctx)  # type: ignore[arg-type]
    assert bad.is_error and "invalid arguments" in bad.content and len(calls) == 2


def test_a_symlink_in_the_workspace_cannot_lead_a_servers_cwd_out(tmp_path: Path) -> None:
    """The model's shell may plant `esc -> <elsewhere>` in the workspace; a server's relative cwd through it is
    refused before the runner (outside any sandbox) creates a directory over there."""
    from agenthost.runners.local_agent import mcp_client
    from agenthost.runners.sdk.mcp_servers import McpServer, McpServerError

    workspace, outside = tmp_path / "ws", tmp_path / "other-conversation"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "esc").symlink_to(outside)
    server = McpServer(name="s", transport="stdio", command="/bin/true", cwd="esc/made")
    with pytest.raises(McpServerError, match="leads out of the conversation workspace"):
        mcp_client.server_cwd(server, workspace)
    if sandboxing.probe() is None:
        with pytest.raises(McpServerError, match="leads out of the conversation workspace"):
            mcp_client.stdio_sandbox(server, workspace, tmp_path / "data")
    assert list(outside.iterdir()) == []
    inside = McpServer(name="s", transport="stdio", command="/bin/true", cwd="sub/dir")
    assert mcp_client.server_cwd(inside, workspace) == (workspace / "sub" / "dir").resolve()
    assert (workspace / "sub" / "dir").is_dir()


def test_a_symlink_swapped_in_after_the_check_cannot_lead_a_servers_cwd_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's shell runs beside the runner: it can swap `a` for a link between any check of `a/b` and the
    directory's creation (here: at the moment the runner first creates a directory). Nothing is made outside."""
    from agenthost.runners.local_agent import mcp_client
    from agenthost.runners.sdk.mcp_servers import McpServer, McpServerError

    workspace, outside = tmp_path / "ws", tmp_path / "other-conversation"
    (workspace / "a").mkdir(parents=True)
    outside.mkdir()
    real_mkdir = os.mkdir

    def racing_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if not (workspace / "a").is_symlink():
            (workspace / "a").rename(workspace / "a.was")
            (workspace / "a").symlink_to(outside)
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    server = McpServer(name="s", transport="stdio", command="/bin/true", cwd="a/b")
    with pytest.raises(McpServerError, match="leads out of the conversation workspace"):
        mcp_client.server_cwd(server, workspace)
    assert list(outside.iterdir()) == []


@pytest.mark.e2e
def test_an_unsandboxed_server_starts_in_the_directory_that_was_checked(tmp_path: Path) -> None:
    """Without a sandbox the server's process gets the checked directory itself (an open descriptor), so a link
    swapped in before the process starts does not move it elsewhere."""
    from agenthost.runners.local_agent import mcp_client
    from agenthost.runners.sdk.mcp_servers import McpServer

    workspace, outside = tmp_path / "ws", tmp_path / "other-conversation"
    workspace.mkdir()
    outside.mkdir()
    server = McpServer(name="s", transport="stdio", command="/bin/true", cwd="a/b")
    with mcp_client.held_cwd(server, workspace) as cwd:
        (workspace / "a").rename(workspace / "a.was")
        (workspace / "a").symlink_to(outside)
        (outside / "b").mkdir()
        where = subprocess.run(["pwd", "-P"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    assert where.stdout.strip() == str((workspace / "a.was" / "b").resolve())


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_an_unsandboxed_stdio_server_runs_in_its_cwd(tmp_path: Path) -> None:
    """The descriptor path (`/proc/self/fd/N`) is what the MCP SDK starts the process with, end to end."""
    async with FakeProviderServer() as model:
        config = cfg(model, stdio_server(cwd="sub/dir"), shell={"sandbox": False})
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=config) as h:
            model.push(openai_tool_calls([("c1", "mcp__fx__whoami", {})]), openai_text("ok"))
            r = await h.send("who are you", conversation_id="a")
            assert r.run.status == "completed", r.run.error_message
            [done] = finished(r)
            cwd = done.result.split(" cwd=", 1)[1].split(" env=", 1)[0]
            assert cwd.endswith("/sub/dir") and "/proc/" not in cwd and Path(cwd).is_dir(), done.result
