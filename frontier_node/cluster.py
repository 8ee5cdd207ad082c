"""A node's slice of the ring: answer ownership for the current epoch, and move domains when the ring changes.

On a new ring the node, holding the service lock so no call runs half in one epoch and half in the next:
forgets the domains it lost (their state stays in the shared store), then adopts the domains it gained by
claiming each one's fence at the new epoch — from then on the previous owner's writes are refused — and
loading the rows into the core (every claim in one round trip, the rows in a few: `RedisStore.adopt_domains`).
Leased rows keep their deadlines, so a host busy at the old owner is not leased again before that fetch ends or
expires (and a worker still holding it can complete it here), and adopted hosts rest one delay before their
next request.

A write refused by a newer owner's fence means the node lost a domain before its ring said so: it lets go
of the domain at once and answers wrong-owner for it until the next ring. A domain first written during a
handoff window (by an owner that had not yet seen the new ring) is picked up by `catch_up`, which the node
runs periodically.

Mail: links (and robots hops) that other nodes found for domains this node owns wait in the store's inboxes
(`frontier_node.store.redis.mail`). A thread of the slice polls the pending set every fraction of a second,
adopts any owned domain it does not hold yet, admits the mail as Discover would, commits, and only then deletes
it. The poll also reads the store's instance marker: a store that lost its data (StoreLost) is logged once by
name and turns the node's health to NOT_SERVING; the shell answers data-plane calls UNAVAILABLE from then on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Fenced, StoreLost
from frontier_node.store.redis import RedisStore
from frontier_node.store.redis.bodies import RedisBodyIndex
from frontier_node.store.redis.mail import READ_COUNT, row_link
from hostring.ring import EMPTY_RING, Ring
from hostring.thread_names import name_os_thread

log = logging.getLogger("hostring.node")

MAIL_POLL_S = 0.2
"""How often the slice looks for mail when it found none the last time (at once again when it found some)."""
_OWNED_CACHE = 1_000_000
"""Domains whose ownership a node remembers per ring before it starts over."""
_NAMED = 50
"""Domains a let-go log line names (tests match them against the ring's moves)."""


class Slice:
    """Ownership of one node at the newest ring it has seen, the handoffs between rings, and its mail."""

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
        self._owned_ring: Ring = EMPTY_RING
        self._owned: dict[str, bool] = {}
        self._frontier: Frontier | None = None
        self.bodies: RedisBodyIndex | None = None
        self.on_ready = on_ready
        self.fenced: set[str] = set()
        self.handoffs = 0
        self.moved_in = 0
        self.moved_out = 0
        self.mail_admitted = 0
        self.lost: StoreLost | None = None
        self._caught_up: tuple[int, int] = (-1, -1)  # (ring epoch, domains written) at the last full catch-up
        self._stop = threading.Event()
        self._mail_thread: threading.Thread | None = None

    @property
    def frontier(self) -> Frontier | None:
        return self._frontier

    @frontier.setter
    def frontier(self, frontier: Frontier | None) -> None:
        """Attach the core: its outbox is the store's (links other nodes own go to their inboxes) and its body
        index the cluster-wide one."""
        self._frontier = frontier
        if frontier is not None:
            self.bodies = RedisBodyIndex(
                self.store.client, self.store.namespace, frontier.config.near_duplicate_distance
            )
            frontier.attach_cluster(self.store, self.bodies)

    def owns(self, domain: str) -> bool:
        """Whether this node owns `domain` now; the ring's answers are remembered per ring (a ring lookup hashes
        the domain, and the core asks once per link)."""
        ring = self.ring
        if ring is not self._owned_ring or len(self._owned) > _OWNED_CACHE:
            self._owned_ring, self._owned = ring, {}
        owned = self._owned.get(domain)
        if owned is None:
            owned = self._owned[domain] = ring.owns(self.node_id, domain)
        return owned and domain not in self.fenced

    def epoch(self) -> int:
        return self.ring.epoch

    def apply(self, ring: Ring) -> None:
        """Switch to `ring`: release lost domains, adopt gained ones from the store (called on every new epoch)."""
        frontier = self.frontier
        assert frontier is not None, "attach the frontier before the first ring"
        if ring.epoch <= self.ring.epoch or self.lost is not None:
            return
        t0 = time.monotonic()
        try:
            with self.lock:
                self.store.flush()
                self.ring = ring
                self.fenced.clear()
                lost = {d for d in frontier.domains if not ring.owns(self.node_id, d)}
                frontier.release(lost)
                gained = self._adopt_owned()
                self._recount()
                self.lock.notify_all()
        except StoreLost as e:
            self.store_lost(e)
            return
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
        self._start_mail()

    def let_go(self, domains: Iterable[str]) -> None:
        """A newer owner's fence refused our writes for `domains`: forget those still held now (the service lock
        is held). A refusal can land after this node's own ring update released the domain (a flush in flight
        across the handoff); that domain is fenced again, and not counted or logged a second time."""
        assert self.frontier is not None
        domains = set(domains)
        self.fenced |= domains
        held = domains & self.frontier.domains
        if not held:
            return
        self.frontier.release(held)
        self._recount()
        self.moved_out += len(held)
        log.info("let go of %d domain(s) early, fenced by a newer owner: %s", len(held), sorted(held)[:_NAMED])

    def catch_up(self) -> int:
        """Adopt domains this node owns but does not hold (first written during a handoff); how many.

        The domain names are read outside the service lock (at 10k domains the read takes ~20 ms, and every call
        would wait for it), and not at all while their number and the ring's epoch are what the last complete
        catch-up saw: the set only grows, and a domain first written during a handoff grows it. Also checks that
        the store still holds this node's data (StoreLost otherwise, logged and re-raised).
        """
        if self.frontier is None or not self.ring.members or self.lost is not None:
            return 0
        try:
            self.store.check()
            seen = (self.ring.epoch, self.store.written_domain_count())
            if seen == self._caught_up:
                return 0
            domains = self.store.written_domains()
            with self.lock:
                gained = self._adopt_owned(domains)
                if gained:
                    self._recount()
                    self.moved_in += gained
                    self.lock.notify_all()
            self._caught_up = seen
        except StoreLost as e:
            self.store_lost(e)
            raise
        if gained:
            log.info("ring epoch %d: adopted %d domain(s) written during a handoff", self.ring.epoch, gained)
        return gained

    def store_lost(self, error: StoreLost) -> None:
        """The store lost data: log it once by name, stop serving (health NOT_SERVING) and stop polling mail."""
        if self.lost is not None:
            return
        self.lost = error
        self._stop.set()
        log.error(
            "store_lost: %s. This node stops serving (health NOT_SERVING): its queue and leases are gone with the "
            "data. Restore Redis from its append-only file (or start a new crawl) and restart the nodes.",
            error.reason,
        )
        self.on_ready(False)

    def stop(self) -> None:
        """Stop polling mail (the node is shutting down)."""
        self._stop.set()
        thread = self._mail_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # ------------------------------------------------------------------ adoption

    def _adopt_owned(self, domains: set[str] | None = None) -> int:
        """Adopt the domains this node owns and does not hold, of `domains` (default: every domain written, this
        store's buffered writes flushed first); how many. The lock is held."""
        frontier = self.frontier
        assert frontier is not None
        if domains is None:
            domains = self.store.all_domains()
        held = frontier.domains
        return self._adopt(sorted(d for d in domains if self.owns(d) and d not in held))

    def _adopt(self, domains: list[str]) -> int:
        """Claim and load `domains` into the core (the lock is held); how many."""
        frontier = self.frontier
        assert frontier is not None
        for adopted in self.store.adopt_domains(domains, self.ring.epoch):
            frontier.adopt(adopted.items, adopted.robots, {adopted.domain: adopted.breaches})
            frontier.hold(adopted.domain)
        return len(domains)

    def _recount(self) -> None:
        """Per-state totals from the store's counters of the held domains: exact after writes were refused."""
        assert self.frontier is not None
        self.frontier.recount(self.store.counts_by_state())

    # ------------------------------------------------------------------ mail

    def _start_mail(self) -> None:
        if self._mail_thread is None and not self._stop.is_set():
            self._mail_thread = threading.Thread(target=self._mail_loop, name=f"mail-{self.node_id}", daemon=True)
            self._mail_thread.start()

    def _mail_loop(self) -> None:
        name_os_thread()
        wait = MAIL_POLL_S
        failures = 0
        while not self._stop.wait(wait):
            if self.store.closed:
                return
            try:
                got = self.drain_mail()
                failures = 0
            except StoreLost as e:
                self.store_lost(e)
                return
            except Exception:
                if self.store.closed:
                    return
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.exception("reading the inbox failed (%d time(s) in a row); trying again", failures)
                got = 0
            wait = 0.0 if got else MAIL_POLL_S

    def drain_mail(self) -> int:
        """Admit the mail waiting for domains this node owns; the number of messages handled.

        Mail is deleted only after what it brought was committed; mail of a domain whose commit a newer owner
        refused stays for that owner.
        """
        frontier = self.frontier
        if frontier is None or not self.ring.members or self.lost is not None:
            return 0
        mine = {d for d in self.store.pending_mail() if self.owns(d)}
        if not mine:
            return 0
        mail = self.store.mail.read(mine)
        handled: dict[str, list[str]] = {}
        with self.lock:
            mine = {d for d in mine if self.owns(d)}
            todo = sorted(d for d in mine if d not in frontier.domains)
            if todo:
                self.moved_in += self._adopt(todo)
                self._recount()
            for domain in sorted(mine):
                for entry_id, message in mail.get(domain, []):
                    self._deliver(frontier, domain, message)
                    handled.setdefault(domain, []).append(entry_id)
            try:
                self.store.flush()
            except Fenced as e:
                refused = {e.domain, *(o.domain for o in e.others)}
                self.let_go(refused)
                for domain in refused:
                    handled.pop(domain, None)
            self.lock.notify_all()
        drained = [d for d in mine if len(mail.get(d, [])) < READ_COUNT and d in handled]
        self.store.mail.ack(handled, drained + [d for d in mine if not mail.get(d)])
        count = sum(len(ids) for ids in handled.values())
        self.mail_admitted += count
        return count

    def _deliver(self, frontier: Frontier, domain: str, message: dict[str, object]) -> None:
        kind = message.get("t")
        if kind == "links":
            rows = message.get("l")
            if isinstance(rows, list):
                frontier.discover([row_link(r) for r in rows])
            return
        if isinstance(kind, str) and kind.startswith("robots_"):
            frontier.robots_mail(message)
            return
        log.warning("mail for %s of an unknown kind %r dropped", domain, kind)
