"""Every CLI print of text a plugin, runner, model or channel can write is inert on a terminal: `plugins list`,
`status` and `channels list` show a plugin process's last error (its stderr, its exit), `approvals list` a
conversation id a channel chose, `runners` a plugin's manifest; and `--json` output escapes the C1 controls
(U+009B is CSI on many terminals), DEL and bidi controls that json.dumps(ensure_ascii=False) would keep raw. The
same holds for what the host logs (host.log and the serving process's stderr) of a runner's error and a client's
conversation id."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.host.cli import main as cli
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness
from tests.cli_process import CLI, acli, cli_env

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


class Lookalike(Runner):
    """Asks for a command whose arguments hide a zero-width space, and records a tool call under a lookalike name."""

    manifest = RunnerManifest(name="lookalike", description="asks with invisible characters")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        d = await run.request_approval(
            "shell", summary="rm -rf build", arguments={"command": "rm -rf build\u200b /"}, timeout_seconds=60
        )
        yield events.text(d.outcome)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_conversation_id_built_to_look_like_a_chats_is_told_apart(tmp_path: Path) -> None:
    """A sender (a narrow gateway key: the host's rule for its conversation ids is the same) names its
    conversation `tg\u200b:42`: to the host's reserved-name check it is not a chat's (`tg:42`), but printed raw it
    read as one, so an operator took the key holder's runs for a Telegram user's; and a call's arguments carried
    characters an approver could not see (the console showed them). The CLI now writes what
    others chose (conversation ids, runner ids, tool names, a call's arguments) through protos.text.ident, the
    console's rule: every zero-width and bidi character as an escape."""
    async with HostHarness(tmp_path, runners=[Lookalike]) as h:
        conversation = "tg\u200b:42"
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
            for args in (("approvals", "list"), ("runs", "list", "--bot", h.bot)):
                code, out, err = await acli(h.host.data_dir, *args)
                assert code == 0, (args, err)
                assert "\u200b" not in out and "tg\\u200b:42" in out, (args, out)
                if args[0] == "approvals":
                    assert "build\\u200b /" in out, out
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# What json.dumps(ensure_ascii=False) leaves raw in a log line: C1 (U+009B is CSI), DEL and bidi controls.
LOG_RAW = ("\x9b", "\x7f", "\u202e", "\u2066", "\u200f")


class Hostile(Runner):
    """Fails with an error code and message of its choosing, and logs (in-process, through the host's handlers)
    a line quoting them."""

    manifest = RunnerManifest(name="hostile", description="fails with control characters")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        logging.getLogger("hostile").warning("about to fail: %s", HOSTILE)
        yield events.failed("code\x9b2J\u202eevil\x7f", HOSTILE)


def _escaped_only(text: str) -> None:
    for bad in LOG_RAW:
        assert bad not in text, (bad, text)
    assert "\\u009b" in text and "\\u202e" in text  # escaped, not dropped: the reader sees what was sent


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_host_log_and_stderr_escape_runner_errors_and_conversation_ids(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from agenthost.host.ops import logs

    # The serving process's stderr handler, as `agenthost serve` installs it.
    to_stderr = logs.install(None, logging.INFO, stderr=True)
    try:
        async with HostHarness(tmp_path, runners=[Hostile], host_options={"log_level": logging.INFO}) as h:
            conversation = "tg:\x9b2J\u202eevil\u2066"  # a client chooses it: anything but C0 and DEL passes
            reply = await h.client.send(h.bot, "hi", conversation_id=conversation)
            assert reply.run.status == "failed" and reply.run.error_code == "code\x9b2J\u202eevil\x7f"
            data_dir = h.host.data_dir
    finally:
        to_stderr.close()
    host_log = (data_dir / "logs" / "host.log").read_text(encoding="utf-8")
    stderr = capfd.readouterr().err
    for text in (host_log, stderr):
        _escaped_only(text)
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        # The same values, once decoded: escaping is lossless.
        assert any(r.get("conversation_id") == conversation for r in records)
        assert any(r.get("error_code") == "code\x9b2J\u202eevil\x7f" for r in records)
        assert any(HOSTILE in r.get("msg", "") for r in records)


def test_plain_text_log_lines_and_harness_stderr_use_the_one_rule() -> None:
    from agenthost.protos.text import TerminalSafeFormatter, one_line, plain_text

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "user said %s", (HOSTILE,), None)
    line = TerminalSafeFormatter("%(message)s").format(record)
    _inert(line)
    assert "fake" in line and "end" in line
    # 8-bit CSI and bidi controls, which the harness runner's own rule used to let through, are gone too.
    assert plain_text("\x9b31mred\x1b[0m \u202egnp.exe\x7f\n\tok") == "red gnp.exe\n\tok"
    assert one_line("  \x9b2J\u202eboom\x7f \nnext") == "2Jboom"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_serving_terminal_and_host_log_show_a_clients_conversation_id_inert(tmp_path: Path) -> None:
    """`agenthost serve` as its own process: a client (the CLI here, with a narrow credential it would be the same
    call) picks a conversation id with C1 and bidi controls; the serving process's stderr and host.log quote it
    escaped."""
    data_dir = tmp_path / "home"
    notes = str(Path(__file__).resolve().parent.parent / "plugins" / "examples" / "notes-runner")
    with open(tmp_path / "stderr", "wb") as err:
        serve = await asyncio.create_subprocess_exec(
            *CLI, "--data-dir", str(data_dir), "serve",
            env=cli_env(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        for _ in range(300):  # the host is up when a CLI call gets through (a condition, polled, bounded)
            if (await acli(data_dir, "status"))[0] == 0:
                break
            assert serve.returncode is None, (tmp_path / "stderr").read_text()
            await asyncio.sleep(0.1)
        assert (await acli(data_dir, "plugins", "install", notes, "--offline", timeout=240))[0] == 0
        assert (await acli(data_dir, "bots", "create", "support"))[0] == 0
        assert (await acli(data_dir, "bots", "bind", "support", "--runner", "agenthost-notes/notes"))[0] == 0
        conversation = "c\x9b2J\u202eevil\u2066"
        code, out, err_text = await acli(data_dir, "send", "support", "note milk", "--conversation", conversation)
        assert code == 0, err_text
    finally:
        serve.terminate()
        await asyncio.wait_for(serve.wait(), 30)
    host_log = (data_dir / "logs" / "host.log").read_text(encoding="utf-8")
    stderr = (tmp_path / "stderr").read_text(encoding="utf-8")
    for text in (host_log, stderr):
        _escaped_only(text)
        started = [json.loads(ln) for ln in text.splitlines() if '"run.started"' in ln]
        assert [r["conversation_id"] for r in started] == [conversation]
