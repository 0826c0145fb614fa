"""Host + runner overhead of one external-harness turn, against the bare CLI, in the same run.

    .venv/bin/python benchmarks/bench_harness.py [--runs 7] [--harness claude-code codex] [--paths bare agenthost ...]
                                                 [--turn first|next]

For each harness it times a trivial turn ("ping" -> one model request -> "pong") against a fake model API on
loopback, several ways. `--turn first` (the default): each in a fresh conversation (a new harness session, like a
first message). `--turn next` (Claude Code only): the conversation's second message, after an untimed first one;
the bare CLI resumes the session (`--resume`), agenthost answers in the process it kept (warm.py), and `cold`
is agenthost with `keep_warm_seconds: 0` (a new process resuming the session, as before kept processes).

* bare       the CLI alone: the same binary, flags and fake API, started by this script with no agenthost around it,
             with the variables the runner passes through from its environment (PATH, locale, CA bundles, proxies)
             For Codex that is the native binary the runner execs (with the two variables npm's node launcher
             would set), not the launcher: until 2026-11-27 bare ran `bin/codex.js`, a node start-up the runner
             never pays, which is where the 0.67-0.84x of earlier figures came from
* bare-launcher (Codex, only with --paths) the bare CLI through npm's node launcher, the baseline until 2026-11-27
* bare-sdk   (Claude Code) the bare CLI with the bridge's tools on its own stdin and stdout, answered by this script
             (an MCP server of type `sdk`, mcp_control.py, no host behind it): what the CLI spends on having the
             bridge the way agenthost gives it by default; `agenthost` against `bare-sdk` is agenthost's own cost
* bare-mcp   the bare CLI with one MCP server on loopback that answers in under a millisecond: the runner's own
             HTTP endpoint listing the bridge's tools, with no host behind it. What the CLI itself spends on having
             a networked MCP server (connecting, listing, building tool definitions), however fast the server
* bare-noenv the same with PATH alone (the baseline of figures before 2026-11-26: it skips work the CA variables
             cost the CLI, so it made every other path look slower)
* agenthost  a message sent through the real host (HostHarness): event log, run, grant, gRPC to the runner,
             projection, the sandboxed harness, the host MCP bridge (the default transport: for Claude Code the
             CLI's own pipes, for Codex the runner's loopback HTTP endpoint), persistence of events and state
* http       (Claude Code) the same with `mcp_transport: http` (the runner's loopback endpoint, the default until
             2026-11-27)
* plugin     the same turn with the runner as `agenthost serve` runs it: the built-in runner plugin in its own
             sandboxed process, its key from the host's key store (in `agenthost`, the runner shares this script's
             process and event loop with the host and the fake API)
* stdio      the same with `mcp_transport: stdio` (the bridge as a process the harness starts every turn)
* no-bridge  the same with `mcp_bridge: false`, to separate the bridge's cost from the rest
* bare-mcp-held (only with --paths) bare-mcp with the server marked `alwaysLoad` in mcp.json, as the runner projected
             the bridge until 2026-11-27: the CLI holds its start-up until the server has connected, where the
             bridge's per-tool flag (bare-mcp) lets it connect alongside and wait only before its first request
* search-off (only with --paths) the default path with `ENABLE_TOOL_SEARCH=false`, as the runner set it until
             2026-11-26: every built-in tool inlined into the request instead of the bridge's tools alone
* cold       the default path with no process waiting: for Claude Code `keep_warm_seconds: 0` (no kept process and
             no spare, so every message starts a CLI, as before kept processes, 2026-11-27), for Codex
             `spare_seconds: 0` (as before Codex spares, 2026-11-27). With `--turn first`, `agenthost` answers in
             the spare started after the previous round's message (warm.py), and `cold` is a bot's first message

Between two timed turns the script waits until every process under it is idle (a spare starting after a message, a
bare CLI exiting after its reply line), so no path is timed against another's start-up or wind-down.

Every path is timed to the line that carries the reply (Claude Code's `result`, Codex's `turn.completed`), which is
when the user has it; a process's exit after that is not waited for. It prints medians, the ratio to bare, and a
bootstrap 95 % interval of each paired ratio. Needs the pinned CLIs (scripts/install_harness_clis.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agenthost.protos import host_pb2 as hpb  # noqa: E402
from agenthost.runners.external_harness.claude_code import stdin_message  # noqa: E402
from agenthost.runners.external_harness.mcp_bridge import TOOL_NAMES  # noqa: E402
from agenthost.runners.external_harness.mcp_control import McpControl, is_control  # noqa: E402
from agenthost.runners.external_harness.mcp_http import TOKEN_ENV, McpHttpEndpoint  # noqa: E402
from agenthost.runners.external_harness.process import build_env  # noqa: E402
from agenthost.runners.external_harness.projection import (  # noqa: E402
    MCP_SERVER_NAME,
    HttpBridgeLaunch,
    SdkBridgeLaunch,
    codex_mcp_overrides,
    write_claude_mcp_config,
)
from agenthost.runners.external_harness.runner import ClaudeCodeRunner, CodexRunner  # noqa: E402
from agenthost.runners.external_harness.sandboxing import resolve_codex  # noqa: E402
from agenthost.runners.external_harness.workspace import Workspace  # noqa: E402
from agenthost.runners.sdk.testing import HostHarness  # noqa: E402
from tests.external_harness.fake_apis import FakeAnthropic, FakeOpenAI, Request  # noqa: E402

BIN = REPO / ".tools" / "npm" / "node_modules" / ".bin"


def pong(_: Request) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "pong"}]


def bare_command(
    harness: str,
    binary: str,
    port: int,
    root: Path,
    *,
    inherit: bool = True,
    mcp: McpHttpEndpoint | None = None,
    held: bool = False,
    sdk: bool = False,
    session: list[str] = (),  # type: ignore[assignment]
    launcher: bool = False,
) -> tuple[list[str], dict[str, str]]:
    # One home and config dir for every bare run, as agenthost keeps one per bot: a fresh one each time would
    # charge the bare CLI its first-run set-up (config files, Codex's state databases) and flatter agenthost.
    for sub in ("home", "config", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # The same variables the runner lets through from its own environment (PATH, locale, CA bundles, proxies), as a
    # user's shell would pass them: some cost the CLI start-up time (NODE_EXTRA_CA_CERTS makes Claude Code parse a
    # second CA bundle, ~5 % of a trivial turn), so a bare run without them would be measuring another machine.
    env = build_env(inherited=os.environ if inherit else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    env |= {"HOME": str(root / "home"), "TMPDIR": str(root / "tmp")}
    if harness == "claude-code":
        env |= {
            "CLAUDE_CONFIG_DIR": str(root / "config"),
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
            "ANTHROPIC_API_KEY": "sk-bench",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
        }
        argv = [binary, "-p", "--output-format", "stream-json", "--verbose", "--strict-mcp-config", *session]
        if mcp is not None:
            env[TOKEN_ENV] = mcp.token
            workspace = Workspace(working_dir=root / "mcp-config", harness_dir=root / "mcp-config", bot_dir=root)
            workspace.working_dir.mkdir(parents=True, exist_ok=True)
            config = write_claude_mcp_config(workspace, HttpBridgeLaunch(url=mcp.url))
            if held:
                doc = json.loads(config.read_text())
                doc["mcpServers"][MCP_SERVER_NAME]["alwaysLoad"] = True
                config.write_text(json.dumps(doc))
            argv += ["--mcp-config", str(config), "--allowedTools", f"mcp__{MCP_SERVER_NAME}"]
        elif sdk:
            workspace = Workspace(working_dir=root / "sdk-config", harness_dir=root / "sdk-config", bot_dir=root)
            workspace.working_dir.mkdir(parents=True, exist_ok=True)
            config = write_claude_mcp_config(workspace, SdkBridgeLaunch())
            argv += ["--input-format", "stream-json", "--mcp-config", str(config)]
            argv += ["--allowedTools", f"mcp__{MCP_SERVER_NAME}"]
        return argv, env
    env |= {"CODEX_HOME": str(root / "config"), "OPENAI_API_KEY": "sk-bench"}
    from agenthost.runners.external_harness.codex import BASE_OVERRIDES, toml_value

    if not launcher:
        # The native binary the runner execs, with what npm's launcher would have set: the same program both ways.
        binary, launcher_env, _ = resolve_codex(binary, env["PATH"])
        env |= launcher_env

    overrides = dict(BASE_OVERRIDES) | {
        "sandbox_mode": "read-only",
        "model_provider": "bench",
        "model_providers.bench.name": "bench",
        "model_providers.bench.base_url": f"http://127.0.0.1:{port}/v1",
        "model_providers.bench.wire_api": "responses",
        "model_providers.bench.env_key": "OPENAI_API_KEY",
    }
    argv = [binary, "exec", "--json", "--skip-git-repo-check", "-m", "gpt-fake"]
    for key, value in overrides.items():
        argv += ["-c", f"{key}={toml_value(value)}"]
    if mcp is not None:
        env[TOKEN_ENV] = mcp.token
        for override in codex_mcp_overrides(HttpBridgeLaunch(url=mcp.url)):
            argv += ["-c", override]
    return argv + ["-"], env


async def time_bare(
    harness: str,
    binary: str,
    port: int,
    root: Path,
    work: Path,
    *,
    inherit: bool = True,
    mcp: McpHttpEndpoint | None = None,
    held: bool = False,
    sdk: bool = False,
    session: list[str] = (),  # type: ignore[assignment]
    launcher: bool = False,
) -> float:
    argv, env = bare_command(
        harness, binary, port, root, inherit=inherit, mcp=mcp, held=held, sdk=sdk, session=session, launcher=launcher
    )
    # A fresh working directory: a new session, like a conversation's first message (or its second, resumed here).
    work.mkdir(parents=True, exist_ok=bool(session))
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=16 * 1024 * 1024,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin
    control: McpControl | None = None
    if sdk:

        async def send(data: bytes) -> None:
            stdin.write(data)
            await stdin.drain()

        control = McpControl(send, tools=TOOL_NAMES)
        await control.attach(None, unavailable_reason="benchmark control: no host")
        await send(stdin_message("ping"))
    else:
        stdin.write(b"ping")
        stdin.close()
    out, elapsed = [], 0.0
    while line := await proc.stdout.readline():
        raw = json.loads(line) if line.startswith(b"{") else {}
        if control is not None and is_control(raw):
            control.receive(raw)
            continue
        out.append(line)
        if raw.get("type") == REPLY_LINE[harness]:
            elapsed = time.perf_counter() - started
            break
    if control is not None:
        stdin.close()
        await control.close()
    rest = await proc.stdout.read()
    await proc.wait()
    if proc.returncode != 0 or not elapsed or b"pong" not in b"".join(out):
        raise RuntimeError(f"bare {harness} failed ({proc.returncode}): {b''.join(out)[-500:]!r} {rest[-300:]!r}")
    return elapsed


# The line that carries the reply: where a user has the answer, and where the clock stops.
REPLY_LINE = {"claude-code": "result", "codex": "turn.completed"}


PATHS = ("bare", "bare-sdk", "bare-mcp", "bare-noenv", "agenthost", "http", "plugin", "stdio", "no-bridge", "cold")
CLAUDE_ONLY = ("bare-sdk", "http")
CODEX_ONLY = ("bare-launcher",)


def _cpu_ticks_under(root: int) -> int:
    """CPU time (clock ticks) of process `root` and every process below it, sandboxed ones included."""
    parents, ticks = {}, {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
    total = 0
    for pid, used in ticks.items():
        walk = pid
        while walk not in (root, 0, 1) and walk in parents:
            walk = parents[walk]
        if walk == root:
            total += used
    return total


async def settle(window: float = 0.3, limit: float = 15.0) -> bool:
    """Waits until the processes under this one use no more than two clock ticks in `window`; False if `limit`
    passed first (the round is then timed anyway, and the count of such waits is printed)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    before = _cpu_ticks_under(os.getpid())
    while loop.time() < end:
        await asyncio.sleep(window)
        now = _cpu_ticks_under(os.getpid())
        if now - before <= 2:
            return True
        before = now
    return False


async def bench(
    harness: str, runs: int, paths: tuple[str, ...] = PATHS, *, turn: str = "first"
) -> dict[str, list[float]]:
    binary = str(BIN / ("claude" if harness == "claude-code" else "codex"))
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"{binary} missing: run scripts/install_harness_clis.sh")
    # The real file, as a binding names it (the host refuses a command that passes through a symlink, and npm's
    # .bin entries are symlinks).
    binary = os.path.realpath(binary)
    fake_cls = FakeAnthropic if harness == "claude-code" else FakeOpenAI
    runner_cls = ClaudeCodeRunner if harness == "claude-code" else CodexRunner
    key_env = "ANTHROPIC_API_KEY" if harness == "claude-code" else "OPENAI_API_KEY"
    os.environ[key_env] = "sk-bench"
    # The built-in runner's sandbox must see the pinned CLIs (`plugin`).
    os.environ["AGENTHOST_SANDBOX_RO"] = ":".join(
        filter(None, [os.environ.get("AGENTHOST_SANDBOX_RO"), str(BIN.parent)])
    )
    times: dict[str, list[float]] = {name: [] for name in paths}
    # The fake's guards against a spinning client, sized to this benchmark: one request per turn, a few s per turn.
    turns = (runs + 1) * len(paths) * (2 if turn == "next" else 1)
    guards = {"max_requests": 2 * turns, "max_seconds": 10.0 * turns}
    with fake_cls(pong, **guards) as fake, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        base: dict[str, Any] = {"command": binary, "interrupt_grace_seconds": 1.0}
        if harness == "claude-code":
            base |= {"base_url": f"http://127.0.0.1:{fake.port}"}
        else:
            base |= {"base_url": f"http://127.0.0.1:{fake.port}/v1", "model": "gpt-fake"}
        hosts = {}
        # Settings of one harness: no process waiting (`cold`), the http bridge (Claude Code only).
        own_settings: dict[str, dict[str, Any]] = {"cold": {"keep_warm_seconds": 0}, "http": {"mcp_transport": "http"}}
        if harness != "claude-code":
            own_settings = {"cold": {"spare_seconds": 0}, "http": {}}
        async with (
            # Listing works with no host behind it; a tool call would be answered "unavailable" (none is made).
            McpHttpEndpoint(None, unavailable_reason="benchmark control: no host") as mcp,
            HostHarness(Path(tmp) / "with", runners=[runner_cls], config=base) as with_bridge,
            HostHarness(Path(tmp) / "stdio", runners=[runner_cls], config=base | {"mcp_transport": "stdio"}) as stdio,
            HostHarness(Path(tmp) / "without", runners=[runner_cls], config=base | {"mcp_bridge": False}) as without,
            HostHarness(
                Path(tmp) / "search-off", runners=[runner_cls], config=base | {"env": {"ENABLE_TOOL_SEARCH": "false"}}
            ) as search_off,
            HostHarness(Path(tmp) / "cold", runners=[runner_cls], config=base | own_settings["cold"]) as cold,
            HostHarness(Path(tmp) / "http", runners=[runner_cls], config=base | own_settings["http"]) as http,
            HostHarness(Path(tmp) / "plugin", builtin=True) as plugin,
        ):
            await plugin.client.call("SetKey", hpb.SetKeyRequest(name=key_env, value="sk-bench"))
            await plugin.bind(f"agenthost/{harness}", base, keys=[key_env])
            hosts = {
                "agenthost": with_bridge,
                "plugin": plugin,
                "stdio": stdio,
                "no-bridge": without,
                "search-off": search_off,
                "cold": cold,
                "http": http,
            }

            async def timed(name: str, i: int) -> float:
                if name.startswith("bare"):
                    bare = {
                        "inherit": name != "bare-noenv",
                        "mcp": mcp if name.startswith("bare-mcp") else None,
                        "held": name == "bare-mcp-held",
                        "sdk": name == "bare-sdk",
                        "launcher": name == "bare-launcher",
                    }
                    root, work = Path(tmp) / name, Path(tmp) / f"{name}-work-{i}"
                    session: list[str] = []
                    if turn == "next":
                        sid = str(uuid.uuid4())
                        await time_bare(harness, binary, fake.port, root, work, session=["--session-id", sid], **bare)
                        session = ["--resume", sid]
                    seen = len(fake.requests)
                    elapsed = await time_bare(harness, binary, fake.port, root, work, session=session, **bare)
                    offered = any("agenthost" in t for r in fake.requests[seen:] for t in r.tools)
                    if offered != name.startswith(("bare-mcp", "bare-sdk")):
                        raise RuntimeError(f"{name} {harness}: MCP tools offered={offered}")
                    return elapsed
                if turn == "next":
                    first = await hosts[name].send("ping", conversation_id=f"bench-{i}")
                    if first.run.status != "completed":
                        raise RuntimeError(f"{name} {harness} first message: {first.run.error_message}")
                seen = len(fake.requests)
                started = time.perf_counter()
                result = await hosts[name].send("ping", conversation_id=f"bench-{i}")
                elapsed = time.perf_counter() - started
                if result.run.status != "completed" or "pong" not in result.text:
                    raise RuntimeError(f"{name} {harness}: {result.run.status} {result.run.error_message}")
                # A bridge that failed to connect would look fast: its tools must have reached the model.
                offered = any("agenthost" in t for r in fake.requests[seen:] for t in r.tools)
                if offered != (name != "no-bridge"):
                    raise RuntimeError(f"{name} {harness}: bridge tools offered={offered}")
                return elapsed

            # One warm-up of each (page cache, first-run files), then rounds of one turn per path, the order rotating
            # from round to round, so drift and a neighbour's load spike hit all paths alike.
            paths = list(times)
            unsettled = 0
            for i in range(runs + 1):
                order = paths[i % len(paths) :] + paths[: i % len(paths)]
                row = {}
                for name in order:
                    unsettled += not await settle()
                    row[name] = await timed(name, i)
                if i:
                    for name, value in row.items():
                        times[name].append(value)
            if unsettled:
                total = (runs + 1) * len(paths)
                print(f"{harness}: {unsettled} of {total} turns were timed before the processes settled")
    return times


def paired_interval(values: list[float], baseline: list[float], *, level: float = 0.95) -> tuple[float, float]:
    """A bootstrap confidence interval of the paired median (rounds resampled with replacement, fixed seed): on a
    shared 2-core machine a run's median moves by about 10 %, so a target near 1.1x needs its interval, not a point."""
    ratios = [v / b for v, b in zip(values, baseline, strict=True)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    tail = (1 - level) / 2
    return medians[int(tail * len(medians))], medians[int((1 - tail) * len(medians)) - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--harness", nargs="+", default=["claude-code", "codex"], choices=["claude-code", "codex"])
    parser.add_argument(
        "--paths", nargs="+", default=list(PATHS), choices=[*PATHS, "bare-mcp-held", "search-off", *CODEX_ONLY]
    )
    parser.add_argument("--turn", choices=["first", "next"], default="first")
    args = parser.parse_args()
    if args.turn == "next" and args.harness != ["claude-code"]:
        parser.error("--turn next measures Claude Code's kept process: pass --harness claude-code")
    which = "fresh session each" if args.turn == "first" else "the second message of a fresh session each"
    print(f"trivial turn, median of {args.runs} ({which}), fake API on loopback")
    print("'paired' is the median of each round's own ratio (a path against the bare run of the same round),")
    print("'95% CI' its bootstrap confidence interval over the rounds")
    print(
        f"{'harness':<12} {'path':<10} {'median s':>9} {'min s':>7} {'max s':>7} {'vs bare':>8} {'paired':>7} "
        f"{'95% CI':>13} {'overhead s':>11}"
    )
    for harness in args.harness:
        paths = tuple(args.paths) if "bare" in args.paths else ("bare", *args.paths)  # ratios need the baseline
        if harness != "claude-code":
            paths = tuple(p for p in paths if p not in CLAUDE_ONLY)
        else:
            paths = tuple(p for p in paths if p not in CODEX_ONLY)
        times = await bench(harness, args.runs, paths, turn=args.turn)
        bare = statistics.median(times["bare"])
        for name, values in times.items():
            med = statistics.median(values)
            paired = statistics.median(v / b for v, b in zip(values, times["bare"], strict=True))
            low, high = paired_interval(values, times["bare"])
            print(
                f"{harness:<12} {name:<10} {med:>9.3f} {min(values):>7.3f} {max(values):>7.3f} "
                f"{med / bare:>7.2f}x {paired:>6.2f}x {low:>5.2f}-{high:.2f}x {med - bare:>+11.3f}"
            )
        # agenthost against the bare CLI given the bridge the same way: what agenthost itself adds.
        control = "bare-sdk" if harness == "claude-code" else "bare-mcp"
        if control in times and "agenthost" in times:
            own = statistics.median(v / b for v, b in zip(times["agenthost"], times[control], strict=True))
            low, high = paired_interval(times["agenthost"], times[control])
            print(
                f"{harness:<12} agenthost / {control}, paired: {own:.2f}x ({low:.2f}-{high:.2f}x)"
                " (agenthost's own cost, the CLI's own MCP client set aside)"
            )


if __name__ == "__main__":
    asyncio.run(main())
