"""Untrusted text (a runner's, a model's, a plugin's log) made safe to write to a terminal. No imports beyond
`re`: `agenthost logs` uses it without loading gRPC."""

from __future__ import annotations

import re

# What a runner or model could write to take over the terminal: escape sequences (ESC, 8-bit CSI/OSC: clipboard
# writes, titles, hyperlinks, cursor moves that repaint what was printed), carriage returns that overwrite the
# line, and bidi controls (overrides, isolates and marks) that reorder what is shown. Tabs and newlines stay.
_BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
# In JSON text too (json.dumps escapes C0 inside strings, but with ensure_ascii=False keeps DEL, C1 and bidi raw).
_UNSAFE = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
# The same plus tab and newline: for text that must stay on one line (a tool name on an approval prompt).
UNSAFE_IN_A_LINE = re.compile(rf"[\x00-\x1f\x7f-\x9f{_BIDI}]")


def terminal_safe(text: str) -> str:
    """Untrusted text (a runner's, a model's) made inert for a terminal: control characters other than tab and
    newline are dropped (a carriage return) or shown as U+FFFD (anything else)."""
    return _UNSAFE.sub(lambda m: "" if m.group() == "\r" else "\ufffd", text)


def json_safe(text: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False) with every character a terminal could act on written as a
    `\\uXXXX` escape. JSON's own syntax is ASCII, so such a character can only stand inside a string, where the
    escape is the same value: a consumer reads the same data, a terminal shows plain text, and other non-ASCII text
    stays readable (which ensure_ascii=True would give up)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
