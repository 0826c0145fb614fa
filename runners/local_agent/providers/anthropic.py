"""Anthropic Messages: streaming, tools, extended thinking replayed verbatim to the model that produced it.

Also serves local servers exposing `/v1/messages` (Ollama, llama.cpp, vLLM, LM Studio) when configured with
their base URL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agenthost.runners.local_agent import images
from agenthost.runners.local_agent.errors import ErrorKind, ProviderError, classify_stream_error
from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolCall, ToolResult, UserMessage
from agenthost.runners.local_agent.providers.base import (
    Final,
    HttpProvider,
    ModelRequest,
    ProbeResult,
    StreamEvent,
    TextChunk,
    Usage,
    normalize_finish_reason,
    safe_arguments,
    summary_text,
)
from agenthost.runners.local_agent.providers.openai import known_window
from agenthost.runners.local_agent.providers.tool_args import coerce_tool_name, repair_arguments

API_VERSION = "2023-06-01"
KNOWN_WINDOWS = {"claude-": 200_000}


class AnthropicProvider(HttpProvider):
    def __init__(
        self,
        provider_id: str,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        timeout: float,
        thinking_budget: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(provider_id, model, base_url=base_url, api_key=api_key, timeout=timeout, transport=transport)
        self.thinking_budget = thinking_budget
        self._send_cache_control = True
        self.context_window_hint = known_window(model, KNOWN_WINDOWS)

    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json", "anthropic-version": API_VERSION, "accept": "text/event-stream"}
        if self._api_key:
            h["x-api-key"] = self._api_key
        return h

    def models_request(self) -> tuple[str, dict[str, str]]:
        headers = {"anthropic-version": API_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return self._url("models"), headers

    def _url(self, path: str) -> str:
        base = self.base_url if self.base_url.endswith("/v1") else f"{self.base_url}/v1"
        return f"{base}/{path}"

    def build_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def push(role: str, blocks: list[dict[str, Any]]) -> None:
            if not blocks:
                return
            # Consecutive same-role turns are merged: tool results and the next user text share one user turn,
            # with the tool_result blocks first as the API requires.
            if out and out[-1]["role"] == role:
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": role, "content": blocks})

        for m in request.messages:
            if isinstance(m, UserMessage):
                shown, notes = images.split(m.images, request.vision, request.images, "image attachment")
                text = images.with_notes(m.content, notes)
                # Images before the text they come with: the order Anthropic recommends.
                user_blocks = [_image_block(part, data) for part, data in shown]
                if text or not shown:
                    user_blocks.append({"type": "text", "text": text or "(empty message)"})
                push("user", user_blocks)
            elif isinstance(m, Summary):
                push("user", [{"type": "text", "text": summary_text(m.content, m.progress)}])
            elif isinstance(m, ToolResult):
                shown, notes = images.split(m.images, request.vision, request.images)
                text = images.with_notes(m.content, notes) or "(empty)"
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": [{"type": "text", "text": text}, *(_image_block(p, d) for p, d in shown)]
                    if shown
                    else text,
                }
                if m.is_error:
                    block["is_error"] = True
                push("user", [block])
            else:
                blocks: list[dict[str, Any]] = []
                if m.thinking and m.model == self.full_model:
                    # Signed thinking must come back byte-for-byte, or the API rejects the turn.
                    blocks.extend(m.thinking)
                elif m.thinking or m.reasoning:
                    pass  # another model's reasoning: not replayable here, and not part of the answer
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                for c in m.tool_calls:
                    blocks.append(
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": safe_arguments(c.arguments)}
                    )
                push("assistant", blocks)
        if request.note:
            push("user", [{"type": "text", "text": request.note}])
        if out and out[0]["role"] != "user":
            out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(conversation continues)"}]})
        return out

    def build_payload(self, request: ModelRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "messages": self.build_messages(request),
        }
        cache = request.prompt_cache and self._send_cache_control
        if request.system:
            payload["system"] = [{"type": "text", "text": request.system}]
        if self.thinking_budget:
            payload["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
            payload["max_tokens"] = max(request.max_tokens, self.thinking_budget + 1024)
        elif request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.tools:
            payload["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
            payload["tool_choice"] = {"type": request.tool_choice}
        if cache:
            _add_breakpoints(payload)
        return payload

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        url = self._url("messages")
        try:
            events = self._sse(url, self.build_payload(request), self._headers())
            first = await anext(events, None)
        except ProviderError as err:
            if not (err.kind == ErrorKind.BAD_REQUEST and "cache_control" in err.message and self._send_cache_control):
                raise
            # A /v1/messages server that rejects the field: requests go without breakpoints from now on.
            self._send_cache_control = False
            events = self._sse(url, self.build_payload(request), self._headers())
            first = await anext(events, None)
        async for ev in self._parse(first, events):
            yield ev

    async def _parse(
        self, first: tuple[str, str] | None, rest: AsyncIterator[tuple[str, str]]
    ) -> AsyncIterator[StreamEvent]:
        blocks: dict[int, dict[str, Any]] = {}
        partial_json: dict[int, list[str]] = {}
        usage = Usage()
        stop_reason: str | None = None
        finished = False

        async def frames() -> AsyncIterator[tuple[str, str]]:
            if first is not None:
                yield first
            async for f in rest:
                yield f

        async for event, data in frames():
            try:
                obj = json.loads(data)
            except ValueError:
                raise ProviderError(ErrorKind.STREAM_BROKEN, f"unparsable stream event: {data[:200]!r}") from None
            etype = event or (obj.get("type") if isinstance(obj, dict) else "")
            if event == "json":
                etype = "json"
            if etype == "error" or (isinstance(obj, dict) and obj.get("type") == "error"):
                # An error inside an HTTP 200 stream (overloaded_error is the usual one).
                raise self._error(classify_stream_error(obj))
            if etype == "message_start":
                usage = _usage((obj.get("message") or {}).get("usage") or {})
            elif etype == "content_block_start":
                idx = int(obj.get("index", len(blocks)))
                blocks[idx] = dict(obj.get("content_block") or {})
                if blocks[idx].get("type") == "tool_use":
                    partial_json[idx] = []
                    if blocks[idx].get("input"):
                        partial_json[idx].append(json.dumps(blocks[idx]["input"]))
                elif blocks[idx].get("type") == "text" and blocks[idx].get("text"):
                    yield TextChunk(blocks[idx]["text"])
            elif etype == "content_block_delta":
                idx = int(obj.get("index", 0))
                block = blocks.setdefault(idx, {"type": "text", "text": ""})
                delta = obj.get("delta") or {}
                dtype = delta.get("type")
                if dtype == "text_delta":
                    block["text"] = block.get("text", "") + delta.get("text", "")
                    if delta.get("text"):
                        yield TextChunk(delta["text"])
                elif dtype == "thinking_delta":
                    block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
                elif dtype == "signature_delta":
                    block["signature"] = block.get("signature", "") + delta.get("signature", "")
                elif dtype == "input_json_delta":
                    partial_json.setdefault(idx, []).append(delta.get("partial_json", ""))
            elif etype == "message_delta":
                stop_reason = (obj.get("delta") or {}).get("stop_reason") or stop_reason
                u = obj.get("usage") or {}
                if u.get("output_tokens") is not None:
                    usage.output_tokens = int(u["output_tokens"])
                if u.get("input_tokens"):
                    usage.input_tokens = int(u["input_tokens"]) + usage.cache_read_tokens + usage.cache_write_tokens
            elif etype == "message_stop":
                finished = True
            elif etype == "json" and isinstance(obj, dict) and obj.get("type") == "message":
                # A server that ignored stream=true.
                for i, b in enumerate(obj.get("content") or []):
                    blocks[i] = b
                    if b.get("type") == "text" and b.get("text"):
                        yield TextChunk(b["text"])
                stop_reason = obj.get("stop_reason")
                usage = _usage(obj.get("usage") or {})
                finished = True
        if not finished:
            raise ProviderError(ErrorKind.STREAM_BROKEN, "stream ended before message_stop")
        text: list[str] = []
        thinking: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        for idx in sorted(blocks):
            b = blocks[idx]
            btype = b.get("type")
            if btype == "text":
                text.append(b.get("text", ""))
            elif btype in ("thinking", "redacted_thinking"):
                thinking.append(b)
            elif btype == "tool_use":
                raw = "".join(partial_json.get(idx, []))
                calls.append(
                    ToolCall(
                        id=str(b.get("id") or f"toolu_{idx}"),
                        name=coerce_tool_name(str(b.get("name") or "")),
                        arguments=repair_arguments(raw),
                    )
                )
        message = AssistantMessage(content="".join(text), tool_calls=calls, model=self.full_model, thinking=thinking)
        reason = normalize_finish_reason(stop_reason)
        if calls and reason == "stop":
            reason = "tool_calls"
        yield Final(message=message, finish_reason=reason, usage=usage)

    async def probe(self) -> ProbeResult:
        data = await self._get_json(self._url(f"models/{self.model}"), self._headers())
        window = None
        if isinstance(data, dict):
            for key in ("max_input_tokens", "context_window"):
                if isinstance(data.get(key), int):
                    window = data[key]
        return ProbeResult(ok=True, context_window=window or self.context_window_hint)


def _image_block(part: Any, data: bytes) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": part.mime_type, "data": images.b64(data)}}


def _usage(u: dict[str, Any]) -> Usage:
    """Anthropic reports the uncached part as input_tokens; the whole prompt (what anchors the token estimate) is
    that plus the tokens read from and written to the cache."""
    read = int(u.get("cache_read_input_tokens") or 0)
    write = int(u.get("cache_creation_input_tokens") or 0)
    return Usage(
        input_tokens=int(u.get("input_tokens") or 0) + read + write,
        output_tokens=int(u.get("output_tokens") or 0),
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


EPHEMERAL = {"type": "ephemeral"}


def _add_breakpoints(payload: dict[str, Any]) -> None:
    """The four breakpoints Anthropic allows: the last tool schema (caches all tools), the system prompt (tools +
    system), the last block of the latest message (the whole conversation so far, which the next request finds as
    its prefix), and the last block of the user turn before it — where the previous request put its last one, so
    the read hits even when a step added more blocks than the API looks back over (20) from a breakpoint. Markers
    are not part of the cached content: moving them forward each turn still hits what earlier requests wrote."""
    tools = payload.get("tools")
    if tools:
        tools[-1]["cache_control"] = dict(EPHEMERAL)
    system = payload.get("system")
    if system:
        system[-1]["cache_control"] = dict(EPHEMERAL)
    messages = payload.get("messages") or []
    # Turns alternate (same-role turns are merged), so [-3] is the previous request's latest user turn.
    for message in (messages[-1], messages[-3]) if len(messages) >= 3 else messages[-1:]:
        # Thinking blocks cannot carry a breakpoint; these are user turns, so this is only a guard.
        for block in reversed(message["content"]):
            if block.get("type") not in ("thinking", "redacted_thinking"):
                block["cache_control"] = dict(EPHEMERAL)
                break
