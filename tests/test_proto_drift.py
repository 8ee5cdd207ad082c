"""The committed gRPC stubs are exactly what `python scripts/gen_proto.py` makes from proto/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
