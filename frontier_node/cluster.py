"""A node's slice of the ring: answer ownership for the current epoch, and move domains when the ring changes.

On a new ring the node, holding the service lock so no call runs half in one epoch and half in the next:
forgets the domains it lost (their state stays in the shared store), then adopts the domains it gained by
claiming each one's fence at the new epoch — from then on the previous owner's writes are refused — and
loading the rows into the core. Leased rows keep their deadlines, so a host busy at the old owner is not
leased again before that fetch ends or expires, and adopted hosts rest one delay before their next request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from frontier_node.core.frontier import Frontier
from frontier_node.store.redis import RedisStore
from hostring.ring import EMPTY_RING, Ring

log = logging.getLogger("hostring.node")


class Slice:
    """Ownership of one node at the newest ring it has seen, and the handoffs between rings."""

    def __init__(self, node_id: str, store: RedisStore, lock: threading.Condition,
                 on_ready: Callable[[bool], None] = lambda ready: None) -> None:
        self.node_id = node_id
        self.store = store
        self.lock = lock
        self.ring: Ring = EMPTY_RING
        self.frontier: Frontier | None = None
        self.on_ready = on_ready
        self.handoffs = 0
        self.moved_in = 0
        self.moved_out = 0

    def owns(self, domain: str) -> bool:
        return self.ring.owns(self.node_id, domain)

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
            me = self.node_id
            lost = {d for d in frontier.domains if not ring.owns(me, d)}
            counts: Counter[str] = Counter()
            for domain in lost:
                counts.update(self.store.domain_counts(domain))
            frontier.release(lost, dict(counts))
            gained = sorted(d for d in self.store.all_domains() if ring.owns(me, d) and d not in frontier.domains)
            for domain in gained:
                adopted = self.store.adopt_domain(domain, ring.epoch)
                frontier.adopt(adopted.items, adopted.robots)
                frontier.domains.add(domain)
            self.store.flush()
            self.lock.notify_all()
        self.handoffs += 1
        self.moved_in += len(gained)
        self.moved_out += len(lost)
        log.info("ring epoch %d: %d members, released %d domains, adopted %d, in %.3fs", ring.epoch,
                 len(ring.members), len(lost), len(gained), time.monotonic() - t0)
        self.on_ready(me in ring.members)
