"""The committed stubs are exactly what the generator makes, and the declared floors satisfy their guards."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_regeneration_changes_nothing(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), str(tmp_path)], check=True, capture_output=True
    )
    generated = sorted(p.name for p in (tmp_path / "protos").glob("*_pb2*"))
    committed = sorted(p.name for p in (ROOT / "protos").glob("*_pb2*"))
    assert generated == committed
    for name in generated:
        assert (tmp_path / "protos" / name).read_text() == (ROOT / "protos" / name).read_text(), name


def _floor(dep_name: str) -> Version:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        if req.name == dep_name:
            return min(Version(s.version) for s in req.specifier if s.operator == ">=")
    raise AssertionError(f"{dep_name} is not a declared dependency")


def test_declared_floors_satisfy_the_stub_version_guards():
    grpc_floor = _floor("grpcio")
    proto_floor = _floor("protobuf")
    for path in (ROOT / "protos").glob("*_pb2_grpc.py"):
        generated = Version(re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", path.read_text()).group(1))
        assert grpc_floor >= generated, path.name
    for path in (ROOT / "protos").glob("*_pb2.py"):
        m = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", path.read_text())
        gencode = Version(".".join(m.groups()))
        # protobuf's runtime check: same major, runtime >= gencode.
        assert proto_floor.major == gencode.major and proto_floor >= gencode, path.name
