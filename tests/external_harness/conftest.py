from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .fake_run_api import FakeHost


@pytest.fixture
async def fake_host(tmp_path: Path) -> AsyncIterator[FakeHost]:
    # unix socket paths are capped at ~107 bytes; pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ah-") as sock_dir:
        async with FakeHost(Path(sock_dir)) as host:
            yield host


@pytest.fixture(autouse=True)
def _runners_closed(close_harness_runners: None) -> None:
    """Every harness runner a test here makes is closed at its end (tests/conftest.py)."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keeps the runner process's real credentials out of the harness tests."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "CLAUDE_")):
            monkeypatch.delenv(name, raising=False)


REPO = Path(__file__).resolve().parents[2]


def _binary(env: str, name: str) -> str:
    path = os.environ.get(env) or str(REPO / ".tools" / "npm" / "node_modules" / ".bin" / name)
    if not os.access(path, os.X_OK):
        message = f"{name} CLI not installed: run scripts/install_harness_clis.sh or set {env}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs them (.ci/run → make test); a skip there would hide a gap
        pytest.skip(message)
    # The real file, as a user names it in a binding: the host refuses a command outside the system dirs that is a
    # symlink (it binds the named file alone into the plugin's sandbox).
    return os.path.realpath(path)


@pytest.fixture
def claude_bin() -> str:
    return _binary("AGENTHOST_CLAUDE_BIN", "claude")


@pytest.fixture
def codex_bin() -> str:
    return _binary("AGENTHOST_CODEX_BIN", "codex")
