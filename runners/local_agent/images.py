"""Images in the working context: which models are shown them, what a request carries, what they cost.

An image reaches a model as an image only if the model accepts images (`vision` in the config: true, false, or
auto, which asks `accepts_images` below), its bytes could be loaded, and it is among the newest
MAX_IMAGES_PER_REQUEST of the context; otherwise the model reads a one-line note naming it. Where each provider
puts an image (inside a tool result for Anthropic; in a user message after the tool results for OpenAI-compatible
servers, whose tool messages hold text only) is the providers' business; they share the notes and encodings here.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from agenthost.protos.media import ATTACHMENT_MAX_BYTES, IMAGE_TYPES
from agenthost.protos.media import sniff_image as sniff
from agenthost.runners.local_agent.messages import ImagePart, Message, ToolResult, UserMessage, image_label

# What OpenAI and Anthropic both accept as image input, recognised from the bytes by the same rule as the host's
# check of attachments; the largest image sent is the largest attachment (Anthropic refuses images over 5 MB).
VISION_TYPES = IMAGE_TYPES
MAX_IMAGE_BYTES = ATTACHMENT_MAX_BYTES
# Images shown per request, newest first; older ones become notes. Every image is re-sent with every model call,
# so this bounds the request size (~7 MB of base64 at the cap) and the token bill.
MAX_IMAGES_PER_REQUEST = 8
# The token estimate of one image shown to a model. Anthropic bills width*height/750 tokens and downscales
# anything past ~1.15 megapixels, so ~1,600 is its most; OpenAI's high-detail tiling costs at most ~1,100
# (85 + 170 per 512-px tile, images scaled to 2048x768). The larger figure, since undercounting overflows a window.
IMAGE_TOKENS = 1_600
# Model families known to take text only; any other model of an OpenAI-compatible or Anthropic provider is assumed
# to accept images (`vision: false` in the config says otherwise for a local model that does not).
TEXT_ONLY_PREFIXES = ("deepseek-chat", "deepseek-reasoner", "gpt-3.5", "o1-mini", "o3-mini")

NOT_ACCEPTED = "[{kind} {label} omitted: this model does not accept images]"
NOT_SHOWN = "[{kind} {label} not shown: {reason}]"
TOOL_IMAGE_NOTE = "[image {label} returned, shown in the next message]"
FOLLOW_UP_TEXT = "Images returned by the tool calls above:"


def accepts_images(provider_id: str, model: str) -> bool:
    """Whether `vision: auto` shows this model images."""
    if provider_id == "demo":
        return False
    bare = model.rsplit("/", 1)[-1].lower()
    return not bare.startswith(TEXT_ONLY_PREFIXES)


def resolve_vision(setting: str | bool, provider_id: str, model: str) -> bool:
    return accepts_images(provider_id, model) if setting == "auto" else bool(setting)


@dataclass(frozen=True)
class ToolImage:
    """An image a tool returns, with its bytes; the loop stores it and keeps an ImagePart in the context."""

    name: str
    mime_type: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class ToolOutput:
    """What a tool returns when its result has images besides its text."""

    text: str
    images: tuple[ToolImage, ...] = ()


def data_url(mime_type: str, data: bytes) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def note(part: ImagePart, *, vision: bool, reason: str = "its bytes could not be loaded", kind: str = "image") -> str:
    """`kind`: "image attachment" for a user's, "image" for one a tool returned."""
    if not vision:
        return NOT_ACCEPTED.format(kind=kind, label=image_label(part))
    return NOT_SHOWN.format(kind=kind, label=image_label(part), reason=reason)


def parts_of(messages: Iterable[Message]) -> list[ImagePart]:
    """Every image of the context, oldest first."""
    out: list[ImagePart] = []
    for m in messages:
        if isinstance(m, (UserMessage, ToolResult)):
            out.extend(m.images)
    return out


def newest_keys(messages: list[Message], limit: int | None = None) -> list[str]:
    """Keys of the images a request shows: the newest `limit` (MAX_IMAGES_PER_REQUEST) of the context."""
    limit = limit or MAX_IMAGES_PER_REQUEST
    keys: list[str] = []
    for part in reversed(parts_of(messages)):
        if part.key not in keys:
            keys.append(part.key)
        if len(keys) >= limit:
            break
    return keys


async def load(api: object, part: ImagePart) -> bytes:
    """An image's bytes from its host artifact (raises on failure: the caller shows a note instead)."""
    if not part.artifact_id:
        raise LookupError("it was never stored on the host")
    if part.size > MAX_IMAGE_BYTES:
        raise ValueError(f"it is larger than {MAX_IMAGE_BYTES} bytes")
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = await api.artifact_read_range(part.artifact_id, offset, 1024 * 1024)  # type: ignore[attr-defined]
        if not chunk.data:
            break
        chunks.append(chunk.data)
        offset += len(chunk.data)
        if offset > MAX_IMAGE_BYTES:
            raise ValueError(f"it is larger than {MAX_IMAGE_BYTES} bytes")
        if chunk.eof or (part.size and offset >= part.size):
            break
    data = b"".join(chunks)
    if sniff(data) != part.mime_type:
        raise ValueError(f"its bytes are not a {part.mime_type}")
    return data


def split(
    parts: Iterable[ImagePart], vision: bool, loaded: dict[str, bytes], kind: str = "image"
) -> tuple[list[tuple[ImagePart, bytes]], str]:
    """The images a request shows with their bytes, and the notes (one line each) standing in for the rest."""
    shown: list[tuple[ImagePart, bytes]] = []
    notes: list[str] = []
    for part in parts:
        data = loaded.get(part.key) if vision else None
        if data is None:
            reason = "an older image (only the newest are shown), or its bytes could not be loaded"
            notes.append(note(part, vision=vision, reason=reason, kind=kind))
        else:
            shown.append((part, data))
    return shown, "\n".join(notes)


def with_notes(text: str, notes: str) -> str:
    if not notes:
        return text
    return f"{text}\n{notes}" if text else notes


def from_attachments(text: str, refs: Iterable[object]) -> tuple[str, list[ImagePart]]:
    """A user message's text and images from its attachment refs (common_pb2.ArtifactRef): images of
    VISION_TYPES become ImageParts; any other file is listed in the text for the model to open with read_artifact."""
    parts: list[ImagePart] = []
    others: list[str] = []
    for a in refs:
        name, mime, aid = getattr(a, "name", ""), getattr(a, "mime_type", ""), getattr(a, "artifact_id", "")
        if mime in VISION_TYPES:
            parts.append(ImagePart(mime_type=mime, name=name, size=int(getattr(a, "size_bytes", 0)), artifact_id=aid))
        else:
            others.append(f"{name or 'attachment'} (artifact {aid}, {mime})")
    if others:
        text += f"\n\n[Attachments: {', '.join(others)}. Use read_artifact to open them.]"
    return text, parts
