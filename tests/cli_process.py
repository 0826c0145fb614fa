"""The CLI as a separate process, for tests that drive it against a host running in the test's own loop."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from agenthost.host.processes import describe_cache

CLI = [sys.executable, "-m", "agenthost.host.cli"]


def cli_env(data_dir: Path | None = None) -> dict[str, str]:
    """The test's environment without provider keys or agenthost settings, so nothing of the machine leaks in (but
    the suite's own describe cache: tests/conftest.py)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC", "OPENAI", "AGENTHOST")) or k == describe_cache.CACHE_ENV
    }
    if data_dir is not None:
        env["AGENTHOST_HOME"] = str(data_dir)
    return env


async def acli(
    data_dir: Path, *args: str, stdin: bytes | None = None, stdout: Any = asyncio.subprocess.PIPE, timeout: float = 90
) -> tuple[int, str, str]:
    """Runs one CLI command without blocking the loop the host serves on: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "--data-dir",
        str(data_dir),
        *args,
        env=cli_env(),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=stdout,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, (out or b"").decode(), err.decode()
