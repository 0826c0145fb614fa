"""A request's JSON object body, read under a byte cap and a time limit, for both the OpenAI-compatible endpoints
and the console API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from agenthost.host.gateway.errors import GatewayError, bad_request

BODY_SECONDS = 30.0  # to read a request body: a trickling client holds a socket briefly


def too_large(max_bytes: int) -> GatewayError:
    return GatewayError(413, f"the request body is larger than {max_bytes} bytes", code="request_too_large")


async def json_object(request: web.Request, max_bytes: int, *, require_json_type: bool = False) -> dict[str, Any]:
    """The body as a JSON object. Read chunk by chunk, so a body without Content-Length is cut off at the cap
    rather than read whole first. `require_json_type`: refuse other content types with 415 (the console needs
    it: a cross-site form cannot send application/json without a preflight)."""
    if require_json_type and request.content_type != "application/json":
        raise GatewayError(415, "send JSON (Content-Type: application/json)", code="unsupported_media_type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_SECONDS):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise GatewayError(408, f"the request body did not arrive within {BODY_SECONDS:.0f}s") from None
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body
