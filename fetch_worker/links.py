"""Link extraction from fetched HTML with selectolax's lexbor parser.

Lexbor is a spec-following HTML5 parser written in C: it builds the same tree
a browser would from broken markup, and one CSS query walks that tree once,
which keeps a 50 KB page in the tens of microseconds. Links come back raw (as
written, whitespace-trimmed per the HTML URL rules) because resolving and
normalizing them is the kernel's job; the effective base URL travels beside
them. Only a legacy-encoded page's non-ASCII query characters come back
percent-encoded in the page's encoding, as the URL standard resolves them (the
kernel would encode them in UTF-8). Nothing is dropped silently except what the
page asks not to follow:
`rel=nofollow` links, and every link when meta robots or X-Robots-Tag says
`nofollow`/`none`. Bad schemes such as `javascript:` are left for the kernel,
which rejects them with a named reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from selectolax.lexbor import LexborHTMLParser

from hostring.html import document_codec, parser_input, visible_text

_SELECTOR = "a[href], area[href], link[href], base[href], meta[name]"
_URL_WHITESPACE = " \t\n\r\f"
_DIRECTIVE_SPLIT = re.compile(r"[,\s]+")
# Robots directives that carry a value after a colon; any other "word:" prefix names a user agent.
_VALUED_DIRECTIVES = frozenset({"max-snippet", "max-image-preview", "max-video-preview", "unavailable_after"})
# A scheme other than http(s) at the start of a reference: its query is not the document's to encode.
_OTHER_SCHEME = re.compile(r"^(?!https?:)[a-z][a-z0-9+.-]*:", re.IGNORECASE)


@dataclass(slots=True)
class Extracted:
    """Links of one page and what the page says about itself.

    `links`: raw hrefs of `a`, `area` and `link rel=canonical`, in document
    order, first occurrence kept; empty when `nofollow`. `base_url`: the URL
    the links resolve against (first `<base href>` resolved against the page
    URL, else the page URL). `canonical`: the first canonical link, resolved
    against `base_url` ("" if none), reported even under `nofollow`. `text`:
    the page's visible text (hostring.html.visible_text), what its simhash
    reads.
    """

    links: list[str] = field(default_factory=list)
    base_url: str = ""
    nofollow: bool = False
    noindex: bool = False
    canonical: str = ""
    text: str = ""


def _apply(directives: str, flags: list[bool]) -> None:
    """Fold robots directives into flags = [nofollow, noindex]."""
    for token in _DIRECTIVE_SPLIT.split(directives.lower()):
        if token == "none":
            flags[0] = flags[1] = True
        elif token == "nofollow":
            flags[0] = True
        elif token == "noindex":
            flags[1] = True


def _x_robots(values: Iterable[str], product_token: str, flags: list[bool]) -> None:
    """Apply X-Robots-Tag header values; `ua: directives` applies only to our product token.

    A user-agent prefix scopes the directives after it up to the end of that
    header value, as search engines read "otherbot: noindex, nofollow".
    """
    for value in values:
        scope = ""
        for part in value.split(","):
            head, colon, tail = part.partition(":")
            name = head.strip().lower()
            if colon and name not in _VALUED_DIRECTIVES and " " not in name:
                scope, part = name, tail
            if not scope or scope == product_token:
                _apply(part, flags)


def encode_query(href: str, codec: str) -> str:
    """`href` with the non-ASCII characters of its query percent-encoded in the page's encoding `codec`, as
    the URL standard resolves a link of a legacy-encoded page (a browser asks a latin-1 page's `?q=café` as
    `?q=caf%E9`: the bytes past ASCII are escaped, the rest is the kernel's to normalize); a character the
    encoding lacks becomes its `&#N;` reference, percent-encoded. The path and the fragment stay characters
    (they are UTF-8 whatever the page), and so does a non-http(s) reference."""
    if href.isascii() or _OTHER_SCHEME.match(href):
        return href
    head, hash_, fragment = href.partition("#")
    path, mark, query = head.partition("?")
    if not mark or query.isascii():
        return href
    out: list[str] = []
    for ch in query:
        if ch.isascii():
            out.append(ch)
            continue
        try:
            out.append("".join(f"%{b:02X}" if b > 0x7E else chr(b) for b in ch.encode(codec)))
        except UnicodeEncodeError:
            out.append(f"%26%23{ord(ch)}%3B")
    return f"{path}?{''.join(out)}{hash_}{fragment}"


def extract_links(
    body: bytes,
    page_url: str,
    *,
    x_robots_tag: str | Iterable[str] = "",
    product_token: str = "",
    content_type: str = "",
) -> Extracted:
    """Extract links and page-level robots directives from an HTML body.

    `x_robots_tag` is one X-Robots-Tag header value or all of them (a UA prefix
    scopes to the end of its own value). `product_token` is our robots name
    (e.g. "hostring"): `<meta name="hostring">` and `hostring:` prefixed
    X-Robots-Tag directives apply to us. `content_type` is the response's
    Content-Type header, whose charset (if any) decides the decoding.
    """
    token = product_token.strip().lower()
    flags = [False, False]
    _x_robots([x_robots_tag] if isinstance(x_robots_tag, str) else x_robots_tag, token, flags)
    result = Extracted(base_url=page_url)
    if not body or body.isspace():
        result.nofollow, result.noindex = flags
        return result

    links: list[str] = []
    seen: set[str] = set()
    base_href: str | None = None
    canonical = ""
    codec = document_codec(body, content_type)
    tree = LexborHTMLParser(parser_input(body, content_type, codec))
    for node in tree.css(_SELECTOR):
        attrs = node.attributes  # one dict per node: several times cheaper than node.attrs.get()
        tag = node.tag
        if tag == "meta":
            name = (attrs.get("name") or "").strip().lower()
            if name == "robots" or (token and name == token):
                _apply(attrs.get("content") or "", flags)
            continue
        href = (attrs.get("href") or "").strip(_URL_WHITESPACE)
        if tag == "base":
            if base_href is None:
                base_href = href
            continue
        rel = attrs.get("rel")
        rels = rel.lower().split() if rel else ()
        if "nofollow" in rels:
            continue
        if tag == "link":
            if "canonical" not in rels:
                continue
            if not canonical:
                canonical = href
        if href not in seen:
            seen.add(href)
            links.append(href)

    if base_href is not None:
        resolved = urljoin(page_url, base_href)
        # The HTML standard ignores a base that is not a fetchable URL (data:, javascript:).
        if urlsplit(resolved).scheme in ("http", "https"):
            result.base_url = resolved
    result.nofollow, result.noindex = flags
    if codec not in ("utf-8", "utf-16"):
        links = [encode_query(href, codec) for href in links]
        canonical = encode_query(canonical, codec)
    result.links = [] if result.nofollow else links
    result.canonical = urljoin(result.base_url, canonical) if canonical else ""
    result.text = visible_text(tree)  # last: it removes the scripts and styles from the tree
    return result
