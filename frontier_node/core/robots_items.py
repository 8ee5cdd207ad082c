"""robots.txt files as frontier items: admitted with an origin's first page, leased before its pages, followed
through redirects host by host, and settled into the origin's RobotsRecord (RFC 9309 §2.3).

A robots item is keyed ROBOTS_PREFIX + origin. While it follows a redirect its `host` is the hop's host (whose
queue and politeness it then uses) and its `source` the origin's own host, its home, where the record lands.
`RobotsItems` is mixed into `Frontier`, which owns the state and the transitions declared at the top.
"""

from __future__ import annotations

from collections import Counter

from frontier_node.core.config import FrontierConfig
from frontier_node.core.dedup import SeenSet, key_hash
from frontier_node.core.front import FrontLayer
from frontier_node.core.hosts import Host
from frontier_node.core.journal import pack_admit
from frontier_node.core.ports import Store
from frontier_node.core.records import Completion, Item, Kind, OutcomeLike
from frontier_node.core.retry import OVERLOAD_STATUSES, Action, classify
from frontier_node.core.robots import RobotsPolicy, RobotsVerdict
from frontier_node.core.states import Event, State
from hostring.urls import ROBOTS_PREFIX, UrlRejected, identify, robots_url

# A robots.txt redirecting to a host of a domain another node owns (only in a cluster).
ELSEWHERE = "robots_redirect_elsewhere"


class RobotsItems:
    """The robots part of the Frontier."""

    # What the Frontier provides.
    _config: FrontierConfig
    _front: FrontLayer
    _store: Store
    _seen: SeenSet
    _events: Counter[str]
    _robots_policy: RobotsPolicy

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
            self._move(robots, Event.REVISIT, "robots_expired", data=pack_admit(robots))
        return robots if robots.state is State.SCHEDULED and robots.host == host.name else None

    def _robots_home(self, item: Item) -> Host:
        """The host whose origin a robots item is for (it differs from item.host while following a redirect)."""
        return self._front.host(item.source or item.host, item.domain)

    # ------------------------------------------------------------------ completion

    def _complete_robots(self, item: Item, host: Host, outcome: OutcomeLike, now: float) -> Completion:
        policy = self._config.politeness
        status, error_class = outcome.status, outcome.error_class
        item.status, item.evidence = status, outcome.evidence
        home = self._robots_home(item)
        redirected = 300 <= status < 400 and bool(outcome.location) and not error_class
        hop = ""
        if redirected and item.redirect_hops < self._config.max_redirect_hops:
            hop = self._robots_hop(item, host, home, outcome.location)
            if hop == ELSEWHERE:
                # Not followed, and not read as "unavailable, allow all" either: the rules behind it are unknown.
                hop, error_class = "", ELSEWHERE
        if not hop:
            record = self._robots_policy.from_outcome(
                item.origin, status=status, body=bytes(outcome.robots_body), error_class=error_class, now=now
            )
            home.robots[item.origin] = record
            self._store.save_robots(item.origin, home.name, record.to_dict())
        self._events[f"robots_{status // 100}xx" if status else "robots_no_response"] += 1
        # Pace after the record is in place, so the file's own Crawl-delay governs the very next request.
        if error_class or status in OVERLOAD_STATUSES or status >= 500:
            self._events["backoff"] += 1
            host.on_trouble(now, outcome.retry_after_s, policy)
        else:
            host.on_response(outcome.response_s, now, policy)
        if hop:
            return Completion(True, item.state.value, False, hop)
        reason = error_class or f"robots_{status}"
        if record.verdict is not RobotsVerdict.DISALLOW_ALL:
            self._move(item, Event.COMPLETE, reason, outcome.evidence)
        elif classify(status, error_class).action is Action.FAIL:
            self._move(item, Event.FAIL, reason, outcome.evidence)
            self._abandon(home, item.origin, error_class or "robots_unavailable")
        elif item.attempt - item.redirect_hops >= self._config.retry.robots_max_attempts:
            self._move(item, Event.FAIL, f"robots_unavailable:{reason}", outcome.evidence)
            self._abandon(home, item.origin, "robots_unavailable")
        else:
            self._retry_later(item, now, reason, outcome)
        if item.state is not State.RETRYABLE and host is not home:
            host.robots_items.pop(item.origin, None)
        return Completion(True, item.state.value, False, reason)

    def _robots_hop(self, item: Item, host: Host, home: Host, location: str) -> str:
        """Send a robots item to its redirect target's host queue; the reason, or '' when the target is unusable."""
        try:
            target = identify(location, item.url, max_length=self._config.budgets.max_url_length)
        except UrlRejected:
            return ""
        if not self.owns(target.domain):
            # Another node paces that host; fetching it from here could put two requests on it at once.
            return ELSEWHERE
        if host is not home:
            host.robots_items.pop(item.origin, None)
        item.url, item.redirect_hops, item.source, item.host = (
            target.url,
            item.redirect_hops + 1,
            home.name,
            target.host,
        )
        hop_host = self._front.host(target.host, target.domain)
        reason = f"robots_redirect -> {target.url[:200]}"
        self._move(item, Event.REDIRECT, reason, data=pack_admit(item))
        if hop_host is not home:
            hop_host.robots_items[item.origin] = item
        self._front.wake_now(hop_host)
        return reason
