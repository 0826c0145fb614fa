"""Every CLI print of text a plugin, runner, model or channel can write is inert on a terminal: `plugins list`,
`status` and `channels list` show a plugin process's last error (its stderr, its exit), `approvals list` a
conversation id a channel chose, `runners` a plugin's manifest; and `--json` output escapes the C1 controls
(U+009B is CSI on many terminals), DEL and bidi controls that json.dumps(ensure_ascii=False) would keep raw."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.host import cli
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness
from tests.cli_process import acli

# 7-bit and 8-bit escape sequences (clipboard write, screen clear, CSI), a carriage return, a DEL, bidi controls.
HOSTILE = "ok\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m\rfake\x7f\u202egnp.exe\u2066x\u2069\u200fend"
RAW = ("\x1b", "\x07", "\x9b", "\r", "\x7f", "\u202e", "\u2066", "\u200f")


def _inert(out: str) -> None:
    for bad in RAW:
        assert bad not in out, (bad, out)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_json_output_escapes_c1_del_and_bidi_but_keeps_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    data = {"last_error": HOSTILE, f"key{HOSTILE}": ["é 中 ✓"]}
    cli.print_json(data)
    out = capsys.readouterr().out
    _inert(out)
    assert json.loads(out) == data
    assert "é 中 ✓" in out  # text that cannot drive a terminal stays readable


class Asker(Runner):
    manifest = RunnerManifest(name="asker", description="asks before it acts")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        d = await run.request_approval("shell", summary="ls", arguments={"command": "ls"}, timeout_seconds=60)
        yield events.text(d.outcome)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_plugin_channel_and_conversation_text_reaches_the_terminal_inert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostHarness(tmp_path, runners=[Asker]) as h:
        data_dir = h.host.data_dir
        # What the supervisor keeps of a failed plugin start: the plugin's own words.
        h.host.supervisor.processes["test"].last_error = HOSTILE
        channel = hpb.ChannelInfo(
            name="tg", bot_id=h.bot, adapter="agenthost/telegram", state="failed", restarts=2, last_error=HOSTILE
        )
        monkeypatch.setattr(h.host.channels, "list", lambda: [channel])
        # A channel chooses its conversation ids: anything but C0 passes the host's check.
        conversation = "tg:\x9b2J\u202eevil"
        request = hpb.SendMessageRequest(bot=h.bot, text="hi", conversation_id=conversation)

        asked = asyncio.Event()

        async def pump() -> None:
            async for reply in h.client.stream(request):
                if reply.WhichOneof("kind") == "events" and any(
                    e.WhichOneof("kind") == "approval_requested" for e in reply.events.events
                ):
                    asked.set()

        task = asyncio.create_task(pump())
        try:
            await asyncio.wait_for(asked.wait(), 30)
            for args in (
                ("plugins", "list"),
                ("status",),
                ("channels", "list"),
                ("approvals", "list"),
                ("plugins", "list", "--json"),
                ("status", "--json"),
                ("channels", "list", "--json"),
                ("approvals", "list", "--json"),
                ("runs", "list", "--bot", h.bot, "--json"),
            ):
                code, out, err = await acli(data_dir, *args)
                assert code == 0, (args, err)
                _inert(out)
                if "--json" in args:
                    found = list(_strings(json.loads(out)))  # the same data, once decoded
                    assert HOSTILE in found or conversation in found, args
                else:
                    assert "fake" in out or "evil" in out, (args, out)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
