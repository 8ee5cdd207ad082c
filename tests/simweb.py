"""A simulated worker fleet on a virtual clock, driving the scheduler core over a random web.

The web and its oracle are the shared test web's (hostring_testing: WebModel, oracle_for): pages named by
(host, path), the oracle a brute-force BFS over the model's own graph, sharing no code with hostring's URL
identity or scheduler. What only a simulation needs rides beside the model in SimWeb: each host's response time
and transient failures (503s before a page or a robots file answers), which change when something is fetched,
never whether. The simulated worker writes links in many spellings and answers from the model.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field

from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import replay
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.states import State
from hostring.clock import VirtualClock
from hostring_testing import Key, LinkSpec, PageSpec, RobotsSpec, WebModel, oracle_for

PageId = Key  # (host, path): the hosts are the model's origin labels


@dataclass
class SimWeb:
    """A WebModel plus what the simulated servers do over time."""

    model: WebModel
    response_s: dict[str, float]
    """host -> seconds every response takes."""
    fail_first: dict[PageId, int] = field(default_factory=dict)
    """page -> transient failures (503) before it answers."""
    robots_fail_first: dict[str, int] = field(default_factory=dict)
    """host -> transient 503s before its robots file (wherever it is served) answers."""


def spell(pid: PageId, base: PageId, rng: random.Random) -> str:
    """One of many spellings of a link from page `base` to page `pid`."""
    host, path = pid
    variants = [
        f"http://{host}{path}",
        f"HTTP://{host.upper()}{path}",
        f"http://{host}:80{path}",
        f"http://{host}{path}#frag{rng.randint(0, 9)}",
        f"http://{host}{path}?utm_source=x" if "?" not in path else f"http://{host}{path}&utm_medium=y",
    ]
    if host == base[0]:
        variants += [
            path,
            "." + path if path.startswith("/") and base[1].count("/") == 1 else path,
            path.replace("/p", "/./p", 1),
            path.replace("p", "%70", 1),
        ]
    return rng.choice(variants)


def random_web(rng: random.Random, *, hosts: int = 4, pages: int = 6) -> SimWeb:
    """A random web of `hosts` hosts with `pages` pages each: mirrors, pages that fail for a while or for good
    (500), meta nofollow, redirects, robots files (some served from another host), 503 robots, two seeds."""
    names = [f"h{i}.example" for i in range(hosts)]
    all_ids = [(h, f"/p{j}" if j else "/") for h in names for j in range(pages)]
    specs: dict[PageId, PageSpec] = {}
    fail_first: dict[PageId, int] = {}
    mirrors: list[PageId] = []
    for pid in all_ids:
        links = rng.sample(all_ids, k=min(len(all_ids), rng.randint(0, 4)))
        text = " ".join(rng.choice("abcdefgh") for _ in range(30))
        spec = PageSpec(links=[LinkSpec(t) for t in links], title=f"page {pid[0]} {pid[1]} {text}")
        roll = rng.random()
        if roll < 0.1:
            mirrors.append(pid)  # one body shared by several paths
        elif roll < 0.2:
            fail_first[pid] = rng.randint(1, 2)
        elif roll < 0.23:
            spec.status = 500  # forever
        elif roll < 0.28:
            spec.meta_nofollow = True
        elif roll < 0.33:
            spec.redirect_to = rng.choice(all_ids)
            spec.links = []
        specs[pid] = spec
    # mirrors share one body, so they share one link list: the first is the original, the others mirror it
    mirror_links = rng.sample(all_ids, k=min(3, len(all_ids)))
    for pid in mirrors:
        specs[pid].links = [LinkSpec(t) for t in mirror_links]
        if pid != mirrors[0]:
            specs[pid].mirror_of = mirrors[0]
    robots: dict[str, RobotsSpec] = {}
    robots_fail_first: dict[str, int] = {}
    for h in names:
        roll = rng.random()
        if roll < 0.5:
            disallow = rng.sample(["/p1", "/p2", "/p3", "/nothing"], k=rng.randint(0, 2))
            robots[h] = RobotsSpec("file", "".join(f"User-agent: *\nDisallow: {p}\n" for p in disallow))
        elif roll < 0.6:
            robots[h] = RobotsSpec("unavailable")
        else:
            robots[h] = RobotsSpec("missing")
        if rng.random() < 0.2:
            robots_fail_first[h] = rng.randint(1, 2)
    seeds = rng.sample(all_ids, k=min(2, len(all_ids)))
    redirects = {h: rng.choice(names) for h in names if robots[h].kind == "file" and rng.random() < 0.3}
    for h, other in redirects.items():
        robots[h] = RobotsSpec("redirect", robots[h].text, (other, f"/robots-for-{h}.txt"))
    response_s = {h: rng.choice([0.01, 0.05, 0.2]) for h in names}
    model = WebModel(origins=names, pages=specs, robots=robots, seeds=seeds)
    return SimWeb(model, response_s, fail_first, robots_fail_first)


def oracle(web: SimWeb) -> tuple[set[PageId], set[PageId]]:
    """(pages a correct crawler fetches successfully, pages it attempts but never gets): the shared oracle's
    reachable pages, split by whether they answer 500 for good."""
    reachable = oracle_for(web.model).reachable_allowed
    failed = {pid for pid in reachable if web.model.pages[pid].status >= 500}
    return reachable - failed, failed


def _path_of(url: str) -> PageId:
    rest = url.split("://", 1)[1]
    host, _, path = rest.partition("/")
    return host.split(":")[0], "/" + path.split("?")[0]


@dataclass
class Trace:
    """What the simulated fleet did: every request with its virtual start and end, per host."""

    requests: dict[str, list[tuple[float, float, str]]] = field(default_factory=lambda: defaultdict(list))
    successes: dict[PageId, int] = field(default_factory=lambda: defaultdict(int))
    attempts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    replay_checks: int = 0


def simulate(
    frontier: Frontier,
    clock: VirtualClock,
    web: SimWeb,
    rng: random.Random,
    *,
    die_rate: float = 0.05,
    batch: int = 3,
    max_steps: int = 20_000,
    check_replay: bool = False,
) -> Trace:
    """Run workers against the frontier until it drains; return the trace of requests."""
    trace = Trace()
    frontier.discover([Link(f"http://{h}{p}", seed=True) for h, p in web.model.seeds])
    frontier.store.flush()
    pending: list[tuple[float, int, Item]] = []
    n = 0
    for _ in range(max_steps):
        for item in frontier.lease("sim", batch):
            trace.attempts[item.key] += 1
            if rng.random() < die_rate:
                continue  # the worker dies before connecting: only the lease expiry brings the item back
            n += 1
            heapq.heappush(pending, (clock.now() + web.response_s[item.host], n, item))
        if check_replay and rng.random() < 0.05:
            _check_replay(frontier)
            trace.replay_checks += 1
        if frontier.drained and not pending:
            return trace
        nxt = frontier.next_event_in()
        t_next = clock.now() + nxt if nxt is not None else float("inf")
        if pending and pending[0][0] <= t_next:
            t, _, item = heapq.heappop(pending)
            clock.set(max(t, clock.now()))
            start = t - web.response_s[item.host]
            trace.requests[item.host].append((start, clock.now(), item.url))
            _complete(frontier, web, item, trace)
        elif t_next < float("inf"):
            clock.set(max(t_next, clock.now()) + 1e-6)
        else:
            raise AssertionError("nothing pending, nothing scheduled, yet the frontier is not drained")
    raise AssertionError("simulation did not finish")


def _complete(frontier: Frontier, web: SimWeb, item: Item, trace: Trace) -> None:
    host, path = _path_of(item.url)
    model, response_s = web.model, web.response_s[host]
    if item.kind is Kind.ROBOTS:
        served_for = {r.redirect_to: h for h, r in model.robots.items() if r.kind == "redirect"}
        home = host if path == "/robots.txt" else served_for[(host, path)]
        robots = model.robots.get(home, RobotsSpec())
        status = {"file": 200, "redirect": 200, "missing": 404, "unavailable": 503}[robots.kind]
        if item.attempt <= web.robots_fail_first.get(home, 0):
            status = 503
        if status == 200 and robots.redirect_to is not None and path == "/robots.txt":
            target = f"http://{robots.redirect_to[0]}{robots.redirect_to[1]}"
            frontier.complete(item.key, item.generation, Outcome(status=301, location=target, response_s=response_s))
            return
        body = robots.text if status == 200 else ""
        frontier.complete(
            item.key, item.generation, Outcome(status=status, robots_body=body.encode(), response_s=response_s)
        )
        return
    pid = (host, path)
    spec = model.pages[pid]
    always_fail = spec.status >= 500
    if always_fail or item.attempt <= web.fail_first.get(pid, 0):
        frontier.complete(
            item.key, item.generation, Outcome(status=spec.status if always_fail else 503, response_s=response_s)
        )
        return
    if spec.redirect_to is not None:
        target = f"http://{spec.redirect_to[0]}{spec.redirect_to[1]}"
        frontier.complete(
            item.key,
            item.generation,
            Outcome(status=spec.redirect_status, location=target, response_s=response_s),
            [Link(target, item.url, item.key, item.depth, 0, item.redirect_hops + 1)],
        )
        trace.successes[pid] += 1
        return
    body_of = spec.mirror_of or pid  # a mirror serves its original's body and links
    source = model.pages[body_of]
    digest = "sha256:" + hashlib.sha256(repr(body_of).encode()).hexdigest()
    rng = random.Random(hash(item.key))
    links = [Link(spell(link.target, pid, rng), item.url, item.key, item.depth + 1) for link in source.links]
    frontier.complete(
        item.key,
        item.generation,
        Outcome(status=200, body_digest=digest, nofollow=source.meta_nofollow, response_s=response_s),
        links,
    )
    trace.successes[pid] += 1
    frontier.store.flush()


def _check_replay(frontier: Frontier) -> None:
    store = frontier.store
    rebuilt = replay(store.journal())
    rows = {r.key: r for r in store.items()}
    assert set(rebuilt) == set(rows), "replay and live rows name different keys"
    for key, r in rows.items():
        got = rebuilt[key]
        assert (got.state, got.attempt, got.generation, got.reason) == (r.state, r.attempt, r.generation, r.reason), key
        if got.item is not None:
            assert (got.item.url, got.item.host, got.item.depth, got.item.seq) == (r.url, r.host, r.depth, r.seq)
    assert all(r.state is not State.DISCOVERED for r in rows.values())
