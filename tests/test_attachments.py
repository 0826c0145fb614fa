"""Message attachments through a real host: checked, stored as artifacts of the conversation, handed to the runner
as refs it can read, shown in history; a refused message leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agenthost.host import limits
from agenthost.host.runs.attachments import sanitize_name, sniff_image
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(60)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(200))
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg-body" * 20
GIF = b"GIF89a" + b"\x01\x00\x01\x00" + b"g" * 30
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"w" * 30


class Reader(Runner):
    """Replies with what it was handed: each attachment's ref and whether its bytes read back whole."""

    manifest = RunnerManifest(name="reader")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        seen = []
        assert list(run.context.input.attachments) == run.attachments  # the same refs in both places
        for ref in run.attachments:
            data = await run.api.artifact_read_all(ref.artifact_id)
            seen.append(
                {
                    "id": ref.artifact_id,
                    "name": ref.name,
                    "mime": ref.mime_type,
                    "size": ref.size_bytes,
                    "data": data.hex(),
                }
            )
        yield events.text(json.dumps({"text": run.text, "attachments": seen}))


def _att(data: bytes, name: str = "pic.png", mime_type: str = "") -> hpb.Attachment:
    return hpb.Attachment(name=name, mime_type=mime_type, data=data)


async def _footprint(h: HostHarness) -> tuple[int, int, int, int, list[Path]]:
    db = h.host.registry.db
    counts = tuple(db.query_one(f"SELECT COUNT(*) FROM {t}")[0] for t in ("events", "runs", "artifacts", "transcript"))
    objects = sorted(p for p in (h.host.artifacts.root / "objects").rglob("*") if p.is_file())
    return (*counts, objects)  # type: ignore[return-value]


def test_sniffing_and_names() -> None:
    assert [sniff_image(b) for b in (PNG, JPEG, GIF, WEBP, b"hello", b"RIFF\x00\x00\x00\x00WAVE")] == [
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "",
        "",
    ]
    assert sanitize_name("../../etc/passwd", 0, "") == "passwd"
    assert sanitize_name("C:\\Users\\me\\cat.png", 0, "image/png") == "cat.png"
    assert sanitize_name("a\x00b\u202ecod.exe\n", 0, "") == "abcod.exe"
    assert sanitize_name("..", 2, "image/jpeg") == "attachment-3.jpg"
    # invisible and bidi marks: no look-alike names, no ".." hiding behind a mark
    assert sanitize_name("re\u200bport\u200f.pdf\ufeff", 0, "") == "report.pdf"
    assert sanitize_name("\u200e\u200f..\u2060", 1, "") == "attachment-2"
    assert sanitize_name("cv\u061c\u2067gpj.exe\x85", 0, "") == "cvgpj.exe"
    assert sanitize_name("", 0, "") == "attachment-1"
    long = sanitize_name("x" * 400 + ".png", 0, "image/png")
    assert len(long) == 255 and long.endswith(".png")


async def test_a_runner_reads_attachments_and_history_shows_them(tmp_path: Path, host_database: dict) -> None:
    async with HostHarness(tmp_path, runners=[Reader], host_options=host_database) as h:
        files = [
            _att(PNG, "../../secret/dir/photo.png", "image/png"),
            _att(JPEG, "scan.jpg", ""),  # empty type: sniffed
            _att(GIF, "anim", "application/octet-stream"),  # generic type: sniffed
            _att(b"col1,col2\n1,2\n", "data.csv", "text/csv; charset=utf-8"),
            _att(WEBP, "s.webp", "image/WEBP"),
        ]
        result = await h.send("look", attachments=files)
        assert result.run.status == "completed", result.run.error_message
        reply = json.loads(result.run.text)
        assert reply["text"] == "look"
        got = [(a["name"], a["mime"], a["size"], bytes.fromhex(a["data"])) for a in reply["attachments"]]
        assert got == [
            ("photo.png", "image/png", len(PNG), PNG),
            ("scan.jpg", "image/jpeg", len(JPEG), JPEG),
            ("anim", "image/gif", len(GIF), GIF),
            ("data.csv", "text/csv", 14, b"col1,col2\n1,2\n"),
            ("s.webp", "image/webp", len(WEBP), WEBP),
        ]
        ids = [a["id"] for a in reply["attachments"]]
        # The artifacts belong to the conversation, tagged with the run the message started.
        for art_id in ids:
            ref, bot_id = h.host.artifacts.get(art_id)  # type: ignore[misc]
            assert ref.conversation_id == "default" and ref.run_id == result.run.run_id and bot_id

        # An attachment with no text is still a user turn.
        alone = await h.send("", attachments=[_att(PNG, "again.png")])
        assert alone.run.status == "completed"

        history = await h.client.call(
            "GetHistory", hpb.GetHistoryRequest(bot=h.bot, conversation_id="default", direction=pb.FORWARD)
        )
        users = [i for i in history.items if i.role == "user"]
        assert [u.text for u in users] == ["look", ""]
        assert [r.artifact_id for r in users[0].attachments] == ids
        assert [(r.name, r.mime_type, r.size_bytes) for r in users[1].attachments] == [
            ("again.png", "image/png", len(PNG))
        ]
        # The stored event carries them too (what ListEvents gives a runner).
        event = h.host.conversations.get_event(result.run.event_id)
        assert event is not None and [r.artifact_id for r in event.attachments] == ids
        # Identical bytes are stored once: as files, or in the database (PostgreSQL).
        if h.host.db.backend == "sqlite":
            assert sum(1 for _ in (h.host.artifacts.root / "objects").rglob("*") if _.is_file()) == 5
        else:
            assert h.host.db.query_one("SELECT COUNT(DISTINCT sha256) FROM artifact_chunks")[0] == 5


async def test_lies_and_oversize_are_refused_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_database: dict
) -> None:
    async with HostHarness(tmp_path, runners=[Reader], host_options=host_database) as h:
        await h.send("warm up")
        before = await _footprint(h)

        async def refused(code: grpc.StatusCode, needle: str, files: list[hpb.Attachment]) -> None:
            with pytest.raises(errors.AgentHostError) as exc:
                await h.send("hi", attachments=files)
            assert exc.value.code == code and needle in exc.value.message, exc.value.message
            assert await _footprint(h) == before

        invalid = grpc.StatusCode.INVALID_ARGUMENT
        await refused(
            invalid, "declared as 'image/png' but the bytes are image/jpeg", [_att(JPEG, "x.png", "image/png")]
        )
        await refused(invalid, "but the bytes are not a png", [_att(b"<svg/>", "x.png", "image/png")])
        await refused(
            invalid, "declared as 'text/plain' but the bytes are image/gif", [_att(GIF, "x.txt", "text/plain")]
        )
        await refused(invalid, "not a media type", [_att(PNG, "x", "image png")])
        await refused(invalid, "attachment 2 is empty", [_att(PNG), _att(b"")])
        # The second is bad: the first is not kept either.
        await refused(invalid, "attachment 2", [_att(PNG + b"new"), _att(JPEG, "j", "image/gif")])

        exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
        monkeypatch.setattr(limits, "ATTACHMENT_MAX_BYTES", 100)
        await refused(exhausted, "ATTACHMENT_MAX_BYTES = 100", [_att(PNG)])
        monkeypatch.setattr(limits, "ATTACHMENT_MAX_BYTES", 1000)
        monkeypatch.setattr(limits, "ATTACHMENTS_MAX_PER_MESSAGE", 2)
        await refused(exhausted, "ATTACHMENTS_MAX_PER_MESSAGE = 2", [_att(PNG)] * 3)
        monkeypatch.setattr(limits, "ATTACHMENTS_MAX_BYTES_PER_MESSAGE", 300)
        await refused(exhausted, "ATTACHMENTS_MAX_BYTES_PER_MESSAGE = 300", [_att(PNG), _att(JPEG)])
        monkeypatch.setattr(limits, "ARTIFACT_MAX_BYTES_PER_CONVERSATION", 100)
        await refused(exhausted, "ARTIFACT_MAX_BYTES_PER_CONVERSATION", [_att(PNG)])


async def test_attachment_bytes_count_against_the_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued run's attachments count as its input: past RUNS_MAX_QUEUED_INPUT_BYTES a message is refused, and
    its files are not stored."""
    async with HostHarness(tmp_path, runners=[Reader]) as h:
        await h.send("warm up")
        monkeypatch.setattr(limits, "RUNS_MAX_ACTIVE", 0)  # every run waits in `queued`
        monkeypatch.setattr(limits, "RUNS_MAX_QUEUED_INPUT_BYTES", len(PNG) + 100)
        first = h.client.stream(hpb.SendMessageRequest(bot=h.bot, text="one", attachments=[_att(PNG)]))
        started = await anext(first)
        assert started.queued.run.status == "queued"
        before = await _footprint(h)
        with pytest.raises(errors.ResourceExhausted) as exc:
            await h.send("two", conversation_id="other", attachments=[_att(JPEG)])
        assert "RUNS_MAX_QUEUED_INPUT_BYTES" in exc.value.message
        assert await _footprint(h) == before
        await h.client.call("CancelRun", hpb.RunRequestById(run_id=started.queued.run.run_id))
        await first.aclose()


@pytest.mark.slow
async def test_cli_send_attach(tmp_path: Path) -> None:
    async with HostHarness(tmp_path, runners=[Reader]) as h:
        pic = tmp_path / "holiday photo.png"
        pic.write_bytes(PNG)
        notes = tmp_path / "notes.txt"
        notes.write_text("remember")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agenthost.host.cli",
            "--data-dir",
            str(h.host.data_dir),
            "send",
            h.bot,
            "what is this?",
            "--attach",
            str(pic),
            "--attach",
            str(notes),
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 50)
        assert proc.returncode == 0, err.decode()
        reply = json.loads(json.loads(out)["text"])
        assert [(a["name"], a["mime"], bytes.fromhex(a["data"])) for a in reply["attachments"]] == [
            ("holiday photo.png", "image/png", PNG),
            ("notes.txt", "text/plain", b"remember"),
        ]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agenthost.host.cli",
            "--data-dir",
            str(h.host.data_dir),
            "send",
            h.bot,
            "x",
            "--attach",
            str(tmp_path / "missing.png"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 50)
        assert proc.returncode != 0 and "cannot read" in err.decode()
