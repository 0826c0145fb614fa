"""The run orchestrator: one inbound event → one binding → one run, executed through its runner's `Run` RPC.

For every run, the RunManager: admits it or refuses it (see Admission: past what the host serves at once, runs
wait in `queued`; past the queue's bounds they are refused with RESOURCE_EXHAUSTED and a retry hint, before
anything is recorded); records the event, the user's turn and a queued run in one transaction; waits its turn
in the conversation (runs of one conversation execute one at a time, in arrival order) and for a host slot;
mints the run token and freezes the grant; streams the runner's events, numbering, persisting (group-committed,
never awaited per event), projecting into the transcript and fanning them out to subscribers; and finally writes
the outcome and revokes the token. The final write is awaited before the terminal status is published, so a
client that saw a run finish can always read everything it produced. What a runner is handed at start is
assembled by run_context; what clients receive is buffered per subscriber by run_inbox.

Runs do not belong to the client that asked for them: a client that disconnects only unsubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Literal, TypeVar, overload

import grpc
from google.protobuf.message import DecodeError

from agenthost.host import limits
from agenthost.host.access.grants import ActiveRun, Grant, RunRegistry, hash_secret, new_token
from agenthost.host.access.keys import KeyStore
from agenthost.host.ops.observability import Observer
from agenthost.host.processes.supervisor import PluginStartError, Supervisor
from agenthost.host.runs import attachments as attachment_checks
from agenthost.host.runs.admission import Admission, end_user_of
from agenthost.host.runs.approvals import Approvals
from agenthost.host.runs.child_runs import ChildRuns
from agenthost.host.runs.context import ContextBuilder
from agenthost.host.runs.inbox import Inbox, Published, split_events
from agenthost.host.runs.state import QueuedStart, RunState
from agenthost.host.runs.writer import RunWriter
from agenthost.host.store import faults, text_deltas
from agenthost.host.store.artifacts import ArtifactStore
from agenthost.host.store.conversations import Conversations, NewItem
from agenthost.host.store.registry import PluginRecord, Registry
from agenthost.host.store.runs import RunStore
from agenthost.host.store.state import StateStore
from agenthost.host.workers.hub import WorkerHub, WorkerLost
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import runner_pb2
from agenthost.protos.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from agenthost.protos.wire import IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_RULE

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300.0
MAX_INPUT_BYTES = 256 * 1024
MAX_ASSISTANT_TEXT = 4 * 1024 * 1024
# Matched whole (fullmatch: `$` would let a trailing newline through). An actor id, like a conversation id, ends up
# in logs, terminals, state keys and every event row.
_CONVERSATION_ID = re.compile(r"[^\x00-\x1f\x7f]{1,512}")
_ACTOR_TYPE = _EVENT_TYPE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
# Events only the host writes into a run (approvals, subagent links); a runner sending one is ignored, so a plugin
# cannot put a forged approval prompt in front of a person or link a run that is not its child.
HOST_ONLY_EVENTS = frozenset({"approval_requested", "approval_resolved", "subagent_started", "subagent_finished"})


def parse_runner_id(runner_id: str) -> tuple[str, str]:
    plugin_id, sep, name = runner_id.partition("/")
    if not sep or not plugin_id or not name:
        raise InvalidArgument(f"runner id must look like '<plugin>/<runner>', got {runner_id!r}")
    return plugin_id, name


_RUN_METHOD = "/agenthost.v1.Runner/Run"
_Record = TypeVar("_Record", hpb.Bot, hpb.Binding)


def _run_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryStreamMultiCallable:
    # Responses arrive as bytes (no deserializer): RunManager._ingest_wire reads them.
    return channel.unary_stream(_RUN_METHOD, request_serializer=runner_pb2.RunRequest.SerializeToString)


class _Recorded(Exception):  # noqa: N818 - not an error: a retried send's run already exists
    """Raised in a send's recording transaction: the sender's key names a run already recorded."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


def _same_message(
    earlier: tuple[str, str, str] | None, key: str, conversation_id: str, request: hpb.SendMessageRequest
) -> str | None:
    """The run of a repeated idempotency key, if its message is this one. A key reused for another text or another
    conversation is the client's mistake, refused: answering with the other message's run would pass it off as this
    one's answer."""
    if earlier is None:
        return None
    run_id, earlier_conversation, text = earlier
    if text != request.text or earlier_conversation != conversation_id:
        raise InvalidArgument(
            f"idempotency_key {key!r} was already used for another message (run {run_id}); a new message needs a"
            " new key"
        )
    return run_id


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
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self.keys = keys
        self.artifacts = artifacts  # where message attachments are stored; None refuses them
        self.observer = observer or Observer()
        self.registry = registry
        self.runs = runs
        self.conversations = conversations
        self.contexts = ContextBuilder(conversations, state)
        self.grants = grants
        self.supervisor = supervisor
        self._live: dict[str, RunState] = {}
        self.admission = Admission()
        self._closing = False
        # At start, until the host's plugins are supervised: runs are admitted and queued, none starts (`hold`).
        self._holding = False
        self._manifests: dict[tuple[str, str], RunnerManifest] = {}
        # The bot and binding records queued runs hold, one object per id while it is unchanged (see _held).
        self._held_records: dict[str, hpb.Bot | hpb.Binding] = {}
        self.approvals = Approvals(self.host_event)
        self.children = ChildRuns(self)
        # Runner workers on other machines (`serve --workers`): a runner no local plugin serves runs on one of them.
        self.workers: WorkerHub | None = None

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
        plugin_id, _ = parse_runner_id(runner_id)
        if self.workers is not None and self.registry.find_plugin(plugin_id) is None:
            offered = self.workers.manifest(runner_id)
            if offered is not None:
                return offered
        return self._installed_manifest(self.registry.plugin(plugin_id), runner_id)

    def _installed_manifest(self, plugin: PluginRecord, runner_id: str) -> RunnerManifest:
        _, name = parse_runner_id(runner_id)
        # Validating a manifest checks its config schema (a JSON Schema meta-validation): a burst of runs would
        # spend a millisecond each redoing it. Keyed by the stored text, so a reinstall is seen at once.
        key = (runner_id, plugin.manifests_json)
        cached = self._manifests.get(key)
        if cached is not None:
            return cached
        for raw in json.loads(plugin.manifests_json):
            if raw.get("name") == name:
                manifest = RunnerManifest.model_validate(raw)
                if len(self._manifests) >= 256:
                    self._manifests.clear()
                self._manifests[key] = manifest
                return manifest
        raise NotFound(f"plugin {plugin.plugin_id} offers no runner {name!r}")

    def _held(self, record_id: str, record: _Record) -> _Record:
        """`record`, or an equal one a queued run already holds: every send reads its bot and binding afresh, and
        thousands of runs queued on one binding would each keep a copy (a workers' binding carries its pinned
        manifest, kilobytes). Shared records are read, never changed. An edited record is a new entry; the
        table is bounded like the manifests'."""
        key = f"{type(record).__name__}:{record_id}"
        kept = self._held_records.get(key)
        if kept is not None and type(kept) is type(record) and kept == record:
            return kept
        if len(self._held_records) >= 256:
            self._held_records.clear()
        self._held_records[key] = record
        return record

    def binding_manifest(self, binding: hpb.Binding, plugin: PluginRecord | None) -> RunnerManifest:
        """The manifest a run of `binding` is granted from. A runner the host runs itself: its installed record
        (`plugin`, the caller's read of its plugin's row: one read a send, not four). A runner only workers offer
        (`plugin` None): the one pinned when the binding was made, never what a worker offers now (a compromised
        worker offering the same runner id with wider permissions widens nothing)."""
        if plugin is not None:
            return self._installed_manifest(plugin, binding.runner_id)
        if not binding.manifest_json:
            raise FailedPrecondition(
                f"binding {binding.binding_id} runs {binding.runner_id} on workers but was made before bindings kept"
                f" the manifest they were made with; update it (`agenthost bots update-binding {binding.binding_id}`)"
                " or bind it again, to pin the permissions its runs get"
            )
        key = (binding.runner_id, binding.manifest_json)
        cached = self._manifests.get(key)
        if cached is None:
            cached = RunnerManifest.model_validate_json(binding.manifest_json)
            if len(self._manifests) >= 256:
                self._manifests.clear()
            self._manifests[key] = cached
        return cached

    # ---- entry point ----

    @overload
    def send(
        self,
        request: hpb.SendMessageRequest,
        *,
        origin: str = "",
        trusted: bool = False,
        own_conversation: bool = False,
        start_refusal: str | None = None,
        encoded: Literal[False] = False,
    ) -> AsyncIterator[hpb.SendMessageReply]: ...

    @overload
    def send(
        self,
        request: hpb.SendMessageRequest,
        *,
        origin: str = "",
        trusted: bool = False,
        own_conversation: bool = False,
        start_refusal: str | None = None,
        encoded: bool,
    ) -> AsyncIterator[hpb.SendMessageReply | bytes]: ...

    async def send(
        self,
        request: hpb.SendMessageRequest,
        *,
        origin: str = "",
        trusted: bool = False,
        own_conversation: bool = False,
        start_refusal: str | None = None,
        encoded: bool = False,
    ) -> AsyncIterator[hpb.SendMessageReply | bytes]:
        """Called by the AgentHost servicer for SendMessage, and by the HTTP gateway. Yields `queued` (if the run
        must wait for a slot or its conversation's turn) or at once `run_started`, then event batches, then
        run_finished (see hpb.SendMessageReply). Raises ResourceExhausted (with `retry_after_ms`) before recording
        anything when the run queue is full. `origin` is the caller's credential name (ActiveRun.origin), recorded
        on the event and the run; `trusted`: it is an admin credential, with no sender share of the queue.
        `own_conversation`: the conversation must be new or one `origin` started; PermissionDenied otherwise.
        `start_refusal`: the conversation must exist, and if not, this is why (credentials.Principal.start_refusal).
        `encoded`: event batches the host numbered as bytes come as a serialized SendMessageReply, for a gRPC
        stream to send as they are (see Inbox.take)."""
        # The work of taking the message is a coroutine of its own: this generator lives as long as the client
        # holds the stream (a queued run may wait minutes), and what the recording needed (the frozen grant, the
        # plugin row, the closure's cells) must not live with it.
        accepted = await self._accept(request, origin, trusted, own_conversation, start_refusal)
        if isinstance(accepted, str):  # a retried send: the run its first attempt recorded
            async for reply in self._follow(accepted, encoded):
                yield reply
            return
        st, inbox, first = accepted
        del accepted
        if first is not None:  # it waits (or ended waiting): the client hears so now, not when a slot frees
            yield first
            del first
        async for reply in self._drain(st, inbox, encoded):
            yield reply

    async def _accept(
        self,
        request: hpb.SendMessageRequest,
        origin: str,
        trusted: bool,
        own_conversation: bool,
        start_refusal: str | None,
    ) -> tuple[RunState, Inbox, hpb.SendMessageReply | None] | str:
        """send's admission and recording: the recorded run, its first subscriber, and its `queued` reply (None when
        it started at once: its run_started is in the inbox already); or the id of the run a retried send's first
        attempt recorded, to follow instead."""
        if self._closing:
            raise Unavailable("the host is stopping; send again once it is back")
        bot = self.registry.bot(request.bot)
        conversation_id = request.conversation_id or "default"
        event_type = request.event_type or "message.received"
        if not _CONVERSATION_ID.fullmatch(conversation_id):
            raise InvalidArgument("conversation_id must be 1-512 characters without control characters")
        if not _EVENT_TYPE.fullmatch(event_type):
            raise InvalidArgument("event_type must look like 'message.received'")
        text_bytes = len(request.text.encode())
        if text_bytes > MAX_INPUT_BYTES:
            raise ResourceExhausted(f"message text is larger than {MAX_INPUT_BYTES} bytes")
        data_json = request.data_json or "{}"
        if len(data_json) > MAX_INPUT_BYTES:
            raise ResourceExhausted(f"event data is larger than {MAX_INPUT_BYTES} bytes")
        try:
            json.loads(data_json)
        except (ValueError, RecursionError):
            raise InvalidArgument("data_json is not valid JSON") from None
        key = request.idempotency_key
        if key and not IDEMPOTENCY_KEY.fullmatch(key):
            raise InvalidArgument(f"idempotency_key must be {IDEMPOTENCY_KEY_RULE}")
        if key:
            # A retried send: the run its first attempt recorded, followed instead of a second run. Keys are the
            # sender's own (per bot and credential), so no one reaches another sender's run by its key.
            earlier = _same_message(
                RunStore.by_key(self.registry.db.reader, bot.bot_id, origin, key), key, conversation_id, request
            )
            if earlier is not None:
                return earlier
        files = attachment_checks.check(list(request.attachments))
        check = own_conversation or start_refusal is not None
        if check:  # early, before attachments are stored; checked again in the recording transaction
            self._check_starter(
                self.registry.db.reader, bot.bot_id, conversation_id, origin, own_conversation, start_refusal
            )
        if files and self.artifacts is None:
            raise FailedPrecondition("this host stores no attachments")
        binding = self.route(bot.bot_id, event_type, conversation_id)
        plugin_id, _ = parse_runner_id(binding.runner_id)
        plugin = self.registry.find_plugin(plugin_id)  # None: a runner workers offer (its manifest pinned)
        manifest = self.binding_manifest(binding, plugin)
        if plugin is not None and not plugin.enabled:
            raise FailedPrecondition(f"plugin {plugin_id} is disabled")
        actor = request.actor if request.HasField("actor") else pb.Actor(actor_type="user", actor_id="local")
        if not actor.actor_id:
            actor.actor_id = "local"
        if not _CONVERSATION_ID.fullmatch(actor.actor_id) or not _ACTOR_TYPE.fullmatch(actor.actor_type or "user"):
            raise InvalidArgument(
                "actor: actor_id must be 1-512 characters without control characters, actor_type like 'user'"
            )
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
            origin=origin,
        )
        token = new_token("rt")
        grant = Grant.freeze(manifest, binding.resource_policy)
        file_bytes = sum(len(f.data) for f in files)
        if files:
            # Checked against rows already written: messages recorded concurrently may each pass, so the quota can
            # be overshot by at most RUNS_MAX_QUEUED_PER_CONVERSATION messages' attachments.
            assert self.artifacts is not None
            self.artifacts.check_conversation_room(bot.bot_id, conversation_id, file_bytes)
        refs: list[pb.ArtifactRef] = []

        def record(conn: sqlite3.Connection) -> pb.EventRecord:
            if key:  # checked again here, where writes are serialized: two attempts racing record one run
                earlier = _same_message(RunStore.by_key(conn, bot.bot_id, origin, key), key, conversation_id, request)
                if earlier is not None:
                    raise _Recorded(earlier)
            if check:
                self._check_starter(conn, bot.bot_id, conversation_id, origin, own_conversation, start_refusal)
            for ref, f in zip(refs, files, strict=True):
                ArtifactStore.insert_row(conn, ref, bot.bot_id, data=f.data)
            event = Conversations.insert_event(
                conn,
                bot_id=bot.bot_id,
                conversation_id=conversation_id,
                event_type=event_type,
                source=request.source or "api",
                actor=actor,
                text=request.text,
                data_json=data_json,
                attachments=refs,
                origin=origin,
            )
            info.event_id = event.event_id
            if event_type.startswith("message.") and (request.text or refs):
                self.conversations.insert_items(
                    conn,
                    bot_id=bot.bot_id,
                    conversation_id=conversation_id,
                    run_id=info.run_id,
                    event_id=event.event_id,
                    items=[NewItem(role="user", item_type="message", text=request.text, attachments=refs)],
                    event_seq=event.seq,
                )
            RunStore.insert(
                conn,
                info,
                plugin_id=plugin_id,
                token_hash=hash_secret(token),
                grant_json=json.dumps(grant.to_json()),
                origin=origin,
                idempotency_key=key,
            )
            return event

        conversation = (bot.bot_id, conversation_id)
        input_bytes = text_bytes + len(data_json.encode()) + file_bytes
        share = "" if trusted else origin
        end_user = end_user_of(share, actor.actor_id)
        self.admission.reserve(bot.bot_id, conversation, input_bytes, share, end_user=end_user)
        try:
            if files:
                refs.extend(await self._store_attachments(files, conversation_id, info.run_id))
            event = await self.registry.db.write(record)
        except _Recorded as recorded:
            self.admission.release(bot.bot_id, conversation, input_bytes, share, end_user)
            return recorded.run_id
        except BaseException:
            self.admission.release(bot.bot_id, conversation, input_bytes, share, end_user)
            raise
        st = RunState(info=info)
        bot, binding = self._held(bot.bot_id, bot), self._held(binding.binding_id, binding)
        st.start = QueuedStart(
            bot, binding, manifest, event, actor, token, timeout, input_bytes, origin, share, end_user
        )
        inbox = Inbox(info.run_id)
        st.subscribers.append(inbox)
        self._live[info.run_id] = st
        place = self.admission.enqueue(st)
        queued = hpb.RunQueued(waiting_on=place.waiting_on)
        if trusted or place.waiting_on == "conversation":
            # A place in the host's line counts other senders' runs and bots: their load is not a narrow key's to
            # learn. A conversation's line holds only runs its sender may see.
            queued.position = place.position
            queued.bots_waiting = place.bots_waiting
        queued.run.CopyFrom(info)
        if self._closing:  # the host began stopping while the run was being recorded
            self._leave_queued(st)
        else:
            self._pump()  # a run given a slot at once has its run_started in the inbox already
        return st, inbox, hpb.SendMessageReply(queued=queued) if st.task is None else None

    @staticmethod
    async def _drain(st: RunState, inbox: Inbox, encoded: bool) -> AsyncIterator[hpb.SendMessageReply | bytes]:
        """A subscriber's replies until the run's stream ends (or the subscriber leaves)."""
        try:
            while True:
                for reply in await inbox.take(encoded=encoded):
                    if reply is None:
                        return
                    yield reply
        finally:
            with contextlib.suppress(ValueError):
                st.subscribers.remove(inbox)

    async def _follow(self, run_id: str, encoded: bool) -> AsyncIterator[hpb.SendMessageReply | bytes]:
        """A retried send's answer: the run its first attempt recorded. Live, it is followed from now (`queued` or
        `run_started` first, then what it streams from here on; what it streamed before is in `runs show
        --events`); ended, its outcome."""
        st = self._live.get(run_id)
        if st is None:
            info = self.runs.get(run_id)
            if info is None:  # recorded by a transaction that has not committed yet cannot be: writes are serialized
                raise NotFound(f"no run {run_id!r}")
            if info.status in ("queued", "running"):
                # Not this host's to follow (left by a host that stopped, not yet resumed): it is still accepted.
                yield hpb.SendMessageReply(queued=hpb.RunQueued(waiting_on="host", run=info))
                return
            yield hpb.SendMessageReply(run_finished=info)
            return
        inbox = Inbox(run_id)
        st.subscribers.append(inbox)
        info = hpb.RunInfo()
        info.CopyFrom(st.info)
        if st.task is None:
            yield hpb.SendMessageReply(queued=hpb.RunQueued(waiting_on="host", run=info))
        else:
            yield hpb.SendMessageReply(run_started=info)
        async for reply in self._drain(st, inbox, encoded):
            yield reply

    @staticmethod
    def _check_starter(
        conn: sqlite3.Connection, bot_id: str, conversation_id: str, origin: str, own: bool, start_refusal: str | None
    ) -> None:
        """`own`: refuses a message into a conversation someone other than `origin` started (or a host before
        migration _V9 recorded, sender unknown): the run would read that conversation's history to answer it.
        `start_refusal`: refuses to start the conversation, saying why (credentials.Principal.start_refusal); to an
        `own` caller also a reserved name another sender started, in the same words: "started by another sender"
        there told an own-only key that a name it may not start exists (that a key's end user, a keyed request or a
        chat had talked to the bot)."""
        starter = Conversations.starter(conn, bot_id, conversation_id)
        grant = (
            " (an operator may grant a send credential all of its bots' conversations: `agenthost credentials"
            " create NAME --bot BOT --all-conversations`)"
        )
        if start_refusal is not None and (starter is None or (own and starter != origin)):
            raise PermissionDenied(start_refusal + (grant if own else ""))
        if own and starter is not None and starter != origin:
            raise PermissionDenied(
                f"conversation {conversation_id[:64]!r} was started by another sender; {origin!r} may write only"
                f" into conversations it started: name a new one{grant}"
            )

    async def _store_attachments(
        self, files: list[attachment_checks.CheckedAttachment], conversation_id: str, run_id: str
    ) -> list[pb.ArtifactRef]:
        """Stores the bytes of checked attachments; their rows are written with the event, in its transaction, so
        a message that is not recorded leaves no artifact anyone can name. They belong to the conversation and
        carry the id of the run the message starts."""
        assert self.artifacts is not None
        refs = []
        for f in files:
            sha = await asyncio.to_thread(self.artifacts.store_object, f.data)
            refs.append(
                pb.ArtifactRef(
                    artifact_id=f"art_{uuid.uuid4().hex}",
                    name=f.name,
                    mime_type=f.mime_type,
                    size_bytes=len(f.data),
                    sha256=sha,
                    conversation_id=conversation_id,
                    run_id=run_id,
                    created_at=time.time(),
                    metadata_json='{"attachment": true}',
                )
            )
        return refs

    async def cancel(self, run_id: str) -> hpb.RunInfo:
        if self.children.get(run_id) is not None:
            return await self.children.cancel(run_id)
        st = self._live.get(run_id)
        if st is None:
            info = self.runs.get(run_id)
            if info is None:
                raise NotFound(f"no run {run_id!r}")
            raise FailedPrecondition(f"run {run_id} already ended ({info.status})")
        if st.task is None:  # still queued: it ends without ever reaching a runner
            await asyncio.shield(self._end_queued(st, "cancelled", "cancelled", "cancelled by request while queued"))
            return self.runs.get(run_id) or st.info
        st.cancel_reason = "cancelled by request"
        st.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(st.task)
        if st.ending is not None:
            await asyncio.shield(st.ending)
        return self.runs.get(run_id) or st.info

    def in_flight(self) -> int:
        return len(self._live)

    def host_event(self, run_id: str, event: pb.RunEvent) -> bool:
        """Writes an event of the host's own (an approval) into a running run's stream: numbered, persisted and
        published like the runner's. False when the run is not running or has already ended."""
        st = self._live.get(run_id)
        if st is None or st.task is None or st.terminal is not None:
            return False
        self._ingest_batch(st, pb.RunEventBatch(events=[event]), from_host=True)
        return True

    def running_state(self, run_id: str) -> RunState | None:
        """A run that is executing and has not begun to end: the only kind that may open a child run."""
        st = self._live.get(run_id)
        if st is None or st.task is None or st.ending is not None or st.info.status != "running":
            return None
        return st

    async def shutdown(self) -> None:
        """Host stopping: in-flight runs end as interrupted; their ends are awaited before the DB closes. Queued
        runs stay `queued` in the database: the next host on it (after a restart, or a standby taking over) runs
        them (resume_queued). No queued run starts here from now on."""
        self._closing = True
        states = list(self._live.values())
        tasks: list[asyncio.Future[None]] = []
        for st in states:
            st.cancel_reason = "host_shutdown"
            if st.task is not None:
                st.task.cancel()
                tasks.append(st.task)
            elif st.ending is None:
                self._leave_queued(st)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(st.ending for st in states if st.ending is not None), return_exceptions=True)

    def _leave_queued(self, st: RunState) -> None:
        """A queued run left to the next host (the host is stopping): out of this host's queue, its row untouched,
        and its senders told it was accepted and will run, not that it ended."""
        start, st.start = st.start, None
        self.admission.remove(st)
        if start is not None:
            self.admission.release(
                st.info.bot_id,
                (st.info.bot_id, st.info.conversation_id),
                start.input_bytes,
                start.share,
                start.end_user,
            )
        self._live.pop(st.info.run_id, None)
        for inbox in st.subscribers:
            inbox.end_with(
                Unavailable(
                    f"the host stopped before run {st.info.run_id} started; it stays queued and runs, in its turn,"
                    f" once a host serves this data again (see `agenthost runs show {st.info.run_id}`)"
                )
            )

    def hold(self) -> None:
        """No run starts until `release`: the host calls this before it opens its sockets, so the queued runs a
        previous host left (resume_queued) are in their conversations' lines before any new message is, and a
        run never starts before its plugin is supervised."""
        self._holding = True

    def release(self) -> None:
        """Runs start again, in the order they were admitted."""
        self._holding = False
        self._pump()

    async def resume_queued(self) -> int:
        """At start: the runs a previous host accepted and left `queued` (it stopped, or died and a standby took
        over) join this host's queue in their arrival order: nothing accepted is lost. Each gets a fresh run
        token. One that can no longer start (its bot, binding or runner gone, its plugin disabled) ends `failed`
        with code `runner_unavailable`, saying why. A runner only workers offer needs no worker connected yet:
        its binding's pinned manifest is the one its run is granted from, as at send. Returns how many rejoined.
        Called before the host takes new messages (with `hold`), so a conversation's messages keep their order."""
        resumed: list[tuple[RunState, str]] = []
        unstartable: list[hpb.RunInfo] = []
        for info in self.runs.queued_runs():
            try:
                bot = self.registry.bot(info.bot_id)
                binding = self.registry.binding(info.binding_id)
                plugin_id, _ = parse_runner_id(binding.runner_id)
                plugin = self.registry.find_plugin(plugin_id)
                manifest = self.binding_manifest(binding, plugin)
                if plugin is not None and not plugin.enabled:
                    raise FailedPrecondition(f"plugin {plugin_id} is disabled")
                event = self.conversations.get_event(info.event_id)
                if event is None:
                    raise NotFound(f"its message {info.event_id} is gone")
            except (NotFound, FailedPrecondition, InvalidArgument) as exc:
                info.status, info.error_code, info.finished_at = "failed", "runner_unavailable", time.time()
                info.error_message = f"the host restarted and this queued run could not start: {exc.message}"
                unstartable.append(info)
                continue
            input_bytes = (
                len(event.text.encode()) + len(event.data_json.encode()) + sum(a.size_bytes for a in event.attachments)
            )
            token = new_token("rt")
            timeout = binding.timeout_seconds or DEFAULT_TIMEOUT
            st = RunState(info=info, resumed=True)
            end_user = end_user_of(info.origin, event.actor.actor_id)
            st.start = QueuedStart(
                bot,
                binding,
                manifest,
                event,
                event.actor,
                token,
                timeout,
                input_bytes,
                info.origin,
                info.origin,
                end_user,
            )
            resumed.append((st, hash_secret(token)))

        def record(conn: sqlite3.Connection) -> None:
            for st, token_hash in resumed:
                RunStore.set_token(conn, st.info.run_id, token_hash)
            for info in unstartable:
                RunStore.finish(conn, info)

        if resumed or unstartable:
            await self.registry.db.write(record)
        for info in unstartable:
            log.warning("queued run %s could not resume: %s", info.run_id, info.error_message)
        for st, _ in resumed:
            assert st.start is not None
            key = (st.info.bot_id, st.info.conversation_id)
            start = st.start
            self.admission.reserve(
                st.info.bot_id, key, start.input_bytes, start.share, end_user=start.end_user, accepted=True
            )
            self._live[st.info.run_id] = st
            self.admission.enqueue(st)
        self._pump()
        return len(resumed)

    # ---- admission ----

    def _pump(self) -> None:
        """Starts queued runs while slots are free. Called whenever a run is queued or leaves a slot."""
        if self._closing or self._holding:
            return
        while (st := self.admission.next_to_start()) is not None:
            start, st.start = st.start, None
            assert start is not None
            self.admission.release(
                st.info.bot_id,
                (st.info.bot_id, st.info.conversation_id),
                start.input_bytes,
                start.share,
                start.end_user,
            )
            info = st.info
            info.status = "running"
            info.started_at = time.time()
            info.deadline_at = info.started_at + start.timeout
            st.task = asyncio.create_task(self._execute(st, start), name=f"run:{info.run_id}")
            st.task.add_done_callback(functools.partial(self._check_ended, st))
            started = hpb.RunInfo()
            started.CopyFrom(info)
            self._publish(st, hpb.SendMessageReply(run_started=started), started.ByteSize())

    def _check_ended(self, st: RunState, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never runs its body, nor the `finally` that writes the run's
        end and frees its slot (CancelRun or shutdown can land between _pump and that step): end it here."""
        if st.ending is not None:
            return
        if st.cancel_reason == "host_shutdown":
            self._set_outcome(st, "interrupted", "host_shutdown", "the host stopped while this run was starting")
        else:
            self._set_outcome(st, "cancelled", "cancelled", st.cancel_reason or "cancelled")
        began = time.monotonic()
        st.ending = asyncio.ensure_future(self._finish(st))
        st.ending.add_done_callback(lambda _: self._slot_freed(st, began))

    def _end_queued(self, st: RunState, status: str, code: str, message: str) -> asyncio.Future[None]:
        """Ends a run that never started (idempotent): out of the queue, its outcome written and published."""
        if st.ending is None:
            start, st.start = st.start, None
            self.admission.remove(st)
            if start is not None:
                self.admission.release(
                    st.info.bot_id,
                    (st.info.bot_id, st.info.conversation_id),
                    start.input_bytes,
                    start.share,
                    start.end_user,
                )
            self._set_outcome(st, status, code, message)
            st.ending = asyncio.ensure_future(self._finish(st))
            st.ending.add_done_callback(lambda _: self._pump())
        return st.ending

    # ---- one run ----

    def _publish(self, st: RunState, reply: Published, size: int = 0) -> None:
        for inbox in st.subscribers:
            inbox.put(reply, size)

    async def _execute(self, st: RunState, start: QueuedStart) -> None:
        """Runs an admitted run: it holds one of limits.RUNS_MAX_ACTIVE slots until its end is written."""
        info = st.info
        began = time.monotonic()
        try:
            bot, binding, manifest, event, actor = start.bot, start.binding, start.manifest, start.event, start.actor
            token = start.token
            grant = Grant.freeze(manifest, binding.resource_policy)  # as recorded at send, from the same inputs
            plugin_id, runner_name = parse_runner_id(binding.runner_id)
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
                event_seq=event.seq,
                origin=start.origin,
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
            await self._stream(st, plugin_id, request, binding.pool)
        except asyncio.CancelledError:
            if st.cancel_reason == "host_shutdown":
                self._set_outcome(st, "interrupted", "host_shutdown", "the host stopped while this run was in progress")
            elif st.cancel_reason == faults.RUN_CODE and st.writer is not None:
                self._lost_outcome(info, st.writer.lost)
            else:
                self._set_outcome(st, "cancelled", "cancelled", st.cancel_reason or "cancelled")
        except faults.DatabaseDown as exc:  # e.g. marking it running, or reading its context
            self._set_outcome(st, "failed", faults.RUN_CODE, exc.message)
        except Exception as exc:  # a bug here must still end the run visibly, never leave it running
            log.exception("run %s failed in the host", info.run_id)
            self._set_outcome(st, "failed", "host_error", f"{type(exc).__name__}: {exc}")
        finally:
            # The slot and the conversation's turn pass on only once the end is written (even if this task is
            # cancelled again meanwhile): the next run of the conversation sees this one's whole transcript.
            finish = st.ending = asyncio.ensure_future(self._finish(st))
            finish.add_done_callback(lambda _: self._slot_freed(st, began))
            await asyncio.shield(finish)

    def _slot_freed(self, st: RunState, began: float) -> None:
        self.admission.ended(st, began)
        self._pump()

    def _set_outcome(self, st: RunState, status: str, code: str = "", message: str = "") -> None:
        if st.info.status in ("queued", "running"):
            st.info.status = status
            st.info.error_code = code
            st.info.error_message = message

    async def _stream(self, st: RunState, plugin_id: str, request: runner_pb2.RunRequest, pool: str = "") -> None:
        info = st.info
        if pool or (self.workers is not None and plugin_id not in self.supervisor.processes):
            await self._stream_on_worker(st, request, pool)
            return
        try:
            pp = await self.supervisor.wait_ready(plugin_id, self.supervisor.policy.start_timeout)
        except PluginStartError as exc:
            self._set_outcome(st, "failed", "runner_unavailable", str(exc))
            return
        proc = pp.proc  # the process this run is on; a restart may replace pp.proc while we look
        remaining = info.deadline_at - time.time()
        call = _run_call(pp.channel)(request, timeout=remaining)
        try:
            async for data in call:
                self._ingest_wire(st, data)
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

    async def _stream_on_worker(self, st: RunState, request: runner_pb2.RunRequest, pool: str) -> None:
        """A run of a binding that names a pool, or of a runner no local plugin serves, on a connected worker
        that offers it (WorkerHub.place: the conversation's last worker first, else the least in flight). Its
        batches come up the worker's Run stream as the runner sent them and go through the same ingestion."""
        info = st.info
        assert st.active is not None
        workers = self.workers
        where = f" in pool {pool!r}" if pool else ""
        if workers is None:
            self._set_outcome(
                st,
                "failed",
                "runner_unavailable",
                f"the binding runs on workers{where}, but this host does not listen for workers (serve --workers)",
            )
            return
        conversation = (info.bot_id, info.conversation_id)
        # A run the previous host left queued: its workers may still be reconnecting to this one.
        grace = st.resumed and time.monotonic() < workers.grace_until
        session = await workers.wait_place(
            info.runner_id, info.deadline_at - time.time(), pool, conversation, grace=grace
        )
        if session is None:
            waited = (
                f"; the host had restarted (or a standby taken over) with this run queued, and waited"
                f" {limits.WORKER_RECONNECT_GRACE_SECONDS:g} s from its start for a worker offering it to connect"
                if grace
                else ""
            )
            self._set_outcome(
                st,
                "failed",
                "runner_unavailable",
                f"no connected worker{where} offers runner {info.runner_id} (or none had room before the run's"
                f" deadline){waited}; see `agenthost workers list`",
            )
            return
        st.active.worker = session.name  # from now on the run API answers this run's token from that worker only
        stream = workers.run(session, request)
        try:
            async with asyncio.timeout(max(0.0, info.deadline_at - time.time())):
                async for data in stream:
                    self._ingest_wire(st, data)
                    if st.terminal is not None:
                        break
                    if self.registry.db.congested:
                        await self.registry.db.backpressure()
        except WorkerLost as exc:
            self._set_outcome(st, "failed", "runner_lost", f"the worker serving this run was lost: {exc}")
            return
        except TimeoutError:
            self._set_outcome(
                st,
                "timed_out",
                "deadline_exceeded",
                f"the run passed its deadline of {info.deadline_at - info.started_at:.0f}s",
            )
            return
        finally:
            await stream.aclose()  # ends the worker's Run stream: a run still going there is cancelled
        if st.terminal is None:
            self._set_outcome(st, "failed", "runner_protocol", "the runner ended its stream without a terminal event")

    async def _stream_broke(self, st: RunState, proc: asyncio.subprocess.Process | None, detail: str) -> None:
        """The Run stream ended abnormally: if the process died, say how (the supervisor restarts it)."""
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 2.0)
            if proc.returncode is not None:
                # The memory cap has its own code: the fix is a smaller job or a larger cap, not a bug hunt.
                code = "runner_out_of_memory" if self.supervisor.out_of_memory(proc) else "runner_crashed"
                self._set_outcome(
                    st, "failed", code, f"runner process {self.supervisor.describe_end(proc)} during the run"
                )
                return
        self._set_outcome(st, "failed", "runner_unavailable", detail)

    def _ingest_wire(self, st: RunState, data: bytes) -> None:
        """One message off a runner's Run stream, a serialized RunEventBatch: numbered as bytes when it is plain
        text deltas (host/store/text_deltas.py, the hot path of streaming), else parsed and read event by event."""
        deltas = text_deltas.number(data, st.seq + 1, time.time()) if st.terminal is None else None
        if deltas is None or self._over_quota(st, deltas.count, len(data)):
            reply = hpb.SendMessageReply()
            try:
                reply.events.MergeFromString(data)
            except DecodeError as exc:
                failed = pb.Failed(code="runner_protocol", message=f"the runner sent a malformed RunEventBatch: {exc}")
                reply = hpb.SendMessageReply(events=pb.RunEventBatch(events=[pb.RunEvent(failed=failed)]))
            self._ingest(st, reply, len(data))
            return
        count = deltas.count
        st.event_count += count
        st.event_bytes += len(data)
        st.seq += count
        if st.text_len < MAX_ASSISTANT_TEXT:
            st.text_parts.append(deltas.text)
            st.text_len += len(deltas.text)
        self._writer(st).add(deltas, [], len(data))
        self._publish(st, deltas, len(deltas.batch))

    def _writer(self, st: RunState) -> RunWriter:
        if st.writer is None:
            info = st.info
            st.writer = RunWriter(
                self.conversations,
                run_id=info.run_id,
                bot_id=info.bot_id,
                conversation_id=info.conversation_id,
                event_id=info.event_id,
                event_seq=(st.active.event_seq or None) if st.active is not None else None,
                on_lost=functools.partial(self._write_lost, st),
            )
        return st.writer

    def _write_lost(self, st: RunState, reason: str) -> None:
        """A write of the run's events did not commit (RunWriter.lost): the run is stopped now, not left streaming
        what is no longer recorded; _finish ends it failed (faults.RUN_CODE)."""
        log.error("run %s: its events could not be recorded (%s); ending it", st.info.run_id, reason)
        if st.task is not None and not st.task.done() and st.ending is None:
            st.cancel_reason = faults.RUN_CODE
            st.task.cancel()

    def _ingest_batch(self, st: RunState, batch: pb.RunEventBatch, *, from_host: bool = False) -> None:
        """_ingest for a batch that did not come off a runner's Run stream: a child run's events, the host's own."""
        reply = hpb.SendMessageReply(events=batch)
        self._ingest(st, reply, reply.events.ByteSize(), from_host=from_host)

    def _ingest(self, st: RunState, reply: hpb.SendMessageReply, size: int, *, from_host: bool = False) -> None:
        """Numbers, projects, persists (queued) and publishes one batch, any events: the general path of
        streaming (see _ingest_wire). `reply` holds the batch as parsed off the wire and `size` its wire bytes; its
        events are numbered in place and the same object goes to the subscribers and to the writer, no per-event
        copy.
        `from_host`: events the host writes itself (approvals, subagent links), which a runner's batch may not
        carry: those are dropped from it."""
        info = st.info
        now = time.time()
        items: list[NewItem] = []
        if st.terminal is None:
            over = self._over_quota(st, len(reply.events.events), size)
            if over:
                log.warning("run %s: %s", info.run_id, over)
                reply = hpb.SendMessageReply(
                    events=pb.RunEventBatch(events=[pb.RunEvent(failed=pb.Failed(code="quota_exceeded", message=over))])
                )
                size = reply.events.ByteSize()
        events = reply.events.events
        st.event_count += len(events)
        st.event_bytes += size
        if st.terminal is not None:
            return  # nothing after the terminal event counts
        first_seq = seq = st.seq
        taken = deltas = 0
        forged = False
        for ev in events:
            seq += 1
            ev.seq = seq
            ev.created_at = now
            taken += 1
            kind = ev.WhichOneof("kind")
            if kind == "text_delta":  # the common case, kept first and short
                deltas += 1
                if st.text_len < MAX_ASSISTANT_TEXT:
                    text = ev.text_delta.text
                    st.text_parts.append(text)
                    st.text_len += len(text)
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
                break  # nothing after the terminal event counts
            elif (kind in HOST_ONLY_EVENTS or kind == "artifact_created") and not from_host:
                forged = True  # rare: checked below, off the hot path
        st.seq = seq
        if taken < len(events):
            del events[taken:]
        if forged:
            for i in reversed(range(taken)):
                dropped = events[i].WhichOneof("kind")
                if dropped == "artifact_created":
                    if self._checked_artifact(st, events[i].artifact_created):
                        continue
                    self.observer.runner_event_dropped(info.run_id, dropped, "names an artifact it may not read")
                    del events[i]
                elif dropped in HOST_ONLY_EVENTS:
                    self.observer.runner_event_dropped(info.run_id, dropped, "only the host writes it")
                    del events[i]
            taken = len(events)
            for i, ev in enumerate(events, start=first_seq + 1):
                ev.seq = i
            st.seq = first_seq + taken
        if not taken:
            return
        if not st.project:
            items.clear()  # a child run's events never enter the conversation's transcript
        # The writer reads the same event objects the subscribers get: nothing mutates them once published. A
        # batch of deltas only is handed over whole, to be stored as (part of) one row.
        self._writer(st).add(events, items, size, reply.events if deltas == len(events) else None)
        # Numbering adds a few bytes per event; a batch that may no longer fit one client message is cut.
        estimate = size + 16 * taken
        if estimate <= limits.CLIENT_BATCH_BYTES:
            self._publish(st, reply, estimate)
            return
        kept = list(events)
        sizes = [ev.ByteSize() + 6 for ev in kept]
        for part in split_events(kept, sizes):
            self._publish(st, hpb.SendMessageReply(events=pb.RunEventBatch(events=part)), sum(sizes[: len(part)]))
            sizes = sizes[len(part) :]

    def _checked_artifact(self, st: RunState, event: pb.ArtifactCreated) -> bool:
        """Whether a runner's artifact_created names a stored artifact this run may read; if so its ref is replaced
        by the stored one. Clients act on these refs with their own, wider credentials (a channel adapter fetches
        the file with ReadRunArtifact under the ref's run_id and posts it to the chat), so a forged ref would make
        them deliver another conversation's files.

        Each lookup is a database read on the host's loop: a run's verdicts are kept, and once it has named
        RUN_MAX_ARTIFACT_MISSES artifacts it may not read, the rest are dropped unread (forged refs with fresh ids,
        2 bytes each, had cost a read apiece, up to RUN_MAX_EVENTS a run)."""
        artifact_id = event.artifact.artifact_id
        if artifact_id in st.artifact_verdicts:
            verdict = st.artifact_verdicts[artifact_id]
        elif st.artifact_misses >= limits.RUN_MAX_ARTIFACT_MISSES:
            return False
        else:
            verdict = self._readable_artifact(st, artifact_id)
            if verdict is None:
                st.artifact_misses += 1
            if len(st.artifact_verdicts) < limits.RUN_ARTIFACT_VERDICTS:
                st.artifact_verdicts[artifact_id] = verdict
        if verdict is None:
            return False
        event.artifact.CopyFrom(verdict)
        return True

    def _readable_artifact(self, st: RunState, artifact_id: str) -> pb.ArtifactRef | None:
        """The stored ref of `artifact_id` if this run may read it; None otherwise."""
        found = self.artifacts.get(artifact_id) if self.artifacts and artifact_id else None
        if found is None:
            return None
        ref, bot_id = found
        info = st.info
        if st.active is not None:
            allowed = st.active.may_read(bot_id, ref.conversation_id)
        else:  # a child run: its own conversation only
            allowed = bot_id == info.bot_id and ref.conversation_id == info.conversation_id
        return ref if allowed else None

    @staticmethod
    def _over_quota(st: RunState, events: int, size: int) -> str:
        """Why this batch would take the run past its event quotas, or "" if it fits."""
        if st.event_count + events > limits.RUN_MAX_EVENTS:
            return f"the runner sent more than RUN_MAX_EVENTS = {limits.RUN_MAX_EVENTS} events"
        if st.event_bytes + size > limits.RUN_MAX_EVENT_BYTES:
            return f"the runner sent more than RUN_MAX_EVENT_BYTES = {limits.RUN_MAX_EVENT_BYTES} bytes of events"
        return ""

    def _flush_text(self, st: RunState, items: list[NewItem], final: str | None = None) -> None:
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

    @staticmethod
    def _lost_outcome(info: hpb.RunInfo, reason: str) -> None:
        info.status, info.error_code, info.error_message = "failed", faults.RUN_CODE, reason

    async def _record_end(self, write: Callable[[sqlite3.Connection], None]) -> None:
        """Writes a run's end once the database is reachable again (the run keeps its slot meanwhile, so the next
        run of its conversation starts after it); given up when the host stops (the next start then ends the run
        `interrupted`)."""
        while not self._closing:
            await asyncio.sleep(limits.RUN_END_RETRY_SECONDS)
            try:
                await self.registry.db.write(write)
                return
            except faults.DatabaseDown:
                continue
            except Exception:
                log.exception("could not record the end of a run")
                return

    async def _finish(self, st: RunState) -> None:
        info = st.info
        # Open approvals end as cancelled, recorded in the stream before the run's end is written.
        self.approvals.run_ended(info.run_id)
        self.grants.revoke(info.run_id)
        if self.children.open_for(info.run_id):
            # A child cannot outlive its parent: its end is written (and its usage added here) before the parent's.
            await self.children.end_for_parent(st)
        leftover: list[NewItem] = []
        self._flush_text(st, leftover)
        if not st.project:
            leftover.clear()
        if info.status in ("queued", "running"):
            self._set_outcome(st, "failed", "host_error", "run ended without an outcome")
        info.finished_at = time.time()
        info.text = st.final_message or ""  # cut to RUN_MAX_TEXT_CHARS (with the marker) by RunStore.finish
        writer = st.writer
        event_seq = (st.active.event_seq or None) if st.active is not None else None

        def write(conn: sqlite3.Connection) -> None:
            if writer is not None and writer.lost:
                # Checked here, on the writer thread: a failed batch of the run's events, right before this job,
                # has set it already. The run is recorded failed, not as the outcome its runner reported.
                self._lost_outcome(info, writer.lost)
            elif leftover:
                self.conversations.insert_items(
                    conn,
                    bot_id=info.bot_id,
                    conversation_id=info.conversation_id,
                    run_id=info.run_id,
                    event_id=info.event_id,
                    items=leftover,
                    event_seq=event_seq,
                )
            RunStore.finish(conn, info)

        try:
            await self.registry.db.write(write)
        except faults.DatabaseDown as exc:
            # Its client hears now; the end is recorded once the database is back (_record_end).
            self._lost_outcome(info, exc.message)
            self._ended(st)
            await self._record_end(write)
            return
        except Exception:
            log.exception("could not record the end of run %s", info.run_id)
        self._ended(st)

    def _ended(self, st: RunState) -> None:
        info = st.info
        self._live.pop(info.run_id, None)
        self.observer.run_finished(info)
        self._publish(st, hpb.SendMessageReply(run_finished=info), info.ByteSize())
        self._publish(st, None)
