"""End-to-end crawl bench: `hostring crawl` as a subprocess against a local web served by its own process.

Four runs, each judged from the web server's request log (never from hostring's own account):

1. throughput: a generated web of many origins (200; --quick 20), `--delay 0`, every root a seed. Pages/s from
   the first to the last request the server saw, CPU milliseconds per page of all hostring processes (the crawl
   process and its node child together), and coverage against the generator's oracle.
2. politeness: a few origins whose every page repeats the same ~30 navigation links, `--delay 0.2`, one request
   in flight per origin. Makespan (first request to last response) against the politeness bound (per origin:
   requests x (median response time + delay); the largest), and CPU ms per page.
3. turnaround (issue 10's workload): six origins, ~2,100 pages of ~136 links each (mostly repeated navigation
   links), `--delay 0`, one request in flight per origin. Makespan against the politeness bound, and CPU ms per
   page of all hostring processes: how long a host's next URL waits once its page completed, and what a
   link-heavy page costs. Default politeness flags: a host answering in 15 ms is not slow (--slow-response
   0.5 s), so it rests only --delay, the bound's own terms. --quick: three small origins.
4. profile (not with --quick): the same web as 3 with py-spy sampling the node and the
   worker (the crawl process), to show where the time goes when every page repeats the same links.

The web runs in its own process (`python -m bench.crawl --serve ...`): served in-process next to the bench the
server, not hostring, would be the bottleneck. Only loopback addresses are used. No pass/fail: figures only.

CPU accounting: `resource.getrusage(RUSAGE_CHILDREN)` taken just before the crawl starts and just after it has
been waited for; it covers the crawl process and, through it, its waited-for node child (startup, the crawl and
the final report). The web server is a child too but is only waited for afterwards, so it is not counted. As a
cross-check the bench also polls /proc/<pid>/stat of the crawl process and of the node every 0.1 s and keeps the
last values (which miss at most the last 0.1 s and the report) and reports the split between the two.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.node import end_of_run, machine, machine_line, profile_summary
from hostring_cli.args import positive_int
from hostring_testing import (
    LinkSpec,
    LocalWeb,
    Oracle,
    PageSpec,
    RobotsSpec,
    WebModel,
    oracle_for,
    random_model,
    render_model,
)
from hostring_testing.proc import stop_process

REPO = Path(__file__).resolve().parent.parent
UA = "hostring-bench/0.1 (+https://github.com/hostring/hostring)"
LOOPBACK = "127.0.0.0/8"
_CLK = os.sysconf("SC_CLK_TCK")


# ====================================================================== the webs


@dataclass(frozen=True)
class RandomWebSpec:
    """A generated web (hostring_testing.random_model): robots files, redirects, mirrors, broken links, spellings.

    No 503 robots origin (its bounded retries would stretch the crawl by minutes of waiting) and no calendar
    traps (budget-bounded, they would make the page count depend on depth limits), so the work is the oracle's.
    """

    kind: str = "random"
    seed: int = 3
    origins: int = 200
    pages_per_origin: int = 20
    links_per_page: int = 8

    def model(self) -> WebModel:
        m = random_model(
            self.seed, origins=self.origins, pages_per_origin=self.pages_per_origin,
            links_per_page=self.links_per_page, unavailable_robots=0, trap_fraction=0.0, user_agent="hostring-bench",
        )  # fmt: skip
        m.seeds = [(label, "/") for label in m.origins]
        return m


@dataclass(frozen=True)
class NavWebSpec:
    """Origins whose every page repeats the same `nav` navigation links (identical hrefs) plus a few content links.

    Per origin: "/" and nav-1 section pages form the navigation set linked from every page; the other pages are
    articles, each page linking to `content` of them (together they reach every article). Robots files are 404.
    """

    kind: str = "nav"
    seed: int = 5
    origins: int = 6
    pages_per_origin: int = 40
    nav: int = 30
    content: int = 3
    service_s: float = 0.0
    """Server think time before each response (the issue's held-out web: ~15 ms median service time)."""

    def model(self) -> WebModel:
        rng = random.Random(self.seed)
        labels = [f"nav{i}" for i in range(self.origins)]
        pages: dict[tuple[str, str], PageSpec] = {}
        for label in labels:
            nav_paths = ["/"] + [f"/section/{k}/" for k in range(1, self.nav)]
            articles = [f"/articles/{k}-{rng.randrange(10**6)}" for k in range(self.pages_per_origin - self.nav)]
            nav_links = [LinkSpec((label, p), href=p) for p in nav_paths]
            for i, path in enumerate(nav_paths + articles):
                n = len(articles)
                picks = [articles[(i * self.content + t) % n] for t in range(self.content)] if n else []
                links = nav_links + [LinkSpec((label, p), href=p) for p in picks]
                pages[(label, path)] = PageSpec(links=links, title=f"{label} {path}")
        robots = {label: RobotsSpec("missing") for label in labels}
        return WebModel(
            origins=labels, pages=pages, robots=robots, seeds=[(lb, "/") for lb in labels], user_agent="hostring-bench"
        )


def _spec_from(d: dict[str, Any]) -> RandomWebSpec | NavWebSpec:
    return RandomWebSpec(**d) if d["kind"] == "random" else NavWebSpec(**d)


def serve_main(spec_json: str, log: Path) -> int:
    """The web server process: serve the spec's web, print its origins as one JSON line, serve until SIGTERM."""
    spec = _spec_from(json.loads(spec_json))
    model = spec.model()
    sites = render_model(model, spec.seed)
    service_s = getattr(spec, "service_s", 0.0)
    if service_s > 0:
        for site in sites.values():
            for page in site.pages.values():
                page.delay_s = service_s
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LocalWeb(sites, log_path=log) as web:
        print(json.dumps({"origins": web.origins, "hosts": {lb: a for lb, (a, _) in web.addresses.items()}}),
              flush=True)  # fmt: skip
        # die with the bench if it goes away without telling us
        while not stop.wait(0.5):
            if os.getppid() == 1:
                break
    return 0


class WebProcess:
    """The web in its own process (its own interpreter and GIL); a context manager that always stops it."""

    def __init__(self, spec: RandomWebSpec | NavWebSpec, log: Path) -> None:
        self.spec, self.log = spec, log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.crawl", "--serve", json.dumps(asdict(spec)), "--serve-log", str(log)],
            cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = _readline(self.proc, 120)
        info = json.loads(line)
        self.origins: dict[str, str] = info["origins"]
        self.hosts: dict[str, str] = info["hosts"]
        self.labels = {o: lb for lb, o in self.origins.items()}

    def __enter__(self) -> WebProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)

    def hits(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line.strip()]


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    if not box or not box[0].strip():
        proc.kill()
        raise RuntimeError("the web server process did not start")
    return box[0]


# ====================================================================== running a crawl


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime+stime seconds) of pid from /proc, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] == pid:
                out.append(int(entry))
    return out


@dataclass
class CrawlRun:
    returncode: int
    wall_s: float
    cpu_s_rusage: float
    cpu_s_polled_worker: float
    cpu_s_polled_node: float
    cpu_s_at_first_request: float
    node_pid: int | None
    stdout: str


def run_crawl(
    web: WebProcess,
    tmp: Path,
    name: str,
    *,
    delay: float,
    timeout: float,
    max_depth: int = 50,
    profile: Path | None = None,
    extra: Sequence[str] = (),
    workers: int = 1,
) -> CrawlRun:
    """`hostring crawl` over every origin of `web` (all roots seeds, scope = their hosts), timed and CPU-counted."""
    out = tmp / f"{name}-out"
    scope = tmp / f"{name}-scope.txt"
    scope.write_text("\n".join(sorted(web.hosts.values())) + "\n", encoding="utf-8")
    seeds = [o + "/" for o in web.origins.values()]
    seeds_file = tmp / f"{name}-seeds.txt"
    seeds_file.write_text("\n".join(seeds) + "\n", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "hostring_cli",
        "crawl",
        "--seeds-file",
        str(seeds_file),
        "--scope",
        str(scope),
        "--allow-network",
        LOOPBACK,
        "--delay",
        str(delay),
        "--concurrency",
        "1",
        "--out",
        str(out),
        "--no-progress",
        "--max-depth",
        str(max_depth),
        "--max-pages-per-host",
        "100000",
        "--user-agent",
        UA,
        *(["--workers", str(workers)] if workers > 1 else []),
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    stdout_path = tmp / f"{name}.stdout"
    with stdout_path.open("w") as sink, (tmp / f"{name}.stderr").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=err, start_new_session=True)
        worker_cpu = node_cpu = 0.0
        children_cpu: dict[int, float] = {}  # --workers N: the crawl's worker children, by pid
        at_first: float | None = None
        node_pid: int | None = None
        spies: list[subprocess.Popen[bytes]] = []
        if profile is not None:
            spies.append(_spy(proc.pid, profile.with_name(profile.name + "-worker.txt")))
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{name}: hostring crawl did not finish in {timeout:.0f} s")
                st = _stat(proc.pid)
                if st is not None:
                    worker_cpu = st[1]
                kids = _children(proc.pid) if workers > 1 or node_pid is None else []
                if workers > 1:
                    for kid in kids:
                        if _is_worker(kid) and (kst := _stat(kid)) is not None:
                            children_cpu[kid] = kst[1]
                if node_pid is None:
                    nodes = [k for k in kids if _is_node(k)]
                    if nodes:
                        node_pid = nodes[0]
                        if profile is not None:
                            spies.append(_spy(node_pid, profile.with_name(profile.name + "-node.txt")))
                elif (nst := _stat(node_pid)) is not None:
                    node_cpu = nst[1]
                if at_first is None and web.log.exists() and web.log.stat().st_size > 0:
                    # startup and seeding: spent before the first request
                    at_first = worker_cpu + sum(children_cpu.values()) + node_cpu
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            for spy in spies:
                if spy.poll() is None:
                    spy.send_signal(signal.SIGINT)
                try:
                    spy.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    worker_cpu += sum(children_cpu.values())
    return CrawlRun(
        proc.returncode, wall, cpu, worker_cpu, node_cpu, at_first or 0.0, node_pid, stdout_path.read_text()
    )


def _is_worker(pid: int) -> bool:
    """Whether `pid` runs `hostring worker` (a child of `hostring crawl --workers N`)."""
    try:
        return b"\0worker\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_node(pid: int) -> bool:
    """Whether `pid` runs `hostring node` (the crawl's other children, such as a short `uname`, are not counted)."""
    try:
        return b"\0node\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the Python thread that holds the GIL in `pid` (where its Python CPU goes)."""
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--nonblocking", "--gil",
         "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


# ====================================================================== judging from the server log


def coverage(hits: list[dict[str, Any]], oracle: Oracle) -> dict[str, Any]:
    """Missing, unexpected, forbidden and duplicate fetches, judged against the generator's oracle."""
    fetched = {(h["label"], h["resource"]) for h in hits}
    verdict = oracle.judge(fetched)
    counts = Counter((h["label"], h["resource"]) for h in hits if h["resource"] != "/robots.txt")
    dups = sorted((lb, r, n) for (lb, r), n in counts.items() if n > 1)
    return {
        "expected_pages": len(oracle.reachable_allowed),
        "missing": len(verdict["missing"]),
        "unexpected": len(verdict["unexpected"]),
        "forbidden": len(verdict["forbidden"]),
        "duplicates": len(dups),
        "missing_examples": sorted(verdict["missing"])[:5],
        "duplicate_examples": dups[:5],
        "max_in_flight_per_origin": max((h["concurrent"] for h in hits), default=0),
    }


def _window(hits: list[dict[str, Any]]) -> tuple[float, float]:
    return min(h["start"] for h in hits), max(h["end"] for h in hits)


def _pages(hits: list[dict[str, Any]], oracle: Oracle) -> int:
    """Requests for pages (robots files, wherever served, excluded)."""
    return sum(1 for h in hits if h["resource"] != "/robots.txt" and (h["label"], h["resource"])
               not in oracle.robots_fetches)  # fmt: skip


def crawl_figures(run: CrawlRun, hits: list[dict[str, Any]], oracle: Oracle) -> dict[str, Any]:
    first, last = _window(hits)
    pages = _pages(hits, oracle)
    span = max(last - first, 1e-9)
    polled = run.cpu_s_polled_worker + run.cpu_s_polled_node
    return {
        "requests": len(hits),
        "pages": pages,
        "server_window_s": round(span, 3),
        "pages_per_s": round(pages / span, 1),
        "crawl_wall_s": round(run.wall_s, 2),
        "cpu_ms_per_page": round(1000 * run.cpu_s_rusage / max(pages, 1), 3),
        "cpu_s_rusage": round(run.cpu_s_rusage, 3),
        "cpu_s_polled": {"worker": round(run.cpu_s_polled_worker, 3), "node": round(run.cpu_s_polled_node, 3)},
        "cpu_ms_per_page_polled": round(1000 * polled / max(pages, 1), 3),
        "cpu_s_startup": round(run.cpu_s_at_first_request, 3),
        "cpu_ms_per_page_after_startup": round(1000 * (polled - run.cpu_s_at_first_request) / max(pages, 1), 3),
        "cores_busy_during_window": round(polled / span, 2),
        "crawl_returncode": run.returncode,
        "coverage": coverage(hits, oracle),
    }


def politeness(hits: list[dict[str, Any]], delay: float) -> dict[str, Any]:
    """Makespan (first request to last response) against the bound max over origins of n x (median + delay)."""
    by_origin: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in hits:
        by_origin[h["label"]].append(h)
    bounds, per_origin = {}, {}
    for label, hs in sorted(by_origin.items()):
        med = statistics.median(h["end"] - h["start"] for h in hs)
        bounds[label] = len(hs) * (med + delay)
        hs.sort(key=lambda h: h["start"])
        gaps = [b["start"] - a["end"] for a, b in itertools.pairwise(hs)]
        per_origin[label] = {
            "requests": len(hs), "median_response_s": round(med, 6), "bound_s": round(bounds[label], 3),
            "span_s": round(max(h["end"] for h in hs) - hs[0]["start"], 3),
            "min_gap_s": round(min(gaps), 4) if gaps else None,
            "median_gap_s": round(statistics.median(gaps), 4) if gaps else None,
        }  # fmt: skip
    first, last = _window(hits)
    bound = max(bounds.values())
    return {
        "makespan_s": round(last - first, 3),
        "politeness_bound_s": round(bound, 3),
        "makespan_over_bound": round((last - first) / bound, 3),
        "per_origin": per_origin,
    }


# ====================================================================== driver


@dataclass(frozen=True)
class Workload:
    throughput: RandomWebSpec
    polite: NavWebSpec
    polite_delay: float
    turnaround: NavWebSpec
    profile: NavWebSpec | None
    timeout_s: float
    workers: int = 1  # hostring crawl --workers N


FULL = Workload(
    throughput=RandomWebSpec(origins=200),
    polite=NavWebSpec(origins=6, pages_per_origin=40, nav=30, content=3),
    polite_delay=0.2,
    # the target shape: ~2,100 pages over six origins, ~136 links a page
    # service time: the bound of ~5.2 s over ~350 requests an origin is ~15 ms a response
    turnaround=NavWebSpec(origins=6, pages_per_origin=350, nav=130, content=6, service_s=0.015),
    profile=NavWebSpec(origins=6, pages_per_origin=350, nav=130, content=6),
    timeout_s=600,
)
QUICK = Workload(
    throughput=RandomWebSpec(origins=20),
    polite=NavWebSpec(origins=3, pages_per_origin=15, nav=10, content=2),
    polite_delay=0.2,
    turnaround=NavWebSpec(origins=3, pages_per_origin=30, nav=20, content=3, service_s=0.005),
    profile=None,
    timeout_s=90,
)


def run(w: Workload, keep: Path | None = None) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": machine()}
    figures["workload"] = {
        "throughput": {**asdict(w.throughput), "delay_s": 0.0, "concurrency_per_origin": 1, "fetchers": 64},
        "politeness": {**asdict(w.polite), "delay_s": w.polite_delay, "concurrency_per_origin": 1},
        "turnaround": {**asdict(w.turnaround), "delay_s": 0.0, "concurrency_per_origin": 1},
        "profile": ({**asdict(w.profile), "delay_s": 0.0} if w.profile else None),
        "crawl": "python -m hostring_cli crawl (node child on SQLite + in-process worker"
        + (f", --workers {w.workers}: {w.workers - 1} more worker processes" if w.workers > 1 else "")
        + "), all roots as seeds, --scope FILE of every origin host, --allow-network 127.0.0.0/8, --no-progress",
        "web": "hostring_testing.LocalWeb in its own process (python -m bench.crawl --serve), one 127.0.0.x "
        "address per origin",
    }
    tmpdir = tempfile.mkdtemp(prefix="hostring-bench-crawl-", dir=keep)
    tmp = Path(tmpdir)
    try:
        # 1. throughput
        with WebProcess(w.throughput, tmp / "throughput-web.jsonl") as web:
            r = run_crawl(web, tmp, "throughput", delay=0.0, timeout=w.timeout_s, workers=w.workers)
            time.sleep(0.2)
            hits = web.hits()
        if r.returncode != 0:
            err = (tmp / "throughput.stderr").read_text()[-2000:]
            raise RuntimeError(f"throughput crawl exited {r.returncode}: {err}")
        figures["throughput"] = crawl_figures(r, hits, oracle_for(w.throughput.model()))

        # 2. politeness-bound
        with WebProcess(w.polite, tmp / "polite-web.jsonl") as web:
            r = run_crawl(web, tmp, "polite", delay=w.polite_delay, timeout=w.timeout_s, workers=w.workers)
            time.sleep(0.2)
            hits = web.hits()
        if r.returncode != 0:
            err = (tmp / "polite.stderr").read_text()[-2000:]
            raise RuntimeError(f"politeness crawl exited {r.returncode}: {err}")
        polite = crawl_figures(r, hits, oracle_for(w.polite.model()))
        polite.update(politeness(hits, w.polite_delay))
        figures["politeness"] = polite

        # 3. turnaround: the workload at --delay 0
        figures["turnaround"] = run_turnaround(w.turnaround, tmp, w.timeout_s, workers=w.workers)

        # 4. profile
        if w.profile is not None:
            have_spy = shutil.which("py-spy") is not None
            base = tmp / "profile"
            with WebProcess(w.profile, tmp / "profile-web.jsonl") as web:
                spy = base if have_spy else None
                r = run_crawl(web, tmp, "profile", delay=0.0, timeout=w.timeout_s, profile=spy, workers=w.workers)
                time.sleep(0.2)
                hits = web.hits()
            prof = crawl_figures(r, hits, oracle_for(w.profile.model()))
            prof["note"] = "sampled by py-spy (--gil --rate 200), which itself slows the sampled processes"
            if have_spy:
                for role in ("node", "worker"):
                    path = base.with_name(base.name + f"-{role}.txt")
                    if path.exists():
                        prof[f"{role}_profile"] = profile_summary(path, top=20)
            figures["profile"] = prof
    finally:
        if keep is None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    end_of_run(figures["machine"])
    figures["pages_per_s"] = figures["throughput"]["pages_per_s"]
    figures["cpu_ms_per_page"] = figures["throughput"]["cpu_ms_per_page"]
    figures["politeness_makespan_s"] = figures["politeness"]["makespan_s"]
    figures["politeness_bound_s"] = figures["politeness"]["politeness_bound_s"]
    figures["makespan_over_bound"] = figures["politeness"]["makespan_over_bound"]
    figures["politeness_cpu_ms_per_page"] = figures["politeness"]["cpu_ms_per_page"]
    figures["turnaround_makespan_over_bound"] = figures["turnaround"]["makespan_over_bound"]
    figures["turnaround_cpu_ms_per_page"] = figures["turnaround"]["cpu_ms_per_page"]
    return figures


def run_turnaround(
    spec: NavWebSpec, tmp: Path, timeout: float, profile: Path | None = None, workers: int = 1
) -> dict[str, Any]:
    """Run 3: the issue's link-heavy web at --delay 0, one request in flight per origin, every other politeness flag
    at its default; makespan against the bound. With `profile`, py-spy samples the node and the worker there."""
    name = "turnaround"
    with WebProcess(spec, tmp / f"{name}-web.jsonl") as web:
        r = run_crawl(web, tmp, name, delay=0.0, timeout=timeout, profile=profile, workers=workers)
        time.sleep(0.2)
        hits = web.hits()
    if r.returncode != 0:
        err = (tmp / f"{name}.stderr").read_text()[-2000:]
        raise RuntimeError(f"turnaround crawl exited {r.returncode}: {err}")
    turn = crawl_figures(r, hits, oracle_for(spec.model()))
    turn.update(politeness(hits, 0.0))
    return turn


def turnaround_lines(tr: dict[str, Any], tw: dict[str, Any]) -> list[str]:
    return [
        f"3. turnaround (issue 10): {tw['origins']} origins x {tw['pages_per_origin']} pages, every page repeating "
        f"the same {tw['nav']} nav links + {tw['content']} content links, server think time "
        f"{tw['service_s'] * 1000:.0f} ms a response, --delay 0, 1 request in flight per origin, default flags"
        + (f", --workers {tw['workers']}" if tw.get("workers", 1) > 1 else ""),
        f"   makespan {tr['makespan_s']:.2f} s, politeness bound {tr['politeness_bound_s']:.2f} s: "
        f"makespan/bound {tr['makespan_over_bound']:.2f} (issue target: <= 2x)",
        f"   CPU {tr['cpu_ms_per_page']:.2f} ms/page by rusage incl. startup and report over {tr['pages']} pages "
        f"(polled: worker {tr['cpu_s_polled']['worker']:.1f} s + node {tr['cpu_s_polled']['node']:.1f} s = "
        f"{tr['cpu_ms_per_page_polled']:.2f} ms/page; after the first request "
        f"{tr['cpu_ms_per_page_after_startup']:.2f} ms/page; issue target <= 6 ms)",
        "   coverage vs oracle: " + _cov(tr["coverage"]),
        "   per origin: "
        + "; ".join(
            f"{lb} {o['requests']} req, median {o['median_response_s'] * 1000:.1f} ms, span {o['span_s']:.2f} s, "
            f"median gap {o['median_gap_s']}"
            for lb, o in list(tr["per_origin"].items())[:6]
        ),
    ]


def table(f: dict[str, Any]) -> str:
    m, w = f["machine"], f["workload"]
    t, p = f["throughput"], f["politeness"]
    lines = [
        machine_line(m, sqlite=True),
        f"crawl: {w['crawl']}",
        f"web: {w['web']}",
        "",
        f"1. throughput: generated web of {w['throughput']['origins']} origins x {w['throughput']['pages_per_origin']} "
        f"pages ({w['throughput']['links_per_page']}+ links a page, robots files, redirects, mirrors, broken links), "
        "--delay 0, 1 request in flight per origin, 64 fetchers",
        f"   {t['pages']:,} pages ({t['requests']:,} requests) in {t['server_window_s']:.2f} s of server log: "
        f"{t['pages_per_s']:,.0f} pages/s   (crawl command wall {t['crawl_wall_s']:.1f} s)",
        f"   CPU of all hostring processes: {t['cpu_ms_per_page']:.2f} ms/page (rusage of the waited crawl+node, "
        f"{t['cpu_s_rusage']:.1f} s incl. startup and report); polled during the run: worker "
        f"{t['cpu_s_polled']['worker']:.1f} s + node {t['cpu_s_polled']['node']:.1f} s = "
        f"{t['cpu_ms_per_page_polled']:.2f} ms/page, {t['cores_busy_during_window']:.2f} cores busy; "
        f"{t['cpu_s_startup']:.1f} s of it before the first request, "
        f"{t['cpu_ms_per_page_after_startup']:.2f} ms/page after",
        "   coverage vs oracle: " + _cov(t["coverage"]),
        "",
        f"2. politeness: {w['politeness']['origins']} origins x {w['politeness']['pages_per_origin']} pages, every "
        f"page repeating the same {w['politeness']['nav']} nav links + {w['politeness']['content']} content links, "
        f"--delay {w['politeness']['delay_s']}, 1 request in flight per origin",
        f"   makespan {p['makespan_s']:.2f} s, politeness bound {p['politeness_bound_s']:.2f} s: "
        f"makespan/bound {p['makespan_over_bound']:.2f} (issue target: within 2x)",
        f"   CPU {p['cpu_ms_per_page']:.2f} ms/page by rusage incl. startup and report over {p['pages']} pages "
        f"(polled: {p['cpu_ms_per_page_polled']:.2f}, of which startup "
        f"{p['cpu_s_startup']:.1f} s; after the first request {p['cpu_ms_per_page_after_startup']:.2f} ms/page; "
        "issue 10's <= 6 ms is judged in section 3, at delay 0: here the processes' time between delayed fetches "
        "is spread over few pages)",
        "   coverage vs oracle: " + _cov(p["coverage"]),
        "   per origin: "
        + "; ".join(
            f"{lb} {o['requests']} req, median {o['median_response_s'] * 1000:.1f} ms, bound {o['bound_s']:.2f} s, "
            f"span {o['span_s']:.2f} s, min gap {o['min_gap_s']}"
            for lb, o in list(p["per_origin"].items())[:6]
        ),
    ]
    lines += ["", *turnaround_lines(f["turnaround"], w["turnaround"])]
    prof = f.get("profile")
    if prof:
        pw = w["profile"]
        lines += [
            "",
            f"4. profile: {pw['origins']} origins x {pw['pages_per_origin']} pages, every page repeating the same "
            f"{pw['nav']} nav links + {pw['content']} content links, --delay 0 (under py-spy)",
            f"   {prof['pages']:,} pages in {prof['server_window_s']:.2f} s: {prof['pages_per_s']:,.0f} pages/s, "
            f"{prof['cpu_ms_per_page']:.2f} ms CPU/page (polled: worker {prof['cpu_s_polled']['worker']:.1f} s, "
            f"node {prof['cpu_s_polled']['node']:.1f} s); coverage: {_cov(prof['coverage'])}",
        ]
        lines += profile_lines(prof)
    return "\n".join(lines)


def _cov(c: dict[str, Any]) -> str:
    s = (
        f"{c['expected_pages']} expected, missing {c['missing']}, unexpected {c['unexpected']}, forbidden "
        f"{c['forbidden']}, duplicates {c['duplicates']}, max in flight per origin {c['max_in_flight_per_origin']}"
    )
    if c["missing_examples"]:
        s += f"; missing e.g. {c['missing_examples'][:3]}"
    if c["duplicate_examples"]:
        s += f"; duplicates e.g. {c['duplicate_examples'][:3]}"
    return s


def _turnaround_only(w: Workload, keep: Path | None, *, as_json: bool, profile: bool = False, rounds: int = 1) -> int:
    """Run 3 alone, `rounds` times (a fresh server and store each time); the round with the median makespan/bound
    is reported in full, every round in one line: on a shared machine one run can be a third slower than the next."""
    m = machine()
    tmpdir = tempfile.mkdtemp(prefix="hostring-bench-crawl-", dir=keep)
    base = Path(tmpdir) / "turnaround-profile"
    spied = profile and shutil.which("py-spy") is not None
    runs: list[dict[str, Any]] = []
    try:
        for n in range(rounds):
            round_dir = Path(tmpdir) / f"round-{n + 1}"
            round_dir.mkdir()
            spy = base if spied and n == 0 else None
            tr = run_turnaround(w.turnaround, round_dir, w.timeout_s, profile=spy, workers=w.workers)
            for role in ("node", "worker") if spied and n == 0 else ():
                path = base.with_name(base.name + f"-{role}.txt")
                if path.exists():
                    tr[f"{role}_profile"] = profile_summary(path, top=20)
            runs.append(tr)
    finally:
        if keep is None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    median = sorted(runs, key=lambda r: r["makespan_over_bound"])[(len(runs) - 1) // 2]
    summary = [_round_summary(r) for r in runs]
    tw = {**asdict(w.turnaround), "delay_s": 0.0, "concurrency_per_origin": 1, "rounds": rounds, "workers": w.workers}
    if as_json:
        figures = {"machine": m, "workload": tw, "turnaround": median, "rounds": summary}
        print(json.dumps(figures, indent=2, default=str))
    else:
        print(machine_line(m, sqlite=True))
        print("\n".join(turnaround_lines(median, tw)))
        if rounds > 1:
            print(f"   the round above is the median of {rounds} by makespan/bound; every round:")
            print("\n".join(_round_line(n + 1, r) for n, r in enumerate(summary)))
        if spied:
            print("   (sampled by py-spy --gil --rate 200, which itself slows the sampled processes; round 1)")
            print("\n".join(profile_lines(runs[0])))
    return 0


def _round_summary(tr: dict[str, Any]) -> dict[str, Any]:
    """The figures of one turnaround round that the issue's targets read."""
    return {
        "makespan_over_bound": tr["makespan_over_bound"],
        "makespan_s": tr["makespan_s"],
        "cpu_ms_per_page": tr["cpu_ms_per_page"],
        "cpu_s_worker": tr["cpu_s_polled"]["worker"],
        "cpu_s_node": tr["cpu_s_polled"]["node"],
    }


def _round_line(n: int, r: dict[str, Any]) -> str:
    return (
        f"     round {n}: makespan/bound {r['makespan_over_bound']:.2f}, CPU {r['cpu_ms_per_page']:.2f} ms/page "
        f"(worker {r['cpu_s_worker']:.1f} s, node {r['cpu_s_node']:.1f} s)"
    )


def profile_lines(prof: dict[str, Any]) -> list[str]:
    """The node's and the worker's py-spy summaries: self time, then inclusive, as % of samples."""
    lines = []
    for role in ("node", "worker"):
        if f"{role}_profile" in prof:
            lines.append(f"   {role} (py-spy --gil, self time, % of samples):")
            lines += [f"     {share:5.1f}%  {frame}" for frame, share in prof[f"{role}_profile"]["self"][:15]]
            lines.append(f"   {role} (inclusive):")
            lines += [f"     {share:5.1f}%  {frame}" for frame, share in prof[f"{role}_profile"]["inclusive"][:25]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crawl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test): 20 origins, no profile")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profile run")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep logs, stores and profiles in a new directory under DIR",
    )
    parser.add_argument(
        "--turnaround-only", action="store_true", help="only run 3 (the issue's link-heavy web at --delay 0)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --turnaround-only: sample the node and the worker with py-spy and print where their time goes",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --turnaround-only: run it N times and report the median round (default: 1)",
    )
    parser.add_argument("--origins", type=int, default=None, help="origins of the throughput web")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="crawl with `hostring crawl --workers N` (worker processes; default: 1)",
    )
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-log", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve_main(args.serve, args.serve_log)
    w = QUICK if args.quick else FULL
    if args.no_profile:
        w = Workload(**{**w.__dict__, "profile": None})
    if args.origins:
        w = Workload(**{**w.__dict__, "throughput": RandomWebSpec(origins=args.origins)})
    if args.workers > 1:
        w = Workload(**{**w.__dict__, "workers": args.workers})
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    if args.turnaround_only:
        return _turnaround_only(w, args.keep, as_json=args.json, profile=args.profile, rounds=args.rounds)
    figures = run(w, args.keep)
    print(json.dumps(figures, indent=2, default=str) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
