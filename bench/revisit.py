"""Freshness of revisit schedules on a simulated web, and the core's revisit scheduling rate.

`python -m bench.revisit [--json] [--quick]` prints, with the machine and the workload stated:

1. Freshness (time-averaged fraction of pages whose stored copy is the current version) on a simulated web of
   100k pages (5k with --quick) whose pages change as Poisson processes of mixed rates: a fifth never change,
   the rest at rates spread log-uniformly from once an hour to once in 60 days. The scheduler is the real core
   (Frontier on a MemoryStore, a virtual clock, 1,000 hosts, politeness on) answering every fetch from the
   oracle web (hostring_testing.changing.ChangeWeb): a conditional GET gets 304 while the copy is current.
   Schedules compared over the second half of a 100-day run (the first half lets adaptive intervals settle):
   - adaptive: --revisit adaptive, initial interval 1 day, [1 hour, 14 days];
   - fixed: --revisit fixed at the interval that spends the same number of fetches as adaptive did;
   - uniform: the expected freshness of visiting every page at that same interval, from the rates (no lag, no
     politeness: the schedule the issue's target names);
   - fixed at 1 day (its own, higher cost; expected, from the rates), and the freshness-optimal schedule of
     adaptive's cost computed from the true rates (a ceiling no estimator reaches).
2. Revisit scheduling rate of the core: pages fetched once under a fixed policy, the clock moved past their due
   time, then revisits/s for moving them fetched -> scheduled -> leased -> fetched (304), on MemoryStore and on
   SqliteStore flushed after every call as the gRPC shell does.

3. What revisit scheduling costs admission and leasing: bench.node's in-process Discover and Lease+Complete on
   SqliteStore with --revisit off and adaptive, alternating rounds, medians of per-CPU-second rates.

No pass/fail: the issue's target (adaptive at least as fresh as uniform, aim 5% better) is printed beside.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.node import Stopwatch, end_of_run, machine, machine_line
from frontier_node.core.config import FrontierConfig, PolitenessConfig, RevisitConfig
from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Store
from frontier_node.core.records import Entry, Item, Kind, Link, Outcome
from frontier_node.core.revisit import KAPPA, optimal_interval
from frontier_node.store.memory import MemoryStore
from frontier_node.store.sqlite import SqliteStore
from hostring.clock import VirtualClock
from hostring_testing.changing import ChangeWeb, uniform_freshness

HOUR = 3600.0
DAY = 86_400.0
START = 1_700_000_000.0
TARGET = "adaptive >= uniform (aim: 5% better)"


@dataclass(frozen=True)
class Workload:
    pages: int = 100_000
    hosts: int = 1_000
    static_share: float = 0.2
    fastest_s: float = HOUR
    slowest_s: float = 60 * DAY
    initial_s: float = DAY
    min_s: float = HOUR
    max_s: float = 14 * DAY
    horizon_s: float = 100 * DAY
    delay_s: float = 1.0
    response_s: float = 0.2
    rate_pages: int = 100_000
    rate_hosts: int = 10_000
    overhead_links: int = 150_000
    overhead_pages: int = 30_000
    overhead_hosts: int = 2_000
    overhead_rounds: int = 5
    seed: int = 7

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["rates"] = (
            f"{self.static_share:.0%} never change; the rest Poisson, rates log-uniform from once per "
            f"{self.fastest_s / HOUR:g} h to once per {self.slowest_s / DAY:g} d"
        )
        d["window"] = f"second half of {self.horizon_s / DAY:g} days"
        d["core"] = (
            "Frontier on a journal-less in-memory store (bench.revisit.RowStore), virtual clock, "
            f"{self.hosts} hosts, delay {self.delay_s:g} s, every fetch {self.response_s:g} s; 304 to a "
            "conditional GET while the copy is current"
        )
        d["overhead_run"] = (
            "bench.node's in-process Discover and Lease+Complete on SqliteStore flushed per call, "
            f"{self.overhead_links:,} links over {self.overhead_hosts:,} hosts then {self.overhead_pages:,} pages "
            "leased and completed, with "
            f"--revisit off and adaptive alternating, {self.overhead_rounds} rounds each; medians of per-CPU-s rates"
        )
        d["rate_run"] = (
            f"{self.rate_pages:,} pages over {self.rate_hosts:,} hosts, fetched once under --revisit fixed, then "
            "every revisit promoted, leased and completed 304 (delay 0)"
        )
        return d


QUICK = Workload(
    pages=2_000,
    hosts=100,
    rate_pages=10_000,
    rate_hosts=1_000,
    overhead_links=30_000,
    overhead_pages=6_000,
    overhead_hosts=1_000,
    overhead_rounds=3,
)


def rates(w: Workload) -> list[float]:
    """Change rates per second of the workload's pages (0: never changes)."""
    rng = random.Random(w.seed)
    lo, hi = math.log(1 / w.slowest_s), math.log(1 / w.fastest_s)
    return [0.0 if rng.random() < w.static_share else math.exp(rng.uniform(lo, hi)) for _ in range(w.pages)]


def page_url(i: int, hosts: int) -> str:
    return f"http://h{i % hosts}.example/p{i}"


# ---------------------------------------------------------------------------------------------- the core on a web


class RowStore(MemoryStore):
    """The reference store without its journal and without copies: rows are the core's own objects.

    A long simulation writes tens of millions of journal lines, which the freshness figures do not need; and the
    core never holds two live references to one item (a row it reads back is one it let go of), so sharing the
    objects is safe here. Not a store for anything but this bench.
    """

    def record(self, entry: Entry, item: Item) -> None:
        self.rows[item.key] = item

    def note(self, entry: Entry) -> None:
        pass

    def get(self, key: str) -> Item | None:
        return self.rows.get(key)


@dataclass
class CoreRun:
    """What one run of the core against a ChangeWeb gave."""

    freshness: float
    window_fetches: int
    fetches: int
    revisits: dict[str, int]
    frontier: Frontier
    web: ChangeWeb
    seconds: float


def run_core(
    page_rates: Sequence[float],
    revisit: RevisitConfig,
    *,
    hosts: int,
    horizon_s: float,
    window_start_s: float,
    delay_s: float = 1.0,
    response_s: float = 0.2,
    store: Store | None = None,
    seed: int = 0,
) -> CoreRun:
    """Drive the real core over a simulated web on a virtual clock until `horizon_s`; freshness over the window.

    The simulated worker answers robots.txt 404 and each page from the oracle: 304 when the lease's ETag names
    the current version, else 200 with that version's digest, simhash and ETag. Fetches take `response_s` of
    virtual time (the next step begins after them), so politeness and lag are real.
    """
    clock = VirtualClock(START)
    store = store or RowStore()
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=delay_s, response_factor=0.0), revisit=revisit)
    frontier = Frontier(store, clock, config)
    web = ChangeWeb(page_rates, start=START, window_start=START + window_start_s, seed=seed)
    index = {page_url(i, hosts): i for i in range(len(page_rates))}
    for start in range(0, len(page_rates), 1000):
        frontier.discover(
            [Link(page_url(i, hosts), seed=True) for i in range(start, min(len(page_rates), start + 1000))]
        )
    end = START + horizon_s
    robots = Outcome(status=404, response_s=response_s)
    t0 = time.perf_counter()
    while clock.now() < end:
        items = frontier.lease("bench", 10_000)
        now = clock.now()
        for it in items:
            if it.kind is Kind.ROBOTS:
                outcome = robots
            else:
                version, _ = web.fetch(index[it.url], now)
                etag = f'"{version}"'
                if it.etag == etag:
                    outcome = Outcome(status=304, etag=etag, response_s=response_s)
                else:
                    h = hash((it.url, version)) & 0xFFFFFFFFFFFFFFFF or 1
                    outcome = Outcome(
                        status=200, body_digest=f"sha256:{h:016x}", simhash=h, etag=etag, response_s=response_s
                    )
            frontier.complete(it.key, it.generation, outcome)
        wait = frontier.next_event_in()
        if wait is None:
            break
        clock.advance(max(wait, 1e-3) if not items else max(wait, response_s))
    seconds = time.perf_counter() - t0
    freshness = web.finish(end)
    stats = frontier.revisit_stats()
    return CoreRun(freshness, web.window_fetches, web.fetches, stats.outcomes, frontier, web, seconds)


def equal_cost_interval(pages: int, window_fetches: int, window_s: float) -> float:
    """The interval at which visiting every page spends `window_fetches` fetches over `window_s`."""
    return pages * window_s / max(1, window_fetches)


def optimal_freshness(page_rates: Sequence[float], fetches_per_s: float) -> float:
    """The freshness of the best schedule of that cost with the rates known (Lagrange: g(λI) = μλ, bisection
    on the price μ), clamped to no interval at all for pages never worth a visit. A ceiling, for scale."""
    lo, hi = 1e-3, 1e9
    for _ in range(80):
        mu = math.sqrt(lo * hi)
        cost = sum(1.0 / optimal_interval(lam, mu / KAPPA) for lam in page_rates if lam > 0 and mu * lam < 1)
        if cost > fetches_per_s:
            lo = mu
        else:
            hi = mu
    mu = math.sqrt(lo * hi)
    total = 0.0
    for lam in page_rates:
        if lam <= 0:
            total += 1.0
        elif mu * lam < 1:
            x = lam * optimal_interval(lam, mu / KAPPA)
            total += (1 - math.exp(-x)) / x
    return total / len(page_rates)


def freshness_figures(w: Workload) -> dict[str, Any]:
    page_rates = rates(w)
    window = w.horizon_s / 2
    common = dict(hosts=w.hosts, horizon_s=w.horizon_s, window_start_s=window, delay_s=w.delay_s,
                  response_s=w.response_s, seed=w.seed)  # fmt: skip
    adaptive = run_core(page_rates, RevisitConfig("adaptive", w.initial_s, w.min_s, w.max_s), **common)  # type: ignore[arg-type]
    interval = equal_cost_interval(w.pages, adaptive.window_fetches, window)
    fixed = run_core(page_rates, RevisitConfig("fixed", interval, interval, interval), **common)  # type: ignore[arg-type]
    uniform = uniform_freshness(page_rates, interval)
    optimal = optimal_freshness(page_rates, adaptive.window_fetches / window)
    return {
        "freshness_adaptive": adaptive.freshness,
        "freshness_fixed_equal_cost": fixed.freshness,
        "freshness_uniform_equal_cost": uniform,
        "freshness_fixed_initial_interval": uniform_freshness(page_rates, w.initial_s),
        "freshness_optimal_equal_cost": optimal,
        "adaptive_gain_over_uniform": adaptive.freshness / uniform - 1.0,
        "adaptive_gain_over_fixed": adaptive.freshness / fixed.freshness - 1.0,
        "window_fetches_adaptive": adaptive.window_fetches,
        "window_fetches_fixed_equal_cost": fixed.window_fetches,
        "window_fetches_fixed_initial_interval": round(w.pages * window / w.initial_s),
        "equal_cost_interval_s": interval,
        "revisits_adaptive": adaptive.revisits,
        "core_seconds_adaptive": adaptive.seconds,
        "core_fetches_per_s_adaptive": adaptive.fetches / adaptive.seconds,
    }


# ---------------------------------------------------------------------------------------------- scheduling rate


def scheduling_rate(store: Store, pages: int, hosts: int, *, flush_each: bool) -> dict[str, Any]:
    """Revisits per second through the core: due pages promoted, leased and completed (304)."""
    clock = VirtualClock(START)
    config = FrontierConfig(
        politeness=PolitenessConfig(min_delay_s=0.0, response_factor=0.0),
        revisit=RevisitConfig("fixed", DAY, HOUR, 30 * DAY),
    )
    frontier = Frontier(store, clock, config)
    for start in range(0, pages, 1000):
        frontier.discover([Link(page_url(i, hosts), seed=True) for i in range(start, min(pages, start + 1000))])
    store.flush()
    done = 0
    while done < pages:  # the first fetch of every page (robots first), not timed
        items = frontier.lease("bench", 10_000)
        if not items:
            clock.advance(0.01)
            continue
        for it in items:
            ok = Outcome(status=404) if it.kind is Kind.ROBOTS else Outcome(status=200, etag='"1"', body_digest="d")
            frontier.complete(it.key, it.generation, ok)
            done += it.kind is Kind.PAGE
        store.flush()
    clock.advance(DAY + 1)
    revisited = 0
    with Stopwatch() as sw:
        while revisited < pages:
            items = frontier.lease("bench", 10_000)
            if flush_each:
                store.flush()
            if not items:
                clock.advance(0.001)
                continue
            for it in items:  # robots.txt files expired meanwhile (24 h cache): fetched again, first
                robots = it.kind is Kind.ROBOTS
                frontier.complete(it.key, it.generation, Outcome(status=404 if robots else 304, etag='"1"'))
                if flush_each:
                    store.flush()
                revisited += not robots
            store.flush()
    outcomes = frontier.revisit_stats().outcomes
    return {
        "revisits": revisited,
        "seconds": sw.wall,
        "revisits_per_s": revisited / sw.wall,
        "revisits_per_cpu_s": revisited / sw.cpu,
        "not_modified": outcomes.get("not_modified", 0),
    }


def overhead(w: Workload) -> dict[str, Any]:
    """Admission and leasing with revisits off and on (adaptive: every completion gets a due time a day away),
    alternating so that load on a shared machine falls on both alike; medians of per-CPU-second rates."""
    from bench import node as bench_node

    base = bench_node.Workload(hosts=w.overhead_hosts, links=w.overhead_links, lease_pages=w.overhead_pages)
    urls = bench_node.link_stream(base)
    hosts = min(base.hosts, base.unique)
    rates_: dict[str, dict[str, list[float]]] = {p: {"discover": [], "lease": []} for p in ("off", "adaptive")}
    for r in range(w.overhead_rounds):
        for policy in ("off", "adaptive") if r % 2 == 0 else ("adaptive", "off"):
            bw = replace(base, revisit=policy)
            with tempfile.TemporaryDirectory(prefix="hostring-bench-overhead-") as tmp:
                store = SqliteStore(Path(tmp) / "core.sqlite3")
                frontier, disc = bench_node.core_discover(store, urls, bw)
                lease = bench_node.core_lease_complete(frontier, hosts, bw)
                store.close()
            rates_[policy]["discover"].append(disc["links_per_cpu_s"])
            rates_[policy]["lease"].append(lease["urls_per_cpu_s"])
    med = {p: {k: statistics.median(v) for k, v in d.items()} for p, d in rates_.items()}
    return {
        "discover_links_per_cpu_s_revisit_off": med["off"]["discover"],
        "discover_links_per_cpu_s_revisit_on": med["adaptive"]["discover"],
        "lease_complete_urls_per_cpu_s_revisit_off": med["off"]["lease"],
        "lease_complete_urls_per_cpu_s_revisit_on": med["adaptive"]["lease"],
        "discover_slowdown_revisit_on": 1 - med["adaptive"]["discover"] / med["off"]["discover"],
        "lease_complete_slowdown_revisit_on": 1 - med["adaptive"]["lease"] / med["off"]["lease"],
        "overhead_rounds": rates_,
    }


def run(w: Workload) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": machine(), "workload": w.describe(), "target": TARGET}
    figures.update(freshness_figures(w))
    figures.update(overhead(w))
    memory = scheduling_rate(MemoryStore(), w.rate_pages, w.rate_hosts, flush_each=False)
    with tempfile.TemporaryDirectory(prefix="hostring-bench-revisit-") as tmp:
        store = SqliteStore(Path(tmp) / "revisit.sqlite3")
        sqlite = scheduling_rate(store, w.rate_pages, w.rate_hosts, flush_each=True)
        store.close()
    figures.update(
        revisits_per_s_core_memory=memory["revisits_per_s"],
        revisits_per_cpu_s_core_memory=memory["revisits_per_cpu_s"],
        revisits_per_s_core_sqlite=sqlite["revisits_per_s"],
        revisits_per_cpu_s_core_sqlite=sqlite["revisits_per_cpu_s"],
        rate_revisits=memory["revisits"],
    )
    end_of_run(figures["machine"])
    return figures


def table(f: dict[str, Any]) -> str:
    m, w = f["machine"], f["workload"]
    lines = [
        machine_line(m, sqlite=True),
        f"workload: {w['pages']:,} pages over {w['hosts']:,} hosts; {w['rates']}; measured over the {w['window']}",
        f"  adaptive: initial {w['initial_s'] / HOUR:g} h in [{w['min_s'] / HOUR:g} h, {w['max_s'] / DAY:g} d]; "
        f"core: {w['core']}",
        f"  scheduling rate: {w['rate_run']}",
        "",
        f"{'schedule':<52} {'freshness':>9} {'fetches':>10}",
        f"{'adaptive (the core)':<52} {f['freshness_adaptive']:>9.4f} {f['window_fetches_adaptive']:>10,}",
        f"{'fixed at the same cost (the core), every':<41} {f['equal_cost_interval_s'] / HOUR:>8.1f} h "
        f"{f['freshness_fixed_equal_cost']:>9.4f} {f['window_fetches_fixed_equal_cost']:>10,}",
        f"{'uniform at the same cost (expected, from the rates)':<52} {f['freshness_uniform_equal_cost']:>9.4f}",
        f"{'fixed at the initial interval (expected)':<52} {f['freshness_fixed_initial_interval']:>9.4f} "
        f"{f['window_fetches_fixed_initial_interval']:>10,}",
        f"{'optimal at the same cost (true rates known: a ceiling)':<52} {f['freshness_optimal_equal_cost']:>9.4f}",
        "",
        f"adaptive vs uniform: {100 * f['adaptive_gain_over_uniform']:+.1f}%   adaptive vs fixed: "
        f"{100 * f['adaptive_gain_over_fixed']:+.1f}%   (target: {f['target']})",
        f"revisits by outcome (adaptive): {f['revisits_adaptive']}",
        f"core revisit scheduling rate: {f['revisits_per_s_core_memory']:,.0f} revisits/s on MemoryStore "
        f"({f['revisits_per_cpu_s_core_memory']:,.0f} per CPU-s), {f['revisits_per_s_core_sqlite']:,.0f} "
        f"revisits/s on SqliteStore flushed per call ({f['revisits_per_cpu_s_core_sqlite']:,.0f} per CPU-s)",
        f"(the adaptive run drove {f['core_fetches_per_s_adaptive']:,.0f} fetches/s of simulation through the core "
        f"in {f['core_seconds_adaptive']:.0f} s)",
        "",
        f"revisit scheduling overhead ({w['overhead_run']}):",
        f"  Discover, core, SQLite: {f['discover_links_per_cpu_s_revisit_off']:,.0f} links/CPU-s off, "
        f"{f['discover_links_per_cpu_s_revisit_on']:,.0f} on "
        f"(slowdown {100 * f['discover_slowdown_revisit_on']:+.1f}%)",
        f"  Lease+Complete, core, SQLite: {f['lease_complete_urls_per_cpu_s_revisit_off']:,.0f} URLs/CPU-s off, "
        f"{f['lease_complete_urls_per_cpu_s_revisit_on']:,.0f} on "
        f"(slowdown {100 * f['lease_complete_slowdown_revisit_on']:+.1f}%; target: at most 10%; negative: faster, "
        "i.e. within the noise of a shared machine)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.revisit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test): 5k pages")
    args = parser.parse_args(argv)
    figures = run(QUICK if args.quick else Workload())
    print(json.dumps(figures, indent=2) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
