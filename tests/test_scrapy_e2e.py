"""Real Scrapy through hostring: `scrapy runspider examples/scrapy_spider.py` processes against a loopback web.

Every crawl here runs the README's example spider in subprocesses that share one `hostring node` (or a
two-node cluster): unchanged (its one hostring line, `SCHEDULER = "hostring.scrapy.Scheduler"`, with
HOSTRING_NODES or HOSTRING_COORDINATOR on the command line), or as users write it in their own code (SCHEDULER
and the nodes in `custom_settings`; or the add-on, or the former three settings, which must keep working). A
spider of every callback shape (CrawlSpider rules, async callbacks, no errback) runs the same way. Each crawl is
judged from what the *web server* saw (hostring_testing's request log and oracle) and from the items the
spiders wrote:

- every page a correct crawler fetches is fetched exactly once between the processes, each process doing a
  fair share, and no page robots forbid; an origin whose robots.txt answers 503 sees only robots.txt;
- no origin ever has two requests in flight or a pause below the delay;
- retries and redirects are hostring's, as in `hostring crawl`: a 429 is retried max-attempts times with
  Retry-After honoured, a page that times out likewise, and the spider hears of each once, in its errback,
  when hostring gives up; a redirect target is fetched as its own item and reaches the spider with the
  redirecting request's callback, cb_kwargs and meta;
- a Scrapy process killed with SIGKILL loses nothing: its leases expire and the other process fetches them.

Only loopback servers the tests start are contacted; Scrapy's downloader has no network policy of its own.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from hostring.scrapy.session import StaticRing
from hostring.urls import identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing import (
    LocalWeb,
    Oracle,
    Page,
    Site,
    WebModel,
    html_page,
    needed_depth,
    oracle_for,
    random_model,
    redirect_page,
    render_model,
)
from hostring_testing.cluster import Cluster, wait_for
from hostring_testing.crawls import (
    STORE_NAME,
    TOKEN,
    UA,
    CrawlProcess,
    fresh_page_lease,
    gaps,
    journal,
    key_of,
    page_hits,
    politeness_violations,
    serve,
)
from hostring_testing.proc import REPO, STARTUP_TIMEOUT_S
from tests.test_security import Pki, pki  # noqa: F401 (the certificates fixture)

EXAMPLE = REPO / "examples" / "scrapy_spider.py"
SHAPES = REPO / "tests" / "scrapy_shapes_spider.py"
SCHEDULER = "hostring.scrapy.Scheduler"
STAT_LINE = re.compile(r"'(hostring/[^']+)': (\d+)")


def links(*hrefs: str) -> str:
    items = "".join(f'<li><a href="{h}">{h}</a></li>' for h in hrefs)
    return f"<!DOCTYPE html><html><head><title>t</title></head><body><ul>{items}</ul></body></html>"


# ---------------------------------------------------------------------------------------------- processes


class Spider(CrawlProcess):
    """One `scrapy runspider` of the example spider (or `script`), identified by its User-Agent (same product
    token); `hostring` and `extra` are `-s` settings, `args` the `-a` arguments (default: start=the starts)."""

    def __init__(
        self,
        name: str,
        tmp: Path,
        starts: Sequence[str],
        hostring: Sequence[str],
        *extra: str,
        script: Path = EXAMPLE,
        args: Sequence[str] | None = None,
    ) -> None:
        self.items_path = tmp / f"{name}.jsonl"
        self.user_agent = f"{TOKEN}/0.1 (scrapy-{name})"
        settings = {
            "USER_AGENT": self.user_agent,
            "LOG_LEVEL": "INFO",
            "TELNETCONSOLE_ENABLED": "False",
            "REMOTE_CONTROL_ENABLED": "False",
            "HOSTRING_WORKER_ID": f"scrapy-{name}",
            "HOSTRING_DRAIN_GRACE_S": "1.0",
            "DOWNLOAD_TIMEOUT": "2",
        }
        cmd = [sys.executable, "-m", "scrapy", "runspider", str(script), "-O", str(self.items_path)]
        for arg in ["start=" + ",".join(starts)] if args is None else args:
            cmd += ["-a", arg]
        for key, value in settings.items():
            cmd += ["-s", f"{key}={value}"]
        for setting in (*hostring, *extra):
            cmd += ["-s", setting]
        super().__init__(cmd, None, tmp, name)

    def items(self) -> list[dict[str, Any]]:
        text = self.items_path.read_text(encoding="utf-8") if self.items_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def stats(self) -> Counter[str]:
        return Counter({k: int(v) for k, v in STAT_LINE.findall(self.stderr())})


def variant(tmp: Path, name: str, custom_settings: dict[str, Any]) -> Path:
    """The example spider as users configure it in their own code: a spider file whose `custom_settings` (in
    place of the example's SCHEDULER) say how hostring is enabled and, if given, where the nodes are."""
    path = tmp / f"spider_{name}.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(EXAMPLE.parent)!r})\nfrom scrapy_spider import PagesSpider\n\n\n"
        f"class Variant(PagesSpider):\n    custom_settings = {custom_settings!r}\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def spiders() -> Iterator[list[Spider]]:
    """Every spider a test starts is killed (with its process group) at teardown."""
    started: list[Spider] = []
    yield started
    for s in started:
        s.kill()


def run_together(spiders: list[Spider], timeout: float) -> None:
    """Start the spiders at once and wait for each to end by itself with exit code 0."""
    for s in spiders:
        s.start()
    for s in spiders:
        code = s.wait(timeout)
        assert code == 0, f"{s.name} exited {code}\n{s.output()}"


# ---------------------------------------------------------------------------------------------- judging


def judge_coverage(web: LocalWeb, model: WebModel, oracle: Oracle) -> None:
    """The model's origins: every page a correct crawler fetches, nothing else, nothing robots forbids."""
    fetched = {k for k in web.fetched() if k[0] in model.origins}
    verdict = oracle.judge(fetched)
    assert verdict["missing"] == set(), f"never fetched: {sorted(verdict['missing'])[:10]}"
    assert verdict["forbidden"] == set(), f"robots forbid: {sorted(verdict['forbidden'])}"
    assert verdict["unexpected"] == set(), f"unexpected: {sorted(verdict['unexpected'])}"


def judge_politeness(web: LocalWeb, delay: float, tolerance: float = 0.02) -> None:
    for label in web.origins:
        assert web.max_concurrency(label) <= 1, label
        assert politeness_violations(web, label, delay, tolerance) == [], label


def judge_fair_share(web: LocalWeb, oracle: Oracle, spiders: Sequence[Spider], floor: float = 0.2) -> dict[str, int]:
    """Each process fetched at least `floor` of the pages fetched while all of them crawled: from the last one's
    first page on (on a loaded machine one Scrapy process can start seconds after the other, which meanwhile has
    the web to itself). The pages of each process in all, by name."""
    hits = page_hits(web, oracle.robots_fetches)
    by_agent = Counter(h.user_agent for h in hits)
    shares = {s.name: by_agent[s.user_agent] for s in spiders}
    assert sum(shares.values()) == len(hits), f"requests from outside the spiders: {by_agent}"
    assert all(shares.values()), f"a process fetched nothing: {shares}"
    all_in = max(min(h.start for h in hits if h.user_agent == s.user_agent) for s in spiders)
    together = Counter(h.user_agent for h in hits if h.start >= all_in)
    total = sum(together.values())
    for s in spiders:
        n = together[s.user_agent]
        assert n >= floor * total, f"{s.name} fetched {n} of the {total} pages fetched while all crawled: {shares}"
    return shares


def judge_items(
    web: LocalWeb, oracle: Oracle, items: list[dict[str, Any]], seeds: set[str]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Each page the server answered 200 reached the spider's callback exactly once, with the cb_kwargs and meta
    of the request that discovered it; returns the items by page."""
    pages = [i for i in items if "error" not in i]
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for item in pages:
        key = key_of(web, item["url"])
        assert key not in by_key, f"{key} reached the spider twice: {by_key[key]} and {item}"
        by_key[key] = item
    served = {(h.label, h.resource) for h in page_hits(web, oracle.robots_fetches) if h.status == 200 and h.complete}
    assert set(by_key) == served, (sorted(set(by_key) - served)[:5], sorted(served - set(by_key))[:5])
    for item in by_key.values():
        if item["url"] in seeds:
            assert (item["via"], item["parent"], item["depth"]) == ("start", "", 0), item
        else:
            assert item["via"] == "link" and item["depth"] >= 1, item
            assert key_of(web, item["parent"]) in by_key, f"{item['url']} came from a page never parsed: {item}"
    return by_key


# ---------------------------------------------------------------------------------------------- one node


def flaky_sites() -> dict[str, Site]:
    """An origin that links to a 429 with Retry-After and to a page that always times out (each on an origin of
    its own, so their backoffs overlap) and has a 302 to a page of its own."""
    return {
        "flaky": Site(
            pages={
                "/": html_page(links("{{origin:busy}}/", "{{origin:slow}}/", "/moved", "/fine")),
                "/moved": redirect_page("{{origin:flaky}}/landed", status=302),
                "/landed": html_page(links("/")),
                "/fine": html_page(links("/")),
            }
        ),
        "busy": Site(
            pages={"/": Page(status=429, body=b"slow down\n", content_type="text/plain", headers={"Retry-After": "1"})}
        ),
        "slow": Site(pages={"/": html_page(links("/") + " " * 4000, trickle_s=0.01)}),
    }


def node_args(tmp: Path, delay: float, lease_s: float, model: WebModel, *extra: str) -> list[str]:
    return ["node", "--store", f"sqlite:///{tmp / STORE_NAME}", "--listen", "127.0.0.1:0", "--delay", str(delay),
            "--lease-s", str(lease_s), "--user-agent", UA, "--max-depth", str(needed_depth(model) + 4),
            *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_processes_share_one_node(tmp_path: Path, spiders: list[Spider]) -> None:
    """Two Scrapy processes, one `hostring node`: a generated web of six origins (robots rules, a robots.txt that
    answers 503, robots redirects, page redirects, mirrors, nofollow) plus origins that answer 429, time
    out and redirect. Judged as `hostring crawl` is."""
    model = random_model(29, origins=6, pages_per_origin=16, unavailable_robots=1, trap_fraction=0.0, user_agent=TOKEN)
    oracle = oracle_for(model)
    assert oracle.blocked and oracle.robots_redirects and oracle.robots_unavailable, "the web should test robots"
    sites = {**render_model(model, 29), **flaky_sites()}
    delay, max_attempts = 0.2, 3
    with LocalWeb(sites) as web:
        node, port = serve(
            node_args(tmp_path, delay, 10.0, model, "--max-attempts", str(max_attempts), "--retry-base-s", "0.3",
                      "--robots-attempts", "1"),
            tmp_path, "node",
        )  # fmt: skip
        try:
            starts = [*oracle.seed_urls(web), web.url("flaky")]
            # Spider a is configured in its own code with the one setting and the node (and asks Scrapy to obey
            # robots.txt: hostring owns it, so nothing may be fetched twice); b is the example, the node given
            # on the command line.
            node_at = f"127.0.0.1:{port}"
            own = variant(tmp_path, "a", {"SCHEDULER": SCHEDULER, "HOSTRING_NODES": node_at, "ROBOTSTXT_OBEY": True})
            spiders += [
                Spider("a", tmp_path, starts, [], script=own),
                Spider("b", tmp_path, starts, [f"HOSTRING_NODES={node_at}"]),
            ]
            run_together(spiders, 180)
        finally:
            node.stop(signal.SIGKILL)

        assert "hostring owns robots.txt" in spiders[0].stderr()
        judge_coverage(web, model, oracle)
        dead = next(iter(oracle.robots_unavailable))
        assert [h for h in page_hits(web, oracle.robots_fetches) if h.label == dead] == [], "the 503-robots origin"
        retried = {("busy", "/"), ("slow", "/")}
        counts = Counter((h.label, h.resource) for h in page_hits(web, oracle.robots_fetches))
        assert {k: n for k, n in counts.items() if n > 1} == dict.fromkeys(retried, max_attempts)
        robots = [h for h in web.hits if h.resource == "/robots.txt" or (h.label, h.resource) in oracle.robots_fetches]
        extra_robots = {(label, "/robots.txt") for label in ("flaky", "busy", "slow")}
        assert {(h.label, h.resource) for h in robots} == oracle.robots_fetches | extra_robots
        judge_politeness(web, delay, tolerance=0.03)
        # After each 429 the origin rests at least Retry-After, whichever page comes next.
        after_429 = [gap for gap, prev, _ in gaps(web.hits_for("busy")) if prev.status == 429]
        assert after_429 and min(after_429) >= 1.0 - 0.02, after_429
        slow = [h for h in web.hits_for("slow") if h.resource == "/"]
        assert all(not h.complete and 1.5 < h.end - h.start < 5.0 for h in slow), slow  # DOWNLOAD_TIMEOUT 2 s

        shares = judge_fair_share(web, oracle, spiders)
        items = spiders[0].items() + spiders[1].items()
        pages = judge_items(web, oracle, items, set(starts))
        landed = pages[("flaky", "/landed")]
        assert landed["parent"] == web.url("flaky") and landed["via"] == "link", landed  # carried over the hop
        assert ("flaky", "/moved") not in pages
        errors = Counter((key_of(web, i["url"]), i["error"], i["status"]) for i in items if "error" in i)
        assert errors == {
            (("busy", "/"), "HttpError", 429): 1,
            (("slow", "/"), "DownloadTimeoutError", 0): 1,
            **{(key, "HttpError", 404): 1 for key in oracle.broken},
        }

        stats = spiders[0].stats() + spiders[1].stats()
        assert stats["hostring/withheld/retry"] == 2 * (max_attempts - 1), stats
        redirects = {k for k, spec in model.pages.items() if spec.redirect_to and k in oracle.reachable_allowed}
        assert redirects, "the web should have page redirects"
        assert stats["hostring/withheld/redirect"] == 1 + len(redirects), stats
        assert stats["hostring/lease/robots"] == len(robots), stats  # every robots fetch was a hostring lease
        assert stats["hostring/lease/page"] == sum(counts.values()), stats
        # Every request a page's callback yielded travelled in that page's Complete: only the start requests were
        # Discovered on their own, and no link reached the scheduler after its page was completed.
        assert stats["hostring/discover/sent"] == 2 * len(starts) and stats["hostring/complete/links_sent"] > 0, stats
        assert "hostring/discover/after_complete" not in stats, stats
        print(f"pages by process: {shares}; hostring stats: {dict(sorted(stats.items()))}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_process_loses_nothing(tmp_path: Path, spiders: list[Spider]) -> None:
    """SIGKILL one of two Scrapy processes mid-crawl, while it holds leases (every page takes 0.5 s to answer):
    the node hands its leases out again when they expire, the other process fetches them, and every page a
    correct crawler fetches is fetched; the only pages fetched twice are ones the killed process had leased."""
    model = random_model(
        8, origins=6, pages_per_origin=14, unavailable_robots=0, trap_fraction=0.0, seeds=6, user_agent=TOKEN
    )
    oracle = oracle_for(model)
    sites = render_model(model, 8)
    for site in sites.values():
        for page in site.pages.values():
            page.delay_s = 0.5
    lease_s = 2.0
    with LocalWeb(sites) as web:
        node, port = serve(node_args(tmp_path, 0.1, lease_s, model), tmp_path, "node")
        try:
            starts = oracle.seed_urls(web)
            victim, survivor = (Spider(n, tmp_path, starts, [f"HOSTRING_NODES=127.0.0.1:{port}"]) for n in "ab")
            spiders += [victim, survivor]
            victim.start()
            survivor.start()
            wait_for(
                lambda: (
                    not victim.running
                    or (
                        sum(h.user_agent == victim.user_agent for h in web.hits) >= 10
                        and fresh_page_lease(tmp_path, "scrapy-a", web)
                    )
                ),
                90,
                "the victim to fetch 10 pages and hold a fresh lease on a page",
                interval=0.02,
            )
            assert victim.running, f"the victim ended before it was killed\n{victim.output()}"
            victim.kill()
            killed_at = time.time()
            code = survivor.wait(150)
            assert code == 0, survivor.output()
            expired = {row["key"] for row in journal(tmp_path, event="expire")}
        finally:
            node.stop(signal.SIGKILL)

        judge_coverage(web, model, oracle)
        judge_politeness(web, 0.1)
        assert expired, "the victim held no lease when it was killed: nothing was tested"
        pages = page_hits(web, oracle.robots_fetches)
        before = {(h.label, h.resource) for h in pages if h.user_agent == victim.user_agent}
        twice = {k for k, n in Counter((h.label, h.resource) for h in pages).items() if n > 1}
        assert twice <= before, f"fetched twice without the victim: {sorted(twice - before)}"
        for key in twice:
            hits = sorted((h for h in pages if (h.label, h.resource) == key), key=lambda h: h.start)
            assert [h.user_agent for h in hits] == [victim.user_agent, survivor.user_agent], hits
            assert hits[1].start >= killed_at, hits
        assert len(twice) <= len(expired), (sorted(twice), sorted(expired))
        survivor_items = [i for i in survivor.items() if "error" not in i]
        survivor_pages = {
            (h.label, h.resource) for h in pages if h.user_agent == survivor.user_agent and h.status == 200
        }
        assert {key_of(web, i["url"]) for i in survivor_items} == survivor_pages
        print(f"leases expired after the kill: {len(expired)}; fetched twice: {sorted(twice)}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wait_mode_takes_work_seeded_later_and_stops_on_sigint(tmp_path: Path, spiders: list[Spider]) -> None:
    """HOSTRING_WHEN_DRAINED = "wait": a spider without start URLs stays up while the node is empty, crawls what
    an operator seeds later (a seed without payload reaches the spider's default callback), and stops cleanly
    on SIGINT, giving nothing back because it holds nothing."""
    sites = {"a": Site(pages={"/": html_page(links("/x", "/y")), "/x": html_page(links("/")), "/y": html_page("")})}
    with LocalWeb(sites) as web:
        node, port = serve(node_args(tmp_path, 0.05, 10.0, random_model(1)), tmp_path, "node")
        try:
            spider = Spider("w", tmp_path, [], [f"HOSTRING_NODES=127.0.0.1:{port}", "HOSTRING_WHEN_DRAINED=wait"])
            spiders.append(spider)
            spider.start()
            wait_for(lambda: "leasing from" in spider.stderr() or not spider.running, 60, "the spider to lease")
            time.sleep(3.0)  # well past HOSTRING_DRAIN_GRACE_S with nothing to do
            assert spider.running, spider.output()
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
                seed = pb.Link(observed=web.url("a"), seed=True)
                assert stub.Discover(pb.DiscoverRequest(links=[seed]), timeout=10).verdicts[0].verdict == pb.ADMITTED
            wait_for(lambda: len(page_hits(web)) == 3, 60, "the seeded site to be crawled")
            time.sleep(2.0)
            assert spider.running, "the spider closed although told to wait"
            spider.send(signal.SIGINT)
            assert spider.wait(60) == 0, spider.output()
        finally:
            node.stop(signal.SIGKILL)
    assert web.duplicates(include_robots=True) == []
    assert {i["url"] for i in spider.items()} == {web.url("a", p) for p in ("/", "/x", "/y")}
    assert "Closing spider (shutdown)" in spider.stderr()
    assert "hostring/lease/given_back" not in spider.stderr()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_long_download_keeps_its_lease(tmp_path: Path, spiders: list[Spider]) -> None:
    """A page that takes three times the lease to answer is renewed while it downloads: fetched once, no lease
    expires, and the spider gets it."""
    sites = {"a": Site(pages={"/": html_page(links("/slow")), "/slow": html_page(links("/"), delay_s=4.5)})}
    with LocalWeb(sites) as web:
        node, port = serve(node_args(tmp_path, 0.05, 1.5, random_model(1)), tmp_path, "node")
        try:
            spider = Spider("r", tmp_path, [web.url("a")], [f"HOSTRING_NODES=127.0.0.1:{port}"], "DOWNLOAD_TIMEOUT=20")
            spiders.append(spider)
            run_together([spider], 90)
            expired = journal(tmp_path, event="expire")
        finally:
            node.stop(signal.SIGKILL)
    assert web.duplicates(include_robots=True) == [], "the long download was handed out again"
    assert expired == []
    assert {i["url"] for i in spider.items()} == {web.url("a"), web.url("a", "/slow")}
    assert spider.stats()["hostring/renew/ok"] >= 2, spider.stats()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_callback_shape_sees_what_it_would_without_hostring(tmp_path: Path, spiders: list[Spider]) -> None:
    """tests/scrapy_shapes_spider.py, with only SCHEDULER: a CrawlSpider's start URL (no callback: Scrapy's
    default dispatch applies the rules) redirected once by hostring, rule callbacks, an async-generator callback
    and the coroutine callback it follows, a handled 410, and, without errbacks, a 404 and a timeout that Scrapy
    reports as it would without hostring, and a download a downloader middleware replaced with another URL (its
    lease ends, the other URL is crawled with the same callback). Every callback sees its own method as
    response.request.callback."""
    sites = {
        "s": Site(
            pages={
                "/start": redirect_page("{{origin:s}}/", status=302),
                "/": html_page(links("/rule/1")),
                "/rule/1": html_page(links("/rule/2", "/")),
                "/rule/2": html_page(links("/rule/1")),
                "/async": html_page(""),
                "/coro": html_page(""),
                "/gone": Page(status=410, body=b"gone\n", content_type="text/plain"),
                "/landing": html_page(""),
            }
        ),
        "slow": Site(pages={"/": html_page(" " * 4000, trickle_s=0.01)}),
    }
    with LocalWeb(sites) as web:
        model = random_model(1)
        node, port = serve(node_args(tmp_path, 0.05, 10.0, model, "--max-attempts", "1"), tmp_path, "node")
        try:
            args = [f"site={web.url('s').rstrip('/')}", f"slow={web.url('slow').rstrip('/')}"]
            spider = Spider(
                "shapes", tmp_path, [], [f"HOSTRING_NODES=127.0.0.1:{port}"], "DOWNLOAD_TIMEOUT=1", script=SHAPES,
                args=args,
            )  # fmt: skip
            spiders.append(spider)
            run_together([spider], 90)
        finally:
            node.stop(signal.SIGKILL)
    assert web.duplicates(include_robots=True) == []
    assert not [h for h in web.hits if h.resource == "/replaced"], "the replaced download went out"
    got = sorted(
        (i["kind"], key_of(web, i["url"])[1], i.get("n"), i.get("status"), i.get("own")) for i in spider.items()
    )
    assert got == [
        ("async", "/async", 1, None, True),
        ("coro", "/coro", 2, None, True),
        ("rule", "/rule/1", None, None, True),
        ("rule", "/rule/2", None, None, True),
        ("start", "/", None, None, None),
        ("status", "/gone", None, 410, True),
        ("status", "/landing", None, 200, True),
    ], got
    err, stats = spider.stderr(), spider.stats()
    assert f"Ignoring response <404 {web.url('s', '/missing')}>" in err
    assert f"Error downloading <GET {web.url('slow')}>" in err
    assert "Spider error" not in err and "spider_exceptions" not in err, err[-3000:]
    assert stats["hostring/withheld/redirect"] == 1, stats
    assert stats["hostring/lease/page"] == 11 and stats["hostring/complete/replaced"] == 1, stats
    assert stats["hostring/complete/failed"] == 2, stats  # the timeout and the replaced download


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mutual_tls_to_the_node(tmp_path: Path, pki: Pki, spiders: list[Spider]) -> None:  # noqa: F811
    """HOSTRING_TLS_CERT/KEY/CA: a spider crawls through a node that requires client certificates."""
    sites = {"a": Site(pages={"/": html_page(links("/x")), "/x": html_page(links("/"))})}
    tls = [f"HOSTRING_TLS_CERT={pki.cert}", f"HOSTRING_TLS_KEY={pki.key}", f"HOSTRING_TLS_CA={pki.ca}"]
    with LocalWeb(sites) as web:
        node, port = serve([*node_args(tmp_path, 0.05, 10.0, random_model(1)), *pki.flags()], tmp_path, "node")
        try:
            spider = Spider("t", tmp_path, [web.url("a")], [f"HOSTRING_NODES=127.0.0.1:{port}", *tls])
            spiders.append(spider)
            run_together([spider], 90)
        finally:
            node.stop(signal.SIGKILL)
    assert {i["url"] for i in spider.items()} == {web.url("a"), web.url("a", "/x")}
    assert "plaintext" not in node.stderr(), "the node did not run with TLS"


FORMER_MIDDLEWARES = {
    "DOWNLOADER_MIDDLEWARES": {"hostring.scrapy.DownloaderMiddleware": 585},
    "SPIDER_MIDDLEWARES": {"hostring.scrapy.SpiderMiddleware": 5},
}


# ---------------------------------------------------------------------------------------------- several nodes


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_processes_share_two_standalone_nodes(tmp_path: Path, spiders: list[Spider]) -> None:
    """HOSTRING_NODES with two nodes started without a coordinator: the spiders shard the domains by a ring of
    the node addresses (links another node owns are Discovered there, not admitted by the node that leased the
    page), so each domain lives on one node and every page is still fetched once, politely. One spider enables
    hostring with the add-on, the other with the three settings an earlier version needed (its two middlewares
    now disable themselves, saying so)."""
    model = random_model(
        31, origins=6, pages_per_origin=12, unavailable_robots=0, redirect_robots_fraction=0.0,
        trap_fraction=0.0, seeds=6, user_agent=TOKEN,
    )  # fmt: skip
    oracle = oracle_for(model)
    delay = 0.1
    with LocalWeb(render_model(model, 31)) as web:
        nodes = []
        try:
            starts = oracle.seed_urls(web)
            for n in ("n1", "n2"):
                (tmp_path / n).mkdir()
                nodes.append(serve(node_args(tmp_path / n, delay, 10.0, model), tmp_path, n))
            # The ring of the two addresses may give every seed's domain to one node (about one pair of ports in
            # thirty): n2 starts again on another port until the ring shares them, so that the split judged below
            # is the spiders' routing, not the luck of the ports.
            seed_domains = {identify(url).domain for url in starts}
            for _ in range(20):
                ring = StaticRing([f"127.0.0.1:{port}" for _, port in nodes])
                if len({ring.owner(domain) for domain in seed_domains}) == 2:
                    break
                nodes.pop()[0].stop(signal.SIGKILL)
                nodes.append(serve(node_args(tmp_path / "n2", delay, 10.0, model), tmp_path, "n2"))
            addresses = ",".join(f"127.0.0.1:{port}" for _, port in nodes)
            # The forms an earlier version asked for still work: the add-on, and the three settings.
            addon = variant(tmp_path, "addon", {"ADDONS": {"hostring.scrapy.Addon": 0}})
            three = variant(tmp_path, "three", {"SCHEDULER": SCHEDULER, **FORMER_MIDDLEWARES})
            spiders += [
                Spider(n, tmp_path, starts, [f"HOSTRING_NODES={addresses}"], script=script)
                for n, script in (("a", addon), ("b", three))
            ]
            run_together(spiders, 180)
            reports = {}
            for proc, port in nodes:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
                    resp = stub.Report(pb.ReportRequest(dispositions=True), timeout=10)
                    reports[proc.name] = json.loads(resp.json)["dispositions"]
        finally:
            for proc, _ in nodes:
                proc.stop(signal.SIGKILL)

    judge_coverage(web, model, oracle)
    assert web.duplicates(include_robots=True) == [], "fetched more than once (robots files included)"
    judge_politeness(web, delay)
    judge_fair_share(web, oracle, spiders)
    judge_items(web, oracle, spiders[0].items() + spiders[1].items(), set(starts))
    domains = {name: {identify(row["url"]).domain for row in rows} for name, rows in reports.items()}
    assert domains["n1"] and domains["n2"], f"one node got every domain: {domains}"
    assert not domains["n1"] & domains["n2"], f"domains on both nodes: {domains['n1'] & domains['n2']}"
    for name in ("DownloaderMiddleware", "SpiderMiddleware"):
        assert f"Disabled hostring.scrapy.{name}: not needed any more" in spiders[1].stderr()


# ---------------------------------------------------------------------------------------------- a cluster


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_processes_share_a_two_node_cluster(tmp_path: Path, empty_redis: str, spiders: list[Spider]) -> None:
    """The same through HOSTRING_COORDINATOR: a coordinator and two nodes on Redis, the domains split between
    them; both spiders lease from both nodes and route each request to its domain's owner."""
    model = random_model(
        31, origins=6, pages_per_origin=14, unavailable_robots=0, redirect_robots_fraction=0.0,
        trap_fraction=0.0, seeds=6, user_agent=TOKEN,
    )  # fmt: skip
    oracle = oracle_for(model)
    assert needed_depth(model) <= 18  # the nodes' default --max-depth is 20
    delay = 0.1
    with (
        LocalWeb(render_model(model, 31)) as web,
        Cluster(tmp_path, empty_redis, heartbeat_timeout=5.0, delay=delay, lease_s=10.0) as cluster,
    ):
        cluster.start_coordinator()
        cluster.start_nodes("n1", "n2")
        ring = cluster.wait_settled({"n1", "n2"}, STARTUP_TIMEOUT_S)
        domains = {identify(web.url(label)).domain for label in web.origins}
        owners = Counter(ring.owner(d).node_id for d in domains)  # type: ignore[union-attr]
        assert set(owners) == {"n1", "n2"}, f"the ring gives every origin to one node: {owners}"
        starts = oracle.seed_urls(web)
        # a: SCHEDULER and the coordinator in the spider's own custom_settings; b: the example, on the command line.
        own = variant(tmp_path, "a", {"SCHEDULER": SCHEDULER, "HOSTRING_COORDINATOR": cluster.coordinator})
        spiders += [
            Spider("a", tmp_path, starts, [], script=own),
            Spider("b", tmp_path, starts, [f"HOSTRING_COORDINATOR={cluster.coordinator}"]),
        ]
        run_together(spiders, 180)
        granted = {n: cluster.stats(n).leases_granted for n in ("n1", "n2")}

    judge_coverage(web, model, oracle)
    assert web.duplicates(include_robots=True) == [], "fetched more than once (robots files included)"
    judge_politeness(web, delay)
    shares = judge_fair_share(web, oracle, spiders)
    judge_items(web, oracle, spiders[0].items() + spiders[1].items(), set(starts))
    assert all(granted.values()), f"a node handed out nothing: {granted}"
    print(f"pages by process: {shares}; leases by node: {granted}")
