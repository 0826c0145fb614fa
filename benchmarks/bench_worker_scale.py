"""Scale on workers (issue 22): one host, N `agenthost worker` processes, as many concurrent runs as asked.

    python benchmarks/bench_worker_scale.py [--runs 2000] [--bots 1] [--workers 4] [--capacity 64] [--deadline 900]
                                            [--netns]

Processes, as in production: `agenthost serve --workers 127.0.0.1:PORT` (the host), N `agenthost worker`
processes (enrolled with join tokens from the CLI, each running the built-in local agent in its sandbox), a
scripted OpenAI-compatible model on loopback answering each request with a short streamed text, and this script
as the client holding every run's SendMessage stream open at once (bench_load.one_run: one conversation per run).
The binding names the workers' pool, so every run is placed on a worker.

`--netns` (root, iproute2): each worker in a network namespace of its own, joined by a veth pair to a bridge in
the host's namespace (the host's workers port and the scripted model listen on the bridge's address), as a worker
on another machine would be; without it everything is on loopback.

Prints: runs ok, refused with a retry hint (counted apart, not errors), other errors; the host's peak RSS; the
first answer (run_started, queued, or a refusal) p50 / p90 / max; wall time. Exit status 1 on any error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_load import Answer, answer_figures, one_run, proc_figures  # noqa: E402
from bench_workers import free_port  # noqa: E402

from agenthost.host.api.client import HostClient  # noqa: E402
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text  # noqa: E402
from tests.workers.test_partition import ReachableProvider, ip  # noqa: E402

CLI = [sys.executable, "-m", "agenthost.host.cli"]


def cli(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTHOST", "ANTHROPIC", "OPENAI"))}
    out = subprocess.run([*CLI, "--data-dir", str(home), *args], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"agenthost {' '.join(args)}: {out.stderr}")
    return out.stdout


def answers(home: Path) -> bool:
    try:
        cli(home, "status")
    except RuntimeError:
        return False
    return True


class Namespaces:
    """One network namespace per worker, each joined by a veth pair to a bridge holding the host's address."""

    def __init__(self, workers: int) -> None:
        tag = os.getpid() % 100000
        self.bridge, self.names = f"ahsb{tag}", [f"ahs{tag}w{n}" for n in range(workers)]
        self.subnet = f"10.232.{os.getpid() % 250 + 1}"
        self.address = f"{self.subnet}.1"

    def __enter__(self) -> Namespaces:
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for n, ns in enumerate(self.names):
                outer, inner = f"{self.bridge}h{n}", f"{self.bridge}w{n}"
                ip("netns", "add", ns)
                ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                ip("link", "set", inner, "netns", ns)
                ip("link", "set", outer, "master", self.bridge)
                ip("link", "set", outer, "up")
                ip("netns", "exec", ns, "ip", "addr", "add", f"{self.subnet}.{n + 2}/24", "dev", inner)
                ip("netns", "exec", ns, "ip", "link", "set", inner, "up")
                ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for n, ns in enumerate(self.names):
            subprocess.run(["ip", "link", "del", f"{self.bridge}h{n}"], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


async def main(args: argparse.Namespace) -> int:
    if not args.netns:
        return await scale(args, None)
    with Namespaces(args.workers) as nets:
        return await scale(args, nets)


async def scale(args: argparse.Namespace, nets: Namespaces | None) -> int:
    work = Path(tempfile.mkdtemp(prefix="ahwscale-"))
    home, port = work / "host", free_port()
    address = nets.address if nets is not None else "127.0.0.1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTHOST", "ANTHROPIC", "OPENAI"))}
    log = (work / "processes.log").open("ab")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        host = subprocess.Popen(  # noqa: ASYNC220
            [*CLI, "--data-dir", str(home), "serve", "--workers", f"{address}:{port}"], env=env, stdout=log, stderr=log
        )
        procs.append(host)
        deadline = time.monotonic() + 120
        while not answers(home):
            if host.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the host did not come up; see " + str(work / "processes.log"))
            await asyncio.sleep(0.2)
        for n in range(args.workers):
            join = cli(home, "workers", "token", "create").strip()
            inside = ["ip", "netns", "exec", nets.names[n]] if nets is not None else []
            procs.append(
                subprocess.Popen(  # noqa: ASYNC220
                    [
                        *inside,
                        *CLI,
                        "--data-dir",
                        str(work / f"w{n}"),
                        "worker",
                        "--host",
                        f"{address}:{port}",
                        "--join",
                        join,
                        "--name",
                        f"w{n}",
                        "--capacity",
                        str(args.capacity),
                    ],
                    env=env,
                    stdout=log,
                    stderr=log,
                )
            )
        deadline = time.monotonic() + 600
        while cli(home, "workers", "list").count(" connected ") < args.workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not connect:\n" + cli(home, "workers", "list"))
            await asyncio.sleep(1)
        async with FakeProviderServer() if nets is None else ReachableProvider(address) as model:
            model.default = openai_text("ok, done")
            config = ["model=vllm/m", f"base_url={model.url}/v1", "max_retries=0", "context_window=32000"]
            for b in range(args.bots):  # a bot queues at most RUNS_MAX_QUEUED_PER_BOT: more runs need more bots
                cli(home, "bots", "create", f"load{b}")
                cli(home, "bots", "bind", f"load{b}", "--runner", "agenthost/local-agent", "--pool", "default",
                    "--config", *config, "--timeout", str(int(args.deadline)))  # fmt: skip
            async with HostClient.for_data_dir(home, timeout=args.deadline) as client:
                answered: list[Answer] = []
                t0 = time.perf_counter()
                tasks = [
                    asyncio.ensure_future(one_run(client, f"load{i % args.bots}", f"s{i}", 0, 0, answered))
                    for i in range(args.runs)
                ]
                _, late = await asyncio.wait(tasks, timeout=args.deadline)
                for task in late:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                wall = time.perf_counter() - t0
        ok = refused = 0
        problems: list[str] = []
        for task in tasks:
            if task.cancelled():
                problems.append("unfinished at the deadline")
            elif (exc := task.exception()) is not None:
                problems.append(f"{type(exc).__name__}: {exc}")
            elif (status := task.result()[1]).startswith("refused "):
                refused += 1
            elif status == "completed":
                ok += 1
            else:
                problems.append(status)
        peak = proc_figures(host.pid)["peak_mib"]
        print(
            f"{args.runs} concurrent runs ({args.bots} bots) on {args.workers} workers (capacity {args.capacity}"
            f"{', each in its own network namespace' if nets is not None else ''}): "
            f"ok {ok}, "
            f"refused with a retry hint {refused}, other errors {len(problems)}; host peak RSS {peak:.0f} MiB; "
            f"wall {wall:.1f}s"
        )
        for kind, (count, (p50, p90, top)) in answer_figures(answered).items():
            label = "took up" if kind == "reached" else f"first answer {kind}"
            print(f"   {label:26} n {count:5}  p50 {p50:6.2f}s  p90 {p90:6.2f}s  max {top:6.2f}s")
        for problem in sorted(set(problems))[:5]:
            print("   error:", problem, f"(x{problems.count(problem)})")
        return 1 if problems else 0
    finally:
        for proc in procs[1:] + procs[:1]:  # the workers first, then the host
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bots", type=int, default=1, help="bots the runs are spread over, one conversation each")
    parser.add_argument("--capacity", type=int, default=64)
    parser.add_argument("--deadline", type=float, default=900, help="seconds the runs may take (then cut off)")
    parser.add_argument("--netns", action="store_true", help="each worker in a network namespace of its own (root)")
    sys.exit(asyncio.run(main(parser.parse_args())))
