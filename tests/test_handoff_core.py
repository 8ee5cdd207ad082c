"""Handing domains between two cores over one store: nothing lost, nothing leased twice at once."""

from __future__ import annotations

from collections import Counter

import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=10.0, window=2)


def _lease_all(f: Frontier, worker: str) -> list:
    out = []
    while batch := f.lease(worker, 100):
        out += batch
    return out


def test_adopted_domain_keeps_its_lease_and_queue_and_the_old_owner_lets_go() -> None:
    clock, store = VirtualClock(), MemoryStore()
    owner = {"a.example": "A", "b.example": "A"}
    a = Frontier(store, clock, CONFIG, owns=lambda d: owner.get(d) == "A")
    a.discover([Link(f"http://www.{d}/p{i}") for d in ("a.example", "b.example") for i in range(5)])
    for item in _lease_all(a, "w"):  # robots first: allow all
        assert item.kind is Kind.ROBOTS
        a.complete(item.key, item.generation, Outcome(status=404))
    clock.advance(2)
    in_flight = {it.domain: it for it in _lease_all(a, "w")}
    assert set(in_flight) == {"a.example", "b.example"}
    store.flush()

    # b.example moves to B: A lets go, B adopts its rows from the store
    owner["b.example"] = "B"
    counts = Counter(r.state.value for r in store.items() if r.domain == "b.example")
    a.release({"b.example"}, dict(counts))
    b = Frontier(store, clock, CONFIG, owns=lambda d: owner.get(d) == "B", recover=False)
    b.adopt(
        [r for r in store.items() if r.domain == "b.example"],
        [r for r in store.robots_records() if r[1].endswith("b.example")],
    )

    clock.advance(2)
    assert all(it.domain == "a.example" for it in _lease_all(a, "w"))
    # the host still has a fetch in flight (leased at A): B must not lease it before that lease ends
    assert [it for it in b.lease("w", 100) if it.domain == "b.example"] == []
    stale = in_flight["b.example"]
    # the worker's Complete reaches the new owner, which holds the same lease and generation
    done = b.complete(stale.key, stale.generation, Outcome(status=200, body_digest="sha256:x"))
    assert done.accepted and done.state == "fetched"
    clock.advance(2)
    nxt = b.lease("w", 100)
    assert len(nxt) == 1 and nxt[0].domain == "b.example"
    # A never hands out b.example again, and its counts no longer include it
    clock.advance(20)
    assert all(it.domain == "a.example" for it in a.lease("w", 100))
    counts = a.stats().urls_by_state
    assert counts.get("scheduled", 0) + counts.get("leased", 0) <= 5
    # nothing of b.example is lost: every row is there and B's counts cover them
    rows = [r for r in store.items() if r.domain == "b.example" and r.kind is Kind.PAGE]
    assert len(rows) == 5


def test_expired_lease_of_a_dead_owner_comes_back_with_a_higher_generation() -> None:
    clock, store = VirtualClock(), MemoryStore()
    a = Frontier(store, clock, CONFIG)
    a.discover([Link("http://www.c.example/x")])
    robots = a.lease("w", 10)[0]
    a.complete(robots.key, robots.generation, Outcome(status=404))
    clock.advance(2)
    page = a.lease("w", 10)[0]
    store.flush()
    # A dies; B adopts everything
    b = Frontier(store, clock, CONFIG, recover=False)
    b.adopt(store.items(), store.robots_records())
    assert b.lease("w", 10) == []
    clock.advance(CONFIG.lease_s + 5)
    assert b.lease("w", 10) == []  # the lease expires now; the host then rests one delay before its next request
    clock.advance(CONFIG.politeness.min_delay_s)
    again = b.lease("w", 10)
    assert [it.key for it in again] == [page.key] and again[0].generation > page.generation
    late = b.complete(page.key, page.generation, Outcome(status=200))
    assert not late.accepted and late.reason == "stale_generation"


def test_robots_redirect_to_another_nodes_domain_is_not_followed() -> None:
    """Following it here would pace that host on two nodes at once; reading it as 'allow all' would guess."""
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG, owns=lambda d: d == "mine.example")
    f.discover([Link("http://www.mine.example/a")])
    robots = f.lease("w", 10)[0]
    done = f.complete(
        robots.key, robots.generation, Outcome(status=301, location="http://rules.theirs.example/robots.txt")
    )
    assert done.state == "failed" and done.reason == "robots_redirect_elsewhere"
    clock.advance(60)
    assert f.lease("w", 10) == []  # nothing of the origin is fetched: its pages end with the reason
    page = store.get("http://www.mine.example/a")
    assert page is not None and page.state.value == "suppressed" and page.reason == "robots_redirect_elsewhere"
    assert f.drained


class _FlakyStore(MemoryStore):
    """A store whose next backlog read fails, as a Redis that is away for a moment does."""

    fail_next = False

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list:  # type: ignore[type-arg]
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("redis away")
        return super().backlog(host, after, limit)


def test_a_failed_store_read_during_lease_does_not_strand_the_host() -> None:
    """A backlog read that fails while a host is being leased: the call fails, but the host's queue is leased by
    the next call. (Before: the host had left the ready heap and nothing put it back, so its queue waited forever.)"""
    clock, store = VirtualClock(), _FlakyStore()
    f = Frontier(store, clock, CONFIG)
    f.discover([Link(f"http://www.a.example/p{i}") for i in range(6)])  # window 2: the rest wait in the store
    robots = f.lease("w", 10)
    f.complete(robots[0].key, robots[0].generation, Outcome(status=404))
    pages = []
    for _ in range(2):
        clock.advance(1.5)
        got = f.lease("w", 10)
        for item in got:
            f.complete(item.key, item.generation, Outcome(status=200))
        pages += got
    assert len(pages) == 2, "the window's two pages went first; the rest are in the store"
    store.fail_next = True
    clock.advance(1.5)
    with pytest.raises(ConnectionError):
        f.lease("w", 10)
    for _ in range(10):
        clock.advance(1.5)
        for item in f.lease("w", 10):
            f.complete(item.key, item.generation, Outcome(status=200))
            pages.append(item)
    assert len(pages) == 6, f"{6 - len(pages)} pages stranded after one failed store read"
