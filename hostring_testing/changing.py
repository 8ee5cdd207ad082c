"""Pages that change over time: served over HTTP with validators and 304s, and modelled as Poisson processes.

`ChangingPage` is a page of the loopback web (`LocalWeb`) whose body changes on a schedule (every `period_s`
seconds, or as a Poisson process of a given rate, or never). It sends ETag and Last-Modified and answers a
conditional GET whose validators match the current version with 304 Not Modified (If-None-Match wins over
If-Modified-Since, as RFC 9110 §13.2.2 orders them). Each version's body is fresh text, so versions differ by
digest and by simhash.

`ChangeWeb` is the oracle of a simulated web for the virtual clock: pages change as Poisson processes of known
rates, a fetch learns the current version, and the web keeps the time-averaged freshness of the fetcher's copy
(the fraction of pages whose stored copy is the current version), over a measuring window. It keeps a few
numbers per page and draws changes as time moves on (Poisson processes are memoryless), so 100k pages over a
long horizon cost little memory; fetches of one page must come in time order.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime

from hostring_testing.pages import HTML, Page, paragraph

__all__ = ["ChangeWeb", "ChangingPage", "version_body"]


def version_body(path: str, version: int, links: Sequence[str] = ()) -> bytes:
    """The HTML of one version of a page: its own paragraphs (a new version shares no text with the last)."""
    rng = random.Random(f"{path}#{version}")
    items = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    text = " ".join(paragraph(rng, 6) for _ in range(3))
    return (
        f"<!doctype html><html><head><title>{path} v{version}</title></head><body><h1>{path}</h1>"
        f"<p>{text}</p><ul>{items}</ul></body></html>"
    ).encode()


@dataclass
class ChangingPage(Page):
    """A page whose version changes every `period_s` seconds, or at the events of a Poisson process of `rate`
    per second (seeded by `seed`), or never (neither given), counted from `start` (Unix seconds).

    `name` sets the text (pages of one name serve the same versions: give each page its own), `links` are written
    into every version. `near_duplicate` makes a new version differ from the first only by a counter line (a new
    digest, the same simhash neighbourhood).
    """

    name: str = ""
    period_s: float = 0.0
    rate: float = 0.0
    seed: int = 0
    start: float = 0.0
    links: tuple[str, ...] = ()
    near_duplicate: bool = False
    _events: list[float] = field(default_factory=list, repr=False)
    _rng: random.Random | None = field(default=None, repr=False)

    def version_at(self, now: float) -> int:
        """How many times the page changed between `start` and `now`."""
        if now <= self.start:
            return 0
        if self.period_s > 0:
            return int((now - self.start) // self.period_s)
        if self.rate <= 0:
            return 0
        if self._rng is None:
            self._rng = random.Random(self.seed)
            self._events.append(self.start + self._rng.expovariate(self.rate))
        while self._events[-1] <= now:
            self._events.append(self._events[-1] + self._rng.expovariate(self.rate))
        return bisect.bisect_right(self._events, now)

    def changed_at(self, version: int) -> float:
        """When version `version` appeared (`start` for version 0)."""
        if version <= 0:
            return self.start
        if self.period_s > 0:
            return self.start + version * self.period_s
        return self._events[version - 1]

    def at(self, now: float, request_headers: Mapping[str, str]) -> Page:
        """The response to a request at `now`: the current version, or 304 when the validators match it."""
        version = self.version_at(now)
        etag = f'"v{version}-{_tag(self.name, self.seed)}"'
        modified = formatdate(math.floor(self.changed_at(version)), usegmt=True)
        headers = {**self.headers, "ETag": etag, "Last-Modified": modified, "Cache-Control": "no-cache"}
        if _not_modified(request_headers, etag, self.changed_at(version)):
            return Page(status=304, body=b"", content_type="", headers=headers)
        if self.near_duplicate:
            body = version_body(self.name, 0, self.links) + f"<p>counter {version}</p>".encode()
        else:
            body = version_body(f"{self.name}/{self.seed}", version, self.links)
        return Page(status=200, body=body, content_type=HTML, headers=headers)


def _tag(name: str, seed: int) -> str:
    return hashlib.blake2b(f"{name}/{seed}".encode(), digest_size=4).hexdigest()


def _not_modified(request_headers: Mapping[str, str], etag: str, modified_at: float) -> bool:
    """RFC 9110 §13.1: If-None-Match (weak comparison) when present, else If-Modified-Since (second precision)."""
    inm = request_headers.get("if-none-match")
    if inm is not None:
        tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
        return "*" in tags or etag in tags
    ims = request_headers.get("if-modified-since")
    if ims is None:
        return False
    try:
        since = parsedate_to_datetime(ims).timestamp()
    except (TypeError, ValueError):
        return False
    return math.floor(modified_at) <= since


# ---------------------------------------------------------------------------------------------- the oracle


@dataclass(slots=True)
class _PageClock:
    """One page of a ChangeWeb: its rate, current version, next change and the fetcher's copy."""

    rate: float
    version: int = 0
    next_change: float = math.inf
    copy: int = -1  # the version the fetcher holds (-1: none)
    copy_fresh_until: float = -math.inf  # when the fetcher's copy stops being current
    copy_since: float = 0.0  # when it was fetched
    fetches: int = 0
    changes: int = 0


class ChangeWeb:
    """N pages changing as Poisson processes of known `rates` (per second), from time `start`.

    `fetch(i, t)` returns page i's version at t (and whether the fetcher's copy was already current, i.e.
    a conditional request would get 304). Freshness is measured from `window_start` to `finish()`'s time:
    for each page, the time its copy was current, divided by the window length times the number of pages.
    """

    def __init__(self, rates: Sequence[float], *, start: float, window_start: float | None = None, seed: int = 0):
        self.rng = random.Random(seed)
        self.start = start
        self.window_start = start if window_start is None else window_start
        self.pages = [_PageClock(r) for r in rates]
        for p in self.pages:
            p.next_change = start + self.rng.expovariate(p.rate) if p.rate > 0 else math.inf
        self._fresh = 0.0
        self._finished_at: float | None = None
        self.window_fetches = 0

    def __len__(self) -> int:
        return len(self.pages)

    def _advance(self, p: _PageClock, t: float) -> None:
        while p.next_change <= t:
            p.version += 1
            p.changes += 1
            p.next_change += self.rng.expovariate(p.rate)

    def _close(self, p: _PageClock, until: float) -> None:
        """Count the fresh time of p's current copy up to `until` (inside the window)."""
        if p.copy < 0:
            return
        lo = max(p.copy_since, self.window_start)
        hi = min(p.copy_fresh_until, until)
        if hi > lo:
            self._fresh += hi - lo

    def fetch(self, i: int, t: float) -> tuple[int, bool]:
        """Fetch page i at t: (its version, whether the fetcher's copy was current already)."""
        p = self.pages[i]
        self._advance(p, t)
        current = p.copy == p.version
        self._close(p, t)
        p.copy, p.copy_since, p.copy_fresh_until = p.version, t, p.next_change
        p.fetches += 1
        if t >= self.window_start:
            self.window_fetches += 1
        return p.version, current

    def version(self, i: int, t: float) -> int:
        p = self.pages[i]
        self._advance(p, t)
        return p.version

    def finish(self, t: float) -> float:
        """The time-averaged freshness over [window_start, t] (call once, at the end)."""
        for p in self.pages:
            self._close(p, t)
        self._finished_at = t
        span = (t - self.window_start) * len(self.pages)
        return self._fresh / span if span > 0 else 0.0

    @property
    def fetches(self) -> int:
        return sum(p.fetches for p in self.pages)


def uniform_freshness(rates: Sequence[float], interval_s: float) -> float:
    """The expected time-averaged freshness of visiting every page every `interval_s` (Poisson pages):
    the mean over pages of (1 - exp(-λI)) / (λI)."""
    total = 0.0
    for lam in rates:
        x = lam * interval_s
        total += 1.0 if x < 1e-12 else (1.0 - math.exp(-x)) / x
    return total / len(rates) if rates else 0.0
