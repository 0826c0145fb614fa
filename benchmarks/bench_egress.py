"""What the egress walls cost (agenthost.runners.sdk.egress): a sandbox whose only way out is the runner's proxy,
against one sharing the host's network, in the same run.

    .venv/bin/python benchmarks/bench_egress.py [--rounds 21] [--requests 20]

Two figures, each from interleaved rounds (the order alternates, so drift in machine load hits both alike):

* **start**: bwrap + the command `/bin/true`, to its exit: sharing the host's network, in a network namespace of
  its own with nothing in it (`own_netns`: what a shell command without `network` always had), and the egress
  sandbox, which also starts its forwarder first (the runner's Python, -I -S). What every harness process and
  networked shell command pays once.
* **request**: one HTTP request on a new connection (as a harness opens one per model request, at worst) from
  inside the sandbox to a model API on the host's loopback, timed inside the sandbox: direct, against through the
  forwarder and the proxy (a CONNECT tunnel, the route a loopback base_url takes), and through the proxy by
  HTTP_PROXY (the route a named API host takes; here the proxy lets 127.0.0.1 through as the configured
  endpoint). The median of `--requests` requests per round.

* **turn** (with `--turns N`, needs the pinned CLIs): one whole harness turn ("ping" -> one model request ->
  "pong", a new process each time: `keep_warm_seconds: 0`, a fresh conversation) through the runner against a
  fake API on loopback, in the egress sandbox against the same sandbox sharing the host's network (the wall
  before the egress proxy, patched in for the comparison). A kept process or a spare pays the start-up once,
  not per message; its requests still go through the proxy.

Prints the medians over rounds and the paired differences with a bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from agenthost.plugins.sandbox import Sandbox  # noqa: E402
from agenthost.runners.sdk import egress  # noqa: E402

CLIENT = r"""
import http.client, json, os, statistics, sys, time
port, n, via_proxy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "proxy"
times = []
for _ in range(n):
    t = time.perf_counter()
    if via_proxy:
        proxy_port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
        c = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=20)
        c.request("GET", f"http://127.0.0.1:{port}/v1/ping", headers={"Host": f"127.0.0.1:{port}"})
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("GET", "/v1/ping")
    r = c.getresponse(); r.read(); c.close()
    assert r.status == 200, r.status
    times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


async def run(argv: list[str]) -> bytes:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[-4:]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return out


def interval(diffs: list[float]) -> tuple[float, float]:
    rng = random.Random(7)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(2000))
    return medians[50], medians[1949]


def report(name: str, samples: dict[str, list[float]], base: str, unit: float, label: str) -> None:
    print(f"\n{name} (median over rounds, {label}):")
    for path, values in samples.items():
        print(f"  {path:<14} {statistics.median(values) * unit:8.2f}")
    for path, values in samples.items():
        if path == base:
            continue
        diffs = [(a - b) * unit for a, b in zip(values, samples[base], strict=True)]
        low, high = interval(diffs)
        print(f"  {path} - {base}: {statistics.median(diffs):+.2f} (95 % interval {low:+.2f} to {high:+.2f})")


async def turns(harness: str, rounds: int) -> dict[str, list[float]]:
    import dataclasses
    import tempfile

    from external_harness.fake_apis import FakeAnthropic, FakeOpenAI
    from external_harness.fake_run_api import FakeHost

    from agenthost.runners.external_harness import runner as runner_mod

    binary = REPO / ".tools" / "npm" / "node_modules" / ".bin" / ("claude" if harness == "claude-code" else "codex")
    fake_cls = FakeAnthropic if harness == "claude-code" else FakeOpenAI
    runner_cls = runner_mod.ClaudeCodeRunner if harness == "claude-code" else runner_mod.CodexRunner
    walled = runner_mod.harness_egress

    async def host_network(sandbox: Sandbox, *args: object) -> Sandbox:
        return dataclasses.replace(sandbox, network=True)

    times: dict[str, list[float]] = {"host_network": [], "egress": []}
    with (
        tempfile.TemporaryDirectory(prefix="ah-bench-") as d,
        fake_cls(lambda _: [{"type": "text", "text": "pong"}]) as fake,
    ):
        os.environ["ANTHROPIC_API_KEY" if harness == "claude-code" else "OPENAI_API_KEY"] = "sk-bench-0123456789"
        config: dict[str, object] = {
            "command": str(binary),
            "base_url": f"http://127.0.0.1:{fake.port}" + ("" if harness == "claude-code" else "/v1"),
        }
        config |= {"keep_warm_seconds": 0} if harness == "claude-code" else {"model": "gpt-fake"}
        async with FakeHost(Path(d)) as host:
            runner = runner_cls(Path(d) / "data")
            try:
                for i in range(rounds + 1):  # the first round warms the page cache and is not counted
                    order = ["host_network", "egress"] if i % 2 == 0 else ["egress", "host_network"]
                    for variant in order:
                        runner_mod.harness_egress = host_network if variant == "host_network" else walled
                        host.data.conversation_id = f"c{i}-{variant}"
                        started = time.perf_counter()
                        events = [e async for e in runner.run(host.run_context("ping", config=config))]
                        elapsed = time.perf_counter() - started
                        if events[-1].WhichOneof("kind") != "completed":
                            raise RuntimeError(f"{variant} turn failed: {events[-1]}")
                        if i:
                            times[variant].append(elapsed)
            finally:
                runner_mod.harness_egress = walled
                await runner.close()
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--turns", type=int, default=0, help="rounds of whole harness turns (0: none)")
    parser.add_argument("--harness", nargs="+", default=["claude-code", "codex"], choices=["claude-code", "codex"])
    args = parser.parse_args()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\npong")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    python = os.path.realpath(sys.executable)
    shared = Sandbox(network=True, ro=egress.forwarder_paths())
    walled = await egress.egress_sandbox(
        Sandbox(ro=egress.forwarder_paths()), egress.EgressPolicy(endpoints=(("127.0.0.1", port),))
    )
    client = [python, "-I", "-S", "-c", CLIENT, str(port), str(args.requests)]
    isolated = Sandbox(network=False, ro=egress.forwarder_paths())
    starts: dict[str, list[float]] = {"shared": [], "own_netns": [], "egress": []}
    requests: dict[str, list[float]] = {"direct": [], "tunnel": [], "http_proxy": []}
    for n in range(args.rounds):
        order = [("shared", shared), ("own_netns", isolated), ("egress", walled)]
        for name, box in order if n % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            await run(box.argv(["/bin/true"]))
            starts[name].append(time.perf_counter() - t)
        paths = [
            ("direct", shared, "direct"),
            ("tunnel", walled, "direct"),
            ("http_proxy", walled, "proxy"),
        ]
        for name, box, mode in paths if n % 2 == 0 else paths[::-1]:
            requests[name].append(json.loads(await run(box.argv([*client, mode]))))
    server.close()
    report("sandbox start to exit of /bin/true", starts, "shared", 1000, "ms")
    report("one HTTP request on a new connection", requests, "direct", 1000, "ms")
    for harness in args.harness if args.turns else ():
        report(f"a {harness} turn", await turns(harness, args.turns), "host_network", 1000, "ms")


if __name__ == "__main__":
    asyncio.run(main())
