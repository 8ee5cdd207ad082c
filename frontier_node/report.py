"""The coverage report: every admitted identity's final disposition, reconciled from the store."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from frontier_node.core.records import Item, Kind
from frontier_node.core.revisit import INTERVAL_BUCKETS, Change, RevisitView, interval_bucket, item_rate
from frontier_node.core.states import TERMINAL, State
from frontier_node.core.views import CoverageInput

# Reasons that mean "never really tried": the crawl ended around them, so a reader should look at them.
UNRESOLVED_PREFIXES = ("robots_unavailable", "host_unreachable", "retries_exhausted", "lease_expired")
_EXAMPLES = 5


def coverage_report(source: CoverageInput, *, dispositions: bool = False) -> dict[str, Any]:
    """Counts by state and reason, robots denials, failures by class, suppressions by rule, and what is unresolved.

    `source` comes from a live node (Frontier.coverage_input()) or a store file (offline_report); what it does
    not know (budget breaches, Discover verdicts: None) is left out of the report.
    With `dispositions`, also the final state of every admitted identity (one row each: large for big crawls).

    Counts add up: `admitted` is the sum of `by_state` without `rejected` (links refused at admission), and
    `by_reason` splits `by_state` (keys "state:reason class"), with the first URL of each in `first_example`.
    An unresolved item not in a final state says when it may go on (`not_before`, Unix time, 0 when it may go
    as soon as its host's politeness allows) and, for a page held back by its origin's robots.txt, `waits_for`.
    """
    by_state: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    first: dict[str, str] = {}
    failures: Counter[str] = Counter()
    robots_denied: list[str] = []
    robots_files: Counter[str] = Counter()
    robots_pending: dict[str, Item] = {}
    unresolved: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    fetched_statuses: Counter[str] = Counter()
    intervals: Counter[str] = Counter()
    for item in source.items:
        if item.kind is Kind.ROBOTS:
            robots_files[f"{item.state.value}:{item.reason}"] += 1
            if item.state not in TERMINAL:
                robots_pending[item.origin] = item
            continue
        state = item.state.value
        by_state[state] += 1
        reason_class = item.reason.split(":")[0].split(" ")[0]
        key = f"{state}:{reason_class}" if reason_class else state
        by_reason[key] += 1
        first.setdefault(key, item.url)
        if item.state is State.FETCHED:
            fetched_statuses[str(item.status)] += 1
            if item.visits > 0:
                lam = item_rate(item)
                intervals[interval_bucket(1.0 / lam if lam > 0 else math.inf)] += 1
        if item.state is State.FAILED:
            failures[reason_class] += 1
        if item.state is State.SUPPRESSED and item.reason == "robots":
            robots_denied.append(item.url)
        # A page waiting for its revisit (queued or in flight again) has a stored copy: not unresolved.
        if (item.state not in TERMINAL and not item.checked_at) or item.reason.startswith(UNRESOLVED_PREFIXES):
            unresolved.append(
                {
                    "url": item.url,
                    "origin": item.origin,
                    "state": state,
                    "reason": item.reason,
                    "attempts": item.attempt,
                    "not_before": _not_before(item),
                }
            )
        if dispositions:
            rows.append(
                {
                    "key": item.key,
                    "url": item.url,
                    "state": state,
                    "reason": item.reason,
                    "attempts": item.attempt,
                    "status": item.status,
                    "depth": item.depth,
                    "evidence": item.evidence,
                }
            )
    for row in unresolved:  # robots rows come after their origin's first page: placed once all are read
        robots = robots_pending.get(row.pop("origin"))
        if robots is not None and row["state"] == State.SCHEDULED.value:
            row["waits_for"] = f"robots.txt ({robots.state.value}{': ' + robots.reason if robots.reason else ''})"
            row["not_before"] = max(row["not_before"], _not_before(robots))
    admitted = sum(n for s, n in by_state.items() if s != State.REJECTED.value)
    report: dict[str, Any] = {
        "run_id": source.run_id,
        "admitted": admitted,
        "by_state": dict(sorted(by_state.items())),
        "by_reason": dict(sorted(by_reason.items())),
        "first_example": dict(sorted(first.items())),
        "fetched_by_status": dict(sorted(fetched_statuses.items())),
        "robots_files": dict(sorted(robots_files.items())),
        "robots_denied": {"count": len(robots_denied), "examples": sorted(robots_denied)[:_EXAMPLES]},
        "failures_by_class": dict(sorted(failures.items())),
        "suppressed_by_rule": list(source.budget_breaches or ()),
        "discovered_by_verdict": {f"{v}:{r}" if r else v: n for (v, r), n in sorted((source.verdicts or {}).items())},
        "unresolved": {"count": len(unresolved), "items": unresolved[:100]},
    }
    if source.budget_breaches is None:
        del report["suppressed_by_rule"]
    if source.verdicts is None:
        del report["discovered_by_verdict"]
    revisits = revisit_section(source, intervals)
    if revisits is not None:
        report["revisits"] = revisits
    if dispositions:
        report["dispositions"] = rows
    return report


def _not_before(item: Item) -> float:
    """When a waiting item may go on by itself: a retry's due time, a lease's deadline; 0 when not waiting."""
    if item.state is State.RETRYABLE:
        return item.due_at
    if item.state is State.LEASED:
        return item.deadline
    return 0.0


def revisit_section(source: CoverageInput, intervals: Counter[str]) -> dict[str, Any] | None:
    """Revisits by outcome, the distribution of estimated change intervals and (live) the revisit lag; None
    when the crawl never revisited anything and has no revisit policy."""
    view = source.revisits
    outcomes = dict(view.outcomes) if view is not None else dict(source.revisit_outcomes or {})
    if not outcomes and not intervals and (view is None or view.policy == "off"):
        return None
    out: dict[str, Any] = {
        "by_outcome": {c.value: outcomes.get(c.value, 0) for c in Change},
        "estimated_change_intervals": {b: intervals.get(b, 0) for b in INTERVAL_BUCKETS if intervals.get(b, 0)},
    }
    if view is not None:
        out["policy"] = view.policy
        out["pending"] = view.pending
        out["due_now"] = view.due_now
        out["estimated_staleness"] = round(view.staleness, 4)
        out["lag_s"] = lag_summary(view)
    return out


def lag_summary(view: RevisitView) -> dict[str, Any]:
    """Revisit lag (lease time minus due time): count, mean, max, and p50/p90 as bucket upper bounds."""
    n = view.revisits
    summary: dict[str, Any] = {
        "count": n,
        "mean": round(view.lag_sum_s / n, 3) if n else 0.0,
        "max": round(view.lag_max_s, 3),
        "buckets": {("inf" if math.isinf(b) else f"{b:g}"): c for b, c in view.lag_buckets},
    }
    for name, q in (("p50", 0.5), ("p90", 0.9)):
        seen = 0
        for bound, count in view.lag_buckets:
            seen += count
            if n and seen >= q * n:
                summary[name] = "inf" if math.isinf(bound) else bound
                break
    return summary
