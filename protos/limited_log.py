"""The one limit on log lines an untrusted party can make a process write again and again (a refused call, a
malformed request, a stranger's chat message, a forged button press): at most REFUSALS_PER_WINDOW lines of a kind a
window, then one line that counts the rest. The host (agenthost.host.ops.logs) and the plugin side (channel adapters,
the HTTP listeners of agenthost.protos.listeners) both use it; standard library only."""

from __future__ import annotations

import logging
import time

# Refusals are logged at most this many per kind and window; the rest are counted and summed up in one line.
REFUSALS_PER_WINDOW = 20
REFUSAL_WINDOW_SECONDS = 60.0


class RefusalLimiter:
    """At most `per_window` lines per refusal kind and window: a client hammering a refused door costs the log a
    few lines a minute and one summary, not a line per attempt. Kinds are the host's own strings (surface and
    status code), never a caller's, so the table stays small."""

    def __init__(self, per_window: int = REFUSALS_PER_WINDOW, window: float = REFUSAL_WINDOW_SECONDS) -> None:
        self.per_window = per_window
        self.window = window
        self._windows: dict[str, list[float]] = {}  # kind -> [window start, lines written, suppressed]

    def allow(self, kind: str, now: float | None = None) -> tuple[bool, int]:
        """Whether to log this one, and how many were suppressed in the window that just ended (to report)."""
        now = time.monotonic() if now is None else now
        state = self._windows.get(kind)
        suppressed = 0
        if state is None or now - state[0] >= self.window:
            suppressed = int(state[2]) if state is not None else 0
            state = self._windows[kind] = [now, 0.0, 0.0]
        if state[1] < self.per_window:
            state[1] += 1
            return True, suppressed
        state[2] += 1
        return False, suppressed


def log_limited(
    limiter: RefusalLimiter,
    logger: logging.Logger,
    kind: str,
    level: int,
    message: str,
    *args: object,
    exc_info: BaseException | None = None,
) -> None:
    """A line an untrusted caller can make the host write again and again (a refused call, a worker's reconnect, a
    failing dependency it keeps asking for): at most `limiter.per_window` a window of `kind` (the host's own string),
    then one line that counts the rest."""
    allowed, suppressed = limiter.allow(kind)
    if suppressed:
        logger.warning("%d more lines of kind %s in the last minute, not logged one by one", suppressed, kind)
    if allowed:
        logger.log(level, message, *args, exc_info=exc_info)
