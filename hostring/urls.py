"""URL identity: a discovered link becomes observed / resolved / fetch key, or a named rejection.

The rules are the ones of DESIGN.md "URL identity": RFC 3986 §5 resolution, §6.2.2 syntax normalization,
a documented query policy, and browser (WHATWG) leniency where pages rely on it: surrounding whitespace,
tabs and newlines inside, backslashes and extra slashes in http(s). `identify()` is on the frontier's hot
path, so per-host work is cached and components that are already clean skip their normalization pass.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final, NamedTuple

import idna

from hostring.domains import registrable_domain

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_QUERY_POLICY",
    "ROBOTS_PREFIX",
    "WEB_SCHEMES",
    "ParamClass",
    "QueryPolicy",
    "RejectReason",
    "UrlIdentity",
    "UrlRejected",
    "domain_of",
    "identify",
    "normalize",
    "reference_key",
    "reference_keys",
    "remove_dot_segments",
    "resolve",
    "robots_url",
]

DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
WEB_SCHEMES: frozenset[str] = frozenset({"http", "https"})
# WHATWG "special" schemes: "\" is a path separator and any run of slashes introduces the authority.
_SPECIAL = frozenset(DEFAULT_PORTS)
# References longer than this many times max_length are refused before any parsing: bounded work per link.
_INPUT_CAP_FACTOR = 16

_ASCII_WS = " \t\n\r\f"
_DROP_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# RFC 3986 Appendix B, except that a scheme only counts when it is syntactically one (§3.1), as browsers do.
_REST = r"(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?"
_SPLIT_REST = re.compile(_REST, re.DOTALL)
_SPLIT = re.compile(r"(?:([A-Za-z][A-Za-z0-9+.\-]*):)?" + _REST, re.DOTALL)
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Anything outside RFC 3986 pchar / "/" / "?" (a "%" included): such a path or query needs the slow pass.
_NOT_CLEAN = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/?]")
# An absolute http(s) reference whose general passes would leave it as written (see _canonical_identity): no
# whitespace or backslash, a plain authority, a path and query of clean characters, a printable fragment. Groups:
# scheme, authority, path, query, fragment. A "?" with nothing after it is left to the general path.
_CANONICAL = re.compile(
    r"([Hh][Tt][Tt][Pp][Ss]?)://([A-Za-z0-9_\-.:]+)(/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*)?"
    r"(?:\?([A-Za-z0-9\-._~!$&'()*+,;=:@/?]+))?(?:#([!-\[\]-~]*))?"
)
_PCT_OR_NOT_CLEAN = re.compile(r"%[0-9A-Fa-f]{2}|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?]")
# "%7e" -> "~" (unreserved is decoded), "%2f" -> "%2F" (anything else keeps its escape, upper-cased).
_PCT_TRIPLET: dict[str, str] = {f"%{i:02X}": (chr(i) if chr(i) in _UNRESERVED else f"%{i:02X}") for i in range(256)}
# ASCII labels are checked like browsers do, not like IDNA: "_" and hyphens anywhere are real hosts
# (my_host.example, r3---sn-x.googlevideo.com). Non-ASCII labels go through IDNA 2008 / UTS #46.
_ASCII_HOST = re.compile(r"[a-z0-9_\-.]+")
_MAX_LABEL = 63
_MAX_HOST = 253


class RejectReason(enum.StrEnum):
    """Why a link was not admitted; every rejection carries exactly one."""

    EMPTY = "empty"
    MALFORMED = "malformed"
    BAD_SCHEME = "bad_scheme"
    USERINFO = "userinfo"
    BAD_PORT = "bad_port"
    BAD_HOST = "bad_host"
    TOO_LONG = "too_long"
    OUT_OF_SCOPE = "out_of_scope"


class UrlRejected(ValueError):
    """A link that cannot become a fetch key; `.reason` names the rule, `.url` is the offending text."""

    def __init__(self, reason: RejectReason, url: str, detail: str = "") -> None:
        super().__init__(reason, url, detail)
        self.reason = reason
        self.url = url
        self.detail = detail

    def __str__(self) -> str:
        shown = self.url if len(self.url) <= 200 else self.url[:200] + "..."
        detail = f": {self.detail}" if self.detail else ""
        return f"URL rejected ({self.reason.value}){detail}: {shown!r}"


class ParamClass(enum.StrEnum):
    """What a query parameter is for; TRACKING and SESSION are dropped from the fetch key."""

    TRACKING = "tracking"
    SESSION = "session"
    CONTENT = "content"
    UNKNOWN = "unknown"


_DROPPED = (ParamClass.TRACKING, ParamClass.SESSION)


@dataclass(frozen=True, slots=True)
class QueryPolicy:
    """Classifies query parameter names (case-insensitively) so the key can drop the ones that never
    select content: campaign/click trackers and session ids. Everything else stays, in its order.
    """

    tracking_prefixes: tuple[str, ...]
    tracking_names: frozenset[str]
    session_names: frozenset[str]
    content_names: frozenset[str]
    _dropped: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "tracking_prefixes", tuple(p.lower() for p in self.tracking_prefixes))
        set_(self, "tracking_names", frozenset(n.lower() for n in self.tracking_names))
        set_(self, "session_names", frozenset(n.lower() for n in self.session_names))
        set_(self, "content_names", frozenset(n.lower() for n in self.content_names))
        set_(self, "_dropped", self.tracking_names | self.session_names)

    def classify(self, name: str) -> ParamClass:
        """The class of one parameter name (the text before "="), case-insensitive."""
        n = name.lower()
        if n in self.tracking_names or n.startswith(self.tracking_prefixes):
            return ParamClass.TRACKING
        if n in self.session_names:
            return ParamClass.SESSION
        if n in self.content_names:
            return ParamClass.CONTENT
        return ParamClass.UNKNOWN

    def filter_query(self, query: str) -> str:
        """The query without tracking and session parameters; the others keep their order and spelling."""
        dropped, prefixes = self._dropped, self.tracking_prefixes
        for part in query.lower().split("&"):
            name = part.partition("=")[0]
            if name in dropped or name.startswith(prefixes):
                break
        else:
            return query
        return "&".join(p for p in query.split("&") if self.classify(p.partition("=")[0]) not in _DROPPED)


def _names(words: str) -> frozenset[str]:
    """A set of parameter names from a space-separated list."""
    return frozenset(words.split())


DEFAULT_QUERY_POLICY = QueryPolicy(
    # Campaign tags: Google Analytics (utm_*), Matomo (mtm_*, matomo_*), HubSpot ads (hsa_*).
    tracking_prefixes=("utm_", "mtm_", "matomo_", "hsa_"),
    # Click ids and mail-campaign ids of ad and analytics platforms; none of them selects content.
    tracking_names=_names(
        "gclid gclsrc dclid gbraid wbraid fbclid msclkid yclid igshid twclid ttclid li_fat_id mc_cid mc_eid"
        " _ga _gl _hsenc _hsmi mkt_tok s_kwcid ef_id srsltid oly_anon_id oly_enc_id vero_id vero_conv"
        " rb_clickid wickedid pk_campaign pk_kwd pk_keyword pk_source pk_medium pk_content pk_cid"
    ),
    # Server session ids put in URLs when cookies are off (PHP, Java, ASP, ColdFusion, shop systems).
    session_names=_names(
        "sessionid session_id sessid sid phpsessid jsessionid aspsessionid cfid cftoken oscsid zenid xtcsid"
    ),
    # Known content selectors: informative only, kept exactly like UNKNOWN ones.
    content_names=_names(
        "page p id q query s search lang sort order offset start limit cat category tag v year month"
        " item product article"
    ),
)


@dataclass(frozen=True, slots=True)
class UrlIdentity:
    """Everything the frontier keeps about one discovered link.

    `fetch_key` is the identity of a fetch (dedup, journal, budgets). `url` is what a fetcher requests and
    is, by design, equal to `fetch_key`: the content stored under a key must be a function of the key,
    not of whichever spelling was discovered first, and tracking/session ids are not sent to servers
    (their analytics are not polluted, nobody else's session is reused).
    """

    observed: str
    resolved: str
    fetch_key: str
    url: str
    scheme: str
    host: str
    port: int
    origin: str
    domain: str
    fragment: str


# The five RFC 3986 components (scheme, authority, path, query, fragment); None means undefined, as
# distinct from empty. A plain tuple: it is built several times per link on the hot path.
_Parts = tuple[str | None, str | None, str, str | None, str | None]


class _Authority(NamedTuple):
    """The cached outcome of one (scheme, authority) pair: a host record, or a reason and its detail."""

    reason: RejectReason | None
    detail: str
    host: str
    port: int
    origin: str
    domain: str


# ---------------------------------------------------------------- RFC 3986 §5: resolution


def _split_rest(s: str) -> tuple[str | None, str, str | None, str | None]:
    """Authority, path, query, fragment of a reference without its scheme."""
    m = _SPLIT_REST.match(s)
    assert m is not None  # every group is optional: the pattern matches any string
    authority, path, query, fragment = m.groups()
    return authority, path, query, fragment


def _split(reference: str) -> _Parts:
    """The five components of a URI reference."""
    m = _SPLIT.match(reference)
    assert m is not None
    scheme, authority, path, query, fragment = m.groups()
    return scheme, authority, path, query, fragment


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4. An absolute path is a list of "/segment" units there, so a segment stack gives the
    same output faster; other paths (only met in strict resolution) take the literal algorithm.
    """
    if "." not in path:
        return path
    if not path.startswith("/"):
        return _remove_dot_segments_buffer(path)
    if "/." not in path:
        return path
    segments = path.split("/")
    out: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _remove_dot_segments_buffer(path: str) -> str:
    """RFC 3986 §5.2.4 step by step (any path); the input buffer is walked by index, so it stays linear."""
    out: list[str] = []
    i, n = 0, len(path)
    while i < n:
        if path.startswith("../", i):  # A
            i += 3
        elif path.startswith("./", i) or path.startswith("/./", i):  # A, or B leaving the "/"
            i += 2
        elif path.startswith("/.", i) and i + 2 == n:  # B, at the end
            out.append("/")
            break
        elif path.startswith("/../", i):  # C
            i += 3
            if out:
                out.pop()
        elif path.startswith("/..", i) and i + 3 == n:  # C, at the end
            if out:
                out.pop()
            out.append("/")
            break
        elif (i + 1 == n and path[i] == ".") or (i + 2 == n and path.startswith("..", i)):  # D
            break
        else:  # E: move "/segment" (or a first "segment") to the output
            j = path.find("/", i + 1 if path[i] == "/" else i)
            if j < 0:
                j = n
            out.append(path[i:j])
            i = j
    return "".join(out)


def _transform(ref: _Parts, base: _Parts) -> _Parts:
    """RFC 3986 §5.2.2 for a reference without a (usable) scheme; the base supplies what is missing."""
    _, authority, path, query, fragment = ref
    base_scheme, base_authority, base_path, base_query, _ = base
    if authority is not None:
        return base_scheme, authority, remove_dot_segments(path), query, fragment
    if not path:
        return base_scheme, base_authority, base_path, base_query if query is None else query, fragment
    if not path.startswith("/"):  # §5.2.3 merge
        if base_authority is not None and not base_path:
            path = "/" + path
        else:
            path = base_path[: base_path.rfind("/") + 1] + path
    return base_scheme, base_authority, remove_dot_segments(path), query, fragment


def _recompose(parts: _Parts) -> str:
    """RFC 3986 §5.3."""
    scheme, authority, path, query, fragment = parts
    return "".join(
        (
            "" if scheme is None else scheme + ":",
            "" if authority is None else "//" + authority,
            path,
            "" if query is None else "?" + query,
            "" if fragment is None else "#" + fragment,
        )
    )


def resolve(reference: str, base: str) -> str:
    """The target URI of `reference` against `base`: RFC 3986 §5.2 strict, nothing normalized.

    Raises ValueError when `base` has no scheme (it must be an absolute URI, §5.1).
    """
    b = _split(base)
    if b[0] is None:
        raise ValueError(f"base URI must be absolute (have a scheme): {base!r}")
    scheme, authority, path, query, fragment = r = _split(reference)
    if scheme is not None:
        return _recompose((scheme, authority, remove_dot_segments(path), query, fragment))
    return _recompose(_transform(r, b))


# ---------------------------------------------------------------- hosts and ports


def _ipv4_number(part: str) -> int | None:
    """One WHATWG IPv4 part: decimal, 0x-hex or 0-octal; None when it is not a number."""
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if not part:
        return 0
    try:
        return int(part, radix) if part.isascii() and part.isalnum() else None
    except ValueError:
        return None


def _ends_in_number(host: str) -> bool:
    """WHATWG: a host whose last label is numeric is an IPv4 address (or an error), never a name."""
    last = host.rpartition(".")[2]
    if last.isascii() and last.isdigit():
        return True
    return last[:2] in ("0x", "0X") and all(c in "0123456789abcdefABCDEF" for c in last[2:])


def _parse_ipv4(host: str) -> str | None:
    """The dotted quad of a WHATWG IPv4 host (`127.1`, `0x7f.0.0.1`, `2130706433` all -> 127.0.0.1)."""
    parts = host.split(".")
    if len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        if not part:
            return None
        number = _ipv4_number(part)
        if number is None:
            return None
        numbers.append(number)
    if any(x > 255 for x in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    value = numbers[-1]
    for k, x in enumerate(numbers[:-1]):
        value += x << (8 * (3 - k))
    return str(ipaddress.IPv4Address(value))


def _percent_decode_host(raw: str) -> str | None:
    """A host with its %XX escapes decoded as UTF-8; None when they are not valid UTF-8."""
    data = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "%" and i + 2 < n and all(h in "0123456789abcdefABCDEF" for h in raw[i + 1 : i + 3]):
            data.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            data += c.encode("utf-8", "surrogatepass")
            i += 1
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _canonical_host(raw: str) -> tuple[str, str]:
    """(host, "") with host lower-case ASCII (A-labels, dotted-quad IPv4, bare compressed IPv6), or
    ("", why) when it is not a usable host name.
    """
    if raw.startswith("["):
        inner = raw[1:-1]
        if inner[:1] in ("v", "V"):
            return "", "IPvFuture literals are not supported"
        if "%" in inner:
            return "", "IPv6 zone identifiers are not allowed in URLs for fetching"
        try:
            return ipaddress.IPv6Address(inner).compressed, ""
        except ValueError:
            return "", "invalid IPv6 literal"
    host = raw
    if "%" in host:
        decoded = _percent_decode_host(host)
        if decoded is None:
            return "", "percent-encoded host is not UTF-8"
        host = decoded
    if host.isascii():
        host = host.lower()
    else:
        try:
            host = idna.uts46_remap(host, std3_rules=False, transitional=False)
        except idna.IDNAError as e:
            return "", f"invalid IDNA host ({e})"
    host = host.removesuffix(".")
    if not host:
        return "", "empty host"
    if _ends_in_number(host):
        ipv4 = _parse_ipv4(host)
        return (ipv4, "") if ipv4 is not None else ("", "invalid IPv4 address")
    labels = host.split(".")
    for k, label in enumerate(labels):
        if not label:
            return "", "empty label"
        if label.isascii():
            if _ASCII_HOST.fullmatch(label) is None:
                return "", f"illegal character in host label {label!r}"
            if label.startswith("xn--"):
                try:
                    idna.ulabel(label)
                except (idna.IDNAError, UnicodeError) as e:
                    return "", f"invalid A-label {label!r} ({e})"
        else:
            try:
                labels[k] = label = idna.alabel(label).decode("ascii")
            except (idna.IDNAError, UnicodeError) as e:
                return "", f"invalid IDNA label {label!r} ({e})"
        if len(label) > _MAX_LABEL:
            return "", f"label longer than {_MAX_LABEL} characters"
    host = ".".join(labels)
    if len(host) > _MAX_HOST:
        return "", f"host longer than {_MAX_HOST} characters"
    return host, ""


def _port(scheme: str, text: str | None) -> tuple[int, str]:
    """(effective port, "") or (0, why): empty means the scheme's default (RFC 3986 §6.2.3)."""
    default = DEFAULT_PORTS.get(scheme, 0)
    if not text:
        return (default, "") if default else (0, f"no port given and no default port for {scheme!r}")
    if not (text.isascii() and text.isdigit()):
        return 0, f"port {text!r} is not a number"
    digits = text.lstrip("0")
    port = int(digits) if 0 < len(digits) <= 5 else 0
    if not 0 < port <= 65535:
        return 0, f"port {text!r} is out of range 1-65535"
    return port, ""


@lru_cache(maxsize=1 << 15)
def _authority(scheme: str, authority: str) -> _Authority:
    """Everything that depends only on scheme and authority, computed once per distinct pair."""

    def bad(reason: RejectReason, detail: str) -> _Authority:
        return _Authority(reason, detail, "", 0, "", "")

    if "@" in authority:
        return bad(RejectReason.USERINFO, "credentials in URLs are not crawled")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return bad(RejectReason.BAD_HOST, "unterminated IPv6 literal")
        raw_host, after = authority[: end + 1], authority[end + 1 :]
        if after and not after.startswith(":"):
            return bad(RejectReason.BAD_HOST, "text after an IPv6 literal")
        port_text: str | None = after[1:] if after else None
    else:
        raw_host, colon, port_text = authority.rpartition(":")
        if not colon:
            raw_host, port_text = authority, None
    port, why = _port(scheme, port_text)
    if why:
        return bad(RejectReason.BAD_PORT, why)
    host, why = _canonical_host(raw_host)
    if why:
        return bad(RejectReason.BAD_HOST, why)
    netloc = f"[{host}]" if ":" in host else host
    if port != DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    return _Authority(None, "", host, port, f"{scheme}://{netloc}", registrable_domain(host))


# ---------------------------------------------------------------- paths and queries


@lru_cache(maxsize=4096)
def _escape_char(c: str) -> str:
    """A character that may not appear raw, as UTF-8 percent-escapes; a lone "%" becomes "%25"."""
    return "".join(f"%{b:02X}" for b in c.encode("utf-8"))


def _fix_escape(m: re.Match[str]) -> str:
    """RFC 3986 §6.2.2.1-2 for one match: hex upper-cased, unreserved decoded, the rest escaped."""
    t = m.group()
    return _PCT_TRIPLET[t.upper()] if len(t) == 3 else _escape_char(t)


# ---------------------------------------------------------------- identify


def _clean(text: str, observed: str) -> str:
    """WHATWG pre-processing: strip surrounding ASCII whitespace, drop tabs and newlines inside; any
    other control character is refused rather than guessed at.
    """
    s = text.strip(_ASCII_WS)
    if not s:
        raise UrlRejected(RejectReason.EMPTY, observed, "empty reference")
    if not (s.isascii() and s.isprintable()):
        s = s.translate(_DROP_TAB_NEWLINE)
        if _CONTROL.search(s) is not None:
            raise UrlRejected(RejectReason.MALFORMED, observed, "control character in URL")
    return s


def _unbackslash(s: str) -> str:
    """Browsers read "\\" as "/" before the query in special URLs."""
    if "\\" not in s:
        return s
    end = len(s)
    for delimiter in "?#":
        i = s.find(delimiter)
        if 0 <= i < end:
            end = i
    return s[:end].replace("\\", "/") + s[end:]


def _special_authority(rest: str) -> str:
    """Browsers take any run of slashes (none included) after "http:" as the authority's "//"."""
    if rest.startswith("//") and not rest.startswith("///"):
        return rest
    return "//" + rest.lstrip("/")


@lru_cache(maxsize=1024)
def _base_parts(base: str) -> _Parts | None:
    """A base URL split for resolution (cleaned like a reference); None when it is not absolute."""
    try:
        s = _clean(base, base)
    except UrlRejected:
        return None
    m = _SCHEME.match(s)
    if m is None:
        return None
    scheme = m.group(1)
    rest = s[m.end() :]
    if scheme.lower() in _SPECIAL:
        rest = _special_authority(_unbackslash(rest))
    authority, path, query, _ = _split_rest(rest)
    return scheme, authority, path, query, None


def _resolve_lenient(ref: str, base: str, observed: str) -> _Parts:
    """RFC 3986 §5.2 with the browser readings above and the §5.2.2 non-strict rule for "http:g"."""
    m = _SCHEME.match(ref)
    if m is not None:
        scheme = m.group(1)
        rest = ref[m.end() :]
        if scheme.lower() not in _SPECIAL:
            authority, path, query, fragment = _split_rest(rest)
            return scheme, authority, remove_dot_segments(path), query, fragment
        rest = _unbackslash(rest)
        b = _base_parts(base) if base and not rest.startswith("//") else None
        if b is None or b[0] is None or b[0].lower() != scheme.lower():
            authority, path, query, fragment = _split_rest(_special_authority(rest))
            return scheme, authority, remove_dot_segments(path), query, fragment
        ref = rest
    else:
        b = _base_parts(base) if base else None
    if b is None or b[0] is None:
        raise UrlRejected(RejectReason.MALFORMED, observed, "relative reference without an absolute base")
    if b[0].lower() in _SPECIAL:
        ref = _unbackslash(ref)
        if ref.startswith("//"):
            ref = _special_authority(ref)
    return _transform((None, *_split_rest(ref)), b)


# A frozen dataclass sets each field through object.__setattr__ (about 1.5 µs for ten fields here); writing
# the slots through their descriptors builds the same immutable object at half the cost on the hot path.
_new_object = object.__new__
_set_observed, _set_resolved, _set_fetch_key, _set_url, _set_scheme = (
    UrlIdentity.__dict__[name].__set__ for name in ("observed", "resolved", "fetch_key", "url", "scheme")
)
_set_host, _set_port, _set_origin, _set_domain, _set_fragment = (
    UrlIdentity.__dict__[name].__set__ for name in ("host", "port", "origin", "domain", "fragment")
)


def _make_identity(observed: str, resolved: str, key: str, scheme: str, auth: _Authority, fragment: str) -> UrlIdentity:
    """UrlIdentity(observed, resolved, key, key, scheme, host, port, origin, domain, fragment), fast."""
    identity: UrlIdentity = _new_object(UrlIdentity)
    _set_observed(identity, observed)
    _set_resolved(identity, resolved)
    _set_fetch_key(identity, key)
    _set_url(identity, key)
    _set_scheme(identity, scheme)
    _set_host(identity, auth.host)
    _set_port(identity, auth.port)
    _set_origin(identity, auth.origin)
    _set_domain(identity, auth.domain)
    _set_fragment(identity, fragment)
    return identity


def identify(
    observed: str,
    base: str = "",
    *,
    policy: QueryPolicy = DEFAULT_QUERY_POLICY,
    max_length: int = 2048,
    schemes: frozenset[str] = WEB_SCHEMES,
    scope: Callable[[UrlIdentity], bool] | None = None,
) -> UrlIdentity:
    """Resolve `observed` against `base` and build its identity; raise UrlRejected with a named reason.

    `scope`, when given, is asked last; False rejects the link as OUT_OF_SCOPE.
    """
    identity = _canonical_identity(observed, policy, max_length, schemes)
    if identity is None:
        identity = _identify_general(observed, base, policy, max_length, schemes)
    if scope is not None and not scope(identity):
        raise UrlRejected(RejectReason.OUT_OF_SCOPE, observed, "outside the crawl scope")
    return identity


def _canonical_identity(
    observed: str, policy: QueryPolicy, max_length: int, schemes: frozenset[str]
) -> UrlIdentity | None:
    """The identity of a common absolute http(s) link without the general passes, or None (then they run).

    One regular expression proves that cleaning, resolution and the escape and dot-segment passes would change
    nothing; what remains (the cached authority, the query policy, the key) is the general path's own code, so
    the result is the same identity.
    """
    m = _CANONICAL.fullmatch(observed)
    if m is None:
        return None
    scheme, authority, path, query, fragment = m.groups()
    scheme = "https" if len(scheme) == 5 else "http"  # the pattern's only two, in any case: one string each, shared
    if scheme not in schemes or (path and "/." in path):
        return None
    # The pattern allows only ASCII letters, digits and "_-.:" here, where case never matters (the host is lower-cased
    # and a port is digits): one cache entry serves every spelling, so a node with many hosts does not thrash it.
    auth = _authority(scheme, authority.lower())
    if auth.reason is not None:
        return None
    if query:
        query = policy.filter_query(query)
    key = f"{auth.origin}{path or '/'}?{query}" if query else f"{auth.origin}{path or '/'}"
    if len(key) > max_length:
        return None
    if key == observed:
        key = observed  # most links are written as their key: keep one string for both (caches and items hold it)
    return _make_identity(observed, observed, key, scheme, auth, fragment or "")


def _identify_general(
    observed: str, base: str, policy: QueryPolicy, max_length: int, schemes: frozenset[str]
) -> UrlIdentity:
    """identify() for any reference: the full normaliser (the fast path must agree with it)."""
    ref = _clean(observed, observed)
    m = _SPLIT.match(ref)
    assert m is not None
    scheme, authority, path, query, fragment = m.groups()
    if scheme is not None and scheme.lower() not in schemes:
        raise UrlRejected(RejectReason.BAD_SCHEME, observed, f"scheme {scheme.lower()!r} is not crawled")
    if len(ref) > _INPUT_CAP_FACTOR * max_length:
        raise UrlRejected(
            RejectReason.TOO_LONG, observed, f"reference of {len(ref)} characters, refused before parsing"
        )
    # Fast paths: no backslash, and either "scheme://host..." or a relative reference with no empty authority.
    if "\\" in ref or authority == "" or (scheme is not None and authority is None):
        scheme, authority, path, query, fragment = parts = _resolve_lenient(ref, base, observed)
        resolved = _recompose(parts)
    elif scheme is None:
        b = _base_parts(base) if base else None
        if b is None:
            raise UrlRejected(RejectReason.MALFORMED, observed, "relative reference without an absolute base")
        scheme, authority, path, query, fragment = parts = _transform((None, authority, path, query, fragment), b)
        resolved = _recompose(parts)
    elif "/." in path:
        path = remove_dot_segments(path)
        resolved = _recompose((scheme, authority, path, query, fragment))
    else:
        resolved = ref
    assert scheme is not None
    scheme = scheme.lower()
    if scheme not in schemes:
        raise UrlRejected(RejectReason.BAD_SCHEME, observed, f"scheme {scheme!r} is not crawled")
    if not authority:
        raise UrlRejected(RejectReason.BAD_HOST, observed, "no host")
    auth = _authority(scheme, authority)
    if auth.reason is not None:
        raise UrlRejected(auth.reason, observed, auth.detail)
    if _NOT_CLEAN.search(path) is not None or (query and _NOT_CLEAN.search(query) is not None):
        try:
            path = _PCT_OR_NOT_CLEAN.sub(_fix_escape, path)
            query = _PCT_OR_NOT_CLEAN.sub(_fix_escape, query) if query else query
        except UnicodeEncodeError:
            raise UrlRejected(RejectReason.MALFORMED, observed, "unpaired surrogate in URL") from None
    if "/." in path:
        path = remove_dot_segments(path)
    if query:
        query = policy.filter_query(query)
    key = f"{auth.origin}{path or '/'}?{query}" if query else f"{auth.origin}{path or '/'}"
    if len(key) > max_length:
        raise UrlRejected(RejectReason.TOO_LONG, observed, f"{len(key)} characters > {max_length}")
    return _make_identity(observed, resolved, key, scheme, auth, fragment or "")


def normalize(url: str, policy: QueryPolicy = DEFAULT_QUERY_POLICY) -> str:
    """The fetch key of an absolute http(s) URL (no length limit); raises UrlRejected like identify()."""
    return identify(url, policy=policy, max_length=1 << 62).fetch_key


def reference_key(reference: str, base: str) -> str | tuple[str, str]:
    """What resolving `reference` against `base` depends on, for caches of repeated links.

    The reference alone when absolute, with the base's origin when root-relative, else with the whole base;
    never the fragment (no fetch key holds one). Two links with equal keys have the same fetch key.
    """
    cut = reference.find("#")
    if cut > 0:
        reference = reference[:cut]
    if reference.startswith(("http://", "https://")):
        return reference
    if reference.startswith("/") and not reference.startswith("//"):
        return (reference, _origin_of(base))
    return (reference, base)


def _origin_of(base: str) -> str:
    """The scheme and authority a root-relative reference keeps of `base` (all of it when it has no "//", or no path
    after its authority)."""
    if "//" not in base:
        return base
    end = base.find("/", base.find("//") + 2)
    return base if end < 0 else base[:end]


def reference_keys(references: Iterable[str], base: str) -> list[str | tuple[str, str]]:
    """reference_key of each reference against one base (a page's links): the base's origin is found once, and the
    per-link test is written out here rather than called (a page has a hundred links and more)."""
    origin = _origin_of(base)
    out: list[str | tuple[str, str]] = []
    add = out.append
    for reference in references:
        cut = reference.find("#")
        if cut > 0:
            reference = reference[:cut]
        if reference.startswith(("http://", "https://")):
            add(reference)
        elif reference.startswith("/") and not reference.startswith("//"):
            add((reference, origin))
        else:
            add((reference, base))
    return out


def robots_url(origin: str) -> str:
    """Where an origin's robots.txt lives (RFC 9309 §2.3)."""
    return origin.rstrip("/") + "/robots.txt"


# The fetch key of an origin's robots.txt item: this prefix and the origin ("robots:https://example.com").
ROBOTS_PREFIX: Final = "robots:"


def domain_of(observed: str, base: str = "") -> str:
    """The registrable domain (the shard key) of a link, a fetch key or a robots key; "" when it is rejected.

    `observed` is resolved against `base` as identify() does. Without a base, a robots key (ROBOTS_PREFIX +
    origin) names its origin's domain; with one, `observed` is a link as written and no prefix is special.
    "" is never a domain: every URL that identify() accepts has a host.
    """
    if not base and observed.startswith(ROBOTS_PREFIX):
        observed = observed[len(ROBOTS_PREFIX) :]
    try:
        return identify(observed, base).domain
    except UrlRejected:
        return ""
