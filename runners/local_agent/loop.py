"""The agent loop: an async generator of run events for one user message.

model call (streamed, retried) → tool calls (declared order; read-only batches concurrently) → results → again,
until the model answers without tools or the iteration budget forces a final answer. The session is written as
the loop goes (assistant turn before its tools run, each result as it lands) so a process killed at any point
leaves a session that load-time healing turns back into a valid history.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Any

from agenthost.protos import common_pb2 as pb
from agenthost.runners.local_agent import images, pairing
from agenthost.runners.local_agent.compaction import CompactionFailed, Compactor
from agenthost.runners.local_agent.config import ConfigError, LocalAgentConfig
from agenthost.runners.local_agent.errors import ContextWindowUnknown, ErrorKind, ProviderError, backoff_delay
from agenthost.runners.local_agent.fallback import ModelFailure, ModelSlot, exhausted_message, falls_back
from agenthost.runners.local_agent.history import CHECKPOINT_KEY
from agenthost.runners.local_agent.messages import AssistantMessage, ToolCall, ToolResult, UserMessage, image_label
from agenthost.runners.local_agent.providers.base import Final, ModelRequest, Provider, TextChunk
from agenthost.runners.local_agent.session import Session
from agenthost.runners.local_agent.tokens import TokenCounter, estimate_text, estimate_tools
from agenthost.runners.local_agent.tools.base import ToolContext, ToolRegistry
from agenthost.runners.sdk import events

# Operational log (the plugin's stderr). Provider errors are already redacted; tool output and text are never logged.
log = logging.getLogger("agenthost.local_agent")

BUDGET_EXHAUSTED_RESULT = (
    "error: not executed — the tool-call budget for this turn is used up. Give your final answer now with what "
    "you have."
)
FINAL_ANSWER_NOTE = (
    "[The tool-call budget for this turn is exhausted: tools are disabled. Answer the user now: summarise what "
    "was done, what remains, and how to continue.]"
)

TRUNCATED_NOTICE = (
    "\n\n[This answer was cut off: the model reached its output limit ({limit} tokens). Ask it to continue, or "
    "raise max_output_tokens.]"
)
NOT_ANSWERED_NOTE = "Your message was not answered; it stays in the conversation and is seen with your next one."
OVERSIZED_NOTE = (
    "Your message was not sent to the model; the conversation keeps a note that it was too large, not its text."
)
OVERSIZED_STAND_IN = (
    "[A message of ~{tokens} tokens was here. It was too large for this model's context window and was never "
    "answered; its text is in the conversation history (search_history).]"
)
EMPTY_ANSWER_ATTEMPTS = 2

FAILED_CODES = {
    ErrorKind.AUTH: "provider_auth",
    ErrorKind.RATE_LIMIT: "provider_rate_limited",
    ErrorKind.OVERLOADED: "provider_unavailable",
    ErrorKind.SERVER: "provider_unavailable",
    ErrorKind.TIMEOUT: "provider_timeout",
    ErrorKind.CONNECTION: "provider_unreachable",
    ErrorKind.CONTEXT_OVERFLOW: "context_overflow",
    ErrorKind.BAD_REQUEST: "provider_bad_request",
    ErrorKind.NOT_FOUND: "model_not_found",
    ErrorKind.STREAM_BROKEN: "provider_stream_interrupted",
}


class RunFailed(Exception):
    """Ends a run with a `failed` event carrying this code."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


@dataclass
class _ModelDone:
    final: Final


class AgentLoop:
    def __init__(
        self,
        *,
        provider: Provider,
        registry: ToolRegistry,
        config: LocalAgentConfig,
        session: Session,
        tool_ctx: ToolContext,
        system_prompt: str,
        compactor: Compactor,
        counter: TokenCounter | None = None,
        deadline_at: float = 0.0,
        stream_text: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        fallbacks: Sequence[ModelSlot] = (),
        summarizers: Sequence[Provider] = (),
        refresh_system: Callable[[], Awaitable[str]] | None = None,
        cache_key: str = "",
        persist_checkpoints: bool = True,
    ) -> None:
        self.provider = provider
        # Models the run moves to, in order, when the current one keeps failing (fallback.py says when).
        self.fallbacks = list(fallbacks)
        self._next_fallback = 0
        self._failures: list[ModelFailure] = []
        # Who writes compaction summaries: the configured chain, else the model the run is on at that moment.
        self.summarizers = list(summarizers)
        # A subagent's loop compacts its own context only: the conversation's checkpoint belongs to the parent.
        self.persist_checkpoints = persist_checkpoints
        self.registry = registry
        self.config = config
        self.session = session
        self.ctx = tool_ctx
        self.system = system_prompt
        # Re-renders (and re-freezes) the system prompt after a compaction, the one moment the cached prefix is
        # rewritten anyway; between compactions the prompt stays the same bytes.
        self.refresh_system = refresh_system
        self.cache_key = cache_key
        self.compactor = compactor
        self.counter = counter or TokenCounter()
        self.deadline_at = deadline_at
        # Without streaming delivery the same generator runs but yields only whole messages; since no partial
        # text has reached anyone, a stream that breaks mid-answer can then still be retried.
        self.stream_text = stream_text
        self.sleep = sleep
        self.tool_specs = registry.specs()
        self._turn_user: UserMessage | None = None
        self._replied = False  # whether any model reply arrived in this run
        self._explicit_after: int | None = None  # context size right after the last `compact` tool call
        self._last_outcome: Any = None
        self._unloadable: set[str] = set()  # images whose bytes could not be loaded: noted, not asked for again
        self._tool_schema_tokens = estimate_tools(
            [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tool_specs]
        )

    # ---- the run ----

    async def run(self, user: UserMessage) -> AsyncIterator[pb.RunEvent]:
        self.session.append(user)
        # Compaction keys the current turn on this object: it is never summarized, stubbed or dropped.
        self._turn_user = user
        self._replied = False
        try:
            async for ev in self._turn(user):
                yield ev
        except RunFailed as exc:
            if not self._replied:
                # One rule for every run that fails before the model answered (here, and in the runner before the
                # loop starts, where the session catches up from host history): the message stays in the working
                # context, so the next run sees it. A message too large for the window stays as a marked stand-in,
                # or every later run would fail on it again.
                if exc.code == "context_overflow":
                    stand_in = UserMessage(
                        OVERSIZED_STAND_IN.format(tokens=estimate_text(user.content)), host_seq=user.host_seq
                    )
                    swapped = [stand_in if m is user else m for m in self.session.messages]
                    if any(m is stand_in for m in swapped):
                        self.session.rewrite(swapped)
                        self.counter.invalidate()
                    exc.message += f" {OVERSIZED_NOTE}"
                else:
                    exc.message += f" {NOT_ANSWERED_NOTE}"
                exc.args = (exc.message,)
            raise

    async def _turn(self, user: UserMessage) -> AsyncIterator[pb.RunEvent]:
        iterations = self.config.max_iterations
        for iteration in range(iterations + 1):
            final_turn = iteration == iterations
            async for ev in self._prepare_context():
                yield ev
            request = ModelRequest(
                system=self.system,
                note=FINAL_ANSWER_NOTE if final_turn else "",
                prompt_cache=self.config.prompt_cache,
                cache_key=self.cache_key,
                messages=list(self.session.messages),  # a snapshot: the session grows while tools run
                tools=self.tool_specs,
                # The reserved output budget, not the configured maximum: servers such as vLLM reject a request
                # whose prompt plus max_tokens exceeds the window.
                max_tokens=self.compactor.max_output_tokens,
                temperature=self.config.temperature,
                tool_choice="none" if final_turn else "auto",
            )
            final: Final | None = None
            for attempt in range(EMPTY_ANSWER_ATTEMPTS):
                async for item in self._call_model(request):
                    if isinstance(item, _ModelDone):
                        final = item.final
                    else:
                        yield item
                assert final is not None
                self._replied = True
                if final.message.content or final.message.tool_calls or final.finish_reason == "length":
                    break
                # An empty answer (seen from small local models) would end the run in silence; ask once more.
                if attempt + 1 < EMPTY_ANSWER_ATTEMPTS:
                    yield events.retry(attempt + 1, 0.0, "the model returned an empty response")
            assert final is not None
            if not (final.message.content or final.message.tool_calls):
                note = "(The model returned an empty response twice; try rephrasing or another model.)"
                if self.stream_text:
                    yield events.text(note)
                yield events.message(note)
                yield events.completed("empty_response")
                return
            message = self._normalize(final.message)
            self.session.append(message)
            if final.usage is not None:
                # The reported prompt covers everything the request held; the anchor keys on that message count.
                self.counter.record(final.usage.input_tokens, len(self.session.messages) - 1)
                yield events.usage(
                    final.usage.input_tokens,
                    final.usage.output_tokens,
                    cache_read_tokens=final.usage.cache_read_tokens,
                    cache_write_tokens=final.usage.cache_write_tokens,
                    model=self.provider.full_model,
                )
            cut_off = final.finish_reason == "length" and not message.tool_calls
            if cut_off:
                # The session keeps the model's own words; the notice is for the user, who otherwise cannot tell a
                # truncated answer from a finished one. `completed.finish_reason` carries "length" as the flag.
                notice = TRUNCATED_NOTICE.format(limit=request.max_tokens)
                if self.stream_text:
                    yield events.text(notice)
                yield events.message(message.content + notice)
            elif message.content:
                yield events.message(message.content)
            if not message.tool_calls:
                yield events.completed("max_iterations" if final_turn else _finish(final.finish_reason))
                return
            if final_turn:
                # The model called tools despite tool_choice=none (some local servers ignore it): close the calls
                # and end with an answer instead of silence.
                for call in message.tool_calls:
                    yield events.tool_started(call.id, call.name, call.arguments)
                    result = ToolResult(call.id, call.name, BUDGET_EXHAUSTED_RESULT, is_error=True)
                    self.session.append(result)
                    yield events.tool_finished(call.id, call.name, result.content, is_error=True)
                note = (
                    f"I stopped after {iterations} tool-using steps without reaching a final answer. "
                    "Send another message to let me continue from here."
                )
                self.session.append(AssistantMessage(content=note, model=self.provider.full_model))
                if self.stream_text:
                    yield events.text(note)
                yield events.message(note)
                yield events.completed("max_iterations")
                return
            async for ev in self._run_tools(message.tool_calls, truncated=final.finish_reason == "length"):
                yield ev

    # ---- context management ----

    async def _prepare_context(self) -> AsyncIterator[pb.RunEvent]:
        messages, report = pairing.repair(self.session.messages)
        if report.changed:
            self.session.rewrite(messages)
            self.counter.invalidate()
        tokens = self.counter.estimate(self.system, self._tool_dicts(), self.session.messages)
        if self.compactor.needs_compaction(tokens) and self.compactor.may_compact():
            async for ev in self._compact(force=False):
                yield ev
            tokens = self.counter.estimate(self.system, self._tool_dicts(), self.session.messages)
        if tokens > self.compactor.hard_limit:
            raise RunFailed(
                "context_overflow",
                f"the request needs ~{tokens} tokens but {self.provider.full_model} has a {self.compactor.window}"
                f"-token window ({self.compactor.max_output_tokens} reserved for the answer) and compaction cannot "
                "shrink it further without dropping your message; start a new conversation or use a model with a "
                "larger window",
            )

    def _tool_dicts(self) -> list[dict[str, Any]]:
        return [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tool_specs]

    async def _compact(self, *, force: bool, explicit: bool = False, focus: str = "") -> AsyncIterator[pb.RunEvent]:
        yield events.progress("compacting conversation context" + (" (requested by the model)" if explicit else ""))
        overhead = estimate_text(self.system) + self._tool_schema_tokens
        try:
            outcome = await self.compactor.compact(
                self.session.messages,
                overhead_tokens=overhead,
                provider=self.summarizers or [self.provider],
                api=self.ctx.api,
                run_id=self.ctx.run_id,
                force=force,
                pinned=self._turn_user,
                explicit=explicit,
                focus=focus,
            )
        except CompactionFailed as exc:
            raise RunFailed("context_overflow", str(exc)) from None
        self._last_outcome = outcome
        self.session.rewrite(outcome.messages)
        self.counter.invalidate()
        if self.refresh_system is not None and (outcome.summarized or outcome.collapsed or outcome.stubbed):
            try:
                self.system = await self.refresh_system()
            except Exception as exc:  # noqa: BLE001 — the frozen prompt is still valid, only older
                log.warning("run %s: system prompt not refreshed after compaction: %s", self.ctx.run_id, exc)
        log.info(
            "run %s: compacted %d -> %d tokens (%d stubbed, %d messages summarized, %d steps folded)",
            self.ctx.run_id,
            outcome.tokens_before,
            outcome.tokens_after,
            outcome.stubbed,
            outcome.summarized,
            outcome.collapsed,
        )
        for note in outcome.notes:
            yield events.progress(note)
        if outcome.artifact is not None:
            yield events.artifact_created(outcome.artifact)
        if outcome.checkpoint is not None and self.persist_checkpoints:
            try:
                await self.ctx.api.state_set("conversation", CHECKPOINT_KEY, outcome.checkpoint.to_state())
                yield events.state_updated("conversation", CHECKPOINT_KEY)
            except Exception:  # noqa: BLE001 — the local session still has the summary; the checkpoint is a backup
                pass
        if explicit and not (outcome.summarized or outcome.collapsed or outcome.stubbed):
            return
        yield events.compaction(
            outcome.tokens_before,
            outcome.tokens_after,
            outcome.summary,
            outcome.artifact.artifact_id if outcome.artifact is not None else "",
        )

    # ---- model calls ----

    async def _call_model(self, request: ModelRequest) -> AsyncIterator[pb.RunEvent | _ModelDone]:
        attempt = 0
        compacted_for_overflow = False
        while True:
            emitted = False
            await self._show_images(request)
            try:
                async for ev in self.provider.stream(request):
                    if isinstance(ev, TextChunk):
                        if self.stream_text:
                            emitted = True
                            yield events.text(ev.text)
                    elif isinstance(ev, Final):
                        yield _ModelDone(ev)
                        return
                raise ProviderError(ErrorKind.STREAM_BROKEN, "stream ended without a final message")
            except ProviderError as err:
                if emitted:
                    # Text already reached the user; a retry (or another model's answer) would duplicate it.
                    raise RunFailed(
                        FAILED_CODES[ErrorKind.STREAM_BROKEN],
                        f"the model stream broke mid-answer: {err}",
                        retryable=True,
                    ) from None
                if err.kind == ErrorKind.CONTEXT_OVERFLOW and not compacted_for_overflow:
                    compacted_for_overflow = True
                    async for ev in self._compact(force=True):
                        yield ev
                    request.messages = list(self.session.messages)
                    request.system = self.system
                    continue
                late = False
                delay = 0.0
                give_up = not err.retryable or attempt >= self.config.max_retries
                if not give_up:
                    delay = backoff_delay(attempt + 1, err.retry_after)
                    late = give_up = bool(self.deadline_at and time.time() + delay >= self.deadline_at)
                if give_up:
                    tries = attempt + 1
                    reason = f"{err} (after {tries} attempt{'s' if tries > 1 else ''}" + (
                        "; no time left before the run deadline to retry)" if late else ")"
                    )
                    if falls_back(err) and self._next_fallback < len(self.fallbacks):
                        self._failures.append(ModelFailure(self.provider.full_model, reason))
                        async for ev in self._fall_back(err, reason):
                            yield ev
                        request.messages = list(self.session.messages)
                        request.system = self.system
                        request.max_tokens = self.compactor.max_output_tokens
                        attempt = 0
                        compacted_for_overflow = False
                        continue
                    if self._failures:
                        message = exhausted_message([*self._failures, ModelFailure(self.provider.full_model, reason)])
                    elif late:
                        message = f"{err} (no time left before the run deadline to retry)"
                    else:
                        message = str(err)
                    raise RunFailed(FAILED_CODES[err.kind], message, retryable=err.retryable) from None
                attempt += 1
                log.warning("run %s: %s; retry %d in %.1fs", self.ctx.run_id, err, attempt, delay)
                yield events.retry(attempt, delay, str(err))
                await self.sleep(delay)

    async def _fall_back(self, err: ProviderError, reason: str) -> AsyncIterator[pb.RunEvent]:
        """Moves the run to the next fallback that can be opened. A fallback that cannot (no key, no known
        window, its probe fails) is skipped and named in the failure; with none left the run fails naming all."""
        previous = self.provider.full_model
        first_skipped = len(self._failures)
        while self._next_fallback < len(self.fallbacks):
            slot = self.fallbacks[self._next_fallback]
            self._next_fallback += 1
            try:
                provider, window = await slot.open()
            except (ConfigError, ContextWindowUnknown, ProviderError) as exc:
                self._failures.append(ModelFailure(slot.label, f"could not be used: {exc}"))
                continue
            self.provider = provider
            # The fallback's own window: a smaller one must shrink the context before the first request to it.
            self.compactor.resize(window, min(self.config.max_output_tokens, window // 4))
            self.counter.invalidate()  # the old model's reported prompt sizes say nothing about this one's tokens
            log.warning(
                "run %s: %s failed (%s); moving to fallback model %s", self.ctx.run_id, previous, reason, slot.label
            )
            skipped = "".join(f"; skipped {f}" for f in self._failures[first_skipped:])
            yield events.retry(
                len(self._failures),
                0.0,
                f"{previous} failed: {reason}; continuing on fallback model {provider.full_model}{skipped}",
            )
            async for ev in self._prepare_context():
                yield ev
            return
        raise RunFailed(FAILED_CODES[err.kind], exhausted_message(self._failures), retryable=True)

    def _normalize(self, message: AssistantMessage) -> AssistantMessage:
        """Tool-call ids must be unique across the whole context; some local servers reuse `call_0` every turn."""
        seen = {c.id for m in self.session.messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
        fixed: list[ToolCall] = []
        for call in message.tool_calls:
            cid = call.id
            if not cid or cid in seen:
                cid = f"call_{uuid.uuid4().hex[:24]}"
            seen.add(cid)
            fixed.append(ToolCall(id=cid, name=call.name, arguments=call.arguments))
        message.tool_calls = fixed
        return message

    # ---- tools ----

    def _batches(self, calls: list[ToolCall]) -> list[list[ToolCall]]:
        batches: list[list[ToolCall]] = []
        for call in calls:
            parallel = self.config.parallel_read_only_tools and self.registry.is_read_only(call.name)
            if parallel and batches and all(self.registry.is_read_only(c.name) for c in batches[-1]):
                batches[-1].append(call)
            else:
                batches.append([call])
        return batches

    async def _run_tools(self, calls: list[ToolCall], *, truncated: bool) -> AsyncIterator[pb.RunEvent]:
        for batch in self._batches(calls):
            for call in batch:
                yield events.tool_started(call.id, call.name, call.arguments)
            if len(batch) == 1:
                results = [await self.registry.run(batch[0], self.ctx, truncated=truncated)]
            else:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self.registry.run(c, self.ctx, truncated=truncated)) for c in batch]
                results = [t.result() for t in tasks]
            for result in results:
                async for ev in self._offload_large(result):
                    yield ev
                async for ev in self._store_images(result):
                    yield ev
                self.session.append(result)
                for ev in self.ctx.pending_events:
                    yield ev
                self.ctx.pending_events.clear()
                # The host transcript keeps text: it names the images, so a context rebuilt from it knows of them.
                shown = "".join(
                    f"\n[image {image_label(p)} returned"
                    + (f"; artifact {p.artifact_id} (read_artifact)]" if p.artifact_id else "]")
                    for p in result.images
                )
                yield events.tool_finished(
                    result.tool_call_id,
                    result.name,
                    result.content + shown,
                    is_error=result.is_error,
                    artifact_id=result.artifact_id,
                )
        if self.ctx.compact_request is not None:
            async for ev in self._explicit_compact([c.id for c in calls if c.name == "compact"]):
                yield ev

    async def _explicit_compact(self, call_ids: list[str]) -> AsyncIterator[pb.RunEvent]:
        """The `compact` tool's effect, once the step's calls all have results. The call's result in the working
        context then says what happened (the host transcript keeps the text streamed when the call finished)."""
        focus = self.ctx.compact_request or ""
        self.ctx.compact_request = None
        before = self.counter.estimate(self.system, self._tool_dicts(), self.session.messages)
        if self._explicit_after is not None and before - self._explicit_after < self.compactor.window * 0.10:
            # A model that calls compact in a loop would otherwise buy a summary call per step for nothing.
            text = (
                f"Not compacted: the context (~{before} tokens) has hardly grown since the compaction earlier in "
                "this run. Continue with the request."
            )
        else:
            self._last_outcome = None
            async for ev in self._compact(force=True, explicit=True, focus=focus):
                yield ev
            outcome = self._last_outcome
            assert outcome is not None
            self._explicit_after = outcome.tokens_after
            if not (outcome.summarized or outcome.collapsed or outcome.stubbed):
                text = f"Nothing to compact: the context (~{before} tokens) holds only the current step."
            else:
                done = [
                    f"{outcome.summarized} earlier message(s) summarized" if outcome.summarized else "",
                    f"{outcome.collapsed} step(s) of this request folded into a progress note"
                    if outcome.collapsed
                    else "",
                    f"{outcome.stubbed} old tool output(s) cleared" if outcome.stubbed else "",
                ]
                where = (
                    f" The full transcript before compaction is artifact {outcome.artifact.artifact_id} "
                    "(read_artifact)."
                    if outcome.artifact is not None
                    else " The earlier turns are still in the conversation history (search_history)."
                )
                text = (
                    f"Compacted: ~{outcome.tokens_before} -> ~{outcome.tokens_after} tokens; "
                    + ", ".join(d for d in done if d)
                    + "."
                    + where
                    + " The user's current request is above, verbatim: continue working on it."
                )
        ids = set(call_ids)
        rewritten = [
            dc_replace(m, content=text) if isinstance(m, ToolResult) and m.tool_call_id in ids else m
            for m in self.session.messages
        ]
        self.session.rewrite(rewritten)
        self.counter.invalidate()

    # ---- images ----

    async def _show_images(self, request: ModelRequest) -> None:
        """Decides, for the model the run is on now, whether the request shows images and loads the bytes of the
        newest MAX_IMAGES_PER_REQUEST. Bytes of older images that the host holds are let go (they reload if
        needed); an image that cannot be loaded is shown as a note."""
        request.vision = images.resolve_vision(self.config.vision, self.provider.provider_id, self.provider.model)
        request.images = {}
        if not request.vision:
            return
        wanted = images.newest_keys(request.messages)
        by_key = {p.key: p for p in images.parts_of(request.messages)}
        for key in wanted:
            data = self.ctx.images.get(key)
            if data is None and key not in self._unloadable:
                try:
                    data = await images.load(self.ctx.api, by_key[key])
                except Exception as exc:  # noqa: BLE001 — the model reads a note instead; the run goes on
                    log.warning("run %s: image %s not loaded: %s", self.ctx.run_id, key, exc)
                    self._unloadable.add(key)
                    continue
                self.ctx.images[key] = data
            if data is not None:
                request.images[key] = data
        for key in [k for k in self.ctx.images if k not in request.images and not k.startswith("sha256:")]:
            del self.ctx.images[key]

    async def _store_images(self, result: ToolResult) -> AsyncIterator[pb.RunEvent]:
        """Stores the images a tool returned as host artifacts, so the session can name them and a later run can
        load them; an image that cannot be stored is shown for this run only."""
        for part in result.images:
            data = self.ctx.images.get(part.key)
            if part.artifact_id or data is None:
                continue
            try:
                ref = await self.ctx.api.artifact_create(
                    data,
                    name=part.name or "image",
                    mime_type=part.mime_type,
                    metadata={
                        "kind": "local_agent.tool_image",
                        "tool": result.name,
                        "tool_call_id": result.tool_call_id,
                    },
                )
            except Exception as exc:  # noqa: BLE001 — the image is still shown in this run, from memory
                log.warning("run %s: image from %s not stored: %s", self.ctx.run_id, result.name, exc)
                continue
            self.ctx.images.pop(part.key, None)
            part.artifact_id = ref.artifact_id
            self.ctx.images[part.key] = data
            yield events.artifact_created(ref)

    async def _offload_large(self, result: ToolResult) -> AsyncIterator[pb.RunEvent]:
        # On a small window the configured cap alone could let one result outgrow the whole context; the excerpt
        # then shrinks to what the verbatim tail holds (~3 chars a token, so CJK text is not undercounted badly).
        keep = self.compactor.keep_tokens(estimate_text(self.system) + self._tool_schema_tokens)
        limit = min(self.config.tool_result_max_chars, max(1_000, keep * 3))
        content = result.content
        if len(content) <= limit:
            return
        head = content[: int(limit * 0.4)]
        tail = content[-int(limit * 0.4) :]
        omitted = len(content) - len(head) - len(tail)
        try:
            ref = await self.ctx.api.artifact_create(
                content.encode("utf-8", "replace"),
                name=f"tool-{result.name}-{result.tool_call_id}.txt",
                mime_type="text/plain; charset=utf-8",
                metadata={"kind": "local_agent.tool_result", "tool": result.name, "tool_call_id": result.tool_call_id},
            )
        except Exception as exc:  # noqa: BLE001 — without an artifact the model still gets a bounded excerpt
            result.content = (
                f"{head}\n… [{omitted} chars omitted; the full output could not be stored: {exc}] …\n{tail}"
            )
            return
        result.artifact_id = ref.artifact_id
        result.content = (
            f"{head}\n… [{omitted} chars omitted. The full output ({len(content)} chars) is stored as artifact "
            f"{ref.artifact_id}; use read_artifact to page through it] …\n{tail}"
        )
        yield events.artifact_created(ref)


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length", "content_filter", "refusal") else "stop"


__all__ = ["AgentLoop", "RunFailed"]
