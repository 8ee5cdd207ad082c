"""Revisits: how often each page changes, when it is fetched next, and the queue of pages waiting for that time.

Estimator. A page is checked at irregular times; each check says whether it changed since the previous one
(304 or the same body digest: no; a near duplicate by simhash: no, see `near_duplicate`). Per page we keep four
numbers: n visits compared, X of them changed, T seconds watched over those n intervals and Tc seconds of the X
intervals that held a change. Cho and Garcia-Molina's estimator for a regular interval I,
λ = -log((n - X + 0.5) / (n + 0.5)) / I, is the bias-reduced maximum-likelihood estimate of a Poisson rate
from X detections in n looks. For irregular intervals the likelihood equation is sum over changed intervals of
t_i / (exp(λ t_i) - 1) = T - Tc; taking every changed interval at their mean length tc = Tc / X solves it in
closed form, and the same 0.5 correction (half a mean interval, h = T / 2n) gives
λ = log((T + h) / (T - Tc + h)) / tc, which is Cho's estimator exactly when the intervals are equal. Older visits
fade once n reaches the configured history (all four numbers are scaled down), so a page whose habits change
is learnt again.

Interval. Under a price μ per fetch the freshness-optimal interval of a page with rate λ solves
g(λ I) = μ λ, g(x) = 1 - (1 + x) e^-x (the Lagrange condition of maximising time-averaged freshness
(1 - e^-λI) / (λI) for a given number of fetches; Cho and Garcia-Molina, "Effective page refresh policies").
Slow pages get I ≈ sqrt(2μ/λ): they are visited less than proportionally, which is what beats a uniform
schedule of the same cost. The price comes from the initial interval I0: μ = (1 - 2/e) I0, so a page that
changes once per I0 is visited every I0. Where the theory says "never" (μλ ≥ 1: the page changes too fast to be
caught fresh at this price) we stop at μλ = 0.95 instead: a page that changed at every visit cannot show how
fast it changes, and the capped rule settles such pages at about the initial interval rather than swinging
between it and the maximum. While fewer than SHORT visits are compared, the interval is adjusted
multiplicatively instead (halved on a change, doubled otherwise); afterwards each step is still held within a
factor of two of the last one, and every interval is clamped to [min, max].
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import Counter
from dataclasses import dataclass

from frontier_node.core.config import RevisitConfig
from frontier_node.core.records import Item

KAPPA = 1.0 - 2.0 / math.e  # g(1): the price that makes a page changing once per I0 be visited every I0
SHORT = 3  # visits compared before the estimator is trusted over the multiplicative adjustment
_CAP = 0.95  # largest μλ the rule solves for (see the module docstring)
_STEP = 2.0  # an interval moves at most by this factor per visit

# Journal data of a line that sets a page's revisit state: a tag no admit line starts with (those start with
# a URL), then the fields below, tab-separated; floats in repr form so replay rebuilds them exactly.
REVISIT_TAG = "R"
REVISIT_FIELDS = (
    "due_at", "checked_at", "stored_at", "interval_s", "visits", "changes", "watched_s", "changed_s", "simhash",
)  # fmt: skip

# Revisit lag buckets (upper bounds, seconds) for the core's histogram; the last one is +inf.
LAG_BOUNDS = (0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86_400.0, math.inf)


class Change(enum.StrEnum):
    """What a revisit found, as counted and journaled ("revisit:<value>")."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"  # 200 with the same body digest
    NOT_MODIFIED = "not_modified"  # 304 to the conditional request
    NEAR_DUPLICATE = "near_duplicate"  # 200 within the simhash distance of the stored body
    MISSING = "missing"  # 404/410 once: fetched again soon to confirm
    GONE = "gone"  # 404/410 confirmed: the page is retired


def near_duplicate(a: int, b: int, max_distance: int) -> bool:
    """Whether two simhashes are within `max_distance` bits (0 means "not computed": never near).

    A near duplicate counts as no change for the estimator, while the stored copy is replaced: a page whose
    only difference is a clock, a counter or a rotating banner would otherwise look like it changes at every
    visit and draw the shortest interval, spending fetches on nothing a reader would call new.
    """
    return bool(a and b and max_distance >= 0 and ((a ^ b) & 0xFFFFFFFFFFFFFFFF).bit_count() <= max_distance)


def describe(config: RevisitConfig) -> str:
    """A revisit policy in a few words, e.g. "adaptive from 1d in [1h, 30d], share 0.5"."""
    if not config.enabled:
        return "off"
    if config.policy == "fixed":
        return f"fixed every {duration_text(config.interval_s)}, share {config.share:g}"
    return (
        f"adaptive from {duration_text(config.interval_s)} in [{duration_text(config.min_s)}, "
        f"{duration_text(config.max_s)}], share {config.share:g}"
    )


def duration_text(seconds: float) -> str:
    """Seconds as the largest whole unit that fits (d, h, m, s), as the CLI takes them."""
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"


# ---------------------------------------------------------------------------------------------- estimator


def observe(item: Item, now: float, changed: bool, history: float) -> None:
    """Fold one check of `item` at `now` into its change history, then remember `now` as its last check."""
    t = now - item.checked_at if item.checked_at > 0 else 0.0
    if t > 0:
        if item.visits + 1 > history:
            scale = (history - 1) / item.visits
            item.visits *= scale
            item.changes *= scale
            item.watched_s *= scale
            item.changed_s *= scale
        item.visits += 1
        item.watched_s += t
        if changed:
            item.changes += 1
            item.changed_s += t
    item.checked_at = now


def rate(visits: float, changes: float, watched_s: float, changed_s: float) -> float:
    """Estimated changes per second from a change history (0 when no change was ever seen)."""
    if changes <= 0 or visits <= 0 or watched_s <= 0 or changed_s <= 0:
        return 0.0
    h = 0.5 * watched_s / visits
    return math.log((watched_s + h) / (watched_s - changed_s + h)) / (changed_s / changes)


def item_rate(item: Item) -> float:
    return rate(item.visits, item.changes, item.watched_s, item.changed_s)


def _g(x: float) -> float:
    return 1.0 - (1.0 + x) * math.exp(-x)


def _solve_g(y: float) -> float:
    """The x > 0 with g(x) = y, for 0 < y < 1 (g rises from 0 to 1): Newton steps kept inside a bracket."""
    if y < 1e-6:
        return math.sqrt(2.0 * y)  # g(x) ≈ x²/2 near 0
    lo, hi = 0.0, 2.0
    while _g(hi) < y:
        lo, hi = hi, hi * 2.0
    x = min(max(math.sqrt(2.0 * y), lo), hi)
    for _ in range(60):
        gx = _g(x) - y
        if abs(gx) < 1e-12:
            break
        if gx < 0:
            lo = x
        else:
            hi = x
        slope = x * math.exp(-x)
        step = x - gx / slope if slope > 0 else lo
        x = step if lo < step < hi else 0.5 * (lo + hi)
        if hi - lo < 1e-12 * hi:
            break
    return x


def optimal_interval(lam: float, initial_s: float) -> float:
    """The freshness-optimal interval (seconds) of a page changing `lam` times a second, at the price set by
    `initial_s` (unclamped; infinite for a page never seen to change)."""
    if lam <= 0:
        return math.inf
    return _solve_g(min(KAPPA * initial_s * lam, _CAP)) / lam


def next_interval(item: Item, config: RevisitConfig, changed: bool) -> float:
    """The interval until `item`'s next visit after a check (its history already updated with it)."""
    if config.policy == "fixed":
        return config.interval_s
    previous = item.interval_s if item.interval_s > 0 else config.interval_s
    if item.visits < SHORT:
        target = previous / _STEP if changed else previous * _STEP
    else:
        target = optimal_interval(item_rate(item), config.interval_s)
        target = min(max(target, previous / _STEP), previous * _STEP)
    return min(max(target, config.min_s), config.max_s)


def first_interval(config: RevisitConfig) -> float:
    return config.interval_s


def change_probability(item: Item, now: float) -> float:
    """The chance that `item` changed since its last check, by its estimated rate."""
    lam = item_rate(item)
    if lam <= 0 or item.checked_at <= 0:
        return 0.0
    return 1.0 - math.exp(-lam * max(0.0, now - item.checked_at))


def revisit_rank(item: Item, now: float) -> tuple[int, float, float]:
    """Order among a host's due revisits, smallest first: an operator's refetch, then the link priority, then the
    expected gain (chance of a change, worth more near the seeds: / (1 + depth)), then the earliest due."""
    if item.reason == "refetch":
        return (-(2**31), 0.0, item.due_at)
    return (item.priority, -change_probability(item, now) / (1 + item.depth), item.due_at)


# ---------------------------------------------------------------------------------------------- journal data


def pack_revisit(item: Item) -> str:
    """The `data` of a journal line that sets `item`'s revisit state (see REVISIT_FIELDS)."""
    return "\t".join(
        (
            REVISIT_TAG,
            repr(item.due_at),
            repr(item.checked_at),
            repr(item.stored_at),
            repr(item.interval_s),
            repr(item.visits),
            repr(item.changes),
            repr(item.watched_s),
            repr(item.changed_s),
            str(item.simhash),
        )
    )


def is_revisit_data(data: str) -> bool:
    return data.startswith(REVISIT_TAG + "\t")


def apply_revisit(item: Item, data: str) -> None:
    """Set `item`'s revisit state from the `data` of a journal line (inverse of pack_revisit)."""
    parts = data.split("\t")
    if len(parts) != len(REVISIT_FIELDS) + 1 or parts[0] != REVISIT_TAG:
        raise ValueError(f"not revisit data: {data[:80]!r}")
    (item.due_at, item.checked_at, item.stored_at, item.interval_s, item.visits, item.changes, item.watched_s,
     item.changed_s) = (float(p) for p in parts[1:9])  # fmt: skip
    item.simhash = int(parts[9])


# ---------------------------------------------------------------------------------------------- the queue


class DueBook:
    """Pages waiting for a time: fetched pages for their revisit, retired pages for their retention to end.

    Heaps of (time, key, host). An entry is never removed early; whoever pops it checks it against the page's
    row (state and due time), so a superseded, released or pruned entry is simply skipped.
    """

    __slots__ = ("_prune", "_revisits")

    def __init__(self) -> None:
        self._revisits: list[tuple[float, str, str]] = []
        self._prune: list[tuple[float, str, str]] = []

    def __len__(self) -> int:
        """Revisit entries waiting (retention entries are not work)."""
        return len(self._revisits)

    def due(self, at: float, key: str, host: str) -> None:
        heapq.heappush(self._revisits, (at, key, host))

    def retain(self, until: float, key: str, host: str) -> None:
        heapq.heappush(self._prune, (until, key, host))

    def pop_due(self, now: float) -> tuple[float, str, str] | None:
        return heapq.heappop(self._revisits) if self._revisits and self._revisits[0][0] <= now else None

    def pop_expired(self, now: float) -> tuple[float, str, str] | None:
        return heapq.heappop(self._prune) if self._prune and self._prune[0][0] <= now else None

    def next_revisit(self) -> tuple[float, str] | None:
        """(time, key) of the earliest revisit entry (it may have been superseded since), or None."""
        return (self._revisits[0][0], self._revisits[0][1]) if self._revisits else None

    def next_at(self) -> float | None:
        times = [heap[0][0] for heap in (self._revisits, self._prune) if heap]
        return min(times) if times else None

    def due_by(self, now: float) -> int:
        """Revisit entries due at `now`: a walk of the heap that stops below entries not due yet, so it costs
        about as many steps as there are due entries (for inspection, not the hot path)."""
        heap, count, todo = self._revisits, 0, [0] if self._revisits else []
        while todo:
            i = todo.pop()
            if heap[i][0] <= now:
                count += 1
                todo.extend(j for j in (2 * i + 1, 2 * i + 2) if j < len(heap))
        return count


# ---------------------------------------------------------------------------------------------- counters


@dataclass(frozen=True, slots=True)
class RevisitView:
    """The node's revisit figures at one instant (metrics, the report, benchmarks)."""

    policy: str
    outcomes: dict[str, int]  # Change value -> revisits that found it
    lag_buckets: tuple[tuple[float, int], ...]  # (upper bound s, revisits leased with a lag up to it), not cumulative
    lag_sum_s: float
    lag_max_s: float
    pending: int  # fetched pages with a revisit time
    due_now: int  # of which due now (waiting for their host's turn)
    staleness: float  # estimated fraction of revisited pages whose stored copy is out of date now (sampled)
    sampled: int  # pages the staleness estimate is taken over

    @property
    def revisits(self) -> int:
        return sum(n for _, n in self.lag_buckets)


class RevisitCounters:
    """Outcomes, the lag histogram, and a hash sample of pages' rates for the staleness estimate."""

    __slots__ = ("_limit", "_sample", "_threshold", "lag_counts", "lag_max", "lag_sum", "outcomes")

    def __init__(self, sample_limit: int = 4096) -> None:
        self.outcomes: Counter[str] = Counter()
        self.lag_counts = [0] * len(LAG_BOUNDS)
        self.lag_sum = 0.0
        self.lag_max = 0.0
        self._sample: dict[str, tuple[float, float, int]] = {}  # key -> (rate, checked_at, hash)
        self._threshold = 1 << 64
        self._limit = sample_limit

    def lag(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        for i, bound in enumerate(LAG_BOUNDS):
            if seconds <= bound:
                self.lag_counts[i] += 1
                break
        self.lag_sum += seconds
        self.lag_max = max(self.lag_max, seconds)

    def page(self, item: Item) -> None:
        """Note a page's current rate and last check, if it falls in the sample (pages whose key hash is
        below a threshold that halves whenever the sample outgrows its limit; the process's own str hash, so
        the sample differs between processes, which an estimate does not mind)."""
        h = hash(item.key) & 0xFFFFFFFFFFFFFFFF  # str hashes are cached: cheaper than key_hash on every completion
        if h >= self._threshold:
            return
        self._sample[item.key] = (item_rate(item), item.checked_at, h)
        if len(self._sample) > self._limit:
            self._threshold >>= 1
            self._sample = {k: v for k, v in self._sample.items() if v[2] < self._threshold}

    def forget(self, key: str) -> None:
        self._sample.pop(key, None)

    def staleness(self, now: float) -> tuple[float, int]:
        """(estimated fraction of sampled pages changed since their last check, sample size)."""
        if not self._sample:
            return 0.0, 0
        total = 0.0
        for lam, checked_at, _ in self._sample.values():
            if lam > 0:
                total += 1.0 - math.exp(-lam * max(0.0, now - checked_at))
        return total / len(self._sample), len(self._sample)


def interval_bucket(seconds: float) -> str:
    """The label of an estimated change interval in the report's distribution."""
    if math.isinf(seconds):
        return "no change seen"
    for bound, label in _INTERVAL_LABELS:
        if seconds <= bound:
            return label
    return "over 30d"


_INTERVAL_LABELS = (
    (60.0, "up to 1m"),
    (600.0, "1m-10m"),
    (3600.0, "10m-1h"),
    (6 * 3600.0, "1h-6h"),
    (86_400.0, "6h-1d"),
    (7 * 86_400.0, "1d-7d"),
    (30 * 86_400.0, "7d-30d"),
)
INTERVAL_BUCKETS = (*(label for _, label in _INTERVAL_LABELS), "over 30d", "no change seen")
