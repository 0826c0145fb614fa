"""What one conversation's harness can leave for another, and for the runner: attacks made by a model's shell
commands inside the harness's sandbox (the stand-in harness runs `[sh] …` prompts; the slow test has the real
Claude Code CLI run them through its Bash tool).

* The harness home (`HOME`, `CLAUDE_CONFIG_DIR`, `CODEX_HOME`, `TMPDIR`) is the conversation's own: what a model
  plants there (`CLAUDE.md`, `settings.json` hooks) never reaches another conversation (spares included), and it
  cannot read another's session transcripts. The config dir's start-up files are rewritten before each turn.
* The runner's writes into the working directory never follow a symlink a model planted there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# The harness tests' fixtures: the fake host API and a clean environment (runners are closed: pytestmark).
from external_harness.conftest import claude_bin, clean_env, fake_host  # noqa: F401
from external_harness.fake_apis import FakeAnthropic, Request
from external_harness.helpers import kinds
from external_harness.test_runner import _collect, _config
from external_harness.test_warm import _new_conversation, _spare_boot, _starts

from agenthost.plugins import sandbox as walls
from agenthost.runners.external_harness.runner import ClaudeCodeRunner

needs_bwrap = pytest.mark.skipif(walls.probe() is not None, reason=f"no working bubblewrap: {walls.probe()}")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), needs_bwrap, pytest.mark.usefixtures("close_harness_runners")]

PLANT = (
    "[sh] printf PLANTED-CLAUDE-MD > $CLAUDE_CONFIG_DIR/CLAUDE.md && "
    """printf '{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /tmp/pwned"}]}]}}' """
    "> $CLAUDE_CONFIG_DIR/settings.json && mkdir -p $CLAUDE_CONFIG_DIR/projects/planted && "
    "printf PLANTED-TRANSCRIPT > $CLAUDE_CONFIG_DIR/projects/planted/a.jsonl && ls $CLAUDE_CONFIG_DIR/fake-sessions"
)
LOOK = (
    "[sh] ls -A $CLAUDE_CONFIG_DIR; cat $CLAUDE_CONFIG_DIR/CLAUDE.md $CLAUDE_CONFIG_DIR/settings.json; "
    "ls -AR $CLAUDE_CONFIG_DIR/projects $CLAUDE_CONFIG_DIR/fake-sessions $HOME; echo LOOKED"
)


def _reply(events) -> str:
    assert kinds(events)[-1] == "completed", events[-1]
    return events[-2].message.text


@pytest.mark.parametrize("spare", [False, True], ids=["new-process", "spare"])
async def test_what_one_conversation_plants_in_its_home_reaches_no_other(
    spare,
    tmp_path,
    fake_host,  # noqa: F811
    clean_env,  # noqa: F811
) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    config = _config(tmp_path, spare_process=spare)
    planted = _reply(await _collect(runner, fake_host.run_context(PLANT, config=config)))
    session_a = fake_host.data.get_state("conversation", "external.session_id")
    conversation_a, state_a = fake_host.data.conversation_id, dict(fake_host.data.state)
    assert session_a in planted  # the command ran, and saw its own session store
    if spare:
        boot = await _spare_boot(runner, tmp_path)
        # The spare started after the plant: it loaded nothing of it.
        assert not {"CLAUDE.md", "settings.json", "projects"} & set(boot["config_files"]), boot

    _new_conversation(fake_host, "conv-b")
    looked = _reply(await _collect(runner, fake_host.run_context(LOOK, config=config)))
    assert "LOOKED" in looked
    for trace in ("PLANTED", "planted", "pwned", session_a):
        assert trace not in looked, (trace, looked)
    started_b = _starts(tmp_path)[-1]
    if spare:
        assert started_b["process"] == boot["boot"]  # B's first message went to the spare
    assert not {"CLAUDE.md", "settings.json", "projects"} & set(started_b["config_files"]), started_b

    # A's next message resumes A's session; what it planted in its own config dir is gone by then too (a new
    # process starts, the config dir's files having changed since its kept process read them).
    _new_conversation(fake_host, conversation_a)
    fake_host.data.state.update(state_a)
    again = _reply(await _collect(runner, fake_host.run_context(LOOK, config=config)))
    assert again.startswith("echo[2]: ") and session_a in again, again
    assert "PLANTED-CLAUDE-MD" not in again and "pwned" not in again


# ---- the runner's writes into the working directory ----

SKILLS = [{"name": "runbook", "description": "d", "body": "# Runbook"}]
RUNNER_FILES = ("context.json", "mcp.json", "skills.json", "append-system-prompt.md", "SKILL.md", "runbook")


def _tree(path: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None for p in sorted(path.rglob("*"))}


def _plants(outside: Path, workdir: Path) -> dict[str, str]:
    """Each attack: the shell command a model runs in one turn, against the runner's projection in the next."""
    up = os.path.relpath(outside, workdir / ".claude" / "skills")
    manifest = json.dumps({".claude/skills": {up: "x", "runbook": "x"}, ".agents/skills": {}})
    return {
        "agenthost-up": "rm -rf .agenthost && ln -s ../.. .agenthost",
        "agenthost-out": f"rm -rf .agenthost && ln -s {outside} .agenthost",
        "context-file": f"ln -sf {outside}/keep.txt .agenthost/context.json && ln -sf {outside} .agenthost/mcp.json",
        "skills-dir": f"rm -rf .claude/skills && ln -s {outside} .claude/skills",
        "skill-dir": f"rm -rf .claude/skills/runbook && ln -s {outside} .claude/skills/runbook",
        "manifest-names": f"printf '%s' '{manifest}' > .agenthost/skills.json",
    }


# A symlinked directory on the way is refused (projection_error names it); a symlink in place of a file or a skill
# directory the runner owns is replaced; a manifest name that is not a plain name is ignored.
REFUSED = {"agenthost-up", "agenthost-out", "skills-dir"}


ATTACKS = ["agenthost-up", "agenthost-out", "context-file", "skills-dir", "skill-dir", "manifest-names"]


@pytest.mark.parametrize("attack", ATTACKS)
async def test_the_runner_writes_through_no_symlink_a_model_planted(
    attack,
    tmp_path,
    fake_host,  # noqa: F811
    clean_env,  # noqa: F811
) -> None:
    runner = ClaudeCodeRunner(tmp_path / "data")
    config = _config(tmp_path, skills=SKILLS, mcp_transport="http", append_system_prompt="Be brief.")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("the runner's own file")
    first = await _collect(runner, fake_host.run_context("hello", config=config))
    workdir = Path(fake_host.data.get_state("conversation", "external.working_directory"))
    up = workdir.parent.parent  # where `.agenthost -> ../..` points

    def seen() -> dict[str, object]:
        return {"outside": _tree(outside), "up": sorted(os.listdir(up)), "bot": sorted(os.listdir(workdir.parent))}

    before = seen()
    assert kinds(first)[-1] == "completed"

    planted = await _collect(runner, fake_host.run_context("[sh] " + _plants(outside, workdir)[attack], config=config))
    assert _reply(planted).startswith("echo[2]: sh"), planted[-2].message.text
    planted_at = {"context-file": ".agenthost/context.json", "skill-dir": ".claude/skills/runbook"}
    if attack != "manifest-names":
        path = workdir / planted_at.get(attack, ".agenthost" if attack.startswith("agenthost") else ".claude/skills")
        assert path.is_symlink(), path
    assert seen() == before  # the command itself could not reach any of it: only its runner could

    attacked = await _collect(runner, fake_host.run_context("next", config=config))
    assert {
        "outside": _tree(outside),
        "up": sorted(os.listdir(up)),
        "bot": sorted(os.listdir(workdir.parent)),
    } == before
    assert not any(name in RUNNER_FILES for name in os.listdir(up))
    if attack in REFUSED:
        assert kinds(attacked)[-1] == "failed", attacked[-1]
        failed = attacked[-1].failed
        assert failed.code == "projection_error" and "symlink" in failed.message and "remove it" in failed.message
        return
    assert _reply(attacked).startswith("echo[3]: next")
    for name in ("context.json", "mcp.json", "skills.json"):
        assert (workdir / ".agenthost" / name).is_file() and not (workdir / ".agenthost" / name).is_symlink()
    skill = workdir / ".claude" / "skills" / "runbook"
    assert not skill.is_symlink() and (skill / "SKILL.md").read_text().endswith("# Runbook\n")


# ---- the real Claude Code CLI: the plant as a Bash tool call ----


@pytest.mark.slow
async def test_claude_code_plants_in_its_config_dir_reach_no_other_conversation(
    tmp_path,
    fake_host,  # noqa: F811
    clean_env,  # noqa: F811
    claude_bin,  # noqa: F811
    monkeypatch,
) -> None:
    """Claude Code loads `$CLAUDE_CONFIG_DIR/CLAUDE.md` into every session it starts (user memory) and keeps its
    transcripts under `$CLAUDE_CONFIG_DIR/projects/`: a conversation's Bash tool writes the one and lists the other;
    another conversation's model requests carry nothing of it and its listing shows none of A's sessions."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake-0123456789")
    # The marker is assembled by the shell, so it is in the file and not in the command the session records.
    plant = 'printf PLANTED-%s USER-MEMORY-77 > "$CLAUDE_CONFIG_DIR/CLAUDE.md"; ls -R "$CLAUDE_CONFIG_DIR/projects"'
    look = 'ls -AR "$CLAUDE_CONFIG_DIR/projects"; cat "$CLAUDE_CONFIG_DIR/CLAUDE.md"; echo LOOKED'

    def script(req: Request) -> list[dict[str, Any]]:
        if req.steps == 0:
            command = plant if "PLANT" in req.prompt else look
            return [{"type": "tool", "name": "Bash", "input": {"command": command, "description": "look"}}]
        return [{"type": "text", "text": f"REPORT {req.last_tool_result}"}]

    with FakeAnthropic(script) as fake:
        config = {
            "command": claude_bin,
            "base_url": f"http://127.0.0.1:{fake.port}",
            "allowed_tools": ["Bash"],
            "interrupt_grace_seconds": 1.0,
        }
        runner = ClaudeCodeRunner(tmp_path / "data")
        planted = _reply(await _collect(runner, fake_host.run_context("PLANT it", config=config)))
        session_a = fake_host.data.get_state("conversation", "external.session_id")
        assert f"{session_a}.jsonl" in planted  # the tool ran, in A's own config dir
        conversation_a, state_a = fake_host.data.conversation_id, dict(fake_host.data.state)

        _new_conversation(fake_host, "conv-b")
        n = len(fake.requests)
        looked = _reply(await _collect(runner, fake_host.run_context("look around", config=config)))
        assert not any("PLANTED-USER-MEMORY-77" in r.raw for r in fake.requests[n:])
        assert "LOOKED" in looked and session_a not in looked and "USER-MEMORY" not in looked, looked

        # A goes on in its own session; what it planted in its config dir is gone before its next turn.
        _new_conversation(fake_host, conversation_a)
        fake_host.data.state.update(state_a)
        n = len(fake.requests)
        again = _reply(await _collect(runner, fake_host.run_context("look again", config=config)))
        assert fake_host.data.get_state("conversation", "external.session_id") == session_a
        assert "PLANT it" in fake.requests[n].raw  # the resumed session's history went with the request
        assert not any("PLANTED-USER-MEMORY-77" in r.raw for r in fake.requests[n:])  # not loaded as user memory
        assert f"{session_a}.jsonl" in again and "USER-MEMORY" not in again, again
