"""The binding config of the local agent, validated once per run; its JSON Schema is the manifest's config_schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from agenthost.plugins.binding_paths import path_setting
from agenthost.plugins.manifest import validation_problems
from agenthost.runners.sdk.approvals import ApprovalsConfig
from agenthost.runners.sdk.egress import EgressPolicy, check_domain_pattern
from agenthost.runners.sdk.mcp_servers import McpServer, check_unique
from agenthost.runners.sdk.skills import MAX_SKILLS, Skill, unique_names
from agenthost.runners.sdk.workspace_budget import DEFAULT_MIB

__all__ = ["ApprovalsConfig", "ConfigError", "LocalAgentConfig"]


class ConfigError(ValueError):
    """The binding config (or the environment it points at) cannot drive a run; the message says what to fix."""


class ShellConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    max_output_chars: int = Field(default=30_000, ge=1_000, le=1_000_000)
    # Names of runner-process environment variables passed through to commands. Anything that looks like a
    # credential is refused even if listed, so a provider key cannot leak into a tool subprocess.
    env_passthrough: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Extra variables set for every command.")
    extra_blocklist: list[str] = Field(default_factory=list, description="Regexes of commands to refuse.")
    network: bool = Field(
        default=False,
        description="Let commands (and stdio MCP servers with `network: true`) reach the network through the "
        "runner's egress proxy (HTTPS_PROXY/HTTP_PROXY are set for them): the hosts of `allowed_domains`, or any "
        "public host on ports 80 and 443 when that list is empty. Never the host's loopback, private or "
        "link-local addresses, nor its abstract unix sockets: commands have a network namespace of their own. "
        "Off: only that namespace's own loopback, so nothing is reachable.",
    )
    allowed_domains: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="With `network`: the only hosts commands may reach: `example.com`, `*.example.com` (its "
        "subdomains), either with `:port` (else ports 80 and 443). Public addresses only. Empty: any public host.",
    )

    @field_validator("allowed_domains")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        return [check_domain_pattern(p) for p in patterns]

    def egress_policy(self) -> EgressPolicy:
        """What a networked command may reach (agenthost.runners.sdk.egress)."""
        domains = tuple(self.allowed_domains)
        return EgressPolicy(domains=domains, any_public=not domains, setting="shell.allowed_domains")

    sandbox: bool = Field(
        default=True,
        description="Run every command in a bubblewrap sandbox (workspace writable, system read-only, nothing "
        "else of the machine visible, nothing left running after the command). Setting false is DANGEROUS: "
        "commands then run as the runner, can read its data dir, other conversations' workspaces and whatever "
        "the runner's sandbox lets it see, and can leave processes behind; a warning is logged for every command. "
        "Only for machines where bubblewrap cannot run and every model prompt is trusted.",
    )


class MemoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    profile_max_chars: int = Field(default=1_500, ge=100, le=20_000)
    notes_max_chars: int = Field(default=2_500, ge=100, le=50_000)


def _check_route(value: str) -> str:
    if "/" not in value or value.startswith("/") or value.endswith("/"):
        raise ValueError("must be 'provider/model', e.g. 'openai/gpt-4o' or 'ollama/qwen3'")
    return value


class ModelRoute(BaseModel):
    """One model of a fallback chain with its own endpoint and key. Nothing is inherited from the primary model:
    a fallback is usually another provider, and borrowing the primary's base_url or key would send the
    fallback's requests (and a key) to the wrong server."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="provider/model, e.g. 'anthropic/claude-sonnet-4-5'.")
    base_url: str | None = Field(default=None, description="Overrides the provider's default endpoint.")
    api_key_env: str | None = Field(default=None, description="Name of the binding's stored key.")
    api_key: SecretStr | None = Field(default=None, description="Inline key; prefer api_key_env.")
    context_window: int | None = Field(default=None, ge=1_024, le=10_000_000, description="Tokens; else probed.")

    @field_validator("model")
    @classmethod
    def _routed(cls, value: str) -> str:
        return _check_route(value)


# A chain entry: "provider/model" (provider defaults for endpoint and key) or a ModelRoute object.
ModelRef = str | ModelRoute
MAX_FALLBACKS = 5


def as_route(ref: ModelRef) -> ModelRoute:
    return ref if isinstance(ref, ModelRoute) else ModelRoute(model=ref)


def _check_refs(value: list[ModelRef]) -> list[ModelRef]:
    for ref in value:
        if isinstance(ref, str):
            _check_route(ref)
    return value


class CompactionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ModelRef | None = Field(
        default=None,
        description="Model that writes compaction summaries (e.g. a cheaper one); default: the model the run is on.",
    )
    fallback_models: list[ModelRef] = Field(
        default_factory=list,
        max_length=MAX_FALLBACKS,
        description="Tried in order when the summary model fails; after the last, a mechanical summary is used.",
    )

    @field_validator("model")
    @classmethod
    def _routed(cls, value: ModelRef | None) -> ModelRef | None:
        if isinstance(value, str):
            _check_route(value)
        return value

    @field_validator("fallback_models")
    @classmethod
    def _refs(cls, value: list[ModelRef]) -> list[ModelRef]:
        return _check_refs(value)

    def routes(self) -> list[ModelRoute]:
        if self.model is None:
            return []
        return [as_route(self.model), *(as_route(r) for r in self.fallback_models)]


MAX_SUBAGENT_TYPES = 16


class SubagentConfig(BaseModel):
    """A kind of subagent the `task` tool may start: its own instructions, a subset of the run's tools, optionally
    another model. It starts with a fresh context (its instructions and the prompt it is given) and only its final
    answer returns to the agent that started it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="What the model names in `subagent_type`.")
    description: str = Field(min_length=1, max_length=1_000, description="When to use it (shown to the model).")
    instructions: str = Field(min_length=1, max_length=50_000, description="The subagent's system prompt.")
    tools: list[str] | None = Field(
        default=None,
        description="Tool names it may use, a subset of the run's (never `task`); default: the general set.",
    )
    model: ModelRef | None = Field(default=None, description="Another model for it; default the run's model.")
    max_turns: int = Field(default=10, ge=1, le=100, description="Its model calls before a forced final answer.")

    @field_validator("model")
    @classmethod
    def _routed(cls, value: ModelRef | None) -> ModelRef | None:
        if isinstance(value, str):
            _check_route(value)
        return value


class LocalAgentConfig(BaseModel):
    """What a binding may set. Every field is optional; with no model and no provider key the offline demo runs."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None,
        description="provider/model, e.g. 'openai/gpt-4o', 'anthropic/claude-sonnet-4-5', 'ollama/qwen3', "
        "'vllm/meta-llama/Llama-3.1-8B', 'demo/offline'.",
    )
    base_url: str | None = Field(default=None, description="Overrides the provider's default endpoint.")
    api_key_env: str | None = Field(
        default=None,
        description="Name of a stored key the binding names (`agenthost keys set NAME`, `bots bind --key NAME`).",
    )
    api_key: SecretStr | None = Field(
        default=None, description="Inline key; prefer api_key_env so the key stays out of the DB."
    )
    context_window: int | None = Field(default=None, ge=1_024, le=10_000_000, description="Tokens; otherwise probed.")
    max_output_tokens: int = Field(default=4_096, ge=16, le=200_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    thinking_budget: int | None = Field(default=None, ge=1_024, description="Anthropic extended thinking budget.")
    vision: Literal["auto"] | bool = Field(
        default="auto",
        description="Show the model images (message attachments, images tools return): true, false, or auto (yes, "
        "except for the demo model and model families known to take text only). A model not shown an image reads "
        "a note naming it instead.",
    )
    system_prompt: str | None = Field(default=None, max_length=50_000)
    compaction_watermark: float = Field(
        default=0.7, ge=0.3, le=0.95, description="Fraction of the window that triggers compaction."
    )
    keep_recent_fraction: float = Field(default=0.25, ge=0.05, le=0.6, description="Share of the window kept verbatim.")
    max_iterations: int = Field(
        default=25, ge=1, le=500, description="Model calls per run before a forced final answer."
    )
    max_retries: int = Field(default=4, ge=0, le=20)
    request_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    tool_result_max_chars: int = Field(default=20_000, ge=500, le=2_000_000)
    parallel_read_only_tools: bool = True
    workspace: str | None = Field(
        default=None,
        description="Absolute directory of the host used as every conversation's workspace root (each conversation "
        "works in a subdirectory); it must exist, outside agenthost's data dir, and hold no credentials. The host "
        "shows it read-write to this runner's sandbox. Default: a directory per conversation in the runner's data dir.",
        json_schema_extra=path_setting("rw"),
    )
    workspace_max_mib: int = Field(
        default=DEFAULT_MIB,
        ge=1,
        le=1_048_576,
        description="Size budget of each conversation's workspace, in MiB. A shell command is refused while the "
        "workspace is over it and killed when it passes it while running (measured every 0.5 s); no single file a "
        "command writes may be larger (RLIMIT_FSIZE).",
    )
    tools: list[str] | None = Field(default=None, description="Tool names to enable; default all.")
    shell: ShellConfig = ShellConfig()
    memory: MemoryConfig = MemoryConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()
    fallback_models: list[ModelRef] = Field(
        default_factory=list,
        max_length=MAX_FALLBACKS,
        description="Models to move the run to, in order, when the current one keeps failing with a rate limit, "
        "overload, server error, timeout or dropped connection after its retries. Never on an auth error or a bad "
        "request. Each: 'provider/model' or {model, base_url, api_key_env, api_key, context_window}.",
    )
    compaction: CompactionConfig = CompactionConfig()
    prompt_cache: bool = Field(
        default=True,
        description="Ask the provider to cache the request prefix: Anthropic cache_control breakpoints, an "
        "OpenAI-compatible prompt_cache_key per conversation. A server that rejects the field with a 400 naming it "
        "is retried without it automatically; false never sends them.",
    )
    skills: list[Skill] = Field(
        default_factory=list,
        max_length=MAX_SKILLS,
        description="Skills bound to the bot (the same entries the harness runners project as SKILL.md): listed "
        "in the system prompt by name and description, loaded on demand with the load_skill tool.",
    )

    @field_validator("skills")
    @classmethod
    def _unique_skills(cls, skills: list[Skill]) -> list[Skill]:
        return unique_names(skills)

    subagents: list[SubagentConfig] = Field(
        default_factory=list,
        max_length=MAX_SUBAGENT_TYPES,
        description="Subagent types for the `task` tool, besides the built-in `general` (a type named `general` "
        "replaces it).",
    )

    @field_validator("subagents")
    @classmethod
    def _unique(cls, value: list[SubagentConfig]) -> list[SubagentConfig]:
        names = [s.name for s in value]
        if len(set(names)) != len(names):
            raise ValueError(f"subagent names must be unique, got {names}")
        return value

    mcp_servers: list[McpServer] = Field(
        default_factory=list,
        description="The binding's own MCP servers; their tools join the agent's as mcp__<server>__<tool>. stdio "
        "servers run in the shell tool's sandbox with the conversation's workspace; ${KEY} in env and headers "
        "refers to the binding's keys.",
    )

    @field_validator("mcp_servers")
    @classmethod
    def _servers(cls, value: list[McpServer]) -> list[McpServer]:
        return check_unique(value)

    @field_validator("model")
    @classmethod
    def _routed(cls, value: str | None) -> str | None:
        if value is not None:
            _check_route(value)
        return value

    @field_validator("fallback_models")
    @classmethod
    def _refs(cls, value: list[ModelRef]) -> list[ModelRef]:
        return _check_refs(value)

    def fallback_routes(self) -> list[ModelRoute]:
        return [as_route(r) for r in self.fallback_models]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> LocalAgentConfig:
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(f"invalid local-agent config: {validation_problems(exc)}") from None

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The manifest's config_schema; `api_key` appears as a write-only password string."""
        return cls.model_json_schema()
