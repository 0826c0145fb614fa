"""Untrusted text (a runner's, a model's, a plugin's log) made safe to write to a terminal. No imports beyond
`re`: `agenthost logs` uses it without loading gRPC."""

from __future__ import annotations

import re

# What a runner or model could write to take over the terminal: escape sequences (ESC, 8-bit CSI/OSC: clipboard
# writes, titles, hyperlinks, cursor moves that repaint what was printed), carriage returns that overwrite the
# line, and bidi overrides. Tabs and newlines stay.
_TERMINAL_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """Untrusted text (a runner's, a model's) made inert for a terminal: control characters other than tab and
    newline are dropped (a carriage return) or shown as U+FFFD (anything else)."""
    return _TERMINAL_UNSAFE.sub(lambda m: "" if m.group() == "\r" else "\ufffd", text)
