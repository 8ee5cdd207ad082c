"""The human summary of a crawl's report: how it ended, what became of every URL and why, and for each refusal an
operator can lift, the flag that lifts it.

Counts add up: "N admitted URLs = fetched a + failed b + ..." is the report's by_state without the links refused
at admission (rejected), and each "state:reason" line splits those counts further, with its first URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hostring_cli.progress import clock, wall
from hostring_cli.revisit import revisit_summary

# What an operator can do about a refusal (reason class -> the fix).
FIXES = {
    "network_policy": "--allow-network CIDR (the fetcher refuses loopback, private and other non-public addresses)",
    "out_of_scope": "--scope all, or a FILE of hosts and domains (links off the seeds' domains are not followed)",
    "depth": "--max-depth N",
    "pages_per_host": "--max-pages-per-host N",
    "pages_total": "--max-pages N",
    "robots_unavailable": "the origin's robots.txt did not answer (see robots.txt above); check the URL and network",
    "host_unreachable": "the host kept failing; check the URL and network, then --resume",
    "connect_error": "nothing answers at that address; check the URL",
    "dns_error": "the host name does not resolve; check the URL",
    "too_large": "--max-response-bytes N",
    "total_timeout": "--fetch-timeout S",
}
FINISH_REASONS = {
    "drained": "drained: nothing left to fetch",
    "budget": "budget reached (--max-pages)",
    "duration": "duration reached (--duration)",
    "stopped": "stopped",
    "idle": "idle: the only work left waits longer than --idle-exit",
}
_ORDER = ("fetched", "failed", "suppressed", "scheduled", "retryable", "leased", "rejected")
_SHOWN = 10


@dataclass
class Finish:
    """How a crawl run ended, for the summary and report.json (`finish`)."""

    reason: str
    elapsed_s: float
    requests: int  # requests this run made, robots.txt included
    bytes: int  # body bytes this run received (decoded)
    deferred: list[dict[str, Any]] = field(default_factory=list)
    idle_exit_s: float = 0.0
    out: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests_this_run": self.requests,
            "bytes_this_run": self.bytes,
            "deferred": self.deferred,
        }


def size(n: int) -> str:
    """A byte count for people: 512 B, 1.2 kB, 3.4 MB."""
    value = float(n)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def fix_for(reason_key: str) -> str:
    """' -> fix: ...' for a "state:reason" key whose reason an operator can act on; '' otherwise."""
    reason = reason_key.partition(":")[2]
    return f"  -> fix: {FIXES[reason]}" if reason in FIXES else ""


def summarize(report: dict[str, Any], finish: Finish | None = None) -> str:
    """The summary printed at the end of a crawl (with `finish`) and by `hostring report`."""
    lines: list[str] = []
    if finish is not None:
        took = f"{finish.elapsed_s:.1f} s" if finish.elapsed_s < 60 else clock(finish.elapsed_s)
        lines.append(
            f"finished: {FINISH_REASONS.get(finish.reason, finish.reason)}, after {took}; this run made "
            f"{finish.requests} requests (robots.txt included) and received {size(finish.bytes)}"
        )
    by_state: dict[str, int] = report["by_state"]
    states = sorted(by_state, key=lambda s: (_ORDER.index(s) if s in _ORDER else len(_ORDER), s))
    parts = " + ".join(f"{s} {by_state[s]}" for s in states if s != "rejected") or "none"
    rejected = by_state.get("rejected", 0)
    lines.append(
        f"run {report['run_id']}: {report['admitted']} admitted URLs = {parts}"
        + (f"; {rejected} links rejected at admission" if rejected else "")
    )
    if report.get("fetched_by_status"):
        statuses = ", ".join(f"{k} x{v}" for k, v in report["fetched_by_status"].items())
        lines.append(f"  fetched by status: {statuses}")
    first: dict[str, str] = report.get("first_example", {})
    by_reason: dict[str, int] = report.get("by_reason", {})
    for key in sorted(by_reason, key=lambda k: (_rank(k), -by_reason[k], k)):
        if key == "fetched" or key.startswith("fetched:"):
            continue
        example = f", first {first[key]}" if key in first else ""
        lines.append(f"  {key} {by_reason[key]}{example}{fix_for(key)}")
    robots = report.get("robots_files", {})
    if robots:
        lines.append("  robots.txt files: " + ", ".join(f"{k} x{v}" for k, v in robots.items()))
    if report.get("robots_denied", {}).get("count"):
        lines.append(f"  pages robots.txt disallows: {report['robots_denied']['count']}")
    verdicts = report.get("discovered_by_verdict")
    if verdicts:
        lines.append("  links discovered: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
    for b in report.get("suppressed_by_rule", [])[:_SHOWN]:
        lines.append(
            f"  links suppressed by {b['rule']} ({b['pattern']}): {b['count']}, first {b['first_example']}"
            + fix_for(f"suppressed:{b['rule']}")
        )
    lines += revisit_summary(report)
    unresolved = report["unresolved"]
    lines.append(f"  unresolved: {unresolved['count']}")
    if finish is None or finish.reason != "idle":
        for u in unresolved["items"][:_SHOWN]:
            lines.append(f"    {u['url']}  {u['state']} {u['reason']}".rstrip())
    if finish is not None and finish.deferred:
        lines += _deferred(finish)
    if finish is not None and finish.reason != "stopped" and not by_state.get("fetched"):
        lines.append("nothing was fetched: see the reasons above (exit code 3)")
    return "\n".join(lines)


def _deferred(finish: Finish) -> list[str]:
    soonest = min((d["not_before"] for d in finish.deferred if d["not_before"]), default=0.0)
    when = f" after {wall(soonest)}" if soonest else ""
    lines = [
        f"deferred: {len(finish.deferred)} URLs wait longer than --idle-exit {finish.idle_exit_s:g}s; "
        f"continue{when} with: hostring crawl --resume --out {finish.out}"
    ]
    for d in finish.deferred[:_SHOWN]:
        why = d.get("waits_for") or d["reason"] or d["state"]
        at = f", not before {wall(d['not_before'])}" if d["not_before"] else ""
        lines.append(f"    {d['url']}  {d['state']}: {why}{at}")
    if len(finish.deferred) > _SHOWN:
        lines.append(f"    ... and {len(finish.deferred) - _SHOWN} more in report.json (finish.deferred)")
    return lines


def _rank(key: str) -> int:
    state = key.partition(":")[0]
    return _ORDER.index(state) if state in _ORDER else len(_ORDER)
