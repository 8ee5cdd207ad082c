"""Prometheus metrics of the coordinator: members, the ring epoch, ring changes and the domains they moved."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.membership import Membership
from hostring.ring import EMPTY_RING


class CoordinatorCollector(Collector):
    """Reads membership at scrape time; with Redis, counts the domains each ring change moved (ring math)."""

    def __init__(self, membership: Membership, client: redis.Redis | None = None, namespace: str = "hostring"):
        self.membership = membership
        self.client = client
        self.domains_key = f"{namespace}:{{all}}:domains"
        self._lock = threading.Lock()
        self._last = EMPTY_RING
        self.handoffs = 0
        self.moved = 0

    def _observe(self) -> None:
        ring = self.membership.ring()
        with self._lock:
            if ring.epoch == self._last.epoch:
                return
            if self._last.epoch:
                self.handoffs += 1
                if self.client is not None:
                    domains = [
                        d.decode() if isinstance(d, bytes) else str(d) for d in self.client.smembers(self.domains_key)
                    ]
                    self.moved += len(self._last.moved(ring, domains))
            self._last = ring

    def collect(self) -> Iterator[Metric]:
        self._observe()
        statuses = self.membership.statuses()
        members = GaugeMetricFamily("hostring_members", "Ring members by health", labels=["healthy"])
        members.add_metric(["true"], sum(1 for s in statuses if s.healthy))
        members.add_metric(["false"], sum(1 for s in statuses if not s.healthy))
        yield members
        yield GaugeMetricFamily("hostring_ring_epoch", "Current ring epoch", value=self.membership.epoch)
        yield CounterMetricFamily("hostring_handoffs", "Ring changes seen by this coordinator", value=self.handoffs)
        yield CounterMetricFamily(
            "hostring_domains_moved", "Domains whose owner changed across ring changes", value=self.moved
        )


def coordinator_registry(membership: Membership, client: redis.Redis | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(CoordinatorCollector(membership, client))
    return registry
