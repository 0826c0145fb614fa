from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from agenthost.runners.local_agent.errors import (
    MAX_BACKOFF_SECONDS,
    ErrorKind,
    ProviderError,
    backoff_delay,
    classify_exception,
    classify_status,
    classify_stream_error,
    parse_retry_after,
)


def test_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("-3") == 0.0
    now = time.time()
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert 18 <= (parse_retry_after(date, now=now) or 0) <= 21
    assert parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    for attempt in range(1, 12):
        d = backoff_delay(attempt)
        ceiling = min(MAX_BACKOFF_SECONDS, 2 ** (attempt - 1))
        assert ceiling / 2 <= d <= ceiling
    assert backoff_delay(1, retry_after=12) == 12
    assert backoff_delay(1, retry_after=600) == MAX_BACKOFF_SECONDS
    assert len({backoff_delay(5) for _ in range(20)}) > 1


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (429, '{"error":{"message":"slow down"}}', ErrorKind.RATE_LIMIT),
        (401, '{"error":{"message":"Incorrect API key"}}', ErrorKind.AUTH),
        (403, "forbidden", ErrorKind.AUTH),
        (529, '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}', ErrorKind.OVERLOADED),
        (503, "upstream down", ErrorKind.SERVER),
        (500, '{"error":{"message":"Unknown parameter: foo","type":"invalid_request_error"}}', ErrorKind.BAD_REQUEST),
        (400, '{"error":{"code":"context_length_exceeded","message":"too long"}}', ErrorKind.CONTEXT_OVERFLOW),
        (
            400,
            '{"object":"error","message":"This model\'s maximum context length is 4096 tokens"}',
            ErrorKind.CONTEXT_OVERFLOW,
        ),
        (
            400,
            '{"error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens"}}',
            ErrorKind.CONTEXT_OVERFLOW,
        ),
        (
            400,
            '{"error":{"message":"the request exceeds the available context size (n_ctx)"}}',
            ErrorKind.CONTEXT_OVERFLOW,
        ),
        (400, '{"error":{"message":"bad"}}', ErrorKind.BAD_REQUEST),
        (404, '{"error":{"message":"model not found"}}', ErrorKind.NOT_FOUND),
        (408, "", ErrorKind.TIMEOUT),
    ],
)
def test_status_classification(status: int, body: str, kind: ErrorKind) -> None:
    err = classify_status(status, body, {"retry-after": "3"})
    assert err.kind == kind
    assert err.retryable == (kind in {ErrorKind.RATE_LIMIT, ErrorKind.OVERLOADED, ErrorKind.SERVER, ErrorKind.TIMEOUT})
    if kind == ErrorKind.RATE_LIMIT:
        assert err.retry_after == 3.0


def test_stream_and_transport_errors() -> None:
    assert classify_stream_error({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}).retryable
    assert classify_stream_error({"error": {"type": "authentication_error", "message": "x"}}).kind == ErrorKind.AUTH
    req = httpx.Request("POST", "http://127.0.0.1")
    assert classify_exception(httpx.ReadTimeout("t", request=req)).kind == ErrorKind.TIMEOUT
    assert classify_exception(httpx.ConnectError("refused", request=req)).kind == ErrorKind.CONNECTION
    assert classify_exception(httpx.RemoteProtocolError("closed", request=req)).kind == ErrorKind.STREAM_BROKEN
    same = ProviderError(ErrorKind.AUTH, "x")
    assert classify_exception(same) is same
    with pytest.raises(ValueError):
        classify_exception(ValueError("not a transport error"))
