"""Robots policy of the frontier core: a robots.txt fetch outcome becomes a cached record (RFC 9309).

Pure logic: the caller passes the outcome and the current time; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from protego import Protego

from frontier_node.core.robots_index import RuleIndex
from hostring.agent import product_token
from hostring.limits import MAX_ROBOTS_BODY_BYTES

MAX_ROBOTS_BYTES = MAX_ROBOTS_BODY_BYTES  # RFC 9309 §2.5: at least 500 KiB parsed; what the wire allows
MAX_CACHE_S = 24 * 3600

_ROBOTS_PATH = "/robots.txt"
_RECORD_FORMAT = 1
_NOT_MODIFIED = 304
_TOO_MANY_REQUESTS = 429

_T = TypeVar("_T")


class RobotsVerdict(enum.StrEnum):
    """What a record says about the whole origin before any rule is looked at."""

    ALLOW_ALL = "allow_all"
    DISALLOW_ALL = "disallow_all"
    RULES = "rules"


class _Group(Protocol):
    """What a record asks of the group that applies to it: per-URL answers and the Crawl-delay."""

    def can_fetch(self, url: str) -> bool: ...

    @property
    def crawl_delay(self) -> float | None: ...


def _cap_body(body: bytes) -> bytes:
    """The first MAX_ROBOTS_BYTES of a body, without a line cut in half by the cap (RFC 9309 §2.5).

    A truncated line could turn "Allow: /a/b/c" into the wider "Allow: /a", so it is dropped whole.
    """
    if len(body) <= MAX_ROBOTS_BYTES:
        return body
    head = body[:MAX_ROBOTS_BYTES]
    if body[MAX_ROBOTS_BYTES] in b"\r\n":
        return head
    return head[: max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]


# How protego (0.7) reads a line, so that the groups chosen here begin and end where protego's do: the known
# fields (misspellings included), and "field: value" or, as a second chance, "field value" with a one- or
# two-word field. Only user-agent lines and where they end a group matter here; protego parses the rules.
_USER_AGENT_FIELDS = frozenset({"user-agent", "useragent", "user agent"})
_SITE_WIDE_FIELDS = frozenset({"sitemap", "sitemaps", "site-map", "host"})  # these do not end a group
_KNOWN_FIELDS = _USER_AGENT_FIELDS | _SITE_WIDE_FIELDS | {
    "allow", "disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw",
    "crawl-delay", "crawl delay", "request-rate", "request rate", "visit-time", "visit time",
}  # fmt: skip
_MAX_FIELD_WORDS = 2
# The one user-agent the chosen group is handed to protego under, and asked for.
_AGENT = "*"
_TOKEN_PREFIX = re.compile(r"[a-z_-]*")  # a product token's letters, lower-cased (RFC 9309 §2.2.1)


def _directive(line: str) -> tuple[str, str] | None:
    """(lower-cased field, value) of a comment-free, stripped line, or None when it is no directive at all."""
    field: str | None = None
    value = ""
    if ":" in line:
        field, raw = line.split(":", 1)
        field, value = field.strip().lower(), raw.strip()
        if field in _KNOWN_FIELDS or not raw or raw[0].isspace():
            return field, value
    words = line.split()
    for count in range(1, _MAX_FIELD_WORDS + 1):
        candidate = " ".join(words[:count]).lower()
        if candidate in _KNOWN_FIELDS:
            return candidate, " ".join(words[count:])
    return None if field is None else (field, value)


def _names_token(name: str, token: str) -> bool:
    """Whether a (lower-cased) user-agent value names the product token: its leading letters, '_' and '-' are the
    token, as the RFC's reference parser (Google's robotstxt, ExtractUserAgent) reads a value, so `hostring/0.1`,
    `hostring*` and `hostring (bot)` name it and `hostring-bot` or `hostrings` do not."""
    found = _TOKEN_PREFIX.match(name)
    return found is not None and found.group() == token


def _names_everyone(name: str) -> bool:
    """Whether a (lower-cased) user-agent value is the `*` group: `*` alone or followed by a space and more, as
    the reference parser reads it."""
    return name == "*" or (name[:1] == "*" and name[1:2].isspace())


def _group_lines(text: str, product_token: str) -> list[str] | None:
    """The rule lines of the group that applies to `product_token`, else of the `*` group, else None.

    RFC 9309 §2.2.1: the token is matched whole and case-insensitively (a group named by a mere prefix of it,
    `host` for `hostring`, does not apply; one named `hostring/0.1` does, see _names_token); groups naming the
    same agent are merged, their lines in file order.
    An empty token means only the `*` group may apply.
    """
    groups: list[tuple[list[str], list[str]]] = []  # (lower-cased user-agent values, rule lines)
    group: tuple[list[str], list[str]] | None = None
    previous: str | None = None  # field of the last directive that is not site-wide ("" is a field too)
    for raw in text.splitlines():
        cut = raw.find("#")
        line = (raw[:cut] if cut != -1 else raw).strip()
        directive = _directive(line) if line else None
        if directive is None:
            continue
        field, value = directive
        if field in _USER_AGENT_FIELDS:
            if previous is not None and previous not in _USER_AGENT_FIELDS:
                group = None  # a user-agent line after rules starts a new group
            previous = field
            if value:
                if group is None:
                    group = ([], [])
                    groups.append(group)
                group[0].append(value.lower())
        elif field not in _SITE_WIDE_FIELDS:
            previous = field
            if value and group is not None:
                group[1].append(line)

    def merged(applies: Callable[[str], bool]) -> list[str] | None:
        chosen = [rules for names, rules in groups if any(applies(name) for name in names)]
        return [line for rules in chosen for line in rules] if chosen else None

    token = product_token.lower()
    ours = merged(lambda name: _names_token(name, token)) if token else None
    return ours if ours is not None else merged(_names_everyone)


class _Rules:
    """The chosen group, handed to protego as the only group of a file (under `_AGENT`) and asked under it.

    protego parses; its rules are kept in a RuleIndex, which gives protego's answers without asking every rule.
    """

    __slots__ = ("_crawl_delay", "_index")

    def __init__(self, lines: list[str]) -> None:
        parser = Protego.parse("\n".join([f"User-agent: {_AGENT}", *lines]))
        delay = parser.crawl_delay(_AGENT)
        self._crawl_delay = None if delay is None else float(delay)
        self._index = RuleIndex(parser, _AGENT)

    def can_fetch(self, url: str) -> bool:
        return self._index.can_fetch(url)

    @property
    def crawl_delay(self) -> float | None:
        return self._crawl_delay


def _parse_group(body: bytes, product_token: str) -> _Group | None:
    """Parse a (capped) body into the group for the whole product token, else `*`, else None (no rules)."""
    lines = _group_lines(_cap_body(body).decode("utf-8-sig", errors="replace"), product_token)
    return None if lines is None else _Rules(lines)


def _select_group(body: bytes, product_token: str) -> _Group | None:
    """The group of a body for the product token: the one `prepare` parsed ahead when it did, else parsed now."""
    key = (body, product_token)
    with _PREPARED_LOCK:
        if key in _PREPARED:
            return _PREPARED.pop(key)
    return _parse_group(body, product_token)


def prepare(body: bytes, product_token: str) -> None:
    """Parse a robots.txt body ahead, off the core thread: a shell calls this on a thread of its own for a big body
    (a hostile 500 KB file takes about a second to parse), and the record the core then makes of the same body and
    token takes the parsed group instead of parsing it while every call waits. Parsed groups wait here until taken,
    the PREPARED_MAX newest of them."""
    body = _cap_body(body)  # as a record keeps it
    try:
        group = _parse_group(body, product_token)
    except Exception:
        return  # the core parses it again and records why (robots_parse_error): nothing is decided here
    with _PREPARED_LOCK:
        _PREPARED[(body, product_token)] = group
        while len(_PREPARED) > PREPARED_MAX:
            del _PREPARED[next(iter(_PREPARED))]


PREPARED_MAX = 16
_PREPARED: dict[tuple[bytes, str], _Group | None] = {}
_PREPARED_LOCK = threading.Lock()


def _is_robots_txt(url: str) -> bool:
    """True for the robots.txt resource itself, which must stay fetchable under any verdict."""
    return _ROBOTS_PATH in url and urlsplit(url).path == _ROBOTS_PATH


@dataclass(slots=True)
class RobotsRecord:
    """One origin's robots state: the verdict, its lifetime, and the parsed group that answers per URL.

    `product_token` is the crawler token the group was chosen for; "" means only the `*` group applies.
    The body is parsed once, on construction, and only for a RULES verdict.
    """

    origin: str
    verdict: RobotsVerdict
    http_status: int
    error_class: str
    fetched_at: float
    expires_at: float
    crawl_delay: float | None
    body: bytes
    product_token: str = ""
    _group: _Group | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.verdict = RobotsVerdict(self.verdict)
        if self.verdict == RobotsVerdict.RULES:
            self._group = _select_group(self.body, self.product_token)

    def allowed(self, url: str) -> bool:
        """May this URL (absolute, or a path with its query) be fetched; /robots.txt always may."""
        verdict = self.verdict
        if verdict == RobotsVerdict.ALLOW_ALL:
            return True
        try:
            if _is_robots_txt(url):
                return True
            if verdict == RobotsVerdict.DISALLOW_ALL:
                return False
            group = self._group
            return group is None or bool(group.can_fetch(url))
        except ValueError:
            return False

    def expired(self, now: float) -> bool:
        """True from `expires_at` on: the robots file must be fetched again before more URLs go out."""
        return now >= self.expires_at

    def describe(self) -> str:
        """Short human text for status pages, e.g. "rules(200) delay=2.0" or "disallow_all(timeout)"."""
        cause = self.error_class if self.error_class else str(self.http_status)
        text = f"{self.verdict.value}({cause})"
        return text if self.crawl_delay is None else f"{text} delay={self.crawl_delay}"

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form for the store; the body is base64 so any bytes survive."""
        return {
            "format": _RECORD_FORMAT,
            "origin": self.origin,
            "verdict": self.verdict.value,
            "http_status": self.http_status,
            "error_class": self.error_class,
            "fetched_at": self.fetched_at,
            "expires_at": self.expires_at,
            "crawl_delay": self.crawl_delay,
            "body_b64": base64.b64encode(self.body).decode("ascii"),
            "product_token": self.product_token,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> RobotsRecord:
        """Rebuild a record saved by to_dict (reparsing its body); ValueError on a malformed dict."""
        if d.get("format") != _RECORD_FORMAT:
            raise ValueError(f"unknown robots record format {d.get('format')!r}")
        delay = d.get("crawl_delay")
        try:
            body = base64.b64decode(_field(d, "body_b64", str), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"robots record body is not base64: {exc}") from exc
        return cls(
            origin=_field(d, "origin", str),
            verdict=RobotsVerdict(_field(d, "verdict", str)),
            http_status=_field(d, "http_status", int),
            error_class=_field(d, "error_class", str),
            fetched_at=_number(d, "fetched_at"),
            expires_at=_number(d, "expires_at"),
            crawl_delay=None if delay is None else _number(d, "crawl_delay"),
            body=body,
            product_token=_field(d, "product_token", str),
        )


def _field(d: Mapping[str, object], key: str, kind: type[_T]) -> _T:
    """d[key] if it has the expected type, else ValueError (bool is not taken for int)."""
    value = d.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"robots record field {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _number(d: Mapping[str, object], key: str) -> float:
    """d[key] as a float; ints are accepted because JSON may have written 1.0 as 1."""
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"robots record field {key!r} must be a number, got {value!r}")
    return float(value)


class RobotsPolicy:
    """Turns robots.txt fetch outcomes into RobotsRecords for one crawler identity (RFC 9309 §2.3, §2.4)."""

    __slots__ = ("cache_s", "error_retry_s", "max_crawl_delay_s", "product_token", "user_agent")

    def __init__(
        self,
        user_agent: str,
        *,
        cache_s: float = MAX_CACHE_S,
        error_retry_s: float = 60.0,
        max_crawl_delay_s: float = 30.0,
    ) -> None:
        if not 0 < cache_s <= MAX_CACHE_S:
            raise ValueError(f"cache_s must be in (0, {MAX_CACHE_S}] (RFC 9309 §2.4), got {cache_s}")
        if not 0 < error_retry_s <= MAX_CACHE_S:
            raise ValueError(f"error_retry_s must be in (0, {MAX_CACHE_S}], got {error_retry_s}")
        if not 0 <= max_crawl_delay_s < math.inf:
            raise ValueError(f"max_crawl_delay_s must be finite and >= 0, got {max_crawl_delay_s}")
        self.user_agent = user_agent
        self.product_token = product_token(user_agent)
        self.cache_s = float(cache_s)
        self.error_retry_s = float(error_retry_s)
        self.max_crawl_delay_s = float(max_crawl_delay_s)

    def from_outcome(
        self,
        origin: str,
        *,
        status: int,
        body: bytes,
        error_class: str,
        now: float,
        previous: RobotsRecord | None = None,
    ) -> RobotsRecord:
        """The record for one robots.txt fetch outcome (after the worker's redirect hops).

        - no response (error_class set, or status 0), 429, 5xx, any other status: unreachable, so
          disallow all and fetch again after error_retry_s (§2.3.1.4);
        - 2xx: parse the first MAX_ROBOTS_BYTES; 304 renews `previous` when it holds rules;
        - other 3xx (more than five hops were needed) and 4xx: unavailable, so allow all (§2.3.1.2-3).
        """
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite time, got {now}")
        if previous is not None and previous.origin != origin:
            raise ValueError(f"previous record is for {previous.origin!r}, not {origin!r}")
        if error_class or status <= 0:
            return self._unreachable(origin, status, error_class, now)
        if 200 <= status < 300:
            return self._rules(origin, status, body, now)
        if status == _NOT_MODIFIED:
            if previous is not None and previous.verdict == RobotsVerdict.RULES:
                return self._rules(origin, status, previous.body, now)
            return self._unreachable(origin, status, error_class, now)
        if 300 <= status < 400 or (400 <= status < 500 and status != _TOO_MANY_REQUESTS):
            return self._record(origin, RobotsVerdict.ALLOW_ALL, status, "", now, self.cache_s, b"")
        return self._unreachable(origin, status, error_class, now)

    def _rules(self, origin: str, status: int, body: bytes, now: float) -> RobotsRecord:
        """A parsed record; a body protego cannot parse counts as unreachable rather than allow all."""
        try:
            record = self._record(origin, RobotsVerdict.RULES, status, "", now, self.cache_s, _cap_body(body))
        except Exception:
            return self._unreachable(origin, status, "robots_parse_error", now)
        delay = record._group.crawl_delay if record._group is not None else None
        if delay is not None:
            record.crawl_delay = min(float(delay), self.max_crawl_delay_s)
        return record

    def _unreachable(self, origin: str, status: int, error_class: str, now: float) -> RobotsRecord:
        """Disallow all, with a short lifetime so the node fetches robots.txt again soon."""
        return self._record(origin, RobotsVerdict.DISALLOW_ALL, status, error_class, now, self.error_retry_s, b"")

    def _record(
        self,
        origin: str,
        verdict: RobotsVerdict,
        status: int,
        error_class: str,
        now: float,
        ttl: float,
        body: bytes,
    ) -> RobotsRecord:
        """A record for this crawler's product token, living `ttl` seconds from `now`."""
        return RobotsRecord(
            origin=origin,
            verdict=verdict,
            http_status=status,
            error_class=error_class,
            fetched_at=now,
            expires_at=now + ttl,
            crawl_delay=None,
            body=body,
            product_token=self.product_token,
        )
