"""Fallback models: where a run goes when its model keeps failing for reasons another model would not share.

A failure moves the run on only after the retry policy has given up on it, and only when it is about the
server, not the request: rate limits, overload, 5xx, timeouts, dropped connections and broken streams. An auth
error or a bad request would fail the same way on a misconfigured fallback, or hide the misconfiguration of the
primary behind a silently different model, so those end the run. The run stays on the model it moved to; the
next run starts again at the primary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agenthost.runners.local_agent.errors import RETRYABLE, ErrorKind, ProviderError
from agenthost.runners.local_agent.providers.base import Provider

FALLBACK_KINDS: frozenset[ErrorKind] = frozenset(RETRYABLE)


def falls_back(err: ProviderError) -> bool:
    return err.kind in FALLBACK_KINDS


@dataclass(frozen=True)
class ModelSlot:
    """A fallback model, opened only when the run moves to it: building it can fail (a missing key) and
    resolving its window can mean a probe of its server, neither of which a healthy primary should pay for."""

    label: str  # provider/model, for notices and the failure message
    open: Callable[[], Awaitable[tuple[Provider, int]]]  # the provider and its context window


@dataclass(frozen=True)
class ModelFailure:
    label: str
    reason: str

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}"


def exhausted_message(failures: list[ModelFailure]) -> str:
    return "every configured model failed — " + "; ".join(str(f) for f in failures)


__all__ = ["FALLBACK_KINDS", "ModelFailure", "ModelSlot", "exhausted_message", "falls_back"]
