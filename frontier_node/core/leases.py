"""Items out of their host queues for a while: leased to a worker until a deadline, or waiting out a retry.

Each table has a heap of (time, key, generation) beside it. Heap entries are never removed early: a renewal
pushes a newer deadline and a settled lease leaves its entry behind, so a popped entry counts only when its
item is still in the table with the same generation (and, for a lease, the same deadline).
"""

from __future__ import annotations

import heapq

from frontier_node.core.records import Item


class LeaseBook:
    """Leased items by key with their deadlines (and how many each holder has), and retryable items by key with their
    due times. A leased item's holder is its `reason` when it is lent (the lease's journal line names it)."""

    __slots__ = ("_deadlines", "_held", "_holders", "_leased", "_retries", "_waiting")

    def __init__(self) -> None:
        self._leased: dict[str, Item] = {}
        self._holders: dict[str, str] = {}  # key -> the holder it was lent to
        self._held: dict[str, int] = {}  # holder -> leases it has
        self._deadlines: list[tuple[float, str, int]] = []
        self._waiting: dict[str, Item] = {}
        self._retries: list[tuple[float, str, int]] = []

    # ------------------------------------------------------------------ leases

    def __len__(self) -> int:
        """Items on lease."""
        return len(self._leased)

    def leased(self, key: str) -> Item | None:
        return self._leased.get(key)

    def current(self) -> list[Item]:
        """Every item on lease now."""
        return list(self._leased.values())

    def held(self, holder: str) -> int:
        """Leases `holder` has now."""
        return self._held.get(holder, 0)

    def lend(self, item: Item) -> None:
        """`item` is out on lease until item.deadline, held by `item.reason`."""
        key, holder = item.key, item.reason
        if key in self._leased:
            self._drop_holder(key)
        self._leased[key] = item
        self._holders[key] = holder
        self._held[holder] = self._held.get(holder, 0) + 1
        heapq.heappush(self._deadlines, (item.deadline, key, item.generation))

    def extend(self, item: Item, deadline: float) -> None:
        item.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, item.key, item.generation))

    def settle(self, key: str) -> None:
        del self._leased[key]
        self._drop_holder(key)

    def _drop_holder(self, key: str) -> None:
        holder = self._holders.pop(key)
        left = self._held[holder] - 1
        if left:
            self._held[holder] = left
        else:
            del self._held[holder]

    def expired(self, now: float) -> Item | None:
        """The lease `pop_expired` would take next, left in the table (stale heap entries on top are dropped)."""
        deadlines, leased = self._deadlines, self._leased
        while deadlines and deadlines[0][0] <= now:
            _, key, generation = deadlines[0]
            item = leased.get(key)
            if item is not None and item.generation == generation and item.deadline <= now:
                return item
            heapq.heappop(deadlines)
        return None

    def pop_expired(self, now: float) -> Item | None:
        """Take one lease whose deadline has passed (<= now) out of the table, or None when none has."""
        item = self.expired(now)
        if item is not None:
            heapq.heappop(self._deadlines)
            del self._leased[item.key]
            self._drop_holder(item.key)
        return item

    # ------------------------------------------------------------------ retries

    def waiting(self, key: str) -> Item | None:
        return self._waiting.get(key)

    def wait(self, item: Item) -> None:
        """`item` waits out a retry until item.due_at."""
        self._waiting[item.key] = item
        heapq.heappush(self._retries, (item.due_at, item.key, item.generation))

    def pop_due(self, now: float) -> Item | None:
        """Take one retry that is due (<= now) out of the table, or None when none is."""
        retries, waiting = self._retries, self._waiting
        while retries and retries[0][0] <= now:
            _, key, generation = heapq.heappop(retries)
            item = waiting.get(key)
            if item is None or item.generation != generation:
                continue
            del waiting[key]
            return item
        return None

    def next_retry(self) -> Item | None:
        """The waiting retry due first, or None (stale heap entries on top are dropped)."""
        retries, waiting = self._retries, self._waiting
        while retries:
            _, key, generation = retries[0]
            item = waiting.get(key)
            if item is not None and item.generation == generation:
                return item
            heapq.heappop(retries)
        return None

    def waiting_of(self, host: str) -> list[Item]:
        """Every waiting retry of `host`."""
        return [it for it in self._waiting.values() if it.host == host]

    def take_waiting(self, host: str) -> list[Item]:
        """Take every waiting retry of `host` out of the table (the host gave up)."""
        items = self.waiting_of(host)
        for item in items:
            del self._waiting[item.key]
        return items

    # ------------------------------------------------------------------ both

    def next_at(self) -> float | None:
        """The earliest time on either heap (a stale entry may answer early: a wake-up too many, never one late)."""
        times = [heap[0][0] for heap in (self._retries, self._deadlines) if heap]
        return min(times) if times else None

    def forget(self, domains: set[str]) -> None:
        """Drop the leases and retries of `domains` (their heap entries go stale)."""
        for key in [k for k, it in self._leased.items() if it.domain in domains]:
            self.settle(key)
        for key in [k for k, it in self._waiting.items() if it.domain in domains]:
            del self._waiting[key]
