"""A completion sent again after it landed (its answer lost with a killed node or connection) is answered as the
first was and changes nothing; anything else that arrives for a lease that is no longer current stays late
evidence."""

from __future__ import annotations

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import REPEATED, Frontier
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=10.0)
OK = Outcome(status=200, response_s=0.01, content_type="text/html")


def _page(f: Frontier, clock: VirtualClock) -> Item:
    """The one page of one host, leased (its robots.txt answered 404 first)."""
    f.discover([Link("http://h.example/a")])
    clock.advance(2.0)
    (robots,) = f.lease("w", 5)
    assert robots.kind is Kind.ROBOTS
    assert f.complete(robots.key, robots.generation, Outcome(status=404)).accepted
    clock.advance(2.0)
    (page,) = f.lease("w", 5)
    return page


def test_a_repeated_completion_is_accepted_and_changes_nothing() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _page(f, clock)
    first = f.complete(page.key, page.generation, OK, [Link("http://h.example/b", source_key=page.key)])
    assert first.accepted and first.state == "fetched" and first.admitted == 1
    store.flush()
    lines, row = len(list(store.journal())), store.get(page.key)
    again = f.complete(page.key, page.generation, OK, [Link("http://h.example/c", source_key=page.key)])
    assert again.accepted and again.reason == REPEATED and again.state == "fetched" and again.admitted == 0
    store.flush()
    assert len(list(store.journal())) == lines, "a repeat journals nothing"
    assert store.get(page.key) == row
    assert f.stats().urls_by_state.get("scheduled") == 1, "only the first sending's link was admitted"


def test_what_is_not_a_repeat_stays_late_evidence() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _page(f, clock)
    key, generation = page.key, page.generation
    assert f.complete(key, generation, OK).accepted
    other_status = f.complete(key, generation, Outcome(status=500))
    never_leased = f.complete(key, generation + 1, OK)
    assert not other_status.accepted and not never_leased.accepted
    store.flush()
    late = [e for e in store.journal() if e.key == key and e.event == "late_evidence"]
    assert len(late) == 2


def test_a_completion_after_its_lease_expired_is_not_taken_for_a_repeat() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    page = _page(f, clock)
    key, generation = page.key, page.generation
    clock.advance(CONFIG.lease_s + 1)
    f.tick()
    late = f.complete(key, generation, OK)
    assert not late.accepted and late.reason == "unknown_lease"
    clock.advance(5.0)
    (again,) = f.lease("w", 5)
    assert again.key == key and again.generation != generation and again.state is State.LEASED
