from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agenthost.protos import runner_pb2
from agenthost.runners.external_harness import mcp_bridge
from agenthost.runners.external_harness.config import ClaudeCodeConfig, parse_config
from agenthost.runners.external_harness.projection import (
    BEGIN_MARKER,
    END_MARKER,
    SCHEMA,
    BridgeLaunch,
    HttpBridgeLaunch,
    codex_mcp_overrides,
    project,
    project_skills,
    upsert_managed_block,
    write_claude_mcp_config,
)
from agenthost.runners.external_harness.workspace import WorkspaceManager

from .fake_run_api import FakeHost


@pytest.fixture
def workspace(tmp_path: Path):
    return WorkspaceManager(tmp_path).workspace("bot", "conv")


def _ctx() -> runner_pb2.AgentRunContext:
    host = FakeHost(Path("/nonexistent"))
    ctx = host.context("hello there", config={})
    ctx.state_json = json.dumps({"conversation": {"external.session_id": "s-1", "note": 1}})
    return ctx


def test_context_json_carries_the_run_and_pointers(workspace) -> None:
    config = parse_config(ClaudeCodeConfig, {"instructions": "Be brief."})
    project(_ctx(), config, workspace, harness="claude-code", session_id="s-1", bridge_enabled=True)
    doc = json.loads((workspace.agenthost_dir / "context.json").read_text())
    assert doc["schema"] == SCHEMA
    for key in ("run", "event", "actor", "conversation", "input", "delivery", "resources", "context_access", "state"):
        assert key in doc
    assert doc["input"]["text"] == "hello there"
    assert doc["run"]["run_id"] == "run-1"
    assert doc["state"]["session"] == {"scope": "conversation", "key": "external.session_id", "value": "s-1"}
    assert doc["state"]["snapshot_keys"] == {"conversation": ["external.session_id", "note"]}
    # Only the tools the run's grant covers (the fake grants history.page, state.read, state.write).
    assert doc["mcp"]["tools"] == ["history_page", "state_get", "state_set"]
    assert set(mcp_bridge.tools_for(None)) == set(mcp_bridge.TOOL_NAMES)
    assert stat.S_IMODE(os.stat(workspace.agenthost_dir / "context.json").st_mode) == 0o600
    claude_md = (workspace.working_dir / "CLAUDE.md").read_text()
    assert "Be brief." in claude_md and "mcp__agenthost__history_page" in claude_md
    assert not (workspace.working_dir / "AGENTS.md").exists()


def test_codex_gets_agents_md(workspace) -> None:
    config = parse_config(ClaudeCodeConfig, {"instructions": "MARK"})
    project(_ctx(), config, workspace, harness="codex", session_id=None, bridge_enabled=False)
    agents = (workspace.working_dir / "AGENTS.md").read_text()
    assert "MARK" in agents and "mcp__" not in agents


def test_managed_block_preserves_user_content(tmp_path: Path) -> None:
    path = tmp_path / "CLAUDE.md"
    path.write_text("# My notes\nkeep me\n")
    upsert_managed_block(path, "version one")
    upsert_managed_block(path, "version two")
    text = path.read_text()
    assert text.startswith("# My notes\nkeep me\n\n")
    assert text.count(BEGIN_MARKER) == 1 and "version two" in text and "version one" not in text
    # The user edits around the block; both sides survive the next turn.
    path.write_text("top\n" + text + "bottom line\n")
    upsert_managed_block(path, "version three")
    text = path.read_text()
    assert text.startswith("top\n# My notes") and text.endswith(f"{END_MARKER}\nbottom line\n")
    assert "version three" in text


def test_managed_block_survives_a_deleted_end_marker(tmp_path: Path) -> None:
    path = tmp_path / "AGENTS.md"
    path.write_text(f"mine\n{BEGIN_MARKER}\nstale text the user kept\n")
    upsert_managed_block(path, "fresh")
    text = path.read_text()
    assert "mine\n" in text and "stale text the user kept" in text and text.count(BEGIN_MARKER) == 1
    assert text.rstrip().endswith(END_MARKER) and "fresh" in text


def test_skills_projected_updated_and_removed(workspace) -> None:
    config = parse_config(
        ClaudeCodeConfig,
        {
            "skills": [
                {
                    "name": "greet",
                    "description": 'Greets: "politely"',
                    "body": "# Greet\nSay hi.",
                    "files": {"ref/a.md": "A"},
                },
                {"name": "gone", "description": "temporary"},
            ]
        },
    )
    assert project_skills(workspace, config.skills) == []
    for base in (".claude/skills", ".agents/skills"):
        skill_md = (workspace.working_dir / base / "greet" / "SKILL.md").read_text()
        assert skill_md.startswith('---\nname: greet\ndescription: "Greets: \\"politely\\""\n---\n')
        assert "Say hi." in skill_md
        assert (workspace.working_dir / base / "greet" / "ref" / "a.md").read_text() == "A"
    # A user's own skill next to ours is never touched.
    user_skill = workspace.working_dir / ".claude/skills/mine/SKILL.md"
    user_skill.parent.mkdir(parents=True)
    user_skill.write_text("user skill")
    config2 = parse_config(ClaudeCodeConfig, {"skills": [{"name": "greet", "description": "d2", "body": "v2"}]})
    project_skills(workspace, config2.skills)
    assert not (workspace.working_dir / ".claude/skills/gone").exists()
    assert not (workspace.working_dir / ".claude/skills/greet/ref").exists()
    assert "v2" in (workspace.working_dir / ".claude/skills/greet/SKILL.md").read_text()
    assert user_skill.read_text() == "user skill"
    # Binding a skill whose name a user already took: reported, user copy kept.
    config3 = parse_config(ClaudeCodeConfig, {"skills": [{"name": "mine", "description": "d"}]})
    warnings = project_skills(workspace, config3.skills)
    assert warnings and "mine" in warnings[0] and user_skill.read_text() == "user skill"


def test_mcp_config_holds_no_secrets(workspace, monkeypatch) -> None:
    path = write_claude_mcp_config(workspace, BridgeLaunch())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    server = json.loads(path.read_text())["mcpServers"]["agenthost"]
    assert server["args"] == ["-m", "agenthost.runners.external_harness.mcp_bridge"]
    assert server["env"]["AGENTHOST_RUN_TOKEN"] == "${AGENTHOST_RUN_TOKEN}"
    # Not the server's `alwaysLoad`, which makes Claude Code wait for the bridge before the rest of its start-up:
    # the bridge marks each tool (mcp_bridge.LISTED_TOOLS), so the CLI connects while it starts.
    assert "alwaysLoad" not in server
    overrides = codex_mcp_overrides(BridgeLaunch())
    assert any(o.startswith("mcp_servers.agenthost.env_vars=") and "AGENTHOST_RUN_TOKEN" in o for o in overrides)
    assert 'mcp_servers.agenthost.default_tools_approval_mode="approve"' in overrides
    assert not any(fake_secret in o for o in overrides for fake_secret in ("Bearer", "TOKEN="))


def test_http_bridge_config_names_the_token_never_holds_it(workspace) -> None:
    launch = HttpBridgeLaunch(url="http://127.0.0.1:4242/mcp")
    path = write_claude_mcp_config(workspace, launch)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    server = json.loads(path.read_text())["mcpServers"]["agenthost"]
    assert server == {
        "type": "http",
        "url": "http://127.0.0.1:4242/mcp",
        "headers": {"Authorization": "Bearer ${AGENTHOST_MCP_TOKEN}"},
    }
    overrides = codex_mcp_overrides(launch)
    assert 'mcp_servers.agenthost.url="http://127.0.0.1:4242/mcp"' in overrides
    assert 'mcp_servers.agenthost.bearer_token_env_var="AGENTHOST_MCP_TOKEN"' in overrides
    assert 'mcp_servers.agenthost.default_tools_approval_mode="approve"' in overrides
    assert not any(".command=" in o or ".env_vars=" in o for o in overrides)  # nothing to start


def test_unchanged_files_are_not_rewritten_changed_and_tampered_ones_are(tmp_path: Path) -> None:
    from agenthost.runners.external_harness.projection import write_if_changed

    path = tmp_path / "f.json"
    write_if_changed(path, "one", mode=0o600)
    before = path.stat()
    write_if_changed(path, "one", mode=0o600)
    assert path.stat().st_ino == before.st_ino  # nothing changed: no new file
    write_if_changed(path, "two", mode=0o600)
    assert path.read_text() == "two" and path.stat().st_ino != before.st_ino
    os.chmod(path, 0o644)  # same bytes, wrong mode: rewritten with the right one
    write_if_changed(path, "two", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # A symlink a harness planted in place of the file is replaced, never followed, even when its target matches.
    target = tmp_path / "elsewhere"
    target.write_text("two")
    os.chmod(target, 0o600)
    path.unlink()
    path.symlink_to(target)
    write_if_changed(path, "two", mode=0o600)
    assert not path.is_symlink() and path.read_text() == "two"
    write_if_changed(path, "three", mode=0o600)
    assert target.read_text() == "two"


def test_a_turn_that_changes_no_skill_leaves_the_skill_manifest_alone(workspace) -> None:
    config = parse_config(ClaudeCodeConfig, {"skills": [{"name": "runbook", "description": "d", "body": "# R"}]})
    project_skills(workspace, config.skills)
    manifest = workspace.agenthost_dir / "skills.json"
    inode = manifest.stat().st_ino
    project_skills(workspace, config.skills)
    assert manifest.stat().st_ino == inode
    project_skills(workspace, [])
    assert json.loads(manifest.read_text()) == {".agents/skills": {}, ".claude/skills": {}}


def test_the_config_dirs_start_up_files_are_the_bots_defaults_or_none(workspace, tmp_path) -> None:
    """What a model's command wrote into its home's config dir (Codex's config.toml can name commands to run) is
    gone before the next turn; the operator's defaults for the bot are copied in; a symlinked config dir is
    refused rather than followed."""
    from agenthost.runners.external_harness.errors import ProjectionError
    from agenthost.runners.external_harness.projection import project_home

    (workspace.codex_home / "config.toml").write_text('notify = ["sh", "-c", "planted"]\n')
    (workspace.codex_home / "AGENTS.md").write_text("planted")
    (workspace.codex_home / "sessions").mkdir()  # Codex's own: left alone
    project_home(workspace, "codex")
    assert sorted(p.name for p in workspace.codex_home.iterdir()) == ["sessions"]
    (workspace.defaults_dir / "codex").mkdir(parents=True)
    (workspace.defaults_dir / "codex" / "config.toml").write_text('model = "gpt-default"\n')
    (workspace.codex_home / "config.toml").write_text("planted = 1\n")
    project_home(workspace, "codex")
    assert (workspace.codex_home / "config.toml").read_text() == 'model = "gpt-default"\n'
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace.harness_dir / "claude").rename(tmp_path / "moved")
    (workspace.harness_dir / "claude").symlink_to(outside)
    with pytest.raises(ProjectionError, match="symlink"):
        project_home(workspace, "claude-code")
    assert list(outside.iterdir()) == []
