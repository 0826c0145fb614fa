"""Host paths a binding names (issue 25 item 6): the host checks them at bind time and binds them into the
plugin's sandbox, so the local agent's work lands in the user's directory instead of the sandbox's scratch memory;
what cannot be shown is refused with the remedy, never swallowed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agenthost.host.cli.main import _binding_line, _config_schemas
from agenthost.plugins import binding_paths, sandbox
from agenthost.protos import errors
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.sdk.testing import HostHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox here: {sandbox.probe()}"),
]

LOCAL = "agenthost/local-agent"
READER = """
import sys, json
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method = msg["method"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "reader", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "cat", "inputSchema": {"type": "object", "properties": {}}}]}
    else:
        try:
            text = open(sys.argv[1]).read()
        except OSError as exc:
            text = f"cannot open: {exc}"
        result = {"content": [{"type": "text", "text": text}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def model(server: FakeProviderServer, **extra: object) -> dict[str, object]:
    return {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 32_000, "max_retries": 1, **extra}


def tool_result(server: FakeProviderServer) -> str:
    messages = server.model_requests[-1].json()["messages"]
    return next(m["content"] for m in reversed(messages) if m["role"] == "tool")


async def test_a_bound_workspace_outside_the_data_dir_keeps_what_the_agent_writes(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with FakeProviderServer() as server, HostHarness(tmp_path / "h", builtin=True) as h:
        binding = await h.bind(LOCAL, model(server, workspace=str(project)), priority=10)
        server.push(
            openai_tool_calls([("c1", "write_file", {"path": "notes.txt", "content": "kept"})], text="Writing."),
            openai_text("Done."),
        )
        result = await h.send("write it", conversation_id="proj")
        assert result.run.status == "completed", result.run.error_message
        assert "wrote" in tool_result(server)
        # On the host, not in the sandbox's scratch memory: the file outlives the plugin process.
        written = list(project.glob("*/notes.txt"))
        assert [p.read_text() for p in written] == ["kept"], sorted(project.rglob("*"))
        # What `bots bindings` prints for it.
        line = _binding_line(binding, await _config_schemas(h.client))
        assert f"host path {project} (read-write, workspace)" in line, line
        print(line)


async def test_paths_that_cannot_be_shown_are_refused_at_bind_time(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "file").write_text("x")
    async with HostHarness(tmp_path / "h", builtin=True) as h:
        data = h.host.data_dir
        cases = {
            str(data / "plugins"): "overlaps agenthost's own directory",
            str(tmp_path / "missing"): "does not exist; create the directory first",
            "relative/dir": "must be an absolute path",
            str(home / ".ssh"): "credential location",
            str(home): "credential location",  # it contains ~/.ssh
            str(tmp_path / "file"): "is not a directory",
            "/etc": "part of the system",
        }
        for workspace, remedy in cases.items():
            with pytest.raises(errors.InvalidArgument) as refused:
                await h.bind(LOCAL, {"workspace": workspace}, priority=10)
            assert remedy in refused.value.message and "workspace" in refused.value.message, refused.value.message
        link = tmp_path / "link"
        link.symlink_to(home / ".ssh")
        with pytest.raises(errors.InvalidArgument, match="symlink"):
            await h.bind(LOCAL, {"workspace": str(link)}, priority=10)


async def test_an_mcp_servers_ro_paths_outside_are_readable_to_it(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "reader.py").write_text(READER)
    (tools / "data.txt").write_text("READ-THROUGH-RO-PATHS")
    server_cfg = {
        "name": "r",
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(tools / "reader.py"), str(tools / "data.txt")],
        "ro_paths": [*sandbox.python_paths(), str(tools)],
    }
    async with FakeProviderServer() as server, HostHarness(tmp_path / "h", builtin=True) as h:
        await h.bind(LOCAL, model(server, mcp_servers=[server_cfg]), priority=10)
        server.push(openai_tool_calls([("c1", "mcp__r__cat", {})], text="Reading."), openai_text("Done."))
        result = await h.send("read it")
        assert result.run.status == "completed", result.run.error_message
        assert "READ-THROUGH-RO-PATHS" in tool_result(server)


def test_a_workspace_on_the_sandbox_scratch_memory_is_refused_by_the_runner(tmp_path: Path) -> None:
    """Defence in depth: a runner whose sandbox does not show its workspace says so (the host skipped it, or it
    vanished) instead of making it in the sandbox's tmpfs."""
    probe = (
        "from agenthost.plugins.binding_paths import not_shown;"
        f"print(not_shown({str(tmp_path / 'gone')!r}, 'workspace'));"
        "import os; os.makedirs('/scratch/ws'); print(not_shown('/scratch/ws', 'workspace'))"
    )
    box = sandbox.Sandbox(ro=sandbox.python_paths())
    done = __import__("subprocess").run(
        box.argv([sys.executable, "-c", probe]),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, sandbox.INSIDE_ENV: "1"},
    )
    out = done.stdout.splitlines()
    assert len(out) == 2, done.stderr
    assert "does not exist in the runner's sandbox" in out[0]
    assert "scratch memory" in out[1] and "update-binding" in out[1]


def test_named_paths_follow_refs_and_lists() -> None:
    from agenthost.runners.external_harness.config import ClaudeCodeConfig
    from agenthost.runners.local_agent.config import LocalAgentConfig

    local = binding_paths.named_paths(
        LocalAgentConfig.json_schema(),
        {"workspace": "/w", "mcp_servers": [{"name": "a", "transport": "stdio", "command": "x", "ro_paths": ["/r"]}]},
    )
    assert [(n.setting, n.path, n.mode) for n in local] == [
        ("workspace", "/w", "rw"),
        ("mcp_servers[0].ro_paths[0]", "/r", "ro"),
    ]
    harness = binding_paths.named_paths(ClaudeCodeConfig.model_json_schema(), {"workspace_root": "/w", "command": "c"})
    assert {(n.setting, n.mode) for n in harness} == {("workspace_root", "rw"), ("command", "exec")}


def test_a_command_linked_within_the_system_dirs_is_taken_and_one_linked_from_elsewhere_is_refused(
    tmp_path: Path,
) -> None:
    """`npm i -g` links /usr/local/bin/claude into /usr/local/lib: link and target are both in the system every sandbox
    shows, so the binding names the link. A link outside them would lead to a target the plugin's sandbox lacks."""
    NamedPath, problems = binding_paths.NamedPath, binding_paths.problems
    linked = "/bin/sh"  # /bin is itself a link into /usr on merged-/usr systems; either way both ends are system
    assert problems([NamedPath("command", linked, "exec")], data_dir=tmp_path / "data") == []
    elsewhere = tmp_path / "bin" / "tool"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to("/bin/sh")
    (found,) = problems([NamedPath("command", str(elsewhere), "exec")], data_dir=tmp_path / "data")
    assert "symlink" in found and os.path.realpath("/bin/sh") in found
