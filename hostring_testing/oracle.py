"""The oracle: what a correct crawler fetches from a WebModel, by brute-force BFS over the model's identities.

It reads robots with its own rules (``hostring_testing.robots``) and names pages by the generator's identity,
so it shares no code with hostring's URL identity or scheduler.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hostring_testing.model import RobotsSpec, WebModel
from hostring_testing.pages import Key, under_trap

if TYPE_CHECKING:
    from hostring_testing.server import LocalWeb

__all__ = ["Oracle", "body_of", "needed_depth", "oracle_for"]


@dataclass
class Oracle:
    """What a correct crawler fetches from `seeds`, computed by BFS over the model's identities."""

    seeds: list[Key]
    reachable_allowed: set[Key]
    """Pages a correct crawler fetches (broken links included; robots files and trap pages excluded)."""
    disallowed: set[Key]
    """Every page of the model robots forbid (all pages of origins whose robots answer 503)."""
    blocked: set[Key]
    """Targets a correct crawler discovers through followable links but must not fetch because of robots."""
    broken: set[Key]
    """Reachable targets that 404."""
    trap_entries: set[Key]
    """Allowed trap pages linked from reachable pages: the crawler enters the trap there; budgets end it."""
    traps: dict[str, str]
    robots_missing: set[str]
    robots_unavailable: set[str]
    robots_redirects: dict[str, Key]
    robots_fetches: set[Key]
    """Robots files a correct crawler requests: /robots.txt of each contacted origin, redirect targets."""
    pages: set[Key]
    user_agent: str

    def seed_urls(self, web: LocalWeb) -> list[str]:
        """The seeds as real URLs of a running web."""
        return [web.url(label, path) for label, path in self.seeds]

    def urls(self, web: LocalWeb, keys: set[Key] | None = None) -> set[str]:
        """`keys` (default: reachable_allowed) as real URLs of a running web."""
        return {web.url(label, path) for label, path in (self.reachable_allowed if keys is None else keys)}

    def in_trap(self, key: Key) -> bool:
        """Whether `key` lies under its origin's trap prefix."""
        return under_trap(self.traps.get(key[0]), key[1])

    def judge(self, fetched: set[Key]) -> dict[str, set[Key]]:
        """Compare the (label, resource) pairs a crawler fetched with the oracle."""
        pages = {k for k in fetched if k not in self.robots_fetches and k[1] != "/robots.txt"}
        return {
            "missing": self.reachable_allowed - pages,
            "forbidden": pages & (self.disallowed | self.blocked),
            "unexpected": {k for k in pages - self.reachable_allowed if not self.in_trap(k)},
            "trap": {k for k in pages if self.in_trap(k)},
        }


def body_of(model: WebModel, key: Key) -> Key:
    """The page whose rendered body `key` serves: its mirror_of chain's end (itself for a page of its own)."""
    seen = {key}
    spec = model.pages.get(key)
    while spec is not None and spec.mirror_of is not None and spec.mirror_of not in seen:
        key = spec.mirror_of
        seen.add(key)
        spec = model.pages.get(key)
    return key


def oracle_for(model: WebModel, *, dedup_bodies: bool = False) -> Oracle:
    """Brute-force BFS over the model: robots, nofollow, meta nofollow, redirects, mirrors, traps.

    With `dedup_bodies`, a page whose exact body was already expanded (the twin reached first in BFS order) is
    fetched but its links are not followed, as a crawler that dedups bodies by digest does. The webs this is
    used on reach a mirror of another origin only through its original, so "first" does not depend on timing.
    """
    expanded: set[Key] = set()
    seen: set[Key] = set(model.seeds)
    queue: deque[Key] = deque(model.seeds)
    reachable: set[Key] = set()
    blocked: set[Key] = set()
    broken: set[Key] = set()
    trap_entries: set[Key] = set()
    contacted: set[str] = set()

    def push(key: Key) -> None:
        if key not in seen:
            seen.add(key)
            queue.append(key)

    while queue:
        key = queue.popleft()
        contacted.add(key[0])
        if not model.allowed(key):
            blocked.add(key)
            continue
        if model.in_trap(key):
            trap_entries.add(key)
            continue
        reachable.add(key)
        spec = model.pages.get(key)
        if spec is None:
            broken.add(key)
            continue
        if spec.redirect_to is not None:
            push(spec.redirect_to)
            continue
        source = model.pages[spec.mirror_of] if spec.mirror_of is not None else spec
        if spec.status != 200 or source.meta_nofollow:
            continue
        if dedup_bodies:
            body = body_of(model, key)
            if body in expanded:
                continue
            expanded.add(body)
        for link in source.links:
            if not link.nofollow:
                push(link.target)

    def kind(label: str) -> str:
        return model.robots.get(label, RobotsSpec()).kind

    robots_fetches = {(label, "/robots.txt") for label in contacted}
    redirects = {
        label: r.redirect_to for label, r in model.robots.items() if r.kind == "redirect" and r.redirect_to is not None
    }
    robots_fetches |= {target for label, target in redirects.items() if label in contacted}
    return Oracle(
        seeds=list(model.seeds),
        reachable_allowed=reachable,
        disallowed={k for k in model.pages if not model.allowed(k)},
        blocked=blocked,
        broken=broken,
        trap_entries=trap_entries,
        traps=dict(model.traps),
        robots_missing={o for o in model.origins if kind(o) == "missing"},
        robots_unavailable={o for o in model.origins if kind(o) == "unavailable"},
        robots_redirects=redirects,
        robots_fetches=robots_fetches,
        pages=set(model.pages),
        user_agent=model.user_agent,
    )


def needed_depth(model: WebModel) -> int:
    """The link depth a crawler needs to reach every page the oracle lists (links +1, redirects +0)."""
    oracle = oracle_for(model)
    dist: dict[Key, int] = dict.fromkeys(model.seeds, 0)
    queue: deque[Key] = deque(model.seeds)
    while queue:
        key = queue.popleft()
        d = dist[key]
        spec = model.pages.get(key)
        if spec is None or not model.allowed(key) or model.in_trap(key):
            continue
        if spec.redirect_to is not None:
            if dist.get(spec.redirect_to, 1 << 30) > d:
                dist[spec.redirect_to] = d
                queue.appendleft(spec.redirect_to)
            continue
        source = model.pages[spec.mirror_of] if spec.mirror_of is not None else spec
        if spec.status != 200 or source.meta_nofollow:
            continue
        for link in source.links:
            if not link.nofollow and dist.get(link.target, 1 << 30) > d + 1:
                dist[link.target] = d + 1
                queue.append(link.target)
    return max(dist[k] for k in oracle.reachable_allowed)
