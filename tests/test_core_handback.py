"""Leases handed back and policy refusals reconsidered (core/handback.py): what a resumed crawl relies on.

Every move is checked against the journal: replaying it gives the rows the store holds.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.handback import MAX_FREE_HANDBACKS
from frontier_node.core.journal import replay
from frontier_node.core.records import Item, Kind, Link, Outcome, Verdict
from frontier_node.core.states import TRANSITIONS, Event, IllegalTransition, State, next_state
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=1.0), lease_s=60.0)
OK = Outcome(status=200, response_s=0.01, content_type="text/html")
REFUSED = Outcome(error_class="network_policy", error_detail="network policy refuses 'a' at 10.0.0.1: private")


def frontier(store: MemoryStore | None = None, clock: VirtualClock | None = None, **config: object) -> Frontier:
    cfg = FrontierConfig(**{**{"politeness": CONFIG.politeness, "lease_s": CONFIG.lease_s}, **config})  # type: ignore[arg-type]
    return Frontier(store or MemoryStore(), clock or VirtualClock(), cfg)


def lease_all(f: Frontier, clock: VirtualClock, worker: str = "w", rest: float = 2.0) -> list[Item]:
    clock.advance(rest)
    return f.lease(worker, 100)


def journal_agrees(store: MemoryStore) -> None:
    replayed = replay(store.journal())
    for item in store.items():
        assert replayed[item.key].state is item.state, item.key


def test_the_table_has_the_new_edges_and_nothing_else_reaches_back() -> None:
    assert next_state(State.LEASED, Event.RELEASE) is State.SCHEDULED
    for terminal in (State.FAILED, State.SUPPRESSED, State.REJECTED):
        assert next_state(terminal, Event.RECONSIDER) is State.SCHEDULED
    with pytest.raises(IllegalTransition):
        next_state(State.FETCHED, Event.RECONSIDER)  # a fetched page is not a refusal
    with pytest.raises(IllegalTransition):
        next_state(State.SCHEDULED, Event.RELEASE)
    assert {e for (_, e) in TRANSITIONS} >= {Event.RELEASE, Event.RECONSIDER}


def test_a_dead_workers_leases_come_back_at_once_not_at_their_deadline() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link(f"http://h{i}.example/") for i in range(3)])
    robots = lease_all(f, clock, "dead")
    assert {it.kind for it in robots} == {Kind.ROBOTS} and len(robots) == 3
    for it in robots[:1]:
        f.complete(it.key, it.generation, Outcome(status=404))
    # A restart: a new core on the same store adopts the two leases still held by "dead".
    f2 = frontier(store, clock)
    assert f2.stats().in_flight == 2
    assert f2.release_leases("someone-else") == 0
    assert f2.release_leases("dead", reason="worker_gone") == 2
    s = f2.stats()
    assert s.in_flight == 0 and s.urls_by_state["leased"] == 0
    clock.advance(1.0)  # one politeness delay, not the 60 s lease
    again = f2.lease("alive", 100)
    assert {it.key for it in again} >= {it.key for it in robots[1:]}
    released = [e for e in store.journal() if e.event == "release"]
    assert len(released) == 2 and {e.reason for e in released} == {"worker_gone"}
    journal_agrees(store)
    with pytest.raises(ValueError):
        f2.release_leases()


def test_a_stopping_worker_hands_back_without_retry_delay_or_backoff() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/x")])
    (robots,) = lease_all(f, clock)
    f.complete(robots.key, robots.generation, Outcome(status=404))
    (page,) = lease_all(f, clock)
    first_generation = page.generation  # the core hands out its own objects: keep the number, not the item
    done = f.complete(page.key, page.generation, Outcome(error_class="worker_shutdown"))
    assert done.accepted and done.state == "scheduled"
    host = f.host("a.example")
    assert host is not None and host.backoff == 1.0 and host.errors == 0 and host.queued == 1
    (again,) = lease_all(f, clock, rest=1.0)
    assert again.key == page.key and again.generation > first_generation
    assert f.stats().urls_by_state.get("retryable", 0) == 0
    journal_agrees(store)


def test_network_policy_refusals_are_reconsidered_robots_first() -> None:
    """A robots.txt refused by the network policy abandons its origin (pages suppressed); a page refused fails.
    Reconsidering under a wider policy schedules all of them again, and the crawl then goes on normally."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/"), Link("http://a.example/2"), Link("http://b.example/")])
    for it in lease_all(f, clock):
        f.complete(it.key, it.generation, REFUSED if it.origin == "http://a.example" else Outcome(status=404))
    (b_page,) = lease_all(f, clock)
    f.complete(b_page.key, b_page.generation, REFUSED)
    by_state = {it.key: (it.state, it.reason) for it in store.items()}
    assert by_state["http://a.example/"] == (State.SUPPRESSED, "network_policy")
    assert by_state["http://b.example/"] == (State.FAILED, "network_policy")
    assert f.drained
    # A later link to the abandoned origin is refused too (and kept, to be reconsidered with the others).
    assert f.discover([Link("http://a.example/3")])[0][:2] == (Verdict.REJECTED, "network_policy")

    f2 = frontier(store, clock)  # the next run (restart), under a wider policy
    done = f2.reconsider(["network_policy"])
    assert done == {"network_policy": 5}  # a's robots file, a's 3 pages, b's page
    assert not f2.drained
    fetched = set()
    for _ in range(10):
        for it in lease_all(f2, clock):
            f2.complete(it.key, it.generation, OK if it.kind is Kind.PAGE else Outcome(status=404))
            fetched.add(it.url)
    assert fetched >= {"http://a.example/", "http://a.example/2", "http://a.example/3", "http://b.example/"}
    assert f2.drained
    assert all(it.state is State.FETCHED for it in store.items())
    assert all(e.reason.startswith("reconsidered:") for e in store.journal() if e.event == "reconsider")
    journal_agrees(store)


def test_a_reconsidered_refusal_starts_its_attempts_again() -> None:
    """Retries spent before a network-policy refusal belong to the run that refused it: in the next run a 503 is
    retried again (a robots file's and a page's alike) instead of failing at once on the old count."""
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock)
    f.discover([Link("http://a.example/"), Link("http://b.example/")])
    unavailable = Outcome(status=503)
    script = {  # what each fetch answers, in turn: retries, then the refusal
        "robots:http://a.example": [unavailable] * 3 + [REFUSED],
        "robots:http://b.example": [Outcome(status=404)],
        "http://b.example/": [unavailable] * 2 + [REFUSED],
    }
    for _ in range(100):
        for it in lease_all(f, clock, rest=60.0):
            f.complete(it.key, it.generation, script[it.key].pop(0))
    assert all(not answers for answers in script.values())
    refused = {it.key: (it.state, it.reason, it.attempt) for it in store.items() if it.reason == "network_policy"}
    assert refused == {
        "robots:http://a.example": (State.FAILED, "network_policy", 4),
        "http://a.example/": (State.SUPPRESSED, "network_policy", 0),
        "http://b.example/": (State.FAILED, "network_policy", 3),
    }

    f2 = frontier(store, clock)  # the next run, under a wider policy
    assert f2.reconsider(["network_policy"]) == {"network_policy": 3}
    leased = lease_all(f2, clock, rest=60.0)
    assert {(it.key, it.attempt) for it in leased} == {("robots:http://a.example", 1), ("http://b.example/", 1)}
    for it in leased:
        f2.complete(it.key, it.generation, unavailable)
        row = store.get(it.key)
        assert row is not None and (row.state, row.attempt) == (State.RETRYABLE, 1), it.key
    journal_agrees(store)


def test_scope_refusals_come_back_only_when_the_new_scope_admits_them() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock, scope="domain")
    f.discover([Link("http://a.example/", seed=True), Link("http://b.example/"), Link("http://c.example/")])
    assert {it.key: it.state for it in store.items() if it.kind is Kind.PAGE} == {
        "http://a.example/": State.SCHEDULED,
        "http://b.example/": State.REJECTED,
        "http://c.example/": State.REJECTED,
    }
    # Same scope next run: nothing comes back.
    assert frontier(store, clock, scope="domain").reconsider(["out_of_scope"]) == {}
    # b.example is seeded in the next run (its domain joins the scope): b comes back, c stays out.
    f3 = frontier(store, clock, scope="domain")
    f3.add_scope(domains=["b.example"])
    assert f3.reconsider(["out_of_scope"]) == {"out_of_scope": 1}
    states = {it.key: it.state for it in store.items() if it.kind is Kind.PAGE}
    assert states["http://b.example/"] is State.SCHEDULED and states["http://c.example/"] is State.REJECTED
    # scope "all": c comes back as well, with its robots file admitted like any new origin's.
    f4 = frontier(store, clock, scope="all")
    assert f4.reconsider(["out_of_scope"]) == {"out_of_scope": 1}
    assert store.get("robots:http://c.example") is not None
    journal_agrees(store)
    with pytest.raises(ValueError):
        f4.reconsider(["robots"])  # a robots.txt rule is not a policy the operator widens


def test_the_outlook_names_what_the_crawl_waits_for() -> None:
    clock = VirtualClock()
    f = frontier(None, clock)
    f.discover([Link("http://a.example/")])
    s = f.stats()
    assert s.next_ready_s == 0.0 and s.waiting_for == ""
    (robots,) = f.lease("w", 10)
    assert f.stats().next_ready_s is None  # nothing queued: the robots file is in flight
    f.complete(robots.key, robots.generation, Outcome(status=503, retry_after_s=300))
    s = f.stats()
    assert s.in_flight == 0 and s.next_ready_s is not None and s.next_ready_s >= 299
    assert s.waiting_for == "robots.txt of http://a.example (robots_503)"
    clock.advance(s.next_ready_s + 1)
    f.tick()
    assert f.stats().next_ready_s == 0.0


def test_verdicts_and_breaches_add_up_across_restarts() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = frontier(store, clock, scope="domain")
    f.discover([Link("http://a.example/", seed=True), Link("http://a.example/", seed=True), Link("http://x.example/")])
    f.discover([Link("http://a.example/d", depth=99)])  # over max_depth 20: suppressed by a budget
    f.tick()
    store.flush()
    f2 = frontier(store, clock, scope="domain")
    f2.discover([Link("http://a.example/2"), Link("http://a.example/d2", depth=99)])
    f2.tick()
    verdicts = f2.stats().discovered_by_verdict
    assert verdicts == {"admitted": 2, "duplicate": 1, "rejected:out_of_scope": 1, "suppressed:depth": 2}
    pages = [it for it in store.items() if it.kind is Kind.PAGE and it.state is not State.REJECTED]
    assert verdicts["admitted"] == len(pages)
    breaches = f2.coverage_input().budget_breaches
    assert breaches is not None and [b["count"] for b in breaches] == [2]
    stored = store.load_breaches()  # per domain, so a handoff carries them
    assert [b["first_example"] for b in stored["a.example"]] == ["http://a.example/d"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["lease", "complete", "handback", "release", "restart", "tick"]), max_size=40))
@example(["lease", "handback"] * 7)  # one robots.txt handed back past the bound: it fails, its origin's pages end
@example(["lease", "complete", "lease", "complete"] + ["lease", "release"] * 6)  # pages released past the bound
def test_handing_back_never_loses_or_repeats_a_fetch(steps: list[str]) -> None:
    """Any interleaving of leases, completions, hand-backs, releases of a dead worker and restarts: driven to the
    end, every page is fetched exactly once (one accepted 200 per page) and the journal agrees with the rows.
    The oracle is the plain set of pages: nothing a hand-back does may lose one or fetch one twice, except the
    bound on hand-backs (MAX_FREE_HANDBACKS): an item handed back more often than that in one run (between
    restarts) may fail, a page `retries_exhausted:<reason>`, a robots.txt `robots_unavailable:<reason>` with its
    origin's pages suppressed."""
    clock, store = VirtualClock(), MemoryStore()
    pages = {f"http://h{i % 3}.example/p{i}" for i in range(8)}
    f = frontier(store, clock)
    f.discover([Link(u) for u in sorted(pages)])
    held: list[Item] = []
    completed: list[str] = []
    rng = random.Random(len(steps))
    restarts = [0]  # the journal's last seq before each run

    def finish(item: Item) -> None:
        done = f.complete(item.key, item.generation, OK if item.kind is Kind.PAGE else Outcome(status=404))
        if done.accepted and item.kind is Kind.PAGE:
            completed.append(item.url)

    for step in [*steps, *["lease", "complete"] * 40]:
        if step == "lease":
            held += lease_all(f, clock, "w", rest=1.1)
        elif step == "complete" and held:
            finish(held.pop(rng.randrange(len(held))))
        elif step == "handback" and held:
            item = held.pop()
            f.complete(item.key, item.generation, Outcome(error_class="worker_shutdown"))
        elif step == "release":
            f.release_leases("w")
            held.clear()
        elif step == "restart":
            store.flush()
            restarts.append(store.max_seqs()[0])
            f = frontier(store, clock)
            f.release_leases(every_worker=True, reason="worker_gone")
            held.clear()
        elif step == "tick":
            f.tick()
    assert f.drained
    assert len(completed) == len(set(completed))
    # Hand-backs of each item per run, from the journal: the items the bound may have ended.
    handed: dict[tuple[int, str], int] = {}
    for e in store.journal():
        if e.event == "release":
            run = max(i for i, seq in enumerate(restarts) if seq < e.seq)
            handed[(run, e.key)] = handed.get((run, e.key), 0) + 1
    past_bound = {key for (_, key), n in handed.items() if n > MAX_FREE_HANDBACKS}
    rows = {it.key: it for it in store.items()}
    for url in pages - set(completed):
        row = rows[url]
        if row.state is State.FAILED:
            assert row.reason.startswith("retries_exhausted:") and url in past_bound, (url, row.reason)
        else:
            robots = rows[f"robots:{row.origin}"]
            assert (row.state, row.reason) == (State.SUPPRESSED, "robots_unavailable"), url
            assert robots.reason.startswith("robots_unavailable:") and robots.key in past_bound, robots.reason
    journal_agrees(store)
