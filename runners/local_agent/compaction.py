"""Compaction: keep the working context under a watermark of the model's real window.

The current turn is never compacted away. Its user message stays verbatim as a user message, and its latest tool
exchange stays whole: a model that sees its instruction only inside a "reference only" summary stops working on
it. Within that rule, three passes, each only when the one before was not enough:

1. Cheap: outside the most recent `keep_recent_fraction` of the window, large tool results and large string
   arguments of tool calls (a written file's content) become short stubs. Both are still in the host transcript.
2. Summary: turns before the current one are summarized by the model and replaced by a `Summary` at a clean cut
   point (never between a call and its results); the full pre-compaction context is saved as a host artifact that
   the summary names, and the summary becomes a checkpoint in conversation state for a fresh runner process.
3. Progress: the current turn's older, already stubbed steps fold into one progress note right after its user
   message (one line per step), framed as work done rather than as reference.

If the user message and the latest exchange alone still do not fit, compaction fails (`context_overflow`) rather
than send a request without them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.errors import ProviderError
from agenthost.runners.local_agent.history import Checkpoint
from agenthost.runners.local_agent.messages import (
    AssistantMessage,
    Message,
    Summary,
    ToolCall,
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
CLEARED_PREFIX = "[old tool output cleared"
ARG_CLEARED_MARK = "chars omitted from this earlier call]"
# The smallest verbatim tail, whatever the fraction and the window: below this even one file read gets stubbed.
KEEP_TOKENS_FLOOR = 256
# A compaction that saves less than this share of the window, and leaves the context above the trigger, does not
# count as progress.
MIN_EFFECTIVE_SAVING = 0.10
MAX_INEFFECTIVE = 2
STEP_LINE_CHARS = 240

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
    collapsed: int = 0  # steps of the current turn folded into its progress note
    notes: list[str] = field(default_factory=list)


def _last_group_start(messages: list[Message]) -> int:
    """Where the latest tool exchange (an assistant call turn and its results) starts; len() when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AssistantMessage) and m.tool_calls:
            return i
        if not isinstance(m, ToolResult):
            break
    return len(messages)


def recent_start(messages: list[Message], keep_tokens: int) -> int:
    """The first index of the verbatim tail: as many trailing messages as fit in keep_tokens, and always the
    latest tool exchange (the model is about to act on its results)."""
    total = 0
    start = len(messages)
    for i in range(len(messages) - 1, -1, -1):
        total += estimate_message(messages[i])
        if total > keep_tokens:
            break
        start = i
    return min(start, _last_group_start(messages))


def _stub_result(m: ToolResult) -> ToolResult:
    where = (
        f" Full output: artifact {m.artifact_id} (read_artifact)."
        if m.artifact_id
        else " It is still in the conversation history (search_history)."
    )
    if m.images:
        where += " Its images: " + ", ".join(f"{p.name} (artifact {p.artifact_id or 'not stored'})" for p in m.images)
        where += "."
    return ToolResult(
        tool_call_id=m.tool_call_id,
        name=m.name,
        content=f"{CLEARED_PREFIX}: {m.name} returned {len(m.content)} chars.{where}]",
        is_error=m.is_error,
        artifact_id=m.artifact_id,
    )


def _shorten_strings(value: Any) -> tuple[Any, bool]:
    if isinstance(value, str):
        if len(value) > STUB_MIN_CHARS and not value.endswith(ARG_CLEARED_MARK):
            return f"[{len(value)} {ARG_CLEARED_MARK}", True
        return value, False
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            out[k], c = _shorten_strings(v)
            changed |= c
        return out, changed
    if isinstance(value, list):
        items = [_shorten_strings(v) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    return value, False


def stub_arguments(call: ToolCall) -> ToolCall | None:
    """The call with its long string arguments replaced by a length note; None when there is nothing to shorten.
    The result stays a JSON object with the same keys, so every provider still accepts the replayed call."""
    if len(call.arguments) <= STUB_MIN_CHARS:
        return None
    try:
        value = json.loads(call.arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return ToolCall(call.id, call.name, json.dumps({"omitted": f"[{len(call.arguments)} {ARG_CLEARED_MARK}"}))
    short, changed = _shorten_strings(value)
    if not changed:
        return None
    return ToolCall(call.id, call.name, json.dumps(short, ensure_ascii=False))


def stub_old_results(
    messages: list[Message], keep_recent: int = KEEP_RECENT_RESULTS, *, keep_tokens: int | None = None
) -> tuple[list[Message], int]:
    """The cheap pass: replaces large tool results and large call arguments that are older than the verbatim tail
    with short stubs. The tail is `keep_tokens` worth of trailing messages when given (the budgeted form the
    compactor uses), else the last `keep_recent` results and their calls."""
    if keep_tokens is not None:
        boundary = recent_start(messages, keep_tokens)
    else:
        result_positions = [i for i, m in enumerate(messages) if isinstance(m, ToolResult)]
        kept = result_positions[-keep_recent:] if keep_recent else []
        boundary = kept[0] if kept else len(messages)
        # The call turn of the oldest kept result belongs to the tail too.
        while boundary > 0 and boundary < len(messages) and not isinstance(messages[boundary], AssistantMessage):
            boundary -= 1
    out: list[Message] = []
    stubbed = 0
    for i, m in enumerate(messages):
        if i < boundary and isinstance(m, ToolResult):
            if (len(m.content) > STUB_MIN_CHARS or m.images) and not m.content.startswith(CLEARED_PREFIX):
                out.append(_stub_result(m))
                stubbed += 1
                continue
        elif i < boundary and isinstance(m, AssistantMessage) and m.tool_calls:
            calls = [stub_arguments(c) for c in m.tool_calls]
            if any(c is not None for c in calls):
                new_calls = [c if c is not None else orig for c, orig in zip(calls, m.tool_calls, strict=True)]
                out.append(dc_replace(m, tool_calls=new_calls))
                stubbed += sum(c is not None for c in calls)
                continue
        out.append(m)
    return out, stubbed


def clean_cuts(messages: list[Message]) -> list[int]:
    """Indexes where the list may be split: never before a tool result (it would lose its call), never before a
    progress note (it would lose its user message), never at 0."""
    return [
        i
        for i in range(1, len(messages))
        if not isinstance(messages[i], ToolResult) and not (isinstance(messages[i], Summary) and messages[i].progress)
    ]


def choose_cut(messages: list[Message], keep_tokens: int, *, limit: int | None = None) -> int | None:
    """The earliest clean cut whose tail fits in keep_tokens, preferring a user-turn boundary; at least the last
    turn group is always kept, and with `limit` (the current turn's user message) the cut is never after it.
    None when there is nothing older to summarize."""
    cuts = clean_cuts(messages)
    # Everything before the first non-summary message is already compacted.
    first_real = next((i for i, m in enumerate(messages) if not isinstance(m, Summary)), len(messages))
    cuts = [c for c in cuts if c > first_real and (limit is None or c <= limit)]
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


def _step_line(call: ToolCall, result: ToolResult | None) -> str:
    args = call.arguments if len(call.arguments) <= 120 else call.arguments[:117] + "..."
    if result is None:
        outcome = "no result"
    elif result.content.startswith(CLEARED_PREFIX):
        outcome = ("error, " if result.is_error else "") + "output cleared (in history)"
    else:
        text = " ".join(result.content.split())
        outcome = ("error: " if result.is_error and not text.startswith("error") else "") + text
    line = f"- {call.name} {args} -> {outcome}"
    return line if len(line) <= STEP_LINE_CHARS else line[: STEP_LINE_CHARS - 3] + "..."


def _append_step(lines: list[str], line: str) -> None:
    """Repeats of the previous step (a model re-reading a file) become a count, not another line."""
    if lines:
        prev, _, count = lines[-1].partition(" [x")
        if prev == line:
            n = int(count.rstrip("]")) if count else 1
            lines[-1] = f"{line} [x{n + 1}]"
            return
    lines.append(line)


def collapse_turn_steps(messages: list[Message], user_index: int, boundary: int) -> tuple[list[Message], int]:
    """Folds the current turn's tool steps before `boundary` (the start of the verbatim tail) into one progress
    note placed right after the turn's user message (merging an existing note). Stops at another user message;
    never takes the latest exchange. Returns the new list and the number of steps folded."""
    boundary = min(boundary, _last_group_start(messages))
    i = user_index + 1
    note: Summary | None = None
    if i < len(messages) and isinstance(messages[i], Summary) and messages[i].progress:
        note = messages[i]  # type: ignore[assignment]
        i += 1
    lines: list[str] = note.content.split("\n") if note is not None else []
    steps = 0
    while i < boundary and isinstance(messages[i], AssistantMessage):
        group = messages[i]
        assert isinstance(group, AssistantMessage)
        j = i + 1
        results: dict[str, ToolResult] = {}
        while j < len(messages) and isinstance(messages[j], ToolResult):
            r = messages[j]
            assert isinstance(r, ToolResult)
            results[r.tool_call_id] = r
            j += 1
        if j > boundary:
            break  # the group reaches into the tail: keep it whole
        if group.content.strip():
            said = " ".join(group.content.split())
            lines.append(f"- said: {said[: STEP_LINE_CHARS - 10]}")
        for c in group.tool_calls:
            _append_step(lines, _step_line(c, results.get(c.id)))
        steps += 1
        i = j
    if not steps:
        return messages, 0
    content = "\n".join(lines)
    merged = Summary(content, progress=True)
    return [*messages[: user_index + 1], merged, *messages[i:]], steps


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


def _index_of(messages: list[Message], pinned: Message | None) -> int | None:
    if pinned is None:
        return None
    return next((i for i, m in enumerate(messages) if m is pinned), None)


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

    def resize(self, window: int, max_output_tokens: int) -> None:
        """The run moved to a model with another window (a fallback): every budget follows from these two."""
        self.window = window
        self.max_output_tokens = max_output_tokens

    @property
    def trigger_tokens(self) -> int:
        return int(self.window * self.watermark)

    @property
    def hard_limit(self) -> int:
        """The most a request may hold and still leave room for the answer."""
        return max(self.window - self.max_output_tokens, self.window // 2)

    @property
    def summary_tokens(self) -> int:
        """The summarizer's output budget, which is also what a new summary adds to the context."""
        return min(self.max_output_tokens, max(512, self.window // 8))

    def keep_tokens(self, overhead_tokens: int, *, force: bool = False) -> int:
        """The verbatim tail: `keep_fraction` of the window, capped so that tail plus the fixed overhead leaves
        room under the hard limit for the stubs of the rest and the next tool result, and never below a floor."""
        want = int(self.window * self.keep_fraction * (0.5 if force else 1.0))
        room = int((self.hard_limit - overhead_tokens) * 0.75)
        return max(KEEP_TOKENS_FLOOR, min(want, room))

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
        provider: Provider | Sequence[Provider],
        api: Any,
        run_id: str,
        force: bool = False,
        pinned: Message | None = None,
        explicit: bool = False,
        focus: str = "",
    ) -> CompactionOutcome:
        """`pinned`: the current turn's user message (by identity). It and everything after it stay out of the
        summary; without it (tests, tools) the cut may fall anywhere clean. `provider`: the summary model, or a
        chain tried in order. `explicit`: the model asked (the `compact` tool): as forced, and the transcript is
        saved whenever anything leaves the context, not only when earlier turns are summarized. `focus`: what
        the model asked the summary to keep."""
        providers = list(provider) if isinstance(provider, (list, tuple)) else [provider]
        if explicit:
            force = True
        tokens_before = overhead_tokens + estimate_messages(messages)
        outcome = CompactionOutcome(messages=messages, tokens_before=tokens_before, tokens_after=tokens_before)
        pinned_at = _index_of(messages, pinned)
        if pinned is not None and pinned_at is not None:
            # What no pass can remove: the user message and the latest exchange. Failing now saves a summary call
            # that could not help.
            last = max(_last_group_start(messages), pinned_at + 1)
            floor = overhead_tokens + estimate_message(pinned) + estimate_messages(messages[last:])
            if floor > self.hard_limit:
                raise CompactionFailed(
                    f"the current turn alone (your message and its latest tool step) needs ~{floor} tokens (system "
                    f"prompt and tool definitions included), more than the {self.window}-token window allows with "
                    f"{self.max_output_tokens} reserved for the answer"
                )
        keep = self.keep_tokens(overhead_tokens, force=force)
        # The verbatim tail, by identity: measured before stubbing (stubs are small, so measuring after would
        # stretch the "recent" region over every stubbed step) and followed through the later passes.
        verbatim = {id(m) for m in messages[recent_start(messages, keep) :]}
        staged, outcome.stubbed = stub_old_results(messages, keep_tokens=keep)
        current = overhead_tokens + estimate_messages(staged)
        target = int(self.trigger_tokens * 0.8)
        if current <= target and not force:
            return self._finish(outcome, staged)

        # Pass 2: summarize what precedes the current turn (or precedes the kept tail when nothing is pinned).
        user_index = _index_of(staged, pinned)
        # Asked for explicitly, every turn before the current one goes into the summary (the latest clean cut),
        # not only what the verbatim budget cannot hold: the model asked to drop them from its working context.
        cut = choose_cut(staged, 0 if explicit else keep, limit=user_index)
        if cut is not None:
            head, tail = staged[:cut], staged[cut:]
            artifact = await self._save_transcript(api, messages, run_id)
            summary_text = await self._summarize(providers, head, focus=focus, notes=outcome.notes)
            if artifact is not None:
                summary_text += (
                    f"\n\n(Full transcript before this compaction: artifact {artifact.artifact_id}; "
                    "use read_artifact to consult it.)"
                )
            through = _through_seq(head, tail)
            summary = Summary(summary_text, artifact.artifact_id if artifact is not None else "", through)
            staged = [summary, *tail]
            outcome.summary = summary_text
            outcome.artifact = artifact
            outcome.summarized = len(head)
            outcome.checkpoint = Checkpoint(summary_text, through, summary.artifact_id)
            self.count += 1
            current = overhead_tokens + estimate_messages(staged)

        # Pass 3: the current turn's own older steps. If that is still too much, the verbatim tail shrinks to the
        # floor (the latest exchange) before giving up.
        for tail_tokens in (keep, KEEP_TOKENS_FLOOR):
            user_index = _index_of(staged, pinned)
            if user_index is None or not (current > target or force):
                break
            if tail_tokens != keep:
                if current <= self.hard_limit:
                    break
                verbatim = {id(m) for m in staged[recent_start(staged, tail_tokens) :]}
                staged, more = stub_old_results(staged, keep_tokens=tail_tokens)
                outcome.stubbed += more
            boundary = next((i for i, m in enumerate(staged) if id(m) in verbatim), len(staged))
            staged, folded = collapse_turn_steps(staged, user_index, boundary)
            outcome.collapsed += folded
            current = overhead_tokens + estimate_messages(staged)

        if explicit and outcome.artifact is None and (outcome.stubbed or outcome.collapsed):
            outcome.artifact = await self._save_transcript(api, messages, run_id)
        outcome = self._finish(outcome, staged)
        if outcome.tokens_after > self.hard_limit:
            what = (
                "the current turn alone (your message, a note of its earlier steps and its latest tool step) needs"
                if pinned is not None
                else "after compaction the context still needs"
            )
            raise CompactionFailed(
                f"{what} ~{outcome.tokens_after} tokens (system prompt and tool definitions included), more than "
                f"the {self.window}-token window allows with {self.max_output_tokens} reserved for the answer"
            )
        return outcome

    def _finish(self, outcome: CompactionOutcome, staged: list[Message]) -> CompactionOutcome:
        compacted, _ = pairing.repair(staged)
        pairing.check(compacted)
        overhead = outcome.tokens_before - estimate_messages(outcome.messages)
        outcome.messages = compacted
        outcome.tokens_after = overhead + estimate_messages(compacted)
        self._record(outcome.tokens_before, outcome.tokens_after)
        return outcome

    def _record(self, before: int, after: int) -> None:
        # Small savings are fine when they bring the context back under the trigger (the cheap pass on a small
        # window saves one result at a time); small savings that leave it above are thrashing.
        if before - after < self.window * MIN_EFFECTIVE_SAVING and after >= self.trigger_tokens:
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

    async def _summarize(
        self, providers: list[Provider], head: list[Message], *, focus: str = "", notes: list[str] | None = None
    ) -> str:
        previous = "\n\n".join(m.content for m in head if isinstance(m, Summary) and not m.progress)
        body = render_transcript([m for m in head if not (isinstance(m, Summary) and not m.progress)])
        # The summarizer's own input must fit the window, or the summary call itself overflows.
        budget_chars = max(4_000, int((self.window * 0.5 - self.max_output_tokens) * 3))
        if len(body) > budget_chars:
            keep = budget_chars // 2
            body = body[:keep] + f"\n… [{len(body) - 2 * keep} chars of transcript omitted] …\n" + body[-keep:]
        prompt = (f"Previous summary:\n{previous}\n\n" if previous else "") + f"Transcript to fold in:\n{body}"
        if focus:
            prompt += f"\n\nThe assistant asked that the summary keep in particular: {focus}"
        request = ModelRequest(
            system=SUMMARIZER_SYSTEM,
            messages=[UserMessage(prompt)],
            max_tokens=self.summary_tokens,
        )
        # Each model of the chain once; the compaction is already a detour, and the mechanical summary keeps
        # what must not be lost if none answers.
        for provider in providers:
            try:
                final = await provider.complete(request)
            except ProviderError as err:
                if notes is not None:
                    notes.append(f"summary model {provider.full_model} failed: {err}")
                continue
            text = final.message.content.strip()
            if text:
                if notes is not None and provider is not providers[0]:
                    notes.append(f"summary written by fallback model {provider.full_model}")
                return text
            if notes is not None:
                notes.append(f"summary model {provider.full_model} returned an empty summary")
        if notes is not None:
            notes.append("used a mechanical summary: no summary model answered")
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


__all__ = [
    "CompactionFailed",
    "CompactionOutcome",
    "Compactor",
    "choose_cut",
    "collapse_turn_steps",
    "recent_start",
    "stub_arguments",
    "stub_old_results",
]
