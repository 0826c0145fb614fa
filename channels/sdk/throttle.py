"""Per-chat pacing of outgoing platform calls: a minimum interval per chat, a per-minute budget per chat (groups
are stricter), a global per-second budget, and the platform's own "retry after N s" answers honoured per chat.

Telegram documents ~1 message per second per chat, 20 per minute per group and ~30 per second overall; a 429
carries `retry_after`. Edits count like messages. Other platforms pass their own numbers.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Limits:
    per_chat_interval: float = 1.0
    per_group_minute: int = 20
    global_per_second: int = 30


@dataclass
class _Chat:
    next_at: float = 0.0
    recent: collections.deque[float] = field(default_factory=collections.deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Pacer:
    def __init__(self, limits: Limits | None = None, clock: collections.abc.Callable[[], float] = time.monotonic):
        self.limits = limits or Limits()
        self._clock = clock
        self._chats: dict[Hashable, _Chat] = {}
        self._global: collections.deque[float] = collections.deque()

    def _chat(self, chat: Hashable) -> _Chat:
        state = self._chats.get(chat)
        if state is None:
            state = self._chats[chat] = _Chat()
        return state

    def delay(self, chat: Hashable, group: bool = False) -> float:
        """How long the next call to `chat` must wait (0: it may go now)."""
        now = self._clock()
        state = self._chat(chat)
        wait = max(0.0, state.next_at - now)
        if group:
            while state.recent and now - state.recent[0] >= 60.0:
                state.recent.popleft()
            if len(state.recent) >= self.limits.per_group_minute:
                wait = max(wait, 60.0 - (now - state.recent[0]))
        while self._global and now - self._global[0] >= 1.0:
            self._global.popleft()
        if len(self._global) >= self.limits.global_per_second:
            wait = max(wait, 1.0 - (now - self._global[0]))
        return wait

    async def acquire(self, chat: Hashable, group: bool = False) -> None:
        """Waits for `chat`'s turn and takes it. Calls to one chat go one at a time, in order."""
        state = self._chat(chat)
        async with state.lock:
            # A time-based wait by nature: the limit is a rate, there is no event to wait for.
            while (wait := self.delay(chat, group)) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            now = self._clock()
            state.next_at = now + self.limits.per_chat_interval
            if group:
                state.recent.append(now)
            self._global.append(now)

    def retry_after(self, chat: Hashable, seconds: float) -> None:
        """The platform said: nothing to this chat for `seconds`."""
        state = self._chat(chat)
        state.next_at = max(state.next_at, self._clock() + seconds)
