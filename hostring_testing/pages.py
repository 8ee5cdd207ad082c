"""What a site of the test web is made of: pages, page helpers, the endless calendar trap, and page text.

Sites are written before ports are known, so bodies and header values may contain placeholders that the server
substitutes at serve time (see ``hostring_testing.server``): ``{{origin:LABEL}}``, ``{{origin:LABEL|upper}}``,
``{{origin:LABEL|port}}`` and ``{{host:LABEL}}``.
"""

from __future__ import annotations

import html
import random
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import brotli

__all__ = [
    "HTML",
    "TEXT",
    "Key",
    "Page",
    "Site",
    "bomb_page",
    "compressed_page",
    "html_page",
    "not_found",
    "paragraph",
    "redirect_page",
    "robots_page",
    "trap_page",
    "under_trap",
]

Key = tuple[str, str]
"""A page's identity as the generator knows it: (origin label, path with query, in normal form)."""

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"


@dataclass
class Page:
    """One resource of a site, served as given (after placeholder substitution)."""

    status: int = 200
    body: bytes = b""
    content_type: str = HTML
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Server-side think time before the status line is sent."""
    trickle_s: float = 0.0
    """If > 0 the body is sent one byte per trickle_s seconds: a slow-loris server."""
    encoding: str = ""
    """"gzip", "deflate" or "br": body is already compressed and sent with that Content-Encoding."""

    def at(self, now: float, request_headers: Mapping[str, str]) -> Page:
        """What is served for this page at `now` to a request with these (lower-cased) headers: a page that
        changes over time (hostring_testing.changing) answers its current version or 304; this one is fixed."""
        return self


@dataclass
class Site:
    """The pages of one origin; unknown paths are 404."""

    pages: dict[str, Page] = field(default_factory=dict)
    robots: Page | None = None
    """Served at /robots.txt; None means 404 (allow all)."""
    trap: str | None = None
    """Path prefix of an endless calendar: /trap/2024/01 links to /trap/2024/02 and /trap/2025/01, forever."""


def html_page(text: str, **kwargs: Any) -> Page:
    """An HTML page from a str body."""
    return Page(body=text.encode("utf-8"), **kwargs)


def robots_page(text: str, status: int = 200) -> Page:
    """A robots.txt file served as text/plain."""
    return Page(status=status, body=text.encode("utf-8"), content_type=TEXT)


def redirect_page(location: str, status: int = 301) -> Page:
    """A redirect; location may use placeholders such as {{origin:b}}/x."""
    return Page(status=status, headers={"Location": location}, content_type="")


def compressed_page(content: bytes, encoding: str = "gzip", content_type: str = HTML) -> Page:
    """A page whose body is sent compressed with the given Content-Encoding."""
    if encoding == "gzip":
        body = zlib.compress(content, 9, wbits=31)
    elif encoding == "deflate":
        body = zlib.compress(content, 9)
    elif encoding == "br":
        body = brotli.compress(content)
    else:
        raise ValueError(f"unsupported encoding {encoding!r}")
    return Page(body=body, encoding=encoding, content_type=content_type)


def bomb_page(encoding: str = "gzip", size: int = 1 << 30, content_type: str = HTML) -> Page:
    """A decompression bomb: `size` zero bytes compressed; built chunk by chunk so memory stays small."""
    chunk = bytes(1 << 20)
    parts: list[bytes] = []
    if encoding in ("gzip", "deflate"):
        comp = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        feed, finish = comp.compress, comp.flush
    elif encoding == "br":
        bcomp = brotli.Compressor(quality=5)
        feed, finish = bcomp.process, bcomp.finish
    else:
        raise ValueError(f"unsupported encoding {encoding!r}")
    left = size
    while left > 0:
        parts.append(feed(chunk[: min(left, len(chunk))]))
        left -= len(chunk)
    parts.append(finish())
    return Page(body=b"".join(parts), encoding=encoding, content_type=content_type)


# ----------------------------------------------------------------------------------------------------
# The calendar trap


_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def trap_page(prefix: str, path: str) -> Page | None:
    """The calendar page at `path` under `prefix`, or None if `path` is not under it; malformed dates 404."""
    base = prefix.rstrip("/")
    if path in (base, base + "/"):
        return html_page(_calendar_html(base, None, None, "./" if path.endswith("/") else base + "/"))
    if not path.startswith(base + "/"):
        return None
    m = re.fullmatch(r"(\d{4,9})/(\d{2})", path[len(base) + 1 :])
    if m is None or not 1 <= int(m.group(2)) <= 12:
        return Page(status=404, body=b"<!DOCTYPE html><title>No such month</title>")
    return html_page(_calendar_html(base, int(m.group(1)), int(m.group(2)), ""))


def _calendar_html(base: str, year: int | None, month: int | None, index_ref: str) -> str:
    """One calendar page: new text and new links on every page, so it never ends."""
    if year is None or month is None:
        title, links = "Events calendar", [(index_ref + "2024/01", "January 2024")]
        seed = 0
    else:
        ny, nm = (year, month + 1) if month < 12 else (year + 1, 1)
        title = f"Events in {_MONTHS[month - 1]} {year}"
        links = [
            (f"../{ny}/{nm:02d}", f"{_MONTHS[nm - 1]} {ny}"),
            (f"../../{base.rsplit('/', 1)[-1]}/{year + 1}/{month:02d}", f"{_MONTHS[month - 1]} {year + 1}"),
        ]
        seed = year * 12 + month
    rng = random.Random(zlib.crc32(f"{base}|{seed}".encode()))
    items = "\n".join(f'<li><a href="{html.escape(h)}">{html.escape(t)}</a></li>' for h, t in links)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
        f"<body>\n<h1>{title}</h1>\n<p>{paragraph(rng, 40)}</p>\n<ul>\n{items}\n</ul>\n</body></html>\n"
    )


def under_trap(prefix: str | None, path: str) -> bool:
    """Whether `path` lies under the trap `prefix`."""
    if prefix is None:
        return False
    base = prefix.rstrip("/")
    return path == base or path.startswith(base + "/")


def not_found() -> Page:
    return Page(status=404, body=b"<!DOCTYPE html><title>Not found</title><h1>Not found</h1>\n")


# ----------------------------------------------------------------------------------------------------
# Page text


_WORDS = (
    "harbor",
    "lantern",
    "ferry",
    "market",
    "council",
    "river",
    "bridge",
    "garden",
    "library",
    "tower",
    "meadow",
    "orchard",
    "village",
    "quay",
    "station",
    "bakery",
    "chapel",
    "mill",
    "forge",
    "lighthouse",
    "dune",
    "cliff",
    "tide",
    "current",
    "anchor",
    "sail",
    "rope",
    "knot",
    "compass",
    "chart",
    "storm",
    "breeze",
    "fog",
    "rain",
    "sunrise",
    "dusk",
    "winter",
    "spring",
    "summer",
    "autumn",
    "morning",
    "evening",
    "ledger",
    "notice",
    "schedule",
    "report",
    "review",
    "guide",
    "manual",
    "index",
    "archive",
    "record",
    "letter",
    "journal",
    "diary",
    "recipe",
    "story",
    "poem",
    "song",
    "map",
    "route",
    "trail",
    "path",
    "street",
    "square",
    "alley",
    "lane",
    "road",
    "market",
    "fair",
    "festival",
    "concert",
    "parade",
    "lecture",
    "meeting",
    "vote",
    "budget",
    "plan",
    "project",
    "repair",
    "timber",
    "stone",
    "brick",
    "copper",
    "iron",
    "glass",
    "paper",
    "wool",
    "linen",
    "salt",
    "pepper",
    "honey",
    "apple",
    "pear",
    "plum",
    "cherry",
    "barley",
    "wheat",
    "oat",
    "bread",
    "cheese",
    "butter",
    "fish",
    "oyster",
    "crab",
    "gull",
    "heron",
    "otter",
    "fox",
    "badger",
    "owl",
    "swift",
    "sparrow",
    "wren",
    "oak",
    "ash",
    "elm",
    "willow",
    "birch",
    "pine",
    "fern",
    "moss",
    "heather",
    "thistle",
    "clover",
    "daisy",
    "poppy",
    "rose",
    "quiet",
    "busy",
    "early",
    "late",
    "small",
    "large",
    "narrow",
    "wide",
    "old",
    "new",
    "bright",
    "dark",
    "warm",
    "cold",
    "calm",
    "rough",
    "steady",
    "sudden",
    "careful",
    "simple",
    "honest",
    "patient",
    "curious",
    "gentle",
    "proud",
    "sturdy",
    "tired",
    "cheerful",
    "stubborn",
    "clever",
    "plain",
    "modest",
    "walk",
    "sail",
    "mend",
    "build",
    "paint",
    "carry",
    "gather",
    "measure",
    "weigh",
    "count",
    "write",
    "read",
    "teach",
    "learn",
    "sing",
    "cook",
    "bake",
    "plant",
    "harvest",
    "fish",
    "trade",
    "travel",
    "return",
    "visit",
    "open",
    "close",
    "begin",
    "finish",
    "repair",
    "borrow",
    "lend",
    "share",
    "welcome",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "from",
    "near",
    "under",
    "over",
    "after",
    "before",
    "during",
    "because",
    "while",
    "although",
    "neighbors",
    "visitors",
    "keepers",
    "farmers",
    "sailors",
    "teachers",
    "students",
    "children",
    "elders",
    "volunteers",
    "merchants",
    "carpenters",
    "painters",
    "writers",
    "readers",
    "cooks",
    "pilots",
    "wardens",
    "clerks",
    "builders",
    "fishermen",
    "gardeners",
    "weavers",
)


_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ren",
    "sa",
    "tor",
    "vel",
    "un",
    "dra",
    "pe",
    "qui",
    "zo",
    "ban",
    "el",
    "fi",
    "gu",
    "ho",
    "ix",
    "ja",
    "lum",
    "mar",
    "nor",
    "os",
    "pri",
    "ris",
    "sto",
    "tri",
    "ves",
    "wen",
    "yor",
)


def _name(rng: random.Random) -> str:
    """A made-up proper name (a person, a boat, a place): tokens that make every page's text its own."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def paragraph(rng: random.Random, n: int) -> str:
    """n words of plain text in sentences; different pages get different bags of words, so no two pages
    are near-duplicates under simhash (mirrors excepted)."""
    out: list[str] = []
    while len(out) < n:
        sentence = [_name(rng) if rng.random() < 0.2 else rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
        out.extend([sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."])
    return " ".join(out)
