"""Trap and budget rules: what stops a crawl from wandering forever, and the record of each breach."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from frontier_node.core.config import BudgetConfig

_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class Breach:
    """One rule breached under one pattern: the first example and how many were suppressed."""

    rule: str
    pattern: str
    first_example: str
    count: int = 1

    def to_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "pattern": self.pattern, "first_example": self.first_example, "count": self.count}


def _split(url: str) -> tuple[str, str]:
    """(path, query) of an absolute URL, cheaply."""
    start = url.find("/", url.find("//") + 2)
    if start < 0:
        return "/", ""
    rest = url[start:]
    path, _, query = rest.partition("?")
    return path, query


def _repeated_segments(path: str) -> int:
    """The largest number of times one non-empty path segment occurs."""
    segments = [s for s in path.split("/") if s]
    if len(set(segments)) == len(segments):
        return 1 if segments else 0
    return max(Counter(segments).values())


class Budgets:
    """Counts admitted pages per host, domain and path, and says which rule (if any) a new URL breaches."""

    def __init__(self, config: BudgetConfig) -> None:
        self.config = config
        self.total = 0
        self.per_host: Counter[str] = Counter()
        self.per_domain: Counter[str] = Counter()
        self.variants: Counter[str] = Counter()
        self.breaches: dict[tuple[str, str], Breach] = {}
        self.domains: dict[tuple[str, str], str] = {}
        """(rule, pattern) -> the registrable domain a breach belongs to ("" for the whole crawl's)."""
        self.dirty: set[str] = set()
        """Domains whose breaches changed since they were last saved."""

    def check(self, url: str, host: str, domain: str, depth: int) -> str | None:
        """The rule this URL breaches, recorded as a breach, or None when it may be admitted."""
        c = self.config
        rule, pattern = "", ""
        if len(url) > c.max_url_length:
            rule, pattern = "url_length", host
        elif c.max_depth is not None and depth > c.max_depth:
            rule, pattern = "depth", host
        elif c.max_pages_total is not None and self.total >= c.max_pages_total:
            rule, pattern = "pages_total", "*"
        elif c.max_pages_per_host is not None and self.per_host[host] >= c.max_pages_per_host:
            rule, pattern = "pages_per_host", host
        elif c.max_pages_per_domain is not None and self.per_domain[domain] >= c.max_pages_per_domain:
            rule, pattern = "pages_per_domain", domain
        else:
            path, query = _split(url)
            limit = c.max_repeated_segments  # a path ("/..." ) has no more segments than slashes: count first
            if limit is not None and path.count("/") > limit and _repeated_segments(path) > limit:
                rule, pattern = "repeated_segments", host + _DIGITS.sub("N", path)
            elif query and c.max_query_variants is not None and self.variants[host + path] >= c.max_query_variants:
                rule, pattern = "query_variants", host + path + "?*"
        if not rule:
            return None
        breach = self.breaches.get((rule, pattern))
        if breach is None:
            self.breaches[(rule, pattern)] = Breach(rule, pattern, url)
            self.domains[(rule, pattern)] = owner = "" if rule == "pages_total" else domain
        else:
            breach.count += 1
            owner = self.domains.get((rule, pattern), domain)
        self.dirty.add(owner)
        return rule

    def of_domain(self, domain: str) -> list[dict[str, object]]:
        """The breaches of one domain as stored."""
        return [b.to_dict() for k, b in sorted(self.breaches.items()) if self.domains.get(k, "") == domain]

    def load(self, domain: str, stored: Iterable[dict[str, object]]) -> None:
        """Take over stored breaches of `domain` (after a restart or a handoff); a larger count seen here wins."""
        for row in stored:
            key = (str(row["rule"]), str(row["pattern"]))
            count = int(str(row.get("count", 1)))
            breach = self.breaches.get(key)
            if breach is None:
                self.breaches[key] = Breach(key[0], key[1], str(row.get("first_example", "")), count)
            else:
                breach.count = max(breach.count, count)
            self.domains[key] = domain

    def charge(self, url: str, host: str, domain: str) -> None:
        """Count an admitted page against its budgets."""
        self.total += 1
        self.per_host[host] += 1
        self.per_domain[domain] += 1
        if "?" in url:
            path, _ = _split(url)
            self.variants[host + path] += 1

    def forget(self, hosts: Iterable[str], domains: Iterable[str]) -> None:
        """Stop counting pages of hosts and domains another node now owns (query variants stay counted)."""
        for host in hosts:
            self.total -= self.per_host.pop(host, 0)
        gone = set(domains)
        for domain in gone:
            self.per_domain.pop(domain, None)
        for key in [k for k, d in self.domains.items() if d in gone]:
            del self.domains[key]
            self.breaches.pop(key, None)
        self.dirty -= gone

    def report(self) -> list[dict[str, object]]:
        return [b.to_dict() for b in sorted(self.breaches.values(), key=lambda b: (-b.count, b.rule, b.pattern))]
