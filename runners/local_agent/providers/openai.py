"""OpenAI-compatible Chat Completions: OpenAI itself and the local servers that speak it (Ollama, vLLM,
llama.cpp's llama-server, LM Studio), with the streaming quirks each of them has shipped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from agenthost.runners.local_agent import images
from agenthost.runners.local_agent.errors import ErrorKind, ProviderError, classify_stream_error
from agenthost.runners.local_agent.messages import (
    AssistantMessage,
    Summary,
    ToolCall,
    ToolResult,
    UserMessage,
    image_label,
)
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
from agenthost.runners.local_agent.providers.tool_args import coerce_tool_name, repair_arguments, split_concatenated

# Published context windows of hosted models, longest prefix wins. Only for models whose window is documented;
# anything else must come from the config or a server probe.
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
}


# Request parameters the provider can learn to drop (stream_options, prompt_cache_key, the max-tokens name).
MAX_ADAPTATIONS = 3


def known_window(model: str, table: dict[str, int]) -> int | None:
    best: tuple[int, int] | None = None
    for prefix, window in table.items():
        if model.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), window)
    return best[1] if best else None


@dataclass
class _Slot:
    id: str | None = None
    name: str | None = None
    args: list[str] = field(default_factory=list)


class ToolCallAccumulator:
    """Rebuilds tool calls from streamed deltas, whatever the server does with `index` and `id`.

    Handles: arguments split over many chunks (OpenAI, vLLM); a whole call in one chunk (Ollama); `index` missing
    (old Ollama) or 0 for every parallel call (Ollama, LiteLLM) — a new `id` opens a new call; the name repeated
    in every chunk; arguments sent as an object instead of text; no id at all (synthesized).
    """

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self._by_index: dict[int, _Slot] = {}

    def add(self, delta: dict[str, Any]) -> None:
        idx = delta.get("index")
        cid = delta.get("id") or None
        fn = delta.get("function") or {}
        name = fn.get("name") or None
        args = fn.get("arguments")
        if isinstance(args, (dict, list)):
            args = json.dumps(args, ensure_ascii=False)
        slot: _Slot | None = None
        if cid is not None:
            slot = next((s for s in self.slots if s.id == cid), None)
            if slot is None and idx is not None:
                existing = self._by_index.get(idx)
                if existing is not None and existing.id is None:
                    slot = existing  # the id arrived after the first fragment
        elif idx is not None:
            slot = self._by_index.get(idx)
            if slot is not None and name and slot.name and name != slot.name:
                slot = None  # a different tool reusing the index: a new call
        elif self.slots:
            last = self.slots[-1]
            if not (name and last.name and name != last.name):
                slot = last
        if slot is None:
            slot = _Slot()
            self.slots.append(slot)
        if idx is not None:
            self._by_index[idx] = slot
        if cid and not slot.id:
            slot.id = cid
        if name and not slot.name:
            slot.name = name
        if args:
            slot.args.append(args)

    def calls(self) -> list[ToolCall]:
        out: list[ToolCall] = []
        for slot in self.slots:
            raw = "".join(slot.args)
            if not slot.name:
                if not raw.strip():
                    continue  # an empty fragment with neither name nor arguments carries nothing
                slot.name = "unknown_tool"
            name = coerce_tool_name(slot.name)
            pieces = split_concatenated(raw) if raw.strip().startswith("{") else None
            if pieces and repair_arguments(raw) == raw:
                for n, piece in enumerate(pieces):
                    cid = slot.id if n == 0 and slot.id else f"call_{uuid.uuid4().hex[:24]}"
                    out.append(ToolCall(id=cid, name=name, arguments=piece))
                continue
            out.append(
                ToolCall(id=slot.id or f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=repair_arguments(raw))
            )
        return out


class OpenAICompatProvider(HttpProvider):
    """`flavor` names the server family so the probe can ask it for the real context window."""

    def __init__(
        self,
        provider_id: str,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        timeout: float,
        flavor: str = "openai",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(provider_id, model, base_url=base_url, api_key=api_key, timeout=timeout, transport=transport)
        self.flavor = flavor
        self._send_stream_options = True
        self._send_cache_key = True
        # OpenAI's own API has deprecated max_tokens (reasoning models reject it); local servers only know it.
        self._max_tokens_key = "max_completion_tokens" if provider_id == "openai" else "max_tokens"
        self.context_window_hint = known_window(model, KNOWN_WINDOWS) if flavor == "openai" else None

    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "text/event-stream"}
        if self._api_key:
            h["authorization"] = f"Bearer {self._api_key}"
        return h

    def build_messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if request.system:
            out.append({"role": "system", "content": request.system})
        # Tool messages hold text only: the images of a run of tool results follow it in one user message (a user
        # message between two tool messages of one call group would break the pairing the API checks).
        follow_up: list[dict[str, Any]] = []

        def flush() -> None:
            if follow_up:
                out.append({"role": "user", "content": [{"type": "text", "text": images.FOLLOW_UP_TEXT}, *follow_up]})
                follow_up.clear()

        for m in request.messages:
            if not isinstance(m, ToolResult):
                flush()
            if isinstance(m, UserMessage):
                shown, notes = images.split(m.images, request.vision, request.images, "image attachment")
                text = images.with_notes(m.content, notes)
                if not shown:
                    out.append({"role": "user", "content": text})
                    continue
                content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
                content.extend(_image_url(part, data) for part, data in shown)
                out.append({"role": "user", "content": content})
            elif isinstance(m, Summary):
                out.append({"role": "user", "content": summary_text(m.content, m.progress)})
            elif isinstance(m, ToolResult):
                shown, notes = images.split(m.images, request.vision, request.images)
                text = images.with_notes(m.content or ("" if m.images else "(empty)"), notes)
                for part, data in shown:
                    text = images.with_notes(text, images.TOOL_IMAGE_NOTE.format(label=image_label(part)))
                    follow_up.append({"type": "text", "text": f"{image_label(part)} from {m.name} ({m.tool_call_id}):"})
                    follow_up.append(_image_url(part, data))
                out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": text})
            else:
                msg: dict[str, Any] = {"role": "assistant", "content": m.content or None}
                if m.tool_calls:
                    msg["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(safe_arguments(c.arguments))},
                        }
                        for c in m.tool_calls
                    ]
                if m.reasoning is not None and m.model == self.full_model:
                    # Thinking-mode servers (DeepSeek, vLLM/llama.cpp reasoning parsers) demand their reasoning back.
                    msg["reasoning_content"] = m.reasoning
                if msg["content"] is None and not m.tool_calls:
                    msg["content"] = ""
                out.append(msg)
        flush()
        if request.note:
            out.append({"role": "user", "content": request.note})
        return out

    def build_payload(self, request: ModelRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "messages": self.build_messages(request),
            self._max_tokens_key: request.max_tokens,
        }
        if self._send_stream_options:
            payload["stream_options"] = {"include_usage": True}
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.tools:
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
            payload["tool_choice"] = request.tool_choice
        if request.prompt_cache and request.cache_key and self._send_cache_key:
            # Routes a conversation's requests to the same cache shard (OpenAI); harmless where ignored.
            payload["prompt_cache_key"] = request.cache_key
        return payload

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        url = f"{self.base_url}/chat/completions"
        # A strict gateway names one rejected field per answer; each adaptation drops one, so a few rounds suffice.
        for _ in range(MAX_ADAPTATIONS):
            try:
                stream = self._sse(url, self.build_payload(request), self._headers())
                first = await anext(stream, None)
                break
            except ProviderError as err:
                if not self._adapt(err):
                    raise
        else:
            stream = self._sse(url, self.build_payload(request), self._headers())
            first = await anext(stream, None)
        async for ev in self._parse(first, stream):
            yield ev

    def _adapt(self, err: ProviderError) -> bool:
        """Learns from a rejected request parameter; True when a retry with the adjusted payload makes sense."""
        if err.kind != ErrorKind.BAD_REQUEST:
            return False
        if "prompt_cache_key" in err.message and self._send_cache_key:
            # A server that rejects unknown fields: caching stays on whatever the server does by itself.
            self._send_cache_key = False
            return True
        if "stream_options" in err.message and self._send_stream_options:
            # Strict gateways reject unknown keys; usage then only comes when the server volunteers it.
            self._send_stream_options = False
            return True
        if self._max_tokens_key in err.message:
            other = "max_tokens" if self._max_tokens_key == "max_completion_tokens" else "max_completion_tokens"
            if other in err.message or "unsupported" in err.message.lower() or "unrecognized" in err.message.lower():
                self._max_tokens_key = other
                return True
        return False

    async def _parse(
        self, first: tuple[str, str] | None, stream: AsyncIterator[tuple[str, str]]
    ) -> AsyncIterator[StreamEvent]:
        text_parts: list[str] = []
        reasoning_parts: list[str] | None = None
        acc = ToolCallAccumulator()
        finish: str | None = None
        usage: Usage | None = None
        done = False

        async def frames() -> AsyncIterator[tuple[str, str]]:
            if first is not None:
                yield first
            async for f in stream:
                yield f

        async for event, data in frames():
            if data.strip() == "[DONE]":
                # Keep reading to the end of the body rather than break: an unread body makes httpx drop the
                # keep-alive connection, costing a TCP (and TLS) handshake on every model call.
                done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                raise ProviderError(ErrorKind.STREAM_BROKEN, f"unparsable stream chunk: {data[:200]!r}") from None
            if not isinstance(obj, dict):
                continue
            if "error" in obj and not obj.get("choices"):
                raise self._error(classify_stream_error(obj))
            if event == "json":
                # A non-streamed completion body.
                for choice in obj.get("choices") or []:
                    m = choice.get("message") or {}
                    if m.get("content"):
                        text_parts.append(m["content"])
                        yield TextChunk(m["content"])
                    rc = m.get("reasoning_content", m.get("reasoning"))
                    if rc is not None:
                        reasoning_parts = (reasoning_parts or []) + [str(rc)]
                    for i, tc in enumerate(m.get("tool_calls") or []):
                        acc.add({"index": i, **tc})
                    finish = choice.get("finish_reason") or finish
                usage = _usage(obj.get("usage")) or usage
                done = True
                break
            if obj.get("usage"):
                usage = _usage(obj["usage"]) or usage
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or choice.get("message") or {}
                content = delta.get("content")
                if content:
                    text_parts.append(content)
                    yield TextChunk(content)
                for key in ("reasoning_content", "reasoning"):
                    if key in delta and delta[key] is not None:
                        reasoning_parts = reasoning_parts if reasoning_parts is not None else []
                        reasoning_parts.append(str(delta[key]))
                        break
                for tc in delta.get("tool_calls") or []:
                    acc.add(tc)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and finish is None:
            raise ProviderError(ErrorKind.STREAM_BROKEN, "stream ended before a finish_reason or [DONE]")
        calls = acc.calls()
        reason = normalize_finish_reason(finish)
        if calls and reason == "stop":
            reason = "tool_calls"  # servers that report "stop" with tool calls (LiteLLM/Ollama)
        if not calls and reason == "tool_calls":
            reason = "stop"
        message = AssistantMessage(
            content="".join(text_parts),
            tool_calls=calls,
            model=self.full_model,
            reasoning="".join(reasoning_parts) if reasoning_parts is not None else None,
        )
        yield Final(message=message, finish_reason=reason, usage=usage)

    def models_request(self) -> tuple[str, dict[str, str]]:
        return f"{self.base_url}/models", {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def probe(self) -> ProbeResult:
        headers = self._headers()
        data = await self._get_json(f"{self.base_url}/models", headers)
        window: int | None = None
        detail = ""
        models = data.get("data", []) if isinstance(data, dict) else []
        entry = next((m for m in models if isinstance(m, dict) and m.get("id") == self.model), None)
        if entry:
            for key in ("max_model_len", "context_length", "context_window", "max_context_length"):
                if isinstance(entry.get(key), int):
                    window = entry[key]
                    break
        root = self.base_url.removesuffix("/v1")
        if window is None and self.flavor == "llamacpp":
            props = await self._get_json(f"{root}/props", headers)
            if isinstance(props, dict):
                n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
                if isinstance(n_ctx, int):
                    window = n_ctx
        if window is None and self.flavor == "lmstudio":
            info = await self._get_json(f"{root}/api/v0/models/{self.model}", headers)
            if isinstance(info, dict):
                window = info.get("loaded_context_length") or info.get("max_context_length")
        if window is None and self.flavor == "ollama":
            window, detail = await self._ollama_window(root, headers)
        return ProbeResult(ok=True, context_window=window or self.context_window_hint, detail=detail)

    async def _ollama_window(self, root: str, headers: dict[str, str]) -> tuple[int | None, str]:
        # /v1 ignores the model's trained length and runs at the server's num_ctx; only a loaded model (api/ps)
        # or an explicit num_ctx parameter tells the real figure.
        ps = await self._get_json(f"{root}/api/ps", headers)
        for m in (ps or {}).get("models", []) if isinstance(ps, dict) else []:
            if m.get("name") in (self.model, f"{self.model}:latest") and isinstance(m.get("context_length"), int):
                return m["context_length"], ""
        show = await self._post_json(f"{root}/api/show", {"model": self.model}, headers)
        if isinstance(show, dict):
            for line in str(show.get("parameters", "")).splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
                    return int(parts[1]), ""
        return None, (
            "Ollama's OpenAI endpoint runs at the server's num_ctx (often 4096), not the model's trained length; "
            "set context_window to the value you configured (OLLAMA_CONTEXT_LENGTH or a Modelfile num_ctx)"
        )


def _image_url(part: Any, data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": images.data_url(part.mime_type, data)}}


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details") or {}
    prompt = int(raw.get("prompt_tokens") or 0)
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    # OpenAI counts cached tokens inside prompt_tokens; a server reporting more cached than prompt tokens counts
    # them apart (the processed part only), and the whole prompt is the sum.
    return Usage(
        input_tokens=prompt + cached if cached > prompt else prompt,
        output_tokens=int(raw.get("completion_tokens") or 0),
        cache_read_tokens=cached,
    )
