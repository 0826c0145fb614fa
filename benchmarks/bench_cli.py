"""CLI start-up benchmark: what a user waits for before anything happens, next to a bare interpreter, in one run.

    python benchmarks/bench_cli.py [--repeats 15]

Measures wall time of whole processes, as a user sees them: `python -c pass` (the floor no CLI can beat),
`agenthost --help`, `agenthost --version`, and the part of `agenthost send` before the host is involved: a data
dir whose host.json names a socket nobody serves, so the process parses, imports the client, reads the token,
makes its first RPC and exits on UNAVAILABLE at once. Target: --help within 80 ms. Also checks that --help and
--version never import grpc (the reason they are cheap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_HELP_MS = 80.0


def agenthost_argv() -> list[str]:
    """The console script next to this interpreter (what users run), else the module."""
    script = Path(sys.executable).parent / "agenthost"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agenthost.host.cli"]


def timed(argv: list[str], repeats: int, env: dict[str, str], expect: int | None = 0) -> list[float]:
    subprocess.run(argv, env=env, capture_output=True, timeout=60)  # warm the page cache
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        samples.append((time.perf_counter() - start) * 1000)
        if expect is not None and proc.returncode != expect:
            raise SystemExit(f"{argv} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return samples


def imports_grpc(flag: str, env: dict[str, str]) -> bool:
    code = (
        "import sys\nfrom agenthost.host.cli import main as cli\n"
        f"try:\n    cli.main([{flag!r}])\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(str(any(m == 'grpc' or m.startswith('grpc.') for m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return proc.stderr.strip().endswith("True")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cli = agenthost_argv()
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch)
        # A host that is not there: the send fails on its first RPC, which is where the host's part would begin.
        (data / "host.json").write_text(json.dumps({"admin": f"unix:{data / 'nobody.sock'}"}))
        (data / "admin.token").write_text("x" * 43)
        cases = [
            ("python -c pass (baseline)", [sys.executable, "-c", "pass"], 0),
            ("agenthost --help", [*cli, "--help"], 0),
            ("agenthost --version", [*cli, "--version"], 0),
            ("agenthost send, up to its first RPC", [*cli, "--data-dir", str(data), "send", "bot", "hi"], None),
        ]
        results = {name: timed(argv, args.repeats, env, expect) for name, argv, expect in cases}
    base = statistics.median(results[cases[0][0]])
    print(f"agenthost CLI start-up, {args.repeats} runs each, {sys.executable} ({sys.version.split()[0]})")
    print(f"{'':40} {'median':>9} {'min':>9} {'over baseline':>14}")
    for name, samples in results.items():
        med = statistics.median(samples)
        extra = "" if name.endswith("(baseline)") else f"+{med - base:.1f} ms"
        print(f"{name:40} {med:7.1f} ms {min(samples):6.1f} ms {extra:>14}")
    help_ms = statistics.median(results["agenthost --help"])
    verdict = "met" if help_ms <= TARGET_HELP_MS else "MISSED"
    print(f"--help target <= {TARGET_HELP_MS:.0f} ms: {verdict} ({help_ms:.1f} ms)")
    for flag in ("--help", "--version"):
        print(f"{flag} imports grpc: {'YES (regression)' if imports_grpc(flag, env) else 'no'}")


if __name__ == "__main__":
    main()
