"""Images through the HTTP gateway: OpenAI image parts holding `data:` URLs become message attachments; remote
URLs, bad data and lying types are refused before any run exists."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from agenthost.host import limits
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb

from .helpers import World

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
JPEG = b"\xff\xd8\xff\xe0" + b"j" * 40


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def post(world: World, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=world.base_url, timeout=20) as http:
        return await http.post(path, json=body, headers={"Authorization": f"Bearer {world.key}"})


async def user_attachments(world: World) -> list[list[pb.ArtifactRef]]:
    out = []
    convs = world.host.conversations.list_conversations(world.host.registry.bot("testbot").bot_id)
    for conversation_id, _, _ in convs:
        page = await world.harness.client.call(
            "GetHistory", hpb.GetHistoryRequest(bot="testbot", conversation_id=conversation_id, direction=pb.FORWARD)
        )
        out.extend(list(i.attachments) for i in page.items if i.role == "user")
    return out


async def test_chat_and_responses_image_parts_become_attachments(world: World) -> None:
    chat = {
        "model": "testbot",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": data_url("image/png", PNG), "detail": "low"}},
                ],
            }
        ],
    }
    r = await post(world, "/chat/completions", chat)
    assert r.status_code == 200, r.text
    responses = {
        "model": "testbot",
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": data_url("image/jpeg", JPEG)}]}],
    }
    r = await post(world, "/responses", responses)
    assert r.status_code == 200, r.text
    got = await user_attachments(world)
    assert sorted([(a.name, a.mime_type, a.size_bytes) for refs in got for a in refs]) == [
        ("image-1.jpg", "image/jpeg", len(JPEG)),
        ("image-1.png", "image/png", len(PNG)),
    ]
    for refs in got:
        for ref in refs:
            stored, _ = world.host.artifacts.get(ref.artifact_id)  # type: ignore[misc]
            assert world.host.artifacts.read(stored.sha256, 0, 1 << 20) in (PNG, JPEG)


@pytest.mark.parametrize(
    ("url", "status", "needle"),
    [
        ("https://example.com/cat.png", 400, "image URLs are not fetched"),
        ("ftp://example.com/cat.png", 400, "base64 data: URL"),
        ("data:image/png,rawbytes", 400, "base64 data: URL"),
        ("data:image/png;base64,@@@", 400, "not valid base64"),
        (data_url("image/png", JPEG), 400, "declared as 'image/png' but the bytes are image/jpeg"),
        (data_url("image/png", b"not an image"), 400, "the bytes are not a png"),
        ("data:image/svg+xml;base64,PHN2Zy8+", 400, "PNG, JPEG, GIF or WebP, not 'image/svg+xml'"),
        ("data:text/html;base64,PHNjcmlwdD4=", 400, "PNG, JPEG, GIF or WebP, not 'text/html'"),
    ],
)
async def test_bad_images_are_refused_and_start_no_run(world: World, url: str, status: int, needle: str) -> None:
    body = {
        "model": "testbot",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
    }
    r = await post(world, "/chat/completions", body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    assert world.runs() == []
    assert world.host.registry.db.query_one("SELECT COUNT(*) FROM artifacts")[0] == 0


async def test_an_image_over_the_limit_is_413(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "ATTACHMENT_MAX_BYTES", 32)
    body = {
        "model": "testbot",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}}]}
        ],
    }
    r = await post(world, "/chat/completions", body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "message_too_large"
    assert "ATTACHMENT_MAX_BYTES = 32" in r.json()["error"]["message"]
    assert world.runs() == []
