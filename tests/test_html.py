"""hostring/html.py: the visible text a page's simhash reads, the same in the fetch worker and the Scrapy plug-in.

A site's pages share their markup (navigation, scripts, styles): fingerprinted over the markup, distinct articles
under one template came out as near duplicates of each other, and an article that changed under an unchanged
template looked unchanged to the revisit policy. Fingerprinted over the visible text, they do not.
"""

from __future__ import annotations

import asyncio
import itertools
import random

from scrapy.http import HtmlResponse
from selectolax.lexbor import LexborHTMLParser

from fetch_worker.fetch import Fetcher, FetchResult
from fetch_worker.netpolicy import NetworkPolicy
from fetch_worker.worker import Worker
from hostring.client import StaticRouter
from hostring.fingerprint import NEAR_DUPLICATE_DISTANCE, hamming, simhash64
from hostring.html import page_text, visible_text
from hostring.scrapy.outcome import response_outcome
from hostring.v1 import frontier_pb2 as pb
from hostring_testing import LocalWeb, Site
from hostring_testing.pages import Page

UA = "hostring-test/0.1 (+https://example.invalid/html-tests)"
_VOCABULARY = [f"{stem}{n}" for stem in ("alpha", "delta", "kappa", "omega", "sigma", "theta") for n in range(60)]


def _template(article: str, *, build: str = "a1f3") -> bytes:
    """A documentation page: a heavy shared head and navigation (130 links, a script, a style), then `article`.
    `build` changes only markup: the script's and stylesheet's version, the links' query, the class names."""
    nav = "".join(
        f'<li><a class="nav-{build}" href="/guide/section-{i}.html?v={build}">Guide section {i}</a></li>'
        for i in range(130)
    )
    return (
        "<!doctype html><html><head><title>Docs</title>"
        f"<style>.nav-{build} {{ color: #333; margin: 0 1em }} body {{ font: 14px sans-serif }}</style>"
        f"<script>window.analytics = {{ site: 'docs', build: '{build}', track: function (e) {{ return e }} }};</script>"
        f"</head><body><nav><ul>{nav}</ul></nav><main><article>{article}</article></main>"
        "<noscript>enable javascript to see the search box</noscript><template><p>row</p></template>"
        "<footer>Copyright the docs team</footer></body></html>"
    ).encode()


def _article(rng: random.Random, words: int = 80) -> str:
    return " ".join(rng.choice(_VOCABULARY) for _ in range(words))


def _worker_simhash(worker: Worker, body: bytes) -> int:
    """The simhash the fetch worker reports for a 200 text/html response with this body."""
    result = FetchResult(
        url="http://a.example/p",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=[("Content-Type", "text/html; charset=utf-8")],
        body=body,
        content_type="text/html; charset=utf-8",
        raw_bytes=len(body),
        decoded_bytes=len(body),
        started_at=1_700_000_000.0,
    )
    outcome = pb.Outcome(status=200)
    item = pb.LeaseItem(url="http://a.example/p", fetch_key="http://a.example/p", kind=pb.PAGE)
    worker._links(item, result, outcome)
    return outcome.simhash


def test_visible_text_reads_the_title_and_body_without_code_styles_or_templates() -> None:
    html = (
        b"<html><head><title>Release notes</title><style>p { color: red }</style></head><body>"
        b"<script>var hidden = 1;</script><p>Version <b>2.1</b> fixes the parser.</p>"
        b"<noscript>no js</noscript><template><i>inert</i></template><a href='/x'>Read more</a></body></html>"
    )
    text = visible_text(LexborHTMLParser(html))
    assert text.split() == ["Release", "notes", "Version", "2.1", "fixes", "the", "parser.", "Read", "more"]


def test_page_text_decodes_by_charset_and_reads_only_html_as_markup() -> None:
    latin = "<html><body><p>café crème</p></body></html>".encode("windows-1252")
    assert page_text(latin, "text/html; charset=ISO-8859-1", 100).split() == ["café", "crème"]
    assert page_text(b"<p>a</p><p>b</p>", "application/xhtml+xml", 100).split() == ["a", "b"]
    assert page_text(b"<p>not html</p>", "text/plain", 100) == "<p>not html</p>"  # plain text is its own text
    assert page_text(b"", "text/html", 100) == ""
    assert page_text(b"x" * 1000, "text/plain", 100) == "x" * 100  # the first max_chars, whatever the body's size


def test_pages_under_one_template_are_told_apart_and_a_new_build_of_the_template_changes_nothing() -> None:
    rng = random.Random(7)
    articles = [_article(rng) for _ in range(12)]
    pages = [_template(a) for a in articles]
    rebuilt = [_template(a, build="9c07") for a in articles]  # the same articles under the site's next deploy
    worker = Worker(StaticRouter("127.0.0.1:9"), Fetcher(NetworkPolicy([]), UA))
    hashes = [_worker_simhash(worker, p) for p in pages]
    for a, b in itertools.combinations(hashes, 2):
        assert hamming(a, b) > NEAR_DUPLICATE_DISTANCE, "two different articles taken for near duplicates"
    assert [_worker_simhash(worker, p) for p in rebuilt] == hashes  # markup alone is not a change of the page
    # Why the text: over the markup, the shared template outvotes the articles.
    markup = [simhash64(p.decode()) for p in pages]
    near = sum(hamming(a, b) <= NEAR_DUPLICATE_DISTANCE for a, b in itertools.combinations(markup, 2))
    assert near > len(markup) * (len(markup) - 1) // 4


def test_the_scrapy_plug_in_fingerprints_a_page_as_the_fetch_worker_does() -> None:
    worker = Worker(StaticRouter("127.0.0.1:9"), Fetcher(NetworkPolicy([]), UA))
    rng = random.Random(11)
    for body in (_template(_article(rng)), "<html><body><p>ünïcödé page</p></body></html>".encode()):
        response = HtmlResponse(
            "http://a.example/p", status=200, body=body, headers={"Content-Type": "text/html; charset=utf-8"}
        )
        scrapy_simhash = response_outcome(response, 0.1, robots=False, simhash=True).simhash
        assert scrapy_simhash == _worker_simhash(worker, body) != 0


def test_a_charset_given_only_in_the_http_header_decodes_links_and_text() -> None:
    """A page whose bytes are koi8-r, said only by `Content-Type: text/html; charset=koi8-r`, fetched from a real
    loopback server: its link and its text are read as Cyrillic (the worker used to pass the media type alone, and
    undeclared bytes are read as windows-1252)."""
    body = "<html><body><p>новости дня</p><a href='/путь'>ссылка</a></body></html>".encode("koi8-r")
    page = Page(body=body, content_type="text/html; charset=koi8-r")
    with LocalWeb({"a": Site({"/p": page})}) as web:

        async def run() -> tuple[list[pb.Link], pb.Outcome]:
            fetcher = Fetcher(NetworkPolicy(["127.0.0.0/8"]), UA)
            worker = Worker(StaticRouter("127.0.0.1:9"), fetcher)
            try:
                url = web.url("a", "/p")
                result = await fetcher.fetch(url)
                outcome = pb.Outcome(status=result.status)
                item = pb.LeaseItem(url=url, fetch_key=url, kind=pb.PAGE)
                return worker._links(item, result, outcome), outcome
            finally:
                await fetcher.aclose()

        links, outcome = asyncio.run(run())
    assert [link.observed for link in links] == ["/путь"]
    assert outcome.simhash == simhash64("новости дня ссылка")
