"""Tools of a binding's own MCP servers, as the agent's tools: names, schemas and results.

Each is a `Tool` like any other, so it goes through the registry's one dispatch path (argument checks, error
results, whatever gate the registry applies) and the loop's result-size cap. Pure mapping: the MCP session
itself lives in `local_agent.mcp_client`, and nothing here imports the SDK (content is read by duck typing).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agenthost.runners.local_agent import images
from agenthost.runners.local_agent.images import ToolImage, ToolOutput
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

PREFIX = "mcp__"
MAX_NAME = 64  # OpenAI's and Anthropic's limit on tool names
MAX_DESCRIPTION = 2_000
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")
# Top-level schema keywords some providers refuse in a tool's parameters (OpenAI: $schema; none need $id).
_DROPPED_KEYWORDS = ("$schema", "$id")

# (server name, server-side tool name) -> the name the model sees.
Key = tuple[str, str]


def namespaced(pairs: Iterable[Key]) -> dict[Key, str]:
    """`mcp__<server>__<tool>`, reduced to [A-Za-z0-9_-] and at most 64 chars. Deterministic for a given set: pairs
    are taken in sorted order and one that collides with an earlier name, or is too long, gets a digest suffix of
    its own (server, tool), so the names (part of the prompt-cache prefix) do not change from run to run."""
    names: dict[Key, str] = {}
    taken: set[str] = set()
    for server, tool in sorted(set(pairs)):
        name = f"{PREFIX}{server}__{_NOT_NAME.sub('_', tool)}"
        if len(name) > MAX_NAME or name in taken:
            digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
            name = f"{name[: MAX_NAME - 9]}_{digest}"
        taken.add(name)
        names[(server, tool)] = name
    return names


def parameters(schema: Any) -> dict[str, Any]:
    """The server's input schema as the provider gets it: an object schema, minus keywords providers refuse."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return {"type": "object", "properties": {}}
    out = {k: copy.deepcopy(v) for k, v in schema.items() if k not in _DROPPED_KEYWORDS}
    out["type"] = "object"
    if not isinstance(out.get("properties"), dict):
        out["properties"] = {}
    return out


def render(result: Any) -> tuple[str, bool, list[ToolImage]]:
    """A CallToolResult as (text for the model, is_error, images). An image whose bytes are one of the types
    models take (sniffed, not the server's word) and within the size cap reaches the model like a `read_file`
    image; other images and audio become a note."""
    parts: list[str] = []
    shown: list[ToolImage] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(str(item.text))
        elif kind in ("image", "audio"):
            declared = getattr(item, "mime_type", None) or "unknown type"
            try:
                data = base64.b64decode(getattr(item, "data", "") or "", validate=True)
            except (binascii.Error, ValueError):
                data = b""
            mime = images.sniff(data) if kind == "image" and len(data) <= images.MAX_IMAGE_BYTES else ""
            if mime:
                shown.append(ToolImage(name=f"image-{len(shown) + 1}", mime_type=mime, data=data))
                parts.append(f"[image {len(shown)} ({mime}, {len(data)} bytes)]")
            else:
                parts.append(f"[{kind} ({declared}, {len(data)} bytes) returned by the tool; not shown]")
        elif kind == "resource_link":
            label = f" ({item.name})" if getattr(item, "name", None) else ""
            parts.append(f"[resource link: {item.uri}{label}]")
        elif kind == "resource":
            res = item.resource
            text = getattr(res, "text", None)
            if text is not None:
                parts.append(str(text))
            else:
                parts.append(f"[binary resource {res.uri} ({getattr(res, 'mime_type', None) or 'unknown type'})]")
        else:
            parts.append(f"[{kind or 'unknown'} content not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts) or "(no output)", bool(getattr(result, "is_error", False)), shown


# Calls the server's tool: (server-side tool name, arguments) -> CallToolResult. Raises ToolError for transport
# failures (a timeout, a crashed server), with the server named.
Caller = Callable[[str, dict[str, Any]], Awaitable[Any]]


class McpTool(Tool):
    """One tool of one server. Never read-only to the loop: the server's own readOnlyHint is its claim, not ours."""

    # The schema is the server's, per instance (base.py builds a validator per schema, not per class).
    dynamic_schema = True

    def __init__(self, *, exposed: str, server: str, tool: str, description: str, schema: Any, call: Caller) -> None:
        self.name = exposed  # type: ignore[misc]
        self.server = server
        self.tool = tool
        text = (description or "").strip()
        text = text[:MAX_DESCRIPTION] + ("…" if len(text) > MAX_DESCRIPTION else "")
        self.description = f"[MCP server {server}] {text}".rstrip()  # type: ignore[misc]
        self.parameters = parameters(schema)  # type: ignore[misc]
        self._call = call

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str | ToolOutput:
        text, is_error, shown = render(await self._call(self.tool, args))
        if is_error:
            raise ToolError(f"MCP server {self.server}, tool {self.tool}: {text}")
        return ToolOutput(text, tuple(shown)) if shown else text
