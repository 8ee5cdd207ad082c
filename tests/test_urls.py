"""URL identity kernel: RFC 3986 resolution, fetch-key normalization, query policy, rejections, domains."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hostring.domains import registrable_domain
from hostring.urls import (
    DEFAULT_QUERY_POLICY,
    ROBOTS_PREFIX,
    ParamClass,
    QueryPolicy,
    RejectReason,
    UrlIdentity,
    UrlRejected,
    domain_of,
    identify,
    normalize,
    remove_dot_segments,
    resolve,
    robots_url,
)

RFC_BASE = "http://a/b/c/d;p?q"

# ---------------------------------------------------------------- RFC 3986 §5.4: resolution examples

# §5.4.1 Normal Examples, in the order of the RFC.
NORMAL_EXAMPLES = [
    ("g:h", "g:h"),
    ("g", "http://a/b/c/g"),
    ("./g", "http://a/b/c/g"),
    ("g/", "http://a/b/c/g/"),
    ("/g", "http://a/g"),
    ("//g", "http://g"),
    ("?y", "http://a/b/c/d;p?y"),
    ("g?y", "http://a/b/c/g?y"),
    ("#s", "http://a/b/c/d;p?q#s"),
    ("g#s", "http://a/b/c/g#s"),
    ("g?y#s", "http://a/b/c/g?y#s"),
    (";x", "http://a/b/c/;x"),
    ("g;x", "http://a/b/c/g;x"),
    ("g;x?y#s", "http://a/b/c/g;x?y#s"),
    ("", "http://a/b/c/d;p?q"),
    (".", "http://a/b/c/"),
    ("./", "http://a/b/c/"),
    ("..", "http://a/b/"),
    ("../", "http://a/b/"),
    ("../g", "http://a/b/g"),
    ("../..", "http://a/"),
    ("../../", "http://a/"),
    ("../../g", "http://a/g"),
]

# §5.4.2 Abnormal Examples, in the order of the RFC ("http:g" is the strict parser's answer).
ABNORMAL_EXAMPLES = [
    ("../../../g", "http://a/g"),
    ("../../../../g", "http://a/g"),
    ("/./g", "http://a/g"),
    ("/../g", "http://a/g"),
    ("g.", "http://a/b/c/g."),
    (".g", "http://a/b/c/.g"),
    ("g..", "http://a/b/c/g.."),
    ("..g", "http://a/b/c/..g"),
    ("./../g", "http://a/b/g"),
    ("./g/.", "http://a/b/c/g/"),
    ("g/./h", "http://a/b/c/g/h"),
    ("g/../h", "http://a/b/c/h"),
    ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
    ("g;x=1/../y", "http://a/b/c/y"),
    ("g?y/./x", "http://a/b/c/g?y/./x"),
    ("g?y/../x", "http://a/b/c/g?y/../x"),
    ("g#s/./x", "http://a/b/c/g#s/./x"),
    ("g#s/../x", "http://a/b/c/g#s/../x"),
    ("http:g", "http:g"),
]


@pytest.mark.parametrize(("reference", "target"), NORMAL_EXAMPLES)
def test_rfc3986_normal_examples(reference: str, target: str) -> None:
    assert resolve(reference, RFC_BASE) == target


@pytest.mark.parametrize(("reference", "target"), ABNORMAL_EXAMPLES)
def test_rfc3986_abnormal_examples(reference: str, target: str) -> None:
    assert resolve(reference, RFC_BASE) == target


@pytest.mark.parametrize(
    ("reference", "target"),
    [e for e in NORMAL_EXAMPLES + ABNORMAL_EXAMPLES if e[0] not in ("g:h", "", "http:g")],
)
def test_identify_resolves_like_the_rfc(reference: str, target: str) -> None:
    """The http examples keep their RFC target as `resolved` (g:h is not http, "" is an empty link)."""
    assert identify(reference, RFC_BASE).resolved == target


def test_identify_reads_same_scheme_reference_as_relative_like_browsers() -> None:
    """§5.2.2 allows the non-strict reading for backward compatibility; browsers use it."""
    assert identify("http:g", RFC_BASE).resolved == "http://a/b/c/g"


def test_resolve_needs_an_absolute_base() -> None:
    with pytest.raises(ValueError, match="absolute"):
        resolve("g", "/relative/base")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a/b/c/./../../g", "/a/g"),  # §5.2.4 example 1
        ("mid/content=5/../6", "mid/6"),  # §5.2.4 example 2
        ("", ""),
        ("/", "/"),
        ("/..", "/"),
        ("/a/..", "/"),
        ("/a//../b", "/a/b"),
        ("/.hidden/x", "/.hidden/x"),
        ("a/../b", "/b"),
        ("../a", "a"),
    ],
)
def test_remove_dot_segments(path: str, expected: str) -> None:
    assert remove_dot_segments(path) == expected


def _remove_dot_segments_oracle(path: str) -> str:
    """§5.2.4 transcribed literally, string buffers and all: the reference the fast version must match."""
    inp, out = path, ""
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith("./"):
            inp = inp[2:]
        elif inp.startswith("/./"):
            inp = "/" + inp[3:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = "/" + inp[4:]
            out = out[: max(out.rfind("/"), 0)]
        elif inp == "/..":
            inp = "/"
            out = out[: max(out.rfind("/"), 0)]
        elif inp in (".", ".."):
            inp = ""
        else:
            j = inp.find("/", 1 if inp.startswith("/") else 0)
            j = len(inp) if j < 0 else j
            out, inp = out + inp[:j], inp[j:]
    return out


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "c.d", ".e", "f.."]), max_size=10), st.booleans())
def test_remove_dot_segments_matches_the_rfc_algorithm(segments: list[str], absolute: bool) -> None:
    path = ("/" if absolute else "") + "/".join(segments)
    assert remove_dot_segments(path) == _remove_dot_segments_oracle(path)


# ---------------------------------------------------------------- normalization (§6.2.2)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        # case: scheme and host lower-cased, path case kept
        ("HTTP://Example.COM/Path/To/Page", "http://example.com/Path/To/Page"),
        # IDNA: to the A-label, UTS #46 mapping (case, full-width forms, ideographic full stop)
        ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://XN--BCHER-KVA.example/", "http://xn--bcher-kva.example/"),
        ("http://\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com/", "http://example.com/"),  # full-width
        ("http://bücher。example/", "http://xn--bcher-kva.example/"),
        ("http://fa\u00df.de/", "http://xn--fa-hia.de/"),  # nontransitional: ß stays ß
        ("http://%62%C3%BCcher.example/", "http://xn--bcher-kva.example/"),
        # default ports removed, others kept; an empty port means the default
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/", "https://example.com/"),
        ("http://example.com:443/", "http://example.com:443/"),
        ("https://example.com:8443/", "https://example.com:8443/"),
        ("http://example.com:/", "http://example.com/"),
        ("http://example.com:0080/", "http://example.com/"),
        # dot segments, also percent-encoded ones
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/a/%2E%2e/b", "http://example.com/b"),
        ("http://example.com/../../x", "http://example.com/x"),
        # percent-encoding: hex upper-cased, unreserved decoded, reserved kept escaped
        ("http://example.com/%7euser", "http://example.com/~user"),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/%41%62%2D%5F%2e", "http://example.com/Ab-_."),
        ("http://example.com/%e2%82%ac", "http://example.com/%E2%82%AC"),
        ("http://example.com/?q=%3d%7E", "http://example.com/?q=%3D~"),
        # characters that must be escaped: spaces, non-ASCII (UTF-8), and a "%" that escapes nothing
        ("http://example.com/a b/ü?q=ä b", "http://example.com/a%20b/%C3%BC?q=%C3%A4%20b"),
        ("http://example.com/€", "http://example.com/%E2%82%AC"),
        ("http://example.com/100%/x%zz", "http://example.com/100%25/x%25zz"),
        ('http://example.com/a"b<c>{d}|e^f`', "http://example.com/a%22b%3Cc%3E%7Bd%7D%7Ce%5Ef%60"),
        ("http://example.com/?a[]=1", "http://example.com/?a%5B%5D=1"),
        # empty path becomes "/"
        ("http://example.com", "http://example.com/"),
        ("http://example.com?x=1", "http://example.com/?x=1"),
        # not normalized: trailing slash, path case, query order and content
        ("http://example.com/dir/", "http://example.com/dir/"),
        ("http://example.com/dir", "http://example.com/dir"),
        ("http://example.com/A/b", "http://example.com/A/b"),
        ("http://example.com/?b=2&a=1&B=3", "http://example.com/?b=2&a=1&B=3"),
        ("http://example.com/?a=1&&b=+x", "http://example.com/?a=1&&b=+x"),
        # a lone "?" is dropped; the fragment never reaches the key
        ("http://example.com/x?", "http://example.com/x"),
        ("http://example.com/x#frag", "http://example.com/x"),
        ("http://example.com/x?#frag", "http://example.com/x"),
        # host: trailing dot stripped, IPv4 in WHATWG forms, IPv6 compressed and lower-cased
        ("http://example.com./", "http://example.com/"),
        ("http://127.0.0.1/", "http://127.0.0.1/"),
        ("http://127.1/", "http://127.0.0.1/"),
        ("http://0x7F.0.0.1/", "http://127.0.0.1/"),
        ("http://2130706433/", "http://127.0.0.1/"),
        ("http://[2001:DB8:0:0:0:0:0:1]:8080/", "http://[2001:db8::1]:8080/"),
        ("http://[::FFFF:192.0.2.1]/", "http://[::ffff:c000:201]/"),
        # host labels seen on the real web that strict IDNA would refuse
        ("http://my_host.example.com/", "http://my_host.example.com/"),
        ("http://r3---sn-abc.googlevideo.com/v", "http://r3---sn-abc.googlevideo.com/v"),
    ],
)
def test_normalize(url: str, key: str) -> None:
    assert normalize(url) == key


def test_query_keeps_order_and_spelling_after_dropping_trackers() -> None:
    url = "http://example.com/s?utm_source=news&Z=1&gclid=abc&a=2&UTM_Medium=x&sessionid=9&q=Hello+World"
    assert normalize(url) == "http://example.com/s?Z=1&a=2&q=Hello+World"


def test_query_of_only_trackers_leaves_no_question_mark() -> None:
    assert normalize("http://example.com/?utm_source=a&fbclid=b") == "http://example.com/"
    assert normalize("http://example.com/?PHPSESSID=abc") == "http://example.com/"


def test_escaped_tracker_name_is_still_a_tracker() -> None:
    assert normalize("http://example.com/?utm%5Fsource=a&x=1") == "http://example.com/?x=1"


def test_parameter_named_like_a_tracker_prefix_but_different_is_kept() -> None:
    assert normalize("http://example.com/?utmost=1&gclidx=2&sid2=3") == "http://example.com/?utmost=1&gclidx=2&sid2=3"


# ---------------------------------------------------------------- identify: the three forms of a link


def test_identify_keeps_observed_resolved_and_key_apart() -> None:
    base = "https://Shop.Example.co.uk/cat/list.html?page=2"
    observed = "  ../Item/%7e42?utm_source=mail&color=Red&sessionid=XYZ#reviews "
    ident = identify(observed, base)
    assert ident.observed == observed
    assert ident.resolved == "https://Shop.Example.co.uk/Item/%7e42?utm_source=mail&color=Red&sessionid=XYZ#reviews"
    assert ident.fetch_key == "https://shop.example.co.uk/Item/~42?color=Red"
    assert ident.url == ident.fetch_key
    assert ident.scheme == "https"
    assert ident.host == "shop.example.co.uk"
    assert ident.port == 443
    assert ident.origin == "https://shop.example.co.uk"
    assert ident.domain == "example.co.uk"
    assert ident.fragment == "reviews"


def test_identify_without_fragment_has_empty_fragment() -> None:
    assert identify("http://example.com/a").fragment == ""
    assert identify("http://example.com/a#").fragment == ""


def test_identify_origin_and_port() -> None:
    ident = identify("http://[::1]:8080/x")
    assert (ident.host, ident.port, ident.origin, ident.domain) == ("::1", 8080, "http://[::1]:8080", "::1")
    ident = identify("https://example.com:8443/")
    assert (ident.port, ident.origin) == (8443, "https://example.com:8443")
    assert identify("http://example.com/").port == 80


def test_fetch_key_is_a_fixed_point() -> None:
    ident = identify("HTTP://BÜCHER.example:80/a/../%7eb?utm_source=x&k=v#f")
    again = identify(ident.fetch_key)
    assert again.fetch_key == ident.fetch_key
    assert again.resolved == ident.fetch_key


def test_identity_is_a_frozen_value() -> None:
    ident = identify("/a?b=1#c", "http://example.com/")
    rebuilt = UrlIdentity(
        observed=ident.observed,
        resolved=ident.resolved,
        fetch_key=ident.fetch_key,
        url=ident.url,
        scheme=ident.scheme,
        host=ident.host,
        port=ident.port,
        origin=ident.origin,
        domain=ident.domain,
        fragment=ident.fragment,
    )
    assert ident == rebuilt
    assert hash(ident) == hash(rebuilt)
    assert dataclasses.asdict(ident)["fetch_key"] == "http://example.com/a?b=1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ident.fetch_key = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("observed", "resolved"),
    [
        # WHATWG: surrounding whitespace stripped, tab and newline removed anywhere
        ("  \t/a/b\n ", "http://example.com/a/b"),
        ("/a\t/b\r\n/c", "http://example.com/a/b/c"),
        ("http://exa\nmple.com/x", "http://example.com/x"),
        # backslashes are slashes before the query in http(s)...
        ("\\a\\b", "http://example.com/a/b"),
        ("\\\\other.example\\x", "http://other.example/x"),
        ("https:\\\\other.example\\y", "https://other.example/y"),
        # ...and not after it
        ("/x?a\\b", "http://example.com/x?a\\b"),
        # any run of slashes after an http(s) scheme introduces the authority
        ("https:other.example/z", "https://other.example/z"),
        ("https:///other.example/z", "https://other.example/z"),
        ("///other.example/z", "http://other.example/z"),
        # same scheme as the base without "//": a relative reference
        ("http:z", "http://example.com/dir/z"),
        ("http:/z", "http://example.com/z"),
        # a colon after a non-scheme prefix is part of a relative path
        ("a b:c", "http://example.com/dir/a b:c"),
        ("1x:y", "http://example.com/dir/1x:y"),
    ],
)
def test_browser_leniency(observed: str, resolved: str) -> None:
    assert identify(observed, "http://example.com/dir/page").resolved == resolved


def test_backslash_in_query_is_escaped_in_the_key() -> None:
    assert identify("/x?a\\b", "http://example.com/").fetch_key == "http://example.com/x?a%5Cb"


def test_base_is_cleaned_like_a_reference() -> None:
    assert identify("g", " HTTP:\\\\Example.com\\a\\b ").fetch_key == "http://example.com/a/g"


# ---------------------------------------------------------------- rejections, each with its reason


@pytest.mark.parametrize(
    ("observed", "reason"),
    [
        ("", RejectReason.EMPTY),
        ("   \t\n", RejectReason.EMPTY),
        ("http://example.com/a\x00b", RejectReason.MALFORMED),
        ("http://example.com/\x7f", RejectReason.MALFORMED),
        ("/relative/without/base", RejectReason.MALFORMED),
        ("http://example.com/\ud800", RejectReason.MALFORMED),
        ("mailto:someone@example.com", RejectReason.BAD_SCHEME),
        ("javascript:void(0)", RejectReason.BAD_SCHEME),
        ("data:text/html,<b>x</b>", RejectReason.BAD_SCHEME),
        ("ftp://example.com/file", RejectReason.BAD_SCHEME),
        ("tel:+441234", RejectReason.BAD_SCHEME),
        ("http://user:pass@example.com/", RejectReason.USERINFO),
        ("http://user@example.com/", RejectReason.USERINFO),
        ("http://@example.com/", RejectReason.USERINFO),
        ("http://example.com:99999/", RejectReason.BAD_PORT),
        ("http://example.com:0/", RejectReason.BAD_PORT),
        ("http://example.com:8o/", RejectReason.BAD_PORT),
        ("http://example.com:-1/", RejectReason.BAD_PORT),
        ("http://example.com:\uff11\uff12/", RejectReason.BAD_PORT),  # full-width digits
        ("http://[::1]:x/", RejectReason.BAD_PORT),
        ("http://", RejectReason.BAD_HOST),
        ("http://:80/", RejectReason.BAD_HOST),
        ("http://exa mple.com/", RejectReason.BAD_HOST),
        ("http://exa<mple.com/", RejectReason.BAD_HOST),
        ("http://a..b/", RejectReason.BAD_HOST),
        ("http://.example.com/", RejectReason.BAD_HOST),
        ("http://" + "a" * 64 + ".example/", RejectReason.BAD_HOST),
        ("http://" + "a." * 127 + "example/", RejectReason.BAD_HOST),
        ("http://1.2.3.256/", RejectReason.BAD_HOST),
        ("http://1.2.3.4.5/", RejectReason.BAD_HOST),
        ("http://example.123/", RejectReason.BAD_HOST),
        ("http://[1::2::3]/", RejectReason.BAD_HOST),
        ("http://[::1/", RejectReason.BAD_HOST),
        ("http://[::1]x/", RejectReason.BAD_HOST),
        ("http://[fe80::1%25eth0]/", RejectReason.BAD_HOST),
        ("http://[v1.fe]/", RejectReason.BAD_HOST),
        ("http://xn--zz.example/", RejectReason.BAD_HOST),
        ("http://bü\u200dcher.example/", RejectReason.BAD_HOST),
        ("http://%ff.example/", RejectReason.BAD_HOST),
        ("http://example.com/" + "a" * 2100, RejectReason.TOO_LONG),
        ("http://example.com/?q=" + "x" * 40_000, RejectReason.TOO_LONG),
    ],
)
def test_rejections_name_their_reason(observed: str, reason: RejectReason) -> None:
    with pytest.raises(UrlRejected) as caught:
        identify(observed)
    assert caught.value.reason is reason
    assert caught.value.url == observed
    assert reason.value in str(caught.value)


def test_out_of_scope_is_decided_by_the_scope_hook() -> None:
    def same_site(ident: UrlIdentity) -> bool:
        return ident.domain == "example.com"

    assert identify("http://www.example.com/", scope=same_site).domain == "example.com"
    with pytest.raises(UrlRejected) as caught:
        identify("http://elsewhere.org/", scope=same_site)
    assert caught.value.reason is RejectReason.OUT_OF_SCOPE


def test_length_limit_counts_the_key_not_the_dropped_parts() -> None:
    long_tracker = "http://example.com/a?utm_content=" + "x" * 3000 + "#" + "y" * 3000
    assert identify(long_tracker).fetch_key == "http://example.com/a"
    assert len(identify("http://example.com/" + "a" * 90, max_length=109).fetch_key) == 109
    with pytest.raises(UrlRejected) as caught:
        identify("http://example.com/" + "a" * 90, max_length=108)
    assert caught.value.reason is RejectReason.TOO_LONG


def test_scheme_set_is_configurable() -> None:
    assert identify("ftp://example.com/f", schemes=frozenset({"ftp"})).fetch_key == "ftp://example.com/f"
    with pytest.raises(UrlRejected) as caught:
        identify("https://example.com/", schemes=frozenset({"http"}))
    assert caught.value.reason is RejectReason.BAD_SCHEME


def test_rejected_from_relative_reference_on_non_http_base() -> None:
    with pytest.raises(UrlRejected) as caught:
        identify("x", "ftp://example.com/dir/")
    assert caught.value.reason is RejectReason.BAD_SCHEME


def test_url_rejected_is_a_value_error_with_a_clear_message_and_pickles() -> None:
    err = UrlRejected(RejectReason.USERINFO, "http://u@x/", "credentials")
    assert isinstance(err, ValueError)
    assert str(err) == "URL rejected (userinfo): credentials: 'http://u@x/'"
    back = pickle.loads(pickle.dumps(err))
    assert (back.reason, back.url, back.detail) == (err.reason, err.url, err.detail)
    assert len(str(UrlRejected(RejectReason.TOO_LONG, "x" * 10_000))) < 300


# ---------------------------------------------------------------- query policy


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("utm_source", ParamClass.TRACKING),
        ("UTM_Campaign", ParamClass.TRACKING),
        ("gclid", ParamClass.TRACKING),
        ("fbclid", ParamClass.TRACKING),
        ("msclkid", ParamClass.TRACKING),
        ("mc_cid", ParamClass.TRACKING),
        ("_ga", ParamClass.TRACKING),
        ("yclid", ParamClass.TRACKING),
        ("igshid", ParamClass.TRACKING),
        ("sessionid", ParamClass.SESSION),
        ("PHPSESSID", ParamClass.SESSION),
        ("jsessionid", ParamClass.SESSION),
        ("sid", ParamClass.SESSION),
        ("CFTOKEN", ParamClass.SESSION),
        ("page", ParamClass.CONTENT),
        ("id", ParamClass.CONTENT),
        ("q", ParamClass.CONTENT),
        ("color", ParamClass.UNKNOWN),
        ("", ParamClass.UNKNOWN),
    ],
)
def test_default_policy_classifies(name: str, cls: ParamClass) -> None:
    assert DEFAULT_QUERY_POLICY.classify(name) is cls


def test_custom_policy_changes_the_key() -> None:
    strict = QueryPolicy(
        tracking_prefixes=("Ref_",),
        tracking_names=frozenset({"From"}),
        session_names=frozenset(),
        content_names=frozenset({"id"}),
    )
    assert strict.classify("ref_x") is ParamClass.TRACKING
    url = "http://example.com/?id=1&from=home&ref_a=2&utm_source=x"
    assert normalize(url, strict) == "http://example.com/?id=1&utm_source=x"
    assert identify(url, policy=strict).fetch_key == "http://example.com/?id=1&utm_source=x"


# ---------------------------------------------------------------- properties (hypothesis)

_UNRESERVED = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"
_SEGMENT_CHARS = _UNRESERVED + "!$&'()*+,;=:@ %é€/\\\"<>[]^`{|}"
_QUERY_CHARS = _UNRESERVED + "!$'()*+,;:@/? %é€\"<>[]^`{|}"

labels = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
idn_labels = st.sampled_from(["bücher", "münchen", "faß", "日本", "пример", "xn--bcher-kva"])
hosts = st.builds(
    lambda parts, tld: ".".join([*parts, tld]),
    st.lists(st.one_of(labels, idn_labels), min_size=1, max_size=3),
    st.sampled_from(["com", "org", "co.uk", "github.io", "de", "example"]),
) | st.sampled_from(["127.0.0.1", "[::1]", "[2001:db8::7]", "localhost"])
segments = st.text(_SEGMENT_CHARS, max_size=8) | st.sampled_from([".", "..", "%2e", "%2E%2e", "%7E", "%2f"])
params = st.tuples(
    st.sampled_from(["q", "page", "id", "utm_source", "gclid", "sessionid", "a", "B", "x y", "é"]),
    st.text(_QUERY_CHARS, max_size=6),
)


@st.composite
def urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080", ":"]))
    path = "/" + "/".join(draw(st.lists(segments, max_size=5)))
    query = ""
    if draw(st.booleans()):
        query = "?" + "&".join(f"{k}={v}" for k, v in draw(st.lists(params, max_size=4)))
    fragment = draw(st.sampled_from(["", "#", "#top", "#a b"]))
    return f"{scheme}://{draw(hosts)}{port}{path}{query}{fragment}"


def _key_or_none(url: str) -> str | None:
    try:
        return normalize(url)
    except UrlRejected:
        return None


@settings(max_examples=400, deadline=None)
@given(urls())
def test_normalize_is_idempotent(url: str) -> None:
    key = _key_or_none(url)
    assume(key is not None)
    assert normalize(key) == key  # type: ignore[arg-type]


@st.composite
def respellings(draw: st.DrawFn) -> tuple[str, str]:
    """A canonical-ish URL and an equivalent spelling of it: random case in scheme and host, random
    escapes of unreserved characters, the default port written out, "/./" inserted, a tracker added.
    """
    scheme = draw(st.sampled_from(["http", "https"]))
    host = draw(st.lists(labels, min_size=1, max_size=3).map(".".join)) + ".example"
    segs = draw(st.lists(st.text(_UNRESERVED.replace(".", ""), min_size=1, max_size=6), min_size=0, max_size=4))
    query_params = draw(st.lists(st.tuples(st.sampled_from(["q", "id", "p", "z"]), labels), max_size=3))
    path = "/" + "/".join(segs)
    query = "&".join(f"{k}={v}" for k, v in query_params)
    original = f"{scheme}://{host}{path}" + (f"?{query}" if query else "")

    def recase(text: str) -> str:
        flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
        return "".join(c.upper() if f else c for c, f in zip(text, flips, strict=True))

    def escape_some(text: str) -> str:
        out = []
        for c in text:
            if c in _UNRESERVED and draw(st.booleans()):
                out.append(draw(st.sampled_from([f"%{ord(c):02X}", f"%{ord(c):02x}"])))
            else:
                out.append(c)
        return "".join(out)

    variant_segs = [escape_some(s) for s in segs]
    if draw(st.booleans()):  # "/./" before a segment; a trailing "/." would add a trailing slash
        at = draw(st.integers(0, max(len(variant_segs) - 1, 0)))
        variant_segs.insert(at, ".")
    if draw(st.booleans()) and variant_segs:
        at = draw(st.integers(0, len(variant_segs) - 1))
        variant_segs.insert(at, "zz/..")
    port = draw(st.sampled_from(["", ":" + str({"http": 80, "https": 443}[scheme]), ":"]))
    variant_query = "&".join(f"{escape_some(k)}={escape_some(v)}" for k, v in query_params)
    if draw(st.booleans()):
        tracker = draw(st.sampled_from(["utm_source=x", "GCLID=1", "sessionid=abc", "fbclid="]))
        variant_query = f"{tracker}&{variant_query}" if variant_query else tracker
    variant = f"{recase(scheme)}://{recase(host)}{port}/" + "/".join(variant_segs)
    if variant_query or draw(st.booleans()):
        variant += "?" + variant_query
    variant += draw(st.sampled_from(["", "#", "#frag"]))
    return original, variant


@settings(max_examples=400, deadline=None)
@given(respellings())
def test_equivalent_spellings_share_one_fetch_key(pair: tuple[str, str]) -> None:
    original, variant = pair
    assert normalize(variant) == normalize(original)


relative_refs = st.lists(
    st.sampled_from(["a", "b", ".", "..", "", "c;p", "d.e", "%7E", "?q=1", "#f", "g?x#y"]), max_size=6
).map("/".join)


@settings(max_examples=300, deadline=None)
@given(relative_refs, st.sampled_from(["http://a/b/c/d;p?q", "https://h.example/", "http://h/x", "http://h"]))
def test_resolved_form_is_strict_rfc_resolution(ref: str, base: str) -> None:
    """identify's fast paths and its lenient resolver agree with the strict RFC algorithm on plain refs."""
    assume(not ref.startswith("//"))
    try:
        ident = identify(ref, base)
    except UrlRejected:
        return
    assert ident.resolved == resolve(ref, base)


# ---------------------------------------------------------------- robots and domains


def test_robots_url() -> None:
    assert robots_url("https://example.com") == "https://example.com/robots.txt"
    assert robots_url("http://[::1]:8080") == "http://[::1]:8080/robots.txt"
    assert robots_url(identify("HTTP://Example.com:80/a/b?c").origin) == "http://example.com/robots.txt"


def test_domain_of_links_keys_and_robots_keys() -> None:
    assert domain_of("https://www.Example.co.uk/a") == "example.co.uk"
    assert domain_of("/a?b", "http://shop.example.net/x") == "example.net"  # a link resolved against its page
    assert domain_of(ROBOTS_PREFIX + "http://img.example.org:8080") == "example.org"  # a robots item's key
    assert domain_of("http://127.0.0.1:9/") == "127.0.0.1"
    # rejected: "" (no registrable domain is empty)
    for bad in ("", "not a url", "ftp://example.com/", "http://user@example.com/", "/relative", ROBOTS_PREFIX):
        assert domain_of(bad) == "", bad
    # with a base the text is a link as written: "robots:" is just an unknown scheme there
    assert domain_of(ROBOTS_PREFIX + "http://example.org", "http://example.com/") == ""


@pytest.mark.parametrize(
    ("host", "domain"),
    [
        ("example.com", "example.com"),
        ("www.example.com", "example.com"),
        ("a.b.example.co.uk", "example.co.uk"),
        ("example.co.uk", "example.co.uk"),
        ("co.uk", "co.uk"),
        ("foo.github.io", "foo.github.io"),  # private section: each github.io site is its own domain
        ("bar.foo.github.io", "foo.github.io"),
        ("github.io", "github.io"),
        ("www.city.kobe.jp", "city.kobe.jp"),  # exception rule !city.kobe.jp
        ("a.b.xn--fiqs8s", "b.xn--fiqs8s"),  # .中国 as an A-label
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),  # unknown TLD counts as a public suffix
        ("WWW.Example.COM.", "example.com"),
        ("localhost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("10.1.2.3", "10.1.2.3"),
        ("::1", "::1"),
        ("2001:db8::1", "2001:db8::1"),
    ],
)
def test_registrable_domain(host: str, domain: str) -> None:
    assert registrable_domain(host) == domain


def test_public_suffix_list_loads_without_network() -> None:
    """The bundled list is read from the package; a process with sockets disabled can still use it."""
    code = textwrap.dedent(
        """
        import socket
        def refuse(*args, **kwargs):
            raise AssertionError("network access")
        socket.socket = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from hostring.domains import registrable_domain
        print(registrable_domain("a.b.example.co.uk"))
        """
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "example.co.uk"


@settings(max_examples=200, deadline=None)
@given(
    ref=st.sampled_from(
        ["/a", "/a/../b", "b", "../c", "?q=1", "#top", "/a#x", "http://h.example/z#f", "//other.example/p", "", "./d;p"]
    ),
    page1=st.sampled_from(
        [
            "http://h.example/",
            "http://h.example/x/y",
            "http://h.example/x/y?z",
            "https://h.example/",
            "http://h.example",
        ]
    ),
    page2=st.sampled_from(
        ["http://h.example/", "http://h.example/x/y", "http://h.example/q/", "https://h.example/", "http://h.examplf"]
    ),
)  # a base with no path after its authority (a <base href>) keeps all of it as its origin
def test_equal_reference_keys_mean_equal_fetch_keys(ref: str, page1: str, page2: str) -> None:
    from hostring.urls import reference_key

    if reference_key(ref, page1) != reference_key(ref, page2):
        return
    try:
        a = identify(ref, page1).fetch_key
    except UrlRejected as e:
        with pytest.raises(UrlRejected) as again:
            identify(ref, page2)
        assert again.value.reason == e.reason
        return
    assert identify(ref, page2).fetch_key == a


@settings(max_examples=200, deadline=None)
@given(
    refs=st.lists(
        st.sampled_from(
            ["/a", "/a/../b", "b", "../c", "?q=1", "#top", "/a#x", "http://h.example/z#f", "//other.example/p", "",
             "./d;p", "https://h.example", "#"]
        ),
        max_size=8,
    ),
    base=st.sampled_from(["http://h.example/", "http://h.example/x/y?z", "https://h.example:8443/q/", "h.example"]),
)  # fmt: skip
def test_reference_keys_of_a_page_are_each_links_reference_key(refs: list[str], base: str) -> None:
    """The per-page form (the base's origin found once) answers what reference_key answers link by link."""
    from hostring.urls import reference_key, reference_keys

    assert reference_keys(refs, base) == [reference_key(r, base) for r in refs]


# ---------------------------------------------------------------- the canonical fast path agrees with the normaliser

_NEAR_CANONICAL = st.builds(
    "{}://{}{}{}{}{}".format,
    st.sampled_from(["http", "https", "HTTP", "Https", "ftp", "http:", "htt"]),
    st.sampled_from(["site1.com", "SITE1.COM", "a_b.example", "127.1", "0x7f.0.0.1", "xn--bcher-kva.example",
                     "a..b", "a.com.", "", "-x.org", "a.com:80", "a.com:0443", "a.com:", "a.com:99999", "u@a.com",
                     "Site1.Com:80", "A_B.EXAMPLE:8080", "XN--BCHER-KVA.EXAMPLE", "A..B", "0X7F.0.0.1:0080"]),
    st.lists(st.sampled_from(["a", "b.c", ".", "..", ".x", "%7e", "%2F", "%", "~!$&'()*+,;=:@-_", ""]), max_size=4)
    .map(lambda segments: "".join("/" + s for s in segments)),
    st.sampled_from(["", "?", "?a=1", "?utm_source=x", "?a=1&gclid=2&b", "?x=%2f", "?q=a b", "??x"]),
    st.sampled_from(["", "#", "#sec-2", "#a#b", "#x y", "#\\", "#é"]),
    st.sampled_from(["", " ", "\t", "\\x"]),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(url=_NEAR_CANONICAL, max_length=st.sampled_from([2048, 24]))
def test_canonical_fast_path_gives_the_full_normalisers_answer(url: str, max_length: int) -> None:
    """identify()'s fast path for links already in canonical form answers exactly what the general path answers."""
    from hostring.urls import WEB_SCHEMES, _identify_general

    try:
        expected = _identify_general(url, "", DEFAULT_QUERY_POLICY, max_length, WEB_SCHEMES)
    except UrlRejected as e:
        with pytest.raises(UrlRejected) as got:
            identify(url, max_length=max_length)
        assert got.value.reason == e.reason
        return
    assert identify(url, max_length=max_length) == expected


@settings(max_examples=500, deadline=None)
@given(
    url=st.one_of(_NEAR_CANONICAL, st.sampled_from(["/a", "../b?utm_source=x", "//h.example/p", "#f", "mailto:x"])),
    base=st.sampled_from(["", "http://h.example/x/y", "HTTPS://H.EXAMPLE:443/q/"]),
    max_length=st.sampled_from([2048, 24]),
)
def test_fetch_target_is_identifys_answer(url: str, base: str, max_length: int) -> None:
    """fetch_target(), the frontier's way in, answers identify()'s key, host, origin and domain, or its rejection."""
    from hostring.targets import FetchTarget, fetch_target

    try:
        ident = identify(url, base, max_length=max_length)
    except UrlRejected as e:
        with pytest.raises(UrlRejected) as got:
            fetch_target(url, base, max_length=max_length)
        assert got.value.reason == e.reason
        return
    assert ident.url == ident.fetch_key
    assert fetch_target(url, base, max_length=max_length) == FetchTarget(
        ident.fetch_key, ident.host, ident.origin, ident.domain
    )


def test_canonical_fast_path_takes_the_common_links() -> None:
    """The plain spellings of a crawl's links (upper case, default port, tracking query, fragment) take it."""
    from hostring.urls import _canonical_identity

    for url in ["http://site1.com/p/1", "HTTP://SITE1.COM/p/1", "http://site1.com:80/p/1",
                "http://site1.com/p/1?utm_source=x", "https://a.example/x?q=1#top", "http://a.example"]:  # fmt: skip
        fast = _canonical_identity(url, DEFAULT_QUERY_POLICY, 2048, frozenset({"http", "https"}))
        assert fast is not None and fast == identify(url)
    for url in ["http://a.example/./x", "http://a.example/%7e", "http://a.example/p?", " http://a.example/"]:
        assert _canonical_identity(url, DEFAULT_QUERY_POLICY, 2048, frozenset({"http", "https"})) is None
