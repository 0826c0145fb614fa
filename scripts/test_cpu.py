"""CPU-seconds of test files, each run by pytest alone inside a fresh cpuacct cgroup.

    sudo .venv/bin/python scripts/test_cpu.py tests/robustness/test_load.py tests/test_cli.py [-- -k soak]

Wall time on the shared machine says little (other agents' tests take the cores), and the process's rusage misses
the sandboxed plugin processes (bwrap re-parents them out of the waited-for tree). The cgroup counts every process
the run starts, wherever the product moves it in the memory/pids hierarchies (it never touches cpuacct). Needs root
and cgroup v1's cpuacct hierarchy (the unified hierarchy's cpu.stat is read if that is what there is).
"""

from __future__ import annotations

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


def measure(argv: list[str]) -> tuple[float, float, int]:
    """(cpu s, wall s, exit status) of `argv` and everything it starts."""
    root = V1 if (V1 / "cpuacct.usage").exists() else V2
    group = root / f"test-cpu-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        t0 = time.monotonic()
        # the child joins the group before it execs, so nothing it starts escapes the count
        proc = subprocess.Popen(argv, preexec_fn=lambda: (group / "cgroup.procs").write_text("0"))  # noqa: PLW1509
        status = proc.wait()
        wall = time.monotonic() - t0
        return _usage_s(group), wall, status
    finally:
        for _ in range(50):  # processes a test leaked still hold the group; its count is read already
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main(args: list[str]) -> int:
    extra = args[args.index("--") + 1 :] if "--" in args else []
    files = args[: args.index("--")] if "--" in args else args
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
