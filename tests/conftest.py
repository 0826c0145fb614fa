from __future__ import annotations

import re
from pathlib import Path

import pytest

# The `agenthost_harness` fixture. agenthost registers no auto-loaded pytest plugin: a runner author's suite opts in
# with this same line, so projects that merely have agenthost installed see nothing of it.
pytest_plugins = ["agenthost.runners.sdk.testing"]

# The suite's slowest tests as `pytest --durations` printed them (refresh by pasting a new report). pytest-xdist
# hands tests out in collection order, so these go first: the longest start at once, and the suite's tail is made of
# short tests that `--dist worksteal` spreads over the workers, rather than a minute-long test that started last.
SLOWEST = Path(__file__).with_name("slowest.txt")
_DURATION = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(\S+)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = {}
    for line in SLOWEST.read_text().splitlines():
        if m := _DURATION.match(line):
            seconds[m[2]] = seconds.get(m[2], 0.0) + float(m[1])
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))  # stable: every other test keeps its place


# The throwaway PostgreSQL cluster and the fixtures that run a store test on both backends.
from tests.pg_cluster import host_database, pg_cluster, pg_dsn, store_target  # noqa: E402, F401
