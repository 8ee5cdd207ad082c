"""The core's public surface: typed methods and frozen views, its state private."""

from __future__ import annotations

import dataclasses

import pytest

from frontier_node.core.config import FrontierConfig, PolitenessConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.records import Kind, Link, Outcome
from frontier_node.store.memory import MemoryStore
from hostring.clock import VirtualClock

CONFIG = FrontierConfig(politeness=PolitenessConfig(min_delay_s=2.0), lease_s=10.0)


def _crawl_start() -> tuple[Frontier, VirtualClock]:
    """Two hosts with two pages each; their robots files fetched (404: allow all)."""
    clock = VirtualClock()
    f = Frontier(MemoryStore(), clock, CONFIG)
    f.discover([Link(f"http://{h}.a.example/p{i}") for h in ("www", "img") for i in range(2)])
    for item in f.lease("w", 10):
        assert item.kind is Kind.ROBOTS
        f.complete(item.key, item.generation, Outcome(status=404, response_s=0.1))
    return f, clock


def test_the_state_of_the_core_is_private() -> None:
    f, _ = _crawl_start()
    # A compiled Frontier (scripts/native.py) has no __dict__: mypyc lists its attributes instead.
    attributes = getattr(type(f), "__mypyc_attrs__", None) or vars(f)
    assert [name for name in attributes if not name.startswith("_")] == []


def test_views_are_frozen() -> None:
    f, _ = _crawl_start()
    views: list[object] = [f.stats(), f.host("www.a.example"), *f.hosts(), f.coverage_input()]
    for view in views:
        assert dataclasses.is_dataclass(view)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(view, dataclasses.fields(view)[0].name, None)


def test_host_view_carries_the_public_eligibility() -> None:
    f, clock = _crawl_start()
    host = f.host("WWW.a.example.")  # any case, trailing dot
    assert host is not None and host.name == "www.a.example" and host.domain == "a.example"
    assert host.queued == 2 and host.in_flight == 0 and host.concurrency == 1
    assert host.next_eligible_s == pytest.approx(2.0)  # rests min_delay after its robots fetch
    assert host.robots == (("http://www.a.example", "allow_all(404)"),)
    clock.advance(2.5)
    assert f.host("www.a.example").next_eligible_s == pytest.approx(-0.5)  # type: ignore[union-attr]
    assert f.host("nowhere.example") is None


def test_hosts_longest_queue_first_and_limited() -> None:
    f, clock = _crawl_start()
    clock.advance(3)
    leased = f.lease("w", 1)
    assert len(leased) == 1
    names = [h.name for h in f.hosts()]
    assert names[0] != leased[0].host and set(names) == {"www.a.example", "img.a.example"}
    assert len(f.hosts(limit=1)) == 1
    assert f.stats().hosts_with_work == 2 and f.stats().hosts_ready == 1


def test_leased_domain_answers_only_for_a_current_lease() -> None:
    f, clock = _crawl_start()
    clock.advance(3)
    item = f.lease("w", 1)[0]
    assert f.leased_domain(item.key) == "a.example"
    f.complete(item.key, item.generation, Outcome(status=200, body_digest="sha256:1"))
    assert f.leased_domain(item.key) is None
    assert f.leased_domain("http://unknown.example/") is None


def test_stats_count_states_events_and_verdicts() -> None:
    f, _ = _crawl_start()
    f.discover([Link("http://www.a.example/p0"), Link("mailto:x@y")])
    s = f.stats()
    assert s.urls_by_state["scheduled"] == 4 and s.urls_by_state["fetched"] == 2 and s.queued == 4
    assert s.leases_granted == 2 and s.leases_expired == 0 and s.completes_stale == 0
    assert s.discovered_by_verdict["admitted"] == 4 and s.discovered_by_verdict["duplicate"] == 1
    assert s.owned_domains == 1 and s.hosts == 2 and s.seen == 6 and s.in_flight == 0


def test_held_domains_and_recount_are_the_cluster_slice_s_levers() -> None:
    f, _ = _crawl_start()
    assert f.domains == frozenset({"a.example"})
    f.hold("b.example")
    assert "b.example" in f.domains
    f.recount({"scheduled": 0, "fetched": 2})
    assert f.drained and f.stats().urls_by_state == {"scheduled": 0, "fetched": 2}
    f.release({"a.example"})
    assert f.domains == frozenset({"b.example"}) and f.host("www.a.example") is None


def test_a_page_refused_for_its_redirect_chain_is_scheduled_by_a_short_link_until_its_domain_leaves() -> None:
    """A link at hop 6 of a redirect chain is rejected; a later direct link schedules that page. Once the node
    releases the page's domain (a handoff), its refusals are no longer its own to reconsider."""
    from frontier_node.core.records import Verdict

    core = Frontier(MemoryStore(), VirtualClock(), FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0)))
    (far,) = core.discover([Link("http://a.example/x", redirect_hops=6)])
    assert (far.verdict, far.reason) == (Verdict.REJECTED, "too_many_redirects")
    (near,) = core.discover([Link("http://a.example/x", redirect_hops=0)])
    assert near.verdict is Verdict.ADMITTED
    core.discover([Link("http://b.example/y", redirect_hops=6)])
    core.release({"b.example"})
    (after,) = core.discover([Link("http://b.example/y", redirect_hops=0)])
    assert after.verdict is Verdict.DUPLICATE, "a released domain's refusal was reconsidered from a stale item"
