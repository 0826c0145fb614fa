"""The systemd units under deploy/: parsed (sections, keys, an ExecStart the real CLI parser accepts, the data dir
private) and, where systemd-analyze is installed, verified by systemd itself."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agenthost.host.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a setting outside any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep and key.strip(), f"not KEY=VALUE: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_there_are_units_for_the_host_and_the_worker() -> None:
    assert {u.name for u in UNITS} == {"agenthost.service", "agenthost-worker.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_parses_and_its_command_is_the_cli_s(unit: Path) -> None:
    sections = parse_unit(unit.read_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    service = sections["Service"]
    assert service["UMask"] == ["0077"] and service["StateDirectoryMode"] == ["0700"]
    assert service["Delegate"] == ["yes"], "the resource walls need a delegated cgroup"
    assert service["User"] != ["root"]
    (command,) = service["ExecStart"]
    argv = shlex.split(command)
    assert argv[0].endswith("/agenthost")
    args = build_parser().parse_args(argv[1:])  # the CLI accepts it as written
    if unit.name == "agenthost.service":
        assert args.command == "serve" and args.workers
    else:
        assert args.command == "worker" and args.host and not args.join  # no token in a unit file
    assert sections["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
@pytest.mark.e2e
def test_systemd_verifies_the_unit(unit: Path, tmp_path: Path) -> None:
    # The unit names /usr/local/bin/agenthost; verified here against this interpreter's agenthost (systemd checks
    # that the command exists and is executable).
    agenthost = Path(sys.executable).with_name("agenthost")
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace("/usr/local/bin/agenthost", str(agenthost)))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if unit.name in line or "Unknown" in line or "Failed" in line
    ]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr
