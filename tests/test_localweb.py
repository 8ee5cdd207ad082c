"""The local multi-origin web: real loopback sockets, its request log, and the oracle of generated webs."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

import brotli
import pytest
from protego import Protego

from hostring_testing import (
    Key,
    LinkSpec,
    LocalWeb,
    Page,
    PageSpec,
    RobotsSpec,
    Site,
    WebModel,
    bomb_page,
    compressed_page,
    oracle_for,
    random_model,
    random_web,
    redirect_page,
    render_model,
    robots_allowed,
    robots_page,
    sample_oracle,
    sample_web,
)

pytestmark = pytest.mark.timeout(30)

UA = "hostring/0.1 (+https://example.invalid/bot; test)"


def get(url: str, method: str = "GET", path: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection; redirects are not followed."""
    p = urlsplit(url)
    conn = http.client.HTTPConnection(p.hostname, p.port or 80, timeout=5)
    try:
        target = path if path is not None else (p.path or "/") + ("?" + p.query if p.query else "")
        conn.request(method, target, headers={"User-Agent": UA})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture
def web() -> Iterator[LocalWeb]:
    sites = {
        "a": Site(
            pages={
                "/": Page(body=b'<a href="{{origin:b}}/x">b</a> <a href="//{{host:b}}/y">y</a> {{origin:a|upper}}'),
                "/moved": redirect_page("{{origin:b}}/landing", status=301),
                "/gone": Page(status=410, body=b"gone", content_type="text/plain", headers={"X-Test": "yes"}),
                "/~a/x": Page(body=b"tilde page"),
                "/list?page=2": Page(body=b"page two"),
                "/slow": Page(body=b"slow", delay_s=0.3),
            },
            robots=robots_page("User-agent: *\nDisallow: /private/\n"),
            trap="/cal",
        ),
        "b": Site(pages={"/": Page(body=b"b root"), "/landing": Page(body=b"landed")}),
        "c": Site(pages={"/": Page(body=b"c root")}),
    }
    with LocalWeb(sites) as w:
        yield w


def test_each_origin_gets_its_own_loopback_address_on_one_port(web: LocalWeb) -> None:
    addresses = [web.addresses[label] for label in ("a", "b", "c")]
    assert [a for a, _ in addresses] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert len({p for _, p in addresses}) == 1 and web.port > 0
    assert web.origins["b"] == f"http://127.0.0.3:{web.port}"
    assert web.labels[web.origins["c"]] == "c"
    assert web.url("b", "/landing") == web.origins["b"] + "/landing"
    assert get(web.url("c"))[2] == b"c root"


def test_pages_status_headers_and_placeholders(web: LocalWeb) -> None:
    status, headers, body = get(web.url("a"))
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    b_host = web.origins["b"].removeprefix("http://")
    assert (
        body
        == f'<a href="http://{b_host}/x">b</a> <a href="//{b_host}/y">y</a> HTTP://{web.addresses["a"][0]}:{web.port}'.encode()
    )

    status, headers, body = get(web.url("a", "/moved"))
    assert status == 301 and headers["location"] == web.url("b", "/landing") and body == b""

    status, headers, body = get(web.url("a", "/gone"))
    assert (status, headers["x-test"], headers["content-type"], body) == (410, "yes", "text/plain", b"gone")

    status, headers, body = get(web.url("a", "/gone"), method="HEAD")
    assert status == 410 and headers["content-length"] == "4" and body == b""

    assert get(web.url("a", "/nope"))[0] == 404
    status, headers, body = get(web.url("a", "/robots.txt"))
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"Disallow: /private/" in body
    assert get(web.url("b", "/robots.txt"))[0] == 404
    assert get(web.url("a"), method="POST")[0] == 405


def test_spellings_of_one_page_count_as_one_resource(web: LocalWeb) -> None:
    for path in ("/~a/x", "/%7ea/x", "/%7Ea/./x?utm_source=feed", "/zz/../~a/x"):
        assert get(web.url("a"), path=path)[2] == b"tilde page"
    assert get(web.url("a"), path="/list?utm_medium=x&page=2")[2] == b"page two"
    assert get(web.url("a"), path="/list?page=3")[0] == 404
    counts = web.fetch_counts()
    assert counts[(web.origins["a"], "/~a/x")] == 4
    assert (web.origins["a"], "/~a/x", 4) in web.duplicates()
    assert {h.path for h in web.hits_for("a")} >= {"/%7ea/x", "/%7Ea/./x?utm_source=feed"}
    assert ("a", "/list?page=2") in web.fetched()


def test_trap_generates_endless_distinct_pages(web: LocalWeb) -> None:
    url = web.url("a", "/cal/2024/01")
    seen: set[str] = set()
    bodies: set[bytes] = set()
    for _ in range(30):
        status, _, body = get(url)
        assert status == 200 and url not in seen and body not in bodies
        seen.add(url)
        bodies.add(body)
        hrefs = re.findall(rb'href="([^"]+)"', body)
        assert len(hrefs) == 2
        next_year = urljoin(url, hrefs[1].decode())
        assert get(next_year)[0] == 200 and next_year not in seen
        url = urljoin(url, hrefs[0].decode())
    assert url.endswith("/cal/2026/07")
    assert get(web.url("a", "/cal/2024/13"))[0] == 404
    assert b"2024/01" in get(web.url("a", "/cal"))[2]


def test_overlapping_requests_are_seen_as_concurrent(web: LocalWeb) -> None:
    barrier = threading.Barrier(2)

    def fetch() -> None:
        barrier.wait()
        get(web.url("a", "/slow"))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert web.max_concurrency("a") == 2
    assert sorted(h.concurrent for h in web.hits_for(web.origins["a"])) == [1, 2]
    assert web.min_gap("a") < 0


def test_sequential_requests_are_alone_and_spaced(web: LocalWeb) -> None:
    assert web.min_gap("c") == float("inf")
    for _ in range(3):
        get(web.url("c"))
        time.sleep(0.05)
    assert web.max_concurrency("c") == 1
    assert web.min_gap("c") > 0.02
    assert web.min_gap("c", between="starts") >= web.min_gap("c")
    assert web.max_concurrency("b") == 0


def test_keep_alive_connection_serves_several_requests(web: LocalWeb) -> None:
    conn = http.client.HTTPConnection(*web.addresses["b"], timeout=5)
    try:
        for path in ("/", "/landing", "/"):
            conn.request("GET", path, headers={"User-Agent": UA})
            assert conn.getresponse().read()
    finally:
        conn.close()
    hits = web.hits_for("b")
    assert len(hits) == 3 and len({h.client for h in hits}) == 1
    assert all(h.user_agent == UA and h.complete for h in hits)


def test_compressed_bodies_and_bombs_carry_content_encoding() -> None:
    text = b"<p>hello</p>" * 100
    sites = {
        "z": Site(
            pages={
                "/gz": compressed_page(text, "gzip"),
                "/deflate": compressed_page(text, "deflate"),
                "/br": compressed_page(text, "br"),
                "/bomb": bomb_page("gzip", 8 << 20),
                "/brbomb": bomb_page("br", 8 << 20),
            }
        )
    }
    with LocalWeb(sites) as web:
        decoders = {"/gz": gzip.decompress, "/deflate": zlib.decompress, "/br": brotli.decompress}
        for path, decode in decoders.items():
            status, headers, body = get(web.url("z", path))
            assert status == 200 and headers["content-encoding"] == path.strip("/").replace("gz", "gzip")
            assert decode(body) == text
        for path, decode in {"/bomb": gzip.decompress, "/brbomb": brotli.decompress}.items():
            status, headers, body = get(web.url("z", path))
            assert len(body) < 100_000 and int(headers["content-length"]) == len(body)
            assert decode(body) == bytes(8 << 20)


def test_trickle_sends_slowly_and_logs_abandoned_responses() -> None:
    sites = {"s": Site(pages={"/": Page(body=b"12345678", trickle_s=0.03)})}
    with LocalWeb(sites) as web:
        t0 = time.monotonic()
        assert get(web.url("s"))[2] == b"12345678"
        assert time.monotonic() - t0 > 0.15
        hit = web.hits[0]
        assert hit.complete and hit.bytes_sent == 8 and hit.end - hit.start > 0.15

        conn = http.client.HTTPConnection(*web.addresses["s"], timeout=5)
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.read(2) == b"12"
        conn.close()
        deadline = time.monotonic() + 3
        while len(web.hits) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        abandoned = web.hits[1]
        assert not abandoned.complete and abandoned.bytes_sent < 8


def test_write_log_and_live_log_are_json_lines(web: LocalWeb, tmp_path: Path) -> None:
    get(web.url("a"))
    get(web.url("a", "/nope"))
    out = tmp_path / "hits.jsonl"
    web.write_log(out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in rows] == [200, 404]
    assert {
        "ts",
        "origin",
        "label",
        "path",
        "resource",
        "method",
        "start",
        "end",
        "status",
        "user_agent",
        "concurrent",
        "client",
        "bytes_sent",
        "complete",
        "duration",
    } <= set(rows[0])
    assert rows[0]["origin"] == web.origins["a"] and rows[0]["user_agent"] == UA

    live = tmp_path / "live.jsonl"
    with LocalWeb({"x": Site(pages={"/": Page(body=b"x")})}, log_path=live) as w2:
        get(w2.url("x"))
        get(w2.url("x", "/robots.txt"))
        _ = w2.hits
    assert [json.loads(line)["resource"] for line in live.read_text().splitlines()] == ["/", "/robots.txt"]


def test_many_origins_start_and_addresses_skip_broadcast_octets() -> None:
    sites = {f"o{i}": Site(pages={"/": Page(body=f"origin {i}".encode())}) for i in range(210)}
    with LocalWeb(sites) as web:
        assert web.addresses["o209"][0] == "127.0.0.211"
        assert get(web.url("o209"))[2] == b"origin 209"
        assert len(set(web.origins.values())) == 210

    few = {f"p{i}": Site() for i in range(4)}
    with LocalWeb(few, first_address="127.0.0.253") as web:
        assert [web.addresses[f"p{i}"][0] for i in range(4)] == ["127.0.0.253", "127.0.0.254", "127.0.1.1", "127.0.1.2"]
        assert get(web.url("p2"))[0] == 404


def test_rejects_non_loopback_and_unknown_placeholders() -> None:
    with pytest.raises(ValueError, match="loopback"):
        LocalWeb({"a": Site()}, first_address="10.0.0.2")
    with pytest.raises(ValueError, match="names no site"):
        LocalWeb({"a": Site(pages={"/": Page(body=b"{{origin:zz}}/x")})})


# ---- generated webs and the oracle


def tiny_model() -> WebModel:
    """A hand-made web whose answer is known: every kind of link that must or must not be followed."""
    a_root = [
        LinkSpec(("a", p)) for p in ("/x", "/private/p", "/private/open", "/meta", "/gone", "/redir", "/cal/2024/01")
    ]
    a_root += [LinkSpec(("a", "/nf"), nofollow=True), LinkSpec(("b", "/")), LinkSpec(("c", "/"))]
    pages: dict[Key, PageSpec] = {
        ("a", "/"): PageSpec(links=a_root),
        ("a", "/x"): PageSpec(links=[LinkSpec(("a", "/y"))]),
        ("a", "/y"): PageSpec(links=[LinkSpec(("a", "/mirror")), LinkSpec(("a", "/x"))]),
        ("a", "/mirror"): PageSpec(mirror_of=("a", "/x")),
        ("a", "/private/p"): PageSpec(links=[LinkSpec(("a", "/behind-private"))]),
        ("a", "/behind-private"): PageSpec(),
        ("a", "/private/open"): PageSpec(),
        ("a", "/nf"): PageSpec(),
        ("a", "/meta"): PageSpec(meta_nofollow=True, links=[LinkSpec(("a", "/hidden"))]),
        ("a", "/hidden"): PageSpec(),
        ("a", "/redir"): PageSpec(redirect_to=("b", "/landing")),
        ("b", "/"): PageSpec(links=[LinkSpec(("b", "/secret")), LinkSpec(("b", "/public"))]),
        ("b", "/secret"): PageSpec(),
        ("b", "/public"): PageSpec(),
        ("b", "/landing"): PageSpec(),
        ("c", "/"): PageSpec(links=[LinkSpec(("c", "/more"))]),
        ("c", "/more"): PageSpec(),
    }
    robots = {
        "a": RobotsSpec("file", "User-agent: *\nDisallow: /private/\nAllow: /private/open\n"),
        "b": RobotsSpec("redirect", "User-agent: *\nDisallow: /secret\n", ("a", "/shared/robots-b.txt")),
        "c": RobotsSpec("unavailable"),
    }
    return WebModel(origins=["a", "b", "c"], pages=pages, robots=robots, seeds=[("a", "/")], traps={"a": "/cal"})


def test_oracle_of_a_hand_made_web_is_the_known_answer() -> None:
    oracle = oracle_for(tiny_model())
    assert oracle.reachable_allowed == {
        ("a", "/"),
        ("a", "/x"),
        ("a", "/y"),
        ("a", "/mirror"),
        ("a", "/private/open"),
        ("a", "/meta"),
        ("a", "/gone"),
        ("a", "/redir"),
        ("b", "/"),
        ("b", "/public"),
        ("b", "/landing"),
    }
    assert oracle.blocked == {("a", "/private/p"), ("b", "/secret"), ("c", "/")}
    assert oracle.disallowed == {("a", "/private/p"), ("b", "/secret"), ("c", "/"), ("c", "/more")}
    assert oracle.broken == {("a", "/gone")}
    assert oracle.trap_entries == {("a", "/cal/2024/01")}
    assert oracle.robots_unavailable == {"c"} and oracle.robots_redirects == {"b": ("a", "/shared/robots-b.txt")}
    assert oracle.robots_fetches == {
        ("a", "/robots.txt"),
        ("b", "/robots.txt"),
        ("c", "/robots.txt"),
        ("a", "/shared/robots-b.txt"),
    }


def test_reference_crawl_of_the_hand_made_web_matches_its_oracle() -> None:
    model = tiny_model()
    oracle = oracle_for(model)
    with LocalWeb(render_model(model, seed=1)) as web:
        fetched = reference_crawl(web, oracle.seed_urls(web), trap_budget=1)
        assert fetched - oracle.robots_fetches == oracle.reachable_allowed | {("a", "/cal/2024/01")}
        assert web.duplicates() == []
        assert {k: v for k, v in oracle.judge(web.fetched()).items() if v} == {"trap": {("a", "/cal/2024/01")}}
        assert get(web.url("b", "/robots.txt"))[1]["location"] == web.url("a", "/shared/robots-b.txt")
        assert get(web.url("c", "/robots.txt"))[0] == 503


def test_reference_crawl_of_a_random_web_matches_its_oracle() -> None:
    sites, oracle = random_web(2)
    with LocalWeb(sites) as web:
        fetched = reference_crawl(web, oracle.seed_urls(web))
        verdict = oracle.judge(fetched)
        assert verdict["missing"] == verdict["forbidden"] == verdict["unexpected"] == set()
        assert web.duplicates() == []
        assert oracle.judge(web.fetched()) == verdict


def test_random_web_is_deterministic_and_varied() -> None:
    sites1, oracle1 = random_web(7)
    sites2, oracle2 = random_web(7)
    assert sites1 == sites2 and oracle1 == oracle2
    sites3, _ = random_web(8)
    assert sites3 != sites1
    bodies = [p.body for s in sites1.values() for p in s.pages.values() if p.status == 200 and p.body]
    assert len(oracle1.reachable_allowed) > 60 and len(oracle1.blocked) > 0
    assert len(set(bodies)) < len(bodies)
    html = b"".join(bodies)
    for marker in (
        b"|upper}}",
        b"|port}}",
        b"//{{host:",
        b"../",
        b"./",
        b"%7E",
        b"utm_",
        b"#",
        b"nofollow",
        b'<meta name="',
        b"<base href",
        b"&amp;",
    ):
        assert marker in html, marker
    model = random_model(7, origins=3, pages_per_origin=5, links_per_page=2)
    assert len(model.pages) == 15 and model.robots["site0"].kind != "unavailable"


def test_sample_web_has_the_promised_features() -> None:
    sites = sample_web()
    oracle = sample_oracle()
    assert len(sites) == 4 and 35 <= sum(len(s.pages) for s in sites.values()) <= 45
    assert any(
        p.status == 301 and "{{origin:news}}" in p.headers.get("Location", "") for p in sites["blog"].pages.values()
    )
    assert sites["shop"].trap is not None and sites["news"].robots is not None
    assert sites["docs"].pages["/v1/guide"].body == sites["docs"].pages["/latest/guide"].body
    assert ("news", "/drafts/budget-leak") in oracle.blocked
    assert ("news", "/drafts/press-kit") in oracle.reachable_allowed
    assert ("docs", "/legacy/old-spec") not in oracle.reachable_allowed
    assert ("blog", "/2024/secret-draft") not in oracle.reachable_allowed
    assert ("shop", "/cartography-maps") in oracle.blocked
    assert oracle.seeds == [("news", "/")]


# ---- robots rules


def test_robots_matcher_follows_rfc9309() -> None:
    text = (
        "User-agent: otherbot\nDisallow: /\n\nUser-agent: *\nDisallow: /a/\nAllow: /a/b\nDisallow: /*?sort=\n"
        "Disallow: /*/print$\nDisallow: /%7Ealice/\nDisallow: /t\nAllow: /t\n"
    )
    cases = {
        "/a/x": False,
        "/a/b": True,
        "/a/bc": True,
        "/list?sort=1": False,
        "/list?page=1": True,
        "/x/print": False,
        "/x/printable": True,
        "/~alice/notes": False,
        "/t": True,
        "/robots.txt": True,
    }
    for path, allowed in cases.items():
        assert robots_allowed(text, UA, path) is allowed, path
    own = "User-agent: *\nDisallow: /\n\nUser-agent: HostRing\nDisallow: /x\n"
    assert robots_allowed(own, UA, "/y") and not robots_allowed(own, UA, "/x")
    assert not robots_allowed(own, "otherbot", "/y")
    assert robots_allowed("", UA, "/anything")
    versioned = "User-agent: *\nDisallow: /\n\nUser-agent: hostring/0.1\nDisallow: /x\n"
    assert robots_allowed(versioned, UA, "/y") and not robots_allowed(versioned, UA, "/x"), "a versioned name is ours"
    assert robots_allowed("User-agent: hostring-bot\nDisallow: /x\n", UA, "/x"), "hostring-bot is another crawler"
    assert not robots_allowed("User-agent: * other\nDisallow: /x\n", UA, "/x"), "'*' and more words: everyone"


def test_robots_matcher_agrees_with_protego_on_generated_files() -> None:
    checked = 0
    for seed in range(12):
        model = random_model(seed)
        for label, spec in model.robots.items():
            if spec.kind not in ("file", "redirect"):
                continue
            parser = Protego.parse(spec.text)
            for lb, path in model.pages:
                if lb == label:
                    expected = parser.can_fetch("http://h" + path, "hostring")
                    assert robots_allowed(spec.text, "hostring", path) is expected, (seed, label, path)
                    checked += 1
    assert checked >= 300


# ---- CLI


def test_cli_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hostring_testing", "--seed", "1", "--origins", "2"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("site0\thttp://127.0.0.2:")
        origin = lines[1].split("\t")[1].strip()
        assert get(origin + "/")[0] == 200
        assert lines[2].startswith("seeds:\t")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0


# ---- an independent reference crawler (urllib.parse, html.parser, protego; no hostring code)


_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _pct(s: str) -> str:
    def fix(m: re.Match[str]) -> str:
        ch = chr(int(m.group(1), 16))
        return ch if ch in _UNRESERVED else "%" + m.group(1).upper()

    return re.sub(r"%([0-9A-Fa-f]{2})", fix, s)


def normalize(url: str) -> str:
    p = urlsplit(url)
    host = (p.hostname or "").lower()
    netloc = host if p.port in (None, 80) else f"{host}:{p.port}"
    query = [kv for kv in p.query.split("&") if kv and not kv.lower().startswith("utm_")]
    return urlunsplit((p.scheme.lower(), netloc, _pct(p.path) or "/", _pct("&".join(query)), ""))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.base: str | None = None
        self.nofollow = False
        self.links: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "base" and self.base is None and a.get("href"):
            self.base = a["href"]
        elif tag == "meta" and a.get("name", "").lower() == "robots":
            self.nofollow |= "nofollow" in [t.strip().lower() for t in a.get("content", "").split(",")]
        elif tag == "a" and "href" in a:
            self.links.append((a["href"], "nofollow" in a.get("rel", "").lower().split()))


def reference_crawl(web: LocalWeb, seeds: list[str], trap_budget: int = 2) -> set[Key]:
    """BFS as a correct crawler does it; returns the (label, resource) pairs it requested."""
    rules: dict[str, Protego | bool] = {}

    def allowed(url: str) -> bool:
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(url))
        if origin not in rules:
            robots_url, rules[origin] = origin + "/robots.txt", False
            for _ in range(5):
                status, headers, body = get(robots_url)
                if 300 <= status < 400:
                    robots_url = urljoin(robots_url, headers["location"])
                    continue
                rules[origin] = Protego.parse(body.decode()) if status < 300 else status < 500
                break
        rule = rules[origin]
        return rule if isinstance(rule, bool) else rule.can_fetch(url, "hostring")

    seen = {normalize(s) for s in seeds}
    queue, fetched, digests, trap_pages = list(seen), set(), set(), 0
    while queue and len(fetched) < 2000:
        url = queue.pop(0)
        if not allowed(url):
            continue
        if re.search(r"/\d{4,}/\d\d$", urlsplit(url).path):
            trap_pages += 1
            if trap_pages > trap_budget:
                continue
        status, headers, body = get(url)
        p = urlsplit(url)
        fetched.add((web.labels[f"{p.scheme}://{p.netloc}"], p.path + ("?" + p.query if p.query else "")))
        found: list[str] = []
        if 300 <= status < 400:
            found = [urljoin(url, headers["location"])]
        elif status == 200 and hashlib.sha256(body).digest() not in digests:
            digests.add(hashlib.sha256(body).digest())
            parser = _Links()
            parser.feed(body.decode())
            base = urljoin(url, parser.base) if parser.base else url
            found = [] if parser.nofollow else [urljoin(base, h) for h, nofollow in parser.links if not nofollow]
        for new in map(normalize, found):
            if new not in seen:
                seen.add(new)
                queue.append(new)
    return fetched
