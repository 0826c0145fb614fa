"""Binding config of the harness runners. Its JSON Schema is the manifest's `config_schema`.

Secrets never live in a binding (bindings are stored and listed by the host): a binding names the runner
process's environment variables that hold them (`api_key_env`, `pass_env`), and only those are forwarded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agenthost.plugins.binding_paths import path_setting
from agenthost.plugins.manifest import validation_problems
from agenthost.runners.external_harness.errors import HarnessConfigError
from agenthost.runners.sdk.approvals import ApprovalsConfig
from agenthost.runners.sdk.egress import check_domain_pattern
from agenthost.runners.sdk.mcp_servers import REFERENCE, McpServer, check_unique
from agenthost.runners.sdk.skills import MAX_SKILLS, Skill, unique_names
from agenthost.runners.sdk.workspace_budget import DEFAULT_MIB

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Names the runner sets itself; a binding overriding them would break isolation or session resume.
RESERVED_ENV = frozenset(
    {"HOME", "TMPDIR", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "PWD"}
    | {
        f"AGENTHOST_{k}"
        for k in (
            "RUN_ID",
            "HOST_ADDRESS",
            "RUN_TOKEN",
            "PLUGIN_SECRET",
            "DEADLINE_AT",
            "EVENT_ID",
            "MCP_TOKEN",
            "APIS",
        )
    }
)
# The host bridge's MCP server name (mcp_bridge.SERVER_NAME; a test keeps them equal): no user server may take it.
BRIDGE_SERVER_NAME = "agenthost"


@dataclass(frozen=True)
class CommandWalls:
    """What a binding lets the commands a model runs do, for agenthost's sandbox around the harness to enforce
    (sandboxing.harness_sandbox)."""

    workdir_writable: bool = True
    # Whether the model's commands may reach the network. Not enforced yet: the harness and its commands share one
    # network namespace, which the harness needs for its model API. The egress proxy is what will tell them apart.
    network: bool = True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_HTTP_AND_STDIO = (
    "'http': an endpoint the runner serves on loopback for the harness process only, behind its own bearer token "
    "(no process to start, so no start-up cost per message). 'stdio': a bridge process the harness starts every "
    "turn, holding the run's tool token."
)


class NetworkConfig(_Strict):
    """Where the harness's sandbox may connect (runners/sdk/egress.py). Always: the model endpoint (base_url, else
    the provider's API host) and the binding's own http MCP servers."""

    allowed_domains: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="More hosts the harness and its commands may reach through the runner's egress proxy: "
        "`example.com`, `*.example.com` (its subdomains), either with `:port` (else ports 80 and 443). Public "
        "addresses only: loopback, private and link-local addresses are refused unless they are the model endpoint.",
    )

    @field_validator("allowed_domains")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        return [check_domain_pattern(p) for p in patterns]


class HarnessConfig(_Strict):
    """Settings shared by both harnesses."""

    command: str | None = Field(
        default=None,
        description="Path of the harness executable. Default: $AGENTHOST_CLAUDE_BIN / $AGENTHOST_CODEX_BIN, "
        "the repo-local .tools/npm install, then PATH. An absolute path is checked at bind time and shown read-only "
        "to the runner's sandbox (a harness installed with its dependencies elsewhere also needs them in "
        "AGENTHOST_SANDBOX_RO).",
        json_schema_extra=path_setting("exec"),
    )
    model: str | None = Field(default=None, description="Model name passed to the harness.")
    base_url: str | None = Field(
        default=None,
        description="API base URL (a gateway, a proxy, a local fake), with or without the trailing /v1: each "
        "harness gets the form it needs (Claude Code without /v1, Codex with it).",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the API key: a key the host stores and the binding names (`agenthost keys set NAME`, "
        "`bots bind --key NAME`), else the runner process's environment variable. Default: ANTHROPIC_API_KEY for "
        "Claude Code, OPENAI_API_KEY for Codex.",
    )
    pass_env: list[str] = Field(
        default_factory=list, description="More runner-process environment variables to forward (by name)."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Literal environment for the harness (non-secret flags, proxies)."
    )
    workspace_root: str | None = Field(
        default=None,
        description="Absolute host directory holding the per-conversation working directories; it must exist, "
        "outside agenthost's data dir, and hold no credentials. The host shows it read-write to the runner's sandbox. "
        "Default: <data dir>/workspaces.",
        json_schema_extra=path_setting("rw"),
    )
    instructions: str = Field(default="", max_length=32 * 1024, description="Bot instructions for CLAUDE.md/AGENTS.md.")
    skills: list[Skill] = Field(default_factory=list, max_length=MAX_SKILLS)
    streaming: bool = Field(default=False, description="Stream token deltas where the harness can.")
    mcp_bridge: bool = Field(default=True, description="Offer the run's history/events/artifacts/state as MCP tools.")
    mcp_transport: Literal["http", "stdio"] = Field(
        default="http", description=f"How the harness reaches those tools. {_HTTP_AND_STDIO}"
    )
    mcp_servers: list[McpServer] = Field(
        default_factory=list,
        description="The binding's own MCP servers, registered with the harness beside the host bridge (the "
        "harness starts stdio ones inside its sandbox). ${KEY} in env and headers refers to the binding's keys.",
    )
    resume: bool = Field(default=True, description="Continue the conversation's harness session across messages.")
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="Cap on one turn, on top of the run's deadline."
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=20,
        description="How often the harness retries a failed model request (Claude Code: CLAUDE_CODE_MAX_RETRIES, "
        "whose own default of 10 spends minutes retrying a rejected key; Codex: the provider's request and stream "
        "retries, when base_url configures one). A binding `env` entry of the same variable wins.",
    )
    interrupt_grace_seconds: float = Field(
        default=3.0, ge=0, le=60, description="After an interrupt, how long the harness may wind down before SIGKILL."
    )
    workspace_max_mib: int = Field(
        default=DEFAULT_MIB,
        ge=1,
        le=1_048_576,
        description="Size budget of each conversation's working directory and harness home (with its TMPDIR) "
        "together, in MiB. A message is refused while they are over it, and the harness stopped when its turn "
        "passes it (measured every 0.5 s).",
    )
    network: NetworkConfig = Field(
        default_factory=NetworkConfig,
        description="The sandbox's network: a namespace of its own whose only way out is the runner's egress proxy, "
        "to the model endpoint and `allowed_domains`. Never the host's loopback.",
    )
    process_sandbox: bool = Field(
        default=True,
        description="Run the harness and everything it starts in a bubblewrap sandbox (own pid namespace; sees only "
        "this conversation's working directory, its own harness home, its own install and, for the stdio "
        "bridge, the run API socket). "
        "false runs it without walls (logged as a warning); only for machines where bubblewrap cannot work.",
    )

    def command_walls(self) -> CommandWalls:
        return CommandWalls()

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENV_NAME.match(name) or name in RESERVED_ENV:
                raise ValueError(f"{name!r} is not a forwardable environment variable name")
        return names

    @field_validator("api_key_env")
    @classmethod
    def _key_name(cls, name: str | None) -> str | None:
        if name is not None and not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        return name

    @field_validator("env")
    @classmethod
    def _env_literals(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.match(name) or name in RESERVED_ENV:
                raise ValueError(f"{name!r} cannot be set by a binding")
            if "\0" in value:
                raise ValueError(f"env {name} contains a NUL byte")
        return env

    @field_validator("mcp_servers")
    @classmethod
    def _servers(cls, servers: list[McpServer]) -> list[McpServer]:
        check_unique(servers, reserved=(BRIDGE_SERVER_NAME,))
        referenced: dict[str, tuple[str, str]] = {}
        for s in servers:
            if s.network or s.ro_paths or s.cwd is not None:
                raise ValueError(
                    f"MCP server {s.name!r}: network, ro_paths and cwd are local-agent settings; a harness starts its "
                    "servers itself, inside its own sandbox and working directory"
                )
            for name, value in s.env.items():
                if not REFERENCE.search(value):
                    continue
                # Codex forwards referenced variables by name from its own environment: they must be settable
                # there and mean one thing.
                if name in RESERVED_ENV or name.startswith("AGENTHOST_"):
                    raise ValueError(f"MCP server {s.name!r}: env {name} with a ${{KEY}} reference is reserved")
                other = referenced.setdefault(name, (s.name, value))
                if other[1] != value:
                    raise ValueError(
                        f"MCP servers {other[0]!r} and {s.name!r} set env {name} to different ${{KEY}} values; "
                        "the harness passes it by name, so it must be the same"
                    )
        return servers

    @field_validator("skills")
    @classmethod
    def _unique_skills(cls, skills: list[Skill]) -> list[Skill]:
        return unique_names(skills)


ClaudePermissionMode = Literal["default", "acceptEdits", "plan", "dontAsk", "auto", "bypassPermissions"]


class ClaudeCodeConfig(HarnessConfig):
    mcp_transport: Literal["sdk", "http", "stdio"] = Field(  # type: ignore[assignment]
        default="sdk",
        description="How Claude Code reaches the host tools. 'sdk': the runner answers MCP over Claude Code's own "
        "stdin and stdout (the control protocol of its Agent SDK): nothing listens, and the harness holds no token. "
        + _HTTP_AND_STDIO,
    )
    permission_mode: ClaudePermissionMode = Field(
        default="default",
        description="--permission-mode. 'default' under -p denies anything that would need an approval prompt.",
    )
    allowed_tools: list[str] = Field(
        default_factory=list, description="--allowedTools rules. The host bridge's tools are always allowed."
    )
    disallowed_tools: list[str] = Field(default_factory=list, description="--disallowedTools rules.")
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_budget_usd: float | None = Field(
        default=None, gt=0, description="--max-budget-usd, per message (a binding with one is never kept warm)."
    )
    keep_warm_seconds: float = Field(
        default=300,
        ge=0,
        le=86_400,
        description="Keep the conversation's Claude Code process this long after a message, so the next message of "
        "the conversation skips the CLI's start-up (about 0.5 s). 0: a new process for every message.",
    )
    spare_process: bool = Field(
        default=True,
        description="With keep_warm_seconds > 0: after a message, start one Claude Code process ahead for this "
        "binding's next new conversation, so its first message skips the CLI's start-up too. It holds about 110 MiB "
        "while it waits, at most keep_warm_seconds.",
    )
    append_system_prompt: str = Field(default="", max_length=64 * 1024)
    setting_sources: list[Literal["user", "project", "local"]] | None = Field(
        default=None, description="--setting-sources; must include 'project' for CLAUDE.md and skills."
    )
    approvals: ApprovalsConfig = Field(
        default_factory=ApprovalsConfig,
        description="Tool calls Claude Code would refuse (not allowed by allowed_tools or the permission mode) that "
        "match these rules are put to a person instead (--permission-prompt-tool through the host bridge); the "
        "rest stay refused. `commands` apply to Bash. Tools in allowed_tools never ask.",
    )

    @model_validator(mode="after")
    def _approvals_need_prompts(self) -> ClaudeCodeConfig:
        if self.approvals.enabled:
            if self.permission_mode in ("bypassPermissions", "dontAsk"):
                raise ValueError(
                    f"approvals: permission_mode {self.permission_mode!r} never asks, so nothing would reach a person;"
                    " use 'default' or 'acceptEdits'"
                )
            if not self.mcp_bridge:
                raise ValueError("approvals: the approval prompt goes through the host MCP bridge; set mcp_bridge")
        return self

    @field_validator("allowed_tools", "disallowed_tools")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        for rule in rules:
            if not rule or rule.startswith("-") or "\0" in rule or "\n" in rule:
                raise ValueError(f"{rule!r} is not a permission rule")
        return rules


CodexSandbox = Literal["read-only", "workspace-write", "danger-full-access"]


# Codex's own sandbox settings, which the runner derives from `sandbox` and `network_access` (codex.py).
_CODEX_SANDBOX_KEYS = frozenset({"sandbox_mode", "sandbox_workspace_write", "default_permissions", "permissions"})


class CodexConfig(HarnessConfig):
    sandbox: CodexSandbox = Field(
        default="read-only",
        description="What the model's commands may write: 'read-only' (the working directory is mounted read-only; "
        "the harness home and /tmp stay writable), 'workspace-write' and 'danger-full-access' (the working directory "
        "is writable; never more than agenthost's sandbox shows). agenthost's sandbox enforces it, with Codex's own "
        "sandbox off inside it (Codex's bubblewrap cannot start nested); with process_sandbox: false, Codex's own "
        "sandbox does.",
    )
    network_access: bool = Field(
        default=False,
        description="Network for commands in the workspace-write sandbox. Enforced only by Codex's own sandbox "
        "(process_sandbox: false); inside agenthost's sandbox, commands share the harness's network.",
    )
    wire_api: Literal["responses"] = "responses"
    spare_process: bool = Field(
        default=True,
        description="After a message, start one `codex exec` ahead for this binding's next new conversation, in a "
        "fresh directory and Codex home of its own, waiting for its prompt: Codex's start-up in a new home "
        "(creating and migrating its state databases, about 0.3-0.5 s) is then done before the message arrives. "
        "Needs process_sandbox. It holds about 60 MiB resident (10 MiB of its own) while it waits, at most "
        "spare_seconds.",
    )
    spare_seconds: float = Field(
        default=300, ge=0, le=86_400, description="How long a spare Codex process waits unclaimed. 0: no spare."
    )
    config_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Extra `-c key=value` overrides (values are TOML-encoded)."
    )

    @field_validator("config_overrides")
    @classmethod
    def _override_keys(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        for key in overrides:
            if not re.match(r"^[A-Za-z0-9_.-]+$", key) or key.split(".")[0] in {"mcp_servers", "model_providers"}:
                raise ValueError(f"override {key!r} is not allowed (the runner owns mcp_servers and model_providers)")
            if key.split(".")[0] in _CODEX_SANDBOX_KEYS:
                raise ValueError(
                    f"override {key!r} is not allowed: set `sandbox` (and `network_access`) in the binding; "
                    "agenthost's sandbox enforces it"
                )
        return overrides

    def command_walls(self) -> CommandWalls:
        return CommandWalls(
            workdir_writable=self.sandbox != "read-only",
            network=self.sandbox == "danger-full-access" or (self.sandbox == "workspace-write" and self.network_access),
        )


C = TypeVar("C", bound=HarnessConfig)


def parse_config(model: type[C], raw: dict[str, Any]) -> C:
    """Validates a binding config; raises HarnessConfigError naming each bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise HarnessConfigError(f"invalid {model.__name__} binding config: {validation_problems(exc)}") from None


def config_schema(model: type[HarnessConfig]) -> dict[str, Any]:
    return model.model_json_schema()
