"""The frontier core: which URL matters most and which may be fetched now, as a plain object.

Sans-I/O: time comes from an injected clock, durability from an injected Store whose writes the shell
flushes before it answers. Back queues are per host (`hosts.Host`); the front layer (`front.FrontLayer`) is one
heap of hosts keyed by the time each may next be leased, with each host in it at most once. Leases and retries
wait in `leases.LeaseBook`; robots.txt files are items of their own (`robots_items`).

The shells see the core through its methods and frozen views (`views`) only; its state is private.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import cast

from frontier_node.core.budgets import Budgets
from frontier_node.core.config import FrontierConfig, RevisitConfig
from frontier_node.core.dedup import BodyIndex as MemoryBodyIndex
from frontier_node.core.dedup import SeenSet, key_hash
from frontier_node.core.front import FrontLayer
from frontier_node.core.handback import HANDED_BACK, POLICY_REFUSALS, Handback
from frontier_node.core.hosts import Host
from frontier_node.core.journal import pack_admit
from frontier_node.core.leases import LeaseBook
from frontier_node.core.ports import BodyClaim, BodyIndex, BreachLog, Outbox, Store
from frontier_node.core.records import Completion, Entry, Item, Kind, LinkLike, LinkVerdict, OutcomeLike, Verdict
from frontier_node.core.retry import Action, backoff_s, classify
from frontier_node.core.revisit import DueBook, RevisitCounters, describe
from frontier_node.core.revisit_items import RevisitItems
from frontier_node.core.robots import RobotsPolicy, RobotsRecord, RobotsVerdict
from frontier_node.core.robots_items import RobotsItems, RobotsPlan, remote_home
from frontier_node.core.states import TERMINAL, Event, State, next_state
from frontier_node.core.views import CoverageInput, FrontierStats, HostView
from hostring.clock import Clock
from hostring.limits import MAX_LINK_PAYLOAD_BYTES
from hostring.targets import FetchTarget, fetch_target
from hostring.urls import UrlRejected, reference_key

__all__ = ["Completion", "Frontier", "LeaseError"]

# Plain-string values of the enums, looked up once: reading `.value` on every transition is measurably slow.
_VALUE: dict[State | Event, str] = {**{s: s.value for s in State}, **{e: e.value for e in Event}}
_CACHE_LIMIT = 1 << 15
_NEVER_TOO_DEEP = 1 << 62  # the depth of a link not suppressed for its depth
_TOO_DEEP_LIMIT = 1 << 16
"""Links refused for their depth or redirect chain alone that a node remembers (then it forgets them at once and
sightings count again): at ~100 B (a depth) and ~400 B (a rejected item) each, a few MB and ~25 MB at most."""
_TOO_FAR = "too_many_redirects"
"""The refusal of a link at the end of a redirect chain too long: a later link with a short chain schedules it."""
REPEATED = "already_settled"
"""The reason of a completion answered accepted because it had landed before (a retry whose first answer was lost)."""
NOT_HOLDER = "not_holder"
"""The reason of a completion refused because its worker is not the one the lease was granted to (kept as late
evidence, as a stale one is): lease ids are URLs and generations count from 1, so any client can name a lease."""
# NamedTuples built on the hot path by tuple.__new__ (C, every field given): their generated keyword __new__ costs
# about 0.3 us more per call, once per link and once per journal line.
_verdict = cast(Callable[[tuple[Verdict, str, str, str]], LinkVerdict], partial(tuple.__new__, LinkVerdict))
_entry = cast(Callable[[tuple[object, ...]], Entry], partial(tuple.__new__, Entry))
# Store meta name of the Discover verdicts, a counter that only lives in RAM otherwise: written with every Discover,
# in the same commit as the items it admitted, so the counts add up after a crash. (Budget breaches are stored
# per domain through the store's BreachLog, so they travel with a handoff.)
_VERDICTS_META = "counters.verdicts"


class LeaseError(LookupError):
    """A Renew for a lease that is not current (unknown, stale generation or already settled) or not the caller's."""

    def __init__(self, key: str, generation: int, reason: str) -> None:
        super().__init__(f"lease {key!r} generation {generation}: {reason}")
        self.key = key
        self.generation = generation
        self.reason = reason


class Frontier(RobotsItems, Handback, RevisitItems):
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
        outbox: Outbox | None = None,
        bodies: BodyIndex | None = None,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._breach_log: BreachLog | None = cast(BreachLog, store) if hasattr(store, "save_breaches") else None
        self._clock = clock
        self._config = config = config or FrontierConfig()
        self._owns = owns or (lambda domain: True)
        self._rng = rng or random.Random()
        self._robots_policy = RobotsPolicy(config.user_agent, max_crawl_delay_s=config.politeness.crawl_delay_cap_s)
        self._front = FrontLayer(config.politeness)
        self._leases = LeaseBook()
        self._seen = SeenSet()
        # Links suppressed only for their depth: fingerprint -> the least depth they were seen at. They are not
        # `seen` (a link to the page at a smaller depth, found later, is admitted); a sighting at least as
        # deep is a duplicate, so neither the check nor the breach count repeats per page that links them.
        self._too_deep: dict[int, int] = {}
        # Links refused for their redirect chain alone (kept as rejected rows): fingerprint -> the item. A link to
        # the page with a short enough chain, found later, schedules that item again rather than being a duplicate.
        self._too_far: dict[int, Item] = {}
        self._bodies: BodyIndex = bodies or MemoryBodyIndex(config.near_duplicate_distance)
        self._budgets = Budgets(config.budgets)
        self._counts: Counter[str] = Counter()  # items by state
        self._verdicts: Counter[tuple[str, str]] = Counter()
        self._events: Counter[str] = Counter()
        self._abandoned: dict[str, str] = {}  # origin or host -> why its links are refused
        self._handbacks: dict[str, tuple[int, str]] = {}  # key -> (its hand-backs this run, domain): handback.py
        self._scope_hosts: set[str] = set()
        self._scope_domains: set[str] = set()
        self._domains: set[str] = set()
        self._journal_seq = 0
        self._item_seq = 0
        self._run_id = run_id
        self._now = clock.now()
        self._identities: dict[object, tuple[FetchTarget, int]] = {}
        self._admission_window = max(1, min(config.window, config.admission_window))
        self._read_ahead: dict[str, list[Item]] = {}  # host -> its queued rows, read before a drain (_read_backlogs)
        self._max_url_length = config.budgets.max_url_length
        self._due = DueBook()
        self._revisit_counters = RevisitCounters()
        self._revisit_overrides: dict[str, RevisitConfig] = {}
        self._init_revisits()
        self._recover(rows=recover)

    # ================================================================== what it was given

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def config(self) -> FrontierConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def store(self) -> Store:
        return self._store

    def _set_now(self, now: float) -> None:
        """The time of the operation running (a method: the mixed-in parts are mypyc traits, which cannot assign it)."""
        self._now = now

    def owns(self, domain: str) -> bool:
        """Whether this node owns `domain` (at its current ring epoch, in a cluster)."""
        return self._owns(domain)

    def _clock_now(self) -> float:
        self._now = self._clock.now()
        return self._now

    def attach_cluster(self, outbox: Outbox, bodies: BodyIndex | None = None) -> None:
        """Join a cluster's shared parts: links (and robots hops) other nodes own go to `outbox` instead of back
        to the caller in Completion.forward, and bodies are registered in the shared `bodies` index."""
        self._outbox = outbox
        if bodies is not None:
            self._bodies = bodies

    # ================================================================== admission

    def discover(self, links: Iterable[LinkLike]) -> list[LinkVerdict]:
        """Admit, dedup, scope-check and budget-check a batch of links; one verdict each, in order."""
        self._now = self._clock.now()
        out: list[LinkVerdict] = []
        append = out.append
        seen, verdicts, owns, budgets = self._seen, self._verdicts, self._owns, self._budgets
        abandoned, too_deep, too_far = self._abandoned, self._too_deep, self._too_far
        # Per batch, not per link: whether a link can be refused outright at all (scope or redirect hops).
        open_scope, max_hops = self._config.scope == "all", self._config.max_redirect_hops
        identities = self._identities
        for link in links:
            if len(link.payload) > MAX_LINK_PAYLOAD_BYTES:
                verdicts[("rejected", "payload_too_large")] += 1
                append(_verdict((Verdict.REJECTED, "payload_too_large", "", "")))
                continue
            observed, base = link.observed, link.base_url
            ck = reference_key(observed, base)
            hit = identities.get(ck)
            if hit is None:
                try:
                    hit = self._identify(ck, observed, base)
                except UrlRejected as e:
                    verdicts[("rejected", e.reason.value)] += 1
                    append(_verdict((Verdict.REJECTED, e.reason.value, "", "")))
                    continue
            ident, h = hit
            key, domain = ident.fetch_key, ident.domain
            if not owns(domain):
                verdicts[("wrong_owner", "")] += 1
                append(_verdict((Verdict.WRONG_OWNER, "wrong_owner", key, domain)))
                continue
            far = too_far.get(h) if too_far else None
            if far is not None and far.state is not State.REJECTED:
                far = None
            if (h in seen or link.depth >= too_deep.get(h, _NEVER_TOO_DEEP)) and (
                far is None or link.redirect_hops >= min(far.redirect_hops, max_hops + 1)
            ):
                verdicts[("duplicate", "")] += 1
                append(_verdict((Verdict.DUPLICATE, "", key, domain)))
                continue
            if link.seed and self._config.scope in ("host", "domain"):
                self._widen_scope(ident.host, domain)
            hops = link.redirect_hops
            reason = "" if open_scope and hops <= max_hops else self._refusal(ident.host, domain, hops)
            if reason:
                if far is not None:  # still refused (the scope, say): the first refusal stands
                    verdicts[("duplicate", "")] += 1
                    append(_verdict((Verdict.DUPLICATE, "", key, domain)))
                    continue
                seen.add(h)
                rejected = self._reject(ident, link, reason)
                if reason == _TOO_FAR:
                    if len(too_far) >= _TOO_DEEP_LIMIT:
                        too_far.clear()
                    too_far[h] = rejected
                verdicts[("rejected", reason)] += 1
                append(_verdict((Verdict.REJECTED, reason, key, domain)))
                continue
            rule = budgets.check(key, ident.host, domain, link.depth)
            if rule is None and (ident.host in abandoned or ident.origin in abandoned):
                rule = abandoned.get(ident.origin) or abandoned[ident.host]
                if rule in POLICY_REFUSALS:  # kept as a row, so that a run under a wider policy reconsiders it
                    seen.add(h)
                    self._reject(ident, link, rule)
                    verdicts[("rejected", rule)] += 1
                    append(_verdict((Verdict.REJECTED, rule, key, domain)))
                    continue
            if rule is not None:
                if far is not None:
                    verdicts[("suppressed", rule)] += 1
                    append(_verdict((Verdict.SUPPRESSED, rule, key, domain)))
                    continue
                if rule == "depth":
                    if len(too_deep) >= _TOO_DEEP_LIMIT:
                        too_deep.clear()
                    too_deep[h] = link.depth
                else:
                    seen.add(h)
                verdicts[("suppressed", rule)] += 1
                append(_verdict((Verdict.SUPPRESSED, rule, key, domain)))
                continue
            seen.add(h)
            too_deep.pop(h, None)
            budgets.charge(key, ident.host, domain)
            if far is not None:
                del too_far[h]
                self._readmit(far, link)
            else:
                self._admit(self._new_item(ident, link))
            verdicts[("admitted", "")] += 1
            append(_verdict((Verdict.ADMITTED, "", key, domain)))
        if out:
            self._store.set_meta(_VERDICTS_META, json.dumps([[v, r, n] for (v, r), n in verdicts.items()]))
        if budgets.dirty:
            self._save_breaches()
        return out

    def _save_breaches(self) -> None:
        """Hand the breaches that changed to the store, one list per domain (coalesced until its flush)."""
        budgets, log = self._budgets, self._breach_log
        if log is not None:
            for domain in sorted(budgets.dirty):
                log.save_breaches(domain, budgets.of_domain(domain))
        budgets.dirty.clear()

    def _identify(self, ck: object, observed: str, base: str) -> tuple[FetchTarget, int]:
        """The link's fetch target (identify()'s key, host, origin and domain) and the key's fingerprint, remembered
        under `ck`, its reference_key (what the answer depends on): pages repeat navigation links, and discover()
        looks the cache up itself before it calls this."""
        ident = fetch_target(observed, base, max_length=self._max_url_length)
        cache = self._identities
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        hit = cache[ck] = (ident, key_hash(ident.fetch_key))
        return hit

    def _refusal(self, host: str, domain: str, redirect_hops: int) -> str:
        """Why a link with an identity is rejected outright: scope or redirect chain; '' when it is not."""
        if redirect_hops > self._config.max_redirect_hops:
            return _TOO_FAR
        scope = self._config.scope
        if scope == "host" and host not in self._scope_hosts:
            return "out_of_scope"
        if scope == "domain" and domain not in self._scope_domains:
            return "out_of_scope"
        if scope == "list" and host not in self._scope_hosts and domain not in self._scope_domains:
            return "out_of_scope"
        return ""

    def add_scope(self, hosts: Iterable[str] = (), domains: Iterable[str] = ()) -> None:
        """Admit these hosts and registrable domains into the crawl's scope (from seeds or a scope file)."""
        self._scope_hosts.update(hosts)
        self._scope_domains.update(domains)
        self._store.set_meta(
            "scope", json.dumps({"hosts": sorted(self._scope_hosts), "domains": sorted(self._scope_domains)})
        )

    def _widen_scope(self, host: str, domain: str) -> None:
        if host not in self._scope_hosts or domain not in self._scope_domains:
            self.add_scope([host], [domain])

    def _next_seq(self) -> int:
        """The next item number: admission order, an item's age in its host queue."""
        self._item_seq += 1
        return self._item_seq

    def _new_item(self, ident: FetchTarget, link: LinkLike) -> Item:
        return Item(ident.fetch_key, ident.fetch_key, ident.host, ident.origin, ident.domain, Kind.PAGE, link.depth,
                    link.priority, self._next_seq(), link.redirect_hops, source=link.source_key,
                    payload=link.payload)  # fmt: skip

    def _reject(self, ident: FetchTarget, link: LinkLike, reason: str) -> Item:
        item = self._new_item(ident, link)
        item.payload = b""  # kept for items that will be leased only
        self._move(item, Event.REJECT, reason, data=pack_admit(item))
        return item

    def _readmit(self, item: Item, link: LinkLike) -> None:
        """A page refused for its redirect chain, linked again with a chain short enough: scheduled as found now."""
        if item.state is not State.REJECTED:
            return
        item.depth, item.priority, item.redirect_hops = link.depth, link.priority, link.redirect_hops
        item.source, item.payload, item.attempt = link.source_key, link.payload, 0
        self._move(item, Event.RECONSIDER, "reconsidered:too_many_redirects", data=pack_admit(item))
        self._enqueue(item, self._admission_window)

    def _admit(self, item: Item) -> None:
        """discovered -> admitted -> scheduled, then queued on its host (with a robots item for a new origin)."""
        self._move(item, Event.ADMIT, data=pack_admit(item))
        self._move(item, Event.SCHEDULE)
        self._enqueue(item, self._admission_window)

    def _enqueue(self, item: Item, window: int) -> None:
        """Queue a scheduled item on its host (at most `window` of them in RAM), with a robots item first for a
        page of an origin the host knows nothing of, and wake the host."""
        host = self._front.host(item.host, item.domain)
        self._domains.add(item.domain)
        if item.kind is Kind.PAGE and item.origin not in host.robots and item.origin not in host.robots_items:
            self._admit_robots(host, item.origin)
        host.push(item, window)
        self._front.wake(host, self._now)

    # ================================================================== leasing

    def lease(self, worker_id: str, max_items: int) -> list[Item]:
        """Up to `max_items` items, at most one per host, each host within its delay and concurrency."""
        now = self._now = self._clock.now()
        self.tick(now)
        out: list[Item] = []
        again: list[Host] = []
        front, limits = self._front, self._config.politeness
        while len(out) < max_items:
            host = front.pop_ready(now)
            if host is None:
                break
            try:
                item = self._next_for(host, now)
            except BaseException:
                # A store read failed (Redis away for a moment): the host left the heap and nothing else would
                # put it back, so its queue would wait forever. Back in, and the caller sees the error.
                for h in (host, *again):
                    front.wake(h, now)
                raise
            if item is None:
                continue
            self._grant(item, host, now, worker_id)
            out.append(item)
            if host.in_flight < host.limit(limits):
                again.append(host)
        for host in again:
            front.wake(host, now)
        return out

    def _next_for(self, host: Host, now: float) -> Item | None:
        """The item `host` may send now, or None (the host re-enters the heap when that changes)."""
        if host.paused or host.gave_up or host.in_flight >= host.limit(self._config.politeness):
            return None
        eligible = self._front.eligible_at(host)
        if eligible > now:
            self._front.wake(host, eligible)
            return None
        if self._front.address_busy(host):
            return None
        robots = self._robots_ready(host)
        if robots is not None:
            return robots
        while True:
            item = host.peek()
            while item is None and host.overflow:
                window = self._config.window
                host.refill(self._store.backlog(host.name, host.watermark, window), window)
                item = host.peek()
            # Revisits: a due revisit goes instead when the new queue is empty or it is revisits' turn.
            revisit = self._best_revisit(host, now) if host.revisits or host.revisit_wait else None
            both = item is not None and revisit is not None
            if revisit is not None and self._revisit_turn(host, item is not None):
                item = revisit
            if item is None:
                return None
            record = host.robots.get(item.origin)
            if record is None or record.expired(now):
                return self._robots_due(host, item.origin)
            if record.verdict is RobotsVerdict.DISALLOW_ALL:
                return None
            if both:
                self._spend_turn(host, item is revisit)
            if item is revisit:
                self._took_revisit(host, item, now)
            else:
                host.pop(item.key)
            if record.allowed(item.url):
                return item
            self._move(item, Event.SUPPRESS, "robots")

    def _grant(self, item: Item, host: Host, now: float, worker_id: str) -> None:
        item.generation += 1
        item.attempt += 1
        item.deadline = now + self._config.lease_s
        self._move(item, Event.LEASE, worker_id)
        self._events["lease"] += 1
        self._front.take_slot(host)
        self._leases.lend(item)

    def renew(self, key: str, generation: int, extend_s: float, *, worker_id: str | None = None) -> float:
        """Push a current lease's deadline out to now + extend_s (at most lease_s); the deadline after it.

        `worker_id` as for `complete`: a current lease another worker holds is not extended (NOT_HOLDER), so no
        client keeps alive a lease whose holder died (lease ids are URLs: any client can name one).

        A renewal only ever extends: one asking for less than the time left (extend_ms 0, say) leaves the deadline
        as it is. Else it would end a lease whose fetch still runs, and the host would be leased again meanwhile:
        two requests in flight to one host."""
        item = self._leases.leased(key)
        if item is None:
            raise LeaseError(key, generation, "unknown_lease")
        if item.generation != generation:
            raise LeaseError(key, generation, "stale_generation")
        if _not_holder(item, worker_id):
            raise LeaseError(key, generation, NOT_HOLDER)
        deadline = self._clock.now() + min(max(extend_s, 0.0), self._config.lease_s)
        if deadline > item.deadline:
            self._leases.extend(item, deadline)
        return item.deadline

    def holds(self, key: str, generation: int, worker_id: str) -> bool:
        """Whether `worker_id` holds the current lease `key` at `generation` (what `complete` checks first)."""
        item = self._leases.leased(key)
        return item is not None and item.generation == generation and not _not_holder(item, worker_id)

    def leases_held(self, worker_id: str) -> int:
        """How many leases `worker_id` holds now."""
        return self._leases.held(worker_id)

    def leased_domain(self, key: str) -> str | None:
        """The registrable domain of the item currently leased under `key`, or None when no lease is current."""
        item = self._leases.leased(key)
        return item.domain if item is not None else None

    def body_claim(
        self, key: str, generation: int, outcome: OutcomeLike, *, worker_id: str | None = None
    ) -> tuple[str, int, str] | None:
        """The (digest, simhash, key) `complete` would register in the body index for this outcome, else None: a
        shell registers a batch's bodies ahead in one round trip with it (see RedisBodyIndex.prime_later). `worker_id`
        as for `complete`: a completion it would refuse claims nothing."""
        item = self._leases.leased(key)
        if item is None or item.generation != generation or outcome.error_class == HANDED_BACK:
            return None
        if _not_holder(item, worker_id):
            return None
        return self._claim_of(item, outcome)

    # ================================================================== completion

    def complete(
        self,
        key: str,
        generation: int,
        outcome: OutcomeLike,
        links: Sequence[LinkLike] = (),
        *,
        worker_id: str | None = None,
    ) -> Completion:
        """Settle a lease with its outcome and admit the links found, if they are to be followed.

        A stale or unknown lease is journaled as late evidence only and its links are dropped, except a completion
        sent again after it landed (see `_repeated`), which is answered as the first was. So is a current one
        whose `worker_id` is not its holder's (NOT_HOLDER; a hand-back too): the worker it was granted to, the
        reason of its `lease` journal line. None checks nothing: an in-process caller that is the holder by
        construction; the gRPC shell always passes the request's worker_id (an empty one holds no lease). Links whose
        domain another node owns go to the outbox, in the same flush as the completion, when the node has one
        (a cluster node); else they come back in `forward` for the caller to route.
        """
        self._now = self._clock.now()
        item = self._leases.leased(key)
        if item is None or item.generation != generation:
            row = item or self._leases.waiting(key) or self._store.get(key)  # one read: the store may be remote
            if item is None and (again := self._repeated(row, generation, outcome)) is not None:
                return again
            return self._late(key, generation, outcome, "stale_generation" if item else "unknown_lease", row)
        if _not_holder(item, worker_id):
            return self._late(key, generation, outcome, f"{NOT_HOLDER} worker={worker_id!r}", item, NOT_HOLDER)
        if outcome.error_class == HANDED_BACK:
            self._hand_back(item, HANDED_BACK)  # scheduled again, or failed past the bound (the reason says which)
            return Completion(True, item.state.value, False, item.reason)
        seen = self._ask_bodies(item, outcome)
        now = self._clock.now()
        front = self._front
        host = front.host(item.host, item.domain)
        plan = self._plan_robots(item, outcome, now) if item.kind is Kind.ROBOTS else None
        drains = self._drains(item, host, outcome, plan)
        if drains:
            self._read_backlogs(drains)
        try:
            self._leases.settle(key)
            self._events["completed"] += 1
            front.free_slot(host)
            if outcome.remote_ip:
                host.ip = outcome.remote_ip
            if plan is not None:
                done = self._complete_robots(item, host, outcome, now, plan)
                home = self._robots_home(item)
                if home is not host:
                    front.wake_now(home)
            else:
                done = self._complete_page(item, host, outcome, now, seen)
            front.pace_address(host)
            front.wake_now(host)
        finally:
            self._forget_backlogs()
        if done.follow_links and links:
            for link, verdict in zip(links, self.discover(links), strict=True):
                if verdict.verdict is Verdict.WRONG_OWNER:
                    done.forward.append(link)
                elif verdict.verdict is Verdict.ADMITTED:
                    done.admitted += 1
            if done.forward and self._outbox is not None:
                self._outbox.forward(done.forward)
                done.forwarded, done.forward = len(done.forward), []
        return done

    def _repeated(self, row: Item | None, generation: int, outcome: OutcomeLike) -> Completion | None:
        """The answer to a completion sent again after it landed, else None: the row was fetched under this very
        generation with this status (only a completion moves an item to fetched, and the next lease takes a new
        generation). Its first answer was lost with a killed node or connection; a retry is answered accepted,
        changes nothing and journals nothing, so that delivery at least once settles exactly once."""
        if row is None or row.state is not State.FETCHED or row.generation != generation:
            return None
        if row.status != outcome.status or outcome.error_class:
            return None
        self._events["repeated_completion"] += 1
        return Completion(True, row.state.value, False, REPEATED)

    def _late(
        self, key: str, generation: int, outcome: OutcomeLike, why: str, row: Item | None, reason: str = ""
    ) -> Completion:
        """Journal a completion of a lease that is not current as late evidence (`why`, its journal line's reason);
        `row` is the key's item, if any; the answer's reason is `reason`, else `why`."""
        state = row.state if row else State.DISCOVERED
        self._events["late_evidence"] += 1
        self._journal_seq += 1
        self._store.note(
            Entry(
                self._journal_seq,
                self._run_id,
                key,
                row.attempt if row else 0,
                generation,
                state.value,
                Event.LATE_EVIDENCE.value,
                state.value,
                self._now,
                self._config.policy_version,
                f"{why} status={outcome.status} {outcome.error_class}".strip(),
                outcome.evidence,
            )
        )
        return Completion(False, state.value, False, reason or why)

    def _ask_bodies(self, item: Item, outcome: OutcomeLike) -> BodyClaim | None:
        """What the body index knows of this completion's body, asked before the completion changes anything.

        The index may be a store of its own (Redis in a cluster) whose call fails: that must fail the whole
        completion, not half of it (the lease settled but the item still leased, its host out of the ready heap,
        its links never admitted, and the worker's retry answered unknown_lease). None when settling it does not
        consult the index.
        """
        if item.kind is Kind.ROBOTS or classify(outcome.status, outcome.error_class)[0] is not Action.DONE:
            return None
        if item.checked_at > 0:
            if not self._revisit_asks_mirror(item, outcome):
                return None
            return BodyClaim(self._bodies.mirror_of(outcome.body_digest, item.key), False)
        claim = self._claim_of(item, outcome)
        return None if claim is None else self._bodies.claim(*claim)

    def _drains(self, item: Item, host: Host, outcome: OutcomeLike, plan: RobotsPlan | None) -> list[Host | None]:
        """The hosts whose queues settling this outcome drains, known before it changes anything: a host it gives up
        (and the homes of the robots files that end with it), or the home of an origin it abandons."""
        if plan is not None:
            return [self._robots_drains(item, outcome.status, plan)]
        if host.failures + 1 < self._config.politeness.give_up_after:  # with the failure this outcome may add
            return []
        if classify(outcome.status, outcome.error_class).action is not Action.RETRY:
            return []
        waiting, scheduled = self._robots_of(host)
        return [host, *(self._known_robots_home(robots) for robots in (*waiting, *scheduled))]

    def _read_backlogs(self, hosts: Iterable[Host | None]) -> None:
        """Read the store rows of the queues an operation will drain before it changes anything, for _drain_queue:
        a store that fails there (Redis away, StoreLost) fails the whole operation instead of leaving it half done."""
        self._read_ahead = {
            h.name: self._store.backlog(h.name, h.watermark, 1 << 62) for h in hosts if h is not None and h.overflow
        }

    def _forget_backlogs(self) -> None:
        """Drop rows read ahead and not used: a later drain reads its own, current ones."""
        if self._read_ahead:
            self._read_ahead = {}

    @staticmethod
    def _claim_of(item: Item, outcome: OutcomeLike) -> tuple[str, int, str] | None:
        """The (digest, simhash, key) a first fetch registers in the body index: a page's 2xx done with a body
        fingerprint. Revisits only ask (mirror_of) and robots files never register."""
        if item.kind is not Kind.PAGE or item.checked_at > 0 or not 200 <= outcome.status < 300:
            return None
        if not (outcome.body_digest or outcome.simhash):
            return None
        if classify(outcome.status, outcome.error_class)[0] is not Action.DONE:
            return None
        return outcome.body_digest, outcome.simhash, item.key

    def _complete_page(
        self, item: Item, host: Host, outcome: OutcomeLike, now: float, seen: BodyClaim | None
    ) -> Completion:
        policy = self._config.politeness
        status, action_reason = outcome.status, classify(outcome.status, outcome.error_class)
        action, reason = action_reason
        if action is Action.DONE and item.checked_at > 0:
            return self._complete_revisit(item, host, outcome, now, seen.first if seen is not None else None)
        if action is Action.DONE:
            host.on_response(outcome.response_s, now, policy)
            host.fetched += 1
            follow = status < 300 or (status < 400 and bool(outcome.location))
            if 300 <= status < 400 and outcome.location:
                reason = f"{status} -> {outcome.location[:200]}"
            elif status < 300 and seen is not None:
                first, near = seen
                if first is not None:
                    reason, follow = "duplicate_body", False
                elif near:
                    reason = "near_duplicate"
            if outcome.nofollow:
                follow = False
            item.status, item.etag, item.last_modified = status, outcome.etag, outcome.last_modified
            item.evidence, item.digest = outcome.evidence, outcome.body_digest
            data = self._first_fetched(item, outcome, now)
            self._move(item, Event.COMPLETE, reason, outcome.evidence, data)
            return Completion(True, item.state.value, follow, reason)
        item.status, item.evidence = status, outcome.evidence
        host.errors += 1
        if action is Action.RETRY:
            self._events["backoff"] += 1
            host.on_trouble(now, outcome.retry_after_s, policy, outcome.response_s)
            if item.attempt >= self._config.retry.max_attempts:
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
        wait = backoff_s(item.attempt, self._config.retry, self._rng)
        if outcome.retry_after_s >= 0:
            wait = max(wait, min(outcome.retry_after_s, self._config.politeness.retry_after_cap_s))
        item.due_at = now + wait
        self._move(item, Event.RETRY, reason, outcome.evidence)
        self._leases.wait(item)

    # ================================================================== giving up

    def _abandon(self, host: Host, origin: str, reason: str) -> None:
        """Suppress every queued page of `origin`, and refuse its future links, naming why."""
        self._abandoned[origin] = reason
        self._drain_queue(host, reason, lambda it: it.origin == origin)

    def _give_up(self, host: Host, reason: str) -> None:
        """A host that keeps failing: its queue is suppressed and its waiting retries fail, with the reason.

        Robots items it held for other origins (redirect hops) end too, and so do those origins' pages.
        """
        host.gave_up = reason
        self._abandoned[host.name] = reason
        self._drain_queue(host, reason, lambda it: True)
        waiting, scheduled = self._robots_of(host)
        for item in self._leases.take_waiting(host.name):
            self._move(item, Event.GIVE_UP, reason)
        for robots in scheduled:
            self._move(robots, Event.SUPPRESS, reason)
        for robots in (*waiting, *scheduled):
            home = self._robots_home(robots)
            if home is not host:
                self._abandon(home, robots.origin, reason)

    def _robots_of(self, host: Host) -> tuple[list[Item], list[Item]]:
        """The robots files that end when `host` is given up: (its waiting retries, those scheduled on it)."""
        waiting = [it for it in self._leases.waiting_of(host.name) if it.kind is Kind.ROBOTS]
        return waiting, [r for r in host.robots_items.values() if r.state is State.SCHEDULED and r.host == host.name]

    def _drain_queue(self, host: Host, reason: str, which: Callable[[Item], bool]) -> None:
        if host.overflow:
            rows = self._read_ahead.pop(host.name, None)
            if rows is None:
                rows = self._store.backlog(host.name, host.watermark, 1 << 62)
            host.refill(rows, 1 << 62)
        for item in [it for it in host.items.values() if which(it)]:
            del host.items[item.key]
            self._move(item, Event.SUPPRESS, reason)
        for item in [it for it in host.revisits.values() if which(it)]:
            del host.revisits[item.key]
            self._move(item, Event.SUPPRESS, reason)

    # ================================================================== time passing

    def tick(self, now: float | None = None) -> None:
        """Expire overdue leases and put retries that are due back on their hosts."""
        now = self._now = self._clock.now() if now is None else now
        front, leases, retry = self._front, self._leases, self._config.retry
        while (item := leases.expired(now)) is not None:
            fails = item.attempt >= retry.max_attempts + retry.max_expiries
            # A robots file failing abandons its origin, whose queue may lie in the store: read before any change.
            abandons = fails and item.kind is Kind.ROBOTS and remote_home(item.key) is None
            if abandons:
                self._read_backlogs([self._known_robots_home(item)])
            leases.pop_expired(now)
            host = front.host(item.host, item.domain)
            front.free_slot(host)
            host.next_eligible = max(host.next_eligible, now + host.delay(self._config.politeness))
            self._events["lease_expired"] += 1
            if fails:
                self._move(item, Event.FAIL, "lease_expired_repeatedly")
                if abandons:
                    # Its origin's pages wait for this file: without it they would wait forever.
                    try:
                        self._abandon(self._robots_home(item), item.origin, "robots_unavailable")
                    finally:
                        self._forget_backlogs()
            else:
                self._move(item, Event.EXPIRE, "lease_expired")
                self._requeue(host, item)
            front.wake_now(host)
        while (item := leases.pop_due(now)) is not None:
            host = front.host(item.host, item.domain)
            self._move(item, Event.RESCHEDULE)
            self._requeue(host, item)
            front.wake_now(host)
        self._promote_due(now)

    def _requeue(self, host: Host, item: Item) -> None:
        if item.kind is Kind.ROBOTS:
            host.robots_items[self._robots_slot(item)] = item
        else:
            host.push(item, self._config.window)

    def next_event_in(self) -> float | None:
        """Seconds until something may change by itself (a host ready, a retry due, a lease expiring)."""
        times = [t for t in (self._front.next_at(), self._leases.next_at(), self._due.next_at()) if t is not None]
        return max(0.0, min(times) - self._clock.now()) if times else None

    @property
    def drained(self) -> bool:
        """Nothing queued, nothing in flight, nothing waiting to retry or to be revisited: this node's crawl is over
        (a crawl under a revisit policy never is)."""
        c = self._counts
        if c["scheduled"] or c["leased"] or c["retryable"] or len(self._due):
            return False
        return not any(h.revisit_wait for h in self._front)

    # ================================================================== administration

    def pause(self, host_name: str, paused: bool) -> HostView:
        """Stop (or resume) leasing a host's URLs; the host as it stands after."""
        host = self._known_host(host_name)
        host.paused = paused
        if not paused:
            self._front.wake_now(host)
        return self._view(host, self._clock.now())

    def set_policy(
        self, host_name: str, *, min_delay_s: float | None = None, concurrency: int | None = None
    ) -> HostView:
        """Override a host's minimum delay and/or concurrency limit; the host as it stands after."""
        host = self._known_host(host_name)
        if min_delay_s is not None:
            if min_delay_s < 0:
                raise ValueError("min_delay_s must be >= 0")
            host.min_delay_s = min_delay_s
        if concurrency is not None:
            if concurrency < 1:
                raise ValueError("concurrency must be >= 1")
            host.concurrency = concurrency
        self._front.wake_now(host)
        return self._view(host, self._clock.now())

    def _known_host(self, name: str) -> Host:
        host = self._front.get(_host_name(name))
        if host is None:
            raise KeyError(f"no such host on this node: {name!r}")
        return host

    # ================================================================== internals

    def _move(self, item: Item, event: Event, reason: str = "", evidence: str = "", data: str = "") -> None:
        """Apply one transition from the table, count it and journal it with the item's new row."""
        before = item.state
        after = next_state(before, event, item.key)
        item.state = after
        item.reason = reason
        if self._handbacks and after in TERMINAL:  # an item that ends forgets its hand-backs (mostly empty: one test)
            self._handbacks.pop(item.key, None)
        if item.checked_at and after is not before:
            self._retire(item, before, after)  # revisits: a page retired from revisiting waits out the retention
        counts = self._counts
        b, a = _VALUE[before], _VALUE[after]
        if before is not State.DISCOVERED:
            counts[b] -= 1
        counts[a] += 1
        self._journal_seq += 1
        self._store.record(
            _entry((self._journal_seq, self._run_id, item.key, item.attempt, item.generation, b, _VALUE[event], a,
                    self._now, self._config.policy_version, reason, evidence, data)),
            item,
        )  # fmt: skip

    # ================================================================== ownership: restart and handoff

    def _recover(self, rows: bool) -> None:
        """Rebuild RAM state from the store after a restart: run id, counters, scope and (with `rows`) the items.

        A cluster node passes rows=False: which domains it holds is the ring's to say, and it adopts them then.
        """
        store = self._store
        self._run_id = self._run_id or store.get_meta("run_id") or uuid.uuid4().hex[:12]
        store.set_meta("run_id", self._run_id)
        self._journal_seq, self._item_seq = store.max_seqs()
        scope = store.get_meta("scope")
        if scope:
            loaded = json.loads(scope)
            self._scope_hosts.update(loaded["hosts"])
            self._scope_domains.update(loaded["domains"])
        verdicts = store.get_meta(_VERDICTS_META)
        if verdicts:
            self._verdicts.update({(str(v), str(r)): int(n) for v, r, n in json.loads(verdicts)})
        if rows:
            self.adopt(store.items(), store.robots_records())
            if self._breach_log is not None:
                for domain, stored in self._breach_log.load_breaches().items():
                    self._budgets.load(domain, stored)
        store.flush()

    def adopt(
        self,
        items: Iterable[Item],
        robots: Iterable[tuple[str, str, dict[str, object]]],
        breaches: Mapping[str, Iterable[dict[str, object]]] | None = None,
    ) -> None:
        """Take over rows from the store (after a restart, or a handoff of domains) into RAM.

        Queued rows stay in the store (only counted); leased ones keep their deadline, so a host with a fetch
        still in flight elsewhere is not leased again before it ends. Hosts rest one delay first: no burst.
        """
        now = self._now = self._clock.now()
        front = self._front
        touched: dict[str, Host] = {}
        for domain, stored in (breaches or {}).items():
            self._budgets.load(domain, stored)
        for origin, host_name, data in robots:
            front.host(host_name, "").robots[origin] = RobotsRecord.from_dict(data)
        for item in items:
            self._seen.add(key_hash(item.key))
            self._counts[item.state.value] += 1
            host = touched[item.host] = front.host(item.host, item.domain)
            self._domains.add(item.domain)
            if item.kind is Kind.ROBOTS:
                if item.state is State.FAILED or item.state is State.SUPPRESSED:
                    self._abandoned[item.origin] = item.reason.split(":")[0] or "robots_unavailable"
                else:
                    host.robots_items[self._robots_slot(item)] = item
                    if item.source and item.source != item.host:
                        front.host(item.source, item.domain).robots_items[item.origin] = item
            else:
                host.domain = item.domain
                if item.state is not State.REJECTED:
                    self._budgets.charge(item.url, item.host, item.domain)
                elif item.reason == _TOO_FAR and len(self._too_far) < _TOO_DEEP_LIMIT:
                    self._too_far[key_hash(item.key)] = item  # a short link still schedules it (discover)
                revisit = self._adopt_revisit(item, host)
                if item.state is State.SCHEDULED and not revisit:
                    host.overflow += 1
                elif item.state is State.FETCHED and item.digest:
                    self._bodies.remember(item.digest, 0, item.key)
            if item.state is State.LEASED:
                host.in_flight += 1
                self._leases.lend(item)
            elif item.state is State.RETRYABLE:
                self._leases.wait(item)
        for host in touched.values():
            if host.has_work():
                host.next_eligible = max(host.next_eligible, now + host.delay(self._config.politeness))
                front.wake(host, host.next_eligible)

    def hold(self, domain: str) -> None:
        """Count `domain` among those this node holds, rows or not (a cluster node adopted it at a new ring)."""
        self._domains.add(domain)

    def release(self, domains: Iterable[str], counts: Mapping[str, int] | None = None) -> None:
        """Forget domains another node now owns: their hosts, leases and retries leave RAM (the store keeps all).

        `counts` (state -> rows of those domains) keeps the per-state totals right; a shell that can count
        from its store after the release (the cluster does) passes nothing and calls recount() instead.
        """
        leaving = set(domains)
        if self._too_far:  # their rows are the new owner's to change now: no stale item is reconsidered here later
            self._too_far = {h: it for h, it in self._too_far.items() if it.domain not in leaving}
        gone = leaving & self._domains
        if not gone:
            return
        self._domains -= gone
        self._budgets.forget(self._front.forget(gone), gone)
        self._leases.forget(gone)
        if self._handbacks:
            self._handbacks = {k: n for k, n in self._handbacks.items() if n[1] not in gone}
        for state, n in (counts or {}).items():
            self._counts[state] -= n

    def recount(self, counts: Mapping[str, int]) -> None:
        """Replace the per-state totals with `counts` (state -> rows), counted by the store of the held domains."""
        self._counts = Counter(counts)

    @property
    def domains(self) -> frozenset[str]:
        """The registrable domains this node holds."""
        return frozenset(self._domains)

    # ================================================================== inspection

    def host(self, name: str) -> HostView | None:
        """One host (its name as given, any case, a trailing dot allowed), or None when this node has no such host."""
        host = self._front.get(_host_name(name))
        return None if host is None else self._view(host, self._clock.now())

    def hosts(self, *, only_with_work: bool = False, limit: int | None = None) -> list[HostView]:
        """Hosts with the longest queues first (then by name), at most `limit` of them."""
        hosts = [h for h in self._front if h.has_work() or not only_with_work]
        hosts.sort(key=lambda h: (-h.queued, h.name))
        now = self._clock.now()
        return [self._view(h, now) for h in hosts[:limit]]

    def _view(self, host: Host, now: float) -> HostView:
        return replace(self._front.view(host, now), revisit=describe(self.revisit_config(host.name, host.domain)))

    def stats(self) -> FrontierStats:
        now = self._clock.now()
        front = self._front
        with_work = [h for h in front if h.has_work()]
        breaches: Counter[str] = Counter()
        for breach in self._budgets.breaches.values():
            breaches[breach.rule] += breach.count
        next_ready_s, waiting_for = self._outlook(now)
        return FrontierStats(
            run_id=self._run_id,
            urls_by_state=dict(self._counts),
            hosts=len(front),
            hosts_with_work=len(with_work),
            hosts_ready=sum(1 for h in with_work if front.can_go(h, now)),
            hosts_backed_off=sum(1 for h in front if h.backoff > 1.0),
            in_flight=len(self._leases),
            queued=self._counts["scheduled"],
            queued_in_ram=sum(len(h.items) for h in front),
            seen=len(self._seen),
            seen_bytes=self._seen.nbytes,
            owned_domains=len(self._domains),
            verdicts=dict(self._verdicts),
            events=dict(self._events),
            breaches=dict(breaches),
            next_ready_s=next_ready_s,
            waiting_for=waiting_for,
            revisits=self.revisit_stats(),
        )

    def _outlook(self, now: float) -> tuple[float | None, str]:
        """Seconds until the earliest queued, retrying or revisit work may be leased (0: some may go now; None:
        none waits), and, when it is later, what that work waits for."""
        candidates: list[tuple[float, int, str]] = []  # a retry wins a tie: it is the cause, the host waits on it
        nxt = self._front.next_host()
        if nxt is not None:
            at, host = nxt
            why = f"backed off x{host.backoff:.0f}" if host.backoff > 1.0 else "politeness delay"
            candidates.append((at, 1, f"host {host.name} ({why})"))
        retry = self._leases.next_retry()
        if retry is not None:
            what = f"robots.txt of {retry.origin}" if retry.kind is Kind.ROBOTS else f"retry of {retry.url}"
            candidates.append((retry.due_at, 0, f"{what} ({retry.reason})"))
        revisit = self._due.next_revisit()
        if revisit is not None:
            candidates.append((revisit[0], 2, f"revisit of {revisit[1]}"))
        if not candidates:
            return None, ""
        at, _, text = min(candidates)
        return (0.0, "") if at <= now else (at - now, text)

    def coverage_input(self, items: Iterable[Item] | None = None) -> CoverageInput:
        """What the coverage report needs from this node: the store's rows (or `items`, rows a shell reads from the
        store itself, off the core) and the in-memory counters."""
        rows = self._store.items() if items is None else items
        return CoverageInput(
            self._run_id, rows, self._budgets.report(), dict(self._verdicts), revisits=self.revisit_stats()
        )


def _not_holder(item: Item, worker_id: str | None) -> bool:
    """Whether `worker_id` names another worker than the leased `item`'s holder, its reason (see `_grant`); None, an
    in-process caller that is the holder by construction, is never refused."""
    return worker_id is not None and worker_id != item.reason


def _host_name(name: str) -> str:
    """A host name as the core keys hosts: lower case, no trailing dot."""
    return name.lower().rstrip(".")
