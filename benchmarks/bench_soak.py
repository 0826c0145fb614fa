"""Soak: rounds of concurrent runs against one long-lived host for N minutes; the host's memory and open fds
must stay flat.

    python benchmarks/bench_soak.py [--minutes 10] [--runs 100] [--plugins 4] [--deltas 20] [--pause-ms 20]

Same processes as bench_load.py. Every round starts `--runs` concurrent runs (new conversations each round, plus
one long conversation that keeps growing) and waits for all of them. After each round the host's RSS, fds and
threads are sampled; the script prints a line per ~30 s, then the first-quarter vs last-quarter comparison.
Exit status 1 on any failed run or a drift beyond the thresholds printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import LoadHost, one_run, run_load, show  # noqa: E402

RSS_DRIFT_MIB = 20.0
FD_DRIFT = 4
THREAD_DRIFT = 2  # pools (grpc, asyncio's default executor) start threads lazily, up to their cap


async def soak(
    lh: LoadHost,
    seconds: float,
    runs: int,
    deltas: int,
    pause_ms: float,
    report_every: float = 30.0,
    out=print,  # noqa: ANN001
    *,
    rounds: int | None = None,
) -> dict[str, object]:
    """Rounds until `seconds` have passed, or exactly `rounds` of them; returns per-round samples and totals. A
    count of rounds is the same work on a busy machine as on an idle one (a time would be less work when busy)."""
    await run_load(lh, runs, deltas, pause_ms, tag="warmup")
    samples: list[dict[str, float]] = []
    total_runs = 0
    errors: list[str] = []
    t0 = time.monotonic()
    last_report = t0
    r = 0
    while r < rounds if rounds is not None else time.monotonic() - t0 < seconds:
        res, (_, long_status, _) = await asyncio.gather(
            run_load(lh, runs, deltas, pause_ms, tag=f"s{r}"),
            one_run(lh.client, "load0", "long-conversation", 2, 0),
        )
        r += 1
        total_runs += runs + 1
        errors += res["errors"]
        if long_status != "completed":
            errors.append(f"long conversation: {long_status}")
        fig = lh.figures()
        fig["t"] = time.monotonic() - t0
        fig["round_s"] = res["wall_s"]
        samples.append(fig)
        if time.monotonic() - last_report >= report_every:
            last_report = time.monotonic()
            out(
                f"t={fig['t']:6.0f}s rounds {r:4d} runs {total_runs:6d}  "
                + show("", fig)
                + f"  round {res['wall_s']:.2f}s  errors {len(errors)}"
            )
    quarter = max(1, len(samples) // 4)
    first, last = samples[:quarter], samples[-quarter:]
    summary = {
        "rounds": r,
        "runs": total_runs,
        "errors": errors,
        "rss_first": statistics.median(s["rss_mib"] for s in first),
        "rss_last": statistics.median(s["rss_mib"] for s in last),
        "fds_first": max(s["fds"] for s in first),
        "fds_last": max(s["fds"] for s in last),
        "threads_first": max(s["threads"] for s in first),
        "threads_last": max(s["threads"] for s in last),
        "peak_mib": samples[-1]["peak_mib"] if samples else 0.0,
        "round_first_s": statistics.median(s["round_s"] for s in first),
        "round_last_s": statistics.median(s["round_s"] for s in last),
        "samples": samples,
    }
    return summary


def verdict(s: dict[str, object]) -> list[str]:
    problems = []
    if s["errors"]:
        problems.append(f"{len(s['errors'])} failed runs, e.g. {s['errors'][0]}")
    if s["rss_last"] - s["rss_first"] > RSS_DRIFT_MIB:
        problems.append(f"RSS drifted {s['rss_last'] - s['rss_first']:+.1f} MiB (> {RSS_DRIFT_MIB})")
    if s["fds_last"] - s["fds_first"] > FD_DRIFT:
        problems.append(f"open fds drifted {s['fds_last'] - s['fds_first']:+.0f} (> {FD_DRIFT})")
    if s["threads_last"] - s["threads_first"] > THREAD_DRIFT:
        problems.append(f"threads grew {s['threads_first']:.0f} -> {s['threads_last']:.0f}")
    return problems


async def main(args: argparse.Namespace) -> int:
    async with LoadHost(plugins=args.plugins) as lh:
        print(f"soak: {args.minutes} min, {args.runs} concurrent runs per round over {args.plugins} runner processes")
        print(show("start", lh.figures()))
        s = await soak(
            lh, args.minutes * 60, args.runs, args.deltas, args.pause_ms, out=lambda line: print(line, flush=True)
        )
        print(f"\n{s['rounds']} rounds, {s['runs']} runs, {len(s['errors'])} errors")
        print(
            f"host RSS  first quarter {s['rss_first']:.1f} MiB -> last quarter {s['rss_last']:.1f} MiB "
            f"({s['rss_last'] - s['rss_first']:+.1f}); peak {s['peak_mib']:.1f} MiB"
        )
        print(f"open fds  {s['fds_first']:.0f} -> {s['fds_last']:.0f};  ", end="")
        print(f"threads {s['threads_first']:.0f} -> {s['threads_last']:.0f}")
        print(f"round time {s['round_first_s']:.2f}s -> {s['round_last_s']:.2f}s")
        problems = verdict(s)
        print(
            "verdict:",
            "; ".join(problems) if problems else f"flat (RSS drift <= {RSS_DRIFT_MIB} MiB, fds <= {FD_DRIFT})",
        )
        return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--plugins", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--pause-ms", type=float, default=20)
    sys.exit(asyncio.run(main(parser.parse_args())))
