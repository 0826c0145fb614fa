"""A binding's own MCP servers in the harness runners: registered beside the host bridge in Claude Code's
--mcp-config and Codex's -c overrides, secrets only in the harness's environment (no process)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agenthost.runners.external_harness import mcp_bridge
from agenthost.runners.external_harness.claude_code import ClaudeCodeDriver
from agenthost.runners.external_harness.codex import CodexDriver
from agenthost.runners.external_harness.config import (
    BRIDGE_SERVER_NAME,
    ClaudeCodeConfig,
    CodexConfig,
    HarnessConfigError,
    parse_config,
)
from agenthost.runners.external_harness.projection import BridgeLaunch, write_claude_mcp_config
from agenthost.runners.external_harness.turn import TurnPlan
from agenthost.runners.external_harness.user_mcp import UserMcp, plan
from agenthost.runners.external_harness.workspace import WorkspaceManager
from agenthost.runners.sdk.mcp_servers import McpServerError

SECRETS = {"GH_KEY": "ghp-secret-value-1", "REMOTE_TOKEN": "remote-secret-value-2"}
SERVERS: list[dict[str, Any]] = [
    {
        "name": "gh",
        "transport": "stdio",
        "command": "gh-mcp",
        "args": ["--stdio"],
        "env": {"GITHUB_TOKEN": "${GH_KEY}", "LOG_LEVEL": "debug"},
    },
    {
        "name": "remote",
        "transport": "http",
        "url": "https://mcp.example.test/mcp",
        "headers": {"Authorization": "Bearer ${REMOTE_TOKEN}", "X-Tenant": "acme"},
        "tools": ["search", "fetch"],
        "timeout_s": 45,
    },
]
HOST_ENV = {"PATH": "/bin", "ANTHROPIC_API_KEY": "sk-ant-123456", "OPENAI_API_KEY": "sk-oai-123456"}


def _plan(tmp_path: Path, config: Any, user: UserMcp | None, *, bridge: bool = True) -> TurnPlan:
    return TurnPlan(
        binary="/opt/harness",
        config=config,
        workspace=WorkspaceManager(tmp_path).workspace("bot", "conv"),
        resume_session_id=None,
        new_session_id="uuid-1",
        bridge=BridgeLaunch() if bridge else None,
        bridge_env={"AGENTHOST_RUN_TOKEN": "tok-secret-123456"} if bridge else {},
        inherited_env=HOST_ENV,
        user_mcp=user,
    )


def test_claude_gets_user_servers_beside_the_bridge(tmp_path: Path) -> None:
    config = parse_config(ClaudeCodeConfig, {"mcp_servers": SERVERS, "allowed_tools": ["Read"]})
    user = plan(list(config.mcp_servers), SECRETS)
    turn = _plan(tmp_path, config, user)
    command = ClaudeCodeDriver().command(turn)
    argv = command.argv
    assert argv[argv.index("--mcp-config") + 1].endswith(".agenthost/mcp.json") and "--strict-mcp-config" in argv
    assert (
        argv[argv.index("--allowedTools") + 1] == "Read,mcp__agenthost,mcp__gh,mcp__remote__search,mcp__remote__fetch"
    )

    path = write_claude_mcp_config(turn.workspace, turn.bridge, user.claude)
    raw = path.read_text()
    assert not any(secret in raw for secret in SECRETS.values()), "the file must not hold a secret"
    assert path.stat().st_mode & 0o777 == 0o600
    servers = json.loads(raw)["mcpServers"]
    assert sorted(servers) == ["agenthost", "gh", "remote"]
    gh, remote = servers["gh"], servers["remote"]
    assert (gh["type"], gh["command"], gh["args"], gh["env"]["LOG_LEVEL"]) == ("stdio", "gh-mcp", ["--stdio"], "debug")
    assert remote["type"] == "http" and remote["headers"]["X-Tenant"] == "acme"
    # Each reference names a variable of the harness's environment holding the resolved value.
    token_var = gh["env"]["GITHUB_TOKEN"].removeprefix("${").removesuffix("}")
    auth_var = remote["headers"]["Authorization"].removeprefix("${").removesuffix("}")
    assert command.env[token_var] == "ghp-secret-value-1"
    assert command.env[auth_var] == "Bearer remote-secret-value-2"
    assert not any(secret in " ".join(argv) for secret in SECRETS.values())
    assert {"ghp-secret-value-1", "Bearer remote-secret-value-2"} <= set(command.secrets)


def test_claude_user_servers_without_the_bridge(tmp_path: Path) -> None:
    config = parse_config(ClaudeCodeConfig, {"mcp_servers": SERVERS[:1], "mcp_bridge": False})
    user = plan(list(config.mcp_servers), SECRETS)
    turn = _plan(tmp_path, config, user, bridge=False)
    argv = ClaudeCodeDriver().command(turn).argv
    assert "--mcp-config" in argv and argv[argv.index("--allowedTools") + 1] == "mcp__gh"
    servers = json.loads(write_claude_mcp_config(turn.workspace, None, user.claude).read_text())["mcpServers"]
    assert sorted(servers) == ["gh"]


def test_codex_gets_user_servers_as_overrides(tmp_path: Path) -> None:
    config = parse_config(CodexConfig, {"mcp_servers": SERVERS})
    user = plan(list(config.mcp_servers), SECRETS)
    command = CodexDriver().command(_plan(tmp_path, config, user))
    overrides = [command.argv[i + 1] for i, a in enumerate(command.argv) if a == "-c"]
    doc: dict[str, Any] = {}
    for override in overrides:  # every override is one valid TOML key/value
        parsed = tomllib.loads(override.replace("=", " = ", 1))
        _merge(doc, parsed)
    servers = doc["mcp_servers"]
    assert sorted(servers) == ["agenthost", "gh", "remote"]
    gh, remote = servers["gh"], servers["remote"]
    assert gh["command"] == "gh-mcp" and gh["args"] == ["--stdio"] and gh["env"] == {"LOG_LEVEL": "debug"}
    assert gh["env_vars"] == ["GITHUB_TOKEN"] and command.env["GITHUB_TOKEN"] == "ghp-secret-value-1"
    assert remote["url"] == "https://mcp.example.test/mcp" and remote["http_headers"] == {"X-Tenant": "acme"}
    [(header, var)] = remote["env_http_headers"].items()
    assert header == "Authorization" and command.env[var] == "Bearer remote-secret-value-2"
    assert remote["enabled_tools"] == ["search", "fetch"] and remote["tool_timeout_sec"] == 45
    assert gh["required"] is remote["required"] is True
    assert gh["default_tools_approval_mode"] == remote["default_tools_approval_mode"] == "approve"
    assert not any(secret in " ".join(command.argv) for secret in SECRETS.values())
    assert {"ghp-secret-value-1", "Bearer remote-secret-value-2"} <= set(command.secrets)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def test_a_server_variable_may_not_replace_the_harness_key(tmp_path: Path) -> None:
    server = {**SERVERS[0], "env": {"OPENAI_API_KEY": "${GH_KEY}"}}
    config = parse_config(CodexConfig, {"mcp_servers": [server]})
    user = plan(list(config.mcp_servers), SECRETS)
    with pytest.raises(HarnessConfigError, match="would replace the harness's own OPENAI_API_KEY"):
        CodexDriver().command(_plan(tmp_path, config, user))


def test_missing_binding_key_is_named() -> None:
    config = parse_config(CodexConfig, {"mcp_servers": SERVERS})
    with pytest.raises(
        McpServerError, match=r"mcp_servers\[remote\].headers.Authorization refers to key 'REMOTE_TOKEN'"
    ):
        plan(list(config.mcp_servers), {"GH_KEY": "x"})


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ([{**SERVERS[0], "name": "agenthost"}], "reserved for the runner's own server"),
        ([SERVERS[0], SERVERS[0]], "duplicate MCP server names"),
        ([{**SERVERS[0], "network": True}], "local-agent settings"),
        ([{**SERVERS[0], "ro_paths": ["/opt/x"]}], "local-agent settings"),
        ([{**SERVERS[0], "env": {"HOME_TOKEN": "plain"}}], "looks like a credential"),
        ([{**SERVERS[0], "env": {"CODEX_HOME": "${GH_KEY}"}}], "reserved"),
        (
            [{**SERVERS[0], "env": {"T": "${A}"}}, {**SERVERS[0], "name": "gh2", "env": {"T": "${B}"}}],
            "different ${KEY} values",
        ),
        ([{**SERVERS[1], "headers": {"X-Api-Key": "literal"}}], "looks like a credential"),
    ],
)
def test_bad_configs_are_refused(servers: list[dict[str, Any]], expected: str) -> None:
    for model in (ClaudeCodeConfig, CodexConfig):
        with pytest.raises(HarnessConfigError) as err:
            parse_config(model, {"mcp_servers": servers})
        assert expected in str(err.value)


def test_bridge_name_constant_matches_the_bridge() -> None:
    assert BRIDGE_SERVER_NAME == mcp_bridge.SERVER_NAME


def test_runner_refuses_bad_servers_at_bind_time(tmp_path: Path) -> None:
    from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner

    for runner_class in (ClaudeCodeRunner, CodexRunner):
        runner = runner_class(tmp_path)
        assert runner.validate_config({"mcp_servers": SERVERS}) == []
        [problem] = runner.validate_config({"mcp_servers": [{**SERVERS[1], "name": "agenthost"}]})
        assert "reserved for the runner's own server" in problem


def test_claude_reports_a_user_server_that_did_not_connect() -> None:
    from agenthost.runners.external_harness.turn import TurnState

    init = {
        "type": "system",
        "subtype": "init",
        "session_id": "s",
        "mcp_servers": [
            {"name": "agenthost", "status": "connected"},
            {"name": "gh", "status": "failed"},
            {"name": "remote", "status": "connected"},
        ],
    }
    out = ClaudeCodeDriver().map_event(init, TurnState())
    assert [e.progress.message for e in out] == ["MCP server gh is failed; its tools are unavailable this turn"]
