"""Prometheus metrics of a frontier node, read from the core at scrape time (nothing added to the hot path).

Every name starts with `hostring_node_` (workers use `hostring_worker_`, the coordinator `hostring_coordinator_`),
so that a sum over a whole cluster never adds one event counted by two roles. Counters are counted where the
event happens: in the core (verdicts, leases, robots fetches) and in the node's slice (domains moved in a handoff).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from frontier_node.core.revisit import Change, RevisitView
from hostring.metrics import register_build_info

if TYPE_CHECKING:
    from frontier_node.cluster import Slice
    from frontier_node.core.views import FrontierStats

_LEASE_EVENTS = {
    "granted": "lease",
    "completed": "completed",
    "expired": "lease_expired",
    "released": "released",
    "handback_counted": "handbacks_counted",  # a hand-back past handback.MAX_FREE_HANDBACKS: a try
    "stale": "late_evidence",
}


class NodeCollector(Collector):
    """Turns the core's counters and queues into metric families once per scrape, from the snapshot the core
    thread publishes (`stats`), never from the live core."""

    def __init__(self, stats: Callable[[], FrontierStats], slice_: Slice | None = None) -> None:
        self.stats = stats
        self.slice = slice_

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s.revisits is not None:
            yield from revisit_families(s.revisits)
        verdicts, events, states, breaches = s.verdicts, s.events, s.urls_by_state, s.breaches
        links = CounterMetricFamily(
            "hostring_node_links_discovered",
            "Links answered by Discover, by verdict and reason",
            labels=["verdict", "reason"],
        )
        for (verdict, reason), n in sorted(verdicts.items()):
            links.add_metric([verdict, reason], n)
        yield links
        urls = GaugeMetricFamily("hostring_node_urls", "Fetch keys by state", labels=["state"])
        for state, n in sorted(states.items()):
            urls.add_metric([state], n)
        yield urls
        leases = CounterMetricFamily("hostring_node_leases", "Lease events", labels=["event"])
        for label, key in _LEASE_EVENTS.items():
            leases.add_metric([label], events.get(key, 0))
        yield leases
        robots = CounterMetricFamily(
            "hostring_node_robots_fetches", "robots.txt fetches by status class", labels=["status_class"]
        )
        for key, n in sorted(events.items()):
            if key.startswith("robots_"):
                robots.add_metric([key.removeprefix("robots_")], n)
        yield robots
        budget = CounterMetricFamily(
            "hostring_node_budget_breaches", "Links suppressed by a budget rule", labels=["rule"]
        )
        for rule, n in sorted(breaches.items()):
            budget.add_metric([rule], n)
        yield budget
        yield CounterMetricFamily(
            "hostring_node_backoffs", "Times a host was backed off (429, 5xx, timeouts)", value=events.get("backoff", 0)
        )
        yield GaugeMetricFamily(
            "hostring_node_hosts_backed_off", "Hosts whose delay is multiplied by a backoff", value=s.hosts_backed_off
        )
        yield GaugeMetricFamily(
            "hostring_node_queue_depth", "Scheduled URLs (in RAM and in the store)", value=states.get("scheduled", 0)
        )
        yield GaugeMetricFamily("hostring_node_hosts_with_work", "Hosts with queued work", value=s.hosts_with_work)
        yield GaugeMetricFamily("hostring_node_hosts_ready", "Hosts that may be leased now", value=s.hosts_ready)
        yield GaugeMetricFamily(
            "hostring_node_owned_domains", "Registrable domains this node holds", value=s.owned_domains
        )
        if self.slice is not None:
            yield GaugeMetricFamily(
                "hostring_node_ring_epoch", "Ring epoch this node applies", value=self.slice.epoch()
            )
            yield CounterMetricFamily(
                "hostring_node_handoffs", "Ring changes this node applied", value=self.slice.handoffs
            )
            moved = CounterMetricFamily(
                "hostring_node_domains_moved",
                "Domains this node took over (in) or let go (out) in handoffs",
                labels=["direction"],
            )
            moved.add_metric(["in"], self.slice.moved_in)
            moved.add_metric(["out"], self.slice.moved_out)
            yield moved
        else:
            yield GaugeMetricFamily("hostring_node_ring_epoch", "Ring epoch this node applies", value=0)


def revisit_families(view: RevisitView) -> Iterator[Metric]:
    """Revisits by outcome, revisit lag, pages due now and pending, and the estimated staleness."""
    outcomes = CounterMetricFamily(
        "hostring_node_revisits", "Revisits by what they found", labels=["outcome"]
    )  # exposed as hostring_node_revisits_total
    for change in Change:
        outcomes.add_metric([change.value], view.outcomes.get(change.value, 0))
    yield outcomes
    cumulative, buckets = 0, []
    for bound, count in view.lag_buckets:
        cumulative += count
        buckets.append(("+Inf" if math.isinf(bound) else f"{bound:g}", cumulative))
    lag = HistogramMetricFamily("hostring_node_revisit_lag_seconds", "Seconds from a revisit's due time to its lease")
    lag.add_metric([], buckets, view.lag_sum_s)
    yield lag
    yield GaugeMetricFamily("hostring_node_revisits_due", "Pages due for a revisit now", value=view.due_now)
    yield GaugeMetricFamily(
        "hostring_node_revisits_pending", "Fetched pages waiting for a revisit time", value=view.pending
    )
    yield GaugeMetricFamily(
        "hostring_node_estimated_staleness",
        "Estimated fraction of revisited pages whose stored copy is out of date (from their change rates)",
        value=view.staleness,
    )


class StoreTimer:
    """A histogram of store flush latency; `with timer:` around each flush."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "hostring_node_store_latency_seconds",
            "Time to make a call's writes durable",
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self._t0 = 0.0

    def __enter__(self) -> StoreTimer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.histogram.observe(time.perf_counter() - self._t0)


def node_registry(
    stats: Callable[[], FrontierStats], slice_: Slice | None = None, registry: CollectorRegistry | None = None
) -> CollectorRegistry:
    """A registry of its own per node (several nodes may share a process in tests), or `registry` filled in."""
    registry = CollectorRegistry() if registry is None else registry
    registry.register(NodeCollector(stats, slice_))
    register_build_info(registry, "node")
    return registry
