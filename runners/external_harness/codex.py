"""Codex (`codex exec --json`): command line and JSONL event mapping.

Session model: Codex chooses the thread id and announces it in `thread.started`; later turns run
`codex exec resume <id> -` from the same cwd and CODEX_HOME. Everything the runner configures is passed as
`-c` overrides; `$CODEX_HOME` is the conversation's, and its `config.toml` is the bot's default one an operator put in
`<data dir>/harness/<bot>/defaults/codex/` (or none), copied in before every turn (projection.project_home).
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.runners.external_harness.config import CodexConfig
from agenthost.runners.external_harness.errors import HarnessReportedError, ProjectionError
from agenthost.runners.external_harness.process import build_env
from agenthost.runners.external_harness.projection import SdkBridgeLaunch, bot_default, codex_mcp_overrides
from agenthost.runners.external_harness.sandboxing import resolve_codex
from agenthost.runners.external_harness.turn import (
    Command,
    Install,
    TurnPlan,
    TurnState,
    add_user_mcp_env,
    auth_problem,
    base_url,
    forwarded_secrets,
    isolation_env,
    loopback_bypass,
    secret_values,
)
from agenthost.runners.external_harness.workspace import Workspace
from agenthost.runners.sdk import events

SESSION_LOST_MARKERS = ("No saved session found", "no rollout found")
MISSING_KEY_MARKERS = ("Missing environment variable", "Not logged in", "not logged in")
REJECTED_KEY_MARKERS = ("401 Unauthorized", "Incorrect API key", "invalid_api_key")
PROVIDER = "agenthost"
TOOL_ITEMS = ("command_execution", "mcp_tool_call", "file_change", "web_search")

# Headless and quiet: no analytics/OTLP exports (each also costs seconds of DNS when offline), no curated
# plugin sync (it runs git against the network), never an approval prompt nobody could answer.
BASE_OVERRIDES: dict[str, Any] = {
    "approval_policy": "never",
    "analytics.enabled": False,
    "feedback.enabled": False,
    "otel.exporter": "none",
    "otel.metrics_exporter": "none",
    "otel.trace_exporter": "none",
    "features.plugins": False,
    "features.apps": False,
    "features.remote_plugin": False,
    "check_for_update_on_startup": False,
}


def sandbox_overrides(config: CodexConfig) -> dict[str, Any]:
    """Who enforces the binding's `sandbox`. Inside agenthost's sandbox, agenthost does (sandboxing.harness_sandbox,
    from `config.command_walls()`) and Codex's own is off: Codex wraps each command in a bubblewrap of its own, which
    cannot start nested in agenthost's (the outer /proc is bound read-only there, so it cannot write its uid map),
    and every command would hang for 10 s and return nothing. Without agenthost's sandbox
    (`process_sandbox: false`), Codex's own is the only wall, and gets the binding's mode."""
    if config.process_sandbox:
        return {"sandbox_mode": "danger-full-access"}
    overrides: dict[str, Any] = {"sandbox_mode": config.sandbox}
    if config.sandbox == "workspace-write":
        overrides["sandbox_workspace_write.network_access"] = config.network_access
    return overrides


def usage_event(totals: dict[str, int], *, model: str = "") -> pb.RunEvent:
    # Codex counts cached input inside input_tokens; agenthost reports them apart.
    cached = totals.get("cached_input_tokens", 0)
    return events.usage(
        max(totals.get("input_tokens", 0) - cached, 0),
        totals.get("output_tokens", 0),
        cache_read_tokens=cached,
        model=model,
    )


def usage_since(totals: dict[str, int], previous: dict[str, int]) -> dict[str, int]:
    """This turn's share of a thread's running totals (the totals themselves if they went backwards)."""
    if all(totals.get(k, 0) >= previous.get(k, 0) for k in totals):
        return {k: totals[k] - previous.get(k, 0) for k in totals}
    return dict(totals)


def toml_value(value: Any) -> str:
    """TOML for a `-c` value. JSON scalars and arrays are valid TOML; tables become inline tables."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None:
        raise ValueError("TOML has no null")
    return json.dumps(value)


class CodexDriver:
    name = "codex"
    default_key_env = "OPENAI_API_KEY"
    config_model = CodexConfig
    binary_env = "AGENTHOST_CODEX_BIN"
    binary_name = "codex"

    def install(self, binary: str, path_env: str) -> Install:
        exe, env, ro_paths = resolve_codex(binary, path_env)
        return Install(exe=exe, env=env, ro_paths=ro_paths)

    def command(self, plan: TurnPlan) -> Command:
        config = plan.config
        assert isinstance(config, CodexConfig)
        ws = plan.workspace
        key_env = config.api_key_env or self.default_key_env
        overrides: dict[str, Any] = dict(BASE_OVERRIDES)
        overrides.update(sandbox_overrides(config))
        if config.base_url:
            overrides["model_provider"] = PROVIDER
            overrides[f"model_providers.{PROVIDER}.name"] = "agenthost-configured provider"
            overrides[f"model_providers.{PROVIDER}.base_url"] = base_url(config.base_url, v1=True)
            overrides[f"model_providers.{PROVIDER}.wire_api"] = config.wire_api
            overrides[f"model_providers.{PROVIDER}.env_key"] = key_env
            overrides[f"model_providers.{PROVIDER}.request_max_retries"] = config.max_retries
            overrides[f"model_providers.{PROVIDER}.stream_max_retries"] = config.max_retries
        overrides.update(config.config_overrides)

        argv = [plan.binary, "exec", "--json", "--skip-git-repo-check", "--color", "never", "-C", str(ws.working_dir)]
        if config.model:
            argv += ["-m", config.model]
        for key, value in overrides.items():
            argv += ["-c", f"{key}={toml_value(value)}"]
        if plan.bridge is not None:
            assert not isinstance(plan.bridge, SdkBridgeLaunch)  # CodexConfig has no 'sdk' transport
            for override in codex_mcp_overrides(plan.bridge):
                argv += ["-c", override]
        if plan.user_mcp is not None:
            for override in plan.user_mcp.codex:
                argv += ["-c", override]
        if plan.resume_session_id:
            argv += ["resume", plan.resume_session_id]
        argv.append("-")  # the prompt comes on stdin: no argv size limit, no prompt parsed as a flag

        secrets = forwarded_secrets(plan, key_env)
        set_env: dict[str, str] = {**plan.binary_env, **isolation_env(plan), "CODEX_HOME": str(ws.codex_home)}
        set_env.update(config.env)
        set_env.update(secrets)
        set_env.update(plan.bridge_env)
        env = build_env(inherited=plan.inherited_env, set_env=set_env)
        if plan.user_mcp is not None:
            add_user_mcp_env(env, plan.user_mcp.codex_env)
        loopback_bypass(plan, env)
        return Command(argv=argv, env=env, secrets=secret_values(plan, secrets))

    def auth_problem(self, message: str) -> str | None:
        return auth_problem(message, missing=MISSING_KEY_MARKERS, rejected=REJECTED_KEY_MARKERS)

    def configured_model(self, config: CodexConfig, workspace: Workspace) -> str:
        """The model this turn uses, for usage events (Codex's JSON events never name it): the binding's, else
        the bot's default config.toml's (an operator may set it there; projection.project_home), else ''."""
        if config.model:
            return config.model
        override = config.config_overrides.get("model")
        if isinstance(override, str):
            return override
        try:
            found = bot_default(workspace, "codex", "config.toml")
            model = tomllib.loads(found[0].decode()).get("model") if found is not None else None
        except (OSError, ProjectionError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return ""
        return model if isinstance(model, str) else ""

    def session_lost(self, stderr: str, turn: TurnState) -> bool:
        return turn.session_lost or any(m.lower() in stderr.lower() for m in SESSION_LOST_MARKERS)

    def map_event(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        kind = raw.get("type")
        if kind == "thread.started":
            turn.session_id = raw.get("thread_id") or turn.session_id
            return []
        if kind in ("item.started", "item.updated", "item.completed"):
            return self._item(kind, raw.get("item") or {}, turn)
        if kind == "turn.completed":
            turn.finished = True
            usage = raw.get("usage") or {}
            turn.cumulative_usage = {
                k: int(usage.get(k) or 0) for k in ("input_tokens", "cached_input_tokens", "output_tokens")
            }
            turn.usage = usage_event(turn.cumulative_usage, model=turn.model)
            return []
        if kind == "turn.failed":
            turn.finished = True
            message = str((raw.get("error") or {}).get("message") or turn.last_error_message or "Codex turn failed")
            turn.error = HarnessReportedError(message, code="harness_error")
            return []
        if kind == "error":
            # Often transient ("Reconnecting... 1/5"); fatal only if the turn then fails or the process dies.
            turn.last_error_message = str(raw.get("message") or "")
            if any(m.lower() in turn.last_error_message.lower() for m in SESSION_LOST_MARKERS):
                turn.session_lost = True
            return []
        return []

    def _item(self, kind: str, item: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        itype = item.get("type")
        item_id = str(item.get("id") or "")
        if itype in TOOL_ITEMS:
            out: list[pb.RunEvent] = []
            if item_id not in turn.tool_names:
                name, args = _tool_call(item)
                turn.tool_names[item_id] = name
                out += turn.tool_call(events.tool_started(item_id, name, args))
            if kind == "item.completed":
                result, is_error = _tool_result(item)  # full size; the runner stores big ones as artifacts
                out.append(events.tool_finished(item_id, turn.tool_names[item_id], result, is_error=is_error))
            return out
        if kind != "item.completed":
            return []
        if itype == "agent_message":
            return turn.text_block(str(item.get("text") or ""), message_id=item_id)
        if itype == "error":
            # Non-fatal notices inside a turn (e.g. missing model metadata for a custom model name).
            return [events.progress(f"codex: {item.get('message') or 'error'}")]
        return []  # reasoning, todo_list, future item types


def _tool_call(item: dict[str, Any]) -> tuple[str, Any]:
    itype = item.get("type")
    if itype == "command_execution":
        return "shell", {"command": item.get("command", "")}
    if itype == "mcp_tool_call":
        return f"{item.get('server', '')}.{item.get('tool', '')}", item.get("arguments") or {}
    if itype == "file_change":
        return "file_change", {"changes": item.get("changes") or []}
    return str(itype), {"query": item.get("query", "")}


def _tool_result(item: dict[str, Any]) -> tuple[str, bool]:
    itype = item.get("type")
    status = item.get("status")
    if itype == "command_execution":
        exit_code = item.get("exit_code")
        failed = status in ("failed", "declined") or (exit_code not in (None, 0))
        return str(item.get("aggregated_output") or ""), failed
    if itype == "mcp_tool_call":
        if item.get("error"):
            err = item["error"]
            return str(err.get("message") if isinstance(err, dict) else err), True
        result = item.get("result") or {}
        parts = []
        for part in result.get("content") or []:
            parts.append(
                part.get("text", "") if isinstance(part, dict) and part.get("type") == "text" else json.dumps(part)
            )
        text = "\n".join(parts) or json.dumps(result.get("structured_content") or {})
        return text, status == "failed"
    if itype == "file_change":
        changes = item.get("changes") or []
        return "\n".join(f"{c.get('kind')} {c.get('path')}" for c in changes), status == "failed"
    return json.dumps(item, ensure_ascii=False), status == "failed"
