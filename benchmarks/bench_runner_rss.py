"""Memory of a runner process: idle, after its first call and after its first real run, next to the floors.

    python benchmarks/bench_runner_rss.py [--rounds 3] [--no-floors]

For each of `claude-code` and `local-agent`, interleaved, --rounds times: a fresh host on a scratch data dir with
the built-in plugin, exactly as `agenthost serve` starts it (sandboxed when bubblewrap works here); the runner's
python process read from /proc (VmRSS, the figure the targets are set in: 40 MiB idle, 45 MiB after the first run
(issue 26); RssAnon, memory the process alone holds; Pss, its fair share of pages shared with other processes)
idle, after its first call (ValidateConfig, which loads the runner's entry point: the figure this benchmark used to
report as "loaded") and after its first run through the host: "ping" -> one model request -> "pong", against a
scripted OpenAI-compatible API (local agent) or the real Claude Code CLI against a fake Anthropic API, both on
loopback. Medians and ranges. Also the idle process with AGENTHOST_RUNNER_EAGER=1 (the classes imported at start),
and, for scale, interpreters importing only the runner protocol's floor with and without ssl, and what each import
adds, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET_MIB = 40.0
LOADED_TARGET_MIB = 45.0  # after the first call (issue 26)

_FLOOR = (
    "import asyncio, grpc, grpc.aio\nfrom grpc_health.v1 import health, health_pb2, health_pb2_grpc\n"
    "from agenthost.protos import common_pb2, runner_pb2, runner_pb2_grpc, run_api_pb2_grpc"
)
FLOOR_IMPORTS = {
    "python -c pass": "pass",
    "import asyncio, grpc": "import asyncio, grpc",
    "runner protocol floor (grpc, health, stubs)": _FLOOR,
    "runner protocol floor, ssl deferred": "from agenthost.runners.sdk import lean\nlean.defer_ssl()\n" + _FLOOR,
}

# The order in which a runner process that loads the built-in plugin's classes meets them.
CHAIN = [
    "asyncio",
    "grpc",
    "grpc_health.v1.health",
    "agenthost.protos.runner_pb2_grpc",
    "agenthost.protos.run_api_pb2_grpc",
    "pydantic",
    "agenthost.plugins.manifest",
    "pluggy",
    "agenthost.runners.sdk",
    "agenthost.runners.sdk.server",
    "jsonschema",
    "httpx",
    "agenthost.runners.local_agent.runner",
    "agenthost.runners.external_harness.runner",
]


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and Pss of a process, in MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) / 1024
    except OSError:
        out["Pss"] = float("nan")
    return out


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))  # field 4: parent pid
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def runner_python(root: int) -> int:
    """The runner's interpreter below the process the supervisor started (bwrap and its init come first when
    sandboxed, and bwrap starts a new session, so the process group does not find it)."""
    best, best_rss = root, -1.0
    for pid in _descendants(root):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agenthost.runners.sdk" in cmdline and b"serve" in cmdline and not cmdline[0].endswith(b"bwrap"):
            rss = memory(pid)["VmRSS"]
            if rss > best_rss:
                best, best_rss = pid, rss
    return best


BIN = Path(__file__).resolve().parents[1] / ".tools" / "npm" / "node_modules" / ".bin"
STAGES = ("idle", "call", "run")


async def measure_runner(eager: bool, runner: str) -> tuple[dict[str, dict[str, float]], str]:
    """The built-in plugin's runner process, one fresh host: idle after start; then (in a fresh process when the
    binding restarts it to show the CLI's path) after its first call
    (the binding's ValidateConfig to `runner`, which loads the runner's entry point: the figure this benchmark
    reported before); and after its first real run through the host ("ping" -> one model request -> "pong", against
    a scripted model API on loopback: the local agent's OpenAI-compatible fake, or the real Claude Code CLI against
    a fake Anthropic API). Also the host's sandbox status."""
    from agenthost.protos import host_pb2 as hpb
    from agenthost.protos import runner_pb2
    from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text
    from agenthost.runners.sdk.testing import HostHarness

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.external_harness.fake_apis import FakeAnthropic

    # The supervisor builds the plugin's environment from ours, AGENTHOST_* included.
    os.environ.pop("AGENTHOST_RUNNER_EAGER", None)
    if eager:
        os.environ["AGENTHOST_RUNNER_EAGER"] = "1"
    figures: dict[str, dict[str, float]] = {}
    try:
        with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="agenthost-rss-") as scratch:
            async with FakeProviderServer() as provider, HostHarness(Path(scratch), builtin=True) as h:
                # Before the process is measured: a new key, or a binding naming a host path (the CLI) the sandbox
                # does not show yet, restarts the plugin's process.
                await h.client.call("SetKey", hpb.SetKeyRequest(name="ANTHROPIC_API_KEY", value="sk-bench"))
                pp = await h.host.supervisor.wait_ready("agenthost", 60)
                await asyncio.sleep(1.0)  # idle: let start-up garbage settle as it would between runs
                assert pp.proc is not None
                figures["idle"] = memory(runner_python(pp.proc.pid))
                if runner == "local-agent":
                    provider.default = openai_text("pong")
                    config: dict[str, object] = {
                        "model": "vllm/m",
                        "base_url": provider.url + "/v1",
                        "context_window": 32_000,
                    }
                    await h.bind("agenthost/local-agent", config, priority=10)
                else:
                    fake = stack.enter_context(FakeAnthropic(lambda _: [{"type": "text", "text": "pong"}]))
                    config = {"command": os.path.realpath(BIN / "claude"), "base_url": f"http://127.0.0.1:{fake.port}"}
                    await h.bind("agenthost/claude-code", config, keys=["ANTHROPIC_API_KEY"], priority=10)
                pp = await h.host.supervisor.wait_ready("agenthost", 60)
                assert pp.stub is not None and pp.proc is not None
                pid = runner_python(pp.proc.pid)
                await pp.stub.ValidateConfig(
                    runner_pb2.ValidateConfigRequest(runner_name=runner, config_json=json.dumps(config)), timeout=60
                )
                await asyncio.sleep(1.0)
                figures["call"] = memory(pid)
                result = await h.send("ping", timeout=120)
                if result.run.status != "completed":
                    raise RuntimeError(f"the first {runner} run ended {result.run.status}: {result.run.error_message}")
                await asyncio.sleep(1.0)
                figures["run"] = memory(pid)
                assert runner_python(pp.proc.pid) == pid
                return figures, h.host.sandbox_status
    finally:
        os.environ.pop("AGENTHOST_RUNNER_EAGER", None)


def median_figures(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        stage: {key: statistics.median(s[stage][key] for s in samples) for key in samples[0][stage]} for stage in STAGES
    }


def measure_code(code: str) -> dict[str, float]:
    probe = (
        f"{code}\nfrom pathlib import Path\n"
        "import json, os\n"
        "print(json.dumps(os.getpid()))\n"
        "import sys; sys.stdout.flush(); sys.stdin.readline()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    pid = int(proc.stdout.readline())
    figures = memory(pid)
    proc.stdin.close()
    proc.wait(30)
    return figures


def chain() -> list[tuple[str, float]]:
    code = (
        "import importlib, sys\n"
        "def rss():\n"
        "    return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) / 1024\n"
        "prev = rss()\n"
        f"for name in {CHAIN!r}:\n"
        "    importlib.import_module(name)\n"
        "    now = rss(); print(f'{name}\\t{now - prev:.1f}'); prev = now\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return [(line.split("\t")[0], float(line.split("\t")[1])) for line in out.stdout.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3, help="fresh hosts per runner (medians are reported)")
    parser.add_argument("--no-floors", action="store_true", help="only the runner processes")
    args = parser.parse_args()
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-bench")
    # The built-in runner's sandbox must see the pinned CLI.
    os.environ["AGENTHOST_SANDBOX_RO"] = ":".join(
        filter(None, [os.environ.get("AGENTHOST_SANDBOX_RO"), str(BIN.parent.resolve())])
    )
    env_note = f"{sys.executable} ({sys.version.split()[0]})"
    samples: dict[str, list[dict[str, dict[str, float]]]] = {"claude-code": [], "local-agent": []}
    sandbox = ""
    for _ in range(args.rounds):  # interleaved: the machine's load moves both alike
        for runner, got in samples.items():
            figures, sandbox = asyncio.run(measure_runner(eager=False, runner=runner))
            got.append(figures)
    eager, _ = asyncio.run(measure_runner(eager=True, runner="local-agent"))
    where = f"built-in plugin; sandbox {sandbox.split(':')[0]}"
    print(f"runner memory, MiB — {env_note}; medians of {args.rounds} fresh hosts per runner")
    print(f"{'':62} {'VmRSS':>7} {'RssAnon':>8} {'Pss':>7}   VmRSS range")
    if not args.no_floors:
        for name, code in FLOOR_IMPORTS.items():
            m = measure_code(code)
            print(f"{name:62} {m['VmRSS']:7.1f} {m['RssAnon']:8.1f} {m['Pss']:7.1f}")
    print(f"{'eager load (AGENTHOST_RUNNER_EAGER=1), idle (' + where + ')':62} {eager['idle']['VmRSS']:7.1f}")
    medians = {runner: median_figures(got) for runner, got in samples.items()}
    labels = {"idle": "idle, lazy load", "call": "after its first call (ValidateConfig)", "run": "after its first run"}
    for runner, got in samples.items():
        for stage in STAGES:
            m = medians[runner][stage]
            low, high = min(s[stage]["VmRSS"] for s in got), max(s[stage]["VmRSS"] for s in got)
            name = f"{runner}: {labels[stage]}"
            print(f"{name:62} {m['VmRSS']:7.1f} {m['RssAnon']:8.1f} {m['Pss']:7.1f}   {low:.1f}–{high:.1f}")
    if not args.no_floors:
        print("\nwhat each import adds to VmRSS, in the order a runner loading the built-in plugin meets them:")
        for name, delta in chain():
            print(f"  {name:50} +{delta:5.1f}")
    idle = medians["claude-code"]["idle"]["VmRSS"]
    verdict = "meets" if idle <= TARGET_MIB else "misses"
    print(f"\nidle runner VmRSS {idle:.1f} MiB: {verdict} the {TARGET_MIB:.0f} MiB target")
    for runner in samples:
        call, run = medians[runner]["call"]["VmRSS"], medians[runner]["run"]["VmRSS"]
        verdict = "meets" if run <= LOADED_TARGET_MIB else "misses"
        print(
            f"{runner}: VmRSS {call:.1f} MiB after its first call, {run:.1f} MiB after its first run:"
            f" {verdict} the {LOADED_TARGET_MIB:.0f} MiB target"
        )


if __name__ == "__main__":
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    main()
