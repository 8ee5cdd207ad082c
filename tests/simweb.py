"""A random web as a pure model, a simulated worker fleet on a virtual clock, and a brute-force BFS oracle.

The model names every page by (host, path) and writes links in many spellings; the oracle walks the model's
own graph, so it shares no code with hostring's URL identity or scheduler.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field

from frontier_node.core.frontier import Frontier
from frontier_node.core.journal import replay
from frontier_node.core.records import Item, Kind, Link, Outcome
from frontier_node.core.states import State
from hostring.clock import VirtualClock

PageId = tuple[str, str]  # (host, path)


@dataclass
class Page:
    links: list[PageId]
    body: str                        # distinct text, except mirrors which share one
    fail_first: int = 0              # transient failures (503) before it succeeds
    always_fail: bool = False        # 500 forever
    nofollow: bool = False
    redirect_to: PageId | None = None


@dataclass
class WebModel:
    pages: dict[PageId, Page]
    disallow: dict[str, list[str]]   # host -> disallowed path prefixes (robots 200)
    robots_status: dict[str, int]    # host -> 200 / 404 / 503 (always) ; missing = 404
    robots_fail_first: dict[str, int]  # host -> transient 503s before the robots file answers
    seeds: list[PageId]
    response_s: dict[str, float]
    robots_redirect: dict[str, str] = field(default_factory=dict)  # host -> host serving its robots rules

    def allowed(self, pid: PageId) -> bool:
        host, path = pid
        status = self.robots_status.get(host, 404)
        if status == 503:
            return False
        return not any(path.startswith(p) for p in self.disallow.get(host, []))


def spell(pid: PageId, base: PageId, rng: random.Random) -> str:
    """One of many spellings of a link from page `base` to page `pid`."""
    host, path = pid
    variants = [f"http://{host}{path}", f"HTTP://{host.upper()}{path}", f"http://{host}:80{path}",
                f"http://{host}{path}#frag{rng.randint(0, 9)}", f"http://{host}{path}?utm_source=x" if "?" not in path
                else f"http://{host}{path}&utm_medium=y"]
    if host == base[0]:
        variants += [path, "." + path if path.startswith("/") and base[1].count("/") == 1 else path,
                     path.replace("/p", "/./p", 1), path.replace("p", "%70", 1)]
    return rng.choice(variants)


def random_web(rng: random.Random, *, hosts: int = 4, pages: int = 6) -> WebModel:
    names = [f"h{i}.example" for i in range(hosts)]
    all_ids = [(h, f"/p{j}" if j else "/") for h in names for j in range(pages)]
    model_pages: dict[PageId, Page] = {}
    mirror_body = "mirror body shared by several paths"
    for pid in all_ids:
        links = rng.sample(all_ids, k=min(len(all_ids), rng.randint(0, 4)))
        page = Page(links=links, body=f"page {pid[0]} {pid[1]} " + " ".join(rng.choice("abcdefgh") for _ in range(30)))
        roll = rng.random()
        if roll < 0.1:
            page.body = mirror_body
        elif roll < 0.2:
            page.fail_first = rng.randint(1, 2)
        elif roll < 0.23:
            page.always_fail = True
        elif roll < 0.28:
            page.nofollow = True
        elif roll < 0.33:
            page.redirect_to = rng.choice(all_ids)
            page.links = []
        model_pages[pid] = page
    # mirrors share one body, so they must share one link list for the oracle not to depend on fetch order
    mirror_links = rng.sample(all_ids, k=min(3, len(all_ids)))
    for page in model_pages.values():
        if page.body == mirror_body:
            page.links = mirror_links
    disallow: dict[str, list[str]] = {}
    robots_status: dict[str, int] = {}
    robots_fail_first: dict[str, int] = {}
    for h in names:
        roll = rng.random()
        if roll < 0.5:
            robots_status[h] = 200
            disallow[h] = rng.sample(["/p1", "/p2", "/p3", "/nothing"], k=rng.randint(0, 2))
        elif roll < 0.6:
            robots_status[h] = 503
        else:
            robots_status[h] = 404
        if rng.random() < 0.2:
            robots_fail_first[h] = rng.randint(1, 2)
    seeds = rng.sample(all_ids, k=min(2, len(all_ids)))
    redirects = {h: rng.choice(names) for h in names if robots_status[h] == 200 and rng.random() < 0.3}
    return WebModel(model_pages, disallow, robots_status, robots_fail_first, seeds,
                    {h: rng.choice([0.01, 0.05, 0.2]) for h in names}, redirects)


def oracle(model: WebModel) -> tuple[set[PageId], set[PageId]]:
    """Brute-force BFS: (pages a correct crawler fetches successfully, pages it attempts but never gets)."""
    fetched: set[PageId] = set()
    failed: set[PageId] = set()
    seen: set[PageId] = set()
    todo = list(model.seeds)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if not model.allowed(pid):
            continue
        page = model.pages[pid]
        if page.always_fail:
            failed.add(pid)
            continue
        fetched.add(pid)
        if page.redirect_to is not None:
            todo.append(page.redirect_to)
        if not page.nofollow:
            todo.extend(page.links)
    return fetched, failed


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


def simulate(frontier: Frontier, clock: VirtualClock, model: WebModel, rng: random.Random, *,
             die_rate: float = 0.05, batch: int = 3, max_steps: int = 20_000, check_replay: bool = False) -> Trace:
    """Run workers against the frontier until it drains; return the trace of requests."""
    trace = Trace()
    frontier.discover([Link(f"http://{h}{p}", seed=True) for h, p in model.seeds])
    frontier.store.flush()
    pending: list[tuple[float, int, Item]] = []
    n = 0
    for _ in range(max_steps):
        for item in frontier.lease("sim", batch):
            trace.attempts[item.key] += 1
            if rng.random() < die_rate:
                continue  # the worker dies before connecting: only the lease expiry brings the item back
            n += 1
            heapq.heappush(pending, (clock.now() + model.response_s[item.host], n, item))
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
            start = t - model.response_s[item.host]
            trace.requests[item.host].append((start, clock.now(), item.url))
            _complete(frontier, model, item, trace)
        elif t_next < float("inf"):
            clock.set(max(t_next, clock.now()) + 1e-6)
        else:
            raise AssertionError("nothing pending, nothing scheduled, yet the frontier is not drained")
    raise AssertionError("simulation did not finish")


def _complete(frontier: Frontier, model: WebModel, item: Item, trace: Trace) -> None:
    host, _ = _path_of(item.url)
    if item.kind is Kind.ROBOTS:
        path = _path_of(item.url)[1]
        home = path[len("/robots-for-"):-len(".txt")] if path.startswith("/robots-for-") else host
        status = model.robots_status.get(home, 404)
        if item.attempt <= model.robots_fail_first.get(home, 0):
            status = 503
        if status == 200 and home in model.robots_redirect and path == "/robots.txt":
            target = f"http://{model.robots_redirect[home]}/robots-for-{home}.txt"
            frontier.complete(item.key, item.generation, Outcome(status=301, location=target,
                                                                 response_s=model.response_s[host]))
            return
        body = "".join(f"User-agent: *\nDisallow: {p}\n" for p in model.disallow.get(home, [])) if status == 200 else ""
        frontier.complete(item.key, item.generation, Outcome(status=status, robots_body=body.encode(),
                                                             response_s=model.response_s[host]))
        return
    pid = _path_of(item.url)
    page = model.pages[pid]
    if page.always_fail or item.attempt <= page.fail_first:
        frontier.complete(item.key, item.generation, Outcome(status=500 if page.always_fail else 503,
                                                             response_s=model.response_s[host]))
        return
    if page.redirect_to is not None:
        target = f"http://{page.redirect_to[0]}{page.redirect_to[1]}"
        frontier.complete(item.key, item.generation, Outcome(status=301, location=target,
                                                             response_s=model.response_s[host]),
                          [Link(target, item.url, item.key, item.depth, 0, item.redirect_hops + 1)])
        trace.successes[pid] += 1
        return
    digest = "sha256:" + str(hash(page.body))
    rng = random.Random(hash(item.key))
    links = [Link(spell(t, pid, rng), item.url, item.key, item.depth + 1) for t in page.links]
    frontier.complete(item.key, item.generation, Outcome(status=200, body_digest=digest, nofollow=page.nofollow,
                                                         response_s=model.response_s[host]), links)
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
