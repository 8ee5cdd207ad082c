"""Tunable policy of a frontier node, with the defaults an operator gets when they say nothing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PolitenessConfig:
    """How long a host rests between requests and how that adapts.

    delay = max(min_delay, robots Crawl-delay capped, factor x response time) x backoff, where backoff grows on
    429 / 5xx / timeouts and decays slowly on success, within fixed limits.
    """

    min_delay_s: float = 1.0
    response_factor: float = 1.0
    crawl_delay_cap_s: float = 30.0
    max_delay_s: float = 120.0
    concurrency: int = 1
    backoff_step: float = 2.0
    max_backoff: float = 32.0
    recovery: float = 0.75
    retry_after_cap_s: float = 600.0
    latency_rise: float = 3.0
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


@dataclass(frozen=True, slots=True)
class FrontierConfig:
    """Everything the core is told; `policy_version` is journaled so a reader knows which rules applied."""

    politeness: PolitenessConfig = field(default_factory=PolitenessConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    budgets: BudgetConfig = field(default_factory=BudgetConfig)
    user_agent: str = "hostring/0.1 (+https://github.com/hostring/hostring)"
    lease_s: float = 120.0
    window: int = 16
    max_redirect_hops: int = 5
    near_duplicate_distance: int = 3
    scope: str = "all"  # all | host | domain (seeds widen it) | list (add_scope() from a file)
    policy_version: int = 1
