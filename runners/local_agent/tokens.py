"""Token estimates: CJK-aware character weights, checked against the provider's reported prompt size.

A chars/4 rule undercounts Chinese, Japanese and Korean text by 3-4x (one ideograph is roughly one token or more),
which is exactly how a CJK conversation overflows a window the estimate said was half empty. The provider's report
is not trusted blindly either: local servers have been seen to leave the tool schemas out, to count only the
uncached part of the prompt, or to send a constant. So the count is the larger of the two: the report (plus an
estimate of what was added since) and the runner's own estimate of everything, tool schemas included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agenthost.runners.local_agent.images import IMAGE_TOKENS
from agenthost.runners.local_agent.messages import AssistantMessage, Message, Summary, ToolResult, UserMessage

PER_MESSAGE_OVERHEAD = 4
# The framing a provider wraps around a summary or progress note (providers.base.SUMMARY_PREFIX and friends).
SUMMARY_FRAME_TOKENS = 60


def _is_cjk(cp: int) -> bool:
    return (
        0x3040 <= cp <= 0x30FF  # hiragana, katakana
        or 0x3400 <= cp <= 0x4DBF
        or 0x4E00 <= cp <= 0x9FFF
        or 0xAC00 <= cp <= 0xD7AF  # hangul syllables
        or 0xF900 <= cp <= 0xFAFF
        or 0xFF00 <= cp <= 0xFFEF  # full-width forms
        or 0x20000 <= cp <= 0x2FA1F
    )


def estimate_text(text: str) -> int:
    if not text:
        return 0
    if text.isascii():
        return (len(text) + 3) // 4
    cjk = 0
    other_non_ascii = 0
    for ch in text:
        cp = ord(ch)
        if cp < 128:
            continue
        if _is_cjk(cp):
            cjk += 1
        else:
            other_non_ascii += 1
    ascii_chars = len(text) - cjk - other_non_ascii
    # CJK ~1.0 token per char (the 1.0 rather than 0.7 is deliberate: overestimating compacts early, which is cheap;
    # underestimating overflows). Other non-ASCII (accents, Cyrillic, emoji) ~0.5.
    return (ascii_chars + 3) // 4 + cjk + (other_non_ascii + 1) // 2


def estimate_message(msg: Message) -> int:
    n = PER_MESSAGE_OVERHEAD + estimate_text(msg.content)
    if isinstance(msg, AssistantMessage):
        for call in msg.tool_calls:
            n += PER_MESSAGE_OVERHEAD + estimate_text(call.name) + estimate_text(call.arguments)
        if msg.reasoning:
            n += estimate_text(msg.reasoning)
        for block in msg.thinking:
            n += estimate_text(str(block.get("thinking", "")))
    elif isinstance(msg, ToolResult):
        n += 8 + IMAGE_TOKENS * len(msg.images)
    elif isinstance(msg, UserMessage):
        # Every image counts, shown or not: a note is cheaper, but the count must not depend on the model.
        n += IMAGE_TOKENS * len(msg.images)
    elif isinstance(msg, Summary):
        n += SUMMARY_FRAME_TOKENS
    return n


def estimate_messages(messages: list[Message]) -> int:
    return sum(estimate_message(m) for m in messages)


def estimate_tools(schemas: list[dict[str, Any]]) -> int:
    # Tool schemas are sent on every call and count against the window just like messages.
    return estimate_text(json.dumps(schemas)) if schemas else 0


@dataclass
class UsageAnchor:
    """The last real prompt size the provider reported, and how many context messages it covered."""

    prompt_tokens: int
    message_count: int
    generation: int  # bumps whenever the context is rewritten (compaction), invalidating the anchor


class TokenCounter:
    def __init__(self) -> None:
        self._anchor: UsageAnchor | None = None
        self.generation = 0

    def invalidate(self) -> None:
        self.generation += 1
        self._anchor = None

    def record(self, prompt_tokens: int, message_count: int) -> None:
        if prompt_tokens > 0:
            self._anchor = UsageAnchor(prompt_tokens, message_count, self.generation)

    def estimate(self, system: str, tools: list[dict[str, Any]], messages: list[Message]) -> int:
        own = estimate_text(system) + estimate_tools(tools) + estimate_messages(messages)
        a = self._anchor
        if a is not None and a.generation == self.generation and a.message_count <= len(messages):
            # A report above the estimate is real information (images, a tokenizer heavier than ours); one below
            # it is as likely a server that left something out, and undercounting is what overflows a window.
            return max(own, a.prompt_tokens + estimate_messages(messages[a.message_count :]))
        return own
