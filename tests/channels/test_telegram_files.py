"""Photos and documents both ways: a photo sent to the bot reaches the runner as an attachment (an artifact the
host stored, typed from its bytes); files a run makes come back as sendPhoto / sendDocument."""

from __future__ import annotations

import struct
import zlib

import pytest
from conftest import Scripted, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def png(width: int = 2, height: int = 2) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


async def test_photo_in_reaches_the_runner_and_files_come_back(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    image = png()
    fake.add_file("photo-big", image)
    fake.add_file("photo-small", image[:10])
    sizes = [
        {"file_id": "photo-small", "file_unique_id": "s", "width": 1, "height": 1, "file_size": 10},
        {"file_id": "photo-big", "file_unique_id": "b", "width": 2, "height": 2, "file_size": len(image)},
    ]
    await fake.push(fake.message(None, chat_id=42, photo=sizes, caption="what is this?"))
    await fake.wait_for(lambda f: len(f.of("sendPhoto")) == 1 and len(f.of("sendDocument")) == 1)
    seen = Scripted.seen[0]
    assert seen.text == "what is this?"
    assert [(a.name, a.mime_type, a.size_bytes) for a in seen.attachments] == [("photo.jpg", "image/png", len(image))]
    assert fake.of("sendPhoto")[0].files["photo"] == image
    assert fake.of("sendDocument")[0].files["document"] == b"a report\n"
    assert fake.chat_text(42)[0] == "got 1 file(s): photo.jpg (image/png)"


async def test_document_over_the_limit_is_refused_in_one_line(world: World) -> None:
    await world.add_channel()
    fake = world.fake
    doc = {"file_id": "huge", "file_unique_id": "h", "file_name": "huge.bin", "file_size": 60 * 1024 * 1024}
    await fake.push(fake.message(None, chat_id=42, document=doc, caption="read this"))
    await fake.wait_for(lambda f: len(f.chat_text(42)) == 2)
    assert fake.chat_text(42)[0].startswith("⚠️ huge.bin is too large")
    assert [s.text for s in Scripted.seen] == ["read this"] and not Scripted.seen[0].attachments
    assert not fake.of("getFile")
