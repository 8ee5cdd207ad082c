"""Body dedup in the core: a mirror is named a duplicate, also by a core restarted over the same store."""

from __future__ import annotations

from pathlib import Path

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0))


def _fetch_all(f: Frontier, bodies: dict[str, str]) -> dict[str, str]:
    """Lease and complete everything: robots 404, pages 200 with the digest given per URL; url -> reason."""
    reasons: dict[str, str] = {}
    while batch := f.lease("w", 10):
        for item in batch:
            if item.kind is Kind.ROBOTS:
                f.complete(item.key, item.generation, Outcome(status=404))
                continue
            digest = bodies[item.url]
            f.complete(item.key, item.generation, Outcome(status=200, body_digest=digest))
            reasons[item.url] = f.store.get(item.key).reason  # type: ignore[union-attr]
        f.store.flush()
    return reasons


def test_a_mirror_is_a_duplicate_before_and_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "bodies.sqlite3"
    store = SqliteStore(path)
    first = Frontier(store, VirtualClock(), CONFIG)
    first.discover([Link("http://a.example/x"), Link("http://b.example/y")])
    reasons = _fetch_all(first, {"http://a.example/x": "sha256:1", "http://b.example/y": "sha256:1"})
    assert sorted(reasons.values()) == ["200", "duplicate_body"]
    store.close()

    store = SqliteStore(path)
    again = Frontier(store, VirtualClock(), CONFIG)
    again.discover([Link("http://c.example/z"), Link("http://c.example/w")])
    reasons = _fetch_all(again, {"http://c.example/z": "sha256:1", "http://c.example/w": "sha256:2"})
    assert reasons == {"http://c.example/z": "duplicate_body", "http://c.example/w": "200"}
    store.close()
