"""Text shaping any platform needs: splitting a long reply into messages, and one-line error notices."""

from __future__ import annotations

from agenthost.protos.text import one_line

__all__ = ["one_line", "split_text"]


def split_text(text: str, limit: int) -> list[str]:
    """Splits `text` into pieces of at most `limit` characters, preferring a paragraph break, then a line break,
    then a space, in the last part of each window; a piece never ends mid-word unless the word is longer than
    `limit`. Greedy, so the pieces of a prefix are stable once the text has grown past them: streamed text can be
    split again on every update without earlier messages changing."""
    if limit < 1:
        raise ValueError("limit must be positive")
    pieces: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = -1
        # Only breaks in the second half count: a break near the start would make a tiny message.
        for sep in ("\n\n", "\n", " "):
            at = window.rfind(sep, limit // 2)
            if at > 0:
                cut = at + len(sep)
                break
        if cut <= 0:
            cut = limit
        pieces.append(rest[:cut].rstrip("\n") or rest[:cut])
        rest = rest[cut:]
    if rest or not pieces:
        pieces.append(rest)
    return pieces
