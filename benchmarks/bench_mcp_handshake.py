"""What the MCP protocol version costs Claude Code's start-up: the bare CLI against a runner-style MCP endpoint.

    .venv/bin/python benchmarks/bench_mcp_handshake.py [--runs 15]

Each round runs a trivial `claude -p` turn ("ping" -> "pong", fake API on loopback, fresh working directory) three
ways, in rotating order: with no MCP server (`bare`); with a per-turn McpHttpEndpoint as its `--mcp-config` server
speaking 2026-07-28 (`mcp-2026`: server/discover + tools/list on one connection); and with the same endpoint
refusing that version, as it did before (`mcp-2025`: the refused probe, then initialize,
notifications/initialized, a GET and tools/list on a second connection). It prints the medians, each path's paired
ratio to the bare run of its round, and where the turn's time goes: start to the CLI's first MCP request, first to
last MCP request (`window`), start to the model request, and model request to exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agenthost.runners.external_harness import mcp_http  # noqa: E402
from agenthost.runners.external_harness.mcp_http import McpHttpEndpoint  # noqa: E402
from benchmarks.bench_harness import BIN, bare_command, pong  # noqa: E402
from tests.external_harness.fake_apis import FakeAnthropic  # noqa: E402


class Endpoint(McpHttpEndpoint):
    """The turn endpoint, recording when requests arrive; `legacy` refuses 2026-07-28 as it did before."""

    def __init__(self, *, legacy: bool) -> None:
        super().__init__(None, unavailable_reason="bench")
        self.legacy = legacy
        self.arrivals: list[float] = []

    async def _route(self, conn, reader, request):  # type: ignore[no-untyped-def]
        self.arrivals.append(time.perf_counter())
        return await super()._route(conn, reader, request)

    async def _stateless_request(self, conn, reader, request, headers):  # type: ignore[no-untyped-def]
        if self.legacy:
            raise mcp_http._HttpError(400, "unsupported MCP-Protocol-Version")
        return await super()._stateless_request(conn, reader, request, headers)


MODEL_REQUESTS: list[float] = []


def timed_pong(request):  # type: ignore[no-untyped-def]
    MODEL_REQUESTS.append(time.perf_counter())  # the fake API's thread; perf_counter is one clock per process
    return pong(request)


async def turn(path: str, port: int, root: Path, work: Path) -> dict[str, float]:
    argv, env = bare_command("claude-code", str(BIN / "claude"), port, root / "bare")
    work.mkdir(parents=True)
    endpoint = None if path == "bare" else Endpoint(legacy=path == "mcp-2025")
    if endpoint is not None:
        await endpoint.start()
        config = work / "mcp.json"
        server = {"type": "http", "url": endpoint.url, "headers": {"Authorization": "Bearer ${AGENTHOST_MCP_TOKEN}"}}
        config.write_text(json.dumps({"mcpServers": {"agenthost": server}}))
        argv = [*argv, "--mcp-config", str(config)]
        env["AGENTHOST_MCP_TOKEN"] = endpoint.token
    try:
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=work, env=env, stdin=-1, stdout=-1, stderr=asyncio.subprocess.DEVNULL
        )
        out, _ = await proc.communicate(b"ping")
        elapsed = time.perf_counter() - started
        if proc.returncode != 0 or b"pong" not in out:
            raise RuntimeError(f"{path} failed ({proc.returncode}): {out[-300:]!r}")
        if endpoint is not None and b'"name":"agenthost","status":"connected"' not in out:
            raise RuntimeError(f"{path}: the MCP server did not connect")
        arrivals = endpoint.arrivals if endpoint is not None else [started, started]
        model = next(t for t in MODEL_REQUESTS if t > started)
        return {
            "total": elapsed,
            "to_mcp": arrivals[0] - started,
            "window": arrivals[-1] - arrivals[0],
            "to_model": model - started,
            "to_exit": started + elapsed - model,
        }
    finally:
        if endpoint is not None:
            await endpoint.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    paths = ["bare", "mcp-2026", "mcp-2025"]
    rows: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    with FakeAnthropic(timed_pong) as fake, tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        for i in range(args.runs + 1):  # round 0 warms up
            order = paths[i % len(paths) :] + paths[: i % len(paths)]
            for path in order:
                row = await turn(path, fake.port, Path(tmp), Path(tmp) / f"{path}-{i}")
                if i:
                    rows[path].append(row)
    print(f"claude -p trivial turn, median of {args.runs} rotating rounds; 'paired' = median of per-round ratios")
    print("medians in ms; to-MCP: start to the first MCP request; window: first to last MCP request")
    print(f"{'path':<10} {'total':>7} {'paired':>7} {'to-MCP':>7} {'window':>7} {'to-model':>9} {'to-exit':>8}")
    for path in paths:

        def med(key: str, path: str = path) -> float:
            return 1000 * statistics.median(r[key] for r in rows[path])

        paired = statistics.median(r["total"] / b["total"] for r, b in zip(rows[path], rows["bare"], strict=True))
        print(
            f"{path:<10} {med('total'):>7.0f} {paired:>6.2f}x {med('to_mcp'):>7.0f} {med('window'):>7.1f} "
            f"{med('to_model'):>9.0f} {med('to_exit'):>8.0f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
