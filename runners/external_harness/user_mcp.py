"""A binding's own MCP servers (`mcp_servers`), registered with the harness beside the host bridge.

The harness starts and talks to them itself (stdio servers run inside the harness's sandbox, as its children), so
the runner only writes them into Claude Code's `--mcp-config` file and Codex's `-c mcp_servers.<name>.…`
overrides. Secrets stay out of both: a value with `${KEY}` references is resolved from the run's binding keys
into an environment variable of the harness, and the config names that variable (Claude Code expands `${VAR}`;
Codex forwards `env_vars` by name and reads `env_http_headers` from its environment).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agenthost.runners.sdk.mcp_servers import REFERENCE, McpServer

# Harness environment variables that carry resolved header values (and, for Claude Code, env values).
SECRET_ENV_PREFIX = "AGENTHOST_MCP_SECRET_"


@dataclass(frozen=True)
class UserMcp:
    """One turn's user servers: what each harness's config says, and the environment that config refers to."""

    servers: tuple[McpServer, ...]
    claude: dict[str, dict[str, Any]] = field(default_factory=dict)  # mcpServers entries
    codex: tuple[str, ...] = ()  # `-c` overrides
    claude_env: dict[str, str] = field(default_factory=dict)
    codex_env: dict[str, str] = field(default_factory=dict)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Resolved values, to scrub from what users see."""
        return tuple(v for v in {*self.claude_env.values(), *self.codex_env.values()} if v)

    def claude_allowed(self) -> list[str]:
        """--allowedTools rules: a configured server's tools run without a prompt (nobody answers one under -p);
        with a `tools` list, only those."""
        rules: list[str] = []
        for s in self.servers:
            rules += [f"mcp__{s.name}"] if s.tools is None else [f"mcp__{s.name}__{t}" for t in s.tools]
        return rules


def plan(servers: list[McpServer], secrets: dict[str, str]) -> UserMcp:
    """Resolves the references (McpServerError naming a key the binding lacks) and builds both harnesses' configs."""
    claude: dict[str, dict[str, Any]] = {}
    codex: list[str] = []
    claude_env: dict[str, str] = {}
    codex_env: dict[str, str] = {}

    def secret_var(value: str) -> str:
        name = f"{SECRET_ENV_PREFIX}{len(claude_env)}"
        claude_env[name] = value
        return name

    for s in servers:
        prefix = f"mcp_servers.{s.name}"
        if s.transport == "stdio":
            env = s.resolved_env(secrets)
            literal = {k: v for k, v in s.env.items() if not REFERENCE.search(v)}
            referenced = sorted(k for k in s.env if k not in literal)
            claude[s.name] = {
                "type": "stdio",
                "command": s.command,
                "args": list(s.args),
                "env": {k: (v if k in literal else "${" + secret_var(env[k]) + "}") for k, v in s.env.items()},
            }
            codex += [f"{prefix}.command={json.dumps(s.command)}", f"{prefix}.args={json.dumps(list(s.args))}"]
            if literal:
                codex.append(f"{prefix}.env={_inline_table(literal)}")
            if referenced:
                # Codex forwards these by name from its own environment into the server's.
                codex.append(f"{prefix}.env_vars={json.dumps(referenced)}")
                codex_env.update({k: env[k] for k in referenced})
        else:
            headers = s.resolved_headers(secrets)
            literal = {k: v for k, v in s.headers.items() if not REFERENCE.search(v)}
            claude[s.name] = {
                "type": "http",
                "url": s.url,
                "headers": {
                    k: (v if k in literal else "${" + secret_var(headers[k]) + "}") for k, v in s.headers.items()
                },
            }
            codex.append(f"{prefix}.url={json.dumps(s.url)}")
            if literal:
                codex.append(f"{prefix}.http_headers={_inline_table(literal)}")
            from_env = {k: f"{SECRET_ENV_PREFIX}H{i}" for i, k in enumerate(sorted(set(s.headers) - set(literal)))}
            if from_env:
                codex.append(f"{prefix}.env_http_headers={_inline_table(from_env)}")
                codex_env.update({var: headers[k] for k, var in from_env.items()})
        # required: exec waits for the server before its first model request (else a server slower to start than
        # the harness, such as one importing the Python SDK, is silently missing) and fails the turn naming it.
        codex += [
            f"{prefix}.startup_timeout_sec=30",
            f"{prefix}.tool_timeout_sec={s.timeout_s:g}",
            f"{prefix}.required=true",
        ]
        if s.tools is not None:
            codex.append(f"{prefix}.enabled_tools={json.dumps(list(s.tools))}")
        # exec has nobody to answer an approval prompt; the binding's author chose these servers.
        codex.append(f'{prefix}.default_tools_approval_mode="approve"')
    return UserMcp(tuple(servers), claude, tuple(codex), claude_env, codex_env)


def _inline_table(values: dict[str, str]) -> str:
    # JSON strings are valid TOML basic strings; keys are quoted the same way.
    return "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items()) + "}"
