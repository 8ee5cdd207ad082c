"""Link extraction from fetched HTML with selectolax's lexbor parser.

Lexbor is a spec-following HTML5 parser written in C: it builds the same tree
a browser would from broken markup, and one CSS query walks that tree once,
which keeps a 50 KB page in the tens of microseconds. Links come back raw (as
written, whitespace-trimmed per the HTML URL rules) because resolving and
normalizing them is the kernel's job; the effective base URL travels beside
them. Nothing is dropped silently except what the page asks not to follow:
`rel=nofollow` links, and every link when meta robots or X-Robots-Tag says
`nofollow`/`none`. Bad schemes such as `javascript:` are left for the kernel,
which rejects them with a named reason.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from selectolax.lexbor import LexborHTMLParser

_SELECTOR = "a[href], area[href], link[href], base[href], meta[name]"
_URL_WHITESPACE = " \t\n\r\f"
_DIRECTIVE_SPLIT = re.compile(r"[,\s]+")
# Robots directives that carry a value after a colon; any other "word:" prefix names a user agent.
_VALUED_DIRECTIVES = frozenset({"max-snippet", "max-image-preview", "max-video-preview", "unavailable_after"})
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([a-z0-9_.:-]+)""", re.IGNORECASE)
# WHATWG Encoding: these labels all mean windows-1252 on the web.
_WINDOWS_1252_LABELS = frozenset({"iso-8859-1", "iso8859-1", "latin1", "l1", "ascii", "us-ascii", "cp1252"})


@dataclass(slots=True)
class Extracted:
    """Links of one page and what the page says about itself.

    `links`: raw hrefs of `a`, `area` and `link rel=canonical`, in document
    order, first occurrence kept; empty when `nofollow`. `base_url`: the URL
    the links resolve against (first `<base href>` resolved against the page
    URL, else the page URL). `canonical`: the first canonical link, resolved
    against `base_url` ("" if none), reported even under `nofollow`.
    """

    links: list[str] = field(default_factory=list)
    base_url: str = ""
    nofollow: bool = False
    noindex: bool = False
    canonical: str = ""


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


def _charset_label(body: bytes, content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip("\"'").lower()
    match = _META_CHARSET.search(body, 0, 1024)
    return match.group(1).decode("ascii").lower() if match else ""


def _parser_input(body: bytes, content_type: str) -> bytes | str:
    """What to hand lexbor, which reads bytes as UTF-8: the bytes, or text decoded here.

    Order as in the HTML standard: BOM, then the HTTP charset, then a `<meta>`
    charset in the first 1024 bytes; undeclared bytes that are not valid UTF-8
    are read as windows-1252, the web's legacy default.
    """
    if body.startswith(codecs.BOM_UTF8):
        return body[3:]
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return body.decode("utf-16", "replace")
    label = _charset_label(body, content_type)
    if label in _WINDOWS_1252_LABELS:
        label = "windows-1252"
    try:
        codec = codecs.lookup(label).name if label else ""
    except LookupError:
        codec = ""
    if codec in ("utf-8", "utf-16", "utf-16-le", "utf-16-be"):
        return body  # a meta tag cannot truthfully declare UTF-16 in bytes we could read
    if codec:
        return body.decode(codec, "replace")
    if body.isascii():
        return body
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("windows-1252", "replace")
    return body


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
    tree = LexborHTMLParser(_parser_input(body, content_type))
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
    result.links = [] if result.nofollow else links
    result.canonical = urljoin(result.base_url, canonical) if canonical else ""
    return result
