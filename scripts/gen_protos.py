"""Regenerates the committed protobuf/gRPC stubs in protos/ (run from anywhere: python scripts/gen_protos.py).

tests/test_protos.py runs this into a scratch copy and fails if the output differs from what is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_root: Path = ROOT) -> list[Path]:
    """Compiles every protos/*.proto into out_root/protos; returns the generated files."""
    protos = sorted((ROOT / "protos").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_root / "protos").glob("*_pb2*.py*"))


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(path)
