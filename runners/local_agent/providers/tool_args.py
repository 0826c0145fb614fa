"""Tool-call argument text from local models is often not quite JSON; this is the one place that fixes it up.

Two stages. The fast path is the standard parser plus the two repairs that cover most streams (trailing commas,
unterminated strings/brackets). What it cannot parse goes to `json_repair`, which knows the rest of what small
models write: single quotes, Python literals (True/None), code fences, unquoted keys, prose around the object.
Repairs stay conservative: the second stage only accepts a non-empty object from text that contains one, so prose
never becomes guessed input, and anything still unparsable is kept as-is for the loop to report to the model.
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


def repair_arguments(raw: str | dict[str, Any] | None, *, second_stage: bool = True) -> str:
    """Returns canonical JSON text for an object when the input can be made into one, else the raw text.
    `second_stage=False` runs the fast path alone (the repair-rate measurement compares the two)."""
    if raw is None:
        return "{}"
    if isinstance(raw, dict):
        return json.dumps(raw, ensure_ascii=False)
    text = raw.strip()
    if not text:
        return "{}"
    value = _fast_path(text)
    if value is None and second_stage:
        value = _second_stage(text)
    return json.dumps(value, ensure_ascii=False) if value is not None else raw


def _fast_path(text: str) -> dict[str, Any] | None:
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
                return None
        return value if isinstance(value, dict) else None
    balanced = _balance(_TRAILING_COMMA.sub(r"\1", text))
    try:
        value = json.loads(_TRAILING_COMMA.sub(r"\1", balanced), strict=False)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _second_stage(text: str) -> dict[str, Any] | None:
    """json_repair, accepted only when it yields a non-empty object from text that holds one."""
    if "{" not in text:
        return None  # prose with no object in it: reporting the error beats inventing arguments
    if split_concatenated(text) is not None:
        return None  # several calls merged into one slot: the caller splits them
    # Imported here, at the first argument text the fast path could not parse: most runs never get one, and the
    # package is ~1 MiB of every runner process that loads the local agent.
    from json_repair import repair_json

    try:
        value = repair_json(text, return_objects=True)
    except Exception:  # noqa: BLE001 — a third-party parser's failure is just "not repairable"
        return None
    if isinstance(value, str):
        # Double-encoded and also malformed: the object sits inside a JSON string.
        try:
            value = repair_json(value, return_objects=True) if "{" in value else None
        except Exception:  # noqa: BLE001
            return None
    return value if isinstance(value, dict) and value else None


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
