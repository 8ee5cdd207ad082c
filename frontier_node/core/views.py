"""What the core shows the shells: frozen records taken at one instant, never the core's live objects.

The gRPC service, the metrics collector and the coverage report read the core through these (and the core's
methods) only; a view taken under the service lock stays true to that instant after the lock is released.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from frontier_node.core.records import Item
from frontier_node.core.revisit import RevisitView


@dataclass(frozen=True, slots=True)
class HostView:
    """One host as GetHost, ListHosts and PauseHost report it: its queue, its politeness and its robots."""

    name: str
    domain: str
    queued: int  # scheduled items, in RAM and in the store
    in_flight: int
    concurrency: int  # its limit in flight (its own, else the node's)
    delay_s: float  # rest after each request, as it stands now (backoff and Crawl-delay included)
    min_delay_s: float  # its own minimum delay, else the node's
    backoff: float  # the factor its delay is multiplied by (1.0: not backed off)
    next_eligible_s: float  # seconds until it may go next (address pacing included); <= 0: it may go now
    paused: bool
    has_work: bool
    robots: tuple[tuple[str, str], ...]  # (origin, RobotsRecord.describe()) of each origin, by origin
    fetched: int
    errors: int
    revisits_due: int = 0  # pages due for a revisit now, waiting for the host's turn
    revisit: str = ""  # the host's revisit policy (revisit.describe)


@dataclass(frozen=True, slots=True)
class FrontierStats:
    """The node's counters and queue sizes at one instant (Stats RPC, /metrics, benchmarks)."""

    run_id: str
    urls_by_state: Mapping[str, int]  # every state counted so far, zeros included
    hosts: int
    hosts_with_work: int
    hosts_ready: int  # hosts that could be leased now
    hosts_backed_off: int  # hosts whose delay is multiplied by a backoff > 1
    in_flight: int
    queued: int  # scheduled items, in RAM and in the store
    queued_in_ram: int  # the part of `queued` held in the hosts' RAM windows
    seen: int  # fetch keys in the seen-set
    seen_bytes: int  # RAM the seen-set takes
    owned_domains: int
    verdicts: Mapping[tuple[str, str], int]  # Discover answers by (verdict, reason)
    events: Mapping[str, int]  # lease, completed, lease_expired, released, late_evidence, backoff, robots_2xx, ...
    breaches: Mapping[str, int]  # links suppressed, by budget rule
    next_ready_s: float | None = None  # until the earliest queued, retrying or revisit work may go (0: now; None: none)
    waiting_for: str = ""  # what that work waits for, when it is later than now (a retry, a host's delay)
    revisits: RevisitView | None = None  # revisit figures (outcomes, lag, due, staleness) for /metrics and Stats

    @property
    def discovered_by_verdict(self) -> dict[str, int]:
        """Discover answers keyed "verdict:reason" ("verdict" alone when there is no reason)."""
        return {f"{v}:{r}" if r else v: n for (v, r), n in self.verdicts.items()}

    @property
    def leases_granted(self) -> int:
        return self.events.get("lease", 0)

    @property
    def leases_expired(self) -> int:
        return self.events.get("lease_expired", 0)

    @property
    def completes_stale(self) -> int:
        return self.events.get("late_evidence", 0)


@dataclass(frozen=True, slots=True)
class CoverageInput:
    """What the coverage report is built from. A live node provides it (Frontier.coverage_input()); so does a
    store file read offline, which knows no budget breaches or Discover verdicts (those fields are None).
    """

    run_id: str
    items: Iterable[Item]  # every item row in first-write order; iterated once
    budget_breaches: Sequence[Mapping[str, object]] | None = None  # Budgets.report(): rule, pattern, example, ...
    verdicts: Mapping[tuple[str, str], int] | None = None  # Discover answers by (verdict, reason)
    revisits: RevisitView | None = None  # a live node's revisit figures
    revisit_outcomes: Mapping[str, int] | None = None  # revisits by outcome, counted from a store's journal
