"""The coverage report's counts add up, across restarts, and unfinished work says when it may go on.

A core on a SQLite file crawls a small generated set of outcomes, restarts halfway (as a resumed crawl does), and
the report of the live core and the report read offline from the file must agree with each other and with a
plain recount of the rows.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.offline_report import store_report
from frontier_node.report import coverage_report
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.5), lease_s=30.0, scope="domain")
OUTCOMES = {
    "ok": Outcome(status=200, response_s=0.01, content_type="text/html"),
    "gone": Outcome(status=404, response_s=0.01),
    "refused": Outcome(error_class="network_policy"),
    "busy": Outcome(status=503, response_s=0.01),
}


def check(report: dict[str, object]) -> None:
    by_state: dict[str, int] = report["by_state"]  # type: ignore[assignment]
    by_reason: dict[str, int] = report["by_reason"]  # type: ignore[assignment]
    assert report["admitted"] == sum(n for s, n in by_state.items() if s != "rejected")
    assert sum(by_reason.values()) == sum(by_state.values())
    per_state: Counter[str] = Counter()
    for key, n in by_reason.items():
        per_state[key.partition(":")[0]] += n
    assert dict(per_state) == by_state
    assert set(report["first_example"]) == set(by_reason)  # type: ignore[arg-type]
    rows = report.get("dispositions")
    if rows is not None:
        assert len(rows) == sum(by_state.values())  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=4, max_size=24), st.integers(min_value=1, max_value=20))
def test_counts_add_up_across_a_restart(tmp_path_factory: object, outcomes: list[str], restart_at: int) -> None:
    tmp = tmp_path_factory.mktemp("report")  # type: ignore[attr-defined]
    path = Path(tmp) / "f.sqlite3"
    clock = VirtualClock()
    store = SqliteStore(path)
    f = Frontier(store, clock, CONFIG)
    seeds = [Link("http://a.example/", seed=True), Link("http://b.example/", seed=True)]
    f.discover([*seeds, Link("http://a.example/", seed=True)])  # one duplicate
    pages = [f"http://{'ab'[i % 2]}.example/p{i}" for i in range(len(outcomes))]
    f.discover([Link(u) for u in pages] + [Link("http://elsewhere.example/")])  # one out of scope
    step = 0
    for _ in range(60):
        clock.advance(1.0)
        f.tick()
        for item in f.lease("w", 10):
            if item.kind is Kind.ROBOTS:
                f.complete(item.key, item.generation, Outcome(status=404))
                continue
            step += 1
            kind = outcomes[step % len(outcomes)]
            f.complete(item.key, item.generation, OUTCOMES[kind])
        store.flush()
        if step >= restart_at and restart_at:
            restart_at = 0
            store.close()
            store = SqliteStore(path)
            f = Frontier(store, clock, CONFIG)  # the resumed process
    live = coverage_report(f.coverage_input(), dispositions=True)
    check(live)
    verdicts = live["discovered_by_verdict"]
    assert verdicts["admitted"] == live["admitted"]  # counted by both processes
    assert verdicts["duplicate"] == 1 and verdicts["rejected:out_of_scope"] == 1
    store.flush()
    offline = store_report(path, dispositions=True)
    check(offline)
    for key in ("admitted", "by_state", "by_reason", "first_example", "discovered_by_verdict", "unresolved"):
        assert offline[key] == live[key], key
    store.close()


def test_unfinished_pages_say_what_they_wait_for_and_until_when(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = SqliteStore(tmp_path / "f.sqlite3")
    f = Frontier(store, clock, CONFIG)
    f.discover([Link("http://a.example/", seed=True), Link("http://a.example/2", seed=True)])
    (robots,) = f.lease("w", 10)
    f.complete(robots.key, robots.generation, Outcome(status=503, retry_after_s=120))
    report = coverage_report(f.coverage_input())
    items = {u["url"]: u for u in report["unresolved"]["items"]}
    assert set(items) == {"http://a.example/", "http://a.example/2"}
    for u in items.values():
        assert u["state"] == "scheduled"
        assert u["waits_for"] == "robots.txt (retryable: robots_503)"
        assert u["not_before"] >= clock.now() + 120
    store.close()
