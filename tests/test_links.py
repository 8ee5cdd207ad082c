"""Link extraction: what is collected, what the page forbids, and bytes in any state."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fetch_worker.links import extract_links

PAGE = "http://example.com/dir/page.html"


def links(html: str | bytes, **kwargs: str) -> list[str]:
    body = html.encode() if isinstance(html, str) else html
    return extract_links(body, PAGE, **kwargs).links


def test_anchors_areas_and_canonical_in_document_order_deduplicated() -> None:
    html = """<html><head><link rel="canonical" href="/canon"><link rel="stylesheet" href="/s.css">
    <link rel="alternate" href="/feed"></head><body>
    <a href="a.html">a</a> <map><area href="/area" alt=""></map>
    <a href="  b.html ">b</a><a href="a.html">again</a><a>no href</a><a href="">empty</a>
    <a href="javascript:void(0)">js</a></body></html>"""
    result = extract_links(html.encode(), PAGE)
    assert result.links == ["/canon", "a.html", "/area", "b.html", "", "javascript:void(0)"]
    assert result.canonical == "http://example.com/canon"
    assert result.base_url == PAGE
    assert not result.nofollow and not result.noindex


def test_rel_canonical_is_matched_as_a_token() -> None:
    html = '<link rel="Canonical  alternate" href="/c"><link rel="canonicalish" href="/x">'
    result = extract_links(html.encode(), PAGE)
    assert result.links == ["/c"]
    assert result.canonical == "http://example.com/c"


def test_upper_case_markup() -> None:
    html = b"<BASE HREF=/b/><A HREF=/x>x</A><A HREF=/y REL=NOFOLLOW>y</A><META NAME=ROBOTS CONTENT=NOINDEX>"
    result = extract_links(html, PAGE)
    assert (result.links, result.base_url, result.noindex) == (["/x"], "http://example.com/b/", True)


def test_base_href_sets_the_base_first_one_wins() -> None:
    html = '<head><base href="../other/"><base href="http://elsewhere.test/"></head><a href="x">x</a>'
    result = extract_links(html.encode(), PAGE)
    assert result.base_url == "http://example.com/other/"
    assert result.links == ["x"]


def test_base_without_href_is_skipped_and_bad_scheme_base_ignored() -> None:
    assert extract_links(b'<base target="_blank"><base href="/b/">', PAGE).base_url == "http://example.com/b/"
    assert extract_links(b'<base href="javascript:alert(1)">', PAGE).base_url == PAGE
    assert extract_links(b'<base href="https://cdn.test/x/">', PAGE).base_url == "https://cdn.test/x/"


def test_canonical_resolves_against_the_base() -> None:
    html = '<base href="http://b.test/x/"><link rel="canonical" href="c">'
    assert extract_links(html.encode(), PAGE).canonical == "http://b.test/x/c"


def test_rel_nofollow_links_are_skipped() -> None:
    html = """<a href="/1" rel="nofollow">1</a><a href="/2" rel="noopener NoFollow">2</a>
    <a href="/3" rel="ugc sponsored">3</a><area href="/4" rel="nofollow"><a href="/5">5</a>"""
    assert links(html) == ["/3", "/5"]


@pytest.mark.parametrize(
    ("meta", "nofollow", "noindex"),
    [
        ('<meta name="robots" content="nofollow">', True, False),
        ('<meta name="ROBOTS" content="NoIndex, NoFollow">', True, True),
        ('<meta name="robots" content="none">', True, True),
        ('<meta name="robots" content="noindex">', False, True),
        ('<meta name="robots" content="index, follow">', False, False),
        ('<meta name="hostring" content="nofollow">', True, False),
        ('<meta name="otherbot" content="nofollow, noindex">', False, False),
        ('<meta name="robots">', False, False),
    ],
)
def test_meta_robots(meta: str, nofollow: bool, noindex: bool) -> None:
    html = f"<html><head>{meta}</head><body><a href='/x'>x</a></body></html>"
    result = extract_links(html.encode(), PAGE, product_token="hostring")
    assert (result.nofollow, result.noindex) == (nofollow, noindex)
    assert result.links == ([] if nofollow else ["/x"])


def test_meta_robots_in_body_still_counts_and_canonical_survives_nofollow() -> None:
    html = '<link rel=canonical href="/c"><a href="/x"></a><meta name="robots" content="nofollow">'
    result = extract_links(html.encode(), PAGE)
    assert result.nofollow and result.links == []
    assert result.canonical == "http://example.com/c"


@pytest.mark.parametrize(
    ("header", "token", "nofollow", "noindex"),
    [
        ("nofollow", "", True, False),
        ("noindex, nofollow", "hostring", True, True),
        ("none", "", True, True),
        ("hostring: nofollow", "hostring", True, False),
        ("HostRing: noindex", "hostring", False, True),
        ("hostring: nofollow", "", False, False),
        ("hostring: nofollow", "otherbot", False, False),
        ("otherbot: noindex, nofollow", "hostring", False, False),
        ("noindex, otherbot: nofollow", "hostring", False, True),
        ("otherbot: nofollow, hostring: noindex", "hostring", False, True),
        ("unavailable_after: 25 Jun 2010 15:00:00 PST, nofollow", "hostring", True, False),
        ("max-snippet: 20, noindex", "", False, True),
    ],
)
def test_x_robots_tag(header: str, token: str, nofollow: bool, noindex: bool) -> None:
    result = extract_links(b"<a href='/x'>x</a>", PAGE, x_robots_tag=header, product_token=token)
    assert (result.nofollow, result.noindex) == (nofollow, noindex)
    assert result.links == ([] if nofollow else ["/x"])


def test_x_robots_tag_several_header_values_scope_separately() -> None:
    result = extract_links(
        b"<a href='/x'>x</a>", PAGE, x_robots_tag=["otherbot: noindex", "nofollow"], product_token="hostring"
    )
    assert (result.nofollow, result.noindex) == (True, False)


def test_x_robots_tag_applies_to_an_empty_body() -> None:
    result = extract_links(b"", PAGE, x_robots_tag="noindex")
    assert result.noindex and result.links == [] and result.base_url == PAGE


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"   \n",
        b"<a href='/ok'>unterminated <a href=\"/two\"",
        b"<<<>>><a href=/three>x</a></p></div></html></html><a href=/four",
        b"\x00\x01\x02<a href='/nul\x00x'>x</a>\xff\xfe",
        b"<table><tr><td><a href=/t>x</table></td></tr><form><a href=/f>",
        b"<script>document.write('<a href=/in-script>')</script><a href=/after>",
        b"<!-- <a href=/commented> --><a href=/real>",
        b"<svg><a href='/svg-link'>s</a></svg>",
    ],
)
def test_garbage_html_never_raises(garbage: bytes) -> None:
    result = extract_links(garbage, PAGE)
    assert all(isinstance(link, str) for link in result.links)


def test_broken_html_is_recovered_like_a_browser_does() -> None:
    assert links(b"<a href='/ok'>unterminated <a href=\"/two\">") == ["/ok", "/two"]
    assert links(b"<script>document.write('<a href=/in-script>')</script><a href=/after>") == ["/after"]
    assert links(b"<!-- <a href=/commented> --><a href=/real>") == ["/real"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise(body: bytes) -> None:
    result = extract_links(body, PAGE, x_robots_tag=body.decode("latin-1")[:50], product_token="hostring")
    assert isinstance(result.links, list)


def test_windows_1252_page_with_meta_charset() -> None:
    html = '<meta charset="windows-1252"><a href="/café">x</a><a href="/naïve?q=€#€">y</a>'
    assert links(html.encode("cp1252")) == ["/café", "/naïve?q=%80#€"]


def test_a_legacy_page_encodes_its_links_queries_in_its_own_encoding() -> None:
    """The URL standard encodes a link's query in the page's encoding (a browser asks a latin-1 page's
    `?q=café` as `?q=caf%E9`), its path and fragment in UTF-8; a character the encoding lacks becomes `&#N;`."""
    html = '<a href="/café?q=café&r=&#26085;#é">x</a><link rel=canonical href="/c?q=é">'
    html += '<a href="mailto:x?subject=é">m</a>'
    result = extract_links(html.encode("latin-1"), PAGE, content_type="text/html; charset=iso-8859-1")
    assert result.links == ["/café?q=caf%E9&r=%26%2326085%3B#é", "/c?q=%E9", "mailto:x?subject=é"]
    assert result.canonical == "http://example.com/c?q=%E9"
    body = '<a href="/s?q=日本">x</a>'.encode("shift_jis")
    assert extract_links(body, PAGE, content_type="text/html; charset=Shift_JIS").links == ["/s?q=%93%FA%96{"]
    body = '<a href="/s?q=é€">x</a>'.encode("iso-8859-15")
    latin9 = extract_links(body, PAGE, content_type="text/html; charset=iso-8859-15").links
    assert latin9 == ["/s?q=%E9%A4"]
    utf8 = '<a href="/s?q=é">x</a>'
    assert links(utf8) == ["/s?q=é"], "a UTF-8 page's links stay as written: the kernel encodes them in UTF-8"


def test_http_equiv_charset_and_latin1_label() -> None:
    html = '<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1"><a href="/é">'
    assert links(html.encode("latin-1")) == ["/é"]


def test_content_type_charset_wins_over_meta() -> None:
    html = '<meta charset="utf-8"><a href="/日本">x</a>'
    body = html.encode("shift_jis")
    result = extract_links(body, PAGE, content_type="text/html; charset=Shift_JIS")
    assert result.links == ["/日本"]


def test_undeclared_non_utf8_falls_back_to_windows_1252() -> None:
    assert links('<a href="/façade">x</a>'.encode("cp1252")) == ["/façade"]


def test_undeclared_utf8_is_read_as_utf8() -> None:
    assert links('<a href="/façade">x</a><a href="/日本">'.encode()) == ["/façade", "/日本"]


def test_byte_order_marks() -> None:
    html = '<a href="/façade">x</a>'
    assert links(codecs.BOM_UTF8 + html.encode()) == ["/façade"]
    assert links(codecs.BOM_UTF16_LE + html.encode("utf-16-le")) == ["/façade"]


def test_unknown_charset_label_is_ignored() -> None:
    assert links(b'<meta charset="klingon"><a href="/k">') == ["/k"]


def test_huge_document_is_handled() -> None:
    body = b"<html><body>" + b"".join(b'<p>t <a href="/p%d">%d</a></p>' % (i, i) for i in range(50_000))
    result = extract_links(body, PAGE)
    assert len(result.links) == 50_000
    assert result.links[-1] == "/p49999"
