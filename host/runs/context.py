"""The event-first AgentRunContext a runner receives: the trigger, the conversation, the grant it may use,
cursors to pull history with, and only as much inlined history and state as the manifest asks for and the caps
allow (RunManager builds one per run)."""

from __future__ import annotations

import json

from agenthost.host.access.grants import SCOPE_VALUES, ActiveRun
from agenthost.host.store.conversations import Conversations
from agenthost.host.store.state import StateStore
from agenthost.plugins.manifest import RunnerManifest
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import runner_pb2
from agenthost.protos.wire import PROTOCOL_VERSION, VERSION

MAX_SNAPSHOT_BYTES = 256 * 1024
MAX_SNAPSHOT_KEYS = 200  # per scope


class ContextBuilder:
    def __init__(self, conversations: Conversations, state: StateStore) -> None:
        self.conversations = conversations
        self.state = state

    def build(
        self,
        run: ActiveRun,
        bot: hpb.Bot,
        binding: hpb.Binding,
        manifest: RunnerManifest,
        event: pb.EventRecord,
        actor: pb.Actor,
    ) -> runner_pb2.AgentRunContext:
        # As of the run's own event: messages queued behind it are already recorded but are its future.
        horizon = run.horizon(run.conversation_id)
        count, latest = self.conversations.history_stats(bot.bot_id, run.conversation_id, horizon)
        bootstrap, inline = self._bootstrap(manifest, bot.bot_id, run.conversation_id, count, horizon)
        ctx = runner_pb2.AgentRunContext(
            run_id=run.run_id,
            trigger=runner_pb2.Trigger(type=event.event_type, source=event.source, timestamp=event.created_at),
            event=event,
            conversation=runner_pb2.Conversation(
                conversation_id=run.conversation_id, bot_id=bot.bot_id, bot_name=bot.name
            ),
            actor=actor,
            input=runner_pb2.RunInput(text=event.text, attachments=event.attachments),
            delivery=runner_pb2.Delivery(
                surface=event.source,
                supports_streaming=binding.delivery_policy.streaming,
                max_message_size=binding.delivery_policy.max_message_size,
            ),
            resources=runner_pb2.Resources(
                apis=sorted(run.grant.apis),
                state_scopes=[SCOPE_VALUES[s] for s in sorted(run.grant.state_scopes)],
                cross_conversation_patterns=list(run.grant.cross_conversation_patterns),
            ),
            context=runner_pb2.ContextAccess(
                conversation_id=run.conversation_id,
                latest_cursor=latest,
                has_history_before=count > max(1, inline.delivered_count),
                transcript_count=count,
                inline_policy=inline,
                available_apis=sorted(run.grant.apis),
            ),
            state_json=json.dumps(self._state_snapshot(run)),
            runtime=runner_pb2.Runtime(
                deadline_at=run.deadline_at,
                host_version=VERSION,
                protocol_version=PROTOCOL_VERSION,
                binding_id=binding.binding_id,
                runner_id=binding.runner_id,
                plugin_id=run.plugin_id,
            ),
            config_json=binding.config_json or "{}",
        )
        ctx.bootstrap.extend(bootstrap)
        return ctx

    def _bootstrap(
        self, manifest: RunnerManifest, bot_id: str, conversation_id: str, count: int, horizon: int | None
    ) -> tuple[list[pb.TranscriptItem], runner_pb2.InlinePolicy]:
        needs = manifest.context
        mode = needs.bootstrap
        if mode in ("none", "current_event") or needs.max_inline_events == 0:
            return [], runner_pb2.InlinePolicy(mode=mode, source_total_count=count, complete=count <= 1)
        tail = self.conversations.recent(bot_id, conversation_id, needs.max_inline_events, horizon)
        if mode == "summary_tail":
            cut = max((i for i, item in enumerate(tail) if item.item_type == "compaction"), default=-1)
            if cut > 0:
                tail = tail[cut:]
        size = 0
        kept: list[pb.TranscriptItem] = []
        for item in reversed(tail):
            size += item.ByteSize()
            if size > needs.max_inline_bytes:
                break
            kept.append(item)
        kept.reverse()
        return kept, runner_pb2.InlinePolicy(
            mode=mode,
            delivered_count=len(kept),
            source_total_count=count,
            complete=len(kept) >= count,
            reason="" if len(kept) >= count else "bounded by max_inline_events / max_inline_bytes",
        )

    def _state_snapshot(self, run: ActiveRun) -> dict[str, object]:
        snapshot: dict[str, object] = {}
        budget = MAX_SNAPSHOT_BYTES
        for scope in ("conversation", "actor", "binding", "runner"):
            if scope not in run.grant.state_scopes:
                continue
            # One key past the cap, so a scope cut at it says so like one cut by bytes: a runner may then trust
            # a snapshot without `_truncated` to hold every key of the scope (an absent key is absent).
            values = self.state.snapshot(run.scope_keys[scope], MAX_SNAPSHOT_KEYS + 1)
            kept: dict[str, object] = {}
            for i, (key, value) in enumerate(values.items()):
                if i == MAX_SNAPSHOT_KEYS:
                    kept["_truncated"] = True
                    break
                size = len(json.dumps(value))
                if size > budget:
                    kept["_truncated"] = True  # the rest is one state_get away
                    break
                budget -= size
                kept[key] = value
            snapshot[scope] = kept
        return snapshot
