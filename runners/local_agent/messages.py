"""The runner's own, provider-neutral working-context messages, and their JSON form on disk.

Providers translate these to their wire shapes; the session persists them one JSON object per line. Keeping
provider-specific payloads (Anthropic thinking blocks, OpenAI-compatible reasoning_content) on the assistant
message, tagged with the model that produced them, is what lets a later request replay them verbatim to the same
model and downgrade them for another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text, exactly what will be replayed to the provider

    def parsed_arguments(self) -> dict[str, Any]:
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        return value


@dataclass(slots=True)
class ImagePart:
    """An image in the working context, by reference: a host artifact (a message attachment, or an image a tool
    returned and the loop stored), or, when it could not be stored, its sha256 only. The bytes are never kept on
    the message nor in the session file: the loop loads them for the requests that show the image
    (agenthost.runners.local_agent.images)."""

    mime_type: str  # one of images.VISION_TYPES
    name: str = ""
    size: int = 0
    artifact_id: str = ""
    sha256: str = ""

    @property
    def key(self) -> str:
        return self.artifact_id or f"sha256:{self.sha256}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mime_type": self.mime_type, "name": self.name, "size": self.size}
        if self.artifact_id:
            d["artifact_id"] = self.artifact_id
        if self.sha256:
            d["sha256"] = self.sha256
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ImagePart:
        return cls(
            mime_type=str(d.get("mime_type", "")),
            name=str(d.get("name", "")),
            size=int(d.get("size", 0)),
            artifact_id=str(d.get("artifact_id", "")),
            sha256=str(d.get("sha256", "")),
        )


@dataclass(slots=True)
class UserMessage:
    content: str
    host_seq: int = 0  # the transcript seq this came from, when known
    images: list[ImagePart] = field(default_factory=list)
    role: str = "user"


@dataclass(slots=True)
class AssistantMessage:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    model: str = ""  # provider/model that produced it
    reasoning: str | None = None  # OpenAI-compatible reasoning_content, echoed back to the same model
    thinking: list[dict[str, Any]] = field(default_factory=list)  # Anthropic thinking blocks, verbatim
    role: str = "assistant"


@dataclass(slots=True)
class ToolResult:
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    artifact_id: str = ""
    images: list[ImagePart] = field(default_factory=list)  # images the tool returned
    role: str = "tool"


@dataclass(slots=True)
class Summary:
    """A compaction checkpoint standing in for everything before it.

    With `progress` set it is instead a note of the earlier tool steps of the turn it sits in (right after that
    turn's user message): those steps are done and still in effect, unlike an earlier summary's tasks.
    """

    content: str
    artifact_id: str = ""
    through_seq: int = 0
    progress: bool = False
    role: str = "summary"


Message = UserMessage | AssistantMessage | ToolResult | Summary


def to_dict(msg: Message) -> dict[str, Any]:
    if isinstance(msg, AssistantMessage):
        d: dict[str, Any] = {"role": "assistant", "content": msg.content}
        if msg.tool_calls:
            d["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
        if msg.model:
            d["model"] = msg.model
        if msg.reasoning is not None:
            d["reasoning"] = msg.reasoning
        if msg.thinking:
            d["thinking"] = msg.thinking
        return d
    if isinstance(msg, ToolResult):
        d = {"role": "tool", "tool_call_id": msg.tool_call_id, "name": msg.name, "content": msg.content}
        if msg.is_error:
            d["is_error"] = True
        if msg.artifact_id:
            d["artifact_id"] = msg.artifact_id
        if msg.images:
            d["images"] = [i.to_dict() for i in msg.images]
        return d
    if isinstance(msg, UserMessage):
        d = {"role": "user", "content": msg.content}
        if msg.host_seq:
            d["host_seq"] = msg.host_seq
        if msg.images:
            d["images"] = [i.to_dict() for i in msg.images]
        return d
    d = {"role": "summary", "content": msg.content}
    if msg.artifact_id:
        d["artifact_id"] = msg.artifact_id
    if msg.through_seq:
        d["through_seq"] = msg.through_seq
    if msg.progress:
        d["progress"] = True
    return d


def from_dict(d: dict[str, Any]) -> Message:
    """Raises ValueError for a record that is not a message (the session loader skips and reports those)."""
    role = d.get("role")
    if role == "user":
        return UserMessage(content=str(d.get("content", "")), host_seq=int(d.get("host_seq", 0)), images=_images(d))
    if role == "assistant":
        calls = [
            ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=str(c.get("arguments", "{}")))
            for c in d.get("tool_calls", [])
        ]
        return AssistantMessage(
            content=str(d.get("content", "")),
            tool_calls=calls,
            model=str(d.get("model", "")),
            reasoning=d.get("reasoning"),
            thinking=list(d.get("thinking", [])),
        )
    if role == "tool":
        return ToolResult(
            tool_call_id=str(d["tool_call_id"]),
            name=str(d.get("name", "")),
            content=str(d.get("content", "")),
            is_error=bool(d.get("is_error", False)),
            artifact_id=str(d.get("artifact_id", "")),
            images=_images(d),
        )
    if role == "summary":
        return Summary(
            content=str(d.get("content", "")),
            artifact_id=str(d.get("artifact_id", "")),
            through_seq=int(d.get("through_seq", 0)),
            progress=bool(d.get("progress", False)),
        )
    raise ValueError(f"unknown message role {role!r}")


def _images(d: dict[str, Any]) -> list[ImagePart]:
    raw = d.get("images") or []
    return [ImagePart.from_dict(i) for i in raw if isinstance(i, dict)] if isinstance(raw, list) else []


def image_label(part: ImagePart) -> str:
    """`NAME (mime, size)`, as notes about an image name it."""
    size = part.size
    shown = (
        f"{size} bytes"
        if size < 1024
        else f"{size / 1024:.1f} KiB"
        if size < 1024 * 1024
        else f"{size / 1048576:.1f} MiB"
    )
    return f"{part.name or 'image'} ({part.mime_type}, {shown})"


def render_transcript(messages: list[Message]) -> str:
    """A plain-text rendering used for the compaction summarizer and the pre-compaction artifact."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            lines.append(f"USER: {m.content}" + "".join(f" [image {image_label(i)}]" for i in m.images))
        elif isinstance(m, AssistantMessage):
            if m.content:
                lines.append(f"ASSISTANT: {m.content}")
            for c in m.tool_calls:
                lines.append(f"ASSISTANT called {c.name} [{c.id}] with {c.arguments}")
        elif isinstance(m, ToolResult):
            flag = " (error)" if m.is_error else ""
            shown = "".join(f" [image {image_label(i)}]" for i in m.images)
            lines.append(f"TOOL RESULT{flag} for {m.name} [{m.tool_call_id}]: {m.content}{shown}")
        elif m.progress:
            lines.append(f"STEPS ALREADY TAKEN IN THIS TURN: {m.content}")
        else:
            lines.append(f"EARLIER SUMMARY: {m.content}")
    return "\n".join(lines)
