"""History pages stay fast as a conversation grows (a bounded version of benchmarks/bench_history_scale.py,
which goes to 1M): from 1k to 50k items the page latencies through the run API may not grow like the data."""

from __future__ import annotations

import sys

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_history_scale import measure  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def test_pages_do_not_grow_with_the_conversation(tmp_path):
    """50x the data: a linear scan would be ~50x slower; an index walk stays within noise. The two sizes are measured
    one after the other, so a busy spell of the machine (other xdist workers) can land on one of them: a page out of
    bounds is measured once more, from scratch, and a real regression is out of bounds both times."""
    names = ["newest page", "deep page", "oldest page", "events deep", "search rare"]
    for attempt in range(2):
        (tmp_path / str(attempt)).mkdir()
        small, large = await measure([1_000, 50_000], 150, tmp_path / str(attempt), out=lambda line: None)
        assert large["size"] >= 50_000
        grown = {name: (small[name]["api"][0], large[name]["api"][0]) for name in names}
        names = [name for name, (a, b) in grown.items() if b >= 2.0 * a + 500]
        if not names:
            return
    raise AssertionError(
        {name: f"{a:.0f} µs at 1k -> {b:.0f} µs at 50k" for name, (a, b) in grown.items() if name in names}
    )
