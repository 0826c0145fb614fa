"""Files sent with a message (SendMessageRequest.attachments): checked before anything is recorded.

A client's attachment is untrusted in every field. Its name becomes a plain base name (no directories, no control
characters, bounded); its bytes are bounded (host/limits.py ATTACHMENT*); its type is what the bytes are, for the
images a model may be shown: a PNG, JPEG, GIF or WebP is recognised by its magic bytes and stored under that
type whatever the client left empty or generic, and a declared image type that the bytes do not bear out, or
bytes of one image type declared as another, is refused with INVALID_ARGUMENT. Runners may therefore trust an
attachment's mime_type for those four types; any other declared type is passed on as a label only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agenthost.host import limits
from agenthost.protos import host_pb2 as hpb
from agenthost.protos.errors import InvalidArgument, ResourceExhausted
from agenthost.protos.media import IMAGE_TYPES, sniff_image

MAX_NAME_CHARS = 255
_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp"}
# Names clients use for the same types.
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
# Types that say nothing about the content: the sniffed type replaces them.
_GENERIC = ("", "application/octet-stream", "binary/octet-stream")
_MIME = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}$")
# Controls, bidi overrides and marks, and invisible characters: a name shows as what it is, and two names that
# look alike are alike ("report.pdf" cannot hide a zero-width space, or read ".exe" backwards). ZWJ/ZWNJ stay:
# scripts and emoji need them.
_UNSAFE_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


@dataclass(frozen=True)
class CheckedAttachment:
    name: str
    mime_type: str
    data: bytes


def sanitize_name(raw: str, index: int, mime_type: str) -> str:
    """A display name safe to show and to use as a file's base name: the last path component of `raw`, without
    control or bidi-override characters, at most MAX_NAME_CHARS; `attachment-<n><ext>` when nothing is left."""
    base = re.split(r"[\\/]", raw)[-1]
    base = _UNSAFE_NAME_CHARS.sub("", base).strip()
    if base in ("", ".", ".."):
        base = f"attachment-{index + 1}{_EXTENSIONS.get(mime_type, '')}"
    if len(base) > MAX_NAME_CHARS:
        stem, dot, ext = base.rpartition(".")
        ext = dot + ext if dot and len(ext) <= 16 else ""
        base = base[: MAX_NAME_CHARS - len(ext)] + ext
    return base


def _mime_type(declared_raw: str, data: bytes, label: str) -> str:
    declared = declared_raw.strip().lower().split(";", 1)[0].strip()
    declared = _ALIASES.get(declared, declared)
    if declared and not _MIME.match(declared):
        raise InvalidArgument(f"{label}: mime_type {declared_raw[:80]!r} is not a media type like 'image/png'")
    sniffed = sniff_image(data)
    if sniffed:
        if declared in _GENERIC or declared == sniffed:
            return sniffed
        raise InvalidArgument(f"{label}: declared as {declared!r} but the bytes are {sniffed}")
    if declared in IMAGE_TYPES:
        raise InvalidArgument(f"{label}: declared as {declared!r} but the bytes are not a {declared.split('/')[1]}")
    return declared or "application/octet-stream"


def check(attachments: list[hpb.Attachment]) -> list[CheckedAttachment]:
    """The attachments of one message, validated and normalised; raises before anything is stored."""
    if len(attachments) > limits.ATTACHMENTS_MAX_PER_MESSAGE:
        raise ResourceExhausted(
            f"the message has {len(attachments)} attachments"
            f" (ATTACHMENTS_MAX_PER_MESSAGE = {limits.ATTACHMENTS_MAX_PER_MESSAGE})"
        )
    total = 0
    out: list[CheckedAttachment] = []
    for i, att in enumerate(attachments):
        label = f"attachment {i + 1}"
        size = len(att.data)
        if size == 0:
            raise InvalidArgument(f"{label} is empty")
        if size > limits.ATTACHMENT_MAX_BYTES:
            raise ResourceExhausted(f"{label} is {size} bytes (ATTACHMENT_MAX_BYTES = {limits.ATTACHMENT_MAX_BYTES})")
        total += size
        if total > limits.ATTACHMENTS_MAX_BYTES_PER_MESSAGE:
            raise ResourceExhausted(
                f"the message's attachments hold more than ATTACHMENTS_MAX_BYTES_PER_MESSAGE ="
                f" {limits.ATTACHMENTS_MAX_BYTES_PER_MESSAGE} bytes"
            )
        mime = _mime_type(att.mime_type, att.data, label)
        out.append(CheckedAttachment(sanitize_name(att.name, i, mime), mime, att.data))
    return out
