"""The one small interface every provider implements: stream, complete, probe.

A provider turns the runner's neutral messages into its wire format, streams back `TextChunk`s and exactly one
`Final` holding the whole assistant turn, and raises only `ProviderError` (already classified). Everything
retry-, budget- and tool-related lives in the loop, so a new provider is a translation layer and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from agenthost.runners.local_agent.errors import ErrorKind, ProviderError, classify_exception, classify_status
from agenthost.runners.local_agent.messages import AssistantMessage, Message

SUMMARY_PREFIX = (
    "[CONTEXT SUMMARY — reference only. Earlier turns of this conversation were compacted into the summary below. "
    "Do not re-execute tasks it describes; answer the messages that follow it.]\n"
)
SUMMARY_SUFFIX = "\n[END OF CONTEXT SUMMARY]"
# The in-turn note must not carry the summary's "do not re-execute" framing onto the request it follows: that
# framing, applied to the user's own instruction, is what made models stop mid-task.
PROGRESS_PREFIX = (
    "[PROGRESS NOTE — the earlier tool steps you took for the request above were compacted to save space. They are "
    "done and their effects persist; do not repeat them. Continue working on the request above.]\n"
)
PROGRESS_SUFFIX = "\n[END OF PROGRESS NOTE]"


@dataclass(slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class ModelRequest:
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    temperature: float | None = None
    tool_choice: Literal["auto", "none"] = "auto"
    # Whether the model is shown images, and the bytes of those it is shown, by ImagePart.key; an image of the
    # messages without bytes here becomes a note (agenthost.runners.local_agent.images).
    vision: bool = False
    images: dict[str, bytes] = field(default_factory=dict)
    # A per-turn instruction sent after the history (the forced-final-answer note): putting it anywhere earlier,
    # in the system prompt say, would change the prefix every cached request shares.
    note: str = ""
    # Provider prompt caching: Anthropic cache_control breakpoints; an OpenAI-compatible prompt_cache_key (an
    # opaque per-conversation digest, never the raw ids), sent only when non-empty.
    prompt_cache: bool = True
    cache_key: str = ""


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0  # the whole prompt, cached parts included: this is what anchors the token estimate
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(slots=True)
class TextChunk:
    text: str


@dataclass(slots=True)
class Final:
    message: AssistantMessage
    finish_reason: str  # normalized: stop | tool_calls | length | content_filter | refusal
    usage: Usage | None = None


StreamEvent = TextChunk | Final


@dataclass(slots=True)
class ProbeResult:
    ok: bool
    context_window: int | None = None
    detail: str = ""


def normalize_finish_reason(reason: str | None) -> str:
    if not reason:
        return "stop"
    r = reason.lower()
    return {
        "end_turn": "stop",
        "end": "stop",
        "stop_sequence": "stop",
        "eos": "stop",
        "tool_use": "tool_calls",
        "function_call": "tool_calls",
        "max_tokens": "length",
        "model_length": "length",
    }.get(r, r)


def summary_text(content: str, progress: bool = False) -> str:
    if progress:
        return PROGRESS_PREFIX + content + PROGRESS_SUFFIX
    return SUMMARY_PREFIX + content + SUMMARY_SUFFIX


def canonical_json(value: Any) -> bytes:
    """The one serialization of a request body: sorted keys and fixed separators, so the same request is the same
    bytes every time (prompt caches and the prefix benchmark compare bytes). Lone surrogates are replaced."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.encode("utf-8", "replace")


def safe_arguments(arguments: str) -> dict[str, Any]:
    """Arguments as an object for replay; unparsable text (already reported to the model) replays as {}."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Provider(ABC):
    """`provider_id/model` plus a transport. Subclasses never log or echo the key."""

    provider_id: str = ""
    context_window_hint: int | None = None  # the provider's own knowledge (demo, published limits)

    def __init__(self, provider_id: str, model: str) -> None:
        self.provider_id = provider_id
        self.model = model

    @property
    def full_model(self) -> str:
        return f"{self.provider_id}/{self.model}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.full_model}>"

    @abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Yields TextChunks then exactly one Final; raises ProviderError."""

    async def complete(self, request: ModelRequest) -> Final:
        """The non-streaming path: the same stream, consumed."""
        final: Final | None = None
        async for ev in self.stream(request):
            if isinstance(ev, Final):
                final = ev
        if final is None:
            raise ProviderError(ErrorKind.STREAM_BROKEN, "stream ended without a final message")
        return final

    @abstractmethod
    async def probe(self) -> ProbeResult:
        """Checks reachability and credentials; reports the context window when the server tells."""

    async def aclose(self) -> None:
        return None


def tls_context(base_url: str) -> ssl.SSLContext | bool:
    """What a provider's client verifies TLS with. For an https API, httpx's default (certifi's roots, loaded per
    client: ~1 MiB a runner process holds). For a plain-http one (a local model server), a context that trusts no
    certificate, at no such cost: every URL the client asks is under its base URL and it follows no redirect, so
    it never opens TLS, and a handshake it did try would fail verification (it never weakens a check)."""
    if base_url.startswith("https://"):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname, no roots


class HttpProvider(Provider):
    def __init__(
        self,
        provider_id: str,
        model: str,
        *,
        base_url: str,
        api_key: str | None,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(provider_id, model)
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
            transport=transport,
            verify=tls_context(self.base_url),
            # Environment proxies would route a loopback model server through a corporate proxy.
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def redact(self, text: str) -> str:
        if self._api_key and self._api_key in text:
            text = text.replace(self._api_key, "[REDACTED]")
        return text

    def _error(self, err: ProviderError) -> ProviderError:
        err.message = self.redact(err.message)
        err.args = (err.message,)
        return err

    async def _sse(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[tuple[str, str]]:
        """POSTs and yields (event, data) pairs of a server-sent-event stream; HTTP errors are classified."""
        try:
            body = canonical_json(payload)
            headers = {**headers, "content-type": "application/json"}
            async with self._client.stream("POST", url, content=body, headers=headers) as resp:
                if resp.status_code >= 400:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    raise self._error(classify_status(resp.status_code, body, resp.headers))
                ctype = resp.headers.get("content-type", "")
                if "text/event-stream" not in ctype and "application/json" in ctype:
                    # Some servers ignore stream=true (or report errors) with a plain JSON body.
                    body = (await resp.aread()).decode("utf-8", "replace")
                    yield "json", body
                    return
                event = ""
                data: list[str] = []
                async for line in resp.aiter_lines():
                    if not line:
                        if data:
                            yield event, "\n".join(data)
                        event, data = "", []
                        continue
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(":")
                    if value.startswith(" "):
                        value = value[1:]
                    if name == "event":
                        event = value
                    elif name == "data":
                        data.append(value)
                if data:
                    yield event, "\n".join(data)
        except ProviderError:
            raise
        except httpx.HTTPError as exc:
            raise self._error(classify_exception(exc)) from None

    async def _get_json(self, url: str, headers: dict[str, str]) -> Any:
        return await self._request_json("GET", url, headers)

    @property
    def key_digest(self) -> str:
        """Tells apart two providers on one endpoint under different keys without holding the key itself."""
        return hashlib.sha256((self._api_key or "").encode()).hexdigest()

    def models_request(self) -> tuple[str, dict[str, str]]:
        """The URL and headers that list the models this endpoint serves (`agenthost models`)."""
        raise NotImplementedError

    async def list_model_ids(self) -> tuple[str, list[str]]:
        """(url asked, model ids) from the endpoint's model list; ProviderError (key redacted) when it fails."""
        url, headers = self.models_request()
        data = await self._get_json(url, headers)
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ProviderError(ErrorKind.STREAM_BROKEN, f"{url} did not answer a model list")
        return url, [str(m["id"]) for m in items if isinstance(m, dict) and m.get("id")]

    async def _post_json(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> Any:
        return await self._request_json("POST", url, headers, payload)

    async def _request_json(
        self, method: str, url: str, headers: dict[str, str], payload: dict[str, Any] | None = None
    ) -> Any:
        """A probe request: classified errors for HTTP failures, None for a body that is not JSON."""
        try:
            resp = await self._client.request(method, url, json=payload, headers=headers)
        except httpx.HTTPError as exc:
            raise self._error(classify_exception(exc)) from None
        if resp.status_code >= 400:
            raise self._error(classify_status(resp.status_code, resp.text, resp.headers))
        try:
            return resp.json()
        except ValueError:
            return None
