"""Server-sent events over an aiohttp StreamResponse, with writes that cannot stall the gateway for long.

Buffering is bounded twice: aiohttp's writer waits for the socket to drain past its high-water mark, and while it
waits the run's replies pile up in the host's per-subscriber inbox, which drops a subscriber that falls
limits.INBOX_MAX_BYTES behind (the run never waits for a client). A reader that stops reading altogether is cut
after STALL_SECONDS, so it holds a socket and a task, not a run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

STALL_SECONDS = 30.0
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a reverse proxy in front must not hold deltas back
}


def encode(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One event. JSON escapes line breaks inside strings, so `data` is always a single line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def comment(text: str) -> bytes:
    """An SSE comment line: every conforming reader (the `openai` client library's included) skips it, so it can
    carry what the OpenAI wire format has no field for, such as a run waiting in the host's queue."""
    return f": {' '.join(text.splitlines())}\n\n".encode()


class EventStream:
    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers={**HEADERS, **headers})

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, events: list[bytes]) -> None:
        """Raises ConnectionError when the client went away and TimeoutError when it stopped reading."""
        if not events:
            return
        async with asyncio.timeout(STALL_SECONDS):
            await self.response.write(b"".join(events))

    async def close(self) -> None:
        async with asyncio.timeout(STALL_SECONDS):
            await self.response.write_eof()
