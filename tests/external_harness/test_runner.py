"""The runner engine against a scripted stand-in harness (fast, deterministic) and the fake host API."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from agenthost.runners.external_harness import runner as runner_mod
from agenthost.runners.external_harness.runner import ClaudeCodeRunner

from .helpers import FAKE_HARNESS, group_alive, pids_with_env


def _kinds(events):
    return [e.WhichOneof("kind") for e in events]


async def _collect(runner, rc):
    return [e async for e in runner.run(rc)]


def _config(tmp_path: Path, mode: str = "ok", **extra):
    return {
        "command": FAKE_HARNESS,
        # Relative: the fake harness writes it under its $HOME, the conversation's harness home, which its sandbox
        # shows.
        # The tag finds its processes from out here, whatever pid namespace they live in.
        "env": {"FAKE_HARNESS_MODE": mode, "FAKE_HARNESS_LOG": "harness.log", "FAKE_HARNESS_TAG": _tag(tmp_path)},
        "interrupt_grace_seconds": 0.3,
        # Off unless a test is about spares (test_warm.py): a spare starting in the background after a turn would
        # join the processes a test counts, at a moment of its own.
        "spare_process": False,
        **extra,
    }


def _tag(tmp_path: Path) -> str:
    return f"fake-harness-{tmp_path.name}-{os.getpid()}"


def _log(tmp_path: Path, *, boots: bool = False) -> list[dict]:
    """The fake harness's log: its turns, or (`boots`) when its stream-json processes started."""
    lines = []
    # One log per conversation (each has its own harness home): merged in the order things happened.
    for path in (tmp_path / "data" / "harness").glob("*/conversations/*/home/harness.log"):
        lines += path.read_text().splitlines()
    entries = sorted(map(json.loads, lines), key=lambda e: e.get("start") or e.get("at") or e.get("end") or 0)
    return [entry for entry in entries if ("boot" in entry) == boots]


@pytest.mark.e2e
async def test_first_turn_assigns_a_session_and_the_next_resumes_it(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    first = await _collect(runner, fake_host.run_context("hello", config=_config(tmp_path)))
    assert _kinds(first) == ["state_updated"] * 3 + ["text_delta", "usage", "message", "completed"]
    assert first[-2].message.text == "echo[1]: hello"
    session = fake_host.data.get_state("conversation", "external.session_id")
    workdir = fake_host.data.get_state("conversation", "external.working_directory")
    assert session and Path(workdir).is_dir()
    # The process was kept (warm.py), so the next message goes to it: the same session, no new start.
    second = await _collect(runner, fake_host.run_context("again", config=_config(tmp_path)))
    assert second[-2].message.text == "echo[2]: again" and _kinds(second)[-1] == "completed"
    starts = [entry for entry in _log(tmp_path) if "argv" in entry]
    assert starts[0]["process"] == starts[1]["process"] and starts[1]["prompt"] == "again"
    assert starts[0]["argv"][starts[0]["argv"].index("--session-id") + 1] == session
    assert starts[0]["cwd"] == workdir
    assert (Path(workdir) / "CLAUDE.md").exists() and (Path(workdir) / ".agenthost/context.json").exists()
    # Without the kept process (the runner restarted, or it expired), a new one resumes the stored session.
    await runner.close()
    third = await _collect(runner, fake_host.run_context("later", config=_config(tmp_path)))
    assert third[-2].message.text == "echo[3]: later"
    starts = [entry for entry in _log(tmp_path) if "argv" in entry]
    assert starts[2]["process"] != starts[0]["process"]
    assert starts[2]["argv"][starts[2]["argv"].index("--resume") + 1] == session and starts[2]["cwd"] == workdir


@pytest.mark.e2e
async def test_harness_env_is_explicit(tmp_path, fake_host, clean_env, monkeypatch) -> None:
    monkeypatch.setenv("HOST_ONLY_SECRET", "do-not-leak")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-123456")
    monkeypatch.setenv("EXTRA_FORWARDED", "yes")
    runner = ClaudeCodeRunner(tmp_path / "data")
    events = await _collect(
        runner, fake_host.run_context("hi", config=_config(tmp_path, pass_env=["EXTRA_FORWARDED"], base_url="http://x"))
    )
    assert _kinds(events)[-1] == "completed"
    env = set(_log(tmp_path)[0]["env"])
    assert "HOST_ONLY_SECRET" not in env
    assert {
        "ANTHROPIC_API_KEY",
        "EXTRA_FORWARDED",
        "ANTHROPIC_BASE_URL",
        "CLAUDE_CONFIG_DIR",
        "HOME",
        "TMPDIR",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    } <= env
    # The default bridge lives in the runner and answers on the harness's own pipes: the harness holds no token.
    assert not env & {"AGENTHOST_RUN_TOKEN", "AGENTHOST_HOST_ADDRESS", "AGENTHOST_RUN_ID", "AGENTHOST_MCP_TOKEN"}
    argv = " ".join(_log(tmp_path)[0]["argv"])
    assert "sk-test-123456" not in argv and fake_host.data.token not in argv


@pytest.mark.e2e
async def test_lost_session_starts_fresh_with_a_note(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    old = fake_host.data.get_state("conversation", "external.session_id")
    for stored in (tmp_path / "data").rglob(f"fake-sessions/{old}"):
        stored.unlink()  # the harness forgot the session (cleanup, a new machine, ...)
    events = await _collect(runner, fake_host.run_context("two", config=_config(tmp_path)))
    assert _kinds(events)[0] == "progress" and old in events[0].progress.message
    assert _kinds(events)[-1] == "completed" and events[-2].message.text == "echo[1]: two"
    new = fake_host.data.get_state("conversation", "external.session_id")
    assert new and new != old


@pytest.mark.e2e
async def test_crash_reports_stderr(tmp_path, fake_host, clean_env) -> None:
    events = await _collect(
        ClaudeCodeRunner(tmp_path / "data"), fake_host.run_context("x", config=_config(tmp_path, "crash"))
    )
    assert _kinds(events) == ["failed"]
    assert events[0].failed.code == "harness_crashed"
    assert "exited with code 3" in events[0].failed.message and "crashed on purpose" in events[0].failed.message


@pytest.mark.e2e
async def test_is_error_result_fails_the_run_with_the_harness_message(tmp_path, fake_host, clean_env) -> None:
    events = await _collect(
        ClaudeCodeRunner(tmp_path / "data"), fake_host.run_context("x", config=_config(tmp_path, "is_error"))
    )
    assert _kinds(events)[-1] == "failed" and "message" not in _kinds(events)
    assert "401 invalid x-api-key" in events[-1].failed.message


@pytest.mark.e2e
async def test_deadline_interrupts_and_kills(tmp_path, fake_host, clean_env) -> None:
    events = await _collect(
        ClaudeCodeRunner(tmp_path / "data"),
        fake_host.run_context("x", config=_config(tmp_path, "stubborn", timeout_seconds=1.0)),
    )
    assert _kinds(events)[-1] == "failed" and events[-1].failed.code == "deadline_exceeded"
    assert events[-1].failed.retryable
    assert _log(tmp_path)
    await asyncio.sleep(0.1)
    assert not pids_with_env(_tag(tmp_path))


@pytest.mark.e2e
async def test_cancel_kills_the_whole_process_group(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    rc = fake_host.run_context("x", config=_config(tmp_path, "stubborn"))
    task = asyncio.create_task(_collect(runner, rc))
    for _ in range(200):
        if runner_mod._LIVE and _log(tmp_path):
            break
        await asyncio.sleep(0.05)
    (proc,) = runner_mod._LIVE
    pid = proc.pid
    await asyncio.sleep(0.3)  # the stubborn harness has started its child
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert not group_alive(pid) and not runner_mod._LIVE
    assert not pids_with_env(_tag(tmp_path))


@pytest.mark.e2e
async def test_turns_of_one_conversation_queue(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    config = _config(tmp_path, "slow")
    a, b = await asyncio.gather(
        _collect(runner, fake_host.run_context("first", config=config)),
        _collect(runner, fake_host.run_context("second", config=config)),
    )
    assert _kinds(a)[-1] == _kinds(b)[-1] == "completed"
    assert "progress" in _kinds(b) and "queued" in b[0].progress.message
    entries = _log(tmp_path)
    starts = sorted(e["start"] for e in entries if "start" in e)
    ends = sorted(e["end"] for e in entries if "end" in e)
    assert starts[1] >= ends[0]  # the second harness started after the first finished
    assert {a[-2].message.text, b[-2].message.text} == {"echo[1]: first", "echo[2]: second"}


@pytest.mark.e2e
async def test_lines_over_one_mib(tmp_path, fake_host, clean_env) -> None:
    events = await _collect(
        ClaudeCodeRunner(tmp_path / "data"), fake_host.run_context("x", config=_config(tmp_path, "bigline"))
    )
    assert _kinds(events)[-1] == "completed" and len(events[-2].message.text) == 3 * 1024 * 1024
    assert sum(1 for e in events if e.WhichOneof("kind") == "text_delta") == 1  # the answer once, not twice


async def test_bad_input_is_a_typed_failure(tmp_path, fake_host, clean_env, monkeypatch) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    bad = await _collect(runner, fake_host.run_context("x", config={"permission_mode": "yolo"}))
    assert _kinds(bad) == ["failed"] and bad[0].failed.code == "harness_config"
    missing = await _collect(runner, fake_host.run_context("x", config={"command": str(tmp_path / "no-claude")}))
    assert missing[-1].failed.code == "harness_not_found"
    empty = await _collect(runner, fake_host.run_context("   ", config=_config(tmp_path)))
    assert empty[-1].failed.code == "empty_input"
    unset_key = await _collect(
        runner, fake_host.run_context("x", config=_config(tmp_path, api_key_env="NOT_SET_ANYWHERE"))
    )
    assert unset_key[-1].failed.code == "harness_config" and "NOT_SET_ANYWHERE" in unset_key[-1].failed.message
    assert "`agenthost keys set NOT_SET_ANYWHERE`" in unset_key[-1].failed.message  # the shared wording
    assert "--key NOT_SET_ANYWHERE`" in unset_key[-1].failed.message
    assert not os.environ.get("NOT_SET_ANYWHERE")


@pytest.mark.e2e
async def test_attachments_are_named_in_the_prompt(tmp_path, fake_host, clean_env) -> None:
    from agenthost.protos import common_pb2 as pb

    rc = fake_host.run_context("see the file", config=_config(tmp_path))
    rc.context.input.attachments.append(
        pb.ArtifactRef(artifact_id="art-9", name="report.pdf", mime_type="application/pdf", size_bytes=42)
    )
    events = await _collect(ClaudeCodeRunner(tmp_path / "data"), rc)
    assert _kinds(events)[-1] == "completed"
    prompt = _log(tmp_path)[0]["prompt"]
    assert prompt.startswith("see the file") and "art-9" in prompt and "artifact_read" in prompt


@pytest.mark.e2e
async def test_big_tool_results_become_artifacts(tmp_path, fake_host, clean_env) -> None:
    events = await _collect(
        ClaudeCodeRunner(tmp_path / "data"), fake_host.run_context("x", config=_config(tmp_path, "bigtool"))
    )
    assert _kinds(events)[-1] == "completed"
    (finished,) = [e.tool_finished for e in events if e.WhichOneof("kind") == "tool_finished"]
    assert finished.artifact_id and len(finished.result) < 17_000 and finished.artifact_id in finished.result
    ref, data = fake_host.data.artifacts[finished.artifact_id]
    assert data == b"R" * 100_000 and "Read" in ref.metadata_json
