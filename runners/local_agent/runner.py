"""`LocalAgentRunner`: wires config, provider, session, memory, tools and the loop together for each run."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from agenthost.plugins.binding_paths import not_shown
from agenthost.plugins.manifest import RunnerCapabilities, RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors as host_errors
from agenthost.protos.wire import VERSION
from agenthost.runners.local_agent import images, memory
from agenthost.runners.local_agent.compaction import Compactor
from agenthost.runners.local_agent.config import ConfigError, LocalAgentConfig, ModelRoute
from agenthost.runners.local_agent.errors import ContextWindowUnknown, ProviderError
from agenthost.runners.local_agent.fallback import ModelFailure, ModelSlot, exhausted_message, falls_back
from agenthost.runners.local_agent.history import (
    CHECKPOINT_KEY,
    Checkpoint,
    find_trigger_seq,
    in_host_order,
    read_context,
    session_watermark,
)
from agenthost.runners.local_agent.loop import FAILED_CODES, AgentLoop, RunFailed
from agenthost.runners.local_agent.messages import UserMessage
from agenthost.runners.local_agent.providers import (
    build_provider,
    primary_route,
    resolve_context_window,
    split_model,
)
from agenthost.runners.local_agent.providers.base import Provider
from agenthost.runners.local_agent.session import Session, safe_name
from agenthost.runners.local_agent.subagents import NOT_FOR_SUBAGENTS, Subagents, prompt_block, subagent_types
from agenthost.runners.local_agent.tools import all_tools, build_registry
from agenthost.runners.local_agent.tools.base import ToolContext, ToolRegistry
from agenthost.runners.local_agent.tools.shell import ProcessLedger
from agenthost.runners.local_agent.tools.skills import skills_prompt
from agenthost.runners.local_agent.tools.tasks import STATE_KEY as TASKS_KEY
from agenthost.runners.local_agent.tools.tasks import summary_line as task_summary
from agenthost.runners.local_agent.tools.todo import STATE_KEY as TODO_KEY
from agenthost.runners.local_agent.tools.todo import render as render_todos
from agenthost.runners.sdk import events
from agenthost.runners.sdk.mcp_servers import ro_path_problems
from agenthost.runners.sdk.runner import RunContext, Runner

DEFAULT_SYSTEM_PROMPT = (
    "You are the agenthost local agent, a careful and capable assistant. You have tools to read, search and change "
    "files in this conversation's workspace, run shell commands there, search this conversation's full history, "
    "read stored artifacts, plan multi-step work (a todo checklist, or a task graph with dependencies for work "
    "that spans requests), and save durable memory about the user. Use tools "
    "instead of guessing; when a tool fails, read the error and adjust. Keep answers concise."
)


MAX_CACHED_SESSIONS = 256
log = logging.getLogger("agenthost.local_agent")


class LocalAgentRunner(Runner):
    manifest = RunnerManifest(
        name="local-agent",
        description="Built-in tool-using agent that talks to LLM providers (OpenAI-compatible, Anthropic, local "
        "servers) over HTTP and owns its working context; runs an offline demo model when none is configured.",
        version=VERSION,
        capabilities=RunnerCapabilities(streaming=True, tool_calls=True, attachments=True, cancellation=True),
        # No bootstrap: the runner owns its working context (its session, or history it pulls itself).
        config_schema=LocalAgentConfig.json_schema(),
    )

    def __init__(self, data_dir: Path, *, env: Mapping[str, str] | None = None) -> None:
        super().__init__(data_dir)
        self._env = env
        self._providers: dict[str, Provider] = {}
        self._windows: dict[str, int] = {}
        # Recently used sessions stay in memory; the rest are reloaded from disk when their conversation returns.
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.ledger = ProcessLedger(data_dir / "running")
        # The binding's own MCP servers' sessions (mcp_client.McpPool); created, with the SDK imported, only when
        # a run's binding configures servers.
        self._mcp: Any = None

    async def setup(self) -> None:
        # Commands a killed predecessor left running would otherwise live on as orphans.
        killed = self.ledger.sweep()
        if killed:
            log.warning("killed %d command process group(s) left running by a previous runner process", killed)

    async def close(self) -> None:
        providers, self._providers = list(self._providers.values()), {}
        for p in providers:
            await p.aclose()
        pool, self._mcp = self._mcp, None
        if pool is not None:
            await pool.close()

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Bind-time check of what a run would refuse later: the model's route, tool names, the workspace."""
        from pydantic import ValidationError

        try:
            parsed = LocalAgentConfig.model_validate(config)
        except ValidationError as exc:
            return [
                f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            ]
        problems = []
        if parsed.model is not None:
            try:
                split_model(parsed.model)
            except ConfigError as exc:
                problems.append(f"model: {exc}")
        chains = [("fallback_models", parsed.fallback_routes()), ("compaction", parsed.compaction.routes())]
        for where, routes in chains:
            for route in routes:
                try:
                    split_model(route.model)
                except ConfigError as exc:
                    problems.append(f"{where}: {exc}")
        if parsed.tools is not None:
            known = {t.name for t in all_tools()}
            unknown = sorted(set(parsed.tools) - known)
            if unknown:
                problems.append(f"tools: unknown tools {unknown}; available: {sorted(known)}")
        for sub in parsed.subagents:
            if sub.tools is not None:
                known = {t.name for t in all_tools()} - NOT_FOR_SUBAGENTS
                refused = sorted(set(sub.tools) - known)
                if refused:
                    problems.append(
                        f"subagents.{sub.name}.tools: {refused} cannot be given to a subagent; "
                        f"available: {sorted(known)}"
                    )
            if isinstance(sub.model, str):
                try:
                    split_model(sub.model)
                except ConfigError as exc:
                    problems.append(f"subagents.{sub.name}.model: {exc}")
        if parsed.workspace is not None and not Path(parsed.workspace).is_absolute():
            problems.append(f"workspace: {parsed.workspace!r} must be an absolute path")
        for server in parsed.mcp_servers:
            problems += ro_path_problems(server, self.data_dir)
        return problems

    async def list_models(self, config: dict[str, Any], secrets: dict[str, str]) -> list[dict[str, str]]:
        """The binding's model route and its fallbacks, each provider asked for its list (keys as a run gets
        them: the binding's secrets over the environment)."""
        from agenthost.runners.local_agent import catalog

        parsed = LocalAgentConfig.parse(config)
        env = {**(self._env if self._env is not None else os.environ), **secrets}
        return await catalog.list_models(parsed, env)

    def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        return self._guarded(run)

    async def _guarded(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        lock = self._locks.setdefault(conversation_key(run), asyncio.Lock())
        async with lock:  # one run at a time per conversation: the session is a single writer's file
            try:
                async for ev in self._run(run):
                    yield ev
            except RunFailed as exc:
                yield events.failed(exc.code, exc.message, retryable=exc.retryable)
            except ConfigError as exc:
                yield events.failed("config_error", str(exc))
            except ContextWindowUnknown as exc:
                yield events.failed("context_window_unknown", str(exc))
            except ProviderError as exc:  # from the probe, before the loop's own handling starts
                yield events.failed(FAILED_CODES[exc.kind], str(exc), retryable=exc.retryable)

    # ---- the pieces of a run ----

    def _provider(self, config: LocalAgentConfig, secrets: dict[str, str], route: ModelRoute | None = None) -> Provider:
        """`secrets`: the provider keys the run's binding names (RunContext.secrets), looked up under the same
        names as environment variables (OPENAI_API_KEY, api_key_env), ahead of the process's own environment.
        `route`: a fallback or summary model; default the binding's own model."""
        env = {**(self._env if self._env is not None else os.environ), **secrets}
        route = route or primary_route(config, env)
        # SecretStr dumps as asterisks, so two routes differing only in their inline key must be told apart by a
        # digest of the key itself (never the key: this string is a dict key, not a secret store). The config
        # part covers what the provider takes from it besides the route (timeout, thinking budget).
        secret = route.api_key.get_secret_value() if route.api_key is not None else ""
        material = "\0".join([secret, *(f"{k}={v}" for k, v in sorted(secrets.items()))])
        shared = f"{config.request_timeout_seconds}|{config.thinking_budget}"
        key = route.model_dump_json() + shared + hashlib.sha256(material.encode()).hexdigest()
        provider = self._providers.get(key)
        if provider is None:
            provider = build_provider(config, env, route=route)
            self._providers[key] = provider
        return provider

    def _fallback_slots(self, config: LocalAgentConfig, secrets: dict[str, str]) -> list[ModelSlot]:
        def slot(route: ModelRoute) -> ModelSlot:
            async def open_() -> tuple[Provider, int]:
                provider = self._provider(config, secrets, route)
                # The fallback's own window (its context_window, else the environment or a probe), never the
                # primary's: another model's window is a guess.
                window = await self._window(
                    provider, config.model_copy(update={"context_window": route.context_window})
                )
                return provider, window

            return ModelSlot(route.model, open_)

        return [slot(r) for r in config.fallback_routes()]

    async def _window(self, provider: Provider, config: LocalAgentConfig) -> int:
        key = f"{provider.full_model}|{getattr(provider, 'base_url', '')}|{config.context_window}"
        if key not in self._windows:
            self._windows[key] = await resolve_context_window(
                provider, config, self._env if self._env is not None else os.environ
            )
        return self._windows[key]

    def _workspace(self, config: LocalAgentConfig, conversation_id: str) -> Path:
        if not config.workspace:
            path = self.data_dir / "workspaces" / safe_name(conversation_id)
            path.mkdir(parents=True, exist_ok=True)
            return path
        root = Path(config.workspace)
        if not root.is_absolute():
            raise ConfigError(f"workspace {config.workspace!r} must be an absolute path")
        # Never made here: a binding's workspace the host did not bind would be made in the sandbox's scratch
        # memory, and every file the agent "wrote" would vanish with the process.
        reason = not_shown(str(root), "workspace")
        if reason is not None:
            raise ConfigError(reason)
        path = root / safe_name(conversation_id)
        path.mkdir(exist_ok=True)
        return path

    async def _session(
        self, run: RunContext, config: LocalAgentConfig, window: int
    ) -> tuple[Session, list[pb.RunEvent], int]:
        """The session this run continues, holding exactly the conversation before the triggering message, and
        that message's transcript seq (0 when the host did not say), so checkpoints can name host positions."""
        notes: list[pb.RunEvent] = []
        key = conversation_key(run)
        event = run.context.event
        # Reading the host transcript is bounded so the first model call does not have to compact what was pulled.
        budget = int(window * config.compaction_watermark * 0.8)
        session = self._sessions.get(key)
        if session is None:
            session, report = await asyncio.to_thread(Session.load, self.data_dir, key)
            if report.healed:
                log.warning("conversation %s: session healed on load: %s", run.conversation_id, report)
                notes.append(
                    events.progress(
                        f"session healed on load: {len(report.repair.synthesized)} interrupted tool call(s) closed, "
                        f"{len(report.repair.dropped)} orphan result(s) dropped, "
                        f"{report.skipped_lines} bad line(s) skipped"
                    )
                )
            if session is not None and not in_host_order(session.messages):
                log.warning("conversation %s: session out of the host's order; rebuilding it", run.conversation_id)
                notes.append(events.progress("session held messages out of order; rebuilt it from host history"))
                session = None
        trigger_seq = 0
        if session is None or not session.messages:
            checkpoint = Checkpoint.from_state(run.state.get("conversation", {}).get(CHECKPOINT_KEY))
            if checkpoint is None:
                try:
                    checkpoint = Checkpoint.from_state(await run.api.state_get("conversation", CHECKPOINT_KEY))
                except host_errors.AgentHostError:
                    checkpoint = None
            try:
                host = await read_context(
                    run.api,
                    run.conversation_id,
                    checkpoint=checkpoint,
                    trigger_event_id=event.event_id,
                    trigger_created_at=event.created_at,
                    token_budget=budget,
                )
                messages, trigger_seq = host.messages, host.trigger_seq
            except host_errors.AgentHostError as exc:
                messages = []
                notes.append(events.progress(f"could not read conversation history from the host: {exc.message}"))
            session = Session.create(self.data_dir, key, messages)
            if messages:
                notes.append(events.progress(f"rebuilt working context from host history ({len(messages)} messages)"))
        else:
            # The session is this runner's record, but a turn can be missing from it: a run that failed before its
            # message reached the session, or a runner killed in between. The host transcript has every turn.
            watermark = session_watermark(session.messages)
            try:
                if watermark is None:
                    trigger_seq = await find_trigger_seq(run.api, run.conversation_id, event.event_id)
                else:
                    host = await read_context(
                        run.api,
                        run.conversation_id,
                        checkpoint=None,
                        trigger_event_id=event.event_id,
                        trigger_created_at=event.created_at,
                        token_budget=budget,
                        after_seq=watermark,
                    )
                    trigger_seq = host.trigger_seq
                    if host.messages:
                        session.append(*host.messages)
                        notes.append(
                            events.progress(
                                f"added {len(host.messages)} message(s) the session missed from host history"
                            )
                        )
            except host_errors.AgentHostError:
                pass  # a binding without history access runs on its session alone
        self._sessions[key] = session
        self._sessions.move_to_end(key)
        while len(self._sessions) > MAX_CACHED_SESSIONS:
            self._sessions.popitem(last=False)
        return session, notes, trigger_seq

    def _system_basis(
        self, run: RunContext, config: LocalAgentConfig, workspace: Path, registry: ToolRegistry
    ) -> tuple[str, str]:
        """The configured part of the system prompt and a digest of everything the prompt is rendered from but
        state: a binding edit (prompt, skills, memory on/off, tool set) re-renders; state changes do not. Memory
        is the actor's: in a conversation with several people, a run by someone else re-renders, or one person's
        profile would be shown to the model answering another."""
        parts = [config.system_prompt or DEFAULT_SYSTEM_PROMPT, f"Workspace directory: {workspace}"]
        if "load_skill" in registry:
            parts.append(skills_prompt(config.skills))
        if "task" in registry:
            # Part of the frozen prefix, so a refresh after a compaction keeps listing the subagent types.
            parts.append(prompt_block(subagent_types(config, registry.names)))
        fixed = "\n\n".join(parts)
        actor = run.context.actor
        who = f"{actor.actor_type}\x1f{actor.actor_id}" if config.memory.enabled else ""
        material = "\0".join([fixed, config.memory.model_dump_json(), ",".join(registry.names), who])
        return fixed, hashlib.sha256(material.encode()).hexdigest()

    async def _system_prompt(self, run: RunContext, config: LocalAgentConfig, fixed: str, *, live: bool = False) -> str:
        """The configured part plus a snapshot of memory, the task graph and the todo list. `live` reads the
        conversation state from the host (a refresh mid-run) instead of the run's start snapshot."""
        parts = [fixed]
        if config.memory.enabled:
            try:
                state = await memory.load(run.api)
                block = memory.render_prompt(state, config.memory)
                if block:
                    parts.append(block)
            except host_errors.AgentHostError:
                pass  # memory needs actor state; a binding that does not grant it simply runs without
        conversation = dict(run.state.get("conversation", {}))
        if live:
            for key in (TASKS_KEY, TODO_KEY):
                try:
                    conversation[key] = await run.api.state_get("conversation", key)
                except host_errors.AgentHostError:
                    pass  # no read grant: the start snapshot is the best known
        tasks_line = task_summary(conversation.get(TASKS_KEY))
        if tasks_line:
            parts.append(tasks_line)
        todos = conversation.get(TODO_KEY)
        if isinstance(todos, list) and todos:
            try:
                parts.append("Current todo list:\n" + render_todos(todos))
            except (KeyError, TypeError):
                pass
        return "\n\n".join(parts)

    async def _frozen_system(
        self, run: RunContext, config: LocalAgentConfig, session: Session, workspace: Path, registry: ToolRegistry
    ) -> str:
        """The session's system prompt: rendered when the session starts (or its configuration changed), then the
        same bytes on every request until a compaction re-renders it. Memory, tasks and todos changed meanwhile
        reach the model through the tool results that changed them, not through a rewritten prompt: a prompt that
        moves every turn would void the provider's prompt cache for the whole conversation each time."""
        fixed, basis = self._system_basis(run, config, workspace, registry)
        if session.system and session.system_basis == basis:
            return session.system
        system = await self._system_prompt(run, config, fixed)
        session.freeze_system(system, basis)
        return system

    async def _run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        config = LocalAgentConfig.parse(run.config)
        provider = self._provider(config, run.secrets)
        slots = self._fallback_slots(config, run.secrets)
        try:
            window = await self._window(provider, config)
        except ProviderError as err:
            # The primary's window probe is its first request: a primary that is down shows here, before the loop.
            if not falls_back(err) or not slots:
                raise
            failures = [ModelFailure(provider.full_model, f"{err} (probing its context window)")]
            while True:
                if not slots:
                    raise RunFailed(FAILED_CODES[err.kind], exhausted_message(failures), retryable=True) from None
                slot = slots.pop(0)
                try:
                    provider, window = await slot.open()
                    break
                except (ConfigError, ContextWindowUnknown, ProviderError) as exc:
                    failures.append(ModelFailure(slot.label, f"could not be used: {exc}"))
            yield events.retry(
                len(failures),
                0.0,
                "; ".join(str(f) for f in failures) + f"; continuing on fallback model {provider.full_model}",
            )
        resources = run.context.resources
        registry = build_registry(
            config,
            granted_apis=list(resources.apis),
            granted_scopes=[_scope_name(s) for s in resources.state_scopes],
            window=window,
        )
        workspace = self._workspace(config, conversation_key(run))
        if config.mcp_servers:
            if self._mcp is None:
                from agenthost.runners.local_agent.mcp_client import McpPool

                self._mcp = McpPool(self.data_dir)
            mcp_tools, unavailable = await self._mcp.tools(config, run.secrets, workspace)
            for note in unavailable:
                yield events.progress(note)
            registry = registry.with_tools(mcp_tools)
        session, notes, trigger_seq = await self._session(run, config, window)
        for ev in notes:
            yield ev
        system = await self._frozen_system(run, config, session, workspace, registry)

        async def refresh_system() -> str:
            fixed, basis = self._system_basis(run, config, workspace, registry)
            text = await self._system_prompt(run, config, fixed, live=True)
            session.freeze_system(text, basis)
            return text

        ctx = ToolContext(
            workspace=workspace,
            api=run.api,
            conversation_id=run.conversation_id,
            run_id=run.run_id,
            config=config,
            ledger=self.ledger,
        )
        if "task" in registry:
            types = subagent_types(config, registry.names)
            primary = (provider, window)

            async def open_model(route: ModelRoute | None) -> tuple[Provider, int]:
                if route is None:
                    return primary
                sub = self._provider(config, run.secrets, route)
                return sub, await self._window(sub, config.model_copy(update={"context_window": route.context_window}))

            ctx.subagents = Subagents(types, registry, config, open_model, workspace)
        compactor = Compactor(
            window=window,
            watermark=config.compaction_watermark,
            keep_fraction=config.keep_recent_fraction,
            max_output_tokens=min(config.max_output_tokens, window // 4),
        )
        loop = AgentLoop(
            provider=provider,
            registry=registry,
            config=config,
            session=session,
            tool_ctx=ctx,
            system_prompt=system,
            compactor=compactor,
            deadline_at=run.deadline_at,
            stream_text=run.context.delivery.supports_streaming,
            fallbacks=slots,
            summarizers=[self._provider(config, run.secrets, r) for r in config.compaction.routes()],
            refresh_system=refresh_system,
            cache_key=prompt_cache_key(run) if config.prompt_cache else "",
        )
        text, parts = images.from_attachments(run.text, run.context.input.attachments or run.context.event.attachments)
        user = UserMessage(content=text, host_seq=trigger_seq, images=parts)
        async for ev in loop.run(user):
            yield ev


def conversation_key(run: RunContext) -> str:
    """A conversation is (bot, conversation id) to the host; one runner process serves many bots, and two bots'
    "default" conversations must not share a session or a workspace. \x1f cannot occur in either id."""
    return f"{run.bot_id}\x1f{run.conversation_id}"


def prompt_cache_key(run: RunContext) -> str:
    """A stable, opaque per-conversation key for OpenAI-compatible prompt caching: a digest, so neither the bot
    nor the conversation id reaches the provider."""
    return hashlib.sha256(b"agenthost.local_agent.prompt_cache\0" + conversation_key(run).encode()).hexdigest()[:32]


def _scope_name(value: int) -> str:
    try:
        return events.scope_name(value)
    except ValueError:
        return f"unknown-{value}"
