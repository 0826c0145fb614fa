"""CPU-seconds of test files, each run by pytest alone inside a fresh cpuacct cgroup.

    sudo .venv/bin/python scripts/test_cpu.py tests/robustness/test_load.py tests/test_cli.py [-- -k soak]
    sudo .venv/bin/python scripts/test_cpu.py --per-test OUT_DIR [-- -n 4 --dist worksteal tests/...]

The first form runs each file alone. `--per-test` runs one pytest (xdist allowed: pass its options after `--`)
in a group, each worker in a group of its own below it (scripts/pytest_cpu_per_test.py), and prints the tests and
files that wait longest (wall minus CPU) and cost most CPU, from the JSON lines it leaves in OUT_DIR.

Wall time on the shared machine says little (other agents' tests take the cores), and the process's rusage misses
the sandboxed plugin processes (bwrap re-parents them out of the waited-for tree). The cgroup counts every process
the run starts, wherever the product moves it in the memory/pids hierarchies (it never touches cpuacct). Needs root
and cgroup v1's cpuacct hierarchy (the unified hierarchy's cpu.stat is read if that is what there is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else Path("/sys/fs/cgroup")


def _usage_s(group: Path) -> float:
    if (group / "cpuacct.usage").exists():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def measure(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(cpu s, wall s, exit status) of `argv` and everything it starts. `env` is told the group's path as
    TEST_CPU_GROUP (the per-test plugin makes its workers' groups below it)."""
    root = V1 if (V1 / "cpuacct.usage").exists() else V2
    group = root / f"test-cpu-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        t0 = time.monotonic()
        # the child joins the group before it execs, so nothing it starts escapes the count
        proc = subprocess.Popen(
            argv,
            preexec_fn=lambda: (group / "cgroup.procs").write_text("0"),  # noqa: PLW1509
            env=None if env is None else {**env, "TEST_CPU_GROUP": str(group)},
        )
        status = proc.wait()
        wall = time.monotonic() - t0
        return _usage_s(group), wall, status
    finally:
        for _ in range(50):  # processes a test leaked still hold the group; its count is read already
            try:
                for sub in group.glob("worker-*"):
                    sub.rmdir()
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def per_test(out: Path, extra: list[str], top: int = 25) -> int:
    """One pytest run with each test's CPU-s and wall (see the module's docstring); prints what waits and what
    costs most."""
    env = {**os.environ, "TEST_CPU_PER_TEST": str(out)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_cpu_per_test", "-p", "no:randomly", *extra]
    cpu, wall, status = measure(argv, env)
    rows = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    tests_cpu = sum(r["cpu_s"] for r in rows)
    print(f"CPU {cpu:8.1f} s  wall {wall:7.1f} s  rc {status}; {len(rows)} tests, their CPU {tests_cpu:.1f} s")
    files: dict[str, list[float]] = {}
    for r in rows:
        f = files.setdefault(r["test"].split("::")[0], [0.0, 0.0, 0])
        f[0], f[1], f[2] = f[0] + r["cpu_s"], f[1] + r["wall_s"], f[2] + 1
    print("\n   CPU s  wall s  wait s  test (longest waits)")
    for r in sorted(rows, key=lambda r: r["cpu_s"] - r["wall_s"])[:top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:7.1f} {r['wall_s'] - r['cpu_s']:7.1f}  {r['test']}")
    print("\n   CPU s  wall s  tests  file (most CPU)")
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:8.1f} {w:7.1f} {n:6d}  {name}")
    return status


def main(args: list[str]) -> int:
    extra = args[args.index("--") + 1 :] if "--" in args else []
    files = args[: args.index("--")] if "--" in args else args
    if files[:1] == ["--per-test"]:
        return per_test(Path(files[1]), extra)
    total = 0.0
    worst = 0
    for f in files:
        cpu, wall, status = measure(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:randomly", f, *extra]
        )
        total += cpu
        worst = worst or status
        print(f"CPU {cpu:8.1f} s  wall {wall:7.1f} s  rc {status}  {f} {' '.join(extra)}", flush=True)
    if len(files) > 1:
        print(f"CPU {total:8.1f} s  total")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
