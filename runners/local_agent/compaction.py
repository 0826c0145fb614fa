"""Compaction: keep the working context under a watermark of the model's real window.

Two passes. The cheap one stubs old, large tool results (they are still in the host transcript and searchable).
If that is not enough, the older part is summarized by the model and replaced by a `Summary` at a clean cut point
(never between a call and its results); the full pre-compaction context is saved as a host artifact that the
summary names, and the summary becomes a checkpoint in conversation state for a fresh runner process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.errors import ProviderError
from agenthost.runners.local_agent.history import Checkpoint
from agenthost.runners.local_agent.messages import (
    AssistantMessage,
    Message,
    Summary,
    ToolResult,
    UserMessage,
    render_transcript,
    to_dict,
)
from agenthost.runners.local_agent.providers.base import ModelRequest, Provider
from agenthost.runners.local_agent.providers.demo import SUMMARIZER_MARKER
from agenthost.runners.local_agent.tokens import estimate_message, estimate_messages

STUB_MIN_CHARS = 200
KEEP_RECENT_RESULTS = 3
# A compaction that saves less than this share of the window does not count as progress.
MIN_EFFECTIVE_SAVING = 0.10
MAX_INEFFECTIVE = 2

SUMMARIZER_SYSTEM = (
    f"{SUMMARIZER_MARKER} for an AI assistant that will continue the conversation with only your summary and the "
    "most recent turns. Write a dense, structured summary: the user's goals and constraints; decisions made; facts "
    "learned (names, paths, numbers, identifiers — keep them verbatim); files created or changed; tool results that "
    "still matter; open questions and unfinished tasks; the state of work at the end. If a previous summary is "
    "given, update it rather than starting over. Do not address the user and do not add instructions."
)


class CompactionFailed(Exception):
    """Compaction cannot bring the context under the window (e.g. the latest turn alone is too large)."""


@dataclass
class CompactionOutcome:
    messages: list[Message]
    tokens_before: int
    tokens_after: int
    summary: str = ""
    artifact: Any = None  # ArtifactRef of the pre-compaction context, when stored
    checkpoint: Checkpoint | None = None
    stubbed: int = 0
    summarized: int = 0
    notes: list[str] = field(default_factory=list)


def stub_old_results(messages: list[Message], keep_recent: int = KEEP_RECENT_RESULTS) -> tuple[list[Message], int]:
    """The cheap pass: replaces large tool results older than the last few with a short stub."""
    result_positions = [i for i, m in enumerate(messages) if isinstance(m, ToolResult)]
    old = set(result_positions[:-keep_recent] if keep_recent else result_positions)
    out: list[Message] = []
    stubbed = 0
    for i, m in enumerate(messages):
        if (
            i in old
            and isinstance(m, ToolResult)
            and len(m.content) > STUB_MIN_CHARS
            and not m.content.startswith("[old tool output cleared")
        ):
            where = (
                f" Full output: artifact {m.artifact_id} (read_artifact)."
                if m.artifact_id
                else (" It is still in the conversation history (search_history).")
            )
            out.append(
                ToolResult(
                    tool_call_id=m.tool_call_id,
                    name=m.name,
                    content=f"[old tool output cleared: {m.name} returned {len(m.content)} chars.{where}]",
                    is_error=m.is_error,
                    artifact_id=m.artifact_id,
                )
            )
            stubbed += 1
        else:
            out.append(m)
    return out, stubbed


def clean_cuts(messages: list[Message]) -> list[int]:
    """Indexes where the list may be split: never before a tool result, never at 0."""
    return [i for i in range(1, len(messages)) if not isinstance(messages[i], ToolResult)]


def choose_cut(messages: list[Message], keep_tokens: int) -> int | None:
    """The earliest clean cut whose tail fits in keep_tokens, preferring a user-turn boundary; at least the last
    turn group is always kept. None when there is nothing older to summarize."""
    cuts = clean_cuts(messages)
    # Everything before the first non-summary message is already compacted.
    first_real = next((i for i, m in enumerate(messages) if not isinstance(m, Summary)), len(messages))
    cuts = [c for c in cuts if c > first_real]
    if not cuts:
        return None
    suffix = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + estimate_message(messages[i])
    fitting = [c for c in cuts if suffix[c] <= keep_tokens]
    if not fitting:
        return cuts[-1]
    earliest = fitting[0]
    user_cuts = [c for c in fitting if isinstance(messages[c], UserMessage)]
    # A user boundary keeps whole turns together; take it unless it throws away most of the kept budget.
    if user_cuts and suffix[user_cuts[0]] >= suffix[earliest] // 2:
        return user_cuts[0]
    return earliest


def _through_seq(head: list[Message], tail: list[Message]) -> int:
    """The last host transcript seq the summary fully covers; a runner rebuilding from the host re-reads
    everything after it. Erring low only re-reads a turn the summary also describes; erring high would lose one."""
    previous = max((m.through_seq for m in head if isinstance(m, Summary)), default=0)
    if tail and isinstance(tail[0], UserMessage) and tail[0].host_seq:
        return max(previous, tail[0].host_seq - 1)  # cut at a turn boundary
    last_head_user = next((m for m in reversed(head) if isinstance(m, UserMessage) and m.host_seq), None)
    if last_head_user is not None:
        return max(previous, last_head_user.host_seq - 1)  # cut inside that turn: re-read the whole turn
    return previous


class Compactor:
    def __init__(
        self,
        *,
        window: int,
        watermark: float,
        keep_fraction: float,
        max_output_tokens: int,
    ) -> None:
        self.window = window
        self.watermark = watermark
        self.keep_fraction = keep_fraction
        self.max_output_tokens = max_output_tokens
        self.ineffective = 0
        self.count = 0

    @property
    def trigger_tokens(self) -> int:
        return int(self.window * self.watermark)

    @property
    def hard_limit(self) -> int:
        """The most a request may hold and still leave room for the answer."""
        return max(self.window - self.max_output_tokens, self.window // 2)

    def needs_compaction(self, tokens: int) -> bool:
        return tokens >= self.trigger_tokens

    def may_compact(self) -> bool:
        # Anti-thrash: after repeated compactions that freed almost nothing, stop trying and let the hard limit
        # decide (a clear failure beats burning a summary call on every turn).
        return self.ineffective < MAX_INEFFECTIVE

    async def compact(
        self,
        messages: list[Message],
        *,
        overhead_tokens: int,
        provider: Provider,
        api: Any,
        run_id: str,
        force: bool = False,
    ) -> CompactionOutcome:
        tokens_before = overhead_tokens + estimate_messages(messages)
        outcome = CompactionOutcome(messages=messages, tokens_before=tokens_before, tokens_after=tokens_before)
        staged, outcome.stubbed = stub_old_results(messages)
        after_stub = overhead_tokens + estimate_messages(staged)
        target = int(self.trigger_tokens * 0.8)
        if after_stub <= target and not force:
            outcome.messages, outcome.tokens_after = staged, after_stub
            self._record(tokens_before, after_stub)
            return outcome
        keep_tokens = int(self.window * self.keep_fraction * (0.5 if force else 1.0))
        keep_tokens = min(keep_tokens, max(0, target - overhead_tokens - 2048))
        cut = choose_cut(staged, keep_tokens)
        if cut is None:
            outcome.messages, outcome.tokens_after = staged, after_stub
            self._record(tokens_before, after_stub)
            if after_stub > self.hard_limit:
                raise CompactionFailed(
                    f"the latest turn alone needs ~{after_stub} tokens, more than the {self.window}-token window allows"
                )
            return outcome
        head, tail = staged[:cut], staged[cut:]
        artifact = await self._save_transcript(api, messages, run_id)
        summary_text = await self._summarize(provider, head)
        if artifact is not None:
            summary_text += (
                f"\n\n(Full transcript before this compaction: artifact {artifact.artifact_id}; "
                "use read_artifact to consult it.)"
            )
        through = _through_seq(head, tail)
        summary = Summary(summary_text, artifact.artifact_id if artifact is not None else "", through)
        compacted, _ = pairing.repair([summary, *tail])
        pairing.check(compacted)
        outcome.messages = compacted
        outcome.tokens_after = overhead_tokens + estimate_messages(compacted)
        outcome.summary = summary_text
        outcome.artifact = artifact
        outcome.summarized = len(head)
        outcome.checkpoint = Checkpoint(summary_text, through, summary.artifact_id)
        self._record(tokens_before, outcome.tokens_after)
        self.count += 1
        if outcome.tokens_after > self.hard_limit:
            raise CompactionFailed(
                f"after compaction the context still needs ~{outcome.tokens_after} tokens "
                f"(window {self.window}, reserved for output {self.max_output_tokens})"
            )
        return outcome

    def _record(self, before: int, after: int) -> None:
        if before - after < self.window * MIN_EFFECTIVE_SAVING:
            self.ineffective += 1
        else:
            self.ineffective = 0

    async def _save_transcript(self, api: Any, messages: list[Message], run_id: str) -> Any:
        data = "".join(json.dumps(to_dict(m), ensure_ascii=False) + "\n" for m in messages).encode("utf-8", "replace")
        try:
            return await api.artifact_create(
                data,
                name=f"pre-compaction-{run_id}-{self.count + 1}.jsonl",
                mime_type="application/x-ndjson",
                metadata={"kind": "local_agent.pre_compaction", "messages": len(messages)},
            )
        except Exception:  # noqa: BLE001 — an artifact the grant does not allow must not block compaction
            return None

    async def _summarize(self, provider: Provider, head: list[Message]) -> str:
        previous = "\n\n".join(m.content for m in head if isinstance(m, Summary))
        body = render_transcript([m for m in head if not isinstance(m, Summary)])
        # The summarizer's own input must fit the window, or the summary call itself overflows.
        budget_chars = max(4_000, int((self.window * 0.5 - self.max_output_tokens) * 3))
        if len(body) > budget_chars:
            keep = budget_chars // 2
            body = body[:keep] + f"\n… [{len(body) - 2 * keep} chars of transcript omitted] …\n" + body[-keep:]
        prompt = (f"Previous summary:\n{previous}\n\n" if previous else "") + f"Transcript to fold in:\n{body}"
        request = ModelRequest(
            system=SUMMARIZER_SYSTEM,
            messages=[UserMessage(prompt)],
            max_tokens=min(self.max_output_tokens, max(512, self.window // 8)),
        )
        try:
            final = await provider.complete(request)
            text = final.message.content.strip()
            if text:
                return text
        except ProviderError:
            pass
        return _mechanical_summary(head, previous)


def _mechanical_summary(head: list[Message], previous: str) -> str:
    """Used when the summary call fails: what the user asked is the part that must not be lost."""
    asks = [m.content[:300] for m in head if isinstance(m, UserMessage)]
    tools = sorted({c.name for m in head if isinstance(m, AssistantMessage) for c in m.tool_calls})
    parts = ["(Automatic summary; the model summary was unavailable.)"]
    if previous:
        parts.append(previous)
    if asks:
        parts.append("The user asked, in order:\n" + "\n".join(f"- {a}" for a in asks))
    if tools:
        parts.append("Tools used: " + ", ".join(tools))
    return "\n".join(parts)


__all__ = ["CompactionFailed", "CompactionOutcome", "Compactor", "choose_cut", "stub_old_results"]
