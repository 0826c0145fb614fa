"""Local-agent overhead benchmark (not a test).

Prints:
1. The runner's own cost per model turn against a zero-latency scripted provider on loopback, as a ratio to
   calling that provider directly with httpx in the same run. The direct calls replay the exact request bodies
   the runner sent, so both sides move the same bytes; the difference is the runner (context assembly, session
   writes, token accounting, event construction, stream parsing).
2. The RSS of a runner process after a 200-turn conversation with compaction (measured in a child process that
   does nothing else).

    .venv/bin/python benchmarks/bench_local_agent.py [--turns 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from agenthost.runners.local_agent.runner import LocalAgentRunner  # noqa: E402
from agenthost.runners.local_agent.testing import FakeProviderServer, FakeRunAPI, make_run, openai_text  # noqa: E402

REPLY_TEXT = "Sure - here is a short answer of a few dozen tokens, streamed in pieces like a real model does."


def rss_kib() -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def runner_turns(server: FakeProviderServer, turns: int, data_dir: Path) -> tuple[list[float], list[bytes]]:
    runner = LocalAgentRunner(data_dir, env={})
    api = FakeRunAPI("bench")
    config = {"model": "vllm/bench", "base_url": server.url + "/v1", "context_window": 1_000_000}
    times: list[float] = []
    first_request = len(server.requests)
    for i in range(turns):
        text = f"message {i}: please answer briefly"
        api.add_user(text, event_id=f"e{i}")
        run = make_run(api, text, conversation_id="bench", config=config, event_id=f"e{i}")
        t0 = time.perf_counter()
        events = [ev async for ev in runner.run(run)]
        times.append(time.perf_counter() - t0)
        assert events[-1].WhichOneof("kind") == "completed", events[-1]
        api.project(events)
    await runner.close()
    bodies = [r.body for r in server.requests[first_request:] if r.method == "POST"]
    return times, bodies


async def direct_calls(server: FakeProviderServer, bodies: list[bytes]) -> list[float]:
    times: list[float] = []
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for body in bodies:
            t0 = time.perf_counter()
            text = []
            async with client.stream(
                "POST", server.url + "/v1/chat/completions", content=body, headers=headers
            ) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        for choice in chunk.get("choices", []):
                            text.append(choice.get("delta", {}).get("content") or "")
            times.append(time.perf_counter() - t0)
    return times


async def overhead(turns: int, rounds: int) -> None:
    async with FakeProviderServer() as server:
        server.default = openai_text(REPLY_TEXT, piece=6)
        # Warm both paths (imports, connection setup, first-call costs).
        with tempfile.TemporaryDirectory() as tmp:
            _, bodies = await runner_turns(server, 5, Path(tmp))
            await direct_calls(server, bodies)
        ratios, runner_ms, direct_ms = [], [], []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                rt, bodies = await runner_turns(server, turns, Path(tmp))
            dt = await direct_calls(server, bodies)
            r, d = statistics.median(rt), statistics.median(dt)
            runner_ms.append(r * 1000)
            direct_ms.append(d * 1000)
            ratios.append(r / d)
        print(f"per model turn over {turns} turns x {rounds} rounds (medians; zero-latency scripted provider):")
        print(f"  direct httpx call     {statistics.median(direct_ms):7.3f} ms")
        print(f"  runner turn           {statistics.median(runner_ms):7.3f} ms")
        print(f"  runner overhead       {statistics.median(runner_ms) - statistics.median(direct_ms):7.3f} ms per turn")
        print(
            f"  ratio runner/direct   {statistics.median(ratios):7.2f}x  "
            f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})"
        )


CHILD = r"""
import asyncio, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from benchmarks.bench_local_agent import rss_kib
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeRunAPI, make_run

async def main(url: str, turns: int) -> None:
    idle = rss_kib()
    with tempfile.TemporaryDirectory() as tmp:
        runner = LocalAgentRunner(Path(tmp), env={})
        api = FakeRunAPI("mem")
        config = {"model": "vllm/bench", "base_url": url + "/v1", "context_window": 16000,
                  "compaction_watermark": 0.6}
        compactions = 0
        for i in range(turns):
            text = f"turn {i}: " + "some context the user pasted. " * 40
            api.add_user(text, event_id=f"e{i}")
            run = make_run(api, text, conversation_id="mem", config=config, event_id=f"e{i}")
            events = [ev async for ev in runner.run(run)]
            assert events[-1].WhichOneof("kind") == "completed", events[-1]
            compactions += sum(ev.WhichOneof("kind") == "compaction" for ev in events)
            api.project(events)
        session_bytes = sum(p.stat().st_size for p in Path(tmp).rglob("*.jsonl"))
        await runner.close()
    print(json.dumps({"idle": idle, "after": rss_kib(), "compactions": compactions, "session_bytes": session_bytes,
                      "transcript_items": len(api.items)}))

asyncio.run(main(sys.argv[2], int(sys.argv[3])))
"""


async def memory(turns: int) -> None:
    async with FakeProviderServer() as server:
        server.default = openai_text(REPLY_TEXT + " " + "More detail follows. " * 30, piece=24)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(ROOT),
            server.url,
            str(turns),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 600)
        if proc.returncode != 0:
            raise SystemExit(f"memory child failed:\n{err.decode()}")
        r = json.loads(out.decode().strip().splitlines()[-1])
        print(f"runner process after a {turns}-turn conversation with compaction (window 16000, watermark 0.6):")
        print(f"  RSS idle (runner imported)   {r['idle'][0] / 1024:7.1f} MiB")
        print(
            f"  RSS after {turns} turns        {r['after'][0] / 1024:7.1f} MiB  (peak {r['after'][1] / 1024:.1f} MiB)"
        )
        print(f"  growth                       {(r['after'][0] - r['idle'][0]) / 1024:7.1f} MiB")
        print(
            f"  compactions {r['compactions']}, session file {r['session_bytes'] / 1024:.1f} KiB, "
            f"host transcript items {r['transcript_items']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overhead-turns", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(overhead(args.overhead_turns, args.rounds))
    asyncio.run(memory(args.turns))


if __name__ == "__main__":
    main()
