"""Images in the local agent: attachments shown to models that take images, in each provider's exact shape; images a
tool returns inside the tool result (Anthropic) or in a user message after the tool results (OpenAI-compatible);
notes for models that do not take images; sessions that keep references, never bytes."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from agenthost.protos import common_pb2 as pb
from agenthost.runners.local_agent import images
from agenthost.runners.local_agent.messages import ImagePart, ToolResult, UserMessage, from_dict, to_dict
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.session import Session, safe_name
from agenthost.runners.local_agent.testing import (
    FakeProviderServer,
    FakeRunAPI,
    anthropic_text,
    anthropic_tool_use,
    make_run,
    openai_text,
    openai_tool_calls,
)
from agenthost.runners.local_agent.tokens import PER_MESSAGE_OVERHEAD, estimate_message
from agenthost.runners.sdk.testing import HostHarness

from .helpers import kinds, new_runner, session_key, terminal

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(100))
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg-body" * 10


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def openai_cfg(server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    return {"model": "vllm/vision-model", "base_url": server.url + "/v1", "context_window": 32_000, **extra}


def anthropic_cfg(server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": "anthropic/claude-test",
        "base_url": server.url,
        "api_key": "sk-test",
        "context_window": 32_000,
        **extra,
    }


async def attach(api: FakeRunAPI, data: bytes, name: str, mime: str) -> pb.ArtifactRef:
    """An attachment as the host stores it: an artifact of the conversation."""
    return await api.artifact_create(data, name=name, mime_type=mime)


async def send(
    runner: LocalAgentRunner, api: FakeRunAPI, text: str, config: dict[str, Any], refs: list[pb.ArtifactRef] = ()
) -> list[pb.RunEvent]:
    event_id = f"ev_{uuid.uuid4().hex[:8]}"
    item = api.add_user(text, event_id=event_id)
    item.attachments.extend(refs)
    run = make_run(api, text, conversation_id=api.conversation_id, config=config, event_id=event_id)
    run.context.input.attachments.extend(refs)
    run.context.event.attachments.extend(refs)
    evs = [ev async for ev in runner.run(run)]
    api.project(evs, run_id=run.run_id)
    return evs


def workspace_file(root: Path, api: FakeRunAPI, name: str, data: bytes) -> None:
    ws = root / safe_name(session_key(api))
    ws.mkdir(parents=True, exist_ok=True)
    (ws / name).write_bytes(data)


async def test_openai_user_message_carries_image_parts(tmp_path: Path) -> None:
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    png = await attach(api, PNG, "cat.png", "image/png")
    csv = await attach(api, b"a,b\n", "data.csv", "text/csv")
    async with FakeProviderServer() as server:
        server.push(openai_text("A cat."))
        evs = await send(runner, api, "what is this?", openai_cfg(server), [png, csv])
        assert terminal(evs).WhichOneof("kind") == "completed"
        user = server.model_requests[0].json()["messages"][-1]
    assert user == {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": f"what is this?\n\n[Attachments: data.csv (artifact {csv.artifact_id}, text/csv). Use "
                "read_artifact to open them.]",
            },
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
        ],
    }


async def test_anthropic_user_message_carries_image_blocks(tmp_path: Path) -> None:
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    jpg = await attach(api, JPEG, "scan.jpg", "image/jpeg")
    async with FakeProviderServer() as server:
        server.push(anthropic_text("A scan."))
        evs = await send(runner, api, "read it", anthropic_cfg(server), [jpg])
        assert terminal(evs).WhichOneof("kind") == "completed", kinds(evs)
        user = server.model_requests[0].json()["messages"][-1]
    assert user == {
        "role": "user",
        "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}},
            # The prompt-cache breakpoint sits on the turn's last block; the image before it is cached with it.
            {"type": "text", "text": "read it", "cache_control": {"type": "ephemeral"}},
        ],
    }


@pytest.mark.parametrize(
    "extra",
    [{"vision": False}, {"model": "deepseek/deepseek-chat", "vision": "auto", "api_key": "sk-test"}],
    ids=["vision-false", "auto-text-only-model"],
)
async def test_a_model_without_vision_reads_a_note(tmp_path: Path, extra: dict[str, Any]) -> None:
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    png = await attach(api, PNG, "cat.png", "image/png")
    async with FakeProviderServer() as server:
        server.push(openai_text("I cannot see it."))
        evs = await send(runner, api, "what is this?", openai_cfg(server, **extra), [png])
        assert terminal(evs).WhichOneof("kind") == "completed", kinds(evs)
        user = server.model_requests[0].json()["messages"][-1]
    assert user == {
        "role": "user",
        "content": f"what is this?\n[image attachment cat.png (image/png, {len(PNG)} bytes) omitted: this model does "
        "not accept images]",
    }


async def test_openai_tool_images_follow_the_tool_results_and_survive_a_restart(tmp_path: Path) -> None:
    """Two parallel reads of images: both tool messages first (the call group stays whole), then one user message
    with both images; the session holds artifact ids, not bytes, and a new process shows the images again."""
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    ws = tmp_path / "ws"
    workspace_file(ws, api, "a.png", PNG)
    workspace_file(ws, api, "b.jpg", JPEG)
    async with FakeProviderServer() as server:
        config = openai_cfg(server, workspace=str(ws))
        server.push(
            openai_tool_calls([("c1", "read_file", {"path": "a.png"}), ("c2", "read_file", {"path": "b.jpg"})]),
            openai_text("Two pictures."),
        )
        evs = await send(runner, api, "look at both", config)
        assert terminal(evs).WhichOneof("kind") == "completed", kinds(evs)
        sent = server.model_requests[1].json()["messages"]
        stored = [e.artifact_created.artifact for e in evs if e.WhichOneof("kind") == "artifact_created"]
        assert [(a.name, a.mime_type, a.size_bytes) for a in stored] == [
            ("a.png", "image/png", len(PNG)),
            ("b.jpg", "image/jpeg", len(JPEG)),
        ]
        assert api.artifacts[stored[0].artifact_id][0] == PNG
        a_label = f"a.png (image/png, {len(PNG)} bytes)"
        b_label = f"b.jpg (image/jpeg, {len(JPEG)} bytes)"
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "user"]
        assert sent[3] == {
            "role": "tool",
            "tool_call_id": "c1",
            "content": f"a.png: image/png image, {len(PNG)} bytes\n"
            f"[image {a_label} returned, shown in the next message]",
        }
        assert sent[4]["content"].endswith(f"[image {b_label} returned, shown in the next message]")
        assert sent[5] == {
            "role": "user",
            "content": [
                {"type": "text", "text": "Images returned by the tool calls above:"},
                {"type": "text", "text": f"{a_label} from read_file (c1):"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
                {"type": "text", "text": f"{b_label} from read_file (c2):"},
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b64(JPEG)}"}},
            ],
        }
        # The host transcript's tool result names the stored image.
        finished = [e.tool_finished for e in evs if e.WhichOneof("kind") == "tool_finished"]
        assert f"[image {a_label} returned; artifact {stored[0].artifact_id} (read_artifact)]" in finished[0].result

        # The session file references the images; their bytes (raw or base64) are not in it.
        raw = Session.path_for(tmp_path, session_key(api)).read_bytes()
        assert stored[0].artifact_id.encode() in raw and b64(PNG).encode() not in raw and PNG not in raw

        # A new runner process (same disk) loads the images from the host for the next request.
        again = new_runner(tmp_path)
        server.push(openai_text("Still two."))
        evs = await send(again, api, "and now?", config)
        assert terminal(evs).WhichOneof("kind") == "completed", kinds(evs)
        later = server.model_requests[2].json()["messages"]
        assert later[5] == sent[5] and later[3] == sent[3]


async def test_anthropic_tool_image_goes_inside_the_tool_result(tmp_path: Path) -> None:
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    ws = tmp_path / "ws"
    workspace_file(ws, api, "a.png", PNG)
    async with FakeProviderServer() as server:
        server.push(anthropic_tool_use("toolu_1", "read_file", {"path": "a.png"}), anthropic_text("A picture."))
        evs = await send(runner, api, "look", anthropic_cfg(server, workspace=str(ws)))
        assert terminal(evs).WhichOneof("kind") == "completed", kinds(evs)
        sent = server.model_requests[1].json()["messages"]
    assert sent[-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "cache_control": {"type": "ephemeral"},
                "content": [
                    {"type": "text", "text": f"a.png: image/png image, {len(PNG)} bytes"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
                ],
            }
        ],
    }


async def test_only_the_newest_images_are_sent_and_unloadable_ones_are_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "MAX_IMAGES_PER_REQUEST", 1)
    api = FakeRunAPI()
    runner = new_runner(tmp_path)
    old = await attach(api, PNG, "old.png", "image/png")
    new = await attach(api, JPEG, "new.jpg", "image/jpeg")
    async with FakeProviderServer() as server:
        server.push(openai_text("ok"), openai_text("ok"))
        await send(runner, api, "first", openai_cfg(server), [old])
        await send(runner, api, "second", openai_cfg(server), [new])
        msgs = server.model_requests[1].json()["messages"]
    assert msgs[1]["content"] == (
        f"first\n[image attachment old.png (image/png, {len(PNG)} bytes) not shown: an older image (only the newest "
        "are shown), or its bytes could not be loaded]"
    )
    assert msgs[-1]["content"][1] == {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b64(JPEG)}"}}


def test_messages_persist_references_and_images_count_in_the_token_estimate() -> None:
    part = ImagePart(mime_type="image/png", name="a.png", size=10, artifact_id="art_1")
    user = UserMessage("hi", images=[part])
    assert from_dict(json.loads(json.dumps(to_dict(user)))) == user
    result = ToolResult("c1", "read_file", "x", images=[ImagePart("image/gif", "g.gif", 5, sha256="ab")])
    assert from_dict(to_dict(result)) == result
    assert estimate_message(user) == PER_MESSAGE_OVERHEAD + 1 + 1_600
    assert estimate_message(UserMessage("hi", images=[part, part])) == PER_MESSAGE_OVERHEAD + 1 + 3_200


@pytest.mark.slow
async def test_e2e_cli_attach_reaches_the_model(tmp_path: Path) -> None:
    """`agenthost send --attach` through the real host: the image the user attached is the image the model gets."""
    pic = tmp_path / "photo.png"
    pic.write_bytes(PNG)
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=openai_cfg(server)) as h:
            server.push(openai_text("A photo."))
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agenthost.host.cli",
                "--data-dir",
                str(h.host.data_dir),
                "send",
                h.bot,
                "describe",
                "--attach",
                str(pic),
                "--json",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 50)
            assert proc.returncode == 0, err.decode() + out.decode()
            assert json.loads(out)["text"] == "A photo."
            user = server.model_requests[0].json()["messages"][-1]
            assert user == {
                "role": "user",
                "content": [
                    {"type": "text", "text": "describe"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
                ],
            }


def test_clearing_old_tool_output_drops_its_images_and_names_them() -> None:
    from agenthost.runners.local_agent import pairing
    from agenthost.runners.local_agent.compaction import stub_old_results
    from agenthost.runners.local_agent.messages import AssistantMessage, ToolCall

    part = ImagePart("image/png", "a.png", 10, artifact_id="art_old")
    messages = [
        UserMessage("look"),
        AssistantMessage(tool_calls=[ToolCall("c1", "read_file", '{"path": "a.png"}')]),
        ToolResult("c1", "read_file", "a.png: image/png image, 10 bytes", images=[part]),
        AssistantMessage("seen"),
        UserMessage("again"),
        AssistantMessage(tool_calls=[ToolCall("c2", "read_file", '{"path": "b.txt"}')]),
        ToolResult("c2", "read_file", "text"),
    ]
    out, stubbed = stub_old_results(messages, keep_recent=1)
    assert stubbed == 1
    old = out[2]
    assert isinstance(old, ToolResult) and old.images == [] and "a.png (artifact art_old)" in old.content
    pairing.check(out)
