"""The suite's own set-up, checked where a regression would only show as a slower run."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

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


def test_the_test_modules_rewritten_by_pytest_are_cached() -> None:
    """pytest caches each test module's assert-rewritten code only when bytecode may be written; tests/conftest.py
    lets it while the suite is collected, else every pytest process (each xdist worker) rewrote every test module
    again: ~10 CPU-s a collection."""
    from _pytest.assertion.rewrite import PYC_TAIL, get_cache_dir

    source = Path(__file__)
    cached = get_cache_dir(source) / (source.stem + PYC_TAIL)
    assert cached.exists(), f"{cached} missing: each pytest process rewrites the test modules again"
    assert cached.stat().st_mtime >= source.stat().st_mtime
