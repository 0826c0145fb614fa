from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from agenthost.runners.local_agent.config import LocalAgentConfig, ShellConfig
from agenthost.runners.local_agent.messages import ToolCall
from agenthost.runners.local_agent.testing import FakeRunAPI
from agenthost.runners.local_agent.tools import build_registry
from agenthost.runners.local_agent.tools.base import ToolContext
from agenthost.runners.local_agent.tools.shell import build_env, run_command


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ToolContext(workspace=ws, api=FakeRunAPI(), conversation_id="c1", run_id="r1", config=LocalAgentConfig())


async def call(ctx: ToolContext, name: str, **args):  # type: ignore[no-untyped-def]
    registry = build_registry(ctx.config)
    return await registry.run(ToolCall("id1", name, json.dumps(args)), ctx)


async def test_read_with_line_numbers_and_ranges(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("\n".join(f"line {i}" for i in range(1, 11)))
    r = await call(ctx, "read_file", path="f.txt", offset=3, limit=2)
    assert not r.is_error
    assert r.content.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "offset=5" in r.content
    r = await call(ctx, "read_file", path="f.txt", offset=99)
    assert r.is_error and "past the end" in r.content
    (ctx.workspace / "bin").write_bytes(b"\x00\x01\x02")
    assert "binary" in (await call(ctx, "read_file", path="bin")).content


async def test_write_edit_list_glob_grep(ctx: ToolContext) -> None:
    r = await call(ctx, "write_file", path="src/a.py", content="x = 1\ny = 1\n")
    assert not r.is_error and (ctx.workspace / "src/a.py").read_text() == "x = 1\ny = 1\n"
    r = await call(ctx, "edit_file", path="src/a.py", old_string="= 1", new_string="= 2")
    assert r.is_error and "2 times" in r.content
    r = await call(ctx, "edit_file", path="src/a.py", old_string="y = 1", new_string="y = 2")
    assert not r.is_error and (ctx.workspace / "src/a.py").read_text() == "x = 1\ny = 2\n"
    r = await call(ctx, "edit_file", path="src/a.py", old_string="zzz", new_string="q")
    assert r.is_error and "not found" in r.content
    r = await call(ctx, "edit_file", path="src/a.py", old_string="= ", new_string=":= ", replace_all=True)
    assert "2 occurrence" in r.content
    assert (await call(ctx, "list_files")).content == "src/"
    assert (await call(ctx, "glob", pattern="**/*.py")).content == "src/a.py"
    r = await call(ctx, "grep", pattern=r"y\s*:=", glob="*.py")
    assert r.content == "src/a.py:2: y := 2"
    assert (await call(ctx, "grep", pattern="(")).is_error


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../x", "~/.ssh/id_rsa"])
async def test_traversal_refused(ctx: ToolContext, path: str) -> None:
    for tool, extra in (("read_file", {}), ("write_file", {"content": "x"}), ("list_files", {})):
        r = await call(ctx, tool, path=path, **extra)
        assert r.is_error and "outside the workspace" in r.content, (tool, r.content)
    assert not (ctx.workspace.parent / "outside.txt").exists()


async def test_symlink_escape_refused(ctx: ToolContext, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    os.symlink(secret, ctx.workspace / "link.txt")
    os.symlink(tmp_path, ctx.workspace / "dirlink")
    assert "outside the workspace" in (await call(ctx, "read_file", path="link.txt")).content
    assert "outside the workspace" in (await call(ctx, "write_file", path="dirlink/new.txt", content="x")).content
    assert "TOP SECRET" not in (await call(ctx, "grep", pattern="SECRET")).content
    assert (await call(ctx, "glob", pattern="**/secret.txt")).content == "no matches"
    assert (await call(ctx, "glob", pattern="../*")).is_error


async def test_bad_arguments_and_unknown_tool_are_errors_not_exceptions(ctx: ToolContext) -> None:
    registry = build_registry(ctx.config)
    r = await registry.run(ToolCall("x", "read_file", '{"path": 3}'), ctx)
    assert r.is_error and "invalid arguments" in r.content
    r = await registry.run(ToolCall("x", "read_file", "not json"), ctx, truncated=True)
    assert r.is_error and "token limit" in r.content
    r = await registry.run(ToolCall("x", "nope", "{}"), ctx)
    assert r.is_error and "unknown tool" in r.content


@pytest.mark.e2e
async def test_shell_runs_in_workspace_with_explicit_env(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-never-leak")
    monkeypatch.setenv("HARMLESS_VAR", "visible")
    monkeypatch.setenv("MY_TOKEN", "tok")
    ctx.config = LocalAgentConfig(shell=ShellConfig(env_passthrough=["HARMLESS_VAR", "MY_TOKEN"], env={"X": "1"}))
    r = await call(ctx, "shell", command="pwd; env")
    assert not r.is_error
    assert r.content.splitlines()[0] == str(ctx.workspace)
    assert "sk-should-never-leak" not in r.content and "MY_TOKEN" not in r.content
    assert "HARMLESS_VAR=visible" in r.content and "X=1" in r.content
    assert build_env(ShellConfig(), ctx.workspace, {"OPENAI_API_KEY": "k", "PATH": "/bin"}) == {
        "PATH": "/bin",
        "HOME": str(ctx.workspace),
        "TERM": "dumb",
        "PAGER": "cat",
    }


@pytest.mark.e2e
async def test_shell_failure_timeout_and_blocklist(ctx: ToolContext) -> None:
    r = await call(ctx, "shell", command="echo oops >&2; exit 3")
    assert r.is_error and "exit code 3" in r.content and "oops" in r.content
    t0 = time.monotonic()
    r = await call(ctx, "shell", command="sleep 30", timeout_seconds=0.3)
    assert r.is_error and "timed out" in r.content and time.monotonic() - t0 < 5
    for bad in ("sudo ls", "rm -rf /", "rm -rf ~", "dd if=/dev/zero of=/dev/sda", "shutdown -h now"):
        r = await call(ctx, "shell", command=bad)
        assert r.is_error and "blocklist" in r.content, bad
    assert not (await call(ctx, "shell", command="rm -rf ./build")).is_error


@pytest.mark.e2e
async def test_shell_output_is_capped_head_and_tail(ctx: ToolContext) -> None:
    res = await run_command(
        "seq 1 100000", cwd=ctx.workspace, env={"PATH": "/usr/bin:/bin"}, timeout=10, max_output_chars=2000
    )
    assert res.exit_code == 0 and res.omitted_chars > 0
    assert res.output.startswith("1\n2\n") and res.output.rstrip().endswith("100000")
    assert len(res.output) < 2200


@pytest.mark.e2e
async def test_shell_kills_process_group_and_background_children(ctx: ToolContext, tmp_path: Path) -> None:
    marker = tmp_path / "alive"
    cmd = f"(sleep 1.5; touch {marker}) & sleep 30"
    t0 = time.monotonic()
    res = await run_command(cmd, cwd=ctx.workspace, env={"PATH": "/usr/bin:/bin"}, timeout=0.3, max_output_chars=1000)
    assert res.timed_out and res.exit_code == 124 and time.monotonic() - t0 < 3
    # A finished shell whose background child still holds the pipe does not hang the tool either.
    t0 = time.monotonic()
    res = await run_command(
        f"(sleep 1.5; touch {marker}) & echo started",
        cwd=ctx.workspace,
        env={"PATH": "/usr/bin:/bin"},
        timeout=10,
        max_output_chars=1000,
    )
    assert res.output.strip() == "started" and time.monotonic() - t0 < 1.4
    await asyncio.sleep(1.8)
    assert not marker.exists()


@pytest.mark.e2e
async def test_shell_cancellation_kills_the_command(ctx: ToolContext, tmp_path: Path) -> None:
    marker = tmp_path / "done"
    task = asyncio.create_task(
        run_command(
            f"sleep 1; touch {marker}",
            cwd=ctx.workspace,
            env={"PATH": "/usr/bin:/bin"},
            timeout=30,
            max_output_chars=1000,
        )
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(1.3)
    assert not marker.exists()


async def test_todo_allows_one_item_in_progress(ctx: ToolContext) -> None:
    api = ctx.api
    assert isinstance(api, FakeRunAPI)
    r = await call(
        ctx, "todo_write", items=[{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]
    )
    assert r.is_error and "only one" in r.content and ("conversation", "local_agent.todos") not in api.state
    r = await call(
        ctx,
        "todo_write",
        items=[
            {"content": "a", "status": "completed"},
            {"content": "b", "status": "in_progress"},
            {"content": "c", "status": "pending"},
        ],
    )
    assert r.content == "[x] 1. a\n[>] 2. b\n[ ] 3. c"
    assert json.loads(api.state[("conversation", "local_agent.todos")][0])[1]["status"] == "in_progress"
    assert ctx.pending_events and ctx.pending_events[0].state_updated.key == "local_agent.todos"


async def test_host_tools(ctx: ToolContext) -> None:
    api = ctx.api
    assert isinstance(api, FakeRunAPI)
    api.add_user("the blue whale is big")
    api.add_user("unrelated")
    r = await call(ctx, "search_history", query="whale")
    assert "blue whale" in r.content and "unrelated" not in r.content
    ref = await api.artifact_create(b"0123456789" * 10, name="n")
    r = await call(ctx, "read_artifact", artifact_id=ref.artifact_id, offset=10, length=20)
    assert r.content.startswith("01234567890123456789") and "offset=30" in r.content
    r = await call(ctx, "read_artifact", artifact_id="missing")
    assert r.is_error and "NotFound" in r.content
    api.denied.add("history_search")
    r = await call(ctx, "search_history", query="whale")
    assert r.is_error and "PermissionDenied" in r.content


def test_tool_selection_from_config() -> None:
    from agenthost.runners.local_agent.config import ConfigError

    assert build_registry(LocalAgentConfig(tools=["read_file"])).names == ["read_file"]
    assert "shell" not in build_registry(LocalAgentConfig(shell=ShellConfig(enabled=False))).names
    with pytest.raises(ConfigError, match="unknown tools"):
        build_registry(LocalAgentConfig(tools=["rm_rf"]))


@pytest.mark.e2e
def test_ledger_sweep_kills_only_the_groups_it_started(tmp_path: Path) -> None:
    import subprocess

    from agenthost.runners.local_agent.tools.shell import ProcessLedger

    ledger = ProcessLedger(tmp_path / "running")
    orphan = subprocess.Popen(["/bin/sh", "-c", "sleep 30"], start_new_session=True)
    bystander = subprocess.Popen(["/bin/sh", "-c", "sleep 30"], start_new_session=True)
    try:
        ledger.record(orphan.pid)
        ledger.record(bystander.pid)
        # The bystander's pid was "reused": its recorded start time no longer matches.
        (tmp_path / "running" / str(bystander.pid)).write_text("1")
        assert ProcessLedger(tmp_path / "running").sweep() == 1  # a new process finds what the old one left
        assert orphan.wait(timeout=5) == -9
        assert bystander.poll() is None
        assert not list((tmp_path / "running").iterdir())
    finally:
        for p in (orphan, bystander):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: sh may have forked sleep rather than exec'd it
            p.wait()


async def test_fifo_does_not_block_read_or_grep(ctx: ToolContext) -> None:
    os.mkfifo(ctx.workspace / "pipe")
    (ctx.workspace / "a.txt").write_text("needle\n")
    r = await asyncio.wait_for(call(ctx, "read_file", path="pipe"), 5)
    assert r.is_error and "regular file" in r.content
    r = await asyncio.wait_for(call(ctx, "grep", pattern="needle"), 5)
    assert r.content == "a.txt:1: needle"
