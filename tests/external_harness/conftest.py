from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the fakes live next to the tests

from fake_run_api import FakeHost  # noqa: E402

FAKE_HARNESS = str(HERE / "fake_harness.py")


@pytest.fixture
async def fake_host(tmp_path: Path) -> AsyncIterator[FakeHost]:
    # unix socket paths are capped at ~107 bytes; pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ah-") as sock_dir:
        async with FakeHost(Path(sock_dir)) as host:
            yield host


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps the runner process's real credentials out of the harness tests."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "CLAUDE_")):
            monkeypatch.delenv(name, raising=False)
