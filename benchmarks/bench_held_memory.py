"""What a held run costs the host (issue 22): RSS and a tracemalloc profile of `agenthost serve` at two numbers of
runs held waiting in `queued`, diffed.

    python benchmarks/bench_held_memory.py [--low 500] [--high 2000] [--depth 12] [--top 15] [--no-trace]

A real host (bench_load.LoadHost, one faulty runner process) whose RUNS_MAX_ACTIVE slots are all taken by runs
that sleep, then `--low` sends (one conversation each) held queued, then more up to `--high`. At each level the
host (run under a small wrapper that installs a SIGUSR1 handler) writes gc type counts and, from the second level
on, a tracemalloc snapshot (tracing starts at the first: it is too slow for the host's start-up);
this script prints RSS per held run, Python-traced bytes per held run (the rest of the RSS is C: grpc-core, the
allocator), and the top allocation sites and object types that grew. `--no-trace`: RSS only (tracemalloc slows
the host and adds its own memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_load  # noqa: E402
from bench_load import LoadHost, proc_figures  # noqa: E402

from agenthost.host import limits  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402

# Run in the host process: on SIGUSR1, a tracemalloc snapshot and gc type counts next to the path in the env.
WRAPPER = """
import collections, gc, os, pickle, runpy, signal, sys, tracemalloc
out = os.environ["HELD_PROFILE_OUT"]
def dump(*_):
    n = len([p for p in os.listdir(out) if p.endswith(".counts")])
    gc.collect()
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    if tracemalloc.is_tracing():
        with open(f"{out}/{n}.snap", "wb") as f:
            pickle.dump(tracemalloc.take_snapshot(), f)
    with open(f"{out}/{n}.counts", "w") as f:
        f.write(repr(dict(counts)))
    depth = int(os.environ.get("HELD_PROFILE_DEPTH", "0"))
    if depth and not tracemalloc.is_tracing():  # from the first dump on: tracing start-up is too slow
        tracemalloc.start(depth)
signal.signal(signal.SIGUSR1, dump)
sys.argv = ["agenthost"] + sys.argv[1:]
runpy.run_module("agenthost.host.cli", run_name="__main__")
"""


async def hold(client, bot: str, conversation: str, text: str, answered: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Sends, notes the first answer's kind, then holds the stream open reading nothing more."""
    try:
        async for reply in client.stream(
            hpb.SendMessageRequest(bot=bot, text=text, conversation_id=conversation), timeout=3600
        ):
            answered.append(reply.WhichOneof("kind") or "")
            await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported, not raised: a refused send is a figure
        answered.append(f"error {type(exc).__name__}")


async def level(host: LoadHost, out: Path, answered: list[str], want: int, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while len(answered) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(answered)} of {want} sends answered")
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)  # let the host's loop settle (writes, replies)
    before = len(list(out.glob("*.counts")))
    assert host.proc is not None
    host.proc.send_signal(signal.SIGUSR1)
    while len(list(out.glob("*.counts"))) == before:  # noqa: ASYNC110 - a file another process writes
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)
    return proc_figures(host.proc.pid)


async def main(args: argparse.Namespace) -> int:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"heldprof-{os.getpid()}"
    out.mkdir()
    wrapper = out / "wrap.py"
    wrapper.write_text(WRAPPER)
    os.environ["HELD_PROFILE_OUT"] = str(out)
    if not args.no_trace:
        os.environ["HELD_PROFILE_DEPTH"] = str(args.depth)
    # LoadHost starts `python -m agenthost.host.cli`: the same with the wrapper in front
    real_popen = bench_load.subprocess.Popen

    def popen(cmd, *a, **kw):  # type: ignore[no-untyped-def]
        if cmd[1:3] == ["-m", "agenthost.host.cli"]:
            cmd = [cmd[0], str(wrapper), *cmd[3:]]
        return real_popen(cmd, *a, **kw)

    bench_load.subprocess.Popen = popen  # type: ignore[misc]
    tasks: list[asyncio.Task[None]] = []
    try:
        async with LoadHost(plugins=1) as host:
            assert host.client is not None
            answered: list[str] = []
            start = time.perf_counter()
            for i in range(limits.RUNS_MAX_ACTIVE):
                tasks.append(asyncio.ensure_future(hold(host.client, "load0", f"busy{i}", "sleep", answered)))
            base = await level(host, out, answered, limits.RUNS_MAX_ACTIVE, 600)
            figures = [base]
            made = 0
            for want in (args.low, args.high):
                for i in range(made, want):
                    tasks.append(asyncio.ensure_future(hold(host.client, "load0", f"held{i}", "ping", answered)))
                made = want
                figures.append(await level(host, out, answered, limits.RUNS_MAX_ACTIVE + want, 1200))
            kinds = {k: answered.count(k) for k in set(answered)}
            print(f"first answers: {kinds}; {time.perf_counter() - start:.0f}s")
            held = args.high - args.low
            for label, fig in zip(("slots full", f"+{args.low} held", f"+{args.high} held"), figures, strict=True):
                print(f"  {label:16} RSS {fig['rss_mib']:7.1f} MiB  fds {fig['fds']:.0f}")
            rss = (figures[2]["rss_mib"] - figures[1]["rss_mib"]) * 1024 / held
            print(f"RSS per held run ({args.low} -> {args.high}): {rss:.1f} KiB")
            c1 = eval((out / "1.counts").read_text())  # noqa: S307 - our own repr of a dict of ints
            c2 = eval((out / "2.counts").read_text())  # noqa: S307
            grew = sorted(((c2.get(k, 0) - c1.get(k, 0), k) for k in set(c1) | set(c2)), reverse=True)
            print("gc objects per held run:", ", ".join(f"{k} {n / held:.2f}" for n, k in grew[: args.top] if n > 0))
            if not args.no_trace:
                s1 = pickle.loads((out / "1.snap").read_bytes())
                s2 = pickle.loads((out / "2.snap").read_bytes())
                traced = (sum(t.size for t in s2.traces) - sum(t.size for t in s1.traces)) / held
                print(f"traced Python bytes per held run: {traced / 1024:.1f} KiB")
                for stat in s2.compare_to(s1, "traceback")[: args.top]:
                    print(f"  {stat.size_diff / held:8.0f} B/run {stat.count_diff / held:6.2f} blocks/run")
                    for line in stat.traceback.format()[-2 * args.frames :]:
                        print("      " + line.strip())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bench_load.subprocess.Popen = real_popen  # type: ignore[misc]
        for task in tasks:
            task.cancel()
        print(json.dumps({"profile_dir": str(out)}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--low", type=int, default=500)
    parser.add_argument("--high", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=12, help="tracemalloc frames kept per allocation")
    parser.add_argument("--frames", type=int, default=4, help="frames printed per allocation site")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-trace", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
