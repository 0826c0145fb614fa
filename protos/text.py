"""The one rule for untrusted text (a runner's error, a model's words, a conversation id a client chose, a plugin's
log) written where a person reads it: a terminal, a log file read on one, a chat notice. The host, the channel SDK
and the runners all import agenthost.protos, so all of them use this module; it imports nothing beyond the standard
library, so `agenthost logs` uses it without loading gRPC."""

from __future__ import annotations

import json
import logging
import re

# What could take over a terminal: escape sequences (ESC, 8-bit CSI/OSC: clipboard writes, titles, hyperlinks,
# cursor moves that repaint what was printed), carriage returns that overwrite the line, DEL, and bidi controls
# (overrides, isolates and marks) that reorder what is shown. Tabs and newlines stay.
_BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
# In JSON text too (json.dumps escapes C0 inside strings, but with ensure_ascii=False keeps DEL, C1 and bidi raw).
UNSAFE = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
# The same plus tab and newline: for text that must stay on one line (a tool name on an approval prompt).
UNSAFE_IN_A_LINE = re.compile(rf"[\x00-\x1f\x7f-\x9f{_BIDI}]")
# What would hide or reorder a name someone else chose (a conversation id a client or chat sent, a runner id or tool
# name a plugin offers) or a tool call's arguments an approver reads: the same plus the zero-width and invisible
# format characters, which free text keeps (a ZWJ joins an emoji, a ZWNJ is part of Persian and Hindi spelling) but
# which let "tg\u200b:42" pass for the chat tg:42. The console's `ident` (console_static/dom.js HIDDEN) is this set.
HIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# Whole escape sequences, 7-bit (ESC [ …, ESC ] … BEL/ST) and 8-bit (CSI U+009B, OSC U+009D … ST U+009C), for
# text kept plain: a colour code then leaves no residue.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)|\x1b[@-Z\\-_]"
)


def terminal_safe(text: str) -> str:
    """Untrusted text made inert for a terminal: control characters other than tab and newline are dropped (a
    carriage return) or shown as U+FFFD (anything else), so a reader sees that something was there."""
    return UNSAFE.sub(lambda m: "" if m.group() == "\r" else "\ufffd", text)


def json_safe(text: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False) with every character a terminal could act on written as a
    `\\uXXXX` escape. JSON's own syntax is ASCII, so such a character can only stand inside a string, where the
    escape is the same value: a consumer reads the same data, a terminal shows plain text, and other non-ASCII text
    stays readable (which ensure_ascii=True would give up)."""
    return UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def ident(text: str) -> str:
    """A name someone else chose, as what it is: every HIDDEN character written as a `\\uXXXX` escape, so two names
    that look alike are told apart and none reorders the text around it."""
    return HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def plain_text(text: str) -> str:
    """`text` without escape sequences or control characters (newlines and tabs kept): a program's stderr (a
    harness's colours, titles, links) as words."""
    return UNSAFE.sub("", _SEQUENCE.sub("", text))


def one_line(text: str, limit: int = 300) -> str:
    """The first non-blank line of `text`, without control characters, at most `limit` characters: what a user is
    shown of an error (the full text stays in the host's run record)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = UNSAFE_IN_A_LINE.sub("", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def call_arguments(arguments_json: str, truncated: bool, limit: int) -> str:
    """A tool call's arguments as shown to the person deciding whether it may run, next to the runner's one-line
    summary: that summary is cut (a shell command at 300 characters), so a model could pad a command until what
    matters lies past the cut. Compact JSON on one line (a newline in a command shows as `\\n`), with every character
    a terminal could act on, or that could hide in it (`ident`), escaped, at most `limit` characters, and said so
    when more was left out."""
    try:
        text = json.dumps(json.loads(arguments_json), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        text = json.dumps(arguments_json, ensure_ascii=False)
    text = ident(text)  # inside JSON strings only (JSON's syntax is ASCII): the same value, nothing hidden
    if len(text) > limit:
        text, truncated = text[: limit - 1] + "…", True
    return text + (" (cut: the arguments are longer than shown)" if truncated else "")


class TerminalSafeFormatter(logging.Formatter):
    """A plain-text log formatter whose every line (message, arguments, traceback) is terminal_safe: a plugin's
    stderr log quotes what chat users, models and harnesses wrote."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))
