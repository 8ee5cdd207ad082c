"""A page refused for its redirect chain stays reachable by a short link after a restart or a handoff: the refusal
is a row, and the core that adopts the row remembers it as discover() does when it refuses the link itself."""

from __future__ import annotations

from pathlib import Path

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Link, State, Verdict
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0))


def test_a_restart_keeps_a_long_chain_refusal_open_to_a_short_link(tmp_path: Path) -> None:
    path = tmp_path / "node.sqlite3"
    store = SqliteStore(path)
    first = Frontier(store, VirtualClock(), CONFIG)
    (far,) = first.discover([Link("http://a.example/x", redirect_hops=6)])
    assert (far.verdict, far.reason) == (Verdict.REJECTED, "too_many_redirects")
    store.flush()
    store.close()

    again = SqliteStore(path)
    restarted = Frontier(again, VirtualClock(), CONFIG)
    (still_far,) = restarted.discover([Link("http://a.example/x", redirect_hops=7)])
    assert still_far.verdict is Verdict.DUPLICATE, "a longer chain than the refused one is still a duplicate"
    (near,) = restarted.discover([Link("http://a.example/x", redirect_hops=1)])
    assert near.verdict is Verdict.ADMITTED, "the refused page was lost to the restart"
    (twice,) = restarted.discover([Link("http://a.example/x", redirect_hops=0)])
    assert twice.verdict is Verdict.DUPLICATE
    assert restarted.stats().urls_by_state.get("rejected", 0) == 0
    again.close()


def test_a_node_adopting_a_domain_keeps_its_long_chain_refusals_open() -> None:
    old = Frontier(MemoryStore(), VirtualClock(), CONFIG)
    old.discover([Link("http://b.example/y", redirect_hops=6), Link("http://b.example/z", redirect_hops=0)])
    rows = list(old.store.items())
    assert {r.state for r in rows} >= {State.REJECTED}

    new = Frontier(MemoryStore(), VirtualClock(), CONFIG)
    new.adopt(rows, [])
    verdicts = new.discover([Link("http://b.example/y", redirect_hops=0), Link("http://b.example/z")])
    assert [v.verdict for v in verdicts] == [Verdict.ADMITTED, Verdict.DUPLICATE]


def test_other_refusals_stay_duplicates_after_a_restart(tmp_path: Path) -> None:
    """Only the redirect-chain refusal depends on the link: an out-of-scope page stays refused however linked."""
    path = tmp_path / "node.sqlite3"
    store = SqliteStore(path)
    scoped = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), scope="host")
    first = Frontier(store, VirtualClock(), scoped)
    first.discover([Link("http://a.example/", seed=True)])
    (out,) = first.discover([Link("http://c.example/q")])
    assert (out.verdict, out.reason) == (Verdict.REJECTED, "out_of_scope")
    store.flush()
    store.close()

    again = SqliteStore(path)
    restarted = Frontier(again, VirtualClock(), scoped)
    (seen,) = restarted.discover([Link("http://c.example/q")])
    assert seen.verdict is Verdict.DUPLICATE
    again.close()
