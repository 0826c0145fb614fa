"""The TypeScript SDK's workspace (sdk/typescript), built for the tests that run its runners: `npm ci` when its
node_modules are missing or older than package-lock.json, `npm run build` when an output is older than a source
(the .proto files included). One build at a time across pytest-xdist workers (a file lock). Without node or npm
the caller skips, saying so; a build that fails fails the test with npm's own words."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = ROOT / "sdk" / "typescript"
ECHO = WORKSPACE / "examples" / "echo-runner"
CONFORMANCE = WORKSPACE / "examples" / "conformance-runner"
_OUTPUTS = [WORKSPACE / "runner-sdk" / "dist" / "index.js", ECHO / "dist" / "main.js", CONFORMANCE / "dist" / "main.js"]


def _newest(paths: list[Path]) -> float:
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _sources() -> list[Path]:
    found = list((ROOT / "protos").glob("*.proto"))
    for pattern in ("runner-sdk/src/**/*.ts", "runner-sdk/scripts/*", "examples/*/src/**/*.ts", "**/package.json"):
        found += [p for p in WORKSPACE.glob(pattern) if "node_modules" not in p.parts and "/gen/" not in str(p)]
    return found


def _run(argv: list[str], timeout: float) -> None:
    done = subprocess.run(argv, cwd=WORKSPACE, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed in {WORKSPACE}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def build() -> Path:
    """The workspace, installed and built; pytest.skip when node or npm is not installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the TypeScript SDK's tests need Node.js 18+ and npm on PATH (not found)")
    lock = WORKSPACE / "node_modules" / ".agenthost-build.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        installed = WORKSPACE / "node_modules" / ".package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < (WORKSPACE / "package-lock.json").stat().st_mtime:
            _run([npm, "ci", "--no-audit", "--no-fund"], timeout=600)
        if any(not p.exists() for p in _OUTPUTS) or _newest(_sources()) > min(p.stat().st_mtime for p in _OUTPUTS):
            _run([npm, "run", "build"], timeout=600)
    return WORKSPACE
