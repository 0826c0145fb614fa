from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from agenthost.protos.wire import TOOLS_CGROUP_ENV
from agenthost.runners.external_harness.errors import HarnessNotFound
from agenthost.runners.external_harness.process import HarnessProcess, build_env, redact

from .helpers import group_alive


def test_env_is_an_allowlist() -> None:
    env = build_env(
        inherited={"PATH": "/bin", "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "x", "AGENTHOST_PLUGIN_SECRET": "y"},
        set_env={"HOME": "/h"},
    )
    assert env == {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/h"}
    assert build_env(inherited={})["PATH"]


def test_redact() -> None:
    assert redact("token abcdefgh leaked", ["abcdefgh"]) == "token [redacted] leaked"


@pytest.mark.e2e
async def test_large_lines_and_noise(tmp_path: Path) -> None:
    code = (
        "import json,sys; sys.stdout.write('[SandboxDebug] noise\\n');"
        "sys.stdout.write(json.dumps({'t': 'x' * (5 * 1024 * 1024)}) + '\\n');"
        "sys.stdout.write('{broken\\n'); sys.stdout.write(json.dumps({'last': 1}))"
    )
    async with HarnessProcess([sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ)) as proc:
        got = [e async for e in proc.events()]
        assert await proc.wait() == 0
    assert len(got[0]["t"]) == 5 * 1024 * 1024 and got[1] == {"last": 1}
    assert proc.skipped_lines == 2


@pytest.mark.e2e
async def test_stderr_is_captured_and_redacted(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('boom with sekrit-token-123\\n'); sys.exit(4)"
    async with HarnessProcess(
        [sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ), secrets=["sekrit-token-123"]
    ) as proc:
        assert [e async for e in proc.events()] == []
        assert await proc.wait() == 4
    assert proc.stderr_tail() == "boom with [redacted]"


@pytest.mark.e2e
async def test_stderr_reaches_the_user_as_plain_text(tmp_path: Path) -> None:
    """A harness's stderr ends up in a run's error and on a person's terminal: colours, a window-title OSC, a
    hyperlink OSC, carriage returns and NULs must not survive; newlines and tabs do."""
    code = (
        "import sys; sys.stderr.write('\\x1b[31mError\\x1b[0m: bad\\x1b]0;owned\\x07\\r\\x00 key\\t'"
        " '\\x1b]8;;http://evil\\x1b\\\\here\\x1b]8;;\\x1b\\\\\\nnext line\\n'); sys.exit(2)"
    )
    async with HarnessProcess([sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ)) as proc:
        assert [e async for e in proc.events()] == []
        assert await proc.wait() == 2
    tail = proc.stderr_tail()
    assert tail == "Error: bad key\there\nnext line", repr(tail)
    assert not any(ord(c) < 32 and c not in "\n\t" for c in tail)


@pytest.mark.e2e
async def test_stdin_prompt_is_delivered(tmp_path: Path) -> None:
    code = "import sys,json; print(json.dumps({'prompt': sys.stdin.read()}))"
    big = "p" * (1024 * 1024)  # larger than a pipe buffer: must not deadlock
    async with HarnessProcess(
        [sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ), stdin_data=big.encode()
    ) as proc:
        got = [e async for e in proc.events()]
    assert got == [{"prompt": big}]


@pytest.mark.e2e
async def test_interrupt_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    # Parent and child both ignore SIGINT: only the SIGKILL of the group after the grace period ends them.
    code = (
        "import signal,subprocess,sys,time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        "subprocess.Popen([sys.executable,'-c','import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        " time.sleep(60)']); print('{\"ready\": 1}', flush=True); time.sleep(60)"
    )
    proc = HarnessProcess(
        [sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ), interrupt_grace=0.3
    )
    await proc.start()
    events = proc.events()
    assert await asyncio.wait_for(anext(events), 10) == {"ready": 1}
    await asyncio.sleep(0.2)  # let the child start
    started = time.monotonic()
    await proc.stop()
    assert 0.25 <= time.monotonic() - started < 5
    await asyncio.sleep(0.1)
    assert not group_alive(proc.pid)


@pytest.mark.e2e
async def test_clean_exit_reaps_stragglers(tmp_path: Path) -> None:
    code = "import subprocess,sys; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)'])"
    async with HarnessProcess([sys.executable, "-c", code], cwd=tmp_path, env=build_env(inherited=os.environ)) as proc:
        await proc.wait()
    await asyncio.sleep(0.1)
    assert not group_alive(proc.pid)


async def test_missing_binary_is_typed(tmp_path: Path) -> None:
    with pytest.raises(HarnessNotFound):
        await HarnessProcess([str(tmp_path / "nope")], cwd=tmp_path, env={}).start()
    with pytest.raises(HarnessNotFound):
        await HarnessProcess(["definitely-not-a-harness-binary"], cwd=tmp_path, env={"PATH": "/nonexistent"}).start()


# A stand-in runner process: starts a harness (a sleeper), prints its pid, and waits to be SIGKILLed.
STAND_IN_RUNNER = (
    "import asyncio, os, sys\n"
    "from pathlib import Path\n"
    "from agenthost.runners.external_harness.process import HarnessProcess, build_env\n"
    "async def main():\n"
    "    p = HarnessProcess([sys.executable, '-c', 'import time; time.sleep(60)'], cwd=Path('.'),\n"
    "                       env=build_env(inherited=os.environ))\n"
    "    await p.start()\n"
    "    print(p.pid, flush=True)\n"
    "    await asyncio.sleep(60)\n"
    "asyncio.run(main())\n"
)


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs util-linux setpriv (parent-death signal)")
@pytest.mark.e2e
async def test_harness_dies_with_a_killed_runner(tmp_path: Path) -> None:
    # A stand-in runner process starts a harness, reports its pid, and is then SIGKILLed (no cleanup can run).
    repo = str(Path(__file__).resolve().parents[2])
    runner = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STAND_IN_RUNNER,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": repo},
    )
    try:
        assert runner.stdout
        # generous: the waits of 20 s and 2.5 s here were tuned to an idle machine; `-n 4` on two cores broke it
        harness_pid = int(await asyncio.wait_for(runner.stdout.readline(), 90))
        assert group_alive(harness_pid)
    finally:
        runner.kill()
        await runner.wait()
    # The kernel's death signal and the reaping take their time on a loaded machine: wait for the end, not 2.5 s.
    for _ in range(600):  # at least 30 s
        if not group_alive(harness_pid):
            break
        await asyncio.sleep(0.05)
    assert not group_alive(harness_pid)


@pytest.mark.e2e
async def test_a_runner_killed_before_the_death_signal_is_set_leaves_no_harness(tmp_path: Path) -> None:
    """The window between the runner's fork and setpriv's prctl, held open: the tools prologue blocks writing to its
    cgroup file (a FIFO here) while the runner is SIGKILLed; once it goes on, the death signal is set too late to
    fire. The harness must not start, re-parented, then."""
    gate = tmp_path / "tools.procs"
    os.mkfifo(gate)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo, TOOLS_CGROUP_ENV: str(gate)}
    runner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STAND_IN_RUNNER, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert runner.stdout
        harness_pid = int(await asyncio.wait_for(runner.stdout.readline(), 90))
    finally:
        runner.kill()
        await runner.wait()
    reader = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)  # lets the prologue's write through: it goes on
    try:
        for _ in range(600):  # at least 30 s
            if not group_alive(harness_pid):
                break
            await asyncio.sleep(0.05)
        alive = group_alive(harness_pid)
        if alive:
            os.killpg(harness_pid, signal.SIGKILL)
        assert not alive, "the harness outlived the runner that was killed before its death signal was set"
    finally:
        os.close(reader)
