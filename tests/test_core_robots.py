"""robots.txt items in the core across refetches, on a virtual clock: attempts count the failures of one fetch round
(RFC 9309 §2.3.1.4: a 5xx disallows all while it lasts, and is retried), not an origin's lifetime of refetches.

Every scenario is checked against the journal: replaying it gives the rows (attempts included) the store holds.
"""

from __future__ import annotations

from pathlib import Path

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import replay
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.robots import MAX_CACHE_S
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=60.0)
ORIGIN = "http://a.example"
ROBOTS_OK = Outcome(status=200, robots_body=b"User-agent: *\nAllow: /\n", response_s=0.01)
UNAVAILABLE = Outcome(status=503, response_s=0.01)
PAGE_OK = Outcome(status=200, response_s=0.01, content_type="text/html")
ROUNDS = CONFIG.retry.robots_max_attempts + 2  # more successful robots fetches than the attempts one round has


def _next(f: Frontier, clock: VirtualClock) -> Item:
    """The one item the core leases next, the clock moved on (one second at a time) until it does."""
    for _ in range(10_000):
        items = f.lease("w", 10)
        if items:
            (item,) = items
            return item
        clock.advance(1.0)
    raise AssertionError("nothing was leased")


def _day(f: Frontier, clock: VirtualClock, n: int) -> Item:
    """The robots file has expired: a new page of the origin comes in, and robots.txt is fetched again first."""
    clock.advance(MAX_CACHE_S + 1.0)
    f.discover([Link(f"{ORIGIN}/p{n}")])
    robots = _next(f, clock)
    assert robots.kind is Kind.ROBOTS, robots.key
    return robots


def _crawl_days(f: Frontier, clock: VirtualClock, days: range) -> None:
    """One successful robots fetch and one page fetched per day."""
    for n in days:
        robots = _day(f, clock, n)
        assert robots.attempt == 1, (n, robots.attempt)  # every round starts at its first attempt
        f.complete(robots.key, robots.generation, ROBOTS_OK)
        page = _next(f, clock)
        assert page.url == f"{ORIGIN}/p{n}"
        f.complete(page.key, page.generation, PAGE_OK)


def _journal_agrees(store: MemoryStore | SqliteStore) -> None:
    replayed = replay(store.journal())
    for row in store.items():
        again = replayed[row.key]
        assert (again.state, again.attempt, again.generation) == (row.state, row.attempt, row.generation), row.key


def test_one_503_after_many_robots_refetches_is_retried_and_does_not_abandon_the_origin() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    _crawl_days(f, clock, range(ROUNDS))
    robots = _day(f, clock, ROUNDS)
    done = f.complete(robots.key, robots.generation, UNAVAILABLE)
    assert done.state == State.RETRYABLE.value
    row = store.get(robots.key)
    assert row is not None and (row.state, row.attempt) == (State.RETRYABLE, 1)
    page = store.get(f"{ORIGIN}/p{ROUNDS}")
    assert page is not None and page.state is State.SCHEDULED  # waiting, not suppressed: the origin is kept
    again = _next(f, clock)  # disallow all while it lasts: the page waits behind the retry of robots.txt
    assert (again.key, again.attempt) == (robots.key, 2)
    f.complete(again.key, again.generation, ROBOTS_OK)
    fetched = _next(f, clock)
    assert fetched.key == page.key
    _journal_agrees(store)


def test_robots_failing_a_whole_round_still_abandons_its_origin_at_the_rounds_last_attempt() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    _crawl_days(f, clock, range(ROUNDS))
    robots = _day(f, clock, ROUNDS)
    attempts = []
    while True:
        attempts.append(robots.attempt)
        f.complete(robots.key, robots.generation, UNAVAILABLE)
        row = store.get(robots.key)
        assert row is not None
        if row.state is not State.RETRYABLE:
            break
        robots = _next(f, clock)
    assert attempts == list(range(1, CONFIG.retry.robots_max_attempts + 1))
    assert (row.state, row.reason) == (State.FAILED, "robots_unavailable:robots_503")
    page = store.get(f"{ORIGIN}/p{ROUNDS}")
    assert page is not None and (page.state, page.reason) == (State.SUPPRESSED, "robots_unavailable")
    _journal_agrees(store)


def test_a_restarted_core_counts_the_attempts_of_the_round_too(tmp_path: Path) -> None:
    clock, path = VirtualClock(), tmp_path / "frontier.db"
    first = SqliteStore(path)
    f = Frontier(first, clock, CONFIG)
    _crawl_days(f, clock, range(ROUNDS))
    first.flush()  # the process dies (kill -9): only what was flushed remains
    store = SqliteStore(path)
    g = Frontier(store, clock, CONFIG)
    _crawl_days(g, clock, range(ROUNDS, 2 * ROUNDS))
    robots = _day(g, clock, 2 * ROUNDS)
    g.complete(robots.key, robots.generation, UNAVAILABLE)
    store.flush()
    row = store.get(robots.key)
    assert row is not None and (row.state, row.attempt) == (State.RETRYABLE, 1)
    _journal_agrees(store)
    store.close()


def test_a_robots_lease_expiring_after_many_refetches_is_leased_again_not_abandoned() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, CONFIG)
    rounds = CONFIG.retry.max_attempts + CONFIG.retry.max_expiries + 1  # more than one round's leases may expire
    _crawl_days(f, clock, range(rounds))
    robots = _day(f, clock, rounds)
    key, generation = robots.key, robots.generation
    clock.advance(CONFIG.lease_s + 1.0)  # the worker never answers
    again = _next(f, clock)
    assert (again.key, again.attempt, again.generation) == (key, 2, generation + 1)
    f.complete(again.key, again.generation, ROBOTS_OK)
    assert _next(f, clock).url == f"{ORIGIN}/p{rounds}"
    _journal_agrees(store)
