"""Projection: what the runner writes into the working directory before each harness turn.

Contract (versioned; docs/runners/external-harness.md documents it for users):

* `.agenthost/context.json` — schema `agenthost.external_harness_context.v1`, rewritten atomically every turn:
  the run, event, actor, conversation, input, delivery, resources, context access and state pointers.
* `CLAUDE.md` (Claude Code) / `AGENTS.md` (Codex) — a managed block between two marker lines, replaced every
  turn; everything outside the markers belongs to the user (or the harness) and is preserved byte for byte.
  The block holds only facts of the bot and its binding, the same in every conversation, so the harness's
  prompt cache survives from turn to turn and a process started before its conversation existed (a spare,
  warm.py) read the block its conversation would have; the conversation and message details live in context.json.
* `.claude/skills/<name>/` and `.agents/skills/<name>/` — the skills bound to the bot. The runner remembers
  which skill dirs it wrote (`.agenthost/skills.json`) and only ever rewrites or removes those; a user's own
  skill dir with the same name wins and is reported.
* the MCP server entry: the URL of the runner's per-turn HTTP endpoint, or (stdio) the command that starts
  `python -m agenthost.runners.external_harness.mcp_bridge` (a 0600 `.agenthost/mcp.json` for Claude Code;
  `-c mcp_servers.agenthost.*` overrides for Codex).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agenthost.protos import runner_pb2
from agenthost.protos.json_values import to_jsonable
from agenthost.runners.external_harness import mcp_bridge
from agenthost.runners.external_harness.config import HarnessConfig
from agenthost.runners.external_harness.errors import ProjectionError
from agenthost.runners.external_harness.safe_fs import MAX_READ_BYTES, SafeDir, name_parts, open_dir
from agenthost.runners.external_harness.workspace import AGENTHOST_DIR, Workspace
from agenthost.runners.sdk.skills import Skill, skill_files

SCHEMA = "agenthost.external_harness_context.v1"
BEGIN_MARKER = "<!-- BEGIN AGENTHOST MANAGED BLOCK: replaced before every message; edit outside it -->"
END_MARKER = "<!-- END AGENTHOST MANAGED BLOCK -->"
SKILL_DIRS = (".claude/skills", ".agents/skills")
MCP_SERVER_NAME = mcp_bridge.SERVER_NAME
SESSION_KEY = "external.session_id"
WORKDIR_KEY = "external.working_directory"
HARNESS_KEY = "external.harness"
READ_ONLY_NOTE = "The working directory is read-only"
USAGE_KEY = "external.usage_totals"

Harness = Literal["claude-code", "codex"]
CONTEXT_FILE: dict[str, str] = {"claude-code": "CLAUDE.md", "codex": "AGENTS.md"}


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Replaces `path` atomically; its parent is a directory the caller trusts (safe_fs.SafeDir.write)."""
    with open_dir(path.parent) as parent:
        parent.write(path.name, data, mode=mode)


def read_regular(path: Path, *, limit: int = MAX_READ_BYTES) -> tuple[bytes, int] | None:
    """The bytes and mode bits of `path`, a regular file of at most `limit` bytes, or None if there is none.

    The working directory is the harness's, so whatever is there may have been planted by a model's command. The
    runner reads it from outside the sandbox: a symlink would have it read (and copy into the workspace) what only
    the runner may see, and a FIFO would block its event loop, which serves every conversation. So: no following,
    no waiting, no reading past `limit`; ProjectionError for anything else in that place (safe_fs.SafeDir.read).
    The parent is a directory the caller trusts."""
    with open_dir(path.parent) as parent:
        return parent.read(path.name, limit=limit)


def write_if_changed(path: Path, data: str, *, mode: int = 0o644) -> None:
    """`atomic_write`, skipped when `path` already holds exactly `data` with `mode` (SafeDir.write_if_changed)."""
    with open_dir(path.parent) as parent:
        parent.write_if_changed(path.name, data, mode=mode)


def write_runner_file(workspace: Workspace, name: str, data: str, *, mode: int = 0o600, always: bool = False) -> Path:
    """One of the runner's files in `.agenthost/`, reached from the working directory without following a symlink
    (a model may have made `.agenthost` one, pointing out of the workspace): ProjectionError then."""
    with open_dir(workspace.working_dir, AGENTHOST_DIR) as agenthost:
        if always:
            agenthost.write(name, data, mode=mode)
        else:
            agenthost.write_if_changed(name, data, mode=mode)
    return workspace.agenthost_dir / name


def granted_apis(ctx: runner_pb2.AgentRunContext) -> str | None:
    """The run's granted APIs as the bridge takes them (AGENTHOST_APIS), or None when the host did not say."""
    apis = list(ctx.resources.apis) or list(ctx.context.available_apis)
    return ",".join(apis) if apis else None


def build_context(
    ctx: runner_pb2.AgentRunContext,
    *,
    harness: Harness,
    workspace: Workspace,
    session_id: str | None,
    bridge_enabled: bool,
) -> dict[str, Any]:
    """The context.json document. Pure: everything comes from the run context and the runner's decisions."""
    try:
        snapshot = json.loads(ctx.state_json or "{}")
    except json.JSONDecodeError:
        snapshot = {}
    return {
        "schema": SCHEMA,
        "generated_at": time.time(),
        "harness": harness,
        "working_directory": str(workspace.working_dir),
        "run": {
            "run_id": ctx.run_id,
            "trigger": to_jsonable(ctx.trigger),
            "runtime": to_jsonable(ctx.runtime),
        },
        "event": to_jsonable(ctx.event),
        "actor": to_jsonable(ctx.actor),
        "subject": to_jsonable(ctx.subject),
        "conversation": to_jsonable(ctx.conversation),
        "input": to_jsonable(ctx.input),
        "delivery": to_jsonable(ctx.delivery),
        "resources": to_jsonable(ctx.resources),
        "context_access": to_jsonable(ctx.context),
        "state": {
            # Pointers, not values: the harness reads live values through the bridge's state_get.
            "session": {"scope": "conversation", "key": SESSION_KEY, "value": session_id},
            "working_directory": {"scope": "conversation", "key": WORKDIR_KEY},
            "snapshot_keys": {scope: sorted(values) for scope, values in snapshot.items() if isinstance(values, dict)},
        },
        "mcp": {
            "server": MCP_SERVER_NAME if bridge_enabled else None,
            "tools": list(mcp_bridge.tools_for(granted_apis(ctx))) if bridge_enabled else [],
        },
    }


def render_managed_block(
    ctx: runner_pb2.AgentRunContext, config: HarnessConfig, *, harness: Harness, bridge_enabled: bool
) -> str:
    bot = ctx.conversation.bot_name or ctx.conversation.bot_id or "this bot"
    lines = [
        "## agenthost",
        "",
        # Nothing of one conversation here: the block is the same in every conversation of a binding, so a spare
        # process that read it before its conversation existed (warm.py) read what the conversation would write.
        f"You are the agent behind the chat bot **{bot}**. Each prompt is a message a user sent to the bot; "
        "your final reply is delivered to them.",
        "",
        "- Details of the current message (conversation, sender, attachments, delivery limits, run id) are in "
        f"`.agenthost/context.json` (schema `{SCHEMA}`), rewritten before every message.",
    ]
    if bridge_enabled:
        tool_prefix = f"mcp__{MCP_SERVER_NAME}__" if harness == "claude-code" else f"{MCP_SERVER_NAME}."
        lines.append(
            f"- The host's records of this conversation are available through the `{MCP_SERVER_NAME}` MCP tools ("
            + ", ".join(f"`{tool_prefix}{name}`" for name in mcp_bridge.tools_for(granted_apis(ctx)))
            + "). Use them for messages from before this session, for attachments, and to remember things "
            "in host state."
        )
    if not config.command_walls().workdir_writable:
        # The harness may say otherwise: Codex's own sandbox is off inside agenthost's, which enforces this.
        lines.append(
            f"- {READ_ONLY_NOTE}: your commands can read files there (and write under $TMPDIR) but cannot change "
            "them; the bot's binding sets this and agenthost's sandbox enforces it, whatever the harness says."
        )
    if config.skills:
        lines.append("- Skills bound to this bot: " + ", ".join(f"`{s.name}`" for s in config.skills) + ".")
    if config.instructions.strip():
        lines += ["", "### Bot instructions", "", config.instructions.strip()]
    return "\n".join(lines) + "\n"


def upsert_managed_block(path: Path, block: str) -> None:
    """Replaces the managed block in a user-owned file, or appends one; the rest of the file is untouched."""
    with open_dir(path.parent) as parent:
        _upsert(parent, path.name, block)


def _upsert(parent: SafeDir, name: str, block: str) -> None:
    managed = f"{BEGIN_MARKER}\n{block.rstrip()}\n{END_MARKER}\n"
    found = parent.read(name)
    try:
        current = found[0].decode("utf-8") if found is not None else ""
    except UnicodeDecodeError:
        raise ProjectionError(f"{name} is not UTF-8 text; refusing to rewrite it") from None
    begin = current.find(BEGIN_MARKER)
    end = current.find(END_MARKER, begin + len(BEGIN_MARKER)) if begin >= 0 else -1
    if begin >= 0 and end >= 0:
        tail = current[end + len(END_MARKER) :]
        tail = tail[1:] if tail.startswith("\n") else tail
        updated = current[:begin] + managed + tail
    else:
        # No block yet (or a begin marker whose end someone deleted: drop just that line, keep their text).
        if begin >= 0:
            line_end = current.find("\n", begin)
            current = current[:begin] + (current[line_end + 1 :] if line_end >= 0 else "")
        sep = "" if not current or current.endswith("\n\n") else ("\n" if current.endswith("\n") else "\n\n")
        updated = current + sep + managed
    if updated != current or found is None:
        parent.write(name, updated)


def _digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return h.hexdigest()


def _skill_name(name: object) -> bool:
    """A skill directory name the runner may have written: one plain component (the manifest it comes from sits in
    the working directory, where a model may have rewritten it to name `../..`)."""
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


def project_skills(workspace: Workspace, skills: list[Skill]) -> list[str]:
    """Writes the bound skills into both skill dirs; returns warnings (skills left alone). Every write and removal
    goes by descriptor from the working directory (safe_fs): a symlinked `.claude`, skills dir or skill is refused
    or removed, never followed."""
    with open_dir(workspace.working_dir) as root, root.sub(AGENTHOST_DIR) as agenthost:
        return _project_skills(root, agenthost, skills)


def _project_skills(root: SafeDir, agenthost: SafeDir, skills: list[Skill]) -> list[str]:
    found = agenthost.read("skills.json")
    try:
        managed: dict[str, dict[str, str]] = json.loads(found[0]) if found is not None else {}
        if not isinstance(managed, dict):
            managed = {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        managed = {}
    warnings: list[str] = []
    wanted = {s.name: skill_files(s) for s in skills}
    new_manifest: dict[str, dict[str, str]] = {}
    for skills_dir in SKILL_DIRS:
        listed = managed.get(skills_dir)
        listed = listed if isinstance(listed, dict) else {}
        ours: dict[str, str] = {k: v for k, v in listed.items() if _skill_name(k) and isinstance(v, str)}
        with root.sub(skills_dir) as base:
            for name in list(ours):
                if name not in wanted:  # unbound since the last turn
                    base.remove(name)
                    del ours[name]
            for name, files in wanted.items():
                if not _skill_name(name):
                    raise ProjectionError(f"skill name {name!r} is not a plain directory name")
                digest = _digest(files)
                if base.lexists(name) and name not in ours:
                    warnings.append(
                        f"skill {name!r}: {skills_dir}/{name} exists and is not managed by agenthost; kept it"
                    )
                    continue
                if ours.get(name) == digest and base.is_regular(f"{name}/SKILL.md"):
                    continue
                staging = f".{name}.agenthost-new"
                base.remove(staging)
                with base.sub(staging) as stage:
                    for rel, content in files.items():
                        try:
                            *dirs, leaf = name_parts(rel)
                        except (ProjectionError, ValueError):
                            raise ProjectionError(f"skill {name!r} file {rel!r} escapes the skill directory") from None
                        with stage.sub("/".join(dirs)) as parent:
                            parent.write(leaf, content)
                base.remove(name)
                base.rename(staging, name)
                ours[name] = digest
        new_manifest[skills_dir] = ours
    agenthost.write_if_changed("skills.json", json.dumps(new_manifest, indent=1, sort_keys=True))
    return warnings


@dataclass(frozen=True)
class BridgeLaunch:
    """How the harness starts the bridge. Credentials are named, never included: they travel in the env."""

    command: str = field(default_factory=lambda: sys.executable)
    args: tuple[str, ...] = ("-m", "agenthost.runners.external_harness.mcp_bridge")
    # The runner's own interpreter finds agenthost through its site-packages (installed or editable alike).
    env: dict[str, str] = field(default_factory=lambda: {"PYTHONUNBUFFERED": "1"})
    credential_env: tuple[str, ...] = mcp_bridge.CREDENTIAL_ENV


@dataclass(frozen=True)
class HttpBridgeLaunch:
    """The runner's own per-turn endpoint (mcp_http.py): a URL, and the name of the environment variable that
    holds its bearer token in the harness's environment (the token itself is never written down)."""

    url: str
    token_env: str = "AGENTHOST_MCP_TOKEN"


@dataclass(frozen=True)
class SdkBridgeLaunch:
    """Claude Code only: the bridge answers over the CLI's own stdin and stdout (mcp_control.py), so its entry
    names the server and nothing to connect to."""


Launch = BridgeLaunch | HttpBridgeLaunch | SdkBridgeLaunch


def write_claude_mcp_config(
    workspace: Workspace, launch: Launch | None, user_servers: dict[str, dict[str, Any]] | None = None
) -> Path:
    """`.agenthost/mcp.json` (0600) for `--mcp-config`. `${VAR}` references make Claude Code fill in the run's
    credentials from its own environment (into the bridge's environment, or the endpoint's Authorization
    header), so the file never holds a secret. `user_servers`: the binding's own servers (user_mcp.py), beside
    the bridge, their secrets likewise referenced."""
    # `alwaysLoad`: the binding's own servers' tools go into the first model request though tool search defers other
    # tools (the binding chose these servers; finding their tools by search would cost a model round trip). The
    # bridge marks its tools so itself (mcp_bridge.LISTED_TOOLS), which spares the CLI waiting for it at start-up.
    # Turning tool search off instead (ENABLE_TOOL_SEARCH=false, until 2026-11-26) also inlined every built-in tool:
    # ~30 KB more per request and ~7 % more time per trivial turn.
    servers: dict[str, Any] = {name: {**entry, "alwaysLoad": True} for name, entry in (user_servers or {}).items()}
    if isinstance(launch, SdkBridgeLaunch):
        servers[MCP_SERVER_NAME] = {"type": "sdk", "name": MCP_SERVER_NAME}
    elif isinstance(launch, HttpBridgeLaunch):
        servers[MCP_SERVER_NAME] = {
            "type": "http",
            "url": launch.url,
            "headers": {"Authorization": "Bearer ${" + launch.token_env + "}"},
        }
    elif launch is not None:
        env = dict(launch.env)
        env.update({name: "${" + name + "}" for name in launch.credential_env})
        servers[MCP_SERVER_NAME] = {
            "type": "stdio",
            "command": launch.command,
            "args": list(launch.args),
            "env": env,
        }
    return write_runner_file(workspace, "mcp.json", json.dumps({"mcpServers": servers}, indent=1))


def codex_mcp_overrides(launch: BridgeLaunch | HttpBridgeLaunch) -> list[str]:
    """`-c` overrides registering the bridge with Codex. For stdio, `env_vars` forwards the credentials by name
    from Codex's environment (Codex starts MCP servers with a minimal env otherwise); for the HTTP endpoint,
    `bearer_token_env_var` names the variable Codex reads the bearer token from."""
    prefix = f"mcp_servers.{MCP_SERVER_NAME}"
    if isinstance(launch, HttpBridgeLaunch):
        transport = [
            f"{prefix}.url={json.dumps(launch.url)}",
            f"{prefix}.bearer_token_env_var={json.dumps(launch.token_env)}",
        ]
    else:
        transport = [
            f"{prefix}.command={json.dumps(launch.command)}",
            f"{prefix}.args={json.dumps(list(launch.args))}",
            f"{prefix}.env={{{', '.join(f'{k} = {json.dumps(v)}' for k, v in launch.env.items())}}}",
            f"{prefix}.env_vars={json.dumps(list(launch.credential_env))}",
        ]
    return [
        *transport,
        f"{prefix}.startup_timeout_sec=30",
        # Outside danger-full-access Codex asks before every MCP call, and exec has nobody to ask (with
        # approval_policy=never the call is refused). The bridge's tools are approved here because the host
        # enforces the run's grant on each of them anyway; the Claude Code twin is --allowedTools mcp__agenthost.
        f'{prefix}.default_tools_approval_mode="approve"',
    ]


# What each CLI loads from its config dir at start-up that an operator may set for every conversation of a bot:
# (the config dir's name in the harness home and in the bot's defaults, the files).
HOME_DEFAULTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "claude-code": ("claude", ("CLAUDE.md", "settings.json")),
    "codex": ("codex", ("AGENTS.md", "config.toml")),
}


def bot_default(workspace: Workspace, harness: Harness, name: str) -> tuple[bytes, int] | None:
    """The operator's `defaults/<config dir>/<name>` for the bot, or None."""
    try:
        return read_regular(workspace.defaults_dir / HOME_DEFAULTS[harness][0] / name)
    except FileNotFoundError:  # no defaults dir at all
        return None


def project_home(workspace: Workspace, harness: Harness) -> None:
    """Makes the start-up files of the harness's config dir the runner's, before every turn: the bot's default when
    the operator set one, else none. The home is read-write in the sandbox, so a model's command may write
    `settings.json` (whose hooks run commands) or `CLAUDE.md` there during a turn; it never reaches a later turn,
    of this conversation or (the home being its own, workspace.py) of another."""
    config_name, names = HOME_DEFAULTS[harness]
    with open_dir(workspace.harness_dir, config_name) as config_dir:
        for name in names:
            found = bot_default(workspace, harness, name)
            if found is None:
                config_dir.remove(name)
            else:
                config_dir.write_if_changed(name, found[0], mode=0o600)


def project_startup(
    ctx: runner_pb2.AgentRunContext,
    config: HarnessConfig,
    workspace: Workspace,
    *,
    harness: Harness,
    bridge_enabled: bool,
) -> list[str]:
    """Writes what the harness reads when it starts, the context file's block, the skills and its config dir's files,
    which hold nothing of one conversation or message; returns warnings worth a progress note."""
    project_home(workspace, harness)
    upsert_managed_block(
        workspace.working_dir / CONTEXT_FILE[harness],
        render_managed_block(ctx, config, harness=harness, bridge_enabled=bridge_enabled),
    )
    return project_skills(workspace, config.skills)


def project(
    ctx: runner_pb2.AgentRunContext,
    config: HarnessConfig,
    workspace: Workspace,
    *,
    harness: Harness,
    session_id: str | None,
    bridge_enabled: bool,
) -> list[str]:
    """Writes context.json and `project_startup`'s files; returns its warnings."""
    write_context(ctx, workspace, harness=harness, session_id=session_id, bridge_enabled=bridge_enabled)
    return project_startup(ctx, config, workspace, harness=harness, bridge_enabled=bridge_enabled)


def write_context(
    ctx: runner_pb2.AgentRunContext,
    workspace: Workspace,
    *,
    harness: Harness,
    session_id: str | None,
    bridge_enabled: bool,
) -> None:
    """context.json: this message's details, which the harness reads when it wants them, not at start-up."""
    doc = build_context(ctx, harness=harness, workspace=workspace, session_id=session_id, bridge_enabled=bridge_enabled)
    write_runner_file(workspace, "context.json", json.dumps(doc, indent=1, ensure_ascii=False), always=True)
