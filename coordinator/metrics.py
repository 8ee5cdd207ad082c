"""Prometheus metrics of the coordinator (`hostring_coordinator_*`): members, the ring epoch, and the ring changes
and the domains they moved, counted when each change is committed (not by comparing scrapes)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.membership import Membership
from hostring.metrics import register_build_info
from hostring.ring import Ring

log = logging.getLogger("hostring.coordinator")


class CoordinatorCollector(Collector):
    """Counts each committed ring change as it happens (with Redis, also the domains whose owner it changed, by
    ring math over the domains the nodes registered), and reads membership at scrape time."""

    def __init__(self, membership: Membership, client: redis.Redis | None = None, namespace: str = "hostring"):
        self.membership = membership
        self.client = client
        self.domains_key = f"{namespace}:{{all}}:domains"
        self._lock = threading.Lock()
        self.ring_changes = 0
        self.moved = 0
        membership.listeners.append(self.on_change)

    def on_change(self, old: Ring, new: Ring) -> None:
        """A committed ring change: count it, and the domains it moves from one owner to another."""
        moved = 0
        if self.client is not None and old.members:
            try:
                raw = self.client.smembers(self.domains_key)
                moved = len(old.moved(new, [d.decode() if isinstance(d, bytes) else str(d) for d in raw]))
            except redis.RedisError as e:
                log.warning("could not count the domains epoch %d moves: %s", new.epoch, e)
        with self._lock:
            self.ring_changes += 1
            self.moved += moved

    def collect(self) -> Iterator[Metric]:
        statuses = self.membership.statuses()
        members = GaugeMetricFamily("hostring_coordinator_members", "Ring members by health", labels=["healthy"])
        members.add_metric(["true"], sum(1 for s in statuses if s.healthy))
        members.add_metric(["false"], sum(1 for s in statuses if not s.healthy))
        yield members
        yield GaugeMetricFamily("hostring_coordinator_ring_epoch", "Current ring epoch", value=self.membership.epoch)
        with self._lock:
            changes, moved = self.ring_changes, self.moved
        yield CounterMetricFamily(
            "hostring_coordinator_ring_changes", "Ring changes (epochs) committed by this coordinator", value=changes
        )
        yield CounterMetricFamily(
            "hostring_coordinator_domains_moved",
            "Domains whose owner the committed ring changes moved (of the domains the nodes registered)",
            value=moved,
        )


def coordinator_registry(membership: Membership, client: redis.Redis | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(CoordinatorCollector(membership, client))
    register_build_info(registry, "coordinator")
    return registry
