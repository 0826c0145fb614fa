"""Conversation order through a real host: whatever way messages arrive (bursts queued behind a running turn,
runner restarts between runs, a lost or deleted session file), the request answering a message holds exactly the
conversation's messages up to it, each once, in order, with the replies between.

The host is real (HostHarness: stores, queueing, run API); the local agent runs in process behind a wrapper that
can replace it with a fresh object (a restart: nothing in memory survives) or wipe its sessions just before a
chosen run; the model is an OpenAI-compatible server on loopback that records every request and holds its answers
until every message of a burst has been recorded by the host, so a burst really queues.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.history import Checkpoint, read_context
from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolResult, UserMessage
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    Recorded,
    Reply,
    openai_text,
    openai_tool_calls,
)
from agenthost.runners.sdk.runner import RunContext, Runner
from agenthost.runners.sdk.testing import HostHarness

CONVERSATION = "burst"
ACTIONS = ("none", "restart", "wipe", "delete_file", "scramble")


class CrashingAgent(Runner):
    """The local agent behind a handle the test can break between runs. `plan` maps a message text to what
    happens just before its run reaches the agent: `restart` replaces the agent object (a new process as far as
    the agent can tell: no cached session, no locks), `wipe` also deletes every session file (a lost disk), and
    `delete_file` deletes the files under a live object (which keeps appending to a file without its header), and
    `scramble` restarts it on session files saved the way versions before turn-ordered rebuilds could save a
    burst: user messages swapped, the last one repeated."""

    manifest = LocalAgentRunner.manifest
    plan: ClassVar[dict[str, str]] = {}
    restarts: ClassVar[int] = 0

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.inner = LocalAgentRunner(data_dir, env={})

    async def setup(self) -> None:
        await self.inner.setup()

    async def close(self) -> None:
        await self.inner.close()

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        return self.inner.validate_config(config)

    def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        return self._run(run)

    async def _run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        action = self.plan.get(run.text, "none")
        if action in ("restart", "wipe"):
            await self.inner.close()
            self.inner = LocalAgentRunner(self.data_dir, env={})
            await self.inner.setup()
            CrashingAgent.restarts += 1
        if action in ("wipe", "delete_file"):
            shutil.rmtree(self.data_dir / "sessions", ignore_errors=True)
        if action == "scramble":  # read by a fresh process: a session an older version saved out of order
            await self.inner.close()
            scramble_sessions(self.data_dir / "sessions")
            self.inner = LocalAgentRunner(self.data_dir, env={})
            await self.inner.setup()
        async for ev in self.inner.run(run):
            yield ev


def scramble_sessions(root: Path) -> None:
    """Each session file rewritten out of the host's order: its first two user messages swapped (or its only one
    repeated at the end), every other line kept."""
    for path in root.glob("*.jsonl"):
        lines = path.read_bytes().splitlines(keepends=True)
        users = [i for i, line in enumerate(lines) if json.loads(line).get("m", {}).get("role") == "user"]
        if len(users) >= 2:
            a, b = users[:2]
            lines[a], lines[b] = lines[b], lines[a]
        elif users:
            lines.append(lines[users[0]])
        path.write_bytes(b"".join(lines))


class EchoModel(FakeProviderServer):
    """Answers from the request itself: a message whose text ends in "!tool" first gets a list_files call, and
    every turn ends with the answer "A(<message>)". Answers wait on `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.default = Reply()
        self.gate = asyncio.Event()
        self.gate.set()

    async def _respond(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        request = self.requests[-1]  # appended just before this call, with no await in between
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            await self.gate.wait()
            reply = self._answer(request.json()["messages"])
        return await super()._respond(writer, reply)

    @staticmethod
    def _answer(messages: list[dict[str, Any]]) -> Reply:
        last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        if messages[-1]["role"] == "user" and last_user.endswith("!tool"):
            return openai_tool_calls([(call_id(last_user), "list_files", {"path": "."})])
        return openai_text(answer(last_user))


def answer(label: str) -> str:
    return f"A({label})"


def call_id(label: str) -> str:
    return "call_" + label.replace("!", "_")


def turn(label: str) -> list[tuple[str, str]]:
    """One answered message as the model must see it in every later request."""
    out = [("user", label)]
    if label.endswith("!tool"):
        out += [("assistant-call", call_id(label)), ("tool", call_id(label))]
    return [*out, ("assistant", answer(label))]


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            out += [("assistant-call", c["id"]) for c in m["tool_calls"]]
            if m.get("content"):
                out.append(("assistant", m["content"]))
        elif m["role"] == "tool":
            out.append(("tool", m["tool_call_id"]))
        else:
            out.append((m["role"], m.get("content") or ""))
    return out


@dataclass
class Message:
    tool: bool
    action: str


@dataclass
class Outcome:
    order: list[str] = field(default_factory=list)  # the conversation's messages, in the order the host has them
    requests: list[Recorded] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)


async def play(root: Path, bursts: list[list[Message]], spacing: float = 0.0) -> Outcome:
    """Sends each burst at once (all its messages recorded by the host before any is answered), one burst after
    the other finishing, and returns what the host recorded and what the model was asked. With `spacing`, a
    burst's messages go out that many seconds apart instead and the model answers at once, so a message may
    arrive before, during or after the run ahead of it (the assertions hold for every such timing)."""
    labels = [
        [f"m{b}.{i}" + ("!tool" if msg.tool else "") for i, msg in enumerate(burst)] for b, burst in enumerate(bursts)
    ]
    CrashingAgent.plan = {
        label: msg.action
        for burst, names in zip(bursts, labels, strict=True)
        for msg, label in zip(burst, names, strict=True)
    }
    outcome = Outcome()
    async with EchoModel() as model:
        config = {"model": "vllm/m", "base_url": model.url + "/v1", "context_window": 32_000, "max_retries": 1}
        async with HostHarness(root, runners=[CrashingAgent], config=config) as h:
            for names in labels:
                if not spacing:
                    model.gate.clear()
                recorded = [asyncio.Event() for _ in names]

                async def send(text: str, seen: asyncio.Event) -> hpb.RunInfo:
                    request = hpb.SendMessageRequest(bot=h.bot, text=text, conversation_id=CONVERSATION, source="api")
                    finished = None
                    async for reply in h.client.stream(request, timeout=30):
                        if reply.WhichOneof("kind") in ("queued", "run_started"):
                            seen.set()  # the host's first reply comes once the message is recorded
                        elif reply.WhichOneof("kind") == "run_finished":
                            finished = reply.run_finished
                    assert finished is not None
                    return finished

                tasks = []
                for n, e in zip(names, recorded, strict=True):
                    if tasks and spacing:
                        await asyncio.sleep(spacing)  # the arrival pattern under test, not a wait for a condition
                    tasks.append(asyncio.create_task(send(n, e)))
                try:
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in recorded)), 15)
                finally:
                    model.gate.set()
                for info in await asyncio.wait_for(asyncio.gather(*tasks), 30):
                    outcome.statuses[info.run_id] = f"{info.status} {info.error_message}".strip()
            resp = await h.client.call(
                "GetHistory",
                hpb.GetHistoryRequest(bot=h.bot, conversation_id=CONVERSATION, limit=100, direction=pb.FORWARD),
            )
            assert not resp.has_more  # at most 4 bursts of 4 turns of at most 4 items
            outcome.order = [i.text for i in resp.items if i.role == "user" and i.item_type == "message"]
        outcome.requests = list(model.model_requests)
    return outcome


def check(outcome: Outcome) -> None:
    assert all(s == "completed" for s in outcome.statuses.values()), outcome.statuses
    answered: dict[str, int] = {}
    for request in outcome.requests:
        got = shape(request.json()["messages"])
        label = next(content for role, content in reversed(got) if role == "user")
        i = outcome.order.index(label)
        expected = [step for earlier in outcome.order[:i] for step in turn(earlier)] + [("user", label)]
        if got[-1][0] == "tool":  # the second request of a tool turn: its call and result follow the message
            expected += [("assistant-call", call_id(label)), ("tool", call_id(label))]
        else:
            answered[label] = answered.get(label, 0) + 1
        assert got == expected, f"request answering {label}:\n got {got}\nwant {expected}"
    assert answered == dict.fromkeys(outcome.order, 1)


messages = st.builds(Message, tool=st.booleans(), action=st.sampled_from(ACTIONS))
scenarios = st.lists(st.lists(messages, min_size=1, max_size=4), min_size=1, max_size=4)


@pytest.mark.slow
@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is a regression, not a new draw
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bursts=scenarios)
def test_context_is_the_conversation_up_to_each_message(bursts: list[list[Message]]) -> None:
    with tempfile.TemporaryDirectory(prefix="ordering-") as tmp:
        outcome = asyncio.run(asyncio.wait_for(play(Path(tmp), bursts), 90))
    check(outcome)


async def test_burst_into_a_new_conversation(tmp_path: Path) -> None:
    """The report that started this: three messages at once into a fresh conversation."""
    outcome = await play(tmp_path, [[Message(False, "none")] * 3])
    check(outcome)
    first = shape(outcome.requests[0].json()["messages"])
    assert first == [("user", outcome.order[0])]


async def test_a_session_saved_out_of_order_is_rebuilt_from_the_host(tmp_path: Path) -> None:
    """Sessions saved out of order by older versions: the next run's request is the host's order anyway."""
    outcome = await play(
        tmp_path, [[Message(False, "none")] * 3, [Message(False, "scramble")], [Message(True, "scramble")]]
    )
    check(outcome)
    assert len(outcome.requests) == 6


async def test_messages_50ms_apart_see_nothing_after_their_own(tmp_path: Path) -> None:
    """Three messages 50 ms apart into a fresh conversation: the request answering m_k holds m_1..m_k and the
    replies to m_1..m_(k-1), in order, each once, and no message sent after m_k."""
    outcome = await play(tmp_path, [[Message(False, "none")] * 3], spacing=0.05)
    check(outcome)
    assert len(outcome.requests) == 3
    for request in outcome.requests:
        got = shape(request.json()["messages"])
        k = outcome.order.index(got[-1][1])
        assert not {label for _, label in got} & set(outcome.order[k + 1 :])
        assert [c for role, c in got if role == "user"] == outcome.order[: k + 1]


async def test_rebuild_after_a_burst_reorders_the_interleaved_transcript(tmp_path: Path) -> None:
    """A burst leaves the transcript as m1 m2 m3 A1 A2 A3; a runner that lost its disk must still see
    m1 A1 m2 A2 m3 A3, and must not see the messages queued behind its own."""
    bursts = [
        [Message(True, "none"), Message(False, "none"), Message(True, "none")],
        [Message(False, "wipe"), Message(True, "none"), Message(False, "delete_file")],
        [Message(False, "restart")],
    ]
    outcome = await play(tmp_path, bursts)
    check(outcome)
    assert len(outcome.order) == 7


# ---- the transcript walk alone, on transcripts a burst leaves behind ----


def _burst_transcript() -> FakeRunAPI:
    """m1 m2 m3 arrive together; run 1 (with a tool call) and run 2 have executed, m4 arrives during run 3."""
    api = FakeRunAPI()
    for n in (1, 2, 3):
        api.add_user(f"m{n}", event_id=f"e{n}")
    api.add_item(role="assistant", item_type="tool_call", tool_call_id="c1", tool_name="list_files", event_id="e1")
    api.add_item(role="tool", item_type="tool_result", tool_call_id="c1", tool_name="list_files", event_id="e1")
    api.add_item(role="assistant", item_type="message", text="A1", event_id="e1")
    api.add_item(role="assistant", item_type="message", text="A2", event_id="e2")
    api.add_user("m4", event_id="e4")
    return api


def _texts(messages: list[Any]) -> list[str]:
    return [f"{m.role}:{m.content}" for m in messages]


async def test_read_context_orders_turns_and_leaves_out_the_queue() -> None:
    api = _burst_transcript()
    ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000)
    assert _texts(ctx.messages) == ["user:m1", "assistant:", "tool:", "assistant:A1", "user:m2", "assistant:A2"]
    assert ctx.trigger_seq == 3
    assert isinstance(ctx.messages[2], ToolResult) and ctx.messages[2].tool_call_id == "c1"
    # A checkpoint through m1's turn covers run 1's output even though it lies after m2 in the transcript.
    cp = Checkpoint("S", through_seq=1)
    ctx = await read_context(api, "c1", checkpoint=cp, trigger_event_id="e3", token_budget=100_000)
    assert ctx.messages == [Summary("S", "", 1), UserMessage("m2", host_seq=2), AssistantMessage("A2")]
    # Catching a session up from m1: only the turns after it, before the trigger.
    ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000, after_seq=1)
    assert ctx.messages == [UserMessage("m2", host_seq=2), AssistantMessage("A2")]
    ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000, after_seq=2)
    assert ctx.messages == [] and ctx.trigger_seq == 3


async def test_read_context_keeps_a_message_whose_run_failed() -> None:
    """m2's run failed before any output: m2 is still part of the conversation, between A1 and m3."""
    api = FakeRunAPI()
    for n in (1, 2, 3):
        api.add_user(f"m{n}", event_id=f"e{n}")
    api.add_item(role="assistant", item_type="message", text="A1", event_id="e1")
    ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000)
    assert _texts(ctx.messages) == ["user:m1", "assistant:A1", "user:m2"]


async def test_read_context_after_a_compaction_marker_without_checkpoint() -> None:
    """Run 2 compacted while m3 was queued: m3 precedes the marker in the transcript but follows its turn."""
    api = FakeRunAPI()
    api.add_user("m1", event_id="e1")
    api.add_item(role="assistant", item_type="message", text="A1", event_id="e1")
    api.add_user("m2", event_id="e2")
    api.add_user("m3", event_id="e3")
    api.add_item(role="system", item_type="compaction", text="summary", event_id="e2")
    api.add_item(role="assistant", item_type="message", text="A2", event_id="e2")
    api.add_user("m4", event_id="e4")
    ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e4", token_budget=100_000)
    assert ctx.messages == [Summary("summary", "", 5), AssistantMessage("A2"), UserMessage("m3", host_seq=4)]


# ---- the same transcripts as the host pages them: turn order, up to the run's own event ----


def _as_the_host_pages(api: FakeRunAPI, trigger: str) -> FakeRunAPI:
    """`api`'s items (written in seq order) reordered as the host pages them: each event's message, then its run's
    output, event after event; nothing of the turns queued behind the trigger's. Seqs stay as recorded."""
    turn: dict[str, int] = {}
    for it in api.items:
        turn.setdefault(it.event_id, it.seq)  # an event's message is recorded before its run's output
    api.items = sorted(
        (it for it in api.items if turn[it.event_id] <= turn[trigger]), key=lambda it: (turn[it.event_id], it.seq)
    )
    return api


async def test_read_context_reads_the_same_conversation_from_turn_ordered_pages() -> None:
    """The regrouping is a no-op on the host's turn order: the same context, checkpoints and catch-up alike."""
    for make in (_burst_transcript, lambda: _as_the_host_pages(_burst_transcript(), "e3")):
        api = make()
        ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000)
        assert _texts(ctx.messages) == ["user:m1", "assistant:", "tool:", "assistant:A1", "user:m2", "assistant:A2"]
        assert ctx.trigger_seq == 3
        ctx = await read_context(
            api, "c1", checkpoint=Checkpoint("S", through_seq=1), trigger_event_id="e3", token_budget=100_000
        )
        assert ctx.messages == [Summary("S", "", 1), UserMessage("m2", host_seq=2), AssistantMessage("A2")]
        ctx = await read_context(api, "c1", checkpoint=None, trigger_event_id="e3", token_budget=100_000, after_seq=1)
        assert ctx.messages == [UserMessage("m2", host_seq=2), AssistantMessage("A2")]


async def test_a_budget_cut_in_turn_order_never_claims_a_kept_turn() -> None:
    """m1 m2 m3 arrive together; run 1 writes a long answer, run 2 a short one; run 3 has a small budget. Walking
    back in turn order (m1 A1 m2 A2 m3) the cut falls on A1, whose seq is past m2's: the note must cover only what
    precedes m2, or a checkpoint built on it would later drop m2's turn."""
    api = FakeRunAPI()
    for n in (1, 2, 3):
        api.add_user(f"m{n}", event_id=f"e{n}")
    api.add_item(role="assistant", item_type="message", text="long " * 5000, event_id="e1")
    api.add_item(role="assistant", item_type="message", text="A2", event_id="e2")
    ctx = await read_context(
        _as_the_host_pages(api, "e3"), "c1", checkpoint=None, trigger_event_id="e3", token_budget=1000
    )
    note, *rest = ctx.messages
    assert rest == [UserMessage("m2", host_seq=2), AssistantMessage("A2")]
    assert isinstance(note, Summary) and note.through_seq == 1


def test_a_progress_note_does_not_hide_the_watermark() -> None:
    """A turn folded by compaction keeps its user message's position as the session's watermark, so the next run
    still catches up with what the host has after it."""
    from agenthost.runners.local_agent.history import session_watermark
    from agenthost.runners.local_agent.messages import Summary, UserMessage

    folded = [UserMessage("do the ten files", host_seq=7), Summary("steps so far: …", progress=True)]
    assert session_watermark(folded) == 7
    summarised = [UserMessage("old", host_seq=3), Summary("earlier turns …")]
    assert session_watermark(summarised) is None
