"""Tunable policy of a frontier node, with the defaults an operator gets when they say nothing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PolitenessConfig:
    """How long a host rests between requests and how that adapts.

    delay = max(min_delay, robots Crawl-delay capped, rest) x backoff, where backoff grows on 429 / 5xx / timeouts
    and on a sudden rise in response time (latency_rise x the recent one, and at least rise_floor_s) and decays
    slowly on success, within fixed limits. rest is factor x the host's recent response time when that is at least
    slow_response_s (a struggling server) or the host is backing off; a host that answers fast rests only the
    delay it was given, so `--delay 0` means what it says.
    """

    min_delay_s: float = 1.0
    response_factor: float = 1.0
    slow_response_s: float = 0.5
    crawl_delay_cap_s: float = 30.0
    max_delay_s: float = 120.0
    concurrency: int = 1
    backoff_step: float = 2.0
    max_backoff: float = 32.0
    recovery: float = 0.75
    retry_after_cap_s: float = 600.0
    latency_rise: float = 3.0
    rise_floor_s: float = 0.05
    """A response counts as a rise in latency only when it also takes at least this long: a fast server's few
    milliseconds of jitter (1 ms, then 4 ms) are not a struggling server, and backing off from them slowed a
    healthy host's crawl by seconds."""
    give_up_after: int = 8


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Exponential backoff with bounded jitter for retryable outcomes, and the limit on attempts."""

    max_attempts: int = 3
    base_s: float = 5.0
    cap_s: float = 600.0
    jitter: float = 0.25
    robots_max_attempts: int = 4
    max_expiries: int = 5


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """Bounds that stop crawler traps; None switches a rule off."""

    max_pages_total: int | None = None
    max_pages_per_host: int | None = 10_000
    max_pages_per_domain: int | None = 50_000
    max_depth: int | None = 20
    max_query_variants: int | None = 64
    max_repeated_segments: int | None = 3
    max_url_length: int = 2048


REVISIT_POLICIES = ("off", "fixed", "adaptive")


@dataclass(frozen=True, slots=True)
class RevisitConfig:
    """When a fetched page is fetched again (core/revisit.py holds the estimator and the interval rule).

    off: a fetched page is done. fixed: every page every `interval_s`. adaptive: each page's own interval from
    its observed change history, clamped to [min_s, max_s], starting from `interval_s` (which also sets the
    price of a fetch: a page that changes once per `interval_s` is visited every `interval_s`).
    `share` is the part of a host's leases that go to due revisits while new URLs wait as well; `retention_s`
    how long gone pages and the change history of retired pages are kept; `history` how many visits the
    estimator remembers (older ones fade, so a page whose habits change is re-learnt).
    """

    policy: str = "off"
    interval_s: float = 86_400.0
    min_s: float = 3_600.0
    max_s: float = 30 * 86_400.0
    share: float = 0.5
    retention_s: float = 30 * 86_400.0
    history: float = 32.0

    def __post_init__(self) -> None:
        problem = revisit_config_problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def enabled(self) -> bool:
        return self.policy != "off"


def revisit_config_problem(c: RevisitConfig) -> str:
    """Why a revisit configuration is unusable ('' when it is fine): the message names the setting to fix."""
    if c.policy not in REVISIT_POLICIES:
        return f"unknown revisit policy {c.policy!r}: choose one of {', '.join(REVISIT_POLICIES)}"
    for name, value in (("interval", c.interval_s), ("min", c.min_s), ("max", c.max_s), ("retention", c.retention_s)):
        if not value > 0 or value == float("inf"):
            return f"revisit {name} must be a positive, finite duration (got {value})"
    if c.min_s > c.max_s:
        return f"revisit min ({c.min_s:g} s) is above revisit max ({c.max_s:g} s)"
    if not c.min_s <= c.interval_s <= c.max_s:
        return f"revisit interval ({c.interval_s:g} s) must lie within [min {c.min_s:g} s, max {c.max_s:g} s]"
    if not 0.0 <= c.share <= 1.0:
        return f"revisit share must be within [0, 1] (got {c.share})"
    if not c.history >= 2:
        return f"revisit history must be at least 2 visits (got {c.history})"
    return ""


@dataclass(frozen=True, slots=True)
class FrontierConfig:
    """Everything the core is told; `policy_version` is journaled so a reader knows which rules applied."""

    politeness: PolitenessConfig = field(default_factory=PolitenessConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    budgets: BudgetConfig = field(default_factory=BudgetConfig)
    revisit: RevisitConfig = field(default_factory=RevisitConfig)
    user_agent: str = "hostring/0.1 (+https://github.com/hostring/hostring)"
    lease_s: float = 120.0
    window: int = 16
    admission_window: int = 12
    """Items a host keeps in RAM from admission alone (at most `window`): a host that is only filled, not yet
    leased, holds three quarters of a window, the rest waiting in the store; a refill when it is leased loads a
    whole one. Fewer would save more RAM (8: 110 bytes per URL at 1M URLs over 10k hosts, against 153 with 16) but
    costs one more refill per host, a range scan of the store (bench.node's Lease+Complete, 10 URLs per host,
    lost a quarter of its rate at 8)."""
    max_redirect_hops: int = 5
    near_duplicate_distance: int = 3
    scope: str = "all"  # all | host | domain (seeds widen it) | list (add_scope() from a file)
    policy_version: int = 1
