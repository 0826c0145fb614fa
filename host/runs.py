"""The run orchestrator: one inbound event → one binding → one run, executed through its runner's `Run` RPC.

For every run, the RunManager: records the event, the user's turn and a queued run in one transaction; waits
its turn in the conversation (runs of one conversation execute one at a time, in arrival order); mints the run
token and freezes the grant; streams the runner's events, numbering, persisting (group-committed, never awaited
per event), projecting into the transcript and fanning them out to subscribers; and finally writes the outcome
and revokes the token. The final write is awaited before the terminal status is published, so a client that saw
a run finish can always read everything it produced. What a runner is handed at start is assembled by
run_context; what clients receive is buffered per subscriber by run_inbox.

Runs do not belong to the client that asked for them: a client that disconnects only unsubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from agenthost.host import limits
from agenthost.host.grants import ActiveRun, Grant, RunRegistry, hash_secret, new_token
from agenthost.host.keys import KeyStore
from agenthost.host.observability import Observer
from agenthost.host.run_context import ContextBuilder
from agenthost.host.run_inbox import Inbox, split_events
from agenthost.host.store.conversations import Conversations, NewItem
from agenthost.host.store.registry import Registry
from agenthost.host.store.runs import RunStore
from agenthost.host.store.state import StateStore
from agenthost.host.supervisor import PluginStartError, Supervisor, describe_exit
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import runner_pb2
from agenthost.protos.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 24 * 3600.0
MAX_INPUT_BYTES = 256 * 1024
MAX_ASSISTANT_TEXT = 4 * 1024 * 1024
_CONVERSATION_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,512}$")
_EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


def parse_runner_id(runner_id: str) -> tuple[str, str]:
    plugin_id, sep, name = runner_id.partition("/")
    if not sep or not plugin_id or not name:
        raise InvalidArgument(f"runner id must look like '<plugin>/<runner>', got {runner_id!r}")
    return plugin_id, name


@dataclass
class _RunState:
    """What the orchestrator accumulates while a run streams."""

    info: hpb.RunInfo
    active: ActiveRun | None = None
    seq: int = 0
    text_parts: list[str] = field(default_factory=list)
    text_len: int = 0
    final_message: str | None = None
    event_count: int = 0  # events the runner sent, and their serialized bytes (limits.RUN_MAX_EVENT*)
    event_bytes: int = 0
    terminal: pb.RunEvent | None = None
    subscribers: list[Inbox] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    cancel_reason: str = ""


class RunManager:
    def __init__(
        self,
        *,
        registry: Registry,
        runs: RunStore,
        conversations: Conversations,
        state: StateStore,
        grants: RunRegistry,
        supervisor: Supervisor,
        keys: KeyStore | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.keys = keys
        self.observer = observer or Observer()
        self.registry = registry
        self.runs = runs
        self.conversations = conversations
        self.contexts = ContextBuilder(conversations, state)
        self.grants = grants
        self.supervisor = supervisor
        self._live: dict[str, _RunState] = {}
        # Per-conversation FIFO of runs; an entry lives only while runs of that conversation are queued or running.
        self._conversation_locks: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}

    # ---- routing ----

    def route(self, bot_id: str, event_type: str, conversation_id: str) -> hpb.Binding:
        """Exactly one binding wins: the highest priority among those whose patterns match (ties are refused
        when bindings are created)."""
        for binding in self.registry.bindings(bot_id):
            if not fnmatch.fnmatchcase(event_type, binding.event_pattern):
                continue
            if binding.conversation_pattern and not fnmatch.fnmatchcase(conversation_id, binding.conversation_pattern):
                continue
            return binding
        raise FailedPrecondition(
            f"no binding of this bot matches event {event_type!r} in conversation {conversation_id!r};"
            " bind a runner with `agenthost bots bind`"
        )

    def manifest_for(self, runner_id: str) -> RunnerManifest:
        plugin_id, name = parse_runner_id(runner_id)
        plugin = self.registry.plugin(plugin_id)
        for raw in json.loads(plugin.manifests_json):
            if raw.get("name") == name:
                return RunnerManifest.model_validate(raw)
        raise NotFound(f"plugin {plugin_id} offers no runner {name!r}")

    # ---- entry point ----

    async def send(self, request: hpb.SendMessageRequest) -> AsyncIterator[hpb.SendMessageReply]:
        """Called by the AgentHost servicer for SendMessage. Yields run_started, event batches, run_finished."""
        bot = self.registry.bot(request.bot)
        conversation_id = request.conversation_id or "default"
        event_type = request.event_type or "message.received"
        if not _CONVERSATION_ID.match(conversation_id):
            raise InvalidArgument("conversation_id must be 1-512 characters without control characters")
        if not _EVENT_TYPE.match(event_type):
            raise InvalidArgument("event_type must look like 'message.received'")
        if len(request.text.encode()) > MAX_INPUT_BYTES:
            raise ResourceExhausted(f"message text is larger than {MAX_INPUT_BYTES} bytes")
        data_json = request.data_json or "{}"
        if len(data_json) > MAX_INPUT_BYTES:
            raise ResourceExhausted(f"event data is larger than {MAX_INPUT_BYTES} bytes")
        try:
            json.loads(data_json)
        except (ValueError, RecursionError):
            raise InvalidArgument("data_json is not valid JSON") from None
        binding = self.route(bot.bot_id, event_type, conversation_id)
        manifest = self.manifest_for(binding.runner_id)
        plugin_id, _ = parse_runner_id(binding.runner_id)
        plugin = self.registry.plugin(plugin_id)
        if not plugin.enabled:
            raise FailedPrecondition(f"plugin {plugin_id} is disabled")
        actor = request.actor if request.HasField("actor") else pb.Actor(actor_type="user", actor_id="local")
        if not actor.actor_id:
            actor.actor_id = "local"
        timeout = binding.timeout_seconds or DEFAULT_TIMEOUT
        now = time.time()
        info = hpb.RunInfo(
            run_id=f"run_{uuid.uuid4().hex}",
            bot_id=bot.bot_id,
            conversation_id=conversation_id,
            binding_id=binding.binding_id,
            runner_id=binding.runner_id,
            status="queued",
            created_at=now,
            deadline_at=now + timeout,
        )
        token = new_token("rt")
        grant = Grant.freeze(manifest, binding.resource_policy)

        def record(conn: sqlite3.Connection) -> pb.EventRecord:
            event = Conversations.insert_event(
                conn,
                bot_id=bot.bot_id,
                conversation_id=conversation_id,
                event_type=event_type,
                source=request.source or "api",
                actor=actor,
                text=request.text,
                data_json=data_json,
            )
            info.event_id = event.event_id
            if event_type.startswith("message.") and request.text:
                Conversations.insert_items(
                    conn,
                    bot_id=bot.bot_id,
                    conversation_id=conversation_id,
                    run_id=info.run_id,
                    event_id=event.event_id,
                    items=[NewItem(role="user", item_type="message", text=request.text)],
                )
            RunStore.insert(
                conn, info, plugin_id=plugin_id, token_hash=hash_secret(token), grant_json=json.dumps(grant.to_json())
            )
            return event

        event = await self.registry.db.write(record)
        st = _RunState(info=info)
        inbox = Inbox(info.run_id)
        st.subscribers.append(inbox)
        self._live[info.run_id] = st
        st.task = asyncio.create_task(
            self._execute(st, bot, binding, manifest, event, actor, token, grant, timeout), name=f"run:{info.run_id}"
        )
        started = hpb.RunInfo()
        started.CopyFrom(info)
        yield hpb.SendMessageReply(run_started=started)
        try:
            while True:
                for reply in await inbox.take():
                    if reply is None:
                        return
                    yield reply
        finally:
            with contextlib.suppress(ValueError):
                st.subscribers.remove(inbox)

    async def cancel(self, run_id: str) -> hpb.RunInfo:
        st = self._live.get(run_id)
        if st is None:
            info = self.runs.get(run_id)
            if info is None:
                raise NotFound(f"no run {run_id!r}")
            raise FailedPrecondition(f"run {run_id} already ended ({info.status})")
        st.cancel_reason = "cancelled by request"
        if st.task is not None:
            st.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(st.task)
        return self.runs.get(run_id) or st.info

    def in_flight(self) -> int:
        return len(self._live)

    async def shutdown(self) -> None:
        """Host stopping: in-flight runs end as interrupted; their tasks are awaited before the DB closes."""
        tasks = []
        for st in list(self._live.values()):
            st.cancel_reason = "host_shutdown"
            if st.task is not None:
                st.task.cancel()
                tasks.append(st.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- one run ----

    def _publish(self, st: _RunState, reply: hpb.SendMessageReply | None, size: int = 0) -> None:
        for inbox in st.subscribers:
            inbox.put(reply, size)

    async def _execute(
        self,
        st: _RunState,
        bot: hpb.Bot,
        binding: hpb.Binding,
        manifest: RunnerManifest,
        event: pb.EventRecord,
        actor: pb.Actor,
        token: str,
        grant: Grant,
        timeout: float,
    ) -> None:
        info = st.info
        plugin_id, runner_name = parse_runner_id(binding.runner_id)
        key = (bot.bot_id, info.conversation_id)
        lock, users = self._conversation_locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                info.status = "running"
                info.started_at = time.time()
                info.deadline_at = info.started_at + timeout
                await self.runs.mark_running(info.run_id, info.started_at, info.deadline_at)
                self.observer.run_started(info)
                tool_token = new_token("tt")  # never stored: it lives for this run's life only
                st.active = ActiveRun(
                    run_id=info.run_id,
                    bot_id=bot.bot_id,
                    conversation_id=info.conversation_id,
                    actor_id=actor.actor_id,
                    binding_id=binding.binding_id,
                    runner_id=binding.runner_id,
                    plugin_id=plugin_id,
                    grant=grant,
                    deadline_at=info.deadline_at,
                    token_hash=hash_secret(token),
                    tool_token_hash=hash_secret(tool_token),
                )
                self.grants.activate(st.active)
                context = self.contexts.build(st.active, bot, binding, manifest, event, actor)
                try:
                    secrets = self.keys.resolve(list(binding.resource_policy.keys)) if self.keys else {}
                except FailedPrecondition as exc:
                    self._set_outcome(st, "failed", "missing_key", exc.message)
                    return
                request = runner_pb2.RunRequest(
                    context=context, run_token=token, tool_token=tool_token, runner_name=runner_name, secrets=secrets
                )
                await self._stream(st, plugin_id, request)
        except asyncio.CancelledError:
            if st.cancel_reason == "host_shutdown":
                self._set_outcome(st, "interrupted", "host_shutdown", "the host stopped while this run was in progress")
            else:
                self._set_outcome(st, "cancelled", "cancelled", st.cancel_reason or "cancelled")
        except Exception as exc:  # a bug here must still end the run visibly, never leave it running
            log.exception("run %s failed in the host", info.run_id)
            self._set_outcome(st, "failed", "host_error", f"{type(exc).__name__}: {exc}")
        finally:
            users[0] -= 1
            if users[0] == 0:
                self._conversation_locks.pop(key, None)
            await asyncio.shield(self._finish(st))

    def _set_outcome(self, st: _RunState, status: str, code: str = "", message: str = "") -> None:
        if st.info.status in ("queued", "running"):
            st.info.status = status
            st.info.error_code = code
            st.info.error_message = message

    async def _stream(self, st: _RunState, plugin_id: str, request: runner_pb2.RunRequest) -> None:
        info = st.info
        try:
            pp = await self.supervisor.wait_ready(plugin_id, self.supervisor.policy.start_timeout)
        except PluginStartError as exc:
            self._set_outcome(st, "failed", "runner_unavailable", str(exc))
            return
        proc = pp.proc  # the process this run is on; a restart may replace pp.proc while we look
        remaining = info.deadline_at - time.time()
        call = pp.stub.Run(request, timeout=remaining)
        try:
            async for batch in call:
                self._ingest(st, batch)
                if st.terminal is not None:
                    break
                if self.registry.db.congested:
                    # Stop reading until the writer catches up: gRPC flow control then holds the runner back.
                    await self.registry.db.backpressure()
        except asyncio.CancelledError:
            call.cancel()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we were cancelled (CancelRun, shutdown)
            # The supervisor closed the channel under us: the runner process went away.
            await self._stream_broke(st, proc, "the runner's channel closed")
            return
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._set_outcome(
                    st,
                    "timed_out",
                    "deadline_exceeded",
                    f"the run passed its deadline of {info.deadline_at - info.started_at:.0f}s",
                )
            else:
                await self._stream_broke(st, proc, f"{code.name}: {exc.details()}")
            return
        finally:
            call.cancel()
        if st.terminal is None:
            self._set_outcome(st, "failed", "runner_protocol", "the runner ended its stream without a terminal event")

    async def _stream_broke(self, st: _RunState, proc: asyncio.subprocess.Process | None, detail: str) -> None:
        """The Run stream ended abnormally: if the process died, say how (the supervisor restarts it)."""
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 2.0)
            if proc.returncode is not None:
                self._set_outcome(
                    st,
                    "failed",
                    "runner_crashed",
                    f"runner process {describe_exit(proc.returncode, sandboxed=self.supervisor.sandboxed)} "
                    "during the run",
                )
                return
        self._set_outcome(st, "failed", "runner_unavailable", detail)

    def _ingest(self, st: _RunState, batch: pb.RunEventBatch) -> None:
        """Numbers, projects, persists (queued) and publishes one batch. Runs per batch, not per event, where it
        can: the hot path of streaming."""
        info = st.info
        now = time.time()
        items: list[NewItem] = []
        kept: list[pb.RunEvent] = []
        size = batch.ByteSize()
        if st.terminal is None:
            over = self._over_quota(st, len(batch.events), size)
            if over:
                log.warning("run %s: %s", info.run_id, over)
                batch = pb.RunEventBatch(events=[pb.RunEvent(failed=pb.Failed(code="quota_exceeded", message=over))])
                size = batch.ByteSize()
        st.event_count += len(batch.events)
        st.event_bytes += size
        for ev in batch.events:
            if st.terminal is not None:
                break  # nothing after the terminal event counts
            st.seq += 1
            ev.seq = st.seq
            ev.created_at = now
            kind = ev.WhichOneof("kind")
            kept.append(ev)
            if kind == "text_delta":
                if st.text_len < MAX_ASSISTANT_TEXT:
                    st.text_parts.append(ev.text_delta.text)
                    st.text_len += len(ev.text_delta.text)
            elif kind == "message":
                self._flush_text(st, items, ev.message.text)
            elif kind == "tool_started":
                self._flush_text(st, items)
                t = ev.tool_started
                items.append(
                    NewItem("assistant", "tool_call", "", t.arguments_json or "{}", t.tool_call_id, t.tool_name)
                )
            elif kind == "tool_finished":
                t = ev.tool_finished
                data = json.dumps({"artifact_id": t.artifact_id}) if t.artifact_id else "{}"
                items.append(NewItem("tool", "tool_result", t.result, data, t.tool_call_id, t.tool_name, t.is_error))
            elif kind == "compaction":
                c = ev.compaction
                data = json.dumps(
                    {"tokens_before": c.tokens_before, "tokens_after": c.tokens_after, "artifact_id": c.artifact_id}
                )
                items.append(NewItem("system", "compaction", c.summary, data))
            elif kind == "usage":
                u = info.usage
                u.input_tokens += ev.usage.input_tokens
                u.output_tokens += ev.usage.output_tokens
                u.cache_read_tokens += ev.usage.cache_read_tokens
                u.cache_write_tokens += ev.usage.cache_write_tokens
                u.cost_usd += ev.usage.cost_usd
                if ev.usage.model:
                    u.model = ev.usage.model[: limits.RUN_MAX_MODEL_CHARS]
            elif kind in ("completed", "failed"):
                st.terminal = ev
                self._flush_text(st, items)
                if kind == "completed":
                    self._set_outcome(st, "completed")
                elif ev.failed.code == "deadline_exceeded":
                    # The runner noticed the deadline before the host did: the same outcome as the host's own
                    # timeout, so a run's status does not depend on which side won the race.
                    self._set_outcome(st, "timed_out", "deadline_exceeded", ev.failed.message)
                else:
                    self._set_outcome(st, "failed", ev.failed.code or "runner_failed", ev.failed.message)
                if st.active is not None:
                    st.active.finished = True
        if not kept:
            return
        run_id = info.run_id
        conv = (info.bot_id, info.conversation_id, info.event_id)

        def persist(conn: sqlite3.Connection) -> None:
            RunStore.insert_events(conn, run_id, kept)
            if items:
                Conversations.insert_items(
                    conn, bot_id=conv[0], conversation_id=conv[1], run_id=run_id, event_id=conv[2], items=items
                )

        self.registry.db.enqueue(persist, weight=size)
        # Numbering adds a few bytes per event; a batch that may no longer fit one client message is cut.
        estimate = size + 16 * len(kept)
        if estimate <= limits.CLIENT_BATCH_BYTES:
            self._publish(st, hpb.SendMessageReply(events=pb.RunEventBatch(events=kept)), estimate)
            return
        sizes = [ev.ByteSize() + 6 for ev in kept]
        for part in split_events(kept, sizes):
            self._publish(st, hpb.SendMessageReply(events=pb.RunEventBatch(events=part)), sum(sizes[: len(part)]))
            sizes = sizes[len(part) :]

    @staticmethod
    def _over_quota(st: _RunState, events: int, size: int) -> str:
        """Why this batch would take the run past its event quotas, or "" if it fits."""
        if st.event_count + events > limits.RUN_MAX_EVENTS:
            return f"the runner sent more than RUN_MAX_EVENTS = {limits.RUN_MAX_EVENTS} events"
        if st.event_bytes + size > limits.RUN_MAX_EVENT_BYTES:
            return f"the runner sent more than RUN_MAX_EVENT_BYTES = {limits.RUN_MAX_EVENT_BYTES} bytes of events"
        return ""

    def _flush_text(self, st: _RunState, items: list[NewItem], final: str | None = None) -> None:
        """Streamed text becomes one assistant item when something else happens (a tool call, the end); a
        completed `message` supersedes the deltas it summarises."""
        text = final if final is not None else "".join(st.text_parts)
        st.text_parts.clear()
        st.text_len = 0
        if text:
            items.append(NewItem("assistant", "message", text))
            # RunInfo.text joins the run's messages; past RUN_MAX_TEXT_CHARS it is cut (the transcript has all).
            if st.final_message is None:
                st.final_message = text[: limits.RUN_MAX_TEXT_CHARS + 1]
            elif len(st.final_message) <= limits.RUN_MAX_TEXT_CHARS:
                st.final_message = (st.final_message + "\n\n" + text)[: limits.RUN_MAX_TEXT_CHARS + 1]

    async def _finish(self, st: _RunState) -> None:
        info = st.info
        self.grants.revoke(info.run_id)
        leftover: list[NewItem] = []
        self._flush_text(st, leftover)
        if info.status in ("queued", "running"):
            self._set_outcome(st, "failed", "host_error", "run ended without an outcome")
        info.finished_at = time.time()
        info.text = st.final_message or ""  # cut to RUN_MAX_TEXT_CHARS (with the marker) by RunStore.finish

        def write(conn: sqlite3.Connection) -> None:
            if leftover:
                Conversations.insert_items(
                    conn,
                    bot_id=info.bot_id,
                    conversation_id=info.conversation_id,
                    run_id=info.run_id,
                    event_id=info.event_id,
                    items=leftover,
                )
            RunStore.finish(conn, info)

        try:
            await self.registry.db.write(write)
        except Exception:
            log.exception("could not record the end of run %s", info.run_id)
        self._live.pop(info.run_id, None)
        self.observer.run_finished(info)
        self._publish(st, hpb.SendMessageReply(run_finished=info), info.ByteSize())
        self._publish(st, None)
