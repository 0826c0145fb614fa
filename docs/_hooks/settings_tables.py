"""MkDocs hook: a page that holds `<!-- settings: package.module:Model -->` gets, in its place, the table of every
setting of that pydantic model (dotted names for nested settings), with type, default, limits and description, all
read from the model's JSON Schema. The runners' pages are built this way so their settings cannot drift from the
code: a setting added, renamed or re-bounded shows up in the next `make docs`."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

_MARKER = re.compile(r"<!--\s*settings:\s*([\w.]+):(\w+)\s*-->")
_LIMITS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} chars"),
    ("maxLength", "at most {} chars"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("pattern", "matches `{}`"),
)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MARKER.sub(lambda m: _table(m.group(1), m.group(2)), markdown)


def _table(module: str, name: str) -> str:
    model = getattr(importlib.import_module(module), name)
    schema = model.model_json_schema()
    rows: list[str] = []
    _rows(schema, schema.get("$defs", {}), "", rows)
    head = "| setting | type | default | limits | what it does |\n| --- | --- | --- | --- | --- |\n"
    return head + "\n".join(rows) + "\n"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _object_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The nested settings object a field holds (directly or as the one non-null choice), else None."""
    choices = [_resolve(c, defs) for c in node.get("anyOf", [node])]
    objects = [c for c in choices if c.get("type") == "object" and "properties" in c]
    others = [c for c in choices if c.get("type") not in ("object", "null")]
    return objects[0] if len(objects) == 1 and not others else None


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _resolve(node, defs)
    if "anyOf" in node:
        return " or ".join(dict.fromkeys(_type(c, defs) for c in node["anyOf"]))
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    kind = node.get("type", "any")
    if kind == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object":
        if "properties" in node:
            return node.get("title", "object")
        extra = node.get("additionalProperties")
        return f"map of {_type(extra, defs)}" if isinstance(extra, dict) else "object"
    return str(kind)


def _limits(node: dict[str, Any], defs: dict[str, Any]) -> str:
    found = []
    for choice in [_resolve(c, defs) for c in node.get("anyOf", [node])]:
        found += [text.format(choice[key]) for key, text in _LIMITS if key in choice]
    return ", ".join(dict.fromkeys(found))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _rows(schema: dict[str, Any], defs: dict[str, Any], prefix: str, rows: list[str]) -> None:
    required = set(schema.get("required", []))
    for key, raw in schema.get("properties", {}).items():
        node = _resolve(raw, defs)
        name = prefix + key
        nested = _object_of(node, defs)
        if key in required:
            default = "required"
        elif nested is not None:
            default = "see below"
        else:
            default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        rows.append(
            f"| `{name}` | {_cell(_type(node, defs))} | {_cell(default)} | {_cell(_limits(node, defs))} "
            f"| {_cell(node.get('description', ''))} |"
        )
        if nested is not None:
            _rows(nested, defs, name + ".", rows)
