"""End-to-end: `hostring crawl` against a local multi-origin web on loopback, judged from the server's log.

Every test starts its own LocalWeb (one origin per 127.0.0.N address), crawls it with hostring, and decides
from what the *server* saw (`LocalWeb.hits`: each request with its start and end time and the number of
requests in flight on its origin) and from the crawl's report.json and journal. Only loopback servers that
the tests start are ever contacted.

One crawl must wait out hostring's default robots retry backoff (about 5 + 10 + 20 s with jitter; neither
`hostring crawl` nor CrawlOptions can shorten it): a robots file that answers 503 takes about 40 s to end.
It, and the two network-refusal crawls (which took as long before a refused robots fetch stopped being
retried), run as background `hostring crawl` processes started with the module
(`_prestart_background_crawls`), so their waiting overlaps the other tests; the tests that judge them come
last in the file.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hostring_cli.crawl import CrawlOptions, run_crawl
from hostring_testing import (
    CountingWeb,
    LinkSpec,
    LocalWeb,
    Page,
    PageSpec,
    RobotsSpec,
    Site,
    bomb_page,
    html_page,
    needed_depth,
    oracle_for,
    random_model,
    redirect_page,
    render_model,
    robots_allowed,
    robots_page,
)
from hostring_testing.crawls import (
    LOOPBACK,
    TOKEN,
    UA,
    CrawlProcess,
    by_state,
    crawl_cmd,
    dispositions,
    gaps,
    journal,
    key_of,
    load_report,
    page_hits,
    politeness_violations,
    run_cli,
    scope_file,
    unexplained_refetches,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def links(*hrefs: str) -> str:
    """An HTML page body with one <a> per href (placeholders such as {{origin:b}} allowed)."""
    items = "".join(f'<li><a href="{h}">{h}</a></li>' for h in hrefs)
    return f"<!DOCTYPE html><html><head><title>t</title></head><body><ul>{items}</ul></body></html>"


def crawl_in_process(
    seeds: Sequence[str],
    out: Path,
    *,
    delay: float,
    scope: Path | None = None,
    allow: Sequence[str] = (LOOPBACK,),
    **options: Any,
) -> tuple[int, dict[str, Any], str]:
    """`run_crawl` in this process (main thread: it installs signal handlers); (exit code, report, printed text)."""
    text = io.StringIO()
    opts = CrawlOptions(
        seeds=list(seeds),
        out=out,
        scope="list" if scope is not None else "domain",
        scope_file=scope,
        allow_network=list(allow),
        delay=delay,
        user_agent=UA,
        progress=False,
        **options,
    )
    code = run_crawl(opts, text)
    report = load_report(out) if (out / "report.json").exists() else {}
    return code, report, text.getvalue()


def hit_keys(web: LocalWeb, robots_files: frozenset[tuple[str, str]] = frozenset()) -> set[tuple[str, str]]:
    return {(h.label, h.resource) for h in page_hits(web, set(robots_files))}


# ==================================================================================== background crawls


@dataclass
class Background:
    """A `hostring crawl` started with the module, its web, and what the test needs to judge it."""

    web: CountingWeb
    proc: CrawlProcess
    out: Path
    started_at: float

    def finish(self, timeout: float) -> int:
        """Wait for the crawl to end by itself (bounded); its exit code."""
        return self.proc.wait(timeout)

    @property
    def took(self) -> float:
        """Seconds from the start of the command to its report (it may have ended long before we waited)."""
        return (self.out / "report.json").stat().st_mtime - self.started_at


def _start_background(
    tmp: Path, web: CountingWeb, seeds: list[str], *, allow: tuple[str, ...], scope: Path | None = None
) -> Background:
    out = tmp / "crawl"
    started_at = time.time()
    proc = CrawlProcess(crawl_cmd(seeds, out, delay=0.05, allow=allow, scope=scope), out, tmp).start()
    return Background(web, proc, out, started_at)


@pytest.fixture(scope="module")
def robots_503_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """'down' answers 503 for robots.txt (no Retry-After), 'up' has no robots file and links into 'down'."""
    sites = {
        "down": Site(
            pages={"/": html_page(links("/a", "/b")), "/a": html_page(links("/")), "/b": html_page(links("/"))},
            robots=Page(status=503, body=b"busy\n", content_type="text/plain"),
        ),
        "up": Site(
            pages={"/": html_page(links("/x", "{{origin:down}}/a", "{{origin:down}}/c")), "/x": html_page(links("/"))}
        ),
    }
    tmp = tmp_path_factory.mktemp("robots503")
    with CountingWeb(sites) as web:
        bg = _start_background(
            tmp, web, [web.url("down"), web.url("up")], allow=(LOOPBACK,), scope=scope_file(web, tmp / "scope.txt")
        )
        try:
            yield bg
        finally:
            bg.proc.kill()


@pytest.fixture(scope="module")
def refused_seed_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """A loopback seed crawled without any --allow-network."""
    sites = {"a": Site(pages={"/": html_page(links("/x")), "/x": html_page(links("/"))})}
    tmp = tmp_path_factory.mktemp("refused_seed")
    with CountingWeb(sites) as web:
        bg = _start_background(tmp, web, [web.url("a")], allow=())
        try:
            yield bg
        finally:
            bg.proc.kill()


@pytest.fixture(scope="module")
def refused_redirect_crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """'ok' (127.0.0.2, allowed) redirects to 'bad' (127.0.0.3, not in the allowlist); both are in scope."""
    sites = {
        "ok": Site(
            pages={
                "/": html_page(links("/go", "/stay")),
                "/go": redirect_page("{{origin:bad}}/target"),
                "/stay": html_page(links("/")),
            }
        ),
        "bad": Site(pages={"/target": html_page(links("/"))}),
    }
    tmp = tmp_path_factory.mktemp("refused_redirect")
    with CountingWeb(sites) as web:
        assert web.addresses["ok"][0] == "127.0.0.2" and web.addresses["bad"][0] == "127.0.0.3"
        bg = _start_background(
            tmp, web, [web.url("ok")], allow=("127.0.0.2/32",), scope=scope_file(web, tmp / "scope.txt")
        )
        try:
            yield bg
        finally:
            bg.proc.kill()


_BACKGROUND = ("robots_503_crawl", "refused_seed_crawl", "refused_redirect_crawl")


@pytest.fixture(scope="module", autouse=True)
def _prestart_background_crawls(request: pytest.FixtureRequest) -> None:
    """Start the slow background crawls that the selected tests of this module use, before any test runs."""
    wanted = {
        name
        for item in request.session.items
        if item.module is request.module
        for name in getattr(item, "fixturenames", ())
    }
    for name in _BACKGROUND:
        if name in wanted:
            request.getfixturevalue(name)


# ==================================================================================== 1. exactly once


def test_random_web_every_reachable_allowed_page_fetched_exactly_once(tmp_path: Path) -> None:
    """A generated web (6 origins, mixed link spellings, robots rules and redirects, nofollow, mirrors, traps):
    the server sees every page a correct crawler fetches, once, and nothing robots forbids; the report's fetched
    URLs are exactly the server's page hits, and its robots denials are exactly the oracle's blocked pages."""
    model = random_model(12, origins=6, pages_per_origin=15, unavailable_robots=0, user_agent=TOKEN)
    oracle, sites = oracle_for(model), render_model(model, 12)
    assert oracle.blocked and oracle.robots_redirects and oracle.traps, "the web should exercise robots and traps"
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            oracle.seed_urls(web),
            tmp_path / "crawl",
            delay=0.05,
            scope=scope_file(web, tmp_path / "scope.txt"),
            max_depth=needed_depth(model) + 4,
        )
        assert code == 0, text
        verdict = oracle.judge(web.fetched())
        assert verdict["missing"] == set(), "reachable allowed pages never fetched"
        assert verdict["forbidden"] == set(), "pages robots forbid were fetched"
        assert verdict["unexpected"] == set(), "pages a correct crawler never reaches were fetched"
        assert web.duplicates(include_robots=True) == [], "fetched more than once (any spelling)"
        robots_seen = {(h.label, h.resource) for h in web.hits} - hit_keys(web, frozenset(oracle.robots_fetches))
        assert robots_seen == oracle.robots_fetches, "robots files requested differ from the ones needed"
        for label in web.origins:  # robots redirect hops land on other origins: they are paced there too
            assert politeness_violations(web, label, 0.05) == [], f"origin {label}"

        # The report agrees with the server.
        pages = hit_keys(web, frozenset(oracle.robots_fetches))
        assert by_state(report, web, "fetched") == pages, text
        denied = {
            k
            for k, row in dispositions(report, web).items()
            if row["state"] == "suppressed" and row["reason"] == "robots"
        }
        assert denied == oracle.blocked
        assert report["robots_denied"]["count"] == len(oracle.blocked)
        assert report["unresolved"]["count"] == 0, report["unresolved"]
        # Trap pages are the only extra fetches, and a budget ended them.
        if verdict["trap"]:
            assert any(b["rule"] == "depth" for b in report["suppressed_by_rule"]), report["suppressed_by_rule"]


def test_a_legacy_encoded_page_links_queries_in_its_own_encoding(tmp_path: Path) -> None:
    """A latin-1 page's link `?q=café` is the resource `?q=caf%E9` (the URL standard encodes a query in the
    page's encoding, the path in UTF-8), and a windows-1252 page's `?q=€` is `?q=%80`: the server sees those
    targets once each, and never their UTF-8 spellings."""
    latin1 = '<a href="/s?q=caf\u00e9">q</a><a href="/p/caf\u00e9">p</a><a href="/m">m</a>'
    cp1252 = '<meta charset="windows-1252"><a href="/t?q=\u20ac">t</a>'
    sites = {
        "legacy": Site(
            pages={
                "/": Page(body=latin1.encode("latin-1"), content_type="text/html; charset=iso-8859-1"),
                "/m": Page(body=cp1252.encode("cp1252"), content_type="text/html"),
                "/s?q=caf%E9": html_page(links("/")),
                "/p/caf%C3%A9": html_page(links("/")),
                "/t?q=%80": html_page(links("/")),
            }
        )
    }
    with LocalWeb(sites) as web:
        code, _, text = crawl_in_process([web.url("legacy")], tmp_path / "crawl", delay=0.05)
        assert code == 0, text
        assert sorted(h.path for h in page_hits(web)) == ["/", "/m", "/p/caf%C3%A9", "/s?q=caf%E9", "/t?q=%80"]


def test_a_location_with_raw_non_ascii_bytes_names_the_resource_a_browser_follows(tmp_path: Path) -> None:
    """Location bytes past ASCII are UTF-8 when they decode as UTF-8 (`/café` raw is `/caf%C3%A9`, not the
    latin-1 mojibake `/caf%C3%83%C2%A9`), else each byte is percent-encoded (`/caf\\xe9` is `/caf%E9`). A
    robots.txt redirected that way is the right file, so its Disallow holds."""
    sites = {
        "raw": Site(
            pages={
                "/": html_page(links("/r8", "/r1")),
                "/r8": redirect_page("/u/caf\u00c3\u00a9"),  # LocalWeb writes headers as latin-1: C3 A9
                "/r1": redirect_page("/l/caf\u00e9"),  # E9
                "/u/caf%C3%A9": html_page(links("/")),
                "/l/caf%E9": html_page(links("/")),
                "/robots-%C3%A9.txt": robots_page("User-agent: *\nDisallow: /u/\n"),
            },
            robots=redirect_page("/robots-\u00c3\u00a9.txt"),
        )
    }
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process([web.url("raw")], tmp_path / "crawl", delay=0.05)
        assert code == 0, text
        assert sorted(h.path for h in web.hits) == ["/", "/l/caf%E9", "/r1", "/r8", "/robots-%C3%A9.txt", "/robots.txt"]
        assert report["robots_denied"]["count"] == 1, report["robots_denied"]


# ==================================================================================== 2. robots

ROBOTS_RULES = """\
User-agent: *
Disallow: /

User-agent: hostring
Disallow: /other

User-agent: otherbot
Disallow: /

User-agent: HOSTRING-Test
Disallow: /docs/
Allow: /docs/public/
Disallow: /docs/public/secret
Allow: /a
Disallow: /a/b
Disallow: /tie
Allow: /tie
Disallow: /*.pdf$
"""
RULES_PATHS = {
    # path: allowed for the product token "hostring-test" (only its own group applies; "hostring" is another bot)
    "/docs/a": False,  # Disallow /docs/
    "/docs/public/b": True,  # the longer Allow /docs/public/ wins
    "/docs/public/secret-plan": False,  # the longer Disallow /docs/public/secret wins again
    "/a/x": True,  # Allow /a
    "/a/b/c": False,  # the longer Disallow /a/b wins though Allow comes first in the file
    "/tie": True,  # Disallow /tie and Allow /tie: on a tie Allow wins
    "/tie-break": True,  # the same tie as a prefix
    "/file.pdf": False,  # /*.pdf$
    "/file.pdf?x=1": True,  # $ anchors the end: a query escapes it
    "/other": True,  # only the "hostring" group disallows it
}


def test_robots_rules_404_and_redirected_robots(tmp_path: Path) -> None:
    """Longest match wins and Allow beats Disallow on a tie; the crawler's own group (matched on the whole
    product token, any case) applies, not '*' nor a group for a prefix of its name; a 404 robots file allows
    everything; a robots.txt that redirects to another host applies to the first origin and not to that host."""
    for path, allowed in RULES_PATHS.items():  # the expectations agree with an independent matcher
        assert robots_allowed(ROBOTS_RULES, UA, path) is allowed, path
    sites = {
        "rules": Site(
            pages={"/": html_page(links(*RULES_PATHS)), **{p: html_page(links("/")) for p in RULES_PATHS}},
            robots=robots_page(ROBOTS_RULES),
        ),
        "missing": Site(
            pages={
                "/": html_page(links("/blocked", "/private/x")),
                "/blocked": html_page(links("/")),
                "/private/x": html_page(links("/")),
                "/robots-for-moved.txt": robots_page("User-agent: *\nDisallow: /blocked\n"),
            }
        ),
        "moved": Site(
            pages={
                "/": html_page(links("/blocked", "/open")),
                "/blocked": html_page(links("/")),
                "/open": html_page(links("/")),
            },
            robots=redirect_page("{{origin:missing}}/robots-for-moved.txt"),
        ),
    }
    with LocalWeb(sites) as web:
        seeds = [web.url(label) for label in sites]
        code, report, text = crawl_in_process(
            seeds, tmp_path / "crawl", delay=0.05, scope=scope_file(web, tmp_path / "scope.txt")
        )
        assert code == 0, text
        robots_files = frozenset({("missing", "/robots-for-moved.txt")})
        expected = (
            {("rules", "/")}
            | {("rules", p) for p, ok in RULES_PATHS.items() if ok}
            | {("missing", "/"), ("missing", "/blocked"), ("missing", "/private/x")}
            | {("moved", "/"), ("moved", "/open")}
        )
        assert hit_keys(web, robots_files) == expected
        assert sorted((h.label, h.resource) for h in web.hits if h.resource.startswith("/robots")) == sorted(
            [
                ("missing", "/robots-for-moved.txt"),
                ("missing", "/robots.txt"),
                ("moved", "/robots.txt"),
                ("rules", "/robots.txt"),
            ]
        ), "each robots file once, the redirect followed"

        denied = {("rules", p) for p, ok in RULES_PATHS.items() if not ok} | {("moved", "/blocked")}
        rows = dispositions(report, web)
        assert {k for k, r in rows.items() if r["state"] == "suppressed" and r["reason"] == "robots"} == denied
        assert report["robots_denied"]["count"] == len(denied)
        assert by_state(report, web, "fetched") == expected


def test_robots_redirect_hop_respects_the_target_origins_politeness(tmp_path: Path) -> None:
    """When a's robots.txt redirects to b, the request to b is a request to b: it must not overlap another
    request to b, nor come sooner than b's delay after one. Here b's own robots.txt is slow (0.5 s) and both
    robots files are fetched at once when the crawl starts."""
    sites = {
        "a": Site(
            pages={"/": html_page(links("/1")), "/1": html_page(links("/"))},
            robots=redirect_page("{{origin:b}}/robots-for-a.txt"),
        ),
        "b": Site(
            pages={
                "/": html_page(links("/1")),
                "/1": html_page(links("/")),
                "/robots-for-a.txt": robots_page("User-agent: *\nDisallow: /private\n"),
            },
            robots=Page(
                status=200, body=b"User-agent: *\nDisallow: /private\n", content_type="text/plain", delay_s=0.5
            ),
        ),
    }
    delay = 0.2
    with LocalWeb(sites) as web:
        code, _, text = crawl_in_process(
            [web.url("a"), web.url("b")], tmp_path / "crawl", delay=delay, scope=scope_file(web, tmp_path / "scope.txt")
        )
        assert code == 0, text
        assert ("b", "/robots-for-a.txt") in web.fetched()
        for label in sites:
            assert politeness_violations(web, label, delay) == [], f"origin {label}"


def test_robots_crawl_delay_holds_from_the_first_request_after_robots(tmp_path: Path) -> None:
    """A Crawl-delay in the crawler's robots group paces the origin from the request right after robots.txt on,
    not only from the second page (the crawl's own --delay is 0.05 s)."""
    sites = {
        "cd": Site(
            pages={"/": html_page(links("/1", "/2")), "/1": html_page(links("/", "/2")), "/2": html_page(links("/1"))},
            robots=robots_page("User-agent: *\nCrawl-delay: 0.5\nDisallow: /private\n"),
        )
    }
    with LocalWeb(sites) as web:
        code, _, text = crawl_in_process(
            [web.url("cd")], tmp_path / "crawl", delay=0.05, scope=scope_file(web, tmp_path / "scope.txt")
        )
        assert code == 0, text
        assert [h.resource for h in web.hits_for("cd")] == ["/robots.txt", "/", "/1", "/2"]
        assert politeness_violations(web, "cd", 0.5) == []


# ==================================================================================== 3. politeness


@pytest.mark.slow
def test_per_origin_one_request_at_a_time_and_the_delay_held(tmp_path: Path) -> None:
    """`hostring crawl --delay 0.15`: on every origin the server never has two requests in flight and the
    pause from the end of one request to the start of the next is at least the delay (server timestamps).
    Every page thinks for 30 ms, so overlapping requests would show; cross-origin redirects are in the mix."""
    model = random_model(
        5,
        origins=4,
        pages_per_origin=12,
        unavailable_robots=0,
        redirect_robots_fraction=0.0,
        redirect_fraction=0.15,
        trap_fraction=0.0,
        user_agent=TOKEN,
    )
    oracle, sites = oracle_for(model), render_model(model, 5)
    for site in sites.values():
        for page in site.pages.values():
            page.delay_s = 0.03
    delay = 0.15
    with LocalWeb(sites) as web:
        out = tmp_path / "crawl"
        cmd = crawl_cmd(
            oracle.seed_urls(web),
            out,
            delay=delay,
            scope=scope_file(web, tmp_path / "scope.txt"),
            extra=["--max-depth", str(needed_depth(model) + 4)],
        )
        proc = run_cli(cmd, out, tmp_path, timeout=90)
        assert proc.proc is not None and proc.proc.returncode == 0, proc.output()
        assert oracle.judge(web.fetched())["missing"] == set()
        for label in web.origins:
            hits = web.hits_for(label)
            assert len(hits) >= 5, f"{label}: too few requests to judge politeness"
            assert web.max_concurrency(label) == 1, f"{label}: requests overlapped"
            assert politeness_violations(web, label, delay) == [], f"origin {label}"
            assert web.min_gap(label) >= delay - 0.02


# ==================================================================================== 4. redirect chain


def test_redirect_chain_across_origins_each_hop_paced_by_its_own_origin(tmp_path: Path) -> None:
    """a/start -301-> b/hop -302-> c/final, and a/also -302-> c/final spelled differently. Each hop is a new
    item on its own origin: b (Crawl-delay 0.4 s in its robots file, and busy with its own pages) and c
    (the crawl's 0.1 s) each keep their own pace, every hop waits for its origin's robots file, and the final
    page is fetched once."""
    sites = {
        "a": Site(
            pages={
                "/": html_page(links("/start", "/also", "/a1")),
                "/start": redirect_page("{{origin:b}}/hop", 301),
                "/also": redirect_page("{{origin:c|upper}}/x/../final", 302),
                "/a1": html_page(links("/")),
            }
        ),
        "b": Site(
            pages={
                "/": html_page(links("/b1", "/b2", "/b3")),
                "/hop": redirect_page("{{origin:c}}/final", 302),
                **{f"/b{i}": html_page(links("/")) for i in (1, 2, 3)},
            },
            robots=robots_page("User-agent: *\nCrawl-delay: 0.4\nDisallow: /private\n"),
        ),
        "c": Site(
            pages={
                "/": html_page(links("/c1", "/c2", "/c3")),
                "/final": html_page(links("/c1")),
                **{f"/c{i}": html_page(links("/")) for i in (1, 2, 3)},
            }
        ),
    }
    delay = 0.1
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            [web.url(x) for x in ("a", "b", "c")],
            tmp_path / "crawl",
            delay=delay,
            scope=scope_file(web, tmp_path / "scope.txt"),
        )
        assert code == 0, text
        counts = web.fetch_counts()
        for label, path in [("a", "/start"), ("a", "/also"), ("b", "/hop"), ("c", "/final")]:
            assert counts[(web.origins[label], path)] == 1, (label, path)
        assert web.duplicates(include_robots=True) == []
        for label in sites:
            assert web.max_concurrency(label) == 1
            assert politeness_violations(web, label, delay) == [], f"origin {label}"
        # b keeps its Crawl-delay, the hop included. (The pause right after b's robots.txt is judged by
        # test_robots_crawl_delay_holds_from_the_first_request_after_robots.)
        short = [
            (round(gap, 3), cur.path)
            for gap, prev, cur in gaps(web.hits_for("b"))
            if prev.resource != "/robots.txt" and gap < 0.4 - 0.02
        ]
        assert short == [], "b's Crawl-delay: 0.4 not held"

        def hit(label: str, path: str) -> Any:
            return next(h for h in web.hits_for(label) if h.resource == path)

        # Each hop follows the previous one, and only after its own origin's robots file was read.
        first_to_final = min(hit("b", "/hop").end, hit("a", "/also").end)
        assert hit("b", "/hop").start >= hit("a", "/start").end
        assert hit("c", "/final").start >= first_to_final
        assert hit("b", "/hop").start >= hit("b", "/robots.txt").end
        assert hit("c", "/final").start >= hit("c", "/robots.txt").end
        # The report records the edges.
        rows = dispositions(report, web)
        assert (
            rows[("a", "/start")]["status"],
            rows[("b", "/hop")]["status"],
            rows[("a", "/also")]["status"],
            rows[("c", "/final")]["status"],
        ) == (301, 302, 302, 200)
        assert rows[("a", "/start")]["reason"].startswith("301 ->")
        assert all(rows[k]["state"] == "fetched" for k in [("a", "/start"), ("b", "/hop"), ("c", "/final")])


# ==================================================================================== 6. limits


def test_oversize_body_and_decompression_bomb_are_named_failures(tmp_path: Path) -> None:
    """A body over the 10 MiB default limit (the crawl has no flag to lower it; 10 MiB on loopback is cheap) and
    a gzip bomb (32 MiB of zeros, over the 20 MiB decoded limit) end failed as too_large and decompression_bomb,
    are not retried, and their origins' other pages are still fetched. Brotli and deflate bombs too."""
    big = b"<!DOCTYPE html><html><body>" + b"x" * (10 * 2**20) + b"</body></html>"
    sites = {
        "big": Site(
            pages={
                "/": html_page(links("/huge", "/after")),
                "/huge": Page(body=big),
                "/after": html_page(links("/", "/huge")),
            }
        ),
        "bomb": Site(
            pages={
                "/": html_page(links("/gz", "/br", "/deflate", "/after")),
                "/gz": bomb_page("gzip", 32 * 2**20),
                "/br": bomb_page("br", 32 * 2**20),
                "/deflate": bomb_page("deflate", 32 * 2**20),
                "/after": html_page(links("/", "/gz")),
            }
        ),
    }
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            [web.url(x) for x in sites], tmp_path / "crawl", delay=0.05, scope=scope_file(web, tmp_path / "scope.txt")
        )
        assert code == 0, text
        rows = dispositions(report, web)
        expected = {
            ("big", "/huge"): "too_large",
            ("bomb", "/gz"): "decompression_bomb",
            ("bomb", "/br"): "decompression_bomb",
            ("bomb", "/deflate"): "decompression_bomb",
        }
        for key, reason in expected.items():
            assert (rows[key]["state"], rows[key]["reason"], rows[key]["attempts"]) == ("failed", reason, 1), key
        assert report["failures_by_class"] == {"too_large": 1, "decompression_bomb": 3}
        assert web.duplicates() == [], "a size failure was retried"
        assert rows[("big", "/after")]["state"] == rows[("bomb", "/after")]["state"] == "fetched"
        huge = next(h for h in web.hits if h.resource == "/huge")
        assert huge.status == 200


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_trickle_and_429_are_named_outcomes_and_back_the_origin_off(tmp_path: Path) -> None:
    """A server trickling one byte per 10 ms is cut off by the total timeout (1 s, set in-process: the command
    line has no flag for it) on every attempt, and a 429 with Retry-After: 2 is retried; both end, after the
    bounded retries, as named outcomes in the report. Each backs its origin off: after a timeout the next request
    waits at least twice the rest its response time, the timed-out second included, asks; after a 429 at least
    Retry-After, whichever page comes next."""
    retry_after = 2.0
    trickle_s = 0.01
    sites = {
        "slow": Site(
            pages={
                "/": html_page(links("/trickle", "/after")),
                "/trickle": html_page(links("/") + " " * 4000, trickle_s=trickle_s),
                "/after": html_page(links("/")),
            }
        ),
        "busy": Site(
            pages={
                "/": html_page(links("/limited", "/after1", "/after2")),
                "/limited": Page(
                    status=429,
                    body=b"slow down\n",
                    content_type="text/plain",
                    headers={"Retry-After": str(int(retry_after))},
                ),
                "/after1": html_page(links("/")),
                "/after2": html_page(links("/", "/after1")),
            }
        ),
    }
    delay = 0.15
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            [web.url(x) for x in sites],
            tmp_path / "crawl",
            delay=delay,
            scope=scope_file(web, tmp_path / "scope.txt"),
            total_timeout_s=1.0,
        )
        assert code == 0, text
        rows = dispositions(report, web)
        assert (rows[("slow", "/trickle")]["state"], rows[("slow", "/trickle")]["reason"]) == (
            "failed",
            "retries_exhausted:total_timeout",
        )
        assert (rows[("busy", "/limited")]["state"], rows[("busy", "/limited")]["reason"]) == (
            "failed",
            "retries_exhausted:http_429",
        )
        assert report["failures_by_class"] == {"retries_exhausted": 2}
        assert all(rows[k]["state"] == "fetched" for k in rows if "after" in k[1])

        # The trickle was cut off near the total timeout on every attempt, and backed its origin off. The server
        # notices the client's going at its next byte, so its end stamp may be up to trickle_s late.
        trickles = [h for h in web.hits_for("slow") if h.resource == "/trickle"]
        assert len(trickles) == rows[("slow", "/trickle")]["attempts"] >= 2
        for h in trickles:
            assert not h.complete and 0.5 < h.end - h.start < 5.0, h  # the whole body would take 40 s
        after_trickle = [(gap, cur) for gap, prev, cur in gaps(web.hits_for("slow")) if prev.resource == "/trickle"]
        assert after_trickle, "nothing was requested from the origin after its timeout"
        # The timed-out second counts in the origin's response time (0.3 of it, the rest from fast pages) and
        # the first backoff doubles the rest: a struggling server rests its response time, not only the delay.
        rest = 2 * max(delay, 0.3 * 1.0)
        for gap, cur in after_trickle:
            assert gap >= rest - trickle_s - 0.03, f"{cur.path} came {gap:.3f}s after a timeout: no backoff"

        # After every 429 the origin rests at least Retry-After, whichever page comes next.
        limited = [h for h in web.hits_for("busy") if h.resource == "/limited"]
        assert len(limited) == rows[("busy", "/limited")]["attempts"] >= 2 and all(h.status == 429 for h in limited)
        following = [(gap, cur) for gap, prev, cur in gaps(web.hits_for("busy")) if prev.resource == "/limited"]
        assert following, "nothing was requested from the origin after its 429"
        for gap, cur in following:
            assert gap >= retry_after - 0.02, f"{cur.path} came {gap:.3f}s after a 429 with Retry-After: 2"
        for label in sites:
            assert web.max_concurrency(label) == 1
            assert politeness_violations(web, label, delay, tolerance=trickle_s + 0.03) == [], label


@pytest.mark.parametrize("href", ["/X", "{{origin:a}}/X"])
def test_a_page_first_seen_too_deep_is_fetched_when_a_shallower_link_to_it_comes_later(
    tmp_path: Path, href: str
) -> None:
    """--max-depth 2: a/X is first linked at depth 3 (a/ -> a/A -> a/P -> a/X, suppressed), then at depth 2 from
    b/Q, which b's Crawl-delay holds back (a/ -> b/Q -> a/X). X is within the depth limit, so it is fetched once:
    a depth verdict is no `seen` page at the node, nor a link the worker need not send again (P's link spelled
    as Q's is, absolute, is the same link to the worker)."""
    sites = {
        "a": Site(
            pages={
                "/": html_page(links("/A", "{{origin:b}}/Q")),
                "/A": html_page(links("/P")),
                "/P": html_page(links(href)),
                "/X": html_page(links("/") + "x"),
            }
        ),
        "b": Site(
            pages={"/Q": html_page(links("{{origin:a}}/X") + "q")},
            robots=robots_page("User-agent: *\nCrawl-delay: 0.6\n"),
        ),
    }
    with LocalWeb(sites) as web:
        code, _, text = crawl_in_process(
            [web.url("a")], tmp_path / "crawl", delay=0.05, scope=scope_file(web, tmp_path / "scope.txt"), max_depth=2
        )
        assert code == 0, text
        assert hit_keys(web) == {("a", "/"), ("a", "/A"), ("a", "/P"), ("b", "/Q"), ("a", "/X")}, text
        assert web.duplicates(include_robots=True) == []
        start = {(h.label, h.resource): h.start for h in web.hits}
        assert start[("a", "/P")] < start[("b", "/Q")], "the depth-3 link came second: the web did not test the case"


def test_a_page_refused_for_a_long_redirect_chain_is_fetched_when_linked_with_a_short_one(tmp_path: Path) -> None:
    """a/r0 -> a/r1 -> ... -> a/r8: the link to a/r6 is the sixth hop, past the chain limit, and is refused. b/Q,
    held back by b's Crawl-delay, then links a/r6 directly: a chain of two hops from there, so r6, r7, r8 and
    r8's child are fetched, each once."""
    pages = {"/": html_page(links("/r0", "{{origin:b}}/Q"))}
    pages |= {f"/r{i}": redirect_page(f"/r{i + 1}") for i in range(8)}
    pages |= {"/r8": html_page(links("/child")), "/child": html_page(links("/") + "c")}
    sites = {
        "a": Site(pages=pages),
        "b": Site(
            pages={"/Q": html_page(links("{{origin:a}}/r6") + "q")},
            robots=robots_page("User-agent: *\nCrawl-delay: 0.6\n"),
        ),
    }
    with LocalWeb(sites) as web:
        code, report, text = crawl_in_process(
            [web.url("a")], tmp_path / "crawl", delay=0.02, scope=scope_file(web, tmp_path / "scope.txt")
        )
        assert code == 0, text
        start = {(h.label, h.resource): h.start for h in web.hits}
        assert start[("a", "/r5")] < start[("b", "/Q")], "the long chain came second: the web did not test the case"
        expected = {("a", p) for p in pages} | {("b", "/Q")}
        assert hit_keys(web) == expected, text
        assert web.duplicates(include_robots=True) == []
        assert by_state(report, web, "fetched") == expected


# ==================================================================================== 7. kill -9 and resume


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_midway_then_resume_finishes_without_unexplained_refetches(tmp_path: Path) -> None:
    """SIGKILL the whole `hostring crawl` process group midway, while a request is in flight (a 1.5 s page that
    comes after 4 others on its origin), then `hostring crawl --resume --out SAME`: every reachable allowed page
    ends fetched, and the only resources the server saw twice are ones the journal records a lease handed back
    (the resumed run releases the killed run's leases at once) or expired for."""
    model = random_model(
        5,
        origins=3,
        pages_per_origin=20,
        unavailable_robots=0,
        redirect_robots_fraction=0.0,
        trap_fraction=0.0,
        user_agent=TOKEN,
    )
    # One more origin whose last page is slow: the kill comes while it is being served, when every origin is
    # about 5 requests in (each has at least 17 pages to fetch).
    model.origins.append("slow")
    model.robots["slow"] = RobotsSpec("missing")
    others = [f"/p{i}" for i in range(1, 4)]
    model.pages[("slow", "/")] = PageSpec(links=[LinkSpec(("slow", p)) for p in [*others, "/report"]])
    for p in [*others, "/report"]:
        model.pages[("slow", p)] = PageSpec(links=[LinkSpec(("slow", "/"))])
    model.seeds.append(("slow", "/"))
    oracle, sites = oracle_for(model), render_model(model, 5)
    assert ("slow", "/report") in oracle.reachable_allowed
    sites["slow"].pages["/report"].delay_s = 1.5
    for site in sites.values():
        for page in site.pages.values():
            page.delay_s = max(page.delay_s, 0.02)
    delay = 0.1
    with CountingWeb(sites) as web:
        out = tmp_path / "crawl"
        cmd = crawl_cmd(
            oracle.seed_urls(web),
            out,
            delay=delay,
            scope=scope_file(web, tmp_path / "scope.txt"),
            extra=["--lease-s", "15", "--max-depth", str(needed_depth(model) + 4)],
        )
        first = CrawlProcess(cmd, out, tmp_path, "first").start()
        try:
            wait_until(
                lambda: web.has_started("slow", "/report") or not first.running, 60, "the slow page to be requested"
            )
            assert first.running, first.output()
            first.kill()
        finally:
            first.kill()
        pages_before = hit_keys(web)
        assert len(pages_before) >= 4 and len(oracle.reachable_allowed - pages_before) >= 20, "not midway"
        hits_before = len(web.hits)

        second = run_cli([*cmd, "--resume"], out, tmp_path, timeout=90, name="resume")
        print(
            f"first run killed after {first.duration:.1f}s and {len(pages_before)} pages, "
            f"resume took {second.duration:.1f}s"
        )
        assert second.proc is not None and second.proc.returncode == 0, second.output()
        assert len(web.hits) > hits_before
        verdict = oracle.judge(web.fetched())
        assert verdict["missing"] == set() and verdict["forbidden"] == set() and verdict["unexpected"] == set()

        # A lease the killed run held is handed back by the resumed run at once (release, reason worker_gone);
        # one that ran out first is an expiry. Either explains a second fetch.
        expiries, unexplained = unexplained_refetches(out, web, ("expire", "release"))
        assert expiries.get(("slow", "/report"), 0) >= 1, "the in-flight lease was not recorded as handed back"
        assert {r["reason"] for r in journal(out, event="release")} == {"worker_gone"}
        assert unexplained == [], f"fetched twice without a recorded hand-back or expiry: {unexplained}"

        report = load_report(out)
        assert by_state(report, web, "fetched") == hit_keys(web) == oracle.reachable_allowed
        assert report["unresolved"]["count"] == 0, report["unresolved"]


# ==================================================================================== 8. demo


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_demo_runs_and_prints_the_server_side_check(tmp_path: Path) -> None:
    """`hostring demo --out DIR` exits 0 and prints what the servers saw: nothing missed, nothing forbidden,
    nothing twice, one request at a time per origin."""
    cmd = [sys.executable, "-m", "hostring_cli", "demo", "--out", str(tmp_path / "demo"), "--delay", "0.05"]
    proc = run_cli(cmd, None, tmp_path, timeout=80, name="demo")
    assert proc.proc is not None and proc.proc.returncode == 0, proc.output()
    out = proc.stdout()
    assert "what the web servers saw:" in out, out
    # Every request is accounted for: the pages the oracle expects (all of them), the trap's pages, robots files.
    m = re.search(r"requests (\d+): (\d+) of the (\d+) pages a correct crawler fetches, (\d+) in crawler traps", out)
    assert m is not None, out
    requests, expected, of, trapped = map(int, m.groups())
    assert expected == of and trapped > 0, out
    robots = re.search(r"in crawler traps \([^)]*\), (\d+) robots\.txt\n", out)
    assert robots is not None and expected + trapped + int(robots.group(1)) == requests, out
    assert re.search(
        r"missed 0, robots-forbidden fetched 0, fetched twice 0, most requests at once on one "
        r"origin 1\b",
        out,
    ), out
    assert (tmp_path / "demo" / "crawl" / "report.json").exists()


# ==================================================================================== background crawls, judged last
# These wait for the crawls started with the module (see _prestart_background_crawls); placed last so
# that the waiting overlaps the tests above.


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_robots_503_blocks_the_origin_and_the_crawl_still_ends(robots_503_crawl: Background) -> None:
    """A robots file answering 503 means nothing but robots.txt is fetched from that origin; after bounded
    retries its pages end unresolved with reason robots_unavailable, and the command returns by itself.
    (With the default retry backoff this takes about 35-45 s; a Retry-After: 60 would make it 3 minutes.)"""
    bg = robots_503_crawl
    code = bg.finish(timeout=140)
    print(f"robots 503 crawl took {bg.took:.1f}s")
    assert code == 0, bg.proc.output()
    web = bg.web
    down = web.hits_for("down")
    assert down and {h.resource for h in down} == {"/robots.txt"}, [h.path for h in down]
    print(
        f"robots.txt of the 503 origin requested {len(down)} times at "
        f"{[round(h.start - down[0].start, 1) for h in down]} s"
    )
    assert hit_keys(web) == {("up", "/"), ("up", "/x")}
    report = load_report(bg.out)
    rows = dispositions(report, web)
    for key in [("down", "/"), ("down", "/a")]:
        assert rows[key]["state"] not in ("fetched", "scheduled", "leased", "retryable"), rows[key]
        assert rows[key]["reason"].startswith("robots_unavailable"), rows[key]
    unresolved = {key_of(web, u["url"]): u["reason"] for u in report["unresolved"]["items"]}
    assert {k for k, r in unresolved.items() if r.startswith("robots_unavailable")} >= {("down", "/"), ("down", "/a")}
    assert report["by_state"].get("scheduled", 0) == report["by_state"].get("leased", 0) == 0


# ==================================================================================== 5. network policy


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_loopback_seed_refused_without_allowlist_and_no_connection_made(refused_seed_crawl: Background) -> None:
    """Without --allow-network a loopback seed is refused: the server sees no TCP connection at all, the seed
    ends with reason network_policy (failed, or suppressed when the refusal came on its robots fetch: a scheduled
    item has no edge to failed), not as robots_unavailable, and a policy refusal is not retried."""
    bg = refused_seed_crawl
    code = bg.finish(timeout=140)
    print(f"refused-seed crawl took {bg.took:.1f}s")
    assert code == 3, bg.proc.output()  # nothing fetchable: the summary names the refusal and its fix
    assert "suppressed:network_policy 1" in bg.proc.stdout() and "--allow-network CIDR" in bg.proc.stdout()
    assert bg.web.connections["a"] == 0 and bg.web.hits == []
    report = load_report(bg.out)
    row = dispositions(report, bg.web)[("a", "/")]
    assert row["state"] in ("failed", "suppressed") and row["reason"].startswith("network_policy"), row
    assert f"{row['state']}:network_policy" in report["by_reason"], report["by_reason"]
    robots_key = "robots:" + bg.web.origins["a"]
    assert len(journal(bg.out, event="lease", key=robots_key)) <= 1, "a policy refusal was retried"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_redirect_to_a_refused_address_is_refused(refused_redirect_crawl: Background) -> None:
    """Allowlist 127.0.0.2/32 only: ok/go redirects to 127.0.0.3, which is refused by the policy (it is in
    scope, so the refusal is the network policy's) and sees no connection; the allowed origin is crawled."""
    bg = refused_redirect_crawl
    code = bg.finish(timeout=140)
    print(f"refused-redirect crawl took {bg.took:.1f}s")
    assert code == 0, bg.proc.output()
    web = bg.web
    assert web.connections["bad"] == 0 and web.hits_for("bad") == []
    assert hit_keys(web) == {("ok", "/"), ("ok", "/go"), ("ok", "/stay")}
    report = load_report(bg.out)
    rows = dispositions(report, web)
    assert rows[("ok", "/go")]["status"] == 301 and rows[("ok", "/go")]["state"] == "fetched"
    target = rows[("bad", "/target")]
    assert target["state"] in ("failed", "suppressed") and target["reason"].startswith("network_policy"), target
    robots_key = "robots:" + web.origins["bad"]
    assert len(journal(bg.out, event="lease", key=robots_key)) <= 1, "a policy refusal was retried"
