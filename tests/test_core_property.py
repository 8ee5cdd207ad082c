"""The scheduler core against a brute-force BFS oracle over random webs, on a virtual clock."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontier_node.core.config import BudgetConfig, FrontierConfig, PolitenessConfig, RetryConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind
from frontier_node.core.states import TERMINAL, State
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock
from tests.simweb import _check_replay, _path_of, oracle, random_web, simulate

MIN_DELAY = 0.5

CONFIG = FrontierConfig(
    politeness=PolitenessConfig(min_delay_s=MIN_DELAY, give_up_after=10_000),
    retry=RetryConfig(max_attempts=4, base_s=1.0, robots_max_attempts=4, max_expiries=50),
    budgets=BudgetConfig(max_depth=None, max_pages_per_host=None, max_pages_per_domain=None),
    lease_s=5.0,
    window=2,  # tiny, so refills from the store are exercised constantly
)


def run(seed: int, hosts: int, pages: int, check_replay: bool = False):
    rng = random.Random(seed)
    model = random_web(rng, hosts=hosts, pages=pages)
    clock = VirtualClock()
    store = MemoryStore()
    frontier = Frontier(store, clock, CONFIG, rng=random.Random(seed))
    trace = simulate(frontier, clock, model, rng, check_replay=check_replay)
    return model, store, frontier, trace


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), hosts=st.integers(1, 6), pages=st.integers(1, 12))
def test_fetches_exactly_the_reachable_allowed_pages(seed: int, hosts: int, pages: int) -> None:
    model, store, frontier, trace = run(seed, hosts, pages)
    want_fetched, want_failed = oracle(model)

    got_fetched = {pid for pid, n in trace.successes.items() if n}
    assert got_fetched == want_fetched
    # each page succeeded once; extra attempts are all explained by journaled retries or lease expiries
    assert all(n == 1 for n in trace.successes.values())
    rows = {r.key: r for r in store.items()}
    for key, attempts in trace.attempts.items():
        explained = sum(1 for e in store.history(key) if e.event in ("retry", "expire", "fail", "redirect"))
        assert attempts <= 1 + explained, key
    # what failed for good is exactly what the model makes fail
    failed_pages = {_path_of(r.url) for r in rows.values() if r.kind is Kind.PAGE and r.state is State.FAILED}
    assert failed_pages == want_failed
    # every identity ends terminal (nothing left scheduled, leased or waiting)
    assert all(r.state in TERMINAL for r in rows.values())
    assert frontier.drained


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), hosts=st.integers(1, 4), pages=st.integers(2, 8))
def test_politeness_is_never_violated(seed: int, hosts: int, pages: int) -> None:
    _, _, _, trace = run(seed, hosts, pages)
    for host, reqs in trace.requests.items():
        reqs.sort()
        for (_, e1, _), (s2, _, u2) in itertools.pairwise(reqs):
            assert s2 >= e1, f"two requests at once on {host}"
            assert s2 - e1 >= MIN_DELAY - 1e-6, f"{host}: {u2} started {s2 - e1:.3f}s after the previous ended"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_one_body_kept_per_digest(seed: int) -> None:
    _, store, _, _ = run(seed, 3, 8)
    digests = Counter(
        r.digest for r in store.items() if r.state is State.FETCHED and r.digest and r.reason != "duplicate_body"
    )
    assert all(n == 1 for n in digests.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_journal_replay_equals_live_state_at_random_cut_points(seed: int) -> None:
    _, _, frontier, trace = run(seed, 3, 6, check_replay=True)
    _check_replay(frontier)  # and once more at the very end
    assert trace.replay_checks >= 0  # the cut points are random; the end is always checked
