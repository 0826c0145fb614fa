"""Text a runner, a model or a chat user wrote reaches the operator's terminal inert: `send`/`chat` (Printer) and
`history` print no escape sequence (clipboard writes, titles, screen clears), carriage return or bidi override."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.cli.render import Printer
from agenthost.protos import common_pb2 as pb
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events
from agenthost.runners.sdk.testing import HostHarness
from tests.cli_process import acli

HOSTILE = "ok\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m\rfake\u202egnp.exe\tend\n"


def _inert(out: str) -> None:
    for bad in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert bad not in out, (bad, out)


def test_terminal_safe_keeps_text_tabs_and_newlines() -> None:
    from agenthost.host.cli.render import terminal_safe

    assert terminal_safe("line one\n\tline two ✓") == "line one\n\tline two ✓"
    assert terminal_safe("a\r\nb\x1b[0m") == "a\nb\ufffd[0m"


@pytest.mark.timeout(30)
def test_printer_writes_no_control_sequences_from_the_run() -> None:
    out = io.StringIO()
    printer = Printer(out)
    printer.event(pb.RunEvent(text_delta=pb.TextDelta(text=HOSTILE)))
    printer.event(pb.RunEvent(tool_started=pb.ToolStarted(tool_name="t\x1b[8m", arguments_json='{"a":"\x1b[2J"}')))
    printer.event(pb.RunEvent(tool_finished=pb.ToolFinished(result=HOSTILE)))
    printer.event(pb.RunEvent(progress=pb.Progress(message="\x1b]0;pwned\x07")))
    printer.event(pb.RunEvent(retry=pb.Retry(attempt=1, reason=HOSTILE)))
    printer.finished(
        hpb.RunInfo(run_id="run_x", status="failed", error_code="x", error_message=HOSTILE, text=HOSTILE), False
    )
    text = out.getvalue()
    _inert(text)
    assert "ok" in text and "fake" in text and "\tend\n" in text  # the words survive


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Path]:
    from agenthost.host.server import Host

    h = Host(tmp_path / "data")
    await h.start()
    try:
        yield h.data_dir
    finally:
        await h.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_history_prints_a_hostile_message_inert(host: Path) -> None:
    """A message from a chat user (a channel's, untrusted) and the transcript around it, through `history`."""
    assert (await acli(host, "bots", "create", "b"))[0] == 0
    code, _, err = await acli(host, "bots", "bind", "b", "--runner", "agenthost/local-agent")
    assert code == 0, err
    code, _, err = await acli(host, "send", "b", HOSTILE, "--json")
    assert code == 0, err
    code, out, err = await acli(host, "history", "b")
    assert code == 0, err
    _inert(out)
    assert "[user] ok" in out and "gnp.exe" in out


class Hostile(Runner):
    manifest = RunnerManifest(name="hostile")

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        yield events.text(HOSTILE)
        yield pb.RunEvent(failed=pb.Failed(code="oops\x1b]0;pwned\x07\x1b[2J", message=HOSTILE))


@pytest.mark.timeout(120)
@pytest.mark.e2e
async def test_runs_list_prints_a_runners_error_code_inert(tmp_path: Path) -> None:
    async with HostHarness(tmp_path, runners=[Hostile]) as h:
        r = await h.send("hi")
        assert r.run.status == "failed" and "\x1b" in r.run.error_code
        code, out, err = await acli(h.host.data_dir, "runs", "list")
        assert code == 0, err
        _inert(out)
        assert "oops" in out


@pytest.mark.timeout(60)
@pytest.mark.e2e
def test_logs_prints_a_plugins_stderr_inert(tmp_path: Path) -> None:
    """`agenthost logs --plugin P` shows what the plugin wrote to stderr; it reads the file, no host needed."""
    import subprocess

    from agenthost.host.ops import logs

    data = tmp_path / "data"
    path = logs.plugin_log_path(data, "evil-plugin")
    path.parent.mkdir(parents=True)
    path.write_text(f"starting\n{HOSTILE}\x1b]8;;http://x\x07click\x1b]8;;\x07\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST"))}
    argv = [sys.executable, "-m", "agenthost.host.cli", "--data-dir", str(data), "logs", "--plugin", "evil-plugin"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    _inert(proc.stdout)
    assert "starting\nok" in proc.stdout and "click" in proc.stdout
