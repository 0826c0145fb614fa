"""The harness runners: one turn of a real Claude Code or Codex CLI per run.

Per run: validate the binding config, wait for the conversation's previous turn (one turn at a time per
conversation; later messages queue on a lock), read the stored session, project context into the working
directory, run the harness under the run's deadline (in the conversation's kept Claude Code process when one is
there and unchanged, see warm.py), stream its events, persist the session it reports, and end with exactly one
`completed` or `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agenthost.plugins.binding_paths import not_shown
from agenthost.plugins.manifest import RunnerCapabilities, RunnerManifest
from agenthost.plugins.sandbox import Sandbox
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors as api_errors
from agenthost.protos.wire import VERSION
from agenthost.runners.external_harness.claude_code import APPEND_PROMPT_FILE, ClaudeCodeDriver, stdin_message
from agenthost.runners.external_harness.codex import CodexDriver, usage_event, usage_since
from agenthost.runners.external_harness.config import (
    ClaudeCodeConfig,
    CodexConfig,
    HarnessConfig,
    config_schema,
    parse_config,
)
from agenthost.runners.external_harness.errors import (
    HarnessConfigError,
    HarnessError,
    HarnessNotFound,
    HarnessReportedError,
    WorkspaceQuotaError,
)
from agenthost.runners.external_harness.mcp_bridge import bridge_from_env, tools_for
from agenthost.runners.external_harness.mcp_control import McpControl, is_control
from agenthost.runners.external_harness.mcp_http import TOKEN_ENV as MCP_TOKEN_ENV
from agenthost.runners.external_harness.mcp_http import McpHttpEndpoint
from agenthost.runners.external_harness.process import HarnessProcess
from agenthost.runners.external_harness.projection import (
    HARNESS_KEY,
    SESSION_KEY,
    USAGE_KEY,
    WORKDIR_KEY,
    BridgeLaunch,
    HttpBridgeLaunch,
    Launch,
    SdkBridgeLaunch,
    granted_apis,
    project_startup,
    write_claude_mcp_config,
    write_context,
    write_runner_file,
)
from agenthost.runners.external_harness.sandboxing import harness_egress, harness_sandbox, with_bridge
from agenthost.runners.external_harness.turn import Driver, Install, TurnPlan, TurnState
from agenthost.runners.external_harness.user_mcp import UserMcp
from agenthost.runners.external_harness.user_mcp import plan as plan_user_mcp
from agenthost.runners.external_harness.warm import MAX_SPARES, KeptHarness, KeptHarnesses, RunnerBridge, fingerprint
from agenthost.runners.external_harness.workspace import SpareSlot, Workspace, WorkspaceManager
from agenthost.runners.sdk import egress, events, workspace_budget
from agenthost.runners.sdk.keys import how_to_give_key
from agenthost.runners.sdk.mcp_servers import McpServerError
from agenthost.runners.sdk.runner import RunContext, Runner

# Leave this much of the run's deadline to report the failure after stopping a harness that ran out of time.
DEADLINE_MARGIN = 1.5
# Tool results longer than this travel as a preview; the full text is stored as an artifact of the run.
MAX_INLINE_TOOL_RESULT = 16_000
EVENT_QUEUE = 256

log = logging.getLogger(__name__)


class _ConversationLocks:
    """One asyncio.Lock per (bot, conversation), dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    def busy(self, key: tuple[str, str]) -> bool:
        return key in self._locks and self._locks[key][0].locked()

    @contextlib.asynccontextmanager
    async def hold(self, key: tuple[str, str]) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


# Shared by both runner classes: a conversation switched from Claude Code to Codex still runs one turn at a time.
_LOCKS = _ConversationLocks()
_LIVE: set[HarnessProcess] = set()


def find_binary(driver: Driver, config: HarnessConfig, environ: dict[str, str]) -> str:
    """Binding `command`, then $AGENTHOST_*_BIN, then the repo-local install, then PATH."""
    candidates = [config.command, environ.get(driver.binary_env)]
    repo_local = Path(__file__).resolve().parents[2] / ".tools" / "npm" / "node_modules" / ".bin" / driver.binary_name
    candidates.append(str(repo_local) if repo_local.exists() else None)
    for candidate in candidates:
        if candidate:
            return candidate
    found = shutil.which(driver.binary_name, path=environ.get("PATH"))
    if not found:
        raise HarnessNotFound(
            f"{driver.binary_name!r} not found: set the binding's 'command', ${driver.binary_env}, or run "
            "scripts/install_harness_clis.sh"
        )
    return found


def bridge_credentials(run: RunContext) -> tuple[dict[str, str] | None, str]:
    """The bridge's environment, or None and the reason it cannot have one.

    The bridge (and so the harness, whose environment it inherits) gets the run's tool token: it reaches this
    run's grant only, dies with the run, and works without the plugin secret, which never leaves this process.
    """
    host_address = str(getattr(run.api, "host_address", "") or "")
    tool_token = str(getattr(run, "tool_token", "") or "")
    if not tool_token:
        return None, (
            "the host gave this run no tool token (RunRequest.tool_token), so the bridge is not started: it "
            "would need the runner's own credentials. Upgrade the host to get host tools in the harness"
        )
    if not host_address:
        return None, "the SDK exposes no host address for the bridge to call"
    creds = {
        "AGENTHOST_HOST_ADDRESS": host_address,
        "AGENTHOST_RUN_ID": run.run_id,
        "AGENTHOST_RUN_TOKEN": tool_token,
        "AGENTHOST_DEADLINE_AT": repr(run.deadline_at or 0.0),
        "AGENTHOST_EVENT_ID": run.context.event.event_id,
        # Always set: Claude Code's ${VAR} expansion in the MCP config fails on an unset variable.
        "AGENTHOST_APIS": granted_apis(run.context) or "*",
    }
    return creds, ""


async def _new_bridge(config: HarnessConfig, creds: dict[str, str]) -> RunnerBridge:
    """A bridge the runner serves itself, listing the tools of `creds`' grant, attached to no run yet."""
    tools = tools_for(creds["AGENTHOST_APIS"], creds["AGENTHOST_APPROVALS"])
    if config.mcp_transport == "sdk":
        return McpControl(tools=tools)
    # In a sandbox the harness has a network namespace of its own: it reaches the endpoint through a unix socket
    # its forwarder relays to (sandboxing.with_bridge).
    unix_path = None
    if config.process_sandbox:
        unix_path = os.path.join(egress.private_dir(), f"mcp-{secrets.token_hex(8)}.sock")
    endpoint = McpHttpEndpoint(None, tools=tools, unix_path=unix_path)
    await endpoint.start()
    return endpoint


def _bridge_launch(bridge: RunnerBridge) -> tuple[Launch, dict[str, str]]:
    """How the harness reaches `bridge`, and what its environment needs for that."""
    if isinstance(bridge, McpControl):
        return SdkBridgeLaunch(), {}
    return HttpBridgeLaunch(url=bridge.url, token_env=MCP_TOKEN_ENV), {MCP_TOKEN_ENV: bridge.token}


def _grant(config: HarnessConfig, bridge_env: dict[str, str] | None) -> str:
    """The bridge's transport and what it lists (granted APIs, approvals): what a harness took in at start-up of
    its bridge, so a kept process or a spare serves only a turn with the same."""
    if bridge_env is None:
        return ""
    return "\n".join((config.mcp_transport, bridge_env["AGENTHOST_APIS"], bridge_env["AGENTHOST_APPROVALS"]))


def _spare_key(run: RunContext, grant: str) -> tuple[str, str]:
    """One spare per binding (its config) and grant."""
    binding = json.dumps([run.config, grant], sort_keys=True, default=str)
    return (run.bot_id, hashlib.sha256(binding.encode()).hexdigest())


def build_prompt(run: RunContext) -> str:
    text = run.text
    attachments = list(run.context.input.attachments)
    if attachments:
        listed = "\n".join(
            f"- {a.name or 'attachment'} (artifact_id {a.artifact_id}, {a.mime_type or 'unknown type'}, "
            f"{a.size_bytes} bytes)"
            for a in attachments
        )
        text = f"{text}\n\nAttached (read with the agenthost artifact_read tool):\n{listed}".strip()
    return text


@dataclass
class _Reuse:
    """One turn's share of warm.py: the conversation's kept process it may continue in, and whether its own
    process may be kept after it."""

    keep_seconds: float = 0.0  # 0: this turn's process stops with the turn
    kept: KeptHarness | None = None  # taken out of the runner's kept processes (or its spares) for this turn
    grant: str = ""  # the bridge's transport and what it lists (granted APIs, approvals)
    bridge: RunnerBridge | None = None  # this turn's bridge served by the runner: the kept process's, or a new one
    # How this turn's process started, once it is kept (None until then): its bridge went with it, so the turn
    # must not close that; a spare repeats it.
    started: TurnPlan | None = None
    # How a clean turn's process started, for a spare to repeat when the process itself is not kept (Codex).
    template: TurnPlan | None = None


@dataclass
class _Stored:
    session_id: str | None = None
    working_directory: str | None = None
    harness: str | None = None
    usage_totals: dict[str, Any] | None = None
    readable: bool = True


def _stored(snap: dict[str, Any], *, readable: bool = True) -> _Stored:
    return _Stored(
        session_id=snap.get(SESSION_KEY),
        working_directory=snap.get(WORKDIR_KEY),
        harness=snap.get(HARNESS_KEY),
        usage_totals=snap.get(USAGE_KEY) if readable else None,
        readable=readable,
    )


class HarnessRunner(Runner):
    """Shared engine; subclasses pick the driver (and so the CLI, config model and manifest)."""

    driver: ClassVar[Driver]

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.workspaces = WorkspaceManager(data_dir)
        self.kept = KeptHarnesses()
        self.spares = KeptHarnesses(capacity=MAX_SPARES)
        self._spares_starting: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def close(self) -> None:
        # A spare still starting is let finish (about a second) and then stopped with the others: cancelled inside
        # asyncio's subprocess_exec, its start waited out the whole timeout below, and could outlive it.
        starting = list(self._spares_starting.values())
        if starting:
            await asyncio.wait(starting, timeout=10)
        for task in starting:
            task.cancel()
        await self.spares.close()
        await self.kept.close()
        for proc in list(_LIVE):
            await proc.stop()

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Bind-time check: the config model's own validators, and a workspace root a run could use."""
        try:
            parsed = parse_config(self.driver.config_model, config)
        except HarnessConfigError as exc:
            return [exc.message]
        root = parsed.workspace_root
        if root is not None and not Path(root).expanduser().is_absolute():
            return [f"workspace_root: {root!r} must be an absolute path"]
        return []

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        try:
            config = parse_config(self.driver.config_model, run.config)
        except HarnessConfigError as exc:
            yield events.failed(exc.code, exc.message)
            return
        # A workspace_root the host did not bind would be made in the sandbox's scratch memory and lost.
        unseen = config.workspace_root and not_shown(config.workspace_root, "workspace_root")
        if unseen:
            yield events.failed(HarnessConfigError.code, unseen)
            return
        prompt = build_prompt(run)
        if not prompt.strip():
            yield events.failed("empty_input", "the message has no text and no attachments to send to the harness")
            return
        key = (run.bot_id, run.conversation_id)
        if _LOCKS.busy(key):
            yield events.progress("queued behind the previous message of this conversation")
        async with _LOCKS.hold(key):
            try:
                # aclosing: when the host ends the run (deadline, cancel), the SDK closes this generator, and the
                # nested ones must close with it now, stopping the harness, not whenever they are collected.
                async with contextlib.aclosing(self._turn(run, config, prompt)) as turn_events:
                    async for event in turn_events:
                        yield event
            except HarnessError as exc:
                yield events.failed(exc.code, exc.message, retryable=exc.retryable)

    async def _load_session(self, run: RunContext) -> _Stored:
        snap = run.state.get("conversation")
        if isinstance(snap, dict) and "_truncated" not in snap:
            # The host builds the snapshot when the run starts, after the conversation's previous run ended (one
            # run of a conversation at a time) and wrote these keys, so a whole one is current: no round trips.
            return _stored(snap)
        try:
            # Concurrently: this is on the path to starting the harness, and each read is a host round trip.
            session_id, working_directory, harness, usage_totals = await asyncio.gather(
                *(run.api.state_get("conversation", key) for key in (SESSION_KEY, WORKDIR_KEY, HARNESS_KEY, USAGE_KEY))
            )
            return _Stored(
                session_id=session_id,
                working_directory=working_directory,
                harness=harness,
                usage_totals=usage_totals,
            )
        except api_errors.AgentHostError:
            return _stored(snap if isinstance(snap, dict) else {}, readable=False)

    async def _save_session(self, run: RunContext, session_id: str, workspace: Workspace) -> list[pb.RunEvent]:
        out = []
        try:
            for key, value in (
                (SESSION_KEY, session_id),
                (WORKDIR_KEY, str(workspace.working_dir)),
                (HARNESS_KEY, self.driver.name),
            ):
                await run.api.state_set("conversation", key, value)
                out.append(events.state_updated("conversation", key))
        except api_errors.AgentHostError as exc:
            out.append(
                events.progress(
                    f"could not store the harness session ({exc.message}); the next message starts a new session"
                )
            )
        return out

    async def _turn(self, run: RunContext, config: HarnessConfig, prompt: str) -> AsyncIterator[pb.RunEvent]:
        # The binding's stored keys (RunContext.secrets) stand in for environment variables of the same name; the
        # runner process's own environment holds no provider key once the host sandboxes it.
        environ = {**os.environ, **run.secrets}
        install = self.driver.install(find_binary(self.driver, config, environ), environ.get("PATH", ""))
        bridge_env: dict[str, str] | None = None
        if config.mcp_bridge:
            bridge_env, why = bridge_credentials(run)
            if bridge_env is None:
                log.error("host MCP bridge not started for run %s: %s", run.run_id, why)
                yield events.progress(f"host MCP bridge not started: {why}")
            else:
                # Always set (Claude Code's ${VAR} expansion fails on an unset one); empty = no approvals.
                approvals = getattr(config, "approvals", None)
                bridge_env["AGENTHOST_APPROVALS"] = (
                    approvals.model_dump_json() if approvals is not None and approvals.enabled else ""
                )
        # A bridge served by the runner (over Claude Code's own pipes, or loopback HTTP) keeps the run's credentials
        # in this process: the harness gets neither the tool token nor the run API socket.
        in_runner = bridge_env is not None and config.mcp_transport in ("sdk", "http")
        reuse = _Reuse()
        spare_key: tuple[str, str] | None = None
        # The stored session is a few host round trips: read while the sandbox and the bridge are set up.
        loading = asyncio.create_task(self._load_session(run))
        await asyncio.sleep(0)  # lets it send its reads before the synchronous set-up below
        try:
            kept = await self.kept.take((run.bot_id, run.conversation_id))
            if (
                isinstance(config, ClaudeCodeConfig)
                and config.keep_warm_seconds > 0
                and config.max_budget_usd is None  # the CLI counts a budget over the process, not the message
                and (bridge_env is None or in_runner)  # a stdio bridge holds one run's token for its whole life
            ):
                reuse.keep_seconds = config.keep_warm_seconds
                reuse.grant = _grant(config, bridge_env)
                if kept is not None and kept.grant == reuse.grant:
                    reuse.kept, kept = kept, None
                if config.spare_process and config.process_sandbox:
                    spare_key = _spare_key(run, reuse.grant)
            elif (
                isinstance(config, CodexConfig)
                and config.spare_process
                and config.spare_seconds > 0
                and config.process_sandbox
                and (bridge_env is None or in_runner)  # a stdio bridge holds one run's token for its whole life
            ):
                # `codex exec` answers one prompt per process, so none is kept; a spare waits for a new
                # conversation's first prompt on stdin, its start-up done.
                reuse.grant = _grant(config, bridge_env)
                spare_key = _spare_key(run, reuse.grant)
            if kept is not None:
                await kept.stop()
            if spare_key is not None and reuse.kept is None:
                reuse.kept = await self._claim_spare(run, config, spare_key)
            workspace = self.workspaces.workspace(run.bot_id, run.conversation_id, workspace_root=config.workspace_root)
            sandbox: Sandbox | None = None
            if config.process_sandbox:
                sandbox = harness_sandbox(
                    workspace=workspace,
                    install=install.ro_paths,
                    # The run API socket only for a stdio bridge to use; without one the harness has no token for it.
                    host_address=bridge_env["AGENTHOST_HOST_ADDRESS"] if bridge_env and not in_runner else "",
                    data_dir=self.data_dir,
                    commands=config.command_walls(),
                )
                sandbox = await harness_egress(sandbox, config, self.driver.name)
            else:
                log.warning(
                    "running %s for run %s WITHOUT a sandbox (process_sandbox: false)", self.driver.name, run.run_id
                )
                yield events.progress("the harness runs without a sandbox (process_sandbox: false in the binding)")
            stored = await loading
            if not stored.readable:
                yield events.progress("conversation state is not readable for this run; using the run's state snapshot")

            resume_id: str | None = None
            if config.resume and stored.session_id:
                if stored.harness not in (None, self.driver.name):
                    yield events.progress(f"the stored session belongs to {stored.harness}; starting a new session")
                elif stored.working_directory not in (None, str(workspace.working_dir)):
                    yield events.progress("the working directory moved; starting a new session")
                else:
                    resume_id = str(stored.session_id)

            launch: Launch | None = None
            harness_bridge_env: dict[str, str] = {}
            if in_runner and bridge_env is not None:
                creds = bridge_env
                # Of this transport and tool list: the grant says so.
                reuse.bridge = reuse.kept.bridge if reuse.kept is not None else None
                if reuse.bridge is None:
                    reuse.bridge = await _new_bridge(config, creds)
                await reuse.bridge.attach(lambda: bridge_from_env(creds))
                launch, harness_bridge_env = _bridge_launch(reuse.bridge)
                sandbox = with_bridge(sandbox, reuse.bridge)
            elif bridge_env is not None:
                launch = BridgeLaunch()
                harness_bridge_env = bridge_env
            async with contextlib.aclosing(
                self._project_and_run(
                    run,
                    config,
                    prompt,
                    workspace,
                    install,
                    environ,
                    sandbox,
                    stored,
                    resume_id,
                    launch,
                    harness_bridge_env,
                    reuse,
                )
            ) as turn_events:
                async for event in turn_events:
                    yield event
        finally:
            if not loading.done():
                loading.cancel()
            elif not loading.cancelled():
                loading.exception()  # read, so a turn that failed before needing it leaves no unread error
            if reuse.kept is not None:  # taken, never used: the turn failed (or was cancelled) before its harness ran
                await reuse.kept.stop()
            if reuse.bridge is not None and reuse.started is None:
                # The turn is over, however it ended: the bridge, its sessions and their host calls go with it.
                await reuse.bridge.close()
            template = reuse.started or reuse.template
            if template is not None and spare_key is not None and spare_key not in self.spares:
                self._start_spare(spare_key, run, config, install, bridge_env, reuse.grant, template)

    async def _claim_spare(self, run: RunContext, config: HarnessConfig, key: tuple[str, str]) -> KeptHarness | None:
        """For a conversation's first message (it has no directory yet): the binding's spare, whose slot is then the
        conversation's directory."""
        root = config.workspace_root
        if not self.workspaces.is_new(run.bot_id, run.conversation_id, workspace_root=root):
            return None
        spare = await self.spares.take(key)
        if spare is None or spare.slot is None:
            return None
        if not self.workspaces.claim(run.bot_id, run.conversation_id, spare.slot, workspace_root=root):
            await spare.stop()
            return None
        return spare

    def _start_spare(
        self,
        key: tuple[str, str],
        run: RunContext,
        config: HarnessConfig,
        install: Install,
        creds: dict[str, str] | None,
        grant: str,
        started: TurnPlan,
    ) -> None:
        """Starts, in the background, a spare process for the binding's next new conversation (warm.py): as the
        turn's kept process started (`started`), but in a slot of its own, with a bridge of its own (listing the
        grant's tools, attached to no run) and a new session. Never in place of another binding's spare: with more
        bindings than room, spares go to those that got one first, rather than each message starting a process
        that evicts the one another message started."""
        if key in self._spares_starting or len(self.spares) + len(self._spares_starting) >= self.spares.capacity:
            return

        async def start() -> None:
            slot: SpareSlot | None = None
            bridge: RunnerBridge | None = None
            proc: HarnessProcess | None = None
            try:
                slot = self.workspaces.new_slot(run.bot_id, workspace_root=config.workspace_root)
                workspace = slot.workspace
                launch: Launch | None = None
                bridge_env: dict[str, str] = {}
                if creds is not None:
                    bridge = await _new_bridge(config, creds)
                    launch, bridge_env = _bridge_launch(bridge)
                self._project_startup(run, config, workspace, launch)
                sandbox = harness_sandbox(
                    workspace=workspace,
                    install=install.ro_paths,
                    host_address="",
                    data_dir=self.data_dir,
                    commands=config.command_walls(),
                )
                sandbox = with_bridge(await harness_egress(sandbox, config, self.driver.name), bridge)
                claude = self.driver.name == "claude-code"
                plan = dataclasses.replace(
                    started,
                    workspace=workspace,
                    resume_session_id=None,
                    # Codex names its thread itself, once its prompt has come.
                    new_session_id=str(uuid.uuid4()) if claude else None,
                    bridge=launch,
                    bridge_env=bridge_env,
                    stream_input=claude,
                )
                cmd = self.driver.command(plan)
                proc = HarnessProcess(
                    cmd.argv,
                    cwd=workspace.working_dir,
                    env=cmd.env,
                    keep_stdin=True,
                    interrupt_grace=config.interrupt_grace_seconds,
                    secrets=cmd.secrets,
                    sandbox=sandbox,
                )
                if isinstance(bridge, McpControl):
                    bridge.send = proc.send
                await proc.start()
                spare = KeptHarness(
                    proc,
                    bridge,
                    fingerprint=fingerprint(cmd.argv, cmd.env, workspace=workspace, sandbox=sandbox),
                    session_id=plan.new_session_id or "",
                    grant=grant,
                    slot=slot,
                )
                wait = config.spare_seconds if isinstance(config, CodexConfig) else config.keep_warm_seconds
                await self.spares.put(key, spare, wait)
            except BaseException as exc:
                if proc is not None:
                    await proc.stop(wind_down=False)
                if bridge is not None:
                    await bridge.close()
                if slot is not None:
                    slot.discard()
                if not isinstance(exc, Exception):
                    raise
                log.warning("no spare %s process for bot %s", self.driver.name, run.bot_id, exc_info=True)

        task = asyncio.create_task(start())
        self._spares_starting[key] = task
        task.add_done_callback(lambda _: self._spares_starting.pop(key, None))

    def _project_startup(
        self, run: RunContext, config: HarnessConfig, workspace: Workspace, launch: Launch | None
    ) -> tuple[list[str], UserMcp | None]:
        """Writes what the harness reads at start-up (projection.project_startup, the MCP config, the appended
        prompt); returns warnings worth a progress note and the binding's own MCP servers to start."""
        warnings = project_startup(
            run.context,
            config,
            workspace,
            harness=self.driver.name,  # type: ignore[arg-type]
            bridge_enabled=launch is not None,
        )
        user_mcp: UserMcp | None = None
        if config.mcp_servers:
            usable = []
            for server in config.mcp_servers:
                try:
                    plan_user_mcp([server], run.secrets)
                    usable.append(server)
                except McpServerError as exc:
                    warnings.append(f"MCP server {server.name} left out: {exc}")
            user_mcp = plan_user_mcp(usable, run.secrets) if usable else None
        if (launch is not None or user_mcp is not None) and self.driver.name == "claude-code":
            write_claude_mcp_config(workspace, launch, user_mcp.claude if user_mcp is not None else None)
        if isinstance(config, ClaudeCodeConfig) and config.append_system_prompt:
            write_runner_file(workspace, APPEND_PROMPT_FILE, config.append_system_prompt)
        return warnings, user_mcp

    async def _project_and_run(
        self,
        run: RunContext,
        config: HarnessConfig,
        prompt: str,
        workspace: Workspace,
        install: Install,
        environ: dict[str, str],
        sandbox: Sandbox | None,
        stored: _Stored,
        resume_id: str | None,
        launch: Launch | None,
        bridge_env: dict[str, str],
        reuse: _Reuse,
    ) -> AsyncIterator[pb.RunEvent]:
        write_context(
            run.context,
            workspace,
            harness=self.driver.name,  # type: ignore[arg-type]
            session_id=resume_id,
            bridge_enabled=launch is not None,
        )
        warnings, user_mcp = self._project_startup(run, config, workspace, launch)
        for warning in warnings:
            yield events.progress(warning)

        deadline = self._deadline(run, config)
        for attempt in (1, 2):
            turn = TurnState()
            new_id = str(uuid.uuid4()) if resume_id is None and self.driver.name == "claude-code" else None
            if new_id is not None and reuse.kept is not None and reuse.kept.slot is not None:
                new_id = reuse.kept.session_id  # a spare: its session was named when it started
            plan = TurnPlan(
                binary=install.exe,
                config=config,
                workspace=workspace,
                resume_session_id=resume_id,
                new_session_id=new_id,
                bridge=launch,
                bridge_env=bridge_env,
                inherited_env=environ,
                binary_env=install.env,
                stored_keys=frozenset(run.secrets),
                user_mcp=user_mcp,
                # Kept for the next message, or the bridge on the CLI's own pipes: both need stdin open.
                stream_input=reuse.keep_seconds > 0 or isinstance(launch, SdkBridgeLaunch),
            )
            if isinstance(self.driver, CodexDriver) and isinstance(config, CodexConfig):
                turn.model = self.driver.configured_model(config, workspace)
            emitted = False
            async with contextlib.aclosing(
                self._run_harness(plan, prompt, turn, deadline, run, stored, sandbox, reuse)
            ) as harness_events:
                async for item in harness_events:
                    emitted = emitted or item.WhichOneof("kind") != "state_updated"
                    yield item
            if turn.error is None or turn.error.code != "session_lost":
                return
            if attempt == 1 and not emitted:
                yield events.progress(
                    f"the harness no longer knows session {resume_id}; starting a new session for this conversation"
                )
                resume_id = None
                continue
            yield events.failed("session_lost", f"{self.driver.name} lost session {resume_id} mid-turn")
            return

    def _auth_failure(self, plan: TurnPlan, said: str) -> pb.RunEvent | None:
        """A failure that says which key is missing or was refused, and where to set it, in place of the
        harness's own words ("Not logged in · Please run /login" names neither the variable nor agenthost)."""
        problem = self.driver.auth_problem(said)
        if problem is None:
            return None
        name = self.driver.name
        key = plan.config.api_key_env or self.driver.default_key_env
        how = how_to_give_key(key, f"agenthost/{name}")
        if problem == "missing":
            if key in plan.inherited_env:
                return None  # the key was there: the harness means something else (its own login, a provider)
            message = f"{name} has no API key: {key} is not set for this binding. {how}."
        else:
            if key in plan.stored_keys:
                source = f"the stored key {key} (host key store)"
            elif key in plan.inherited_env:
                source = f"{key} from the runner process's environment"
            else:
                source = f"the harness's own credentials ({key} is not set for this binding)"
            message = f"the model API rejected {source} as invalid (HTTP 401). {how}."
        return events.failed("harness_auth", f"{message}\n{name} said: {said}")

    def _deadline(self, run: RunContext, config: HarnessConfig) -> float | None:
        limits = []
        if run.deadline_at:
            # The harness gets its interrupt grace inside the run's deadline, so the runner still reports the
            # timeout (and the usage so far) before the host's own deadline cuts the stream.
            limits.append(run.deadline_at - time.time() - DEADLINE_MARGIN - config.interrupt_grace_seconds)
        if config.timeout_seconds:
            limits.append(config.timeout_seconds)
        return asyncio.get_running_loop().time() + max(min(limits), 0.1) if limits else None

    async def _turn_usage(self, run: RunContext, turn: TurnState, stored: _Stored) -> list[pb.RunEvent]:
        """The usage event of this turn, turning a harness's running totals into the turn's share."""
        if turn.cumulative_usage is None:
            return [turn.usage] if turn.usage is not None else []
        previous = stored.usage_totals or {}
        totals = turn.cumulative_usage
        if previous.get("session_id") == turn.session_id:
            share = usage_since(totals, {k: int(v) for k, v in previous.items() if k != "session_id"})
        else:
            share = totals
        out = [usage_event(share, model=turn.model)]
        try:
            await run.api.state_set("conversation", USAGE_KEY, {"session_id": turn.session_id, **totals})
            out.append(events.state_updated("conversation", USAGE_KEY))
        except api_errors.AgentHostError:
            pass  # the next turn then reports the thread's totals; a skewed number, not a failed run
        return out

    async def _fit_tool_result(self, run: RunContext, event: pb.RunEvent) -> pb.RunEvent:
        """Keeps full fidelity for big tool results without big events: the whole result becomes an artifact and
        the event carries a preview plus its id (or just the preview, when the run may not create artifacts)."""
        if event.WhichOneof("kind") != "tool_finished" or len(event.tool_finished.result) <= MAX_INLINE_TOOL_RESULT:
            return event
        t = event.tool_finished
        full = t.result
        note = f"... [{len(full) - MAX_INLINE_TOOL_RESULT} more chars"
        artifact_id = ""
        try:
            ref = await run.api.artifact_create(
                full.encode(),
                name=f"tool-result-{t.tool_call_id or 'unknown'}.txt",
                mime_type="text/plain; charset=utf-8",
                metadata={"tool_name": t.tool_name, "tool_call_id": t.tool_call_id},
            )
            artifact_id = ref.artifact_id
            note += f"; full result in artifact {artifact_id}]"
        except api_errors.AgentHostError:
            note += "]"
        return events.tool_finished(
            t.tool_call_id,
            t.tool_name,
            full[:MAX_INLINE_TOOL_RESULT] + note,
            is_error=t.is_error,
            artifact_id=artifact_id,
        )

    async def _run_harness(
        self,
        plan: TurnPlan,
        prompt: str,
        turn: TurnState,
        deadline: float | None,
        run: RunContext,
        stored: _Stored,
        sandbox: Sandbox | None,
        reuse: _Reuse,
    ) -> AsyncIterator[pb.RunEvent]:
        cmd = self.driver.command(plan)
        # What the harness and its commands write to disk: the working dir and the harness home (TMPDIR too).
        budget = workspace_budget.Budget(
            plan.workspace.working_dir,
            plan.config.workspace_max_mib * workspace_budget.MIB,
            "workspace_max_mib",
            also=(plan.workspace.harness_dir,),
        )
        refusal = await asyncio.to_thread(budget.check)
        if refusal is not None:
            if reuse.kept is not None:
                await reuse.kept.proc.stop()
                reuse.kept = None
            raise WorkspaceQuotaError(f"message not sent to {self.driver.name}: {refusal}")
        over: list[str] = []
        stamp = ""
        # Only for a process that was or may be kept (a spare computes its own when it starts).
        if reuse.kept is not None or reuse.keep_seconds > 0:
            stamp = fingerprint(cmd.argv, cmd.env, workspace=plan.workspace, sandbox=sandbox)
        kept, reuse.kept = reuse.kept, None
        if kept is not None and (
            kept.fingerprint != stamp
            or kept.session_id != (plan.resume_session_id or plan.new_session_id or "")
            or not kept.proc.running
        ):
            # Something it read at start-up changed (or its session did): a new process resumes the session.
            # The bridge, already in this turn's MCP config, stays with the turn.
            await kept.proc.stop()
            kept = None
        control = reuse.bridge if isinstance(reuse.bridge, McpControl) else None
        if kept is not None:
            proc = kept.proc
            proc.forget_stderr()
            turn.cost_offset_usd = kept.cost_usd
        else:
            proc = HarnessProcess(
                cmd.argv,
                cwd=plan.workspace.working_dir,
                env=cmd.env,
                stdin_data=stdin_message(prompt) if plan.stream_input else prompt.encode(),
                keep_stdin=plan.stream_input,
                interrupt_grace=plan.config.interrupt_grace_seconds,
                secrets=cmd.secrets,
                sandbox=sandbox,
            )
            if control is not None:
                await control.restart()  # a new process opens a new MCP session (after a replaced one, a retry)
        if control is not None:
            control.send = proc.send
        queue: asyncio.Queue[pb.RunEvent | None] = asyncio.Queue(EVENT_QUEUE)

        async def pump() -> None:
            try:
                while (raw := await proc.next_event()) is not None:
                    if is_control(raw):
                        if control is not None:
                            control.receive(raw)  # answered by a task of its own, on the harness's stdin
                        continue
                    if plan.user_mcp is not None and raw.get("type") == "system" and raw.get("subtype") == "init":
                        proc.note_started()  # the binding's stdio servers run beside the harness for its life
                    for event in self.driver.map_event(raw, turn):
                        await queue.put(event)
                    if turn.session_id and not saved.is_set():
                        saved.set()
                        await queue.put(None)  # tells the consumer to persist the session now
                    if plan.stream_input and turn.finished:
                        break  # the process waits for the next message; its stdout goes on with it
            except HarnessError as exc:
                pump_errors.append(exc)
            finally:
                done.set()
                await queue.put(None)

        saved = asyncio.Event()
        done = asyncio.Event()
        pump_errors: list[HarnessError] = []
        timed_out = False
        session_stored = False
        keep = False
        _LIVE.add(proc)
        pump_task: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        try:
            if kept is not None and plan.stream_input:
                await proc.send(stdin_message(prompt))
            elif kept is not None:
                # A spare `codex exec -`: its prompt is all of its stdin.
                await proc.send(prompt.encode())
                await proc.end_input()
            else:
                await proc.start()
            pump_task = asyncio.create_task(pump())
            watcher = asyncio.create_task(_watch_budget(budget, proc, over))
            loop = asyncio.get_running_loop()
            while True:
                timeout = None if deadline is None else deadline - loop.time()
                try:
                    if timeout is not None and timeout <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    timed_out = True
                    break
                if item is not None:
                    yield await self._fit_tool_result(run, item)
                    continue
                if turn.session_id and not session_stored and turn.session_id != plan.resume_session_id:
                    session_stored = True
                    for event in await self._save_session(run, turn.session_id, plan.workspace):
                        yield event
                if done.is_set() and queue.empty():
                    break
            if timed_out:
                await proc.stop()
                # What the harness printed while winding down (often its last text) is still worth delivering;
                # its group is dead, so the pump reaches EOF at once.
                while not (done.is_set() and queue.empty()):
                    try:
                        item = await asyncio.wait_for(queue.get(), 5)
                    except TimeoutError:
                        break
                    if item is not None:
                        yield await self._fit_tool_result(run, item)
            keep = (
                reuse.keep_seconds > 0
                and turn.finished
                and turn.error is None
                and not (timed_out or pump_errors or over)
                and bool(turn.session_id)
                and proc.running
                # Nothing the model started may outlive its run: a turn that left a process in the sandbox (a
                # background command, a `setsid` escapee) ends its sandbox with it. Without a sandbox there is no
                # pid namespace to look into, so nothing is kept.
                and proc.left_running() == set()
            )
            if keep:
                assert turn.session_id is not None
                kept = KeptHarness(
                    proc,
                    reuse.bridge,
                    fingerprint=stamp,
                    session_id=turn.session_id,
                    grant=reuse.grant,
                    cost_usd=turn.cost_total_usd,
                )
                await self.kept.put((run.bot_id, run.conversation_id), kept, reuse.keep_seconds)
                reuse.started = plan
                exit_code = 0
            else:
                if plan.stream_input and not over:
                    await proc.end_input()  # it ends at the end of its input, as a one-message process does
                exit_code = await proc.wait()
                if turn.finished and turn.error is None and not (timed_out or pump_errors or over):
                    reuse.template = plan
        finally:
            if pump_task is not None and not pump_task.done():
                pump_task.cancel()
            if watcher is not None:
                watcher.cancel()
            if not keep:
                await proc.stop()
            _LIVE.discard(proc)

        stderr = proc.stderr_tail()
        if over:
            raise WorkspaceQuotaError(f"{self.driver.name} stopped: {over[0]}")
        if pump_errors:
            raise pump_errors[0]
        if timed_out:
            for event in await self._turn_usage(run, turn, stored):
                yield event
            yield events.failed(
                "deadline_exceeded",
                f"{self.driver.name} did not finish before the run's deadline; it was interrupted"
                + (f". stderr: {stderr}" if stderr else ""),
                retryable=True,
            )
            return
        if not turn.finished or turn.error is not None:
            if plan.resume_session_id and self.driver.session_lost(stderr, turn):
                turn.error = HarnessReportedError("session lost", code="session_lost")
                return
        if turn.error is not None:
            for event in await self._turn_usage(run, turn, stored):
                yield event
            message = turn.error.message
            if stderr and stderr not in message:
                message = f"{message}\nstderr: {stderr}"
            yield self._auth_failure(plan, message) or events.failed(
                turn.error.code, message, retryable=turn.error.retryable
            )
            return
        if not turn.finished:
            reason = stderr or turn.last_error_message or "no output"
            message = f"{self.driver.name} exited with code {exit_code} before finishing the turn: {reason}"
            yield self._auth_failure(plan, message) or events.failed("harness_crashed", message)
            return
        for event in await self._turn_usage(run, turn, stored):
            yield event
        if turn.final_text:
            yield events.message(turn.final_text)
        yield events.completed()


async def _watch_budget(budget: workspace_budget.Budget, proc: HarnessProcess, over: list[str]) -> None:
    """Stops the harness (its whole sandbox) once the turn's trees pass the budget, which ends the turn: the pump
    reaches the end of its output."""
    over.append(await workspace_budget.watch(budget))
    await proc.stop()


def _manifest(name: str, description: str, config_model: type[HarnessConfig]) -> RunnerManifest:
    return RunnerManifest(
        name=name,
        description=description,
        version=VERSION,
        capabilities=RunnerCapabilities(streaming=True, tool_calls=True, attachments=True, cancellation=True),
        config_schema=config_schema(config_model),
    )


class ClaudeCodeRunner(HarnessRunner):
    driver = ClaudeCodeDriver()
    manifest = _manifest(
        "claude-code",
        "Claude Code (claude -p) in a per-conversation working directory, resuming its session across messages",
        ClaudeCodeConfig,
    )


class CodexRunner(HarnessRunner):
    driver = CodexDriver()
    manifest = _manifest(
        "codex",
        "OpenAI Codex (codex exec) in a per-conversation working directory, resuming its thread across messages",
        CodexConfig,
    )
