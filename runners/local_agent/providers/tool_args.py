"""Tool-call argument text from local models is often not quite JSON; this is the one place that fixes it up.

Repairs are conservative: anything that still does not parse is kept as-is, so the loop can tell the model its
arguments were invalid instead of running a tool with guessed input.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def coerce_tool_name(name: str) -> str:
    """Providers require ^[A-Za-z0-9_-]{1,64}$ when a call is replayed; some models emit dots or spaces."""
    if _NAME_OK.match(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name.strip())[:64]
    return cleaned or "unknown_tool"


def _balance(text: str) -> str:
    """Closes unterminated strings/objects/arrays, string-aware."""
    stack: list[str] = []
    in_str = False
    escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack and stack[-1] == ch:
            stack.pop()
    closing = ('"' if in_str else "") + "".join(reversed(stack))
    return text + closing


def repair_arguments(raw: str | dict[str, Any] | None) -> str:
    """Returns canonical JSON text for an object when the input can be made into one, else the raw text."""
    if raw is None:
        return "{}"
    if isinstance(raw, dict):
        return json.dumps(raw, ensure_ascii=False)
    text = raw.strip()
    if not text:
        return "{}"
    for candidate in (text, _TRAILING_COMMA.sub(r"\1", text)):
        try:
            value = json.loads(candidate, strict=False)  # strict=False admits raw control chars inside strings
        except ValueError:
            continue
        if isinstance(value, str):
            # Double-encoded: the arguments object arrived as a JSON string.
            try:
                value = json.loads(value, strict=False)
            except ValueError:
                return raw
        return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else raw
    balanced = _balance(_TRAILING_COMMA.sub(r"\1", text))
    try:
        value = json.loads(_TRAILING_COMMA.sub(r"\1", balanced), strict=False)
    except ValueError:
        return raw
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else raw


def split_concatenated(text: str) -> list[str] | None:
    """`{"a":1}{"b":2}` — two calls merged into one slot (Ollama sends index 0 for every parallel call)."""
    decoder = json.JSONDecoder(strict=False)
    parts: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        parts.append(json.dumps(value, ensure_ascii=False))
        pos = end
    return parts if len(parts) > 1 else None
