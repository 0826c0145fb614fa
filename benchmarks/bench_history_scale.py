"""History pages as one conversation grows from 1k to 1M events: latency must grow (at most) logarithmically.

    python benchmarks/bench_history_scale.py [--sizes 1000,10000,100000,1000000] [--samples 300]

A real host (in process, with a parked run of the measured conversation holding its token) and a raw grpc.aio
client calling the run API over the host's unix socket. The conversation is grown in place between steps, each
event with its transcript item, and 10% of all rows belong to other conversations of the same bot, so the
indexes have neighbours to skip. At each size it times, through the full run-API path (auth, grant, cursor MAC,
SQLite, protobuf, gRPC) and at the store alone:

  newest page      HistoryPage BACKWARD, 50 items, no cursor
  deep page        HistoryPage from a cursor in the middle of the conversation
  oldest page      HistoryPage FORWARD, no cursor
  events deep      EventPage from a cursor in the middle
  search rare      HistorySearch of a word in 10 items, top_k 10

The run API answers a page it has sent before from memory while the conversation is unchanged (PageCache in
agenthost.host.store.conversations), so the three page rows through gRPC time that path after their first call;
the store rows read the store every time.

Prints p50/p99 per size and the growth factor against the smallest size. `measure()` is reused by
tests/robustness/test_history_scale.py with smaller sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agenthost.host.store.conversations import conversation_scope  # noqa: E402
from agenthost.protos import common_pb2 as pb  # noqa: E402
from agenthost.protos import run_api_pb2 as api  # noqa: E402
from agenthost.protos import run_api_pb2_grpc  # noqa: E402
from agenthost.protos.wire import CHANNEL_OPTIONS  # noqa: E402
from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, events  # noqa: E402
from agenthost.runners.sdk.testing import HostHarness  # noqa: E402

CONVERSATION = "big"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


class Holder(Runner):
    manifest = RunnerManifest(name="holder")
    live: asyncio.Queue
    release: asyncio.Event

    async def run(self, run: RunContext) -> AsyncIterator[pb.RunEvent]:
        await Holder.live.put(run)
        await Holder.release.wait()
        yield events.text("done")


def _grow(conn, bot_id: str, start: int, stop: int, rare_every: int) -> None:  # noqa: ANN001
    now = time.time()
    ev_rows, tr_rows = [], []
    for i in range(start, stop):
        conversation = CONVERSATION if i % 10 else f"other-{i % 97}"
        event_id = f"ev_{uuid.uuid4().hex}"
        text = f"message {i} {WORDS[i % len(WORDS)]} {WORDS[(i * 7) % len(WORDS)]}"
        if i % rare_every == 0:
            text += " zanzibar"
        ev_rows.append((event_id, bot_id, conversation, "message.received", "bench", "{}", text, "{}", now))
        tr_rows.append(
            (
                f"it_{uuid.uuid4().hex}",
                bot_id,
                conversation,
                "run_seed",
                event_id,
                "user",
                "message",
                text,
                "{}",
                "",
                "",
                0,
                "[]",
                now,
            )
        )
    conn.executemany(
        "INSERT INTO events(event_id, bot_id, conversation_id, event_type, source, actor_json, text, data_json,"
        " created_at) VALUES (?,?,?,?,?,?,?,?,?)",
        ev_rows,
    )
    # Each item carries its event's seq, as the host writes them (the run API filters on it).
    conn.executemany(
        "INSERT INTO transcript(item_id, bot_id, conversation_id, run_id, event_id, role, item_type, text, data_json,"
        " tool_call_id, tool_name, is_error, attachments_json, created_at, event_seq)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,(SELECT seq FROM events WHERE event_id = ?))",
        [(*row, row[4]) for row in tr_rows],
    )


def _pct(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1e6, samples[max(0, int(len(samples) * 0.99) - 1)] * 1e6


async def measure(sizes: list[int], samples: int, work: Path, out=print) -> list[dict[str, object]]:  # noqa: ANN001
    Holder.live, Holder.release = asyncio.Queue(), asyncio.Event()
    results: list[dict[str, object]] = []
    async with HostHarness(work, runners=[Holder]) as h:
        send = asyncio.create_task(h.send("hold", conversation_id=CONVERSATION))
        run = await asyncio.wait_for(Holder.live.get(), 10)
        h.host.grants.get(run.run_id).deadline_at = time.time() + 24 * 3600
        bot_id = run.context.conversation.bot_id
        md = (("authorization", f"Bearer {run.api.run_token}"), ("x-agenthost-plugin", run.api.plugin_secret))
        channel = grpc.aio.insecure_channel(h.host.api_address, options=CHANNEL_OPTIONS)
        stub = run_api_pb2_grpc.AgentRunAPIProxyStub(channel)
        conv = h.host.conversations
        scope = conversation_scope(bot_id, CONVERSATION)
        have = 0
        try:
            for size in sizes:
                total = int(size / 0.9)  # 90% of the rows are the measured conversation's
                t0 = time.perf_counter()
                while have < total:
                    step = min(50_000, total - have)
                    rare = max(1, total // 10)
                    await h.host.db.write(lambda c, a=have, b=have + step, r=rare: _grow(c, bot_id, a, b, r))
                    have += step
                seed_s = time.perf_counter() - t0
                count = h.host.db.query_one(
                    "SELECT COUNT(*), MIN(seq), MAX(seq) FROM transcript WHERE bot_id = ? AND conversation_id = ?",
                    (bot_id, CONVERSATION),
                )
                ev = h.host.db.query_one(
                    "SELECT MIN(seq), MAX(seq) FROM events WHERE bot_id = ? AND conversation_id = ?",
                    (bot_id, CONVERSATION),
                )
                # The parked run reads as if it answered the newest message: everything grown is in its view.
                h.host.grants.get(run.run_id).event_seq = ev[1]
                # A history cursor names an item's place in turn order: (its event's seq, its seq).
                mid = h.host.db.query_one(
                    "SELECT event_seq, seq FROM transcript WHERE bot_id = ? AND conversation_id = ? AND seq >= ?"
                    " ORDER BY seq LIMIT 1",
                    (bot_id, CONVERSATION, (count[1] + count[2]) // 2),
                )
                mid_cursor = conv.cursors.encode("history", scope, *mid)
                ev_cursor = conv.cursors.encode("events", scope, (ev[0] + ev[1]) // 2)
                rid = run.run_id
                requests = {
                    "newest page": (stub.HistoryPage, api.HistoryPageRequest(run_id=rid, limit=50)),
                    "deep page": (stub.HistoryPage, api.HistoryPageRequest(run_id=rid, limit=50, cursor=mid_cursor)),
                    "oldest page": (
                        stub.HistoryPage,
                        api.HistoryPageRequest(run_id=rid, limit=50, direction=pb.FORWARD),
                    ),
                    "events deep": (stub.EventPage, api.EventPageRequest(run_id=rid, limit=50, cursor=ev_cursor)),
                    "search rare": (
                        stub.HistorySearch,
                        api.HistorySearchRequest(run_id=rid, query="zanzibar", top_k=10),
                    ),
                }
                calls = {name: functools.partial(method, req, metadata=md) for name, (method, req) in requests.items()}
                page = functools.partial(conv.page_history, bot_id, CONVERSATION, limit=50, through_event=ev[1])
                stores = {
                    "newest page": functools.partial(page, cursor="", forward=False),
                    "deep page": functools.partial(page, cursor=mid_cursor, forward=False),
                    "oldest page": functools.partial(page, cursor="", forward=True),
                    "events deep": functools.partial(
                        conv.page_events,
                        bot_id,
                        CONVERSATION,
                        cursor=ev_cursor,
                        forward=True,
                        limit=50,
                        through_event=ev[1],
                    ),
                    "search rare": functools.partial(
                        conv.search,
                        bot_id,
                        CONVERSATION,
                        "zanzibar",
                        roles=[],
                        item_types=[],
                        top_k=10,
                        through_event=ev[1],
                    ),
                }
                row: dict[str, object] = {"size": count[0], "seed_s": seed_s}
                for name, call in calls.items():
                    assert len(getattr(await call(), "items", None) or getattr(await call(), "events", [])) > 0, name
                    for _ in range(20):
                        await call()
                        stores[name]()
                    api_t, store_t = [], []
                    for _ in range(samples):
                        t = time.perf_counter()
                        await call()
                        api_t.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        stores[name]()
                        store_t.append(time.perf_counter() - t)
                    row[name] = {"api": _pct(api_t), "store": _pct(store_t)}
                results.append(row)
                out(f"  {count[0]:>9,} items in the conversation ({have:,} rows in all, grown in {seed_s:.1f}s)")
        finally:
            await channel.close()
            Holder.release.set()
            await send
    return results


def report(results: list[dict[str, object]], out=print) -> None:  # noqa: ANN001
    names = [k for k in results[0] if k not in ("size", "seed_s")]
    base = results[0]
    out(f"\n{'':14}" + "".join(f"{r['size']:>22,}" for r in results) + "   growth (largest/smallest p50)")
    for layer in ("api", "store"):
        out(f"-- {'run API over gRPC' if layer == 'api' else 'store alone (SQLite + protobuf)'}: p50 / p99 µs")
        for name in names:
            cells = "".join(f"{r[name][layer][0]:>12.0f} /{r[name][layer][1]:>8.0f}" for r in results)
            growth = results[-1][name][layer][0] / base[name][layer][0]
            out(f"{name:14}{cells}   {growth:5.2f}x")


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ahhist-"))
    try:
        print(f"growing one conversation to {sizes}; {args.samples} samples per call and size")
        results = await measure(sizes, args.samples, work)
        report(results)
        if args.json:
            print(json.dumps(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    asyncio.run(main(parser.parse_args()))
