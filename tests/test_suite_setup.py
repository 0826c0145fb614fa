"""The suite's own set-up, checked where a regression would only show as a slower run."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agenthost.host.server
import agenthost.runners.sdk.server

ROOT = Path(__file__).resolve().parent.parent


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


GUARDED = """
import asyncio
import subprocess

import pytest


def test_unmarked_runs_a_command():
    subprocess.run(["true"], check=True)


async def test_unmarked_starts_an_asyncio_subprocess():
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()


@pytest.mark.e2e
def test_marked_runs_a_command():
    subprocess.run(["true"], check=True)


def test_on_a_process_fixture_runs_a_command(pg_dsn):
    subprocess.run(["true"], check=True)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_parametrized_by_backend(backend):
    if backend == "postgresql":
        subprocess.run(["true"], check=True)


def test_starts_nothing():
    pass
"""


@pytest.mark.e2e
def test_a_test_that_starts_a_process_is_e2e_or_fails(tmp_path: Path) -> None:
    """tests/process_guard.py: `make check` runs the tests marked neither e2e nor slow, and those must start no
    process. A test built on a process-starting fixture or parametrized on PostgreSQL is marked e2e at collection;
    an unmarked test that starts a process fails, naming it, so the split cannot drift."""
    (tmp_path / "conftest.py").write_text(
        'import pytest\npytest_plugins = ["tests.process_guard"]\n\n\n@pytest.fixture\ndef pg_dsn():\n    return ""\n'
    )
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AGENTHOST_SPAWN_LOG", None)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-rf",
        "-o",
        "asyncio_mode=auto",
    ]
    ran = subprocess.run([*argv, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    failed = sorted(re.findall(r"^FAILED \S+::(\w+)", ran.stdout, re.M))
    assert failed == ["test_unmarked_runs_a_command", "test_unmarked_starts_an_asyncio_subprocess"], ran.stdout
    # In the failures' section: the short summary repeats each reason, cut to the terminal's width or not (CI).
    failures = ran.stdout.split("short test summary info")[0]
    assert failures.count("not marked e2e but its call started a process:\n  exec: true\n") == 2, ran.stdout
    picked = subprocess.run(
        [*argv, "--collect-only", "-m", "not e2e", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    unit = sorted(re.findall(r"::(\w+(?:\[\w+\])?)$", picked.stdout, re.M))
    assert unit == [
        "test_parametrized_by_backend[sqlite]",
        "test_starts_nothing",
        "test_unmarked_runs_a_command",
        "test_unmarked_starts_an_asyncio_subprocess",
    ], picked.stdout
