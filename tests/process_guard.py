"""The split between unit/contract tests and end-to-end ones, kept by what a test does rather than by memory.

A test is end-to-end (marker `e2e`) when it starts a process: a host or CLI process, a plugin, adapter or harness
process or its sandbox, a browser, a PostgreSQL cluster, a pip install. Every other test (stores on SQLite, the
real host and SDK server in process over gRPC, the conformance suite's contract checks) is a unit or contract
test: `make check` runs those (`-m "not e2e and not slow"`), `make test` runs everything.

The marker is applied here, at collection, from what a test is built on (the process-starting fixtures and
parameters below, and the modules that start processes in their own bodies), so most tests need no mark at all.
And the split cannot drift: while a test marked neither `e2e` nor `slow` sets up or runs (in `make check` and in
`make test` alike), every way Python starts a process is watched, and a test that started one fails, naming the
command and saying to mark it. So whatever `make check` runs is known to start nothing.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Fixtures that start processes (or a PostgreSQL cluster): a test built on any of them, directly or through other
# fixtures, is end-to-end.
E2E_FIXTURES = frozenset(
    {
        "pg_cluster",
        "pgvector_cluster",
        "own_pg_cluster",
        "pg_dsn",
        "pgvector_dsn",
        "claude_bin",  # the real harness CLIs
        "codex_bin",
        "reused_plugin_installs",  # pip installs, then the installed plugin's processes
    }
)

# Parameter ids that mean a PostgreSQL backend (store_target and its kin are parametrized over the backends).
E2E_PARAM_IDS = frozenset({"postgresql", "pgvector"})

_spawned: list[str] = []  # what the running unmarked test started, as "argv0 …" strings
_watching = threading.Event()  # set while a test that is not marked e2e runs one of its phases


def _watched(name: str, start: Callable[..., Any], describe: Callable[..., str]) -> Callable[..., Any]:
    def starts(*args: Any, **kwargs: Any) -> Any:
        if _watching.is_set():
            _spawned.append(f"{name}: {describe(*args, **kwargs)}")
        return start(*args, **kwargs)

    return starts


def _argv(args: tuple[Any, ...], index: int) -> str:
    try:
        argv = args[index]
        return " ".join(os.fsdecode(a) for a in argv)[:200] if argv else "?"
    except Exception:  # a describer must never break the start it watches
        return "?"


def _install() -> None:
    """Wraps the process-starting primitives once per process. subprocess, asyncio's subprocesses and
    multiprocessing's spawn all go through `_posixsubprocess.fork_exec` (subprocess keeps its own reference to it)
    or os.posix_spawn; a bare fork goes through os.fork."""
    if getattr(_install, "done", False):
        return
    _install.done = True  # type: ignore[attr-defined]
    exec_argv: Callable[..., str] = lambda *a, **k: _argv(a, 0)  # noqa: E731
    _posixsubprocess.fork_exec = _watched("exec", _posixsubprocess.fork_exec, exec_argv)  # type: ignore[assignment]
    if getattr(subprocess, "_fork_exec", None) is not None:
        subprocess._fork_exec = _watched("exec", subprocess._fork_exec, exec_argv)  # type: ignore[attr-defined]
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _watched(name, getattr(os, name), lambda *a, **k: _argv(a, 1)))
    for name in ("fork", "forkpty"):
        if hasattr(os, name):
            setattr(os, name, _watched(name, getattr(os, name), lambda *a, **k: "(no exec)"))


def is_e2e(item: pytest.Item) -> bool:
    if item.get_closest_marker("e2e") is not None:
        return True
    if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and E2E_PARAM_IDS.intersection(callspec.id.split("-")):
        return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    # The sandbox probe runs bwrap once per process and is kept for the process's life (the host asks it at start):
    # run here, before any test, it is no test's process, whichever test would have asked first.
    from agenthost.plugins import sandbox

    sandbox.probe()
    _install()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_e2e(item) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # Slow tests are left to `make test` whatever they start; the guard keeps what `make check` runs process-free.
    watch = item.get_closest_marker("e2e") is None and item.get_closest_marker("slow") is None
    item.stash[_WATCH] = watch
    try:
        return (yield)
    finally:
        _watching.clear()


_WATCH = pytest.StashKey[bool]()


def _phase(item: pytest.Item) -> Iterator[None]:
    _spawned.clear()
    if item.stash.get(_WATCH, False):
        _watching.set()
    try:
        return (yield)
    finally:
        _watching.clear()


# Setup and call only: a teardown also finalizes the wider-scoped fixtures the tests before it shared (the session's
# PostgreSQL cluster is stopped by `pg_ctl` in the last test's teardown), which is not this test starting anything.
pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_phase)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_phase)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    if _spawned and item.stash.get(_WATCH, False):
        started = "\n  ".join(dict.fromkeys(_spawned))
        _spawned.clear()
        log = os.environ.get("AGENTHOST_SPAWN_LOG")
        if log:  # survey mode: record instead of failing
            with open(log, "a") as f:
                f.write(f"{item.nodeid}\t{call.when}\t{started.splitlines()[0]}\n")
        elif report.outcome != "failed":
            report.outcome = "failed"
            report.longrepr = (
                f"this test is not marked e2e but its {call.when} started a process:\n  {started}\n"
                "A test that starts a host, CLI, plugin, sandbox, browser or database process is end-to-end: build it "
                "on a process-starting fixture (tests/process_guard.py E2E_FIXTURES) or mark it "
                "`@pytest.mark.e2e`; `make check` then leaves it to `make test`."
            )
    return report
