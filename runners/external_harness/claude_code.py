"""Claude Code (`claude -p --output-format stream-json`): command line and stream mapping.

Session model: the runner picks the session id itself (`--session-id <uuid>`) on the first turn, so it is known
before the harness prints anything, and passes `--resume <id>` afterwards, always from the same cwd and
CLAUDE_CONFIG_DIR (Claude Code stores sessions under the config dir, keyed by cwd).
"""

from __future__ import annotations

import json
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.runners.external_harness.config import ClaudeCodeConfig
from agenthost.runners.external_harness.errors import HarnessReportedError
from agenthost.runners.external_harness.mcp_bridge import APPROVE_TOOL
from agenthost.runners.external_harness.process import build_env
from agenthost.runners.external_harness.projection import MCP_SERVER_NAME
from agenthost.runners.external_harness.sandboxing import install_paths, resolve_executable
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
from agenthost.runners.sdk import events

SESSION_LOST_MARKERS = ("No conversation found with session ID", "No conversation found")
# What Claude Code says when it has no credential at all, and when the API refused the one it has.
MISSING_KEY_MARKERS = ("Not logged in", "Please run /login")
REJECTED_KEY_MARKERS = ("Invalid API key", "(API status 401)", "authentication_error", "Failed to authenticate")
APPEND_PROMPT_FILE = "append-system-prompt.md"


class ClaudeCodeDriver:
    name = "claude-code"
    default_key_env = "ANTHROPIC_API_KEY"
    config_model = ClaudeCodeConfig
    binary_env = "AGENTHOST_CLAUDE_BIN"
    binary_name = "claude"

    def install(self, binary: str, path_env: str) -> Install:
        # The real file, not an npm .bin symlink: the sandbox shows the package it lives in, not .bin.
        exe = resolve_executable(binary, path_env)
        if exe is None:
            return Install(exe=binary, env={}, ro_paths=[])  # HarnessProcess reports it missing
        return Install(exe=exe, env={}, ro_paths=install_paths(exe, path_env))

    def command(self, plan: TurnPlan) -> Command:
        config = plan.config
        assert isinstance(config, ClaudeCodeConfig)
        ws = plan.workspace
        argv = [plan.binary, "-p", "--output-format", "stream-json", "--verbose"]
        if plan.stream_input:
            argv += ["--input-format", "stream-json"]
        if config.streaming:
            argv.append("--include-partial-messages")
        if plan.resume_session_id:
            argv += ["--resume", plan.resume_session_id]
        elif plan.new_session_id:
            argv += ["--session-id", plan.new_session_id]
        allowed = list(config.allowed_tools)
        if plan.bridge is not None or plan.user_mcp is not None:
            argv += ["--mcp-config", str(ws.agenthost_dir / "mcp.json"), "--strict-mcp-config"]
        if plan.bridge is not None:
            # A server-level rule allows every tool of the bridge; the host enforces the real limits.
            allowed.append(f"mcp__{MCP_SERVER_NAME}")
        if plan.user_mcp is not None:
            allowed += plan.user_mcp.claude_allowed()
        if plan.bridge is None and plan.user_mcp is None:
            argv += ["--strict-mcp-config"]  # never pick up MCP servers from elsewhere on the machine
        argv += ["--permission-mode", config.permission_mode]
        if plan.bridge is not None and config.approvals.enabled:
            # Calls Claude Code would refuse go to the bridge's `approve` tool, which asks a person for the ones the
            # binding's approvals name (mcp_bridge.Bridge._tool_approve).
            argv += ["--permission-prompt-tool", f"mcp__{MCP_SERVER_NAME}__{APPROVE_TOOL}"]
        if allowed:
            argv += ["--allowedTools", ",".join(allowed)]
        if config.disallowed_tools:
            argv += ["--disallowedTools", ",".join(config.disallowed_tools)]
        if config.model:
            argv += ["--model", config.model]
        if config.max_turns is not None:
            argv += ["--max-turns", str(config.max_turns)]
        if config.max_budget_usd is not None:
            argv += ["--max-budget-usd", str(config.max_budget_usd)]
        if config.append_system_prompt:
            argv += ["--append-system-prompt-file", str(ws.agenthost_dir / APPEND_PROMPT_FILE)]
        if config.setting_sources is not None:
            argv.append("--setting-sources=" + ",".join(config.setting_sources))

        secrets = forwarded_secrets(plan, "ANTHROPIC_API_KEY")
        set_env: dict[str, str] = {
            **plan.binary_env,
            **isolation_env(plan),
            "CLAUDE_CONFIG_DIR": str(ws.claude_config_dir),
            # Offline-safe and quiet: no updater, telemetry or error reporting from a bot's harness.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_ENTRYPOINT": "sdk-agenthost",
            # Its default (10, with backoff) takes minutes to give up on a key the API rejects.
            "CLAUDE_CODE_MAX_RETRIES": str(config.max_retries),
        }
        if config.base_url:
            set_env["ANTHROPIC_BASE_URL"] = base_url(config.base_url, v1=False)
        set_env.update(config.env)
        set_env.update(secrets)
        set_env.update(plan.bridge_env)
        env = build_env(inherited=plan.inherited_env, set_env=set_env)
        if plan.user_mcp is not None:
            add_user_mcp_env(env, plan.user_mcp.claude_env)
        loopback_bypass(plan, env)
        return Command(argv=argv, env=env, secrets=secret_values(plan, secrets))

    def session_lost(self, stderr: str, turn: TurnState) -> bool:
        return turn.session_lost or any(marker in stderr for marker in SESSION_LOST_MARKERS)

    def auth_problem(self, message: str) -> str | None:
        return auth_problem(message, missing=MISSING_KEY_MARKERS, rejected=REJECTED_KEY_MARKERS)

    def map_event(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        kind = raw.get("type")
        if kind == "system":
            return self._system(raw, turn)
        if kind == "stream_event":
            return self._stream_event(raw, turn)
        if kind == "assistant":
            return self._assistant(raw, turn)
        if kind == "user":
            return self._tool_results(raw, turn)
        if kind == "result":
            return self._result(raw, turn)
        return []  # rate_limit_event, conversation_reset, future types: nothing the user needs

    def _system(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        subtype = raw.get("subtype")
        if subtype == "init":
            turn.session_id = raw.get("session_id") or turn.session_id
            turn.model = raw.get("model") or turn.model
            out = []
            for server in raw.get("mcp_servers") or []:
                if server.get("status") == "connected":
                    continue
                if server.get("name") == MCP_SERVER_NAME:
                    out.append(events.progress(f"host MCP bridge is {server.get('status')}; host tools unavailable"))
                elif isinstance(server.get("name"), str):
                    # A binding's own server (the config is --strict, so every other name is one of those).
                    out.append(
                        events.progress(
                            f"MCP server {server['name'][:64]} is {str(server.get('status'))[:32]}; its tools are "
                            "unavailable this turn"
                        )
                    )
            return out
        if subtype == "api_retry":
            return [
                events.retry(
                    int(raw.get("attempt") or 0),
                    float(raw.get("retry_delay_ms") or 0) / 1000.0,
                    str(raw.get("error") or raw.get("error_status") or "api error"),
                )
            ]
        if subtype == "compact_boundary":
            meta = raw.get("compact_metadata") or {}
            return [events.compaction(int(meta.get("pre_tokens") or 0), 0, summary=str(meta.get("trigger") or ""))]
        return []

    def _stream_event(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        if raw.get("parent_tool_use_id"):
            return []  # a subagent's tokens are not the reply
        ev = raw.get("event") or {}
        if ev.get("type") == "message_start":
            turn.model = (ev.get("message") or {}).get("model") or turn.model
            turn.streaming_message_id = (ev.get("message") or {}).get("id", "")
            turn.block_open = False
            return []
        if ev.get("type") == "content_block_start":
            turn.block_open = False
            return []
        delta = ev.get("delta") or {}
        if ev.get("type") == "content_block_delta" and delta.get("type") == "text_delta" and delta.get("text"):
            if turn.streaming_message_id:
                turn.streamed_messages.add(turn.streaming_message_id)
            first_of_block = not turn.block_open
            turn.block_open = True
            return turn.delta(delta["text"], new_block=first_of_block)
        return []

    def _assistant(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        message = raw.get("message") or {}
        if raw.get("error"):
            # A synthetic message carrying an API error, not a reply: it becomes the failure's text instead.
            turn.last_error_message = _content_text(message.get("content")) or str(raw["error"])
            return []
        if raw.get("parent_tool_use_id"):
            return []
        out: list[pb.RunEvent] = []
        msg_id = message.get("id") or ""
        for block in message.get("content") or []:
            btype = block.get("type")
            if btype == "text":
                out += turn.text_block(block.get("text") or "", message_id=msg_id)
            elif btype in ("tool_use", "server_tool_use"):
                call_id = block.get("id") or ""
                turn.tool_names[call_id] = block.get("name") or ""
                out += turn.tool_call(events.tool_started(call_id, block.get("name") or "", block.get("input") or {}))
        return out

    def _tool_results(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        if raw.get("parent_tool_use_id"):
            return []
        content = (raw.get("message") or {}).get("content")
        if not isinstance(content, list):
            return []  # a replayed user prompt, not tool results
        out = []
        for block in content:
            if block.get("type") != "tool_result":
                continue
            call_id = block.get("tool_use_id") or ""
            result = _content_text(block.get("content"))  # full size; the runner stores big ones as artifacts
            out.append(
                events.tool_finished(
                    call_id, turn.tool_names.get(call_id, ""), result, is_error=bool(block.get("is_error"))
                )
            )
        return out

    def _result(self, raw: dict[str, Any], turn: TurnState) -> list[pb.RunEvent]:
        turn.finished = True
        turn.session_id = raw.get("session_id") or turn.session_id
        usage = raw.get("usage") or {}  # this turn's, also in a kept process (total_cost_usd is the process's)
        model = turn.model or next(iter(raw.get("modelUsage") or {}), "")
        turn.cost_total_usd = float(raw.get("total_cost_usd") or 0.0)
        turn.usage = events.usage(
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
            cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
            cost_usd=max(turn.cost_total_usd - turn.cost_offset_usd, 0.0),
            model=model,
        )
        # Under -p a denied tool does not stop the turn; say so, or the operator never learns what to allow.
        notes = [
            events.progress(
                f"permission denied: {d.get('tool_name', '?')} (allow it with the binding's allowed_tools "
                "or permission_mode)"
            )
            for d in raw.get("permission_denials") or []
            if isinstance(d, dict)
        ]
        subtype = raw.get("subtype") or "success"
        if raw.get("is_error") or subtype != "success":
            detail = raw.get("result") if isinstance(raw.get("result"), str) else ""
            errors = "; ".join(str(e) for e in raw.get("errors") or [])
            message = detail or errors or turn.last_error_message
            if raw.get("api_error_status"):
                message = f"{message} (API status {raw['api_error_status']})".strip()
            code = "harness_error" if subtype == "success" else f"harness_{subtype}"
            if any(m in message for m in SESSION_LOST_MARKERS):
                turn.session_lost = True
            turn.error = HarnessReportedError(message or f"Claude Code reported {subtype}", code=code)
            return notes
        # The result repeats the last assistant text; only use it when no text block arrived at all.
        if not turn.any_text and isinstance(raw.get("result"), str) and raw["result"]:
            return notes + turn.text_block(raw["result"])
        return notes


def stdin_message(prompt: str) -> bytes:
    """One user message as Claude Code reads it under `--input-format stream-json`: a JSON line."""
    message = {"type": "user", "message": {"role": "user", "content": prompt}, "parent_tool_use_id": None}
    # ASCII: no raw U+2028 or other separator a line reader might split on.
    return (json.dumps(message) + "\n").encode()


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            else:
                parts.append(json.dumps(part, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)
