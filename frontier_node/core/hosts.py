"""One host's back queue and politeness clock: a small in-RAM window over the store, and when it may go next."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from frontier_node.core.config import PolitenessConfig
from frontier_node.core.records import Item

if TYPE_CHECKING:
    from frontier_node.core.robots import RobotsRecord


@dataclass(slots=True)
class Host:
    """Politeness state and back queue of one host (the politeness unit).

    The queue is ordered by (priority, seq). At most `window` items live in RAM; `overflow` more are in the
    store, all ordered after `watermark` — the invariant that lets a refill be one range scan.
    """

    name: str
    domain: str
    window: list[tuple[int, int, str]] = field(default_factory=list)
    items: dict[str, Item] = field(default_factory=dict)
    overflow: int = 0
    watermark: tuple[int, int] = (-(2**62), -1)
    in_flight: int = 0
    concurrency: int = 0
    min_delay_s: float = -1.0
    next_eligible: float = 0.0
    backoff: float = 1.0
    latency_s: float = 0.0
    failures: int = 0
    paused: bool = False
    gave_up: str = ""
    ip: str = ""
    robots: dict[str, RobotsRecord] = field(default_factory=dict)
    robots_items: dict[str, Item] = field(default_factory=dict)
    fetched: int = 0
    errors: int = 0
    heap_version: int = 0
    heap_at: float = 0.0
    in_heap: bool = False
    # Revisits (core/revisit_items.py): due revisits in RAM (scheduled, at most a window of them), pages past
    # their revisit time waiting for room in that window (due, key: still fetched in the store), and the
    # credit that shares leases between revisits and new URLs while both wait.
    revisits: dict[str, Item] = field(default_factory=dict)
    revisit_wait: list[tuple[float, str]] = field(default_factory=list)
    revisit_credit: float = 0.0

    @property
    def queued(self) -> int:
        """Scheduled items of this host, in RAM and in the store."""
        return len(self.items) + self.overflow + len(self.revisits)

    def has_work(self) -> bool:
        return (
            bool(self.items)
            or self.overflow > 0
            or bool(self.revisits)
            or bool(self.revisit_wait)
            or any(it.state.value == "scheduled" for it in self.robots_items.values())
        )

    # ------------------------------------------------------------------ queue

    def push(self, item: Item, window: int) -> bool:
        """Queue a scheduled item; returns False when it belongs in the store only (beyond the window)."""
        order = item.order
        if self.overflow and order > self.watermark:
            self.overflow += 1
            return False
        heapq.heappush(self.window, (order[0], order[1], item.key))
        self.items[item.key] = item
        if order > self.watermark:
            self.watermark = order
        if len(self.items) > window:
            self._evict_last()
        return True

    def _evict_last(self) -> None:
        """Send the last item of the window back to the store and lower the watermark to the new last one."""
        last = max(self.window)
        self.window.remove(last)
        heapq.heapify(self.window)
        del self.items[last[2]]
        self.overflow += 1
        self.watermark = max(self.window)[:2] if self.window else (last[0], last[1] - 1)

    def peek(self) -> Item | None:
        """The next item in queue order, or None when the window is empty (a refill may be due)."""
        while self.window:
            key = self.window[0][2]
            item = self.items.get(key)
            if item is not None:
                return item
            heapq.heappop(self.window)
        return None

    def pop(self, key: str) -> Item:
        """Take `key` (the current head) off the queue."""
        heapq.heappop(self.window)
        return self.items.pop(key)

    def refill(self, rows: list[Item], limit: int) -> None:
        """Load the next rows from the store into the window (due revisits, scheduled too, have their own)."""
        taken = 0
        for row in rows:
            self.watermark = row.order
            if row.key in self.revisits:
                continue
            heapq.heappush(self.window, (row.priority, row.seq, row.key))
            self.items[row.key] = row
            taken += 1
        self.overflow = max(0, self.overflow - taken) if len(rows) == limit else 0

    # ------------------------------------------------------------------ politeness

    def delay(self, policy: PolitenessConfig) -> float:
        """Seconds between the end of one request and the start of the next."""
        base = self.min_delay_s if self.min_delay_s >= 0 else policy.min_delay_s
        crawl_delay = 0.0
        for record in self.robots.values():  # a loop, not max() over a generator: this runs twice per fetch
            if record.crawl_delay and record.crawl_delay > crawl_delay:
                crawl_delay = record.crawl_delay
        slow = self.latency_s >= policy.slow_response_s or self.backoff > 1.0
        rest = policy.response_factor * self.latency_s if slow else 0.0
        d = max(base, min(crawl_delay, policy.crawl_delay_cap_s), rest)
        return min(policy.max_delay_s, d * self.backoff) if d > 0 else 0.0

    def limit(self, policy: PolitenessConfig) -> int:
        return self.concurrency if self.concurrency > 0 else policy.concurrency

    def on_response(self, response_s: float, now: float, policy: PolitenessConfig) -> None:
        """A healthy response: recover slowly, watch for rising latency, rest for the delay."""
        rising = (
            self.latency_s > 0
            and response_s > policy.latency_rise * self.latency_s
            and response_s >= policy.rise_floor_s
        )
        self._observe(response_s)
        if rising:
            self.backoff = min(policy.max_backoff, self.backoff * policy.backoff_step)
        else:
            self.backoff = max(1.0, self.backoff * policy.recovery)
        self.failures = 0
        self.next_eligible = max(self.next_eligible, now + self.delay(policy))

    def _observe(self, response_s: float) -> None:
        """Fold one fetch's duration into the host's recent response time (an exponential average)."""
        self.latency_s = response_s if self.latency_s == 0 else 0.7 * self.latency_s + 0.3 * response_s

    def on_trouble(self, now: float, retry_after_s: float, policy: PolitenessConfig, response_s: float = 0.0) -> None:
        """429, 5xx or a timeout: back off this host only; honour Retry-After within bounds.

        `response_s` (> 0) is how long the troubled fetch took, a timeout's whole wait included: it counts in
        the host's response time like a healthy answer's, so a host that stops answering rests factor x that
        time, not only its delay (its request may still be running on the server)."""
        if response_s > 0:
            self._observe(response_s)
        self.backoff = min(policy.max_backoff, self.backoff * policy.backoff_step)
        self.failures += 1
        wait = self.delay(policy)
        if retry_after_s >= 0:
            wait = max(wait, min(retry_after_s, policy.retry_after_cap_s))
        self.next_eligible = max(self.next_eligible, now + wait)
