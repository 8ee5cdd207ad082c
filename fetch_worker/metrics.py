"""Prometheus metrics of a fetch worker (`hostring_worker_*`): durations, sizes, outcomes, fetches in flight,
refused addresses, fetches cut off by a lost lease; each observed as the fetch ends."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fetch_worker.fetch import FetchResult
from hostring.metrics import register_build_info


class WorkerMetrics:
    """One registry per worker; `observe()` after each fetch."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        register_build_info(r, "worker")
        self.duration = Histogram(
            "hostring_worker_fetch_duration_seconds",
            "Whole fetch time, body included",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.size = Histogram(
            "hostring_worker_fetch_bytes",
            "Decoded body bytes per fetch",
            registry=r,
            buckets=(1024, 8192, 32768, 131072, 524288, 2097152, 8388608, 33554432),
        )
        self.outcomes = Counter(
            "hostring_worker_fetch_outcomes",
            "Fetches by outcome (HTTP status class or error class)",
            ["outcome"],
            registry=r,
        )
        self.in_flight = Gauge("hostring_worker_fetches_in_flight", "Fetches under way", registry=r)
        self.refused = Counter(
            "hostring_worker_refused_addresses", "Connections refused by the network policy", ["reason"], registry=r
        )
        self.leases_lost = Counter(
            "hostring_worker_leases_lost",
            "Fetches cut off because a renewal said the lease was gone (nothing archived or reported)",
            registry=r,
        )
        self.requests = 0
        """Requests made (robots.txt included; refused addresses are not contacted), for a crawl's summary."""

    def lease_lost(self) -> None:
        """A fetch cut off because its lease is gone: its request was made, its outcome is not observed."""
        self.requests += 1
        self.leases_lost.inc()

    def observe(self, result: FetchResult) -> None:
        if result.error_class != "network_policy":  # a refused address is never contacted
            self.requests += 1
        self.duration.observe(result.total_s)
        self.size.observe(result.decoded_bytes)
        if result.error_class:
            self.outcomes.labels(result.error_class).inc()
            if result.error_class == "network_policy":
                # "network policy refuses 'h' at 10.0.0.1: private (...)": the reason word after the last colon
                reason = result.error_detail.rsplit(": ", 1)[-1].split(" ")[0]
                self.refused.labels(reason if reason.isidentifier() else "refused").inc()
        else:
            self.outcomes.labels(f"{result.status // 100}xx").inc()
