"""robots.txt files as frontier items: admitted with an origin's first page, leased before its pages, followed
through redirects host by host, and settled into the origin's RobotsRecord (RFC 9309 §2.3).

A robots item is keyed ROBOTS_PREFIX + origin. While it follows a redirect its `host` is the hop's host (whose
queue and politeness it then uses) and its `source` the origin's own host, its home, where the record lands.
`RobotsItems` is mixed into `Frontier`, which owns the state and the transitions declared at the top.

In a cluster a redirect may lead to a host whose domain another node owns (and paces). The home node then
posts a hop message to that domain's owner (through the store's outbox) and keeps its item leased "to the
owner" until the answer comes back (or the lease expires, and robots.txt is fetched again). The owner admits a
hop item of its own, keyed ROBOTS_PREFIX + target URL + "#for=<origin>&gen=<generation>", fetches it under
that host's politeness (following further redirects the same way), and posts the outcome back to the origin's
domain, where the home node settles its item as if it had fetched the file itself.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple
from urllib.parse import parse_qs, urlencode

from mypy_extensions import trait

from frontier_node.core.config import FrontierConfig
from frontier_node.core.dedup import SeenSet, key_hash
from frontier_node.core.front import FrontLayer
from frontier_node.core.hosts import Host
from frontier_node.core.journal import pack_admit
from frontier_node.core.leases import LeaseBook
from frontier_node.core.ports import Outbox, Store
from frontier_node.core.records import Completion, Item, Kind, Outcome, OutcomeLike
from frontier_node.core.retry import OVERLOAD_STATUSES, Action, classify
from frontier_node.core.robots import MAX_ROBOTS_BYTES, RobotsPolicy, RobotsRecord, RobotsVerdict
from frontier_node.core.states import Event, State
from hostring.urls import ROBOTS_PREFIX, UrlIdentity, UrlRejected, domain_of, identify, robots_url

# A robots.txt redirecting to a host of a domain another node owns, in a cluster without an outbox.
ELSEWHERE = "robots_redirect_elsewhere"
_HOP_MARK = "#for="


class RobotsPlan(NamedTuple):
    """What a robots outcome leads to, decided before its completion changes anything (`_plan_robots`)."""

    hop: UrlIdentity | None
    """A redirect target to follow (on this node, or by the owner of its domain); None when there is none."""
    error_class: str
    """The outcome's error class, or ELSEWHERE for a redirect this node may not follow."""
    record: RobotsRecord | None
    """The origin's new record; None while a hop is followed, and for a hop fetched for another node's origin."""


def remote_home(key: str) -> tuple[str, int] | None:
    """(origin, generation at home) of a hop item fetched for another node's origin, from its key; else None."""
    at = key.find(_HOP_MARK)
    if not key.startswith(ROBOTS_PREFIX) or at < 0:
        return None
    fields = parse_qs(key[at + 1 :])
    try:
        return fields["for"][0], int(fields["gen"][0])
    except (KeyError, IndexError, ValueError):
        return None


@trait
class RobotsItems:
    """The robots part of the Frontier."""

    # What the Frontier provides.
    _config: FrontierConfig
    _front: FrontLayer
    _store: Store
    _seen: SeenSet
    _events: Counter[str]
    _robots_policy: RobotsPolicy
    _leases: LeaseBook
    _outbox: Outbox | None

    def owns(self, domain: str) -> bool:
        raise NotImplementedError

    def _move(self, item: Item, event: Event, reason: str = "", evidence: str = "", data: str = "") -> None:
        raise NotImplementedError

    def _next_seq(self) -> int:
        raise NotImplementedError

    def _abandon(self, host: Host, origin: str, reason: str) -> None:
        raise NotImplementedError

    def _retry_later(self, item: Item, now: float, reason: str, outcome: OutcomeLike) -> None:
        raise NotImplementedError

    def _read_backlogs(self, hosts: Iterable[Host | None]) -> None:
        raise NotImplementedError

    def _forget_backlogs(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ admission and dispatch

    def _admit_robots(self, host: Host, origin: str) -> None:
        """Admit and schedule the robots item of `origin` on its host (a new origin's first page came in)."""
        key = ROBOTS_PREFIX + origin
        robots = Item(key, robots_url(origin), host.name, origin, host.domain, Kind.ROBOTS, 0, -1, self._next_seq())
        self._seen.add(key_hash(key))
        self._move(robots, Event.ADMIT, data=pack_admit(robots))
        self._move(robots, Event.SCHEDULE)
        host.robots_items[origin] = robots

    def _robots_ready(self, host: Host) -> Item | None:
        """A robots item scheduled on this host's queue (its own origin's, or a redirect hop's), if any."""
        for robots in host.robots_items.values():
            if robots.state is State.SCHEDULED and robots.host == host.name:
                return robots
        return None

    def _robots_due(self, host: Host, origin: str) -> Item | None:
        """The robots item to lease before `origin`'s pages, or None while it is in flight or backing off."""
        robots = host.robots_items.get(origin)
        if robots is None:
            self._admit_robots(host, origin)
            robots = host.robots_items[origin]
        elif robots.state is State.FETCHED:
            robots.url, robots.host, robots.redirect_hops, robots.source = robots_url(origin), host.name, 0, ""
            robots.attempt = 0  # attempts count the tries of one fetch round, not the refetches of the origin's life
            self._move(robots, Event.REVISIT, "robots_expired", data=pack_admit(robots))
        return robots if robots.state is State.SCHEDULED and robots.host == host.name else None

    def _robots_home(self, item: Item) -> Host:
        """The host whose origin a robots item is for (it differs from item.host while following a redirect)."""
        return self._front.host(item.source or item.host, item.domain)

    def _known_robots_home(self, item: Item) -> Host | None:
        """`_robots_home` if the front holds it, without creating it (None: no queue of it to read or drain)."""
        return self._front.get(item.source or item.host)

    @staticmethod
    def _robots_slot(item: Item) -> str:
        """The item's key in its host's robots_items: its origin, or its own key for a hop fetched for another
        node (two of those may wait on one host for the same origin)."""
        return item.key if _HOP_MARK in item.key else item.origin

    # ------------------------------------------------------------------ completion

    def _plan_robots(self, item: Item, outcome: OutcomeLike, now: float) -> RobotsPlan:
        """Decide, changing nothing, what a robots outcome leads to: a hop to follow, or the origin's new record
        (the completion asks the store what that needs before it settles anything, see `_robots_drains`)."""
        status, error_class = outcome.status, outcome.error_class
        redirected = 300 <= status < 400 and bool(outcome.location) and not error_class
        if redirected and item.redirect_hops < self._config.max_redirect_hops:
            limit = self._config.budgets.max_url_length
            try:
                target: UrlIdentity | None = identify(outcome.location, item.url, max_length=limit)
            except UrlRejected:
                target = None  # an unusable target: read as the redirect it is (allow all)
            if target is not None and (self.owns(target.domain) or self._outbox is not None):
                return RobotsPlan(target, error_class, None)  # followed here, or by the owner of its domain
            if target is not None:
                # Another node paces that host and there is no outbox to hand it over: not followed, and not read
                # as "unavailable, allow all" either: the rules behind it are unknown.
                error_class = ELSEWHERE
        if remote_home(item.key) is not None:
            return RobotsPlan(None, error_class, None)
        record = self._robots_policy.from_outcome(
            item.origin, status=status, body=bytes(outcome.robots_body), error_class=error_class, now=now
        )
        return RobotsPlan(None, error_class, record)

    def _robots_drains(self, item: Item, status: int, plan: RobotsPlan) -> Host | None:
        """The home host whose queue settling this plan drains (its origin abandoned), if any."""
        if plan.record is None or not self._robots_gives_up(item, plan.record, status, plan.error_class):
            return None
        return self._known_robots_home(item)

    def _complete_robots(
        self, item: Item, host: Host, outcome: OutcomeLike, now: float, plan: RobotsPlan
    ) -> Completion:
        policy = self._config.politeness
        status, error_class, record = outcome.status, plan.error_class, plan.record
        item.status, item.evidence = status, outcome.evidence
        remote = remote_home(item.key)
        home = host if remote is not None else self._robots_home(item)
        hop = "" if plan.hop is None else self._robots_hop(item, host, home, plan.hop)
        if record is not None:
            home.robots[item.origin] = record
            self._store.save_robots(item.origin, home.name, record.to_dict())
        self._events[f"robots_{status // 100}xx" if status else "robots_no_response"] += 1
        # Pace after the record is in place, so the file's own Crawl-delay governs the very next request.
        if error_class or status in OVERLOAD_STATUSES or status >= 500:
            self._events["backoff"] += 1
            host.on_trouble(now, outcome.retry_after_s, policy, outcome.response_s)
        else:
            host.on_response(outcome.response_s, now, policy)
        if hop:
            return Completion(True, item.state.value, False, hop)
        if remote is not None:
            return self._return_robots(item, host, outcome, error_class, remote)
        assert record is not None
        return self._settle_robots(item, host, home, record, error_class, outcome, now)

    def _robots_gives_up(self, item: Item, record: RobotsRecord, status: int, error_class: str) -> bool:
        """Whether an outcome ends a robots item for good, its origin abandoned: the rules are unknown ("disallow
        all") and the failure is final or its attempts are spent."""
        if record.verdict is not RobotsVerdict.DISALLOW_ALL:
            return False
        if classify(status, error_class).action is Action.FAIL:
            return True
        return self._robots_tries_spent(item)

    def _robots_tries_spent(self, item: Item) -> bool:
        """Whether a robots item's tries are spent: the leases of its redirect hops belong to the same try."""
        return item.attempt - item.redirect_hops >= self._config.retry.robots_max_attempts

    def _settle_robots(
        self,
        item: Item,
        host: Host,
        home: Host,
        record: RobotsRecord,
        error_class: str,
        outcome: OutcomeLike,
        now: float,
    ) -> Completion:
        """The robots item's end once its record is known: done, failed (origin abandoned) or retried later."""
        status = outcome.status
        reason = error_class or f"robots_{status}"
        if record.verdict is not RobotsVerdict.DISALLOW_ALL:
            self._move(item, Event.COMPLETE, reason, outcome.evidence)
        elif not self._robots_gives_up(item, record, status, error_class):
            self._retry_later(item, now, reason, outcome)
        elif classify(status, error_class).action is Action.FAIL:
            self._move(item, Event.FAIL, reason, outcome.evidence)
            self._abandon(home, item.origin, error_class or "robots_unavailable")
        else:
            self._move(item, Event.FAIL, f"robots_unavailable:{reason}", outcome.evidence)
            self._abandon(home, item.origin, "robots_unavailable")
        if item.state is not State.RETRYABLE and host is not home:
            host.robots_items.pop(item.origin, None)
        return Completion(True, item.state.value, False, reason)

    # ------------------------------------------------------------------ redirects to another node's hosts

    def _return_robots(
        self, item: Item, host: Host, outcome: OutcomeLike, error_class: str, remote: tuple[str, int]
    ) -> Completion:
        """A hop fetched for another node's origin ended: post what it answered to the origin's domain."""
        origin, generation = remote
        assert self._outbox is not None, "hop items exist only on nodes with an outbox"
        self._outbox.post(
            domain_of(origin),
            {
                "t": "robots_result",
                "key": ROBOTS_PREFIX + origin,
                "gen": generation,
                "status": outcome.status,
                "error_class": error_class,
                "retry_after_s": outcome.retry_after_s,
                "evidence": outcome.evidence,
                "url": item.url,
                "body": base64.b64encode(bytes(outcome.robots_body)[:MAX_ROBOTS_BYTES]).decode(),
            },
        )
        reason = f"robots_{outcome.status} for {origin}" if not error_class else f"{error_class} for {origin}"
        self._move(item, Event.COMPLETE, reason[:300], outcome.evidence)
        host.robots_items.pop(self._robots_slot(item), None)
        return Completion(True, item.state.value, False, reason)

    def robots_mail(self, message: Mapping[str, object]) -> None:
        """A robots message from another node: a hop to fetch here, or the outcome of one for an origin here."""
        kind = message.get("t")
        if kind == "robots_hop":
            self._admit_hop(message)
        elif kind == "robots_result":
            self._robots_result(message)

    def _admit_hop(self, message: Mapping[str, object]) -> None:
        """Admit a hop item for another node's origin on the target's host (this node paces that host)."""
        try:
            origin, url = str(message["origin"]), str(message["url"])
            generation, hops = int(str(message["gen"])), int(str(message["hops"]))
            target = identify(url, max_length=self._config.budgets.max_url_length)
        except (KeyError, ValueError, UrlRejected):
            self._events["robots_hop_unreadable"] += 1
            return
        if not self.owns(target.domain):
            self._events["robots_hop_not_owned"] += 1
            return
        key = f"{ROBOTS_PREFIX}{target.url}#{urlencode({'for': origin, 'gen': generation})}"
        h = key_hash(key)
        if h in self._seen:
            return
        self._seen.add(h)
        host = self._front.host(target.host, target.domain)
        item = Item(key, target.url, target.host, origin, target.domain, Kind.ROBOTS, 0, -1, self._next_seq(), hops)
        self._move(item, Event.ADMIT, f"robots redirect of {origin}"[:300], data=pack_admit(item))
        self._move(item, Event.SCHEDULE)
        host.robots_items[key] = item
        self._front.wake_now(host)

    def _robots_result(self, message: Mapping[str, object]) -> None:
        """Settle the home item of a hop another node fetched, as if this node had fetched the file itself."""
        key = str(message.get("key", ""))
        item = self._leases.leased(key)
        try:
            generation = int(str(message.get("gen", -1)))
        except ValueError:
            generation = -1
        if item is None or item.generation != generation:
            self._events["robots_result_stale"] += 1
            return
        now = self._clock_now()
        try:
            body = base64.b64decode(str(message.get("body", "")))[:MAX_ROBOTS_BYTES]
        except ValueError:
            body = b""
        outcome = Outcome(
            status=int(str(message.get("status", 0))),
            error_class=str(message.get("error_class", ""))[:100],
            retry_after_s=float(str(message.get("retry_after_s", -1.0))),
            evidence=str(message.get("evidence", ""))[:200],
            robots_body=body,
        )
        record = self._robots_policy.from_outcome(
            item.origin, status=outcome.status, body=body, error_class=outcome.error_class, now=now
        )
        # Asked before anything changes: the store may fail, and then the message waits to be read again.
        self._read_backlogs([self._robots_drains(item, outcome.status, RobotsPlan(None, outcome.error_class, record))])
        try:
            self._leases.settle(key)
            home = self._robots_home(item)
            self._front.free_slot(home)
            home.robots[item.origin] = record
            self._store.save_robots(item.origin, home.name, record.to_dict())
            self._events["robots_results_received"] += 1
            self._settle_robots(item, home, home, record, outcome.error_class, outcome, now)
            self._front.wake_now(home)
        finally:
            self._forget_backlogs()

    def _clock_now(self) -> float:
        raise NotImplementedError

    def _hop_remote(self, item: Item, host: Host, home: Host, url: str, domain: str) -> str:
        """Hand a redirect hop to the owner of `domain`; this item waits for the answer (or passes it on)."""
        assert self._outbox is not None
        remote = remote_home(item.key)
        reason = f"robots_redirect -> {url[:200]} (fetched by the owner of {domain})"
        if remote is not None:
            origin, generation = remote
            self._outbox.post(
                domain,
                {"t": "robots_hop", "origin": origin, "gen": generation, "url": url, "hops": item.redirect_hops + 1},
            )
            self._move(item, Event.COMPLETE, reason)
            host.robots_items.pop(self._robots_slot(item), None)
            return reason
        if host is not home:
            host.robots_items.pop(item.origin, None)
        now = self._clock_now()
        item.url, item.host, item.source = robots_url(item.origin), home.name, ""
        self._move(item, Event.REDIRECT, reason, data=pack_admit(item))
        item.generation += 1
        item.deadline = now + 2 * self._config.lease_s + 10.0
        self._move(item, Event.LEASE, f"owner of {domain}")
        self._front.take_slot(home)
        self._leases.lend(item)
        home.robots_items[item.origin] = item
        self._events["robots_hops_sent"] += 1
        self._outbox.post(
            domain,
            {
                "t": "robots_hop",
                "origin": item.origin,
                "gen": item.generation,
                "url": url,
                "hops": item.redirect_hops + 1,
            },
        )
        return reason

    def _robots_hop(self, item: Item, host: Host, home: Host, target: UrlIdentity) -> str:
        """Send a robots item to its redirect target's host queue (the owner's, through the outbox, when another
        node owns the target's domain: fetching it from here could put two requests on its host at once)."""
        if not self.owns(target.domain):
            return self._hop_remote(item, host, home, target.url, target.domain)
        slot = self._robots_slot(item)
        if host is not home or slot != item.origin:
            host.robots_items.pop(slot, None)
        item.url, item.redirect_hops, item.host = target.url, item.redirect_hops + 1, target.host
        if slot == item.origin:
            item.source = home.name
        hop_host = self._front.host(target.host, target.domain)
        reason = f"robots_redirect -> {target.url[:200]}"
        self._move(item, Event.REDIRECT, reason, data=pack_admit(item))
        if hop_host is not home or slot != item.origin:
            hop_host.robots_items[slot] = item
        self._front.wake_now(hop_host)
        return reason
