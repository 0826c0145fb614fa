"""Idle memory of a runner process, next to the floors it cannot go below, in one run.

    python benchmarks/bench_runner_rss.py

Starts a host on a scratch data dir with the built-in plugin (the local agent and the harness runners), exactly as
`agenthost serve` does (sandboxed when bubblewrap works here), waits until the plugin is ready, and reads the
runner's python process from /proc: VmRSS (the figure the target is set in: 40 MiB), RssAnon (memory the process
alone holds) and Pss (its fair share of pages shared with other processes, such as the host mapping the same
grpc library). It does so twice in the same run: before (AGENTHOST_RUNNER_EAGER=1: the runner classes imported in
the serving process at start, as it used to be) and after (the default: a describe child imports them, the
serving process loads them at the first call), and for each also once loaded (after one ValidateConfig, to
`claude-code`; the target is 45 MiB), and a third process loaded by a first call to `local-agent` (a call loads
only the entry point of the runner it names).
Then, for scale, the same figures for interpreters that import only `asyncio + grpc` and the runner protocol's
floor (grpc, health, the stubs) with and without `ssl`, which asyncio imports when it can and an idle runner
now defers; and where the loaded runner's memory comes from: each import, in one interpreter, in order.
"""

from __future__ import annotations

import asyncio
import os
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


async def measure_runner(eager: bool, runner: str = "") -> tuple[dict[str, float], dict[str, float], str]:
    """Idle and loaded figures of the built-in plugin's runner process, and the host's sandbox status. Loaded: after
    the first call for `runner` (ValidateConfig; by default the first runner by name, `claude-code`), which loads
    the runner's classes (only its entry point's: the harness runners or the local agent)."""
    from agenthost.host.server import Host
    from agenthost.protos import runner_pb2

    # The supervisor builds the plugin's environment from ours, AGENTHOST_* included.
    os.environ.pop("AGENTHOST_RUNNER_EAGER", None)
    if eager:
        os.environ["AGENTHOST_RUNNER_EAGER"] = "1"
    try:
        with tempfile.TemporaryDirectory(prefix="agenthost-rss-") as scratch:
            host = Host(Path(scratch) / "data")
            await host.start()
            try:
                pp = await host.supervisor.start("agenthost")
                await asyncio.sleep(1.0)  # idle: let start-up garbage settle as it would between runs
                pid = runner_python(pp.proc.pid)
                idle = memory(pid)
                assert pp.stub is not None
                await pp.stub.ValidateConfig(
                    runner_pb2.ValidateConfigRequest(runner_name=runner or sorted(pp.manifests)[0], config_json="{}"),
                    timeout=60,
                )
                await asyncio.sleep(1.0)
                assert runner_python(pp.proc.pid) == pid
                return idle, memory(pid), host.sandbox_status
            finally:
                await host.stop()
    finally:
        os.environ.pop("AGENTHOST_RUNNER_EAGER", None)


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
    env_note = f"{sys.executable} ({sys.version.split()[0]})"
    before_idle, before_loaded, sandbox = asyncio.run(measure_runner(eager=True))
    runner, after_loaded, _ = asyncio.run(measure_runner(eager=False))
    _, local_agent, _ = asyncio.run(measure_runner(eager=False, runner="local-agent"))
    rows = [(name, measure_code(code)) for name, code in FLOOR_IMPORTS.items()]
    where = f"built-in plugin; sandbox {sandbox.split(':')[0]}"
    rows += [
        (f"BEFORE idle runner, eager load ({where})", before_idle),
        ("BEFORE same process after its first call", before_loaded),
        (f"AFTER idle runner, lazy load ({where})", runner),
        ("AFTER same process after its first call (claude-code: loaded)", after_loaded),
        ("AFTER a fresh one after its first call to local-agent", local_agent),
    ]
    print(f"runner idle memory, MiB — {env_note}")
    print(f"{'':62} {'VmRSS':>7} {'RssAnon':>8} {'Pss':>7}")
    for name, m in rows:
        print(f"{name:62} {m['VmRSS']:7.1f} {m['RssAnon']:8.1f} {m['Pss']:7.1f}")
    print("\nwhat each import adds to VmRSS, in the order a runner loading the built-in plugin meets them:")
    for name, delta in chain():
        print(f"  {name:50} +{delta:5.1f}")
    verdict = "meets" if runner["VmRSS"] <= TARGET_MIB else "misses"
    print(
        f"\nidle runner VmRSS {before_idle['VmRSS']:.1f} MiB before, {runner['VmRSS']:.1f} MiB after: "
        f"{verdict} the {TARGET_MIB:.0f} MiB target"
    )
    for name, m in (("claude-code", after_loaded), ("local-agent", local_agent)):
        verdict = "meets" if m["VmRSS"] <= LOADED_TARGET_MIB else "misses"
        print(
            f"after the first call to {name}: VmRSS {m['VmRSS']:.1f} MiB:"
            f" {verdict} the {LOADED_TARGET_MIB:.0f} MiB target"
        )


if __name__ == "__main__":
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    main()
