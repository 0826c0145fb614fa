from __future__ import annotations

import os
import stat
from pathlib import Path

import pluggy
import pytest

from agenthost.plugins.hookspecs import PROJECT
from agenthost.plugins.manifest import RunnerManifest
from agenthost.runners.external_harness import plugin
from agenthost.runners.external_harness.config import ClaudeCodeConfig, CodexConfig, parse_config
from agenthost.runners.external_harness.errors import HarnessConfigError
from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner
from agenthost.runners.external_harness.workspace import WorkspaceManager, path_key


def test_plugin_registers_both_runners_with_valid_manifests() -> None:
    pm = pluggy.PluginManager(PROJECT)
    from agenthost.plugins import hookspecs

    pm.add_hookspecs(hookspecs)
    pm.register(plugin)
    registered: list[type] = []
    pm.hook.agenthost_register_runners(register=registered.append)
    assert registered == [ClaudeCodeRunner, CodexRunner]
    for cls in registered:
        manifest = RunnerManifest.parse_json(cls.manifest.model_dump_json())
        assert manifest.config_schema["type"] == "object"
        manifest.validate_config({"model": "x", "skills": [{"name": "a", "description": "b"}]})


@pytest.mark.parametrize(
    ("model", "raw", "where"),
    [
        (ClaudeCodeConfig, {"permission_mode": "yolo"}, "permission_mode"),
        (ClaudeCodeConfig, {"env": {"HOME": "/"}}, "env"),
        (ClaudeCodeConfig, {"pass_env": ["AGENTHOST_RUN_TOKEN"]}, "pass_env"),
        (ClaudeCodeConfig, {"skills": [{"name": "../x", "description": "d"}]}, "skills.0.name"),
        (ClaudeCodeConfig, {"skills": [{"name": "a", "description": "d", "files": {"../e": ""}}]}, "skills.0.files"),
        (ClaudeCodeConfig, {"skills": [{"name": "a", "description": "line\nbreak"}]}, "skills.0.description"),
        (ClaudeCodeConfig, {"allowed_tools": ["--dangerously-skip-permissions"]}, "allowed_tools"),
        (ClaudeCodeConfig, {"unknown": 1}, "unknown"),
        (CodexConfig, {"sandbox": "none"}, "sandbox"),
        (CodexConfig, {"config_overrides": {"mcp_servers.x.command": "sh"}}, "config_overrides"),
    ],
)
def test_bad_config_is_a_typed_error_naming_the_field(model, raw, where) -> None:
    with pytest.raises(HarnessConfigError) as err:
        parse_config(model, raw)
    assert where in err.value.message
    assert err.value.code == "harness_config"


def test_safe_defaults() -> None:
    claude = parse_config(ClaudeCodeConfig, {})
    codex = parse_config(CodexConfig, {})
    assert claude.permission_mode == "default" and not claude.allowed_tools
    assert codex.sandbox == "read-only"


def test_workspace_is_stable_private_and_contained(tmp_path: Path) -> None:
    manager = WorkspaceManager(tmp_path)
    first = manager.workspace("bot/../../etc", "conv 1")
    again = manager.workspace("bot/../../etc", "conv 1")
    other = manager.workspace("bot/../../etc", "conv 2")
    assert first == again and first.working_dir != other.working_dir
    # A harness home per conversation (the sandbox shows it read-write), beside the bot's defaults (never shown).
    assert first.harness_dir != other.harness_dir and first.bot_dir == other.bot_dir
    assert not first.harness_dir.is_relative_to(first.working_dir)
    root = (tmp_path / "workspaces").resolve()
    assert first.working_dir.is_relative_to(root)
    assert stat.S_IMODE(os.stat(first.working_dir).st_mode) == 0o700
    assert first.claude_config_dir.is_dir() and first.codex_home.is_dir()


def test_path_keys_never_collide_or_escape() -> None:
    assert path_key("a/b") != path_key("a_b") != path_key("a-b")
    assert "/" not in path_key("../../x") and not path_key("..").startswith(".")
    with pytest.raises(HarnessConfigError):
        path_key("")


def test_workspace_root_must_be_absolute(tmp_path: Path) -> None:
    with pytest.raises(HarnessConfigError):
        WorkspaceManager(tmp_path).workspace("b", "c", workspace_root="relative/dir")
    ws = WorkspaceManager(tmp_path).workspace("b", "c", workspace_root=str(tmp_path / "elsewhere"))
    assert ws.working_dir.is_relative_to((tmp_path / "elsewhere").resolve())


def test_the_egress_allow_list_of_a_binding() -> None:
    """What a harness sandbox may reach: its model endpoint (base_url, a `*_BASE_URL` in env, else the provider's
    API host), its http MCP servers, and `network.allowed_domains`, whose entries are checked at bind time."""
    from agenthost.runners.external_harness.sandboxing import egress_policy

    default = egress_policy(parse_config(ClaudeCodeConfig, {}), "claude-code")
    assert default.endpoints == (("api.anthropic.com", 443),) and default.domains == ()
    assert egress_policy(parse_config(CodexConfig, {}), "codex").endpoints == (("api.openai.com", 443),)
    config = parse_config(
        ClaudeCodeConfig,
        {
            "base_url": "http://127.0.0.1:8080/v1",
            "env": {"OTHER_BASE_URL": "https://gw.internal:8443"},
            "mcp_servers": [{"name": "docs", "transport": "http", "url": "https://mcp.example.com/mcp"}],
            "network": {"allowed_domains": ["*.PyPI.org", "github.com:22"]},
        },
    )
    policy = egress_policy(config, "claude-code")
    assert set(policy.endpoints) == {("127.0.0.1", 8080), ("gw.internal", 8443), ("mcp.example.com", 443)}
    assert policy.domains == ("*.pypi.org", "github.com:22")
    with pytest.raises(HarnessConfigError, match="allowed_domains"):
        parse_config(ClaudeCodeConfig, {"network": {"allowed_domains": ["https://example.com"]}})
