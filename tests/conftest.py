from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.plugins import install as installer

# The `agenthost_harness` fixture. agenthost registers no auto-loaded pytest plugin: a runner author's suite opts in
# with this same line, so projects that merely have agenthost installed see nothing of it.
pytest_plugins = ["agenthost.runners.sdk.testing", "tests.process_guard"]

# The suite's slowest tests as `pytest --durations` printed them (refresh by pasting a new report). pytest-xdist's
# `--dist worksteal` first hands each of the n workers one contiguous 1/n of the collection, in order, and later
# lets an idle worker take half of the longest queue left. So the slowest tests are dealt out over those n shares,
# each share starting with its slow ones: every worker starts a long test at once (not one worker with all of them
# in a row while the others run short ones), and the suite's tail is made of short tests spread by stealing.
SLOWEST = Path(__file__).with_name("slowest.txt")
_DURATION = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(.+?)\s*$")  # ids may hold spaces


# This machine's environment sets PYTHONDONTWRITEBYTECODE, so no process writes bytecode, and every Python process
# the suite starts (hosts, plugin and adapter processes, CLI commands, an install's describe) compiled the checkout's
# own modules from source each time: ~0.2 CPU-s per host process, ~0.1 per runner or CLI command, hundreds of times
# per run. They are compiled once here instead (only what changed since; the installed packages have theirs), and
# Python reads a .pyc whatever that variable says. Plugin sources (tests/fixtures, plugins/examples) are left as
# they are: installs copy them.
ROOT = Path(__file__).resolve().parent.parent
_DESCRIBED = [""]  # the describe cache this run made (pytest_configure), removed at its end
_COMPILED = ("channels", "host", "plugins", "protos", "runners", "tests", "benchmarks", "scripts")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller compiled before it started the workers
        return
    import compileall
    import tempfile

    from agenthost.host.processes import describe_cache

    # One describe cache for every host of the run (the workers inherit the variable): each test's host has a data
    # dir of its own, so its own cache would never see the built-in plugin's files twice. Keyed by content,
    # environment and walls: a test that changes any of them is described again.
    if not os.environ.get(describe_cache.CACHE_ENV):
        os.environ[describe_cache.CACHE_ENV] = _DESCRIBED[0] = tempfile.mkdtemp(prefix="agenthost-describe-")

    for folder in _COMPILED:
        compileall.compile_dir(ROOT / folder, quiet=2, rx=re.compile(r"[/\\](fixtures|examples)[/\\]"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DESCRIBED[0]:
        shutil.rmtree(_DESCRIBED[0], ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    """pytest rewrites the asserts of every test module it imports and caches the result as a .pyc, but writes none
    while bytecode writing is off (PYTHONDONTWRITEBYTECODE): each pytest process, every xdist worker and every file
    scripts/test_cpu.py measures, then parsed, rewrote and compiled all the test modules again, ~10 of the 15 CPU-s
    a collection of the suite took. Bytecode is written while the test modules are collected, and only then."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = before


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = {}
    for line in SLOWEST.read_text().splitlines():
        if m := _DURATION.match(line):
            seconds[m[2]] = seconds.get(m[2], 0.0) + float(m[1])
    slow = sorted((item for item in items if item.nodeid in seconds), key=lambda item: -seconds[item.nodeid])
    rest = [item for item in items if item.nodeid not in seconds]  # every other test keeps its place
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ordered: list[pytest.Item] = []
    for share in range(workers):
        size = (len(items) - len(ordered)) // (workers - share)  # what worksteal will send this worker first
        mine = slow[share::workers]
        taken = max(0, size - len(mine))
        ordered += mine + rest[:taken]
        del rest[:taken]
    items[:] = ordered + rest


@pytest.fixture(scope="session")
def _plugin_installs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[object, ...], Any]]:
    return tmp_path_factory.mktemp("plugin-installs"), {}


@pytest.fixture
def reused_plugin_installs(
    _plugin_installs: tuple[Path, dict[tuple[object, ...], Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """For tests of what a host does with an installed plugin, not of installing it: the first install of a source
    in this session (per xdist worker) runs pip for real, later ones copy its environment into the host's plugins
    directory, where a real install would have moved it (the installer stores the env's absolute path, so each host
    gets its own copy). Everything around the installer — the sandbox check, the install's cgroup, the registry
    record, the first start — still runs each time. Tests of installing itself do not use this."""
    cache_dir, installed = _plugin_installs
    real = installer.install

    async def install(source: str, plugins_dir: Path, **options: Any) -> installer.InstalledPlugin:
        walls = options.pop("contain", None)
        key = (str(Path(source).resolve()), tuple(sorted(options.items())), os.environ.get("AGENTHOST_TEST_FAULT"))
        if key not in installed:
            installed[key] = await real(source, cache_dir / str(len(installed)), contain=walls, **options)
        first = installed[key]
        env = plugins_dir / first.plugin_id / "env"
        env.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(env, ignore_errors=True)
        await asyncio.to_thread(shutil.copytree, Path(first.python).parents[1], env, symlinks=True)
        return dataclasses.replace(first, python=str(env / "bin" / "python"))

    monkeypatch.setattr(installer, "install", install)


@pytest.fixture
async def close_harness_runners(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Closes every harness runner a test made, as the SDK server does at shutdown: the Claude Code processes it
    keeps between messages and the spare it starts after a turn (runners/external_harness/warm.py) stop in the
    test's own event loop. Without it they outlive the test: a spare started after the test's last look at its
    processes (bwrap, egress_forward, the harness) ran until the xdist worker exited."""
    from agenthost.runners.external_harness.runner import HarnessRunner

    made: list[HarnessRunner] = []
    init = HarnessRunner.__init__

    def recording_init(self: HarnessRunner, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(HarnessRunner, "__init__", recording_init)
    yield
    for runner in made:
        await runner.close()


# The throwaway PostgreSQL cluster and the fixtures that run a store test on both backends.
from tests.pg_cluster import (  # noqa: E402, F401
    host_database,
    own_pg_cluster,
    pg_cluster,
    pg_dsn,
    pgvector_cluster,
    pgvector_dsn,
    store_target,
)
