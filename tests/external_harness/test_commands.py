"""Command lines and environments the drivers build (no process)."""

from __future__ import annotations

from pathlib import Path

from agenthost.runners.external_harness.claude_code import ClaudeCodeDriver
from agenthost.runners.external_harness.codex import CodexDriver
from agenthost.runners.external_harness.config import ClaudeCodeConfig, CodexConfig, parse_config
from agenthost.runners.external_harness.projection import BridgeLaunch
from agenthost.runners.external_harness.turn import TurnPlan
from agenthost.runners.external_harness.workspace import WorkspaceManager

CREDS = {
    "AGENTHOST_HOST_ADDRESS": "unix:/run/api.sock",
    "AGENTHOST_RUN_ID": "run-1",
    "AGENTHOST_RUN_TOKEN": "tok-secret-123456",
}
HOST_ENV = {"PATH": "/bin", "ANTHROPIC_API_KEY": "sk-ant-123456", "OPENAI_API_KEY": "sk-oai-123456", "AWS_KEY": "x"}


def _plan(tmp_path: Path, config, *, resume=None, new=None, bridge=True) -> TurnPlan:
    return TurnPlan(
        binary="/opt/harness",
        config=config,
        workspace=WorkspaceManager(tmp_path).workspace("bot", "conv"),
        resume_session_id=resume,
        new_session_id=new,
        bridge=BridgeLaunch() if bridge else None,
        bridge_env=CREDS if bridge else {},
        inherited_env=HOST_ENV,
    )


def test_claude_first_turn_and_resume(tmp_path: Path) -> None:
    config = parse_config(
        ClaudeCodeConfig,
        {
            "allowed_tools": ["Read"],
            "disallowed_tools": ["WebFetch"],
            "model": "sonnet",
            "streaming": True,
            "max_turns": 5,
            "base_url": "http://127.0.0.1:9",
        },
    )
    first = ClaudeCodeDriver().command(_plan(tmp_path, config, new="uuid-1"))
    argv = first.argv
    assert argv[:5] == ["/opt/harness", "-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--session-id") + 1] == "uuid-1" and "--resume" not in argv
    assert "--include-partial-messages" in argv and "--strict-mcp-config" in argv
    assert argv[argv.index("--allowedTools") + 1] == "Read,mcp__agenthost"
    assert argv[argv.index("--disallowedTools") + 1] == "WebFetch"
    assert argv[argv.index("--permission-mode") + 1] == "default"
    assert argv[argv.index("--max-turns") + 1] == "5" and argv[argv.index("--model") + 1] == "sonnet"
    env = first.env
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-123456" and "OPENAI_API_KEY" not in env and "AWS_KEY" not in env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9" and env["CLAUDE_CONFIG_DIR"].endswith("/claude")
    assert env["AGENTHOST_RUN_TOKEN"] == "tok-secret-123456"
    assert not any(secret in " ".join(argv) for secret in ("sk-ant-123456", "tok-secret-123456"))
    assert set(first.secrets) == {"sk-ant-123456", "tok-secret-123456"}
    resumed = ClaudeCodeDriver().command(_plan(tmp_path, config, resume="uuid-1"))
    assert resumed.argv[resumed.argv.index("--resume") + 1] == "uuid-1" and "--session-id" not in resumed.argv


def test_claude_without_bridge_still_ignores_foreign_mcp_configs(tmp_path: Path) -> None:
    cmd = ClaudeCodeDriver().command(_plan(tmp_path, parse_config(ClaudeCodeConfig, {}), new="u", bridge=False))
    assert "--strict-mcp-config" in cmd.argv and "--mcp-config" not in cmd.argv
    assert "--allowedTools" not in cmd.argv and not any(k.startswith("AGENTHOST_") for k in cmd.env)


def test_codex_first_turn_and_resume(tmp_path: Path) -> None:
    config = parse_config(
        CodexConfig, {"base_url": "http://127.0.0.1:9/v1", "model": "gpt-x", "sandbox": "workspace-write"}
    )
    first = CodexDriver().command(_plan(tmp_path, config))
    argv = first.argv
    assert argv[:4] == ["/opt/harness", "exec", "--json", "--skip-git-repo-check"] and argv[-1] == "-"
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    # agenthost's sandbox enforces `sandbox` (sandboxing.harness_sandbox); Codex's own cannot start nested in it.
    assert 'approval_policy="never"' in overrides and 'sandbox_mode="danger-full-access"' in overrides
    assert not any(o.startswith("sandbox_workspace_write") for o in overrides)
    assert 'model_provider="agenthost"' in overrides
    assert 'model_providers.agenthost.base_url="http://127.0.0.1:9/v1"' in overrides
    assert 'model_providers.agenthost.env_key="OPENAI_API_KEY"' in overrides
    assert any(o.startswith("mcp_servers.agenthost.command=") for o in overrides)
    assert "resume" not in argv
    assert first.env["CODEX_HOME"].endswith("/codex") and first.env["OPENAI_API_KEY"] == "sk-oai-123456"
    assert "ANTHROPIC_API_KEY" not in first.env
    assert not any(secret in " ".join(argv) for secret in ("sk-oai-123456", "tok-secret-123456"))
    resumed = CodexDriver().command(_plan(tmp_path, config, resume="thread-9")).argv
    assert resumed[-3:] == ["resume", "thread-9", "-"]  # exec flags first, then the subcommand


def test_base_url_takes_the_form_each_harness_needs(tmp_path: Path) -> None:
    for written in ("http://gw.local:9/anthropic", "http://gw.local:9/anthropic/", "http://gw.local:9/anthropic/v1/"):
        cmd = ClaudeCodeDriver().command(_plan(tmp_path, parse_config(ClaudeCodeConfig, {"base_url": written})))
        assert cmd.env["ANTHROPIC_BASE_URL"] == "http://gw.local:9/anthropic"  # Claude Code appends /v1/messages
    for written in ("http://gw.local:9", "http://gw.local:9/", "http://gw.local:9/v1", "http://gw.local:9/v1/"):
        argv = CodexDriver().command(_plan(tmp_path, parse_config(CodexConfig, {"base_url": written}))).argv
        assert 'model_providers.agenthost.base_url="http://gw.local:9/v1"' in argv  # Codex appends /responses


def test_retry_and_tool_search_defaults(tmp_path: Path) -> None:
    claude = ClaudeCodeDriver().command(_plan(tmp_path, parse_config(ClaudeCodeConfig, {})))
    assert claude.env["CLAUDE_CODE_MAX_RETRIES"] == "2"  # not Claude Code's 10, which takes minutes on a bad key
    # Tool search stays Claude Code's default: the bridge marks its tools `anthropic/alwaysLoad` instead
    # (test_mcp_bridge.py).
    assert "ENABLE_TOOL_SEARCH" not in claude.env
    chosen = parse_config(ClaudeCodeConfig, {"max_retries": 5, "env": {"ENABLE_TOOL_SEARCH": "true"}})
    env = ClaudeCodeDriver().command(_plan(tmp_path, chosen)).env
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "5" and env["ENABLE_TOOL_SEARCH"] == "true"  # the binding wins
    argv = CodexDriver().command(_plan(tmp_path, parse_config(CodexConfig, {"base_url": "http://x", "max_retries": 0})))
    assert "model_providers.agenthost.request_max_retries=0" in argv.argv
    assert "model_providers.agenthost.stream_max_retries=0" in argv.argv


def test_codex_usage_names_the_model(tmp_path: Path) -> None:
    driver = CodexDriver()
    ws = WorkspaceManager(tmp_path).workspace("bot", "conv")
    assert driver.configured_model(parse_config(CodexConfig, {"model": "gpt-x"}), ws) == "gpt-x"
    assert driver.configured_model(parse_config(CodexConfig, {"config_overrides": {"model": "gpt-o"}}), ws) == "gpt-o"
    assert driver.configured_model(parse_config(CodexConfig, {}), ws) == ""
    # The conversation's own config.toml is the harness's to write; only the bot's default is the operator's word.
    (ws.codex_home / "config.toml").write_text('model = "gpt-planted"\n')
    assert driver.configured_model(parse_config(CodexConfig, {}), ws) == ""
    (ws.defaults_dir / "codex").mkdir(parents=True)
    (ws.defaults_dir / "codex" / "config.toml").write_text('model = "gpt-from-toml"\n')
    assert driver.configured_model(parse_config(CodexConfig, {}), ws) == "gpt-from-toml"
    from agenthost.runners.external_harness.turn import TurnState

    turn = TurnState(model="gpt-x")
    driver.map_event({"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 2}}, turn)
    assert turn.usage is not None and turn.usage.usage.model == "gpt-x"


def test_http_bridge_env_and_proxy_bypass(tmp_path: Path) -> None:
    """With the HTTP bridge the harness gets only the endpoint's token; a configured proxy is told to leave the
    loopback endpoint alone, or the harness would hand the proxy that token."""
    from dataclasses import replace

    from agenthost.runners.external_harness.projection import HttpBridgeLaunch

    token = {"AGENTHOST_MCP_TOKEN": "mcp-turn-token-123456"}
    proxied = HOST_ENV | {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "internal.example"}
    for driver, model in ((ClaudeCodeDriver(), ClaudeCodeConfig), (CodexDriver(), CodexConfig)):
        plan = replace(
            _plan(tmp_path, parse_config(model, {})),
            bridge=HttpBridgeLaunch(url="http://127.0.0.1:4242/mcp"),
            bridge_env=token,
            inherited_env=proxied,
        )
        cmd = driver.command(plan)
        assert cmd.env["AGENTHOST_MCP_TOKEN"] == "mcp-turn-token-123456"
        assert "AGENTHOST_RUN_TOKEN" not in cmd.env and "AGENTHOST_HOST_ADDRESS" not in cmd.env
        assert "mcp-turn-token-123456" in cmd.secrets and "mcp-turn-token-123456" not in " ".join(cmd.argv)
        for name in ("NO_PROXY", "no_proxy"):
            entries = cmd.env[name].split(",")
            assert "127.0.0.1" in entries and "localhost" in entries
        assert cmd.env["NO_PROXY"].startswith("internal.example")
        # Without a proxy nothing is added.
        plain = driver.command(replace(plan, inherited_env=HOST_ENV))
        assert "NO_PROXY" not in plain.env and "no_proxy" not in plain.env


def test_codex_sandbox_is_enforced_by_one_wall(tmp_path: Path) -> None:
    """Inside agenthost's sandbox Codex's own is off and agenthost's walls carry the binding's `sandbox`; without
    agenthost's sandbox Codex's own gets it. Never an approval prompt either way, and no override can put Codex's
    own sandbox back under agenthost's."""
    import pytest

    from agenthost.runners.external_harness.errors import HarnessConfigError

    def overrides(raw: dict) -> list[str]:
        argv = CodexDriver().command(_plan(tmp_path, parse_config(CodexConfig, raw))).argv
        return [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]

    for mode in ("read-only", "workspace-write", "danger-full-access"):
        walled = overrides({"sandbox": mode})
        assert 'sandbox_mode="danger-full-access"' in walled and 'approval_policy="never"' in walled
        bare = overrides({"sandbox": mode, "process_sandbox": False})
        assert f"sandbox_mode={mode!r}".replace("'", '"') in bare and 'approval_policy="never"' in bare
    assert "sandbox_workspace_write.network_access=true" in overrides(
        {"sandbox": "workspace-write", "network_access": True, "process_sandbox": False}
    )
    assert not parse_config(CodexConfig, {}).command_walls().workdir_writable  # the default: read-only
    assert parse_config(CodexConfig, {"sandbox": "workspace-write"}).command_walls().workdir_writable
    assert ClaudeCodeConfig().command_walls().workdir_writable
    for key in ("sandbox_mode", "sandbox_workspace_write.writable_roots", "default_permissions"):
        with pytest.raises(HarnessConfigError, match="set `sandbox`"):
            parse_config(CodexConfig, {"config_overrides": {key: "x"}})
