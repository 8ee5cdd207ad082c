"""Regenerate the gRPC/protobuf stubs in hostring/v1/ from proto/ (run from the repository root).

The stubs refuse to import under the grpcio and protobuf of the grpcio-tools that made them, so a newer
grpcio-tools (pinned in pyproject.toml's test extra) raises pyproject.toml's grpcio, grpcio-health-checking,
grpcio-reflection and protobuf floors with it; tests/test_proto_drift.py fails until they match.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> None:
    """Run protoc over every .proto under proto/, writing Python, .pyi and gRPC stubs into out_dir."""
    sources = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
