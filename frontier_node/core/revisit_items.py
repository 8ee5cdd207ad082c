"""Revisits as frontier work: a fetched page's due time, its return to its host's queue, and what a revisit found.

A page that ends `fetched` under a revisit policy gets a due time (core/revisit.py says when). At that time it
moves `fetched -> scheduled` through the `revisit` event into its host's revisit window, beside the host's
queue of new URLs: both share the host's politeness, and while both wait a host gives `share` of its leases
to revisits (a credit, so neither starves), the most probably changed and most important revisit first.
Every line that sets a page's revisit state carries it as `data` (revisit.pack_revisit), so the journal alone
rebuilds due times and change histories; the rows carry the same numbers through restarts and handoffs.

A revisit that answers 404 or 410 is fetched once more soon after (at the minimum interval); a second one
retires the page as `failed: gone`. Retired pages (gone, or failed or suppressed on a revisit) wait out the
retention period: then a gone page's row and journal lines are deleted, and the change history of the others
is cleared. `RevisitItems` is mixed into `Frontier`, which owns the state and the transitions declared here.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace

from mypy_extensions import trait

from frontier_node.core.config import FrontierConfig, RevisitConfig
from frontier_node.core.front import FrontLayer
from frontier_node.core.hosts import Host
from frontier_node.core.ports import BodyIndex, Store
from frontier_node.core.records import Completion, Item, Kind, OutcomeLike
from frontier_node.core.revisit import (
    LAG_BOUNDS,
    Change,
    DueBook,
    RevisitCounters,
    RevisitView,
    first_interval,
    near_duplicate,
    next_interval,
    observe,
    pack_revisit,
    revisit_rank,
)
from frontier_node.core.states import Event, State
from hostring.clock import Clock
from hostring.domains import registrable_domain
from hostring.urls import UrlRejected, identify

_OVERRIDES_META = "revisit_overrides"
_GONE_STATUSES = frozenset({404, 410})
_RETIRED = frozenset({State.FAILED, State.SUPPRESSED})


@trait
class RevisitItems:
    """The revisit part of the Frontier."""

    # What the Frontier provides.
    _config: FrontierConfig
    _front: FrontLayer
    _store: Store
    _bodies: BodyIndex
    _events: Counter[str]
    _counts: Counter[str]
    _domains: set[str]
    _now: float
    _clock: Clock
    # What this part keeps (made by _init_revisits).
    _due: DueBook
    _revisit_counters: RevisitCounters
    _revisit_overrides: dict[str, RevisitConfig]

    def owns(self, domain: str) -> bool:
        raise NotImplementedError

    def _move(self, item: Item, event: Event, reason: str = "", evidence: str = "", data: str = "") -> None:
        raise NotImplementedError

    def _init_revisits(self) -> None:
        saved = self._store.get_meta(_OVERRIDES_META)
        if saved:
            base = self._config.revisit
            for name, fields in json.loads(saved).items():
                self._revisit_overrides[name] = replace(base, **fields)

    # ------------------------------------------------------------------ policy

    def revisit_config(self, host: str, domain: str = "") -> RevisitConfig:
        """The revisit policy of `host`: its own override, else its registrable domain's, else the node's."""
        overrides = self._revisit_overrides
        if overrides:
            found = overrides.get(host) or overrides.get("." + (domain or registrable_domain(host)))
            if found is not None:
                return found
        return self._config.revisit

    def set_revisit_policy(
        self,
        name: str,
        *,
        domain: bool = False,
        policy: str | None = None,
        interval_s: float | None = None,
        min_s: float | None = None,
        max_s: float | None = None,
        share: float | None = None,
    ) -> RevisitConfig:
        """Override the revisit policy of one host (or, with `domain`, one registrable domain) of this node.

        Fields not given keep the current effective value. It applies from each page's next check on; the
        override is kept in the store's meta values. ValueError names a bad value; KeyError a name this node
        does not own.
        """
        name = name.lower().rstrip(".")
        reg = name if domain else registrable_domain(name)
        if not reg or not self.owns(reg):
            raise KeyError(f"this node does not own {'domain' if domain else 'host'} {name!r}")
        current = self.revisit_config("" if domain else name, reg)
        updated = replace(  # validates: ValueError with the setting named
            current,
            policy=current.policy if policy is None else policy,
            interval_s=current.interval_s if interval_s is None else interval_s,
            min_s=current.min_s if min_s is None else min_s,
            max_s=current.max_s if max_s is None else max_s,
            share=current.share if share is None else share,
        )
        key = "." + reg if domain else name
        self._revisit_overrides[key] = updated
        saved = {
            k: {f: getattr(c, f) for f in ("policy", "interval_s", "min_s", "max_s", "share")}
            for k, c in self._revisit_overrides.items()
        }
        self._store.set_meta(_OVERRIDES_META, json.dumps(saved, sort_keys=True))
        host = self._front.get(name)
        if host is not None:
            self._front.wake_now(host)
        return updated

    # ------------------------------------------------------------------ after a fetch

    def _first_fetched(self, item: Item, outcome: OutcomeLike, now: float) -> str:
        """A page's first successful fetch: start its history and give it a due time under its policy.

        Returns the journal data of the completion line ('' when no revisit is planned, to keep the journal of
        a one-shot crawl as it was).
        """
        item.checked_at = item.stored_at = now
        item.simhash = outcome.simhash & 0xFFFFFFFFFFFFFFFF
        config = self.revisit_config(item.host, item.domain)
        if not config.enabled:
            item.due_at = 0.0
            return ""
        item.interval_s = first_interval(config)
        item.due_at = now + item.interval_s
        self._due.due(item.due_at, item.key, item.host)
        self._revisit_counters.page(item)
        return pack_revisit(item)

    @staticmethod
    def _revisit_asks_mirror(item: Item, outcome: OutcomeLike) -> bool:
        """Whether settling this revisit needs the body index's `mirror_of` (a changed body): the caller asks it
        before changing anything, since the index may be a store whose call fails."""
        status, digest = outcome.status, outcome.body_digest
        if not digest or status == 304 or status in _GONE_STATUSES:
            return False
        return digest != item.digest if 200 <= status < 300 else status != item.status

    def _complete_revisit(
        self, item: Item, host: Host, outcome: OutcomeLike, now: float, mirror: str | None
    ) -> Completion:
        """Settle a revisit that got a response (the caller handles retries and failures): what changed, the
        stored copy, the change history and the next due time. `mirror`: the key first fetched with this body when
        that is another page's (asked of the body index beforehand, see `_revisit_asks_mirror`)."""
        host.on_response(outcome.response_s, now, self._config.politeness)
        host.fetched += 1
        config = self.revisit_config(item.host, item.domain)
        status = outcome.status
        if status in _GONE_STATUSES:
            if item.status in _GONE_STATUSES:
                self._count(Change.GONE)
                self._move(item, Event.FAIL, Change.GONE.value, outcome.evidence)
                return Completion(True, item.state.value, False, Change.GONE.value)
            item.status = status
            self._count(Change.MISSING)
            self._plan(item, now + config.min_s)
            self._move(item, Event.COMPLETE, f"revisit:{Change.MISSING.value}", outcome.evidence, pack_revisit(item))
            return Completion(True, item.state.value, False, f"revisit:{Change.MISSING.value}")
        follow = False
        if status == 304:
            change = Change.NOT_MODIFIED
            item.etag = outcome.etag or item.etag
            item.last_modified = outcome.last_modified or item.last_modified
        else:
            item.etag, item.last_modified = outcome.etag, outcome.last_modified
            if 200 <= status < 300 and outcome.body_digest and outcome.body_digest == item.digest:
                change = Change.UNCHANGED
            elif not 200 <= status < 300 and status == item.status:
                # The same redirect or refusal again: the status is all there is to compare. A redirect's target
                # is offered again (the seen-set drops it when it is known).
                change = Change.UNCHANGED
                follow = 300 <= status < 400 and bool(outcome.location) and not outcome.nofollow
            else:
                simhash = outcome.simhash & 0xFFFFFFFFFFFFFFFF
                distance = self._config.near_duplicate_distance
                near = 200 <= status < 300 and near_duplicate(simhash, item.simhash, distance)
                change = Change.NEAR_DUPLICATE if near else Change.CHANGED
                item.status, item.digest, item.simhash = status, outcome.body_digest, simhash
                item.evidence, item.stored_at = outcome.evidence, now
                # A mirror of a body first fetched under another key is not followed (as on a first fetch); in a
                # cluster the index is the cluster's, so a twin fetched by another node counts as well.
                follow = mirror is None and not outcome.nofollow
                follow = follow and (status < 300 or (status < 400 and bool(outcome.location)))
        if item.status in _GONE_STATUSES and change in (Change.NOT_MODIFIED, Change.UNCHANGED):
            item.status = 200 if status == 304 else status  # it answers again after a 404: the stored copy holds
        observe(item, now, change is Change.CHANGED, config.history)
        if config.enabled:
            item.interval_s = next_interval(item, config, change is Change.CHANGED)
            self._plan(item, now + item.interval_s)
        else:
            item.due_at = 0.0
        self._count(change)
        self._revisit_counters.page(item)
        reason = f"revisit:{change.value}"
        self._move(item, Event.COMPLETE, reason, outcome.evidence, pack_revisit(item))
        return Completion(True, item.state.value, follow, reason)

    def _plan(self, item: Item, at: float) -> None:
        item.due_at = at
        self._due.due(at, item.key, item.host)

    def _count(self, change: Change) -> None:
        self._revisit_counters.outcomes[change.value] += 1
        self._events[f"revisit_{change.value}"] += 1

    def _retire(self, item: Item, before: State, after: State) -> None:
        """A revisited page leaves the cycle (gone, failed or suppressed): keep it for the retention period."""
        if after in _RETIRED and before not in _RETIRED:
            item.due_at = self._now + self.revisit_config(item.host, item.domain).retention_s
            self._due.retain(item.due_at, item.key, item.host)
            self._revisit_counters.forget(item.key)

    # ------------------------------------------------------------------ time passing

    def _promote_due(self, now: float) -> None:
        """Pages whose revisit time has come: into their host's revisit window (fetched -> scheduled) while it
        has room, else onto the host's waiting list; and retired pages whose retention is over: pruned."""
        due, front, window = self._due, self._front, self._config.window
        while (entry := due.pop_due(now)) is not None:
            at, key, host_name = entry
            host = front.get(host_name)
            if host is None or host.domain not in self._domains:
                continue  # a domain released since: its new owner has the row
            if len(host.revisits) < window and not host.revisit_wait:
                self._promote(host, key, at)
            else:
                host.revisit_wait.append((at, key))
            front.wake_now(host)
        gone: list[Item] = []
        while (entry := due.pop_expired(now)) is not None:
            at, key, host_name = entry
            host = front.get(host_name)
            if host is None or host.domain not in self._domains:
                continue
            row = self._store.get(key)
            if row is None or row.state not in _RETIRED or row.due_at != at:
                continue
            if row.reason == Change.GONE.value:
                gone.append(row)
                continue
            # The history goes; the reason stays (why the page left the cycle: a report counts it, and a policy
            # refusal is still one that a run under a wider policy reconsiders). The line carries the cleared
            # numbers, so replay clears them too.
            row.due_at = row.interval_s = row.visits = row.changes = row.watched_s = row.changed_s = 0.0
            self._move(row, Event.PRUNE, row.reason, data=pack_revisit(row))
        if gone:
            self._store.prune([row.key for row in gone])
            for row in gone:
                self._counts[row.state.value] -= 1
            self._events["pruned"] += len(gone)

    def _promote(self, host: Host, key: str, at: float) -> bool:
        """Move one page into its host's revisit window if its row still says it is due at `at`."""
        row = self._store.get(key)
        if row is None or row.state is not State.FETCHED or row.due_at != at or key in host.revisits:
            return False
        row.attempt = 0  # attempts count the tries of this visit: retries and expiries are judged per visit
        self._move(row, Event.REVISIT, "refetch" if row.reason == "refetch" else "due")
        host.revisits[key] = row
        return True

    def _fill_revisits(self, host: Host) -> None:
        """Move pages waiting for room into the host's revisit window, earliest due first."""
        wait, window = host.revisit_wait, self._config.window
        wait.sort()
        taken = 0
        while taken < len(wait) and len(host.revisits) < window:
            at, key = wait[taken]
            taken += 1
            self._promote(host, key, at)
        del wait[:taken]

    def _best_revisit(self, host: Host, now: float) -> Item | None:
        """The revisit this host should send next, if it has any due."""
        if host.revisit_wait and len(host.revisits) < self._config.window:
            self._fill_revisits(host)
        if not host.revisits:
            return None
        return min(host.revisits.values(), key=lambda it: revisit_rank(it, now))

    def _revisit_turn(self, host: Host, new_waiting: bool) -> bool:
        """Whether a host with a due revisit sends it now rather than a new URL (a credit of `share` per lease
        while both wait; with nothing new waiting, the revisit goes)."""
        if not new_waiting:
            return True
        share = self.revisit_config(host.name, host.domain).share
        return host.revisit_credit + share >= 1.0 - 1e-9

    def _spend_turn(self, host: Host, revisit: bool) -> None:
        share = self.revisit_config(host.name, host.domain).share
        host.revisit_credit = host.revisit_credit + share - (1.0 if revisit else 0.0)

    def _took_revisit(self, host: Host, item: Item, now: float) -> None:
        del host.revisits[item.key]
        self._revisit_counters.lag(now - item.due_at)

    # ------------------------------------------------------------------ restart and handoff

    def _adopt_revisit(self, item: Item, host: Host) -> bool:
        """Rebuild one row's revisit state in RAM; True when the row was a revisit (the caller then skips it)."""
        if item.kind is not Kind.PAGE or item.checked_at <= 0:
            return False
        if item.state is State.SCHEDULED:
            host.revisits[item.key] = item
            return True
        if item.state is State.FETCHED and item.due_at > 0:
            self._due.due(item.due_at, item.key, item.host)
            self._revisit_counters.page(item)
        elif item.state in _RETIRED and item.due_at > 0:
            self._due.retain(item.due_at, item.key, item.host)
        return False

    # ------------------------------------------------------------------ administration

    def refetch(self, url: str, at: float) -> tuple[str, str, float]:
        """Fetch one page again at `at` (Unix seconds; now or earlier: as soon as its host allows).

        Returns (its fetch key, its state, its due time). A page already queued or in flight is left as it is (its
        state is answered, due time 0). KeyError: no such page on this node; ValueError: the page ended in a
        state it is not fetched again from (rejected, failed, suppressed), or `at` is not a finite time.
        """
        if not math.isfinite(at):
            raise ValueError("refetch time must be a finite Unix time")
        try:
            ident = identify(url)
            key, domain = ident.fetch_key, ident.domain
        except UrlRejected:
            key, domain = url, ""
        if domain and not self.owns(domain):
            raise KeyError(f"this node does not own the domain of {url!r}")
        row = self._store.get(key)
        if row is None or row.kind is not Kind.PAGE:
            raise KeyError(f"no such page on this node: {url!r}")
        if row.state in (State.SCHEDULED, State.LEASED, State.RETRYABLE):
            return key, row.state.value, 0.0
        if row.state is not State.FETCHED:
            raise ValueError(f"{url!r} is {row.state.value} ({row.reason}): only a fetched page is fetched again")
        host = self._front.host(row.host, row.domain)
        self._domains.add(row.domain)
        self._plan(row, at)
        self._move(row, Event.REFETCH, "refetch", data=pack_revisit(row))
        self._front.wake_now(host)
        return key, row.state.value, at

    # ------------------------------------------------------------------ inspection

    def revisit_stats(self) -> RevisitView:
        now = self._clock.now()
        c = self._revisit_counters
        waiting = sum(len(h.revisits) + len(h.revisit_wait) for h in self._front)
        staleness, sampled = c.staleness(now)
        return RevisitView(
            policy=self._config.revisit.policy,
            outcomes=dict(c.outcomes),
            lag_buckets=tuple(zip(LAG_BOUNDS, c.lag_counts, strict=True)),
            lag_sum_s=c.lag_sum,
            lag_max_s=c.lag_max,
            pending=len(self._due) + waiting,
            due_now=waiting + self._due.due_by(now),
            staleness=staleness,
            sampled=sampled,
        )
