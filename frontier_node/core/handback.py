"""Work handed back and refusals looked at again: what lets a stopped or crashed crawl resume without loss.

- A lease handed back (`release`): a worker stopping hands back the fetches it will not finish, and a resumed
  crawl hands back the leases of its dead predecessor, instead of letting them sit until their deadline. The item
  is scheduled again at once, its host rests one delay (a request may have reached it) but is not backed off.
  An item's first MAX_FREE_HANDBACKS hand-backs in a run are not tries; later ones are, so that a worker handing
  back every lease it gets cannot keep one URL cycling leased -> scheduled forever.
- A lease taken back (`take_back`): the node answered the call that made it with an error (its commit failed), so
  no worker holds it; it is scheduled again at once, not as a try, its host not rested.
- A policy refusal looked at again (`reconsider`): items that the network policy or the scope refused are not
  the URL's fault, so a run under a wider policy schedules them again; a scope refusal only if the scope of
  this run now admits the link.

`Handback` is mixed into `Frontier`, which owns the state; these are the transitions `release` and
`reconsider` of the table in `states.py`, journaled like every move.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

from mypy_extensions import trait

from frontier_node.core.budgets import Budgets
from frontier_node.core.config import FrontierConfig
from frontier_node.core.front import FrontLayer
from frontier_node.core.hosts import Host
from frontier_node.core.journal import pack_admit
from frontier_node.core.leases import LeaseBook
from frontier_node.core.ports import Store
from frontier_node.core.records import Item, Kind
from frontier_node.core.robots_items import remote_home
from frontier_node.core.states import Event, State
from hostring.clock import Clock
from hostring.urls import robots_url

# The outcome a worker reports for a fetch it will not finish because it is stopping: a hand-back, not a failure.
HANDED_BACK = "worker_shutdown"
# Reason classes (the part before the first ':') of refusals an operator can lift by widening a policy.
POLICY_REFUSALS = frozenset({"network_policy", "out_of_scope"})
_REFUSED_STATES = (State.FAILED, State.SUPPRESSED, State.REJECTED)
MAX_FREE_HANDBACKS = 3
"""Hand-backs of one item in one run that are not tries (its attempt is given back, 4d8af37). An honest hand-back
comes from a worker stopping, or from a release of a gone worker's leases: one item meets a few of those in a run
(workers restarted one after another, an operator's release), and a stop must not cost it the retries a struggling
server needs. A worker that hands back every lease it gets (a bug, or hostile) would keep one URL cycling
leased -> scheduled without end, and the crawl, if that is its only worker, from ever draining: past this many, a
hand-back keeps its attempt (a try), and one that finds the item's tries spent fails it, as a last retryable error
would (retries_exhausted:<reason>; robots_unavailable:<reason> for a robots.txt, which abandons its origin). So a page
is leased at most MAX_FREE_HANDBACKS + retry.max_attempts times by hand-backs alone.

The count lives in RAM (Frontier._handbacks) and starts again when the node restarts: a restart is rare and the
bound still holds within each run."""
_HANDBACKS_LIMIT = 1 << 16
"""Items whose hand-backs a node counts at once (~200 B each, ~13 MB at most; an item leaves the count when it ends
or its domain leaves the node). When full, a hand-back of an item not counted yet is a try: the bound holds whatever
a worker does, at the price of an honest stop's free pass, which only a node with this many items handed back and
not yet ended pays."""


@trait
class Handback:
    """Releasing leases and reconsidering policy refusals; part of the Frontier."""

    # What the Frontier provides.
    _config: FrontierConfig
    _front: FrontLayer
    _leases: LeaseBook
    _store: Store
    _budgets: Budgets
    _abandoned: dict[str, str]
    _domains: set[str]
    _handbacks: dict[str, tuple[int, str]]
    _events: Counter[str]
    _clock: Clock
    _now: float

    def owns(self, domain: str) -> bool:
        raise NotImplementedError

    def _set_now(self, now: float) -> None:
        raise NotImplementedError

    def _move(self, item: Item, event: Event, reason: str = "", evidence: str = "", data: str = "") -> None:
        raise NotImplementedError

    def _refusal(self, host: str, domain: str, redirect_hops: int) -> str:
        raise NotImplementedError

    def _known_robots_home(self, item: Item) -> Host | None:
        raise NotImplementedError

    def _admit_robots(self, host: Host, origin: str) -> None:
        raise NotImplementedError

    def _enqueue(self, item: Item, window: int) -> None:
        raise NotImplementedError

    def _requeue(self, host: Host, item: Item) -> None:
        raise NotImplementedError

    def _robots_home(self, item: Item) -> Host:
        raise NotImplementedError

    def _abandon(self, host: Host, origin: str, reason: str) -> None:
        raise NotImplementedError

    def _robots_tries_spent(self, item: Item) -> bool:
        raise NotImplementedError

    def _read_backlogs(self, hosts: Iterable[Host | None]) -> None:
        raise NotImplementedError

    def _forget_backlogs(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ leases handed back

    def release_leases(self, worker_id: str = "", *, every_worker: bool = False, reason: str = "released") -> int:
        """Hand back every current lease of `worker_id` (or every lease, with every_worker); how many.

        A lease's holder is the worker named when it was granted (the reason of its `lease` journal line). These
        hand-backs count towards MAX_FREE_HANDBACKS like a stopping worker's: an operator releasing a worker that
        takes leases and never finishes them would make the same endless cycle. A resumed crawl's release of its
        predecessor's leases is a new run's first hand-back of each, free.
        """
        if not worker_id and not every_worker:
            raise ValueError("name a worker_id, or release every worker's leases")
        chosen = [it for it in self._leases.current() if every_worker or it.reason == worker_id]
        for item in chosen:
            self._hand_back(item, reason)
        return len(chosen)

    def take_back(self, items: Iterable[Item], reason: str = "unanswered") -> int:
        """Leases whose call was answered with an error (its commit failed): no worker holds them, so each still
        current is scheduled again at once, its try given back and not counted as a hand-back, its host not rested
        (no request was made); how many. Else a store's blip held their hosts until the leases expired."""
        taken = 0
        self._set_now(self._clock.now())
        for item in items:
            if self._leases.leased(item.key) is not item:
                continue  # settled or leased again since
            host = self._let_go(item)
            item.attempt = max(0, item.attempt - 1)
            self._move(item, Event.RELEASE, reason)
            self._requeue(host, item)
            self._wake(item, host)
            taken += 1
        return taken

    def _let_go(self, item: Item) -> Host:
        """Settle `item`'s lease and free its slot on its host (a release, counted); the host."""
        self._leases.settle(item.key)
        host = self._front.host(item.host, item.domain)
        self._front.free_slot(host)
        self._events["released"] += 1
        return host

    def _wake(self, item: Item, host: Host) -> None:
        """Wake the host a released item freed (and, for a robots.txt fetched for another host, that one too)."""
        front = self._front
        front.wake_now(host)
        if item.kind is Kind.ROBOTS and item.source and item.source != item.host:
            front.wake_now(front.host(item.source, item.domain))

    def _hand_back(self, item: Item, reason: str) -> None:
        """One leased item back to scheduled now: its slot freed, its host resting one delay, not backed off.

        The item's first MAX_FREE_HANDBACKS hand-backs in this run are not counted as tries: the attempt is given
        back, so the next lease has the same number. (Else a page handed back twice, by workers stopping, failed
        retries_exhausted at its first 503, and a robots.txt handed back three times failed at its first timeout and
        abandoned its origin's pages.) A later hand-back keeps its attempt, and one that finds the item's tries
        spent fails it: `retries_exhausted:<reason>`, or for a robots.txt `robots_unavailable:<reason>` with its
        origin abandoned, as when its last retryable fetch fails."""
        now = self._clock.now()
        self._set_now(now)
        counts = self._handbacks
        counted = counts.get(item.key)
        times = 1 if counted is None else counted[0] + 1
        tracked = counted is not None or len(counts) < _HANDBACKS_LIMIT  # full: an item not counted yet pays
        free = tracked and times <= MAX_FREE_HANDBACKS
        fails = not free and self._tries_spent(item)
        # A robots file failing abandons its origin, whose queue may lie in the store: read before any change.
        abandons = fails and item.kind is Kind.ROBOTS and remote_home(item.key) is None
        if abandons:
            self._read_backlogs([self._known_robots_home(item)])
        try:
            if tracked:
                counts[item.key] = (times, item.domain)  # forgotten when the item ends (Frontier._move)
            host = self._let_go(item)
            host.next_eligible = max(host.next_eligible, now + host.delay(self._config.politeness))
            if free:
                item.attempt = max(0, item.attempt - 1)
            else:
                self._events["handbacks_counted"] += 1
            if fails:
                self._fail_handed_back(item, host, reason, abandons)
            else:
                self._move(item, Event.RELEASE, reason)
                self._requeue(host, item)
            self._wake(item, host)
        finally:
            if abandons:
                self._forget_backlogs()

    def _tries_spent(self, item: Item) -> bool:
        """Whether the item's attempts are at its limit: the next retryable failure would fail it."""
        if item.kind is Kind.ROBOTS:
            return self._robots_tries_spent(item)
        return item.attempt >= self._config.retry.max_attempts

    def _fail_handed_back(self, item: Item, host: Host, reason: str, abandons: bool) -> None:
        """End an item handed back once too often, as its last retryable failure would have."""
        if item.kind is Kind.PAGE:
            self._move(item, Event.FAIL, f"retries_exhausted:{reason}")
            return
        self._move(item, Event.FAIL, f"robots_unavailable:{reason}")
        if not abandons:  # a hop fetched for another node's origin: that node's lease expires, and it fetches again
            host.robots_items.pop(item.key, None)
            return
        home = self._robots_home(item)
        if host is not home:
            host.robots_items.pop(item.origin, None)
        # Its origin's pages wait for this file: without it they would wait forever.
        self._abandon(home, item.origin, "robots_unavailable")

    # ------------------------------------------------------------------ refusals reconsidered

    def reconsider(self, reasons: Collection[str] = POLICY_REFUSALS) -> Counter[str]:
        """Schedule again the terminal items a policy named in `reasons` refused; the count by reason class.

        `reasons` are reason classes from POLICY_REFUSALS. A network-policy refusal is scheduled again as it is
        (the fetcher applies the policy, and refuses it again if it still says no); a scope refusal only if this
        run's scope admits the link now. Items of domains this node does not own are left alone.
        """
        unknown = set(reasons) - POLICY_REFUSALS
        if unknown:
            raise ValueError(f"not policy refusals: {sorted(unknown)} (known: {sorted(POLICY_REFUSALS)})")
        self._set_now(self._clock.now())
        done: Counter[str] = Counter()
        rows = [it for it in self._store.items(_REFUSED_STATES) if _reason_class(it.reason) in reasons]
        robots = [it for it in rows if it.kind is Kind.ROBOTS]
        for item in robots:  # robots files first: the origin stops being abandoned before its pages come back
            if self.owns(item.domain):
                self._reconsider_robots(self._live(item), done)
        for item in rows:
            if item.kind is Kind.PAGE and self.owns(item.domain):
                self._reconsider_page(item, done)
        return done

    def _live(self, row: Item) -> Item:
        """The core's own object for a robots item the store returned a row of (the home host may hold it)."""
        home = self._known_robots_home(row)
        held = home.robots_items.get(row.origin) if home is not None else None
        return held if held is not None and held.key == row.key else row

    def _reconsider_robots(self, item: Item, done: Counter[str]) -> None:
        why = _reason_class(item.reason)
        home_name = item.source or item.host
        home = self._front.host(home_name, item.domain)
        if item.host != home_name:
            hop = self._front.get(item.host)
            if hop is not None and hop.robots_items.get(item.origin) is item:
                del hop.robots_items[item.origin]
        item.url, item.host, item.redirect_hops, item.source = robots_url(item.origin), home_name, 0, ""
        item.attempt = 0  # the tries before the refusal belong to the run that refused it
        self._move(item, Event.RECONSIDER, f"reconsidered:{why}", data=pack_admit(item))
        home.robots_items[item.origin] = item
        home.robots.pop(item.origin, None)  # the refusal's "disallow all" record would hold its pages back
        if self._abandoned.get(item.origin, "").split(":")[0] == why:
            del self._abandoned[item.origin]
        self._domains.add(item.domain)
        self._front.wake(home, self._now)
        done[why] += 1

    def _reconsider_page(self, item: Item, done: Counter[str]) -> None:
        why = _reason_class(item.reason)
        if why == "out_of_scope":
            if self._refusal(item.host, item.domain, item.redirect_hops):
                return
            if self._budgets.check(item.url, item.host, item.domain, item.depth) is not None:
                return
            self._budgets.charge(item.url, item.host, item.domain)
        item.attempt = 0  # the tries before the refusal belong to the run that refused it
        self._move(item, Event.RECONSIDER, f"reconsidered:{why}")
        self._front.host(item.host, item.domain).domain = item.domain  # a host first known by a robots record has none
        self._enqueue(item, self._config.window)
        done[why] += 1


def _reason_class(reason: str) -> str:
    return reason.split(":")[0].split(" ")[0]
