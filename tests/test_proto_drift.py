"""The committed gRPC stubs are exactly what `python scripts/gen_proto.py` makes from proto/, and pyproject.toml's
grpcio and protobuf floors are the versions those stubs demand at import."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _generate(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(out)


def test_stubs_match_proto(tmp_path: Path) -> None:
    _generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc produced nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is generated but not committed: run python scripts/gen_proto.py"
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} drifted from proto/: run python scripts/gen_proto.py and commit the result"
        )
    committed_stubs = {p.relative_to(ROOT) for p in (ROOT / "hostring" / "v1").glob("*_pb2*")}
    assert committed_stubs == set(generated), "stale stub files without a .proto behind them"


def _floors() -> dict[str, str]:
    """name -> the lowest version pyproject.toml allows, for the dependencies and the test extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floors: dict[str, str] = {}
    for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator in (">=", "=="):
                floors[canonicalize_name(req.name)] = spec.version
    return floors


def test_dependency_floors_are_what_the_stubs_need() -> None:
    """The stubs refuse to import under the grpcio and protobuf they were generated for: those are the floors."""
    grpc_versions = {
        m.group(1)
        for p in (ROOT / "hostring" / "v1").glob("*_pb2_grpc.py")
        for m in [re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'$", p.read_text(encoding="utf-8"), re.M)]
        if m is not None
    }
    protobuf_versions = {
        ".".join(m.groups())
        for p in (ROOT / "hostring" / "v1").glob("*_pb2.py")
        for m in [
            re.search(
                r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
                p.read_text(encoding="utf-8"),
            )
        ]
        if m is not None
    }
    assert len(grpc_versions) == 1 and len(protobuf_versions) == 1, (grpc_versions, protobuf_versions)
    grpc_version, protobuf_version = grpc_versions.pop(), protobuf_versions.pop()
    floors = _floors()
    want = {
        "grpcio": grpc_version,
        "grpcio-health-checking": grpc_version,
        "grpcio-reflection": grpc_version,
        "grpcio-tools": grpc_version,  # the generator itself (pinned in the test extra)
        "protobuf": protobuf_version,
    }
    assert {name: floors.get(name) for name in want} == want, (
        "pyproject.toml's floors differ from the versions the stubs in hostring/v1/ were generated for"
    )
