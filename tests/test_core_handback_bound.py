"""The bound on hand-backs (core/handback.py, MAX_FREE_HANDBACKS): an item's first hand-backs in a run are free (its
attempt given back, 4d8af37), later ones count as tries, and one that finds the tries spent fails the item. A worker
that hands back every lease it gets (buggy or hostile) can no longer keep one URL cycling leased -> scheduled forever.

Sans-I/O: a Frontier on a MemoryStore or SqliteStore and a VirtualClock; every journal line is checked against the
transition table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.config import FrontierConfig, PolitenessConfig, RetryConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.handback import HANDED_BACK, MAX_FREE_HANDBACKS
from frontier_node.core.journal import replay
from frontier_node.core.ports import Store
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.states import TERMINAL, Event, State, next_state
from frontier_node.metrics import NodeCollector
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

RETRY = RetryConfig()
CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=60.0, retry=RETRY)
HAND_BACK = Outcome(error_class=HANDED_BACK)
UNAVAILABLE = Outcome(status=503)
NOT_FOUND = Outcome(status=404)
OK = Outcome(status=200, response_s=0.01, content_type="text/html")
PAGE_LEASES = MAX_FREE_HANDBACKS + RETRY.max_attempts
"""The most leases a page handed back every time gets: the free hand-backs, then one per try."""
ROBOTS_LEASES = MAX_FREE_HANDBACKS + RETRY.robots_max_attempts


def frontier(store: Store, clock: VirtualClock) -> Frontier:
    return Frontier(store, clock, CONFIG)


def lease(f: Frontier, clock: VirtualClock, rest: float = 2.0, worker: str = "w") -> list[Item]:
    """What the frontier leases after `rest` s; a retry's backoff (at most a few minutes here) is waited out."""
    clock.advance(rest)
    out = f.lease(worker, 100)
    if not out and not f.drained:
        wait = f.next_event_in()
        if wait is not None:
            clock.advance(wait + 0.01)
            out = f.lease(worker, 100)
    return out


def lease_counters(f: Frontier) -> dict[str, float]:
    """The node's lease counters by event, as /metrics exports them."""
    family = next(m for m in NodeCollector(f.stats).collect() if m.name == "hostring_node_leases")
    return {sample.labels["event"]: sample.value for sample in family.samples if sample.name.endswith("_total")}


def past_robots(f: Frontier) -> None:
    """Lease and settle the robots.txt of every new host (404: allow all): pages are next."""
    for it in f.lease("w", 100):
        assert it.kind is Kind.ROBOTS
        f.complete(it.key, it.generation, NOT_FOUND)


def journal_follows_the_table(store: Store) -> None:
    """Each item's journal lines chain (a line starts where the previous one ended), each is an edge of the
    table, and replaying them gives the rows the store holds."""
    store.flush()
    where: dict[str, State] = {}
    for e in store.journal():
        if e.event == Event.LATE_EVIDENCE.value:
            continue
        before = State(e.from_state)
        assert where.get(e.key, State.DISCOVERED) is before, (e.key, e.event)
        assert next_state(before, Event(e.event)) is State(e.to_state), (e.key, e.event)
        where[e.key] = State(e.to_state)
    replayed = replay(store.journal())
    for item in store.items():
        assert replayed[item.key].state is item.state, item.key


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sqlite = SqliteStore(tmp_path / "frontier.sqlite3")
    yield sqlite
    sqlite.close()


def test_a_page_handed_back_forever_by_the_only_worker_fails_and_the_crawl_drains(store: Store) -> None:
    clock = VirtualClock()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/")])
    past_robots(f)
    attempts = []
    for _ in range(100):
        leased = lease(f, clock)
        if not leased:
            break
        (page,) = leased
        attempts.append(page.attempt)
        done = f.complete(page.key, page.generation, HAND_BACK)
        assert done.accepted
    # The free hand-backs give the attempt back; from then on each hand-back is a try, and the last one fails.
    assert attempts == [1] * (MAX_FREE_HANDBACKS + 1) + list(range(2, RETRY.max_attempts + 1))
    assert len(attempts) == PAGE_LEASES
    assert (done.state, done.reason) == ("failed", f"retries_exhausted:{HANDED_BACK}"), "the reply says it failed"
    leases = lease_counters(f)
    assert leases["handback_counted"] == PAGE_LEASES - MAX_FREE_HANDBACKS
    assert leases["released"] == PAGE_LEASES
    store.flush()
    row = store.get("http://a.example/")
    assert row is not None and (row.state, row.reason) == (State.FAILED, f"retries_exhausted:{HANDED_BACK}")
    assert f.drained
    host = f.host("a.example")
    assert host is not None and host.in_flight == 0 and host.backoff == 1.0 and host.errors == 0
    journal_follows_the_table(store)


def test_a_robots_file_handed_back_forever_fails_like_an_unavailable_one_and_abandons_its_origin(
    store: Store,
) -> None:
    clock = VirtualClock()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/"), Link("http://a.example/2")])
    leases = 0
    for _ in range(100):
        leased = lease(f, clock)
        if not leased:
            break
        (robots,) = leased
        assert robots.kind is Kind.ROBOTS
        leases += 1
        f.complete(robots.key, robots.generation, HAND_BACK)
    assert leases == ROBOTS_LEASES
    store.flush()
    rows = {it.key: (it.state, it.reason) for it in store.items()}
    assert rows == {
        "robots:http://a.example": (State.FAILED, f"robots_unavailable:{HANDED_BACK}"),
        "http://a.example/": (State.SUPPRESSED, "robots_unavailable"),
        "http://a.example/2": (State.SUPPRESSED, "robots_unavailable"),
    }
    assert f.drained
    journal_follows_the_table(store)


def test_a_robots_file_handed_back_forever_on_a_redirect_hop_fails_and_leaves_the_hop_host() -> None:
    """A robots.txt redirected to another host (the hop's lease counts as the same try) and handed back there every
    time: it fails at the same bound, leaves the hop host's queue, and its origin is abandoned."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/")])
    (robots,) = f.lease("w", 10)
    f.complete(robots.key, robots.generation, Outcome(status=301, location="http://b.example/robots.txt"))
    hops = []
    for _ in range(100):
        leased = lease(f, clock)
        if not leased:
            break
        (robots,) = leased
        hops.append((robots.host, robots.attempt - robots.redirect_hops))
        f.complete(robots.key, robots.generation, HAND_BACK)
    assert hops == [("b.example", 1)] * (MAX_FREE_HANDBACKS + 1) + [
        ("b.example", n) for n in range(2, RETRY.robots_max_attempts + 1)
    ]
    rows = {it.key: (it.state, it.reason) for it in store.items()}
    assert rows == {
        "robots:http://a.example": (State.FAILED, f"robots_unavailable:{HANDED_BACK}"),
        "http://a.example/": (State.SUPPRESSED, "robots_unavailable"),
    }
    hop_host = f.host("b.example")
    assert hop_host is not None and hop_host.in_flight == 0
    assert f.drained
    journal_follows_the_table(store)


def test_an_honest_worker_keeps_its_retries_beside_one_handing_back_forever() -> None:
    """Page a is handed back twice (its workers stopping), then answers 503 three times: it is leased as attempt 1
    three times and gets its full retries (4d8af37). Page b, on another host, is handed back every time: it fails
    at its bound, and its hand-backs cost a nothing."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/"), Link("http://b.example/")])
    past_robots(f)
    script = {"http://a.example/": [HAND_BACK] * 2 + [UNAVAILABLE] * 3}
    attempts: dict[str, list[int]] = {"http://a.example/": [], "http://b.example/": []}
    for _ in range(100):
        leased = lease(f, clock)
        if not leased:
            break
        for it in leased:
            attempts[it.key].append(it.attempt)
            answers = script.get(it.key)
            f.complete(it.key, it.generation, answers.pop(0) if answers else HAND_BACK)
    assert attempts["http://a.example/"] == [1, 1, 1, 2, 3]
    assert len(attempts["http://b.example/"]) == PAGE_LEASES
    rows = {it.key: (it.state, it.reason) for it in store.items() if it.kind is Kind.PAGE}
    assert rows == {
        "http://a.example/": (State.FAILED, "retries_exhausted:http_503"),
        "http://b.example/": (State.FAILED, f"retries_exhausted:{HANDED_BACK}"),
    }
    assert f.drained
    journal_follows_the_table(store)


def test_free_hand_backs_are_per_run_and_tries_between_them_keep_counting() -> None:
    """Hand-backs and a 503 interleaved: the first MAX_FREE_HANDBACKS hand-backs are free whenever they come, a
    later one is a try, and one that finds the tries spent fails the page."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/")])
    past_robots(f)
    script = [HAND_BACK, HAND_BACK, UNAVAILABLE, HAND_BACK, UNAVAILABLE, HAND_BACK]
    attempts = []
    for answer in script:
        (page,) = lease(f, clock)
        attempts.append(page.attempt)
        done = f.complete(page.key, page.generation, answer)
    # Free, free, a try (503), free (the third), a try (503), then a hand-back past the bound at the last try.
    assert attempts == [1, 1, 1, 2, 2, 3]
    assert done.state == "failed"
    row = store.get("http://a.example/")
    assert row is not None and row.reason == f"retries_exhausted:{HANDED_BACK}"
    assert f.drained
    journal_follows_the_table(store)


def test_admin_releases_count_with_hand_backs_and_a_restart_starts_the_count_again() -> None:
    """release_leases (an operator's release, a resumed crawl's release of its predecessor's leases) hands back
    like a stopping worker and shares its count. The count lives in RAM: a restarted node starts it again."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/")])
    past_robots(f)
    attempts = []
    for i in range(MAX_FREE_HANDBACKS + 1):
        (page,) = lease(f, clock)
        attempts.append(page.attempt)
        if i % 2:
            assert f.release_leases("w") == 1
        else:
            f.complete(page.key, page.generation, HAND_BACK)
    (page,) = lease(f, clock)
    attempts.append(page.attempt)
    assert attempts == [1] * (MAX_FREE_HANDBACKS + 1) + [2]  # the last release was a try
    release = [e for e in store.journal() if e.event == "release"]
    assert [e.attempt for e in release] == [0] * MAX_FREE_HANDBACKS + [1]
    store.flush()
    f2 = frontier(store, clock)  # a restart adopts the lease, and its release is free again
    assert f2.release_leases(every_worker=True, reason="worker_gone") == 1
    (page,) = lease(f2, clock)
    assert page.attempt == 2
    f2.complete(page.key, page.generation, OK)
    assert f2.drained
    journal_follows_the_table(store)


ANSWERS = ["handback", "release", "503", "ok"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ANSWERS), max_size=30), st.integers(min_value=1, max_value=3))
def test_whatever_a_worker_answers_every_url_ends_within_its_bound(answers: list[str], pages: int) -> None:
    """A worker answers each lease from `answers` in turn, then hands back every lease for good: the crawl drains,
    no page is leased more than its bound (robots.txt files likewise), every page ends fetched or failed, and the
    journal follows the table."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link(f"http://h{i}.example/") for i in range(pages)])
    past_robots(f)
    script = list(answers)
    leases: Counter[str] = Counter()
    for _ in range(200):
        leased = lease(f, clock, rest=1.1)
        if not leased:
            break
        for it in leased:
            leases[it.key] += 1
            answer = script.pop(0) if script else "handback"
            if answer == "release":
                f.release_leases("w")
            else:
                outcome = {"handback": HAND_BACK, "503": UNAVAILABLE, "ok": OK}[answer]
                f.complete(it.key, it.generation, outcome)
    assert f.drained
    assert max(leases.values(), default=0) <= PAGE_LEASES
    for item in store.items():
        assert item.state in TERMINAL, item.key
        if item.kind is Kind.PAGE and item.state is State.FAILED:
            assert item.reason.startswith("retries_exhausted:"), item.reason
    journal_follows_the_table(store)
