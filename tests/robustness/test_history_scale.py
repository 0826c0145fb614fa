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
    small, large = await measure([1_000, 50_000], 150, tmp_path, out=lambda line: None)
    assert large["size"] >= 50_000
    for name in ("newest page", "deep page", "oldest page", "events deep", "search rare"):
        a, b = small[name]["api"][0], large[name]["api"][0]
        # 50x the data: a linear scan would be ~50x slower; an index walk stays within noise
        assert b < 2.0 * a + 500, f"{name}: {a:.0f} µs at 1k -> {b:.0f} µs at 50k"
