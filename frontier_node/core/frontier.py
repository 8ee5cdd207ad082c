"""The frontier core: which URL matters most and which may be fetched now, as a plain object.

Sans-I/O: time comes from an injected clock, durability from an injected Store whose writes the shell
flushes before it answers. Back queues are per host (`hosts.Host`); the front layer is one heap of hosts
keyed by the time each may next be leased, with each host in it at most once.
"""

from __future__ import annotations

import heapq
import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from frontier_node.core.budgets import Budgets
from frontier_node.core.config import FrontierConfig
from frontier_node.core.dedup import BodyIndex, SeenSet, key_hash
from frontier_node.core.hosts import Host
from frontier_node.core.journal import pack_admit
from frontier_node.core.ports import Store
from frontier_node.core.records import ROBOTS_PREFIX, Entry, Item, Kind, LinkLike, LinkVerdict, OutcomeLike, Verdict
from frontier_node.core.retry import OVERLOAD_STATUSES, Action, backoff_s, classify
from frontier_node.core.robots import RobotsPolicy, RobotsRecord, RobotsVerdict
from frontier_node.core.states import Event, State, next_state
from hostring.clock import Clock
from hostring.urls import UrlIdentity, UrlRejected, identify, reference_key, robots_url

# Plain-string values of the enums, looked up once: reading `.value` on every transition is measurably slow.
_VALUE: dict[State | Event, str] = {**{s: s.value for s in State}, **{e: e.value for e in Event}}
_CACHE_LIMIT = 1 << 15
# A robots.txt redirecting to a host of a domain another node owns (only in a cluster).
_ELSEWHERE = "robots_redirect_elsewhere"


class LeaseError(LookupError):
    """A Renew for a lease that is not current: unknown, stale generation or already settled."""

    def __init__(self, key: str, generation: int, reason: str) -> None:
        super().__init__(f"lease {key!r} generation {generation}: {reason}")
        self.key = key
        self.generation = generation
        self.reason = reason


@dataclass(slots=True)
class Completion:
    """The answer to a Complete: whether it counted, the item's state after it, and what became of its links."""

    accepted: bool
    state: str
    follow_links: bool
    reason: str
    admitted: int = 0
    forward: list[LinkLike] = field(default_factory=list)


class Frontier:
    """Admission, scheduling, leases and completions of the domains one node owns."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: FrontierConfig | None = None,
        *,
        run_id: str = "",
        owns: Callable[[str], bool] | None = None,
        rng: random.Random | None = None,
        recover: bool = True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config or FrontierConfig()
        self.owns = owns or (lambda domain: True)
        self.rng = rng or random.Random()
        self.robots_policy = RobotsPolicy(
            self.config.user_agent, max_crawl_delay_s=self.config.politeness.crawl_delay_cap_s
        )
        self.hosts: dict[str, Host] = {}
        self.ready: list[tuple[float, int, str]] = []
        self.leased: dict[str, Item] = {}
        self.deadlines: list[tuple[float, str, int]] = []
        self.waiting: dict[str, Item] = {}
        self.retries: list[tuple[float, str, int]] = []
        self.ip_next: dict[str, float] = {}
        self.ip_in_flight: Counter[str] = Counter()
        self.ip_waiters: dict[str, set[str]] = {}
        self.seen = SeenSet()
        self.bodies = BodyIndex(self.config.near_duplicate_distance)
        self.budgets = Budgets(self.config.budgets)
        self.state_counts: Counter[str] = Counter()
        self.verdicts: Counter[tuple[str, str]] = Counter()
        self.events: Counter[str] = Counter()
        self.abandoned: dict[str, str] = {}
        self.scope_hosts: set[str] = set()
        self.scope_domains: set[str] = set()
        self.domains: set[str] = set()
        self.journal_seq = 0
        self.item_seq = 0
        self.run_id = run_id
        self._now = clock.now()
        self._identities: dict[object, tuple[UrlIdentity, int]] = {}
        self._recover(rows=recover)

    # ================================================================== admission

    def discover(self, links: Iterable[LinkLike]) -> list[LinkVerdict]:
        """Admit, dedup, scope-check and budget-check a batch of links; one verdict each, in order."""
        self._now = self.clock.now()
        out: list[LinkVerdict] = []
        append = out.append
        seen = self.seen
        for link in links:
            try:
                ident, h = self._identify(link.observed, link.base_url)
            except UrlRejected as e:
                self.verdicts[("rejected", e.reason.value)] += 1
                append(LinkVerdict(Verdict.REJECTED, e.reason.value))
                continue
            key, domain = ident.fetch_key, ident.domain
            if not self.owns(domain):
                self.verdicts[("wrong_owner", "")] += 1
                append(LinkVerdict(Verdict.WRONG_OWNER, "wrong_owner", key, domain))
                continue
            if h in seen:
                self.verdicts[("duplicate", "")] += 1
                append(LinkVerdict(Verdict.DUPLICATE, "", key, domain))
                continue
            if link.seed and self.config.scope in ("host", "domain"):
                self._widen_scope(ident.host, domain)
            reason = self._refusal(ident.host, ident.origin, domain, link.redirect_hops)
            if reason:
                seen.add(h)
                self._reject(ident, link, reason)
                self.verdicts[("rejected", reason)] += 1
                append(LinkVerdict(Verdict.REJECTED, reason, key, domain))
                continue
            rule = self.budgets.check(ident.url, ident.host, domain, link.depth)
            if rule is None and (ident.host in self.abandoned or ident.origin in self.abandoned):
                rule = self.abandoned.get(ident.origin) or self.abandoned[ident.host]
            if rule is not None:
                seen.add(h)
                self.verdicts[("suppressed", rule)] += 1
                append(LinkVerdict(Verdict.SUPPRESSED, rule, key, domain))
                continue
            seen.add(h)
            self.budgets.charge(ident.url, ident.host, domain)
            self._admit(self._new_item(ident, link))
            self.verdicts[("admitted", "")] += 1
            append(LinkVerdict(Verdict.ADMITTED, "", key, domain))
        return out

    def _identify(self, observed: str, base: str) -> tuple[UrlIdentity, int]:
        """identify() and the key's fingerprint, remembering recent answers: pages repeat navigation links.

        The cache key is what the answer depends on (hostring.urls.reference_key).
        """
        ck = reference_key(observed, base)
        cache = self._identities
        hit = cache.get(ck)
        if hit is None:
            ident = identify(observed, base, max_length=self.config.budgets.max_url_length)
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            hit = cache[ck] = (ident, key_hash(ident.fetch_key))
        return hit

    def _refusal(self, host: str, origin: str, domain: str, redirect_hops: int) -> str:
        """Why a link with an identity is rejected outright: scope or redirect chain; '' when it is not."""
        if redirect_hops > self.config.max_redirect_hops:
            return "too_many_redirects"
        scope = self.config.scope
        if scope == "host" and host not in self.scope_hosts:
            return "out_of_scope"
        if scope == "domain" and domain not in self.scope_domains:
            return "out_of_scope"
        if scope == "list" and host not in self.scope_hosts and domain not in self.scope_domains:
            return "out_of_scope"
        return ""

    def add_scope(self, hosts: Iterable[str] = (), domains: Iterable[str] = ()) -> None:
        """Admit these hosts and registrable domains into the crawl's scope (from seeds or a scope file)."""
        for host in hosts:
            self.scope_hosts.add(host)
        for domain in domains:
            self.scope_domains.add(domain)
        self.store.set_meta(
            "scope", json.dumps({"hosts": sorted(self.scope_hosts), "domains": sorted(self.scope_domains)})
        )

    def _widen_scope(self, host: str, domain: str) -> None:
        if host not in self.scope_hosts or domain not in self.scope_domains:
            self.add_scope([host], [domain])

    def _new_item(self, ident: UrlIdentity, link: LinkLike) -> Item:
        """A page item for a link, numbered in admission order (its age in the host queue)."""
        self.item_seq += 1
        return Item(ident.fetch_key, ident.url, ident.host, ident.origin, ident.domain, Kind.PAGE, link.depth,
                    link.priority, self.item_seq, link.redirect_hops, source=link.source_key)  # fmt: skip

    def _reject(self, ident: UrlIdentity, link: LinkLike, reason: str) -> None:
        item = self._new_item(ident, link)
        self._move(item, Event.REJECT, reason, data=pack_admit(item))

    def _admit(self, item: Item) -> None:
        """discovered -> admitted -> scheduled, then queued on its host (with a robots item for a new origin)."""
        self._move(item, Event.ADMIT, data=pack_admit(item))
        self._move(item, Event.SCHEDULE)
        host = self._host(item.host, item.domain)
        self.domains.add(item.domain)
        if item.kind is Kind.PAGE and item.origin not in host.robots and item.origin not in host.robots_items:
            self._admit_robots(host, item.origin)
        host.push(item, self.config.window)
        self._wake(host, self._now)

    def _admit_robots(self, host: Host, origin: str) -> None:
        self.item_seq += 1
        key = ROBOTS_PREFIX + origin
        robots = Item(key, robots_url(origin), host.name, origin, host.domain, Kind.ROBOTS, 0, -1, self.item_seq)
        self.seen.add(key_hash(key))
        self._move(robots, Event.ADMIT, data=pack_admit(robots))
        self._move(robots, Event.SCHEDULE)
        host.robots_items[origin] = robots

    # ================================================================== leasing

    def lease(self, worker_id: str, max_items: int) -> list[Item]:
        """Up to `max_items` items, at most one per host, each host within its delay and concurrency."""
        now = self._now = self.clock.now()
        self.tick(now)
        out: list[Item] = []
        again: list[Host] = []
        ready = self.ready
        while ready and len(out) < max_items:
            at, version, name = ready[0]
            host = self.hosts.get(name)
            if host is None or version != host.heap_version or not host.in_heap:
                heapq.heappop(ready)
                continue
            if at > now:
                break
            heapq.heappop(ready)
            host.in_heap = False
            item = self._next_for(host, now)
            if item is None:
                continue
            self._grant(item, host, now, worker_id)
            out.append(item)
            if host.in_flight < host.limit(self.config.politeness):
                again.append(host)
        for host in again:
            self._wake(host, now)
        return out

    def _eligible_at(self, host: Host) -> float:
        return max(host.next_eligible, self.ip_next.get(host.ip, 0.0)) if host.ip else host.next_eligible

    def _next_for(self, host: Host, now: float) -> Item | None:
        """The item `host` may send now, or None (the host re-enters the heap when that changes)."""
        if host.paused or host.gave_up or host.in_flight >= host.limit(self.config.politeness):
            return None
        eligible = self._eligible_at(host)
        if eligible > now:
            self._wake(host, eligible)
            return None
        if host.ip and self.ip_in_flight[host.ip] >= host.limit(self.config.politeness):
            self.ip_waiters.setdefault(host.ip, set()).add(host.name)
            return None
        for robots in host.robots_items.values():
            if robots.state is State.SCHEDULED and robots.host == host.name:
                return robots
        while True:
            item = host.peek()
            if item is None:
                if host.overflow:
                    host.refill(self.store.backlog(host.name, host.watermark, self.config.window), self.config.window)
                    if host.items:
                        continue
                return None
            record = host.robots.get(item.origin)
            if record is None or record.expired(now):
                return self._robots_due(host, item.origin)
            if record.verdict is RobotsVerdict.DISALLOW_ALL:
                return None
            host.pop(item.key)
            if record.allowed(item.url):
                return item
            self._move(item, Event.SUPPRESS, "robots")

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

    def _grant(self, item: Item, host: Host, now: float, worker_id: str) -> None:
        item.generation += 1
        item.attempt += 1
        item.deadline = now + self.config.lease_s
        self._move(item, Event.LEASE, worker_id)
        self.events["lease"] += 1
        host.in_flight += 1
        if host.ip:
            self.ip_in_flight[host.ip] += 1
        self.leased[item.key] = item
        heapq.heappush(self.deadlines, (item.deadline, item.key, item.generation))

    def renew(self, key: str, generation: int, extend_s: float) -> float:
        """Push a current lease's deadline out to now + extend_s (at most lease_s); the new deadline."""
        item = self.leased.get(key)
        if item is None:
            raise LeaseError(key, generation, "unknown_lease")
        if item.generation != generation:
            raise LeaseError(key, generation, "stale_generation")
        item.deadline = self.clock.now() + min(max(extend_s, 0.0), self.config.lease_s)
        heapq.heappush(self.deadlines, (item.deadline, item.key, item.generation))
        return item.deadline

    # ================================================================== completion

    def complete(self, key: str, generation: int, outcome: OutcomeLike, links: Sequence[LinkLike] = ()) -> Completion:
        """Settle a lease with its outcome and admit the links found, if they are to be followed.

        A stale or unknown lease is journaled as late evidence only and its links are dropped. Links whose
        domain another node owns come back in `forward` for the worker to route.
        """
        self._now = self.clock.now()
        item = self.leased.get(key)
        if item is None or item.generation != generation:
            return self._late(key, generation, outcome, "stale_generation" if item else "unknown_lease")
        now = self.clock.now()
        del self.leased[key]
        self.events["completed"] += 1
        host = self._host(item.host, item.domain)
        self._release(host, now)
        if outcome.remote_ip:
            host.ip = outcome.remote_ip
        if item.kind is Kind.ROBOTS:
            done = self._complete_robots(item, host, outcome, now)
            home = self._robots_home(item)
            if home is not host:
                self._wake(home, self._eligible_at(home))
        else:
            done = self._complete_page(item, host, outcome, now)
        if host.ip:
            self.ip_next[host.ip] = max(self.ip_next.get(host.ip, 0.0), host.next_eligible)
        self._wake(host, self._eligible_at(host))
        if done.follow_links and links:
            for link, verdict in zip(links, self.discover(links), strict=True):
                if verdict.verdict is Verdict.WRONG_OWNER:
                    done.forward.append(link)
                elif verdict.verdict is Verdict.ADMITTED:
                    done.admitted += 1
        return done

    def _late(self, key: str, generation: int, outcome: OutcomeLike, reason: str) -> Completion:
        row = self.leased.get(key) or self.waiting.get(key) or self.store.get(key)
        state = row.state if row else State.DISCOVERED
        self.events["late_evidence"] += 1
        self.journal_seq += 1
        self.store.note(
            Entry(
                self.journal_seq,
                self.run_id,
                key,
                row.attempt if row else 0,
                generation,
                state.value,
                Event.LATE_EVIDENCE.value,
                state.value,
                self._now,
                self.config.policy_version,
                f"{reason} status={outcome.status} {outcome.error_class}".strip(),
                outcome.evidence,
            )
        )
        return Completion(False, state.value, False, reason)

    def _release(self, host: Host, now: float) -> None:
        """One request of `host` is over: free its slot and any host waiting on the same address."""
        host.in_flight -= 1
        if host.ip and self.ip_in_flight[host.ip] > 0:
            self.ip_in_flight[host.ip] -= 1
            for name in self.ip_waiters.pop(host.ip, ()):
                other = self.hosts.get(name)
                if other is None:
                    continue
                self._wake(other, self._eligible_at(other))

    def _complete_page(self, item: Item, host: Host, outcome: OutcomeLike, now: float) -> Completion:
        policy = self.config.politeness
        status, action_reason = outcome.status, classify(outcome.status, outcome.error_class)
        action, reason = action_reason
        if action is Action.DONE:
            host.on_response(outcome.response_s, now, policy)
            host.fetched += 1
            follow = status < 300 or (status < 400 and bool(outcome.location))
            if 300 <= status < 400 and outcome.location:
                reason = f"{status} -> {outcome.location[:200]}"
            elif status < 300:
                first = self.bodies.seen_digest(outcome.body_digest)
                if first is not None:
                    reason, follow = "duplicate_body", False
                elif self.bodies.near(outcome.simhash) is not None:
                    reason = "near_duplicate"
                self.bodies.add(item.key, outcome.body_digest, outcome.simhash)
            if outcome.nofollow:
                follow = False
            item.status, item.etag, item.last_modified = status, outcome.etag, outcome.last_modified
            item.evidence, item.digest = outcome.evidence, outcome.body_digest
            self._move(item, Event.COMPLETE, reason, outcome.evidence)
            return Completion(True, item.state.value, follow, reason)
        item.status, item.evidence = status, outcome.evidence
        host.errors += 1
        if action is Action.RETRY:
            self.events["backoff"] += 1
            host.on_trouble(now, outcome.retry_after_s, policy)
            if item.attempt >= self.config.retry.max_attempts:
                self._move(item, Event.FAIL, f"retries_exhausted:{reason}", outcome.evidence)
            else:
                self._retry_later(item, now, reason, outcome)
            if host.failures >= policy.give_up_after:
                self._give_up(host, f"host_unreachable:{reason}")
        else:
            host.next_eligible = max(host.next_eligible, now + host.delay(policy))
            self._move(item, Event.FAIL, reason, outcome.evidence)
        return Completion(True, item.state.value, False, reason)

    def _retry_later(self, item: Item, now: float, reason: str, outcome: OutcomeLike) -> None:
        wait = backoff_s(item.attempt, self.config.retry, self.rng)
        if outcome.retry_after_s >= 0:
            wait = max(wait, min(outcome.retry_after_s, self.config.politeness.retry_after_cap_s))
        item.due_at = now + wait
        self._move(item, Event.RETRY, reason, outcome.evidence)
        self.waiting[item.key] = item
        heapq.heappush(self.retries, (item.due_at, item.key, item.generation))

    def _robots_home(self, item: Item) -> Host:
        """The host whose origin a robots item is for (it differs from item.host while following a redirect)."""
        return self._host(item.source or item.host, item.domain)

    def _complete_robots(self, item: Item, host: Host, outcome: OutcomeLike, now: float) -> Completion:
        policy = self.config.politeness
        status, error_class = outcome.status, outcome.error_class
        item.status, item.evidence = status, outcome.evidence
        home = self._robots_home(item)
        redirected = 300 <= status < 400 and bool(outcome.location) and not error_class
        hop = ""
        if redirected and item.redirect_hops < self.config.max_redirect_hops:
            hop = self._robots_hop(item, host, home, outcome.location)
            if hop == _ELSEWHERE:
                # Not followed, and not read as "unavailable, allow all" either: the rules behind it are unknown.
                hop, error_class = "", _ELSEWHERE
        if not hop:
            record = self.robots_policy.from_outcome(
                item.origin, status=status, body=bytes(outcome.robots_body), error_class=error_class, now=now
            )
            home.robots[item.origin] = record
            self.store.save_robots(item.origin, home.name, record.to_dict())
        self.events[f"robots_{status // 100}xx" if status else "robots_no_response"] += 1
        # Pace after the record is in place, so the file's own Crawl-delay governs the very next request.
        if error_class or status in OVERLOAD_STATUSES or status >= 500:
            self.events["backoff"] += 1
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
        elif item.attempt - item.redirect_hops >= self.config.retry.robots_max_attempts:
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
            target = identify(location, item.url, max_length=self.config.budgets.max_url_length)
        except UrlRejected:
            return ""
        if not self.owns(target.domain):
            # Another node paces that host; fetching it from here could put two requests on it at once.
            return _ELSEWHERE
        if host is not home:
            host.robots_items.pop(item.origin, None)
        item.url, item.redirect_hops, item.source, item.host = (
            target.url,
            item.redirect_hops + 1,
            home.name,
            target.host,
        )
        hop_host = self._host(target.host, target.domain)
        reason = f"robots_redirect -> {target.url[:200]}"
        self._move(item, Event.REDIRECT, reason, data=pack_admit(item))
        if hop_host is not home:
            hop_host.robots_items[item.origin] = item
        self._wake(hop_host, self._eligible_at(hop_host))
        return reason

    # ================================================================== giving up

    def _abandon(self, host: Host, origin: str, reason: str) -> None:
        """Suppress every queued page of `origin`, and refuse its future links, naming why."""
        self.abandoned[origin] = reason
        self._drain_queue(host, reason, lambda it: it.origin == origin)

    def _give_up(self, host: Host, reason: str) -> None:
        """A host that keeps failing: its queue is suppressed and its waiting retries fail, with the reason.

        Robots items it held for other origins (redirect hops) end too, and so do those origins' pages.
        """
        host.gave_up = reason
        self.abandoned[host.name] = reason
        self._drain_queue(host, reason, lambda it: True)
        lost: list[Item] = []
        for item in [it for it in self.waiting.values() if it.host == host.name]:
            del self.waiting[item.key]
            self._move(item, Event.GIVE_UP, reason)
            if item.kind is Kind.ROBOTS:
                lost.append(item)
        for robots in list(host.robots_items.values()):
            if robots.state is State.SCHEDULED and robots.host == host.name:
                self._move(robots, Event.SUPPRESS, reason)
                lost.append(robots)
        for robots in lost:
            home = self._robots_home(robots)
            if home is not host:
                self._abandon(home, robots.origin, reason)

    def _drain_queue(self, host: Host, reason: str, which: Callable[[Item], bool]) -> None:
        if host.overflow:
            rows = self.store.backlog(host.name, host.watermark, 1 << 62)
            host.refill(rows, 1 << 62)
        for item in [it for it in host.items.values() if which(it)]:
            del host.items[item.key]
            self._move(item, Event.SUPPRESS, reason)

    # ================================================================== time passing

    def tick(self, now: float | None = None) -> None:
        """Expire overdue leases and put retries that are due back on their hosts."""
        now = self._now = self.clock.now() if now is None else now
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now:
            _, key, generation = heapq.heappop(deadlines)
            item = self.leased.get(key)
            if item is None or item.generation != generation or item.deadline > now:
                continue
            del self.leased[key]
            host = self._host(item.host, item.domain)
            self._release(host, now)
            host.next_eligible = max(host.next_eligible, now + host.delay(self.config.politeness))
            self.events["lease_expired"] += 1
            if item.attempt >= self.config.retry.max_attempts + self.config.retry.max_expiries:
                self._move(item, Event.FAIL, "lease_expired_repeatedly")
            else:
                self._move(item, Event.EXPIRE, "lease_expired")
                self._requeue(host, item)
            self._wake(host, self._eligible_at(host))
        retries = self.retries
        while retries and retries[0][0] <= now:
            _, key, generation = heapq.heappop(retries)
            item = self.waiting.get(key)
            if item is None or item.generation != generation:
                continue
            del self.waiting[key]
            host = self._host(item.host, item.domain)
            self._move(item, Event.RESCHEDULE)
            self._requeue(host, item)
            self._wake(host, self._eligible_at(host))

    def _requeue(self, host: Host, item: Item) -> None:
        if item.kind is Kind.ROBOTS:
            host.robots_items[item.origin] = item
        else:
            host.push(item, self.config.window)

    def next_event_in(self) -> float | None:
        """Seconds until something may change by itself (a host ready, a retry due, a lease expiring)."""
        times = []
        while self.ready:
            at, version, name = self.ready[0]
            host = self.hosts.get(name)
            if host is not None and version == host.heap_version and host.in_heap:
                times.append(at)
                break
            heapq.heappop(self.ready)
        if self.retries:
            times.append(self.retries[0][0])
        if self.deadlines:
            times.append(self.deadlines[0][0])
        return max(0.0, min(times) - self.clock.now()) if times else None

    @property
    def drained(self) -> bool:
        """Nothing queued, nothing in flight, nothing waiting to retry: this node's crawl is over."""
        c = self.state_counts
        return c["scheduled"] == 0 and c["leased"] == 0 and c["retryable"] == 0

    # ================================================================== administration

    def pause(self, host_name: str, paused: bool) -> Host:
        host = self._known_host(host_name)
        host.paused = paused
        if not paused:
            self._wake(host, self._eligible_at(host))
        return host

    def set_policy(self, host_name: str, *, min_delay_s: float | None = None, concurrency: int | None = None) -> Host:
        host = self._known_host(host_name)
        if min_delay_s is not None:
            if min_delay_s < 0:
                raise ValueError("min_delay_s must be >= 0")
            host.min_delay_s = min_delay_s
        if concurrency is not None:
            if concurrency < 1:
                raise ValueError("concurrency must be >= 1")
            host.concurrency = concurrency
        self._wake(host, self._eligible_at(host))
        return host

    def _known_host(self, name: str) -> Host:
        host = self.hosts.get(name.lower().rstrip("."))
        if host is None:
            raise KeyError(f"no such host on this node: {name!r}")
        return host

    # ================================================================== internals

    def _host(self, name: str, domain: str) -> Host:
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = Host(name, domain)
        return host

    def _wake(self, host: Host, at: float) -> None:
        """Put `host` in the ready heap for time `at` if it can use a slot; keeps one live entry per host."""
        if host.paused or host.gave_up or host.in_flight >= host.limit(self.config.politeness) or not host.has_work():
            return
        if host.in_heap and self.ready and host.heap_at <= at:
            return
        host.heap_version += 1
        host.heap_at = at
        host.in_heap = True
        heapq.heappush(self.ready, (at, host.heap_version, host.name))

    def _move(self, item: Item, event: Event, reason: str = "", evidence: str = "", data: str = "") -> None:
        """Apply one transition from the table, count it and journal it with the item's new row."""
        before = item.state
        after = next_state(before, event, item.key)
        item.state = after
        item.reason = reason
        counts = self.state_counts
        b, a = _VALUE[before], _VALUE[after]
        if before is not State.DISCOVERED:
            counts[b] -= 1
        counts[a] += 1
        self.journal_seq += 1
        self.store.record(
            Entry(self.journal_seq, self.run_id, item.key, item.attempt, item.generation, b, _VALUE[event], a,
                  self._now, self.config.policy_version, reason, evidence, data),
            item,
        )  # fmt: skip

    def _recover(self, rows: bool) -> None:
        """Rebuild RAM state from the store after a restart: run id, counters, scope and (with `rows`) the items.

        A cluster node passes rows=False: which domains it holds is the ring's to say, and it adopts them then.
        """
        store = self.store
        self.run_id = self.run_id or store.get_meta("run_id") or uuid.uuid4().hex[:12]
        store.set_meta("run_id", self.run_id)
        self.journal_seq, self.item_seq = store.max_seqs()
        scope = store.get_meta("scope")
        if scope:
            loaded = json.loads(scope)
            self.scope_hosts.update(loaded["hosts"])
            self.scope_domains.update(loaded["domains"])
        if rows:
            self.adopt(store.items(), store.robots_records())
        store.flush()

    def adopt(self, items: Iterable[Item], robots: Iterable[tuple[str, str, dict[str, object]]]) -> None:
        """Take over rows from the store (after a restart, or a handoff of domains) into RAM.

        Queued rows stay in the store (only counted); leased ones keep their deadline, so a host with a fetch
        still in flight elsewhere is not leased again before it ends. Hosts rest one delay first: no burst.
        """
        now = self._now = self.clock.now()
        touched: set[str] = set()
        for origin, host_name, data in robots:
            self._host(host_name, "").robots[origin] = RobotsRecord.from_dict(data)
        for item in items:
            self.seen.add(key_hash(item.key))
            self.state_counts[item.state.value] += 1
            host = self._host(item.host, item.domain)
            touched.add(host.name)
            self.domains.add(item.domain)
            if item.kind is Kind.ROBOTS:
                if item.state is State.FAILED or item.state is State.SUPPRESSED:
                    self.abandoned[item.origin] = item.reason.split(":")[0] or "robots_unavailable"
                else:
                    host.robots_items[item.origin] = item
                    if item.source and item.source != item.host:
                        self._host(item.source, item.domain).robots_items[item.origin] = item
            else:
                host.domain = item.domain
                if item.state is not State.REJECTED:
                    self.budgets.charge(item.url, item.host, item.domain)
                if item.state is State.SCHEDULED:
                    host.overflow += 1
                elif item.state is State.FETCHED and item.digest:
                    self.bodies.add(item.key, item.digest, 0)
            if item.state is State.LEASED:
                self.leased[item.key] = item
                host.in_flight += 1
                heapq.heappush(self.deadlines, (item.deadline, item.key, item.generation))
            elif item.state is State.RETRYABLE:
                self.waiting[item.key] = item
                heapq.heappush(self.retries, (item.due_at, item.key, item.generation))
        for name in touched:
            host = self.hosts[name]
            if host.has_work():
                host.next_eligible = max(host.next_eligible, now + host.delay(self.config.politeness))
                self._wake(host, host.next_eligible)

    def release(self, domains: Iterable[str], counts: dict[str, int] | None = None) -> None:
        """Forget domains another node now owns: their hosts, leases and retries leave RAM (the store keeps all).

        `counts` (state -> rows of those domains) keeps the per-state totals right; a shell that can count
        from its store after the release (the cluster does) passes nothing and recounts instead.
        """
        gone = set(domains) & self.domains
        if not gone:
            return
        self.domains -= gone
        for name in [n for n, h in self.hosts.items() if h.domain in gone]:
            host = self.hosts.pop(name)
            host.in_heap = False
            self.budgets.total -= self.budgets.per_host.pop(name, 0)
        for d in gone:
            self.budgets.per_domain.pop(d, None)
        for table in (self.leased, self.waiting):
            for key in [k for k, it in table.items() if it.domain in gone]:
                del table[key]
        for state, n in (counts or {}).items():
            self.state_counts[state] -= n

    # ================================================================== inspection

    def stats(self) -> dict[str, object]:
        now = self.clock.now()
        with_work = [h for h in self.hosts.values() if h.has_work()]
        return {
            "run_id": self.run_id,
            "urls_by_state": {k: v for k, v in self.state_counts.items() if v},
            "hosts": len(self.hosts),
            "hosts_with_work": len(with_work),
            "hosts_ready": sum(
                1
                for h in with_work
                if not h.paused and h.in_flight < h.limit(self.config.politeness) and self._eligible_at(h) <= now
            ),
            "in_flight": len(self.leased),
            "queued": self.state_counts["scheduled"],
            "seen": len(self.seen),
            "discovered_by_verdict": {f"{v}:{r}" if r else v: n for (v, r), n in self.verdicts.items()},
            "leases_granted": self.events["lease"],
            "leases_expired": self.events["lease_expired"],
            "completes_stale": self.events["late_evidence"],
        }
