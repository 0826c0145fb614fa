"""Claude Code processes kept between the messages of a conversation (warm.py), against the scripted stand-in
harness: when a process is reused, when it must not be, and that nothing of it outlives its welcome."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agenthost.runners.external_harness.runner import ClaudeCodeRunner
from agenthost.runners.external_harness.warm import KeptHarnesses
from agenthost.runners.sdk.events import scope_value

from .helpers import pids_with_env
from .test_runner import _collect, _config, _kinds, _log, _tag

pytestmark = [pytest.mark.timeout(60)]


def _starts(tmp_path: Path) -> list[dict]:
    return [entry for entry in _log(tmp_path) if "argv" in entry]


async def _until(condition, what: str, timeout: float = 20.0) -> None:
    """Waits for a condition the runner reaches on its own (a timer, a process exiting), however loaded the
    machine is; fails with `what` if it never does."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


async def test_the_next_message_goes_to_the_kept_process_with_its_own_cost(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    turns = []
    for text in ("one", "two", "three"):
        turns.append(await _collect(runner, fake_host.run_context(text, config=_config(tmp_path))))
    assert [t[-2].message.text for t in turns] == ["echo[1]: one", "echo[2]: two", "echo[3]: three"]
    starts = _starts(tmp_path)
    assert len({s["process"] for s in starts}) == 1 and [s["prompt"] for s in starts] == ["one", "two", "three"]
    assert starts[0]["argv"][starts[0]["argv"].index("--input-format") + 1] == "stream-json"
    # The CLI reports the process's running cost (0.01, 0.02, 0.03); each message is charged its own share.
    costs = [next(e.usage.cost_usd for e in t if e.WhichOneof("kind") == "usage") for t in turns]
    assert costs == pytest.approx([0.01, 0.01, 0.01])
    assert len(runner.kept) == 1


@pytest.mark.parametrize("change", ["config", "claude_md", "key", "session_reset", "bridge_grant"])
async def test_a_changed_start_up_input_gets_a_new_process_that_resumes(
    change: str, tmp_path, fake_host, clean_env, monkeypatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-first-key")
    runner = ClaudeCodeRunner(tmp_path / "data")
    first = await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    one_kept = len(pids_with_env(_tag(tmp_path)))  # bwrap, its init and the harness, or fewer without a sandbox
    assert one_kept
    session = fake_host.data.get_state("conversation", "external.session_id")
    workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
    config = _config(tmp_path)
    if change == "config":
        config["append_system_prompt"] = "Answer in French."
    elif change == "claude_md":
        with (workdir / "CLAUDE.md").open("a") as fh:
            fh.write("\nA rule the user added after the process started.\n")
    elif change == "key":
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-rotated-key")
    elif change == "session_reset":
        fake_host.data.state.pop((scope_value("conversation"), "external.session_id"))
    rc = fake_host.run_context("two", config=config)
    if change == "bridge_grant":  # the endpoint's tool list was fixed when the CLI listed it
        del rc.context.resources.apis[:]
        rc.context.resources.apis.append("history.page")
    second = await _collect(runner, rc)
    assert _kinds(first)[-1] == _kinds(second)[-1] == "completed"
    starts = _starts(tmp_path)
    assert starts[0]["process"] != starts[1]["process"]
    argv = starts[1]["argv"]
    if change == "session_reset":
        assert "--resume" not in argv and second[-2].message.text == "echo[1]: two"
    else:
        assert argv[argv.index("--resume") + 1] == session and second[-2].message.text == "echo[2]: two"
    # The old process is gone, the new one kept in its place.
    assert len(runner.kept) == 1
    await _until(lambda: len(pids_with_env(_tag(tmp_path))) == one_kept, "the replaced process stopped")


@pytest.mark.parametrize("why", ["failed", "keep_warm_0", "budget", "stdio_bridge", "left_a_process", "no_sandbox"])
async def test_processes_that_must_not_be_kept_are_not(why: str, tmp_path, fake_host, clean_env) -> None:
    mode = "is_error" if why == "failed" else "ok"
    extra = {
        "keep_warm_0": {"keep_warm_seconds": 0},
        "budget": {"max_budget_usd": 1.0},  # the CLI counts it over its whole life, not per message
        "stdio_bridge": {"mcp_transport": "stdio"},  # its bridge process holds one run's token
        "no_sandbox": {"process_sandbox": False},  # no pid namespace to see what a turn left running
    }.get(why, {})
    prompt = "[spawn] one" if why == "left_a_process" else "one"  # nothing a model starts outlives its run
    runner = ClaudeCodeRunner(tmp_path / "data")
    events = await _collect(runner, fake_host.run_context(prompt, config=_config(tmp_path, mode, **extra)))
    assert _kinds(events)[-1] == ("failed" if why == "failed" else "completed")
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the turn's process exited")
    if why == "stdio_bridge":
        # One message per process, as before the kept processes: the prompt on stdin, no stream-json input (which
        # the default bridge, on the CLI's own pipes, needs even when nothing is kept).
        assert "--input-format" not in _starts(tmp_path)[0]["argv"]


async def test_idle_processes_expire(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path, keep_warm_seconds=0.3)))
    await _until(lambda: len(runner.kept) == 0, "the idle process expired")
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the expired process exited")
    second = await _collect(runner, fake_host.run_context("two", config=_config(tmp_path, keep_warm_seconds=0.3)))
    assert second[-2].message.text == "echo[2]: two"
    assert len({s["process"] for s in _starts(tmp_path)}) == 2


async def test_a_process_that_prints_while_idle_is_retired(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("[noise] one", config=_config(tmp_path)))
    await _until(lambda: len(runner.kept) == 0, "the noisy process was retired")
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the retired process exited")
    # Its stray line is not taken for the next message's reply: that comes from a new process.
    second = await _collect(runner, fake_host.run_context("two", config=_config(tmp_path)))
    assert second[-2].message.text == "echo[2]: two" and _kinds(second)[-1] == "completed"
    assert len({s["process"] for s in _starts(tmp_path)}) == 2


async def test_cancelling_a_message_in_a_kept_process_stops_it(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path)))
    task = asyncio.create_task(_collect(runner, fake_host.run_context("[hang] two", config=_config(tmp_path))))
    await _until(lambda: len(_starts(tmp_path)) == 2, "the kept process took the second message")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the cancelled process exited")
    third = await _collect(runner, fake_host.run_context("three", config=_config(tmp_path)))
    assert _kinds(third)[-1] == "completed" and third[-2].message.text.startswith("echo[")
    starts = _starts(tmp_path)
    assert starts[2]["process"] != starts[0]["process"] and "--resume" in starts[2]["argv"]


async def test_a_deadline_in_a_kept_process_stops_it(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    await _collect(runner, fake_host.run_context("one", config=_config(tmp_path, timeout_seconds=5)))
    events = await _collect(runner, fake_host.run_context("[hang] two", config=_config(tmp_path, timeout_seconds=1)))
    assert _kinds(events)[-1] == "failed" and events[-1].failed.code == "deadline_exceeded"
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "the timed-out process exited")


async def test_kept_processes_are_bounded_and_stop_with_the_runner(tmp_path, fake_host, clean_env) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    runner.kept = KeptHarnesses(capacity=2)
    for n in range(3):
        fake_host.data.conversation_id = f"conv-{n}"
        events = await _collect(runner, fake_host.run_context(f"hi {n}", config=_config(tmp_path)))
        assert _kinds(events)[-1] == "completed"
        if n == 0:
            one_kept = len(pids_with_env(_tag(tmp_path)))
    assert len(runner.kept) == 2  # the least recently used one was stopped
    await _until(lambda: len(pids_with_env(_tag(tmp_path))) == 2 * one_kept, "the evicted process exited")
    await runner.close()
    assert len(runner.kept) == 0
    await _until(lambda: not pids_with_env(_tag(tmp_path)), "every kept process stopped with the runner")
