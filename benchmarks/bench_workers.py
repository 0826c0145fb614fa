"""Worker benchmark (issue 22): a run-API call and streamed deltas from a runner on a worker (TCP + mutual TLS)
next to the same from a local plugin (unix socket), and next to raw grpc.aio over the same TLS transport, in one run.

    python benchmarks/bench_workers.py [--calls 2000] [--deltas 50000] [--repeats 5] [--rounds 3]

Processes, as in production: `agenthost serve --workers 127.0.0.1:PORT` (the host, with the bench runner plugin
installed locally), `agenthost worker` (enrolled with a join token from the CLI, with the same plugin installed in
its own data dir: the worker offers it, and a binding naming the worker's pool places its runs there), this script
as the client, and raw grpc.aio servers (benchmarks/raw_server.py) serving the same protos from memory:

- raw UDS: the one-hop server on a unix socket, what bench_host.py compares the local path with;
- raw TLS: the one-hop server on loopback TCP with mutual TLS, keyed with the host's own workers-port key and CA
  (hub.key, hub.crt, ca.crt) and called with the worker's own key and certificate: the same credentials, cipher
  suite and TLS version as the worker's channel; for deltas a relay on a unix socket dials it with those client
  credentials (2 hops, one of them TLS: the shape of runner -> worker -[TLS]-> host -> client, with nothing else).

StateGet (~1 KiB) latency: the bench runner times local and raw UDS calls from inside its sandbox (run API on the
host's or the worker's socket). The runner's sandbox has no network, so raw TLS calls are timed by this script,
in the same rounds (interleaved: local run, worker run, raw TLS, repeated). Deltas are compared at EQUAL batch sizes
(1, 16, 64 and 256 per message), the sides interleaved per repeat; medians.

Targets: a worker's StateGet p50 within raw TLS + 150 µs; worker deltas >= 0.5x raw TLS at each batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_host import BATCHES, host_deltas, raw_deltas  # noqa: E402
from raw_server import TLS_TARGET, client_credentials  # noqa: E402

from agenthost.host.api.client import HostClient  # noqa: E402
from agenthost.protos import common_pb2 as pb  # noqa: E402
from agenthost.protos import host_pb2 as hpb  # noqa: E402
from agenthost.protos import run_api_pb2 as api  # noqa: E402
from agenthost.protos import run_api_pb2_grpc  # noqa: E402
from agenthost.protos.wire import CHANNEL_OPTIONS  # noqa: E402

CLI = [sys.executable, "-m", "agenthost.host.cli"]
# --profile DIR: the host and the worker run under cProfile, written to DIR/{host,worker}.prof at their exit.
PROFILE: Path | None = None


def profiled(name: str) -> list[str]:
    if PROFILE is None:
        return CLI
    return [sys.executable, "-m", "cProfile", "-o", str(PROFILE / f"{name}.prof"), "-m", "agenthost.host.cli"]


PLUGIN = str(ROOT / "benchmarks" / "bench-plugin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear in {timeout:.0f} s")
        await asyncio.sleep(0.1)


def cli(home: Path, *args: str) -> str:
    out = subprocess.run([*CLI, "--data-dir", str(home), *args], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"agenthost {' '.join(args)}: {out.stderr or out.stdout}")
    return out.stdout


async def install_into(home: Path, env: dict[str, str]) -> None:
    """The bench plugin installed into a worker's data dir, as its operator does: a host started on that data dir
    for the install, then stopped."""
    proc = subprocess.Popen(  # noqa: ASYNC220 - set-up, before anything is timed
        [*CLI, "--data-dir", str(home), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await wait_file(home / "host.json")
        await asyncio.to_thread(cli, home, "plugins", "install", PLUGIN, "--offline")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def raw_tls_state_get(address: str, creds: str, n: int) -> dict[str, float]:
    """n StateGet calls over TCP + mutual TLS with the worker's credentials, after a warm-up: p50 and p99 in µs."""
    async with grpc.aio.secure_channel(
        address, client_credentials(creds), options=[*CHANNEL_OPTIONS, *TLS_TARGET]
    ) as ch:
        stub = run_api_pb2_grpc.AgentRunAPIProxyStub(ch)
        req = api.StateGetRequest(run_id="r", scope=pb.CONVERSATION, key="blob")
        for _ in range(50):
            await stub.StateGet(req, timeout=10)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            await stub.StateGet(req, timeout=10)
            samples.append(time.perf_counter() - t0)
    samples.sort()
    return {"p50_us": statistics.median(samples) * 1e6, "p99_us": samples[int(len(samples) * 0.99) - 1] * 1e6}


async def main(calls: int, deltas: int, repeats: int, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="ahwbench-"))
    env = {**os.environ, "AGENTHOST_SANDBOX_RW": str(work)}  # the runner calls the raw UDS server from its sandbox
    host_home, worker_home = work / "host", work / "worker"
    port = free_port()
    procs: list[subprocess.Popen] = []
    client: HostClient | None = None

    def start(*argv: str, out: int | None = subprocess.DEVNULL) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), env=env, stdout=out, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        procs.append(proc)
        return proc

    try:
        start(*profiled("host"), "--data-dir", str(host_home), "serve", "--workers", f"127.0.0.1:{port}")
        await install_into(worker_home, env)
        await wait_file(host_home / "host.json")
        await wait_file(host_home / "workers" / "hub.crt")
        token = cli(host_home, "workers", "token", "create", "--pool", "bench").split()[0]
        cli(worker_home, "worker", "--host", f"127.0.0.1:{port}", "--join", token, "--name", "w1", "--enrol-only")
        worker = start(*profiled("worker"), "--data-dir", str(worker_home), "worker", "--host", f"127.0.0.1:{port}")
        pki, ident = host_home / "workers", worker_home / "worker"
        server_creds = f"{pki / 'hub.key'},{pki / 'hub.crt'},{pki / 'ca.crt'}"
        client_creds = f"{ident / 'worker.key'},{ident / 'worker.crt'},{ident / 'ca.crt'}"
        raw_uds = f"unix:{work / 'raw.sock'}"
        raw_tls = f"127.0.0.1:{free_port()}"
        relay = f"unix:{work / 'relay.sock'}"
        server = str(ROOT / "benchmarks" / "raw_server.py")
        raws = [
            start(sys.executable, server, raw_uds, out=subprocess.PIPE),
            start(sys.executable, server, raw_tls, "--tls-server", server_creds, out=subprocess.PIPE),
        ]
        for proc in raws:
            proc.stdout.readline()
        raws.append(start(sys.executable, server, relay, "--relay", raw_tls, "--tls-client", client_creds))

        client = HostClient.for_data_dir(host_home, timeout=600)
        await client.__aenter__()
        await client.call("InstallPlugin", hpb.InstallPluginRequest(source=PLUGIN, offline=True))
        for bot, pool in (("local", ""), ("worker", "bench")):
            await client.call("CreateBot", hpb.CreateBotRequest(name=bot))
            await client.bind(bot, "agenthost-bench/bench", timeout_seconds=3600, pool=pool)
        deadline = time.monotonic() + 120
        while True:  # the worker offers the plugin once it has started it in its sandbox
            infos = await client.call("ListWorkers", hpb.ListWorkersRequest())
            if any(
                w.state == "connected" and any(r.runner_id == "agenthost-bench/bench" for r in w.runners)
                for w in infos.workers
            ):
                break
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"the worker did not offer the bench runner: {infos}")
            await asyncio.sleep(0.2)
        for bot in ("local", "worker"):
            for i in range(30):
                await client.send(bot, f"seed message {i}")

        state: dict[str, list[dict[str, float]]] = {"raw UDS": [], "local": [], "worker": [], "raw TLS": []}
        for _ in range(rounds):
            for bot in ("local", "worker"):
                result = await client.send(bot, f"api {raw_uds} {calls}")
                if result.run.status != "completed":
                    raise SystemExit(f"api run on {bot}: {result.run.error_code}: {result.run.error_message}")
                got = json.loads(result.text)
                state[bot].append(got["state_get/host"])
                state["raw UDS"].append(got["state_get/raw"])
            state["raw TLS"].append(await raw_tls_state_get(raw_tls, client_creds, calls))
        med = {
            side: {q: statistics.median(r[q] for r in rs) for q in ("p50_us", "p99_us")} for side, rs in state.items()
        }
        print(f"\n== StateGet (~1 KiB), {calls} calls per side per round, median of {rounds} interleaved rounds ==")
        print(f"{'side':34} {'p50 µs':>8} {'p99 µs':>8}  p50 range of the rounds")
        labels = {
            "raw UDS": "raw grpc.aio, unix socket",
            "local": "local plugin -> host (UDS)",
            "worker": "worker's runner -> worker -> host",
            "raw TLS": "raw grpc.aio, TCP + mutual TLS",
        }
        for side, label in labels.items():
            p50s = [r["p50_us"] for r in state[side]]
            print(f"{label:34} {med[side]['p50_us']:8.0f} {med[side]['p99_us']:8.0f}  {min(p50s):.0f}-{max(p50s):.0f}")
        extra = med["worker"]["p50_us"] - med["raw TLS"]["p50_us"]
        # Per round (worker and raw TLS timed in the same round): how the gap varies with the load of the moment.
        gaps = [w["p50_us"] - t["p50_us"] for w, t in zip(state["worker"], state["raw TLS"], strict=True)]
        print(f"worker - raw TLS per round: {', '.join(f'{g:+.0f}' for g in gaps)} µs")
        print(
            f"worker p50 - raw TLS p50: {extra:+.0f} µs (target <= +150: {'met' if extra <= 150 else 'missed'});"
            f" worker - local: {med['worker']['p50_us'] - med['local']['p50_us']:+.0f} µs"
        )

        print(f"\n== text deltas (~50 B), runner -> client; median of {repeats} interleaved repeats ==")
        rates: dict[tuple[str, int], float] = {}
        for batch in BATCHES:
            n = deltas if batch > 1 else max(2000, deltas // 10)
            samples: dict[str, list[float]] = {"raw TLS": [], "local": [], "worker": []}
            for _ in range(repeats):
                samples["raw TLS"].append(await raw_deltas(relay, n, batch))
                samples["local"].append(await host_deltas(client, n, batch, bot="local", conversation_id="dl"))
                samples["worker"].append(await host_deltas(client, n, batch, bot="worker", conversation_id="dw"))
            for side, values in samples.items():
                rates[(side, batch)] = statistics.median(values)
        print(
            f"{'deltas per message':>18} {'raw TLS 2 hops /s':>18} {'local /s':>10} {'worker /s':>10}"
            f" {'worker / raw TLS':>17} {'worker / local':>15}"
        )
        for batch in BATCHES:
            r, lo, w = rates[("raw TLS", batch)], rates[("local", batch)], rates[("worker", batch)]
            print(f"{batch:>18} {r:18.0f} {lo:10.0f} {w:10.0f} {w / r:17.2f} {w / lo:15.2f}")
        missed = [b for b in BATCHES if rates[("worker", b)] < 0.5 * rates[("raw TLS", b)]]
        print(
            "target: worker >= 0.5x raw TLS at every batch size:"
            f" {'met' if not missed else 'missed at ' + ', '.join(map(str, missed))}"
        )
    finally:
        if client is not None:
            await client.__aexit__(None, None, None)
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=50000)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per batch size (median)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved StateGet rounds (median)")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="run the host and the worker under cProfile")
    args = parser.parse_args()
    PROFILE = args.profile
    asyncio.run(main(args.calls, args.deltas, args.repeats, args.rounds))
