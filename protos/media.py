"""Message attachments on the wire: their caps, and the image types recognised from their bytes. One rule for the
host that checks and stores attachments, the runners that show images to models, and the channels that carry
files in from chat platforms."""

from __future__ import annotations

MiB = 1024 * 1024

# One attached file. 5 MiB is the largest image the Anthropic API takes (OpenAI's 20 MB is looser), and the whole
# request must fit one gRPC message (wire.MAX_MESSAGE_BYTES = 8 MiB).
ATTACHMENT_MAX_BYTES = 5 * MiB
# Files on one message: more is a batch upload, not a message.
ATTACHMENTS_MAX_PER_MESSAGE = 8
# All files of one message together: one request with its text and event data stays under MAX_MESSAGE_BYTES.
ATTACHMENTS_MAX_BYTES_PER_MESSAGE = 7 * MiB

# The image types recognised from their bytes: what OpenAI and Anthropic both take as image input.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def sniff_image(data: bytes) -> str:
    """The image type the bytes are (one of IMAGE_TYPES), or "" when they are none of them."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return ""
