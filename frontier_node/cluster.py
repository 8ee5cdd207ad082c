"""A node's slice of the ring: answer ownership for the current epoch, and move domains when the ring changes.

On a new ring the node, holding the service lock so no call runs half in one epoch and half in the next:
forgets the domains it lost (their state stays in the shared store), then adopts the domains it gained by
claiming each one's fence at the new epoch — from then on the previous owner's writes are refused — and
loading the rows into the core. Leased rows keep their deadlines, so a host busy at the old owner is not
leased again before that fetch ends or expires, and adopted hosts rest one delay before their next request.

A write refused by a newer owner's fence means the node lost a domain before its ring said so: it lets go
of the domain at once and answers wrong-owner for it until the next ring. A domain first written during a
handoff window (by an owner that had not yet seen the new ring) is picked up by `catch_up`, which the node
runs periodically.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from frontier_node.core.frontier import Frontier
from frontier_node.store.redis import RedisStore
from hostring.ring import EMPTY_RING, Ring

log = logging.getLogger("hostring.node")


class Slice:
    """Ownership of one node at the newest ring it has seen, and the handoffs between rings."""

    def __init__(
        self,
        node_id: str,
        store: RedisStore,
        lock: threading.Condition,
        on_ready: Callable[[bool], None] = lambda ready: None,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.lock = lock
        self.ring: Ring = EMPTY_RING
        self.frontier: Frontier | None = None
        self.on_ready = on_ready
        self.fenced: set[str] = set()
        self.handoffs = 0
        self.moved_in = 0
        self.moved_out = 0
        self._known = 0

    def owns(self, domain: str) -> bool:
        return domain not in self.fenced and self.ring.owns(self.node_id, domain)

    def epoch(self) -> int:
        return self.ring.epoch

    def apply(self, ring: Ring) -> None:
        """Switch to `ring`: release lost domains, adopt gained ones from the store (called on every new epoch)."""
        frontier = self.frontier
        assert frontier is not None, "attach the frontier before the first ring"
        if ring.epoch <= self.ring.epoch:
            return
        t0 = time.monotonic()
        with self.lock:
            self.store.flush()
            self.ring = ring
            self.fenced.clear()
            lost = {d for d in frontier.domains if not ring.owns(self.node_id, d)}
            frontier.release(lost)
            gained = self._adopt_owned()
            self._recount()
            self.lock.notify_all()
        self.handoffs += 1
        self.moved_in += gained
        self.moved_out += len(lost)
        log.info(
            "ring epoch %d: %d members, released %d domains, adopted %d, in %.3fs",
            ring.epoch,
            len(ring.members),
            len(lost),
            gained,
            time.monotonic() - t0,
        )
        self.on_ready(self.node_id in ring.members)

    def let_go(self, domains: Iterable[str]) -> None:
        """A newer owner's fence refused our writes for `domains`: forget them now (the service lock is held)."""
        assert self.frontier is not None
        domains = set(domains)
        self.fenced |= domains
        self.frontier.release(domains)
        self._recount()
        self.moved_out += len(domains)

    def catch_up(self) -> int:
        """Adopt domains this node owns but does not hold (first written during a handoff); how many."""
        if self.frontier is None or not self.ring.members:
            return 0
        with self.lock:
            gained = self._adopt_owned()
            if gained:
                self._recount()
                self.moved_in += gained
                self.lock.notify_all()
        if gained:
            log.info("ring epoch %d: adopted %d domain(s) written during a handoff", self.ring.epoch, gained)
        return gained

    def _adopt_owned(self) -> int:
        frontier = self.frontier
        assert frontier is not None
        domains = self.store.all_domains()
        self._known = len(domains)
        held = frontier.domains
        gained = sorted(d for d in domains if self.owns(d) and d not in held)
        for domain in gained:
            adopted = self.store.adopt_domain(domain, self.ring.epoch)
            frontier.adopt(adopted.items, adopted.robots)
            frontier.hold(domain)
        return len(gained)

    def _recount(self) -> None:
        """Per-state totals from the store's counters of the held domains: exact after writes were refused."""
        assert self.frontier is not None
        self.frontier.recount(self.store.counts_by_state())
