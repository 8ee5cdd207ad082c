"""Revisits in the core, on a virtual clock: the estimator against known Poisson rates, adaptive against fixed at
equal fetch counts, the journal rebuilding revisit state, and what a revisit finds (304, same digest, near
duplicate, 404 twice, retention), share and order within a host, refetch and per-host overrides.

The web is hostring_testing.changing.ChangeWeb (pages changing as Poisson processes of known rates, an oracle of
versions and of the fetcher's freshness); bench.revisit.run_core drives the real Frontier over it.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.revisit import equal_cost_interval, page_url, run_core
from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import replay
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.revisit import SHORT, item_rate, observe, optimal_interval, rate
from frontier_node.core.states import State
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock

HOUR = 3600.0
REVISIT_FIELDS = ("checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s", "simhash")


def _page() -> Item:
    return Item("k", "http://a.example/", "a.example", "http://a.example", "a.example", Kind.PAGE, 0, 0, 1)


# ---------------------------------------------------------------------------------------------- the estimator


@settings(max_examples=40, deadline=None)
@given(
    x=st.floats(0.2, 2.0),  # expected changes per mean interval: where a rate can be told from looks at all
    jitter=st.floats(0.0, 0.8),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_estimator_converges_on_a_poisson_rate_from_irregular_looks(x: float, jitter: float, seed: int) -> None:
    rng = random.Random(seed)
    lam, mean = 1 / 600.0, 600.0 * x
    item, t = _page(), 1_000.0
    item.checked_at = t
    next_change = t + rng.expovariate(lam)
    # Enough looks that the estimate's sampling error (a look sees a change with chance p) is at most 1/6 of the
    # tolerance: with 3000 looks at x = 0.2 it was a third, and one seed in some thousands fell outside 15%.
    p = 1 - math.exp(-x)
    looks = max(3000, math.ceil(p / ((1 - p) * (0.025 * x) ** 2)))
    for _ in range(looks):
        t += mean * rng.uniform(1 - jitter, 1 + jitter)
        changed = next_change <= t
        while next_change <= t:
            next_change += rng.expovariate(lam)
        observe(item, t, changed, history=1e12)
    assert item_rate(item) == pytest.approx(lam, rel=0.15)


def test_the_estimator_is_cho_and_garcia_molinas_on_regular_looks() -> None:
    # n looks at interval I, X of them changed: λ = -log((n - X + 0.5) / (n + 0.5)) / I
    for n, changes in ((10, 0), (10, 3), (10, 10), (50, 17)):
        expected = -math.log((n - changes + 0.5) / (n + 0.5)) / 60.0
        assert rate(n, changes, n * 60.0, changes * 60.0) == pytest.approx(expected)


def test_history_fades_so_a_page_that_starts_changing_is_learnt_again() -> None:
    item, t = _page(), 0.0
    item.checked_at = 1.0
    for _ in range(200):  # never changes
        t += 100.0
        observe(item, t + 1, False, history=32)
    assert item.visits <= 32 and item_rate(item) == 0.0
    for _ in range(40):  # now changes at every look
        t += 100.0
        observe(item, t + 1, True, history=32)
    assert item_rate(item) > 1 / 100.0


def test_the_interval_rule_gives_slow_pages_less_than_proportional_visits() -> None:
    i0 = 3600.0
    assert optimal_interval(1 / i0, i0) == pytest.approx(i0, rel=1e-6)  # a page changing once per I0: every I0
    slow, slower = optimal_interval(1 / (10 * i0), i0), optimal_interval(1 / (40 * i0), i0)
    assert slower / slow == pytest.approx(2.0, rel=0.1)  # I ~ 1/sqrt(λ) for slow pages
    assert optimal_interval(0.0, i0) == math.inf


def test_in_the_core_each_page_s_estimated_rate_converges_on_its_own() -> None:
    rng = random.Random(3)
    i0 = HOUR
    rates = [rng.uniform(0.25, 2.0) / i0 for _ in range(24)]
    run = run_core(
        rates,
        RevisitConfig("adaptive", i0, i0 / 10, 10 * i0, history=10_000),
        hosts=4,
        horizon_s=900 * i0,
        window_start_s=0.0,
        delay_s=1.0,
        store=MemoryStore(),
    )
    rows = {r.url: r for r in run.frontier.store.items() if r.kind is Kind.PAGE}
    for i, lam in enumerate(rates):
        row = rows[page_url(i, 4)]
        assert row.visits > 300
        assert item_rate(row) == pytest.approx(lam, rel=0.3), (i, row.visits, row.changes)


# ---------------------------------------------------------------------------------------------- freshness


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_adaptive_keeps_pages_fresher_than_fixed_at_equal_fetch_counts(seed: int) -> None:
    rng = random.Random(seed)
    i0 = HOUR
    # a mixed web: a quarter never change, the rest from once per 20 minutes to once per 20 days
    rates = [0.0 if rng.random() < 0.25 else math.exp(rng.uniform(math.log(1 / (480 * i0)), math.log(3 / i0)))
             for _ in range(240)]  # fmt: skip
    horizon, window = 120 * i0, 60 * i0
    common = dict(hosts=12, horizon_s=horizon, window_start_s=window, delay_s=1.0, seed=seed)
    adaptive = run_core(rates, RevisitConfig("adaptive", i0, i0 / 4, 16 * i0), **common)  # type: ignore[arg-type]
    interval = equal_cost_interval(len(rates), adaptive.window_fetches, horizon - window)
    fixed = run_core(rates, RevisitConfig("fixed", interval, interval, interval), **common)  # type: ignore[arg-type]
    assert fixed.window_fetches == pytest.approx(adaptive.window_fetches, rel=0.03)
    assert adaptive.freshness > fixed.freshness, (adaptive.freshness, fixed.freshness)


# ---------------------------------------------------------------------------------------------- the journal


def test_the_journal_alone_rebuilds_due_times_and_change_histories() -> None:
    rng = random.Random(11)
    rates = [rng.choice([0.0, 1 / 600.0, 1 / 3000.0, 1 / 20_000.0]) for _ in range(30)]
    run = run_core(rates, RevisitConfig("adaptive", 1200.0, 60.0, 20_000.0), hosts=3, horizon_s=50_000.0,
                   window_start_s=0.0, store=MemoryStore())  # fmt: skip
    store = run.frontier.store
    assert isinstance(store, MemoryStore)
    replayed = replay(store.entries)
    checked = 0
    for row in store.items():
        if row.kind is not Kind.PAGE or row.checked_at == 0:
            continue
        again = replayed[row.key]
        assert again.state is row.state and again.item is not None
        for name in ("due_at", *REVISIT_FIELDS):
            assert getattr(again.item, name) == getattr(row, name), (row.key, name)
        checked += 1
    assert checked == 30


def test_a_restarted_core_keeps_every_due_time_and_leases_nothing_early() -> None:
    clock, store = VirtualClock(), MemoryStore()
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig("fixed", 100, 1, 1000))
    f = Frontier(store, clock, config)
    f.discover([Link(f"http://h{i % 3}.example/p{i}") for i in range(9)])
    fetched = _fetch_all(f, clock)
    assert fetched == 9
    due = {r.key: r.due_at for r in store.items() if r.kind is Kind.PAGE}
    assert len(set(due.values())) > 1  # fetched at different times: different due times
    # the process dies; a new core reads the store
    clock.advance(50)
    g = Frontier(store, clock, config)
    assert g.next_event_in() is not None and not g.drained
    leased: dict[str, float] = {}
    while clock.now() < min(due.values()) + 200:
        for it in g.lease("w", 100):
            leased.setdefault(it.key, clock.now())
            g.complete(it.key, it.generation, Outcome(status=304))
        clock.advance(0.1)
    assert set(leased) == set(due)
    for key, at in leased.items():
        assert due[key] <= at < due[key] + 1.0


def _fetch_all(f: Frontier, clock: VirtualClock) -> int:
    """Lease and complete for 20 virtual seconds (robots 404, pages 200 with an ETag); pages fetched."""
    pages = 0
    for _ in range(200):
        for it in f.lease("w", 100):
            if it.kind is Kind.ROBOTS:
                f.complete(it.key, it.generation, Outcome(status=404))
            else:
                pages += 1
                f.complete(it.key, it.generation, Outcome(status=200, body_digest=f"d:{it.key}", etag='"1"'))
        clock.advance(0.1)
    return pages


# ---------------------------------------------------------------------------------------------- what a revisit finds


def _one_page(policy: str = "fixed", **kw: float) -> tuple[Frontier, VirtualClock, MemoryStore]:
    clock, store = VirtualClock(), MemoryStore()
    revisit = RevisitConfig(policy, kw.get("interval", 100.0), kw.get("low", 10.0), kw.get("high", 1000.0),
                            retention_s=kw.get("retention", 5000.0))  # fmt: skip
    f = Frontier(store, clock, FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), revisit=revisit))
    f.discover([Link("http://a.example/page")])
    robots = f.lease("w", 10)[0]
    f.complete(robots.key, robots.generation, Outcome(status=404))
    return f, clock, store


def _visit(f: Frontier, clock: VirtualClock, outcome: Outcome) -> Item:
    """Wait for the page's next lease, answer it with `outcome`; the row after."""
    for _ in range(100_000):
        items = f.lease("w", 10)
        if items:
            (it,) = items
            f.complete(it.key, it.generation, outcome)
            row = f.store.get(it.key)
            assert row is not None
            return row
        clock.advance(1.0)
    raise AssertionError("the page was never leased again")


def test_each_outcome_of_a_revisit_is_told_apart_and_a_404_twice_retires_the_page() -> None:
    f, clock, store = _one_page(retention=500.0)
    row = _visit(f, clock, Outcome(status=200, body_digest="sha256:a", simhash=0xF0F0, etag='"a"', evidence="rec-a"))
    assert row.state is State.FETCHED and row.stored_at == clock.now()
    row = _visit(f, clock, Outcome(status=304, etag='"a"', evidence="rev-1"))
    assert (row.reason, row.evidence, row.digest, row.changes) == ("revisit:not_modified", "rec-a", "sha256:a", 0)
    row = _visit(f, clock, Outcome(status=200, body_digest="sha256:a", simhash=0xF0F0, etag='"a2"', evidence="r2"))
    assert (row.reason, row.evidence, row.etag) == ("revisit:unchanged", "rec-a", '"a2"')
    row = _visit(f, clock, Outcome(status=200, body_digest="sha256:b", simhash=0xF0F3, evidence="rec-b"))
    assert (row.reason, row.evidence, row.digest, row.changes) == ("revisit:near_duplicate", "rec-b", "sha256:b", 0)
    row = _visit(f, clock, Outcome(status=200, body_digest="sha256:c", simhash=0x0F0F0F0F, evidence="rec-c"))
    assert (row.reason, row.changes, row.visits) == ("revisit:changed", 1, 4)
    row = _visit(f, clock, Outcome(status=404, evidence="rec-404"))
    before = clock.now()
    assert (row.state, row.reason) == (State.FETCHED, "revisit:missing")
    assert row.due_at == pytest.approx(clock.now() + 10.0)  # confirmed soon: at the minimum interval
    assert row.evidence == "rec-c"  # the stored body is still the last one
    row = _visit(f, clock, Outcome(status=410))
    assert (row.state, row.reason) == (State.FAILED, "gone")
    assert clock.now() - before == pytest.approx(10.0, abs=1.0)
    assert f.revisit_stats().outcomes == {
        "not_modified": 1, "unchanged": 1, "near_duplicate": 1, "changed": 1, "missing": 1, "gone": 1,
    }  # fmt: skip
    # retention: the gone page is pruned, row and journal lines, when the retention period is over
    clock.advance(499)
    f.tick()
    assert store.get(row.key) is not None
    clock.advance(2)
    f.tick()
    assert store.get(row.key) is None and store.history(row.key) == []
    assert f.stats().urls_by_state.get("failed", 0) == 0


def test_a_page_missing_once_that_answers_again_is_not_gone() -> None:
    f, clock, _ = _one_page()
    _visit(f, clock, Outcome(status=200, body_digest="sha256:a", etag='"a"', evidence="rec-a"))
    assert _visit(f, clock, Outcome(status=404)).reason == "revisit:missing"
    row = _visit(f, clock, Outcome(status=304, etag='"a"'))
    assert (row.state, row.status, row.reason, row.evidence) == (State.FETCHED, 200, "revisit:not_modified", "rec-a")
    assert _visit(f, clock, Outcome(status=404)).reason == "revisit:missing"  # one 404 again is not two


def test_attempts_count_the_tries_of_one_visit_so_a_page_revisited_often_still_retries_a_503() -> None:
    f, clock, store = _one_page()
    _visit(f, clock, Outcome(status=200, body_digest="sha256:a", etag='"a"'))
    for _ in range(f.config.retry.max_attempts + 1):  # more visits than one visit has attempts
        row = _visit(f, clock, Outcome(status=304, etag='"a"'))
        assert (row.state, row.attempt) == (State.FETCHED, 1)
    row = _visit(f, clock, Outcome(status=503))
    assert (row.state, row.attempt) == (State.RETRYABLE, 1)
    row = _visit(f, clock, Outcome(status=304, etag='"a"'))
    assert (row.state, row.attempt, row.reason) == (State.FETCHED, 2, "revisit:not_modified")
    again = replay(store.journal())[row.key]
    assert (again.state, again.attempt) == (row.state, row.attempt)


def test_a_page_that_fails_on_a_revisit_keeps_its_row_and_loses_its_history_after_the_retention() -> None:
    f, clock, store = _one_page(retention=1000.0)
    _visit(f, clock, Outcome(status=200, body_digest="sha256:a"))
    _visit(f, clock, Outcome(status=200, body_digest="sha256:b"))
    row = None
    for _ in range(10):  # 403 is an answer (a change); then 500s until the retries are exhausted
        row = _visit(f, clock, Outcome(status=500))
        if row.state is State.FAILED:
            break
    assert row is not None and row.state is State.FAILED and row.reason.startswith("retries_exhausted")
    assert row.visits == 1
    clock.advance(1001)
    f.tick()
    row = store.get(row.key)
    assert row is not None and row.state is State.FAILED
    assert (row.visits, row.changes, row.watched_s, row.due_at) == (0, 0, 0, 0)
    assert [e.event for e in store.history(row.key)][-1] == "prune"


def test_adaptive_backs_a_static_page_off_to_the_maximum_and_chases_a_changing_one() -> None:
    f, clock, _ = _one_page("adaptive", interval=100.0, low=10.0, high=1600.0)
    f.discover([Link("http://a.example/news")])
    version = {"http://a.example/page": 0, "http://a.example/news": 0}
    intervals: dict[str, list[float]] = {k: [] for k in version}
    start = clock.now()
    while clock.now() - start < 40_000:
        for it in f.lease("w", 10):
            if it.url.endswith("news"):
                version[it.url] += 1  # changes between any two looks
            v = version[it.url]
            f.complete(it.key, it.generation, Outcome(status=200, body_digest=f"sha256:{it.url}{v}",
                                                      simhash=(hash((it.url, v)) & 0xFFFFFFFF) << 32 | 1))  # fmt: skip
            row = f.store.get(it.key)
            assert row is not None
            intervals[it.url].append(row.interval_s)
        clock.advance(1.0)
    static, news = intervals["http://a.example/page"], intervals["http://a.example/news"]
    assert static[-1] == 1600.0  # doubled up to the maximum
    assert static[: SHORT + 1] == [100.0, 200.0, 400.0, 800.0]
    assert 50 <= news[-1] <= 200  # about the initial interval: it changes at every look
    assert len(news) > 8 * len(static)


# ---------------------------------------------------------------------------------------------- one host's queue


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_due_revisits_and_new_urls_share_a_host_by_the_configured_share(share: float) -> None:
    clock, store = VirtualClock(), MemoryStore()
    config = FrontierConfig(
        politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig("fixed", 50, 1, 100, share=share)
    )
    f = Frontier(store, clock, config)
    f.discover([Link(f"http://a.example/old{i}") for i in range(12)])
    _fetch_all(f, clock)
    clock.advance(100)  # all 12 revisits due
    f.discover([Link(f"http://a.example/new{i}") for i in range(12)])
    kinds = []
    for _ in range(12):
        (it,) = f.lease("w", 10)
        kinds.append("revisit" if "old" in it.url else "new")
        f.complete(it.key, it.generation, Outcome(status=304))
    assert kinds.count("revisit") == round(12 * share)
    if 0 < share < 1:  # interleaved, not in a block: neither waits for the other to run dry
        assert "new" in kinds[:4] and "revisit" in kinds[:4]


def test_within_a_host_a_refetch_goes_first_then_the_page_most_probably_changed() -> None:
    clock, store = VirtualClock(), MemoryStore()
    config = FrontierConfig(
        politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig("fixed", 100, 1, 1000), window=4
    )
    f = Frontier(store, clock, config)
    f.discover([Link(f"http://a.example/p{i}") for i in range(3)])
    _fetch_all(f, clock)
    # give p1 a history of changing often and p2 of never changing
    for row in list(store.items()):
        if row.url.endswith("p1"):
            row.visits, row.changes, row.watched_s, row.changed_s = 10, 9, 1000, 900
        if row.url.endswith("p2"):
            row.visits, row.watched_s = 10, 1000
        store.rows[row.key] = row
    f.refetch("http://a.example/p0", clock.now() + 150)
    clock.advance(200)
    order = []
    for _ in range(3):
        (it,) = f.lease("w", 10)
        order.append(it.url.rsplit("/", 1)[1])
        f.complete(it.key, it.generation, Outcome(status=304))
    assert order == ["p0", "p1", "p2"]
    assert f.revisit_stats().revisits == 3


# ---------------------------------------------------------------------------------------------- administration


def test_refetch_brings_a_one_shot_page_back_at_the_time_asked_and_refuses_what_it_cannot() -> None:
    clock, store = VirtualClock(), MemoryStore()
    f = Frontier(store, clock, FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0)))
    f.discover([Link("http://a.example/x"), Link("http://a.example/bad")])
    robots = f.lease("w", 10)[0]
    f.complete(robots.key, robots.generation, Outcome(status=404))
    for _ in range(2):
        (it,) = f.lease("w", 10)
        ok = Outcome(status=200, etag='"e"', evidence="rec-x")
        f.complete(it.key, it.generation, ok if it.url.endswith("x") else Outcome(error_class="too_large"))
    assert f.drained  # policy off: a one-shot crawl ends
    key, state, due = f.refetch("http://A.example/x#frag", clock.now() + 60)
    assert (key, state, due) == ("http://a.example/x", "fetched", clock.now() + 60)
    assert not f.drained
    clock.advance(59)
    assert f.lease("w", 10) == []
    clock.advance(1)
    (it,) = f.lease("w", 10)
    assert (it.key, it.etag, it.evidence, it.checked_at > 0) == ("http://a.example/x", '"e"', "rec-x", True)
    assert f.refetch("http://a.example/x", clock.now())[1:] == ("leased", 0.0)  # already going: left alone
    with pytest.raises(KeyError):
        f.refetch("http://a.example/never-seen", clock.now())
    with pytest.raises(ValueError, match="failed"):
        f.refetch("http://a.example/bad", clock.now())


def test_per_host_and_per_domain_overrides_apply_at_the_next_check_and_survive_a_restart() -> None:
    clock, store = VirtualClock(), MemoryStore()
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0), revisit=RevisitConfig("fixed", 100, 1, 1000))
    f = Frontier(store, clock, config)
    f.discover([Link("http://www.a.example/1"), Link("http://img.a.example/1"), Link("http://b.example/1")])
    f.set_revisit_policy("a.example", domain=True, interval_s=300, max_s=300)
    f.set_revisit_policy("img.a.example", policy="off")
    with pytest.raises(ValueError, match="min"):
        f.set_revisit_policy("b.example", min_s=5000)
    _fetch_all(f, clock)
    rows = {r.host: r for r in store.items() if r.kind is Kind.PAGE}
    assert rows["www.a.example"].due_at - rows["www.a.example"].checked_at == 300
    assert rows["img.a.example"].due_at == 0  # off: fetched once
    assert rows["b.example"].due_at - rows["b.example"].checked_at == 100
    g = Frontier(store, clock, config)
    assert g.revisit_config("www.a.example").interval_s == 300
    assert g.revisit_config("img.a.example").policy == "off"
    assert g.revisit_config("b.example").interval_s == 100
    view = g.host("img.a.example")
    assert view is not None and view.revisit == "off"


def test_metrics_show_revisits_by_outcome_lag_due_pages_and_staleness() -> None:
    from prometheus_client import generate_latest

    from frontier_node.metrics import node_registry

    f, clock, _ = _one_page(interval=100.0)
    _visit(f, clock, Outcome(status=200, body_digest="sha256:a", etag='"a"'))
    _visit(f, clock, Outcome(status=304))
    _visit(f, clock, Outcome(status=200, body_digest="sha256:b"))
    clock.advance(500)  # due again, and waiting
    f.tick()
    text = generate_latest(node_registry(f.stats)).decode()  # the collector reads the core's stats snapshots
    assert 'hostring_node_revisits_total{outcome="not_modified"} 1.0' in text
    assert 'hostring_node_revisits_total{outcome="changed"} 1.0' in text
    assert 'hostring_node_revisits_total{outcome="gone"} 0.0' in text
    assert "hostring_node_revisit_lag_seconds_count 2.0" in text
    assert "hostring_node_revisits_due 1.0" in text
    staleness = next(line for line in text.splitlines() if line.startswith("hostring_node_estimated_staleness "))
    assert 0.0 < float(staleness.split()[1]) <= 1.0


def test_a_redirect_that_stays_a_redirect_is_unchanged_and_its_target_offered_again() -> None:
    f, clock, _ = _one_page()
    row = _visit(f, clock, Outcome(status=301, location="http://a.example/new"))
    assert row.state is State.FETCHED and row.status == 301
    for _ in range(3):
        (it,) = [it for it in _lease_when_due(f, clock) if it.kind is Kind.PAGE]
        done = f.complete(it.key, it.generation, Outcome(status=301, location="http://a.example/new"),
                          [Link("http://a.example/new", redirect_hops=1)])  # fmt: skip
        assert (done.reason, done.follow_links) == ("revisit:unchanged", True)
    row = f.store.get("http://a.example/page")
    assert row is not None and row.changes == 0 and row.interval_s == 100.0  # fixed policy


def _lease_when_due(f: Frontier, clock: VirtualClock) -> list[Item]:
    for _ in range(100_000):
        items = f.lease("w", 10)
        if any(it.url.endswith("/page") for it in items):
            return items
        for it in items:  # the redirect target, fetched on the way
            f.complete(it.key, it.generation, Outcome(status=404) if it.kind is Kind.ROBOTS else Outcome(status=200))
        clock.advance(1.0)
    raise AssertionError("never due")
