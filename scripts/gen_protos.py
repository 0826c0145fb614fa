"""Regenerates the committed protobuf/gRPC stubs in protos/ (run from anywhere: python scripts/gen_protos.py).

The stubs import each other as `agenthost.protos.*`, the installed name of the repository's protos/ folder, so
protoc compiles from a scratch tree where protos/ appears as agenthost/protos/. tests/test_protos.py runs this into
a scratch copy and fails if the output differs from what is committed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_root: Path = ROOT) -> list[Path]:
    """Compiles every protos/*.proto into out_root/protos; returns the generated files."""
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        src = scratch / "src" / "agenthost" / "protos"
        out = scratch / "out"
        src.mkdir(parents=True)
        out.mkdir()
        protos = sorted((ROOT / "protos").glob("*.proto"))
        for proto in protos:
            shutil.copy(proto, src / proto.name)
        args = [
            "protoc",
            f"-I{scratch / 'src'}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *[f"agenthost/protos/{p.name}" for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        dest = out_root / "protos"
        dest.mkdir(parents=True, exist_ok=True)
        for generated in sorted((out / "agenthost" / "protos").glob("*_pb2*.py*")):
            shutil.copy(generated, dest / generated.name)
    return sorted(dest.glob("*_pb2*.py*"))


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(path)
