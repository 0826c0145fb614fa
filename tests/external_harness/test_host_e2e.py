"""End to end through the real host (stores, grants, run API, orchestration) with the SDK's in-process harness."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from agenthost.host.runs.context import MAX_SNAPSHOT_KEYS
from agenthost.protos import errors
from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner
from agenthost.runners.sdk.testing import HostHarness

from .fake_apis import FakeAnthropic, FakeOpenAI
from .helpers import FAKE_HARNESS
from .test_real_clis import _claude_config, _codex_config, claude_script, codex_script

pytestmark = pytest.mark.slow


def _stored(harness: HostHarness, key: str) -> list:
    rows = harness.host.state.db.query("SELECT value_json FROM state WHERE key = ?", (key,))
    return [json.loads(r[0]) for r in rows]


async def test_claude_code_through_the_host(tmp_path, clean_env, claude_bin, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    with FakeAnthropic(claude_script) as fake:
        config = _claude_config(fake, command=claude_bin)
        async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config=config) as h:
            first = await h.send("hello, remember MARKER-E2E-FIRST", conversation_id="c1")
            assert first.run.status == "completed", (first.run.error_code, first.run.error_message)
            assert first.text.startswith("ANSWER to") and first.text.count("ANSWER to") == 1  # not twice
            # The harness asks the host (through the bridge and the real AgentRunAPIProxy) for the history.
            second = await h.send("HISTORY-PLEASE what did I say?", conversation_id="c1")
            assert second.run.status == "completed", second.run.error_message
            assert "MARKER-E2E-FIRST" in second.text
            assert second.text.startswith("Checking the host records.\n\nFINAL-HISTORY")
            # Each piece of the reply exactly once (the history page itself already lists the first piece).
            assert second.text.count("FINAL-HISTORY") == 1
            assert second.text.split("FINAL-HISTORY")[0] == "Checking the host records.\n\n"
            assert "tool_started" in second.kinds() and "tool_finished" in second.kinds()
            # Resumed: the model saw the first exchange without the host inlining any history.
            assert any("MARKER-E2E-FIRST" in r.raw and "HISTORY-PLEASE" in r.prompt for r in fake.requests)
            (session,) = _stored(h, "external.session_id")
            assert session and len(_stored(h, "external.working_directory")) == 1


async def test_codex_through_the_host(tmp_path, clean_env, codex_bin, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake-0123456789")
    with FakeOpenAI(codex_script) as fake:
        async with HostHarness(tmp_path, runners=[CodexRunner], config=_codex_config(fake, command=codex_bin)) as h:
            first = await h.send("hello, remember MARKER-E2E-CODEX", conversation_id="c1")
            assert first.run.status == "completed", (first.run.error_code, first.run.error_message)
            second = await h.send("HISTORY-PLEASE what did I say?", conversation_id="c1")
            assert second.run.status == "completed", second.run.error_message
            assert "MARKER-E2E-CODEX" in second.text
            assert len(_stored(h, "external.session_id")) == 1
            assert second.run.usage.output_tokens > 0


async def test_failures_and_queueing_through_the_host(tmp_path, clean_env) -> None:
    log = tmp_path / "harness.log"
    config = {"command": FAKE_HARNESS, "env": {"FAKE_HARNESS_MODE": "slow", "FAKE_HARNESS_LOG": str(log)}}
    async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config=config) as h:
        a, b = await asyncio.gather(h.send("one", conversation_id="q"), h.send("two", conversation_id="q"))
        assert a.run.status == b.run.status == "completed", (a.run.error_message, b.run.error_message)
        # One turn at a time: whichever ran second saw the first in its session.
        assert sorted(r.text.split(":")[0] for r in (a, b)) == ["echo[1]", "echo[2]"]
    crash = {"command": FAKE_HARNESS, "env": {"FAKE_HARNESS_MODE": "crash"}}
    async with HostHarness(tmp_path / "crash", runners=[ClaudeCodeRunner], config=crash) as h:
        result = await h.send("boom")
        assert result.run.status == "failed" and result.run.error_code == "harness_crashed"
        assert "crashed on purpose" in result.run.error_message
    assert not os.environ.get("ANTHROPIC_API_KEY")


async def test_the_stored_session_comes_with_the_run_and_is_read_live_when_the_snapshot_is_cut(
    tmp_path, clean_env
) -> None:
    """The next turn resumes from the run's state snapshot with no run-API round trip before the harness starts;
    a conversation whose state fills the snapshot past its key cap (keys sorting before `external.*`) is marked
    cut, and the runner then reads its session live instead of starting a new one."""
    config = {"command": FAKE_HARNESS}
    async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config=config) as h:
        first = await h.send("one", conversation_id="s")
        second = await h.send("two", conversation_id="s")
        assert (first.text.split(":")[0], second.text.split(":")[0]) == ("echo[1]", "echo[2]"), second.text
        h.host.audit.flush()
        await h.host.db.flush()
        reads = [r for r in h.host.audit.rows() if r["run_id"] == second.run.run_id and r["method"] == "StateGet"]
        assert reads == []
        (scope_key,) = (
            r[0] for r in h.host.state.db.query("SELECT scope_key FROM state WHERE key = ?", ("external.session_id",))
        )
        for i in range(MAX_SNAPSHOT_KEYS):
            await h.host.state.set(scope_key, f"a{i:03}", "1")
        third = await h.send("three", conversation_id="s")
        assert third.text.startswith("echo[3]"), third.text  # resumed: echo[1] would be a new session
        h.host.audit.flush()
        await h.host.db.flush()
        reads = [r for r in h.host.audit.rows() if r["run_id"] == third.run.run_id and r["method"] == "StateGet"]
        assert len(reads) == 4 and {r["outcome"] for r in reads} == {"OK"}


async def test_builtin_plugin_process_serves_both_runners(tmp_path, clean_env, monkeypatch) -> None:
    """Registered through the `agenthost.runners` entry point and run by the host's supervisor as a real
    plugin process, exactly as users get them."""
    # The plugin process runs in the host's sandbox, which shows the stand-in harness only when told to (as a
    # user would for a harness installed outside the system dirs); the runner nests the harness's own inside.
    monkeypatch.setenv("AGENTHOST_SANDBOX_RO", str(Path(FAKE_HARNESS).parent))
    async with HostHarness(tmp_path, builtin=True) as h:
        await h.bind("agenthost/claude-code", {"command": FAKE_HARNESS}, priority=10)
        first = await h.send("hello", conversation_id="c1")
        again = await h.send("again", conversation_id="c1")
        assert first.run.runner_id == "agenthost/claude-code", first.run
        assert (first.run.status, first.text) == ("completed", "echo[1]: hello"), first.run.error_message
        assert (again.run.status, again.text) == ("completed", "echo[2]: again"), again.run.error_message
        # A path that does not exist is refused at bind time; a bare name is looked up on the runner's PATH.
        with pytest.raises(errors.InvalidArgument, match="does not exist"):
            await h.bind("agenthost/codex", {"command": str(tmp_path / "no-codex-here")}, priority=20)
        await h.bind("agenthost/codex", {"command": "no-codex-here"}, priority=20)
        missing = await h.send("hi", conversation_id="c2")
        assert missing.run.runner_id == "agenthost/codex"
        assert (missing.run.status, missing.run.error_code) == ("failed", "harness_not_found")


async def test_a_new_conversations_first_message_takes_the_spare_through_host_and_plugin(
    tmp_path, clean_env, monkeypatch
) -> None:
    """Through the host and the built-in plugin process as users run them: the run contexts of two conversations
    give the same binding key and start-up files, so the second conversation's first message goes to the spare
    the first one's message left."""
    monkeypatch.setenv("AGENTHOST_SANDBOX_RO", str(Path(FAKE_HARNESS).parent))
    async with HostHarness(tmp_path, builtin=True) as h:
        await h.bind("agenthost/claude-code", {"command": FAKE_HARNESS, "env": {"FAKE_HARNESS_LOG": "harness.log"}})
        first = await h.send("hello", conversation_id="c1")
        assert (first.run.status, first.text) == ("completed", "echo[1]: hello"), first.run.error_message

        def log() -> list[dict]:
            lines = [line for path in tmp_path.rglob("harness.log") for line in path.read_text().splitlines()]
            return [json.loads(line) for line in lines]

        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while len([e for e in log() if "boot" in e]) < 2:  # the first message's process, then the spare
            assert loop.time() < end, f"no spare started: {log()}"
            await asyncio.sleep(0.05)
        (answered_first,) = [e["process"] for e in log() if e.get("prompt") == "hello"]
        (spare,) = [e["boot"] for e in log() if e.get("boot") not in (None, answered_first)]
        second = await h.send("hi", conversation_id="c2")
        assert (second.run.status, second.text) == ("completed", "echo[1]: hi"), second.run.error_message
        (turn,) = [e for e in log() if e.get("prompt") == "hi"]
        assert turn["process"] == spare and "/.spares/" in turn["cwd"]


async def test_codex_default_binding_runs_commands_in_the_builtin_plugin(
    tmp_path, clean_env, codex_bin, monkeypatch
) -> None:
    """As `agenthost serve` runs it: the built-in runner in the host's plugin sandbox, the harness's sandbox inside
    it, and Codex's commands inside that. Codex's own bubblewrap could not start there (every command waited 10 s
    and returned no output); agenthost's walls now enforce the default `sandbox: read-only` themselves."""
    from agenthost.protos import host_pb2 as hpb

    from .fake_apis import Request

    # The plugin sandbox shows the CLI's install only when told to, as for a user's install outside the system dirs.
    codex = os.path.realpath(codex_bin)
    monkeypatch.setenv("AGENTHOST_SANDBOX_RO", str(Path(codex).parents[3]))  # its node_modules
    outputs: list[str] = []

    def script(req: Request) -> list[dict]:
        if req.steps > 0:
            outputs.append(req.last_tool_result)
        return codex_script(req)

    with FakeOpenAI(script) as fake:
        async with HostHarness(tmp_path, builtin=True) as h:
            await h.client.call("SetKey", hpb.SetKeyRequest(name="OPENAI_API_KEY", value="sk-openai-fake-0123456789"))
            await h.bind("agenthost/codex", _codex_config(fake, command=codex), keys=["OPENAI_API_KEY"])
            result = await h.send("SHELL-PLEASE", conversation_id="c1")
    assert result.run.status == "completed", (result.run.error_code, result.run.error_message)
    (output,) = outputs
    assert "agenthost.external_harness_context.v1" in output and "Process running with session ID" not in output
    assert "MARKER-WRITE-FAILED" in output and "Read-only file system" in output, output
    assert result.text.startswith("FINAL-SHELL")


async def test_host_rejects_a_bad_binding_config_via_the_manifest_schema(tmp_path, clean_env) -> None:
    from agenthost.protos import errors

    async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config={"command": FAKE_HARNESS}) as h:
        with pytest.raises(errors.AgentHostError) as err:
            await h.bind("test/claude-code", {"permission_mode": "yolo"})
        assert "permission_mode" in err.value.message


class _DeafRunner(ClaudeCodeRunner):
    """Never notices the deadline itself, so the host's own deadline is what ends the run."""

    def _deadline(self, run, config):  # type: ignore[override]
        return None


@pytest.mark.parametrize("who", ["runner", "host"])
async def test_a_run_past_its_deadline_is_timed_out(who: str, tmp_path, clean_env) -> None:
    tag = f"deadline-{who}-{os.getpid()}-{tmp_path.name}"
    config = {
        "command": FAKE_HARNESS,
        "env": {"FAKE_HARNESS_MODE": "stubborn", "FAKE_HARNESS_TAG": tag},
        "interrupt_grace_seconds": 0.3,
    }
    runner = ClaudeCodeRunner if who == "runner" else _DeafRunner
    async with HostHarness(tmp_path, runners=[runner], config=config) as h:
        await h.bind("test/claude-code", config, priority=10, timeout_seconds=4)
        result = await asyncio.wait_for(h.send("never finishes"), 30)
        assert (result.run.status, result.run.error_code) == ("timed_out", "deadline_exceeded"), result.run
        # Which side noticed: the runner says the harness was interrupted; the host names its own deadline.
        noticed = "it was interrupted" if who == "runner" else "passed its deadline"
        assert noticed in result.run.error_message, result.run.error_message
        # The end of the run stops the harness then, not when the host harness shuts down.
        from agenthost.runners.external_harness import runner as runner_mod

        for _ in range(200):
            if not runner_mod._LIVE:
                break
            await asyncio.sleep(0.05)
        assert not runner_mod._LIVE, runner_mod._LIVE
    from .helpers import pids_with_env

    for _ in range(100):  # the stubborn harness ignores SIGINT; it must still be gone
        if not pids_with_env(tag):
            break
        await asyncio.sleep(0.05)
    assert not pids_with_env(tag)


async def test_a_harness_turn_filling_the_workspace_or_its_home_is_stopped_and_the_next_refused(
    tmp_path, clean_env
) -> None:
    """Issue 25 item 15 for harnesses: a command the harness runs writes past `workspace_max_mib`, in the working
    dir or in its home and TMPDIR (on disk, beside the conversation's harness config). The turn is stopped, the
    run fails naming the setting, and the conversation's next message is refused until space is freed."""
    config = {"command": FAKE_HARNESS, "workspace_max_mib": 4}
    fill = "for i in $(seq 64); do head -c 1048576 /dev/zero > f$i || exit 3; sleep 0.05; done; echo finished"
    home = "head -c 3145728 /dev/zero > $TMPDIR/a; head -c 3145728 /dev/zero > $HOME/b; echo wrote"
    async with HostHarness(tmp_path, runners=[ClaudeCodeRunner], config=config) as h:
        for conversation, command in (("work", fill), ("home", home)):
            first = await h.send(f"[sh] {command}", conversation_id=conversation)
            if conversation == "work":
                assert first.run.status == "failed" and first.run.error_code == "workspace_quota", first.run
                assert "workspace quota exceeded" in first.run.error_message
                assert "binding setting workspace_max_mib" in first.run.error_message
            refused = await h.send("[sh] echo ran", conversation_id=conversation)
            assert refused.run.status == "failed" and refused.run.error_code == "workspace_quota", refused.run
            assert refused.run.error_message.startswith("message not sent to"), refused.run.error_message
            assert "ran" not in refused.text
