"""The suite's own set-up, checked where a regression would only show as a slower run."""

from __future__ import annotations

import importlib.util
import os

import agenthost.host.server
import agenthost.runners.sdk.server


def test_the_checkouts_modules_are_compiled_before_the_processes_start() -> None:
    """tests/conftest.py compiles the checkout once per run: with PYTHONDONTWRITEBYTECODE set (as on this machine)
    every host, runner and CLI process the suite starts would otherwise compile these modules from source."""
    for module in (agenthost.host.server, agenthost.runners.sdk.server):
        source = module.__file__
        assert source is not None
        cached = importlib.util.cache_from_source(source)
        assert os.path.exists(cached), f"{cached} missing: the suite's processes compile {source} each start"
        assert os.stat(cached).st_mtime >= os.stat(source).st_mtime
