"""The host every worker test starts: no local plugins, so a run can only go to a worker; the workers port on a free
loopback port (its enrolment port beside it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agenthost.host.server import Host


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    h = Host(tmp_path / "host", builtin_plugins=False, workers_address="127.0.0.1:0")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()
