"""Reading a fetched HTML body: the text its charset decides (the HTML standard's order) and its visible text.

The fetch worker's link extraction and both fetchers' simhashes read pages through here, so a worker and a Scrapy
process fingerprint the same page alike. The simhash is taken over the visible text, not the markup: pages of one
site share most of their markup (navigation, templates, scripts), which would make every page near-duplicate of
every other and hide a changed article behind an unchanged template (hostring/fingerprint.py).
"""

from __future__ import annotations

import codecs
import re

from selectolax.lexbor import LexborHTMLParser

__all__ = ["HTML_TYPES", "document_codec", "media_type", "page_text", "parser_input", "visible_text"]

HTML_TYPES = ("text/html", "application/xhtml+xml")
"""Media types read as HTML (the fetch worker's default parse types)."""

_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([a-z0-9_.:-]+)""", re.IGNORECASE)
# WHATWG Encoding: these labels all mean windows-1252 on the web.
_WINDOWS_1252_LABELS = frozenset({"iso-8859-1", "iso8859-1", "latin1", "l1", "ascii", "us-ascii", "cp1252"})
# Elements whose content is not read by a person: code, styles, fallbacks and inert templates.
_INVISIBLE = ["script", "style", "noscript", "template"]


def media_type(content_type: str) -> str:
    """'Text/HTML; charset=utf-8' -> 'text/html'."""
    return content_type.split(";", 1)[0].strip().lower()


def _charset_label(body: bytes, content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip("\"'").lower()
    match = _META_CHARSET.search(body, 0, 1024)
    return match.group(1).decode("ascii").lower() if match else ""


def document_codec(body: bytes, content_type: str) -> str:
    """The Python codec a page's bytes are read with: "utf-8" unless a BOM, the HTTP charset or a `<meta>`
    charset (in the HTML standard's order) says otherwise, or undeclared bytes are not valid UTF-8
    ("cp1252", the web's legacy default). A UTF-16 page is read as "utf-16"."""
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8"
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    label = _charset_label(body, content_type)
    if label in _WINDOWS_1252_LABELS:
        label = "windows-1252"
    try:
        codec = codecs.lookup(label).name if label else ""
    except LookupError:
        codec = ""
    if codec in ("utf-8", "utf-16", "utf-16-le", "utf-16-be"):
        return "utf-8"  # a meta tag cannot truthfully declare UTF-16 in bytes we could read
    if codec:
        return codec
    if body.isascii():
        return "utf-8"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "cp1252"
    return "utf-8"


def parser_input(body: bytes, content_type: str, codec: str = "") -> bytes | str:
    """What to hand lexbor, which reads bytes as UTF-8: the bytes, or text decoded here.

    Order as in the HTML standard: BOM, then the HTTP charset, then a `<meta>`
    charset in the first 1024 bytes; undeclared bytes that are not valid UTF-8
    are read as windows-1252, the web's legacy default. `codec`, when given, is
    document_codec's answer for these bytes, already known to the caller.
    """
    codec = codec or document_codec(body, content_type)
    if body.startswith(codecs.BOM_UTF8):
        return body[3:]
    if codec == "utf-16":
        return body.decode("utf-16", "replace")
    if codec == "utf-8":
        return body
    return body.decode(codec, "replace")


def visible_text(tree: LexborHTMLParser) -> str:
    """The text a reader sees in a parsed page: the title and the body, without scripts, styles, noscript
    fallbacks and templates, words separated by spaces. Removes those elements from `tree`."""
    tree.strip_tags(_INVISIBLE)
    title = tree.css_first("title")
    body = tree.body
    parts = [
        title.text(separator=" ") if title is not None else "",
        body.text(separator=" ") if body is not None else "",
    ]
    return " ".join(p for p in parts if p)


def page_text(body: bytes, content_type: str, max_chars: int) -> str:
    """The first `max_chars` of the text a simhash reads from a body: its visible text when it is HTML (by its
    Content-Type's media type), else the body decoded as UTF-8 (invalid bytes replaced; only its first `max_chars`
    bytes are decoded)."""
    if media_type(content_type) in HTML_TYPES and body and not body.isspace():
        return visible_text(LexborHTMLParser(parser_input(body, content_type)))[:max_chars]
    return body[:max_chars].decode("utf-8", "replace")
