"""One classifier for every provider failure, and the retry policy that acts on its verdict.

Each failure becomes a `ProviderError` with a `kind`; the loop decides from the kind alone: retry with backoff,
compact and retry once, or fail the run with a typed code. Nothing else in the runner inspects status codes.
"""

from __future__ import annotations

import email.utils
import enum
import json
import random
import re
import time
from typing import Any

import httpx

MAX_BACKOFF_SECONDS = 30.0


class ErrorKind(enum.StrEnum):
    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    SERVER = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    AUTH = "auth"
    CONTEXT_OVERFLOW = "context_overflow"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "model_not_found"
    STREAM_BROKEN = "stream_broken"  # malformed stream, or the server closed it mid-answer


RETRYABLE = {
    ErrorKind.RATE_LIMIT,
    ErrorKind.OVERLOADED,
    ErrorKind.SERVER,
    ErrorKind.TIMEOUT,
    ErrorKind.CONNECTION,
    ErrorKind.STREAM_BROKEN,
}


class ProviderError(Exception):
    def __init__(
        self, kind: ErrorKind, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status else ""
        return f"{self.kind.value}{where}: {self.message}"


class ContextWindowUnknown(Exception):
    """Neither the config nor the server says how large the model's window is; guessing overflows silently."""


_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|prompt is too long|context window|"
    r"too many tokens|max_model_len|exceeds the (?:available )?context|n_ctx|slot context|"
    r"context length exceeded|input is too long|reduce the length of the messages|request too large",
    re.IGNORECASE,
)
# 5xx bodies that are really malformed requests: retrying them only burns the budget.
_VALIDATION = re.compile(r"unknown parameter|invalid_request_error|unrecognized request argument", re.IGNORECASE)
_AUTH = re.compile(r"invalid[ _]api[ _]key|authentication|unauthorized|permission", re.IGNORECASE)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; negative clamps to 0."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, float(when.timestamp()) - (time.time() if now is None else now))


def backoff_delay(attempt: int, retry_after: float | None = None, *, base: float = 1.0) -> float:
    """Exponential backoff, jittered over the upper half of each step, capped; a server's Retry-After wins
    (clamped to the same cap, so a hostile header cannot park the run for an hour)."""
    if retry_after is not None:
        return min(retry_after, MAX_BACKOFF_SECONDS)
    ceiling = min(MAX_BACKOFF_SECONDS, base * 2.0 ** max(0, attempt - 1))
    return min(MAX_BACKOFF_SECONDS, ceiling / 2 + random.uniform(0, ceiling / 2))


def _error_text(body: Any) -> tuple[str, str]:
    """(type, message) from an OpenAI- or Anthropic-shaped error body, or the raw text."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            etype = str(err.get("type") or err.get("code") or "")
            msg = str(err.get("message") or json.dumps(err)[:500])
            return etype, msg
        return "", str(err)[:500]
    return "", str(body)[:500]


def classify_status(
    status: int, body_text: str, headers: httpx.Headers | dict[str, str] | None = None
) -> ProviderError:
    try:
        body: Any = json.loads(body_text) if body_text else {}
    except ValueError:
        body = body_text
    etype, msg = _error_text(body)
    text = f"{etype} {msg}"
    retry_after = parse_retry_after((headers or {}).get("retry-after"))
    if _OVERFLOW.search(text) and status in (400, 413, 422, 500):
        return ProviderError(ErrorKind.CONTEXT_OVERFLOW, msg or "context overflow", status=status)
    if status in (401, 403):
        return ProviderError(ErrorKind.AUTH, msg or "authentication failed", status=status)
    if status == 404:
        return ProviderError(ErrorKind.NOT_FOUND, msg or "not found", status=status)
    if status == 429:
        return ProviderError(ErrorKind.RATE_LIMIT, msg or "rate limited", status=status, retry_after=retry_after)
    if status == 529 or "overloaded" in etype:
        return ProviderError(ErrorKind.OVERLOADED, msg or "overloaded", status=status, retry_after=retry_after)
    if status == 408:
        return ProviderError(ErrorKind.TIMEOUT, msg or "request timeout", status=status, retry_after=retry_after)
    if status >= 500:
        if _VALIDATION.search(text):
            return ProviderError(ErrorKind.BAD_REQUEST, msg, status=status)
        return ProviderError(ErrorKind.SERVER, msg or f"server error {status}", status=status, retry_after=retry_after)
    return ProviderError(ErrorKind.BAD_REQUEST, msg or f"HTTP {status}", status=status)


def classify_stream_error(payload: Any) -> ProviderError:
    """An error object delivered inside an HTTP 200 stream (Anthropic `event: error`, some OpenAI proxies)."""
    etype, msg = _error_text(payload)
    text = f"{etype} {msg}"
    if "overloaded" in etype:
        return ProviderError(ErrorKind.OVERLOADED, msg or "overloaded")
    if "rate_limit" in etype:
        return ProviderError(ErrorKind.RATE_LIMIT, msg)
    if _OVERFLOW.search(text):
        return ProviderError(ErrorKind.CONTEXT_OVERFLOW, msg)
    if "authentication" in etype or "permission" in etype:
        return ProviderError(ErrorKind.AUTH, msg)
    if "invalid_request" in etype:
        return ProviderError(ErrorKind.BAD_REQUEST, msg)
    return ProviderError(ErrorKind.SERVER, msg or "error inside stream")


def classify_exception(exc: BaseException) -> ProviderError:
    """Transport failures from httpx; anything already classified passes through."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(ErrorKind.TIMEOUT, f"{type(exc).__name__}: request timed out")
    if isinstance(exc, httpx.RemoteProtocolError):
        return ProviderError(ErrorKind.STREAM_BROKEN, f"connection closed mid-response: {exc}")
    if isinstance(exc, (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.NetworkError)):
        return ProviderError(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.HTTPError):
        return ProviderError(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}")
    raise exc
