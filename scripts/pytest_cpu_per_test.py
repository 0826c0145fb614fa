"""A pytest plugin for `scripts/test_cpu.py --per-test`: each pytest process (every xdist worker) moves into a
cpuacct cgroup of its own below the run's, and each test's setup, call and teardown are counted in CPU-seconds of
that group (the processes the test starts included, sandboxed or not) beside their wall time, one JSON line per
test in $TEST_CPU_PER_TEST/<worker>.jsonl.

A test whose wall time is far above its CPU time waits (process starts, timeouts, polling); one near it keeps a
core busy. On a shared machine the gap also holds the time other processes took the cores."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

_GROUP: list[Path] = []
_OUT: list[IO[str]] = []


def _usage_s() -> float:
    group = _GROUP[0]
    if (group / "cpuacct.usage").exists():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def pytest_configure(config: pytest.Config) -> None:
    out = Path(os.environ["TEST_CPU_PER_TEST"])
    root = Path(os.environ["TEST_CPU_GROUP"])  # the run's group (scripts/test_cpu.py made it)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    group = root / f"worker-{worker}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))  # the processes it starts from now on are counted here
    _GROUP.append(group)
    out.mkdir(parents=True, exist_ok=True)
    _OUT.append(open(out / f"{worker}.jsonl", "a"))  # noqa: SIM115 — open for the whole session


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = _usage_s(), time.monotonic()
    try:
        return (yield)
    finally:
        line = {"test": item.nodeid, "cpu_s": _usage_s() - cpu, "wall_s": time.monotonic() - wall}
        _OUT[0].write(json.dumps(line) + "\n")
        _OUT[0].flush()
