"""Load: many concurrent runs across several runner processes, each streaming events, against a real host.

    python benchmarks/bench_load.py [--runs 500] [--plugins 4] [--deltas 20] [--pause-ms 20] [--rounds 1]
                                    [--deadline 300] [--profile host.prof] [--baseline] [--clients 1]
                                    [--database sqlite|postgresql|postgresql://…]

Processes, as in production: `agenthost serve` (the host), N runner plugin processes (copies of the faulty test
plugin under distinct names, installed offline like any plugin; each run makes a HistoryPage and a StateSet call
and streams deltas), and this script as the client, holding every run's SendMessage stream open at once.
Everything stays on unix sockets under a temp dir; the number of runs and the time are bounded.

Prints, per round: runs ok / refused with a retry hint (the host's admission: RESOURCE_EXHAUSTED with trailing
metadata `retry-after-ms`) / other errors (bare CANCELLED counted apart), wall time, runs/s, per-run latency, and
the host's RSS / peak RSS / open fds / threads before and after. A round is cut off after `--deadline` seconds
(unfinished runs count as errors), and its errors grouped by kind, most frequent first (`BENCH_KEEP_HOST_LOG=path`
also keeps the host's log there). `run_load()` is reused by bench_soak.py and tests/robustness/test_load.py.

`--baseline`: after each round, the same client (the same processes, one channel each, every call at once) against
a raw grpc.aio server whose SendMessage answers `queued` at once and does nothing else: the first answer this
client and this machine allow at best, to read the host's first answers against.

`--clients N`: the round's sends are made by N client processes (one channel each; the runs split evenly), started
and connected before the round and released together, so that the client's own CPU is apart from this script's.
Each round prints the CPU seconds the clients and the host used (getrusage / /proc), to tell how much of the
wait is the client's on a machine of few cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agenthost.host.api.client import HostClient  # noqa: E402
from agenthost.protos import errors  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402
from agenthost.protos.wire import SERVER_OPTIONS  # noqa: E402

FAULTY = ROOT / "tests" / "fixtures" / "faulty-plugin"


def proc_figures(pid: int) -> dict[str, float]:
    """RSS, peak RSS (MiB), open fds and threads of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "peak_mib": int(fields["VmHWM"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
    }


def plugin_copy(work: Path, i: int) -> Path:
    """The faulty plugin under another distribution name: one more runner process for the host to supervise."""
    dest = work / f"load-plugin-{i}"
    shutil.copytree(FAULTY, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pyproject = dest / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "agenthost-faulty"', f'name = "agenthost-load-{i}"'))
    return dest


@dataclass
class LoadHost:
    """A real `agenthost serve` in a temp home with `plugins` runner processes, each bound to bot load<i>."""

    plugins: int = 4
    profile: Path | None = None  # the host runs under cProfile and writes its stats here when it stops
    database: str = ""  # a PostgreSQL DSN for the host's stores; empty: the SQLite file in its data dir
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ahload-")))
    proc: subprocess.Popen | None = None
    client: HostClient | None = None

    async def __aenter__(self) -> LoadHost:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTHOST_TEST", "ANTHROPIC", "OPENAI"))}
        env["AGENTHOST_HOME"] = str(self.work / "home")
        if self.database:
            env["AGENTHOST_DATABASE_URL"] = self.database
        profiler = ["-m", "cProfile", "-o", str(self.profile)] if self.profile else []
        self.proc = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, *profiler, "-m", "agenthost.host.cli", "serve"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / "host.log", "wb"),
        )
        host_json = self.work / "home" / "host.json"
        for _ in range(1200):  # 2 minutes: a host started under tracemalloc (bench_held_memory.py) is slow
            if host_json.exists():
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"host exited: {(self.work / 'host.log').read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        self.client = HostClient.for_data_dir(host_json.parent, timeout=600)
        for i in range(self.plugins):
            await self.client.call(
                "InstallPlugin", hpb.InstallPluginRequest(source=str(plugin_copy(self.work, i)), offline=True)
            )
            await self.client.call("CreateBot", hpb.CreateBotRequest(name=f"load{i}"))
            await self.client.bind(f"load{i}", f"agenthost-load-{i}/faulty", timeout_seconds=600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if os.environ.get("BENCH_KEEP_HOST_LOG"):
            shutil.copy(self.work / "host.log", os.environ["BENCH_KEEP_HOST_LOG"])
        shutil.rmtree(self.work, ignore_errors=True)

    def figures(self) -> dict[str, float]:
        return proc_figures(self.proc.pid)

    def runner_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@dataclass
class Answer:
    """The host's first answer to one send: `kind` (run_started, queued or refusal), `seconds` after the call was
    made, and `reached` seconds until the host took the message up (RunInfo.created_at, stamped when the host's
    RunManager.send reads it; -1 for a refusal, which carries no run)."""

    kind: str
    seconds: float
    reached: float = -1.0


async def one_run(
    client: HostClient,
    bot: str,
    conversation: str,
    deltas: int,
    pause_ms: float,
    answered: list[Answer] | None = None,
) -> tuple[float, str, int]:
    """(latency, status, text deltas received). status is the run's, or `refused <ms>` when the host refused to
    admit it with a retry hint (any other failed call raises). `answered` gets the host's first answer (run_started,
    queued, or the refusal): how long the call waited to learn what became of it."""
    t0 = time.perf_counter()
    wall0 = time.time()
    got = 0
    status = "no_outcome"
    first = True
    try:
        async for reply in client.stream(
            hpb.SendMessageRequest(bot=bot, text=f"load {deltas} {pause_ms}", conversation_id=conversation),
            timeout=600,
        ):
            kind = reply.WhichOneof("kind")
            if first and answered is not None:
                first = False
                # A host from before the `queued` reply answers run_started (its RunInfo may say queued).
                run = reply.queued.run if kind == "queued" else reply.run_started
                answered.append(Answer(kind, time.perf_counter() - t0, max(0.0, run.created_at - wall0)))
            if kind == "events":
                got += sum(1 for e in reply.events.events if e.WhichOneof("kind") == "text_delta")
            elif kind == "run_finished":
                status = reply.run_finished.status
                if status != "completed":
                    status += f" ({reply.run_finished.error_code}: {reply.run_finished.error_message[:120]})"
    except errors.ResourceExhausted as exc:
        if exc.retry_after_ms <= 0 or got or status != "no_outcome":
            raise
        if answered is not None:
            answered.append(Answer("refusal", time.perf_counter() - t0))
        return time.perf_counter() - t0, f"refused {exc.retry_after_ms}", 0
    return time.perf_counter() - t0, status, got


def spread(values: list[float]) -> tuple[float, float, float]:
    """(p50, p90, max) of `values`, zeros when empty."""
    if not values:
        return (0.0, 0.0, 0.0)
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.9))], values[-1]


def answer_figures(answered: list[Answer]) -> dict[str, tuple[int, tuple[float, float, float]]]:
    """Per first-answer kind (and `all`, and `reached`: until the host took the message up): (count, spread)."""
    out: dict[str, tuple[int, tuple[float, float, float]]] = {
        "all": (len(answered), spread([a.seconds for a in answered]))
    }
    for kind in ("run_started", "queued", "refusal"):
        times = [a.seconds for a in answered if a.kind == kind]
        out[kind] = (len(times), spread(times))
    reached = [a.reached for a in answered if a.reached >= 0]
    out["reached"] = (len(reached), spread(reached))
    return out


@dataclass
class Outcome:
    """What became of one send: `kind` ok / refused / failed / cancelled (a bare CANCELLED) / late (cut off at the
    deadline); `detail` the refusal's retry hint in ms or the failure; `latency` and text deltas `got`."""

    kind: str
    detail: str = ""
    latency: float = 0.0
    got: int = 0


async def drive(
    client: HostClient,
    plugins: int,
    runs: int,
    deltas: int,
    pause_ms: float,
    tag: str,
    *,
    first: int = 0,
    deadline: float = 600.0,
) -> tuple[list[Answer], list[Outcome]]:
    """Runs number `first`..`first + runs - 1` at once from `client`, spread over the bots, each in its own
    conversation; their first answers and outcomes. Runs still going after `deadline` seconds are cancelled."""
    answered: list[Answer] = []
    tasks = [
        asyncio.ensure_future(one_run(client, f"load{i % plugins}", f"{tag}-{i}", deltas, pause_ms, answered))
        for i in range(first, first + runs)
    ]
    _, late = await asyncio.wait(tasks, timeout=deadline)
    for task in late:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    outcomes: list[Outcome] = []
    for task in tasks:
        if task.cancelled():
            outcomes.append(Outcome("late", f"unfinished after the {deadline:.0f}s deadline"))
            continue
        exc = task.exception()
        if exc is not None:
            kind = "cancelled" if isinstance(exc, errors.Cancelled) else "failed"
            outcomes.append(Outcome(kind, f"{type(exc).__name__}: {exc}"))
            continue
        latency, status, got = task.result()
        if status.startswith("refused "):
            outcomes.append(Outcome("refused", status.split()[1]))
        elif status != "completed" or got != deltas + 1:
            outcomes.append(Outcome("failed", f"{status}, {got} deltas", latency, got))
        else:
            outcomes.append(Outcome("ok", "", latency, got))
    return answered, outcomes


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (every thread), or of `pid` from /proc."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def client_part(spec: dict[str, object]) -> None:
    """One client process of `--clients`: connects, says `ready`, waits for a line on stdin, makes its share of the
    sends and prints its answers, outcomes and CPU seconds as one JSON line."""
    if spec.get("raw"):
        client = HostClient(str(spec["address"]), token="raw", timeout=600)
    else:
        client = HostClient.for_data_dir(Path(str(spec["home"])), timeout=600)
    try:
        if not spec.get("raw"):  # the channel connected before the release, as the one-process client's is
            await client.call("GetStatus", hpb.GetStatusRequest())
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        cpu0 = cpu_seconds()
        if spec.get("raw"):
            answered, outcomes = await raw_drive(client, int(spec["runs"]))  # type: ignore[call-overload]
        else:
            answered, outcomes = await drive(
                client,
                int(spec["plugins"]),  # type: ignore[call-overload]
                int(spec["runs"]),  # type: ignore[call-overload]
                int(spec["deltas"]),  # type: ignore[call-overload]
                float(spec["pause_ms"]),  # type: ignore[arg-type]
                str(spec["tag"]),
                first=int(spec["first"]),  # type: ignore[call-overload]
                deadline=float(spec["deadline"]),  # type: ignore[arg-type]
            )
        cpu = cpu_seconds() - cpu0
    finally:
        await client.close()
    print(
        json.dumps(
            {
                "answered": [[a.kind, a.seconds, a.reached] for a in answered],
                "outcomes": [[o.kind, o.detail, o.latency, o.got] for o in outcomes],
                "cpu_s": cpu,
            }
        ),
        flush=True,
    )


async def drive_in_processes(
    clients: int, runs: int, spec: dict[str, object], deadline: float
) -> tuple[list[Answer], list[Outcome], float]:
    """The sends made by `clients` processes (`client_part`), released together: answers, outcomes, and the CPU
    seconds the clients spent from the release to their last outcome."""
    procs = []
    share = [runs // clients + (1 if i < runs % clients else 0) for i in range(clients)]
    first = 0
    try:
        for n in share:
            part = dict(spec, runs=n, first=first)
            first += n
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    __file__,
                    "--client-part",
                    json.dumps(part),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    limit=1 << 30,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if line.strip() != b"ready":
                raise RuntimeError(f"a client process did not start: {line[:500]!r}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        answered: list[Answer] = []
        outcomes: list[Outcome] = []
        cpu = 0.0
        for proc in procs:
            assert proc.stdout is not None
            out = json.loads(await asyncio.wait_for(proc.stdout.readline(), deadline + 120))
            answered += [Answer(*a) for a in out["answered"]]
            outcomes += [Outcome(*o) for o in out["outcomes"]]
            cpu += out["cpu_s"]
        return answered, outcomes, cpu
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def run_load(
    lh: LoadHost,
    runs: int,
    deltas: int,
    pause_ms: float,
    tag: str = "r",
    *,
    allow_refusals: bool = False,
    deadline: float = 600.0,
    clients: int = 1,
) -> dict[str, object]:
    """`runs` concurrent runs spread over the bots, each in its own conversation, from this process or from
    `clients` client processes; returns the figures. A refusal with a retry hint counts as `refused`, and as an
    error too unless `allow_refusals`. Runs still going after `deadline` seconds are cancelled and count as errors."""
    assert lh.client is not None and lh.proc is not None
    host_cpu0 = cpu_seconds(lh.proc.pid)
    t0 = time.perf_counter()
    if clients > 1:
        spec: dict[str, object] = {
            "home": str(lh.work / "home"),
            "plugins": lh.plugins,
            "deltas": deltas,
            "pause_ms": pause_ms,
            "tag": tag,
            "deadline": deadline,
        }
        answered, outcomes, client_cpu = await drive_in_processes(clients, runs, spec, deadline)
    else:
        cpu0 = cpu_seconds()
        answered, outcomes = await drive(lh.client, lh.plugins, runs, deltas, pause_ms, tag, deadline=deadline)
        client_cpu = cpu_seconds() - cpu0
    wall = time.perf_counter() - t0
    host_cpu = cpu_seconds(lh.proc.pid) - host_cpu0
    problems: list[str] = []
    latencies: list[float] = []
    hints: list[int] = []
    events = ok = cancelled = 0
    for o in outcomes:
        if o.kind == "refused":
            hints.append(int(o.detail))
            if not allow_refusals:
                problems.append(f"refused with a retry hint of {hints[-1]} ms")
            continue
        if o.kind in ("late", "cancelled") or (o.kind == "failed" and not o.latency):
            problems.append(o.detail)
            cancelled += o.kind == "cancelled"
            continue
        latencies.append(o.latency)
        events += o.got
        if o.kind == "ok":
            ok += 1
        else:
            problems.append(o.detail)
    latencies.sort()
    hints.sort()
    answers = answer_figures(answered)
    return {
        "runs": runs,
        "ok": ok,
        "refused": len(hints),
        "hint_ms": (hints[0], statistics.median(hints), hints[-1]) if hints else (0, 0, 0),
        "cancelled": cancelled,
        "wall_s": wall,
        "runs_per_s": ok / wall,
        "events_per_s": events / wall,
        "events": events,
        "p50_s": statistics.median(latencies) if latencies else 0.0,
        "p99_s": latencies[max(0, int(len(latencies) * 0.99) - 1)] if latencies else 0.0,
        "answer_p50_s": answers["all"][1][0],
        "answer_max_s": answers["all"][1][2],
        "answers": answers,
        "errors": problems,
        "client_cpu_s": client_cpu,
        "host_cpu_s": host_cpu,
    }


async def raw_server(address: str) -> None:
    """A bare grpc.aio server: SendMessage registered as the host registers it, answering `queued` at once and then
    holding the stream until the client goes."""

    async def send(request: hpb.SendMessageRequest, context: object) -> AsyncIterator[hpb.SendMessageReply]:
        yield hpb.SendMessageReply(queued=hpb.RunQueued(run=hpb.RunInfo(created_at=time.time())))
        await asyncio.sleep(600)

    server = grpc.aio.server(options=SERVER_OPTIONS)
    handler = grpc.unary_stream_rpc_method_handler(
        send, request_deserializer=hpb.SendMessageRequest.FromString, response_serializer=_serialize
    )
    server.add_registered_method_handlers("agenthost.v1.AgentHost", {"SendMessage": handler})
    server.add_insecure_port(address)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _serialize(reply: hpb.SendMessageReply) -> bytes:
    return reply.SerializeToString()


async def raw_drive(client: HostClient, runs: int) -> tuple[list[Answer], list[Outcome]]:
    """`runs` SendMessage calls at once from `client` to `raw_server`: their first answers."""
    answered: list[Answer] = []

    async def one() -> None:
        t0, wall0 = time.perf_counter(), time.time()
        async for reply in client.stream(hpb.SendMessageRequest(bot="raw", text="x"), timeout=120):
            answered.append(Answer("queued", time.perf_counter() - t0, max(0.0, reply.queued.run.created_at - wall0)))
            return

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(runs))), 300)
    return answered, [Outcome("ok") for _ in answered]


async def raw_first_answers(
    runs: int, clients: int = 1
) -> tuple[dict[str, tuple[int, tuple[float, float, float]]], float]:
    """`runs` SendMessage calls at once from one HostClient (or `clients` client processes) to `raw_server` in a
    subprocess: first-answer figures and the clients' CPU seconds."""
    work = Path(tempfile.mkdtemp(prefix="ahraw-"))
    address = f"unix:{work}/raw.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--raw-server", address, stdout=subprocess.PIPE
    )
    client = HostClient(address, token="raw")
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), 60)
        if clients > 1:
            answered, _, cpu = await drive_in_processes(clients, runs, {"raw": True, "address": address}, 300)
        else:
            cpu0 = cpu_seconds()
            answered, _ = await raw_drive(client, runs)
            cpu = cpu_seconds() - cpu0
        return answer_figures(answered), cpu
    finally:
        await client.close()
        proc.terminate()
        await proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def error_kinds(problems: list[str]) -> list[tuple[str, int]]:
    """The errors grouped by their text with run ids and numbers blanked, most frequent first: what they ARE."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    for text in problems:
        key = re.sub(r"\b(run|conv|msg)_[0-9a-f]+|\d+(\.\d+)?", "#", text)[:200]
        counts[key] = counts.get(key, 0) + 1
        example.setdefault(key, text[:300])
    return [(example[k], n) for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def show(label: str, fig: dict[str, float]) -> str:
    return (
        f"{label:8} rss {fig['rss_mib']:6.1f} MiB  peak {fig['peak_mib']:6.1f} MiB  "
        f"fds {fig['fds']:4.0f}  threads {fig['threads']:3.0f}"
    )


async def main(args: argparse.Namespace) -> int:
    if args.database == "postgresql":
        from tests.pg_cluster import bench_database

        with bench_database() as dsn:
            print("database: PostgreSQL, a throwaway cluster (fsync on) over loopback TCP")
            return await load_rounds(args, dsn)
    print("database: the SQLite file in the host's data dir" if args.database == "sqlite" else "database: --database")
    return await load_rounds(args, "" if args.database == "sqlite" else args.database)


async def load_rounds(args: argparse.Namespace, database: str) -> int:
    async with LoadHost(plugins=args.plugins, profile=args.profile, database=database) as lh:
        await run_load(lh, min(20, args.runs), args.deltas, args.pause_ms, tag="warm")
        before = lh.figures()
        print(f"host pid {lh.proc.pid}; child processes (runner plugins + the built-in one): {lh.runner_pids()}")
        print(show("before", before))
        failures = 0
        for r in range(args.rounds):
            res = await run_load(
                lh,
                args.runs,
                args.deltas,
                args.pause_ms,
                tag=f"round{r}",
                allow_refusals=True,
                deadline=args.deadline,
                clients=args.clients,
            )
            after = lh.figures()
            failures += len(res["errors"])
            lo, mid, hi = res["hint_ms"]
            print(
                f"round {r}: {res['runs']} concurrent runs x {args.deltas + 1} deltas: ok {res['ok']}, "
                f"refused with a retry hint {res['refused']} (hint min/median/max {lo}/{mid:.0f}/{hi} ms), "
                f"other errors {len(res['errors'])} (bare CANCELLED {res['cancelled']}); "
                f"host peak RSS {after['peak_mib']:.1f} MiB; duration {res['wall_s']:.2f}s"
            )
            print(
                f"   {res['runs_per_s']:.0f} runs/s, {res['events_per_s']:.0f} deltas/s to the client, "
                f"run latency p50 {res['p50_s']:.2f}s p99 {res['p99_s']:.2f}s"
            )
            for kind, (count, (p50, p90, top)) in res["answers"].items():
                label = "took up" if kind == "reached" else f"first answer {kind}"
                print(f"   {label:26} n {count:5}  p50 {p50:6.2f}s  p90 {p90:6.2f}s  max {top:6.2f}s")
            print(
                f"   CPU during the round: clients ({args.clients} process(es)) {res['client_cpu_s']:.1f} s, "
                f"host {res['host_cpu_s']:.1f} s, over {res['wall_s']:.1f} s of wall time"
            )
            for text, count in error_kinds(res["errors"]):
                print(f"   error x{count}: {text}")
            if args.baseline:
                raw, raw_cpu = await raw_first_answers(args.runs, args.clients)
                print(f"   raw grpc.aio: clients' CPU {raw_cpu:.1f} s")
                for kind in ("all", "reached"):
                    count, (p50, p90, top) = raw[kind]
                    label = "raw grpc.aio: took up" if kind == "reached" else "raw grpc.aio: first answer"
                    print(f"   {label:26} n {count:5}  p50 {p50:6.2f}s  p90 {p90:6.2f}s  max {top:6.2f}s")
            print(show("after", after))
        print(
            f"host RSS growth {after['rss_mib'] - before['rss_mib']:+.1f} MiB, fds {after['fds'] - before['fds']:+.0f}"
        )
        return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--plugins", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--pause-ms", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="run the host under cProfile; its stats go to this file")
    parser.add_argument("--deadline", type=float, default=300, help="seconds a round may take (then it is cut off)")
    parser.add_argument("--baseline", action="store_true", help="also the same client against a bare grpc.aio server")
    parser.add_argument("--clients", type=int, default=1, help="client processes making a round's sends")
    parser.add_argument(
        "--database",
        default="sqlite",
        help="sqlite (the default), postgresql (a throwaway cluster this script starts, fsync on, over loopback TCP)"
        " or a postgresql:// DSN",
    )
    parser.add_argument("--raw-server", help=argparse.SUPPRESS)  # the baseline's server process
    parser.add_argument("--client-part", help=argparse.SUPPRESS)  # one client process of --clients
    parsed = parser.parse_args()
    if parsed.client_part:
        asyncio.run(client_part(json.loads(parsed.client_part)))
        sys.exit(0)
    if parsed.raw_server:
        asyncio.run(raw_server(parsed.raw_server))
        sys.exit(0)
    sys.exit(asyncio.run(main(parsed)))
