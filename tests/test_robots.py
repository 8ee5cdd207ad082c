"""Robots policy of the frontier core: RFC 9309 status rules, matching, group choice, caps, persistence."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from protego import Protego

from frontier_node.core.robots import (
    MAX_CACHE_S,
    MAX_ROBOTS_BYTES,
    RobotsPolicy,
    RobotsRecord,
    RobotsVerdict,
)

UA = "hostring/0.1 (+https://hostring.example/bot)"
ORIGIN = "https://a.example"
NOW = 1_000_000.0


def policy(**kwargs: float) -> RobotsPolicy:
    return RobotsPolicy(UA, **kwargs)


def parsed(text: str | bytes, *, pol: RobotsPolicy | None = None, status: int = 200) -> RobotsRecord:
    body = text.encode() if isinstance(text, str) else text
    return (pol or policy()).from_outcome(ORIGIN, status=status, body=body, error_class="", now=NOW)


# ---------------------------------------------------------------- product token


@pytest.mark.parametrize(
    ("user_agent", "token"),
    [
        ("hostring/0.1 (+https://x)", "hostring"),
        ("hostring", "hostring"),
        ("  Host_Ring-bot/2 extra/1", "Host_Ring-bot"),
    ],
)
def test_product_token_is_the_first_product_name(user_agent: str, token: str) -> None:
    assert RobotsPolicy(user_agent).product_token == token


@pytest.mark.parametrize("user_agent", ["", "   ", "bot2/1.0", "/1.0", "hôst/1"])
def test_user_agent_without_a_valid_product_token_is_refused(user_agent: str) -> None:
    with pytest.raises(ValueError, match="product token"):
        RobotsPolicy(user_agent)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cache_s": 0},
        {"cache_s": MAX_CACHE_S + 1},
        {"cache_s": float("nan")},
        {"error_retry_s": 0},
        {"error_retry_s": float("inf")},
        {"max_crawl_delay_s": -1},
        {"max_crawl_delay_s": float("inf")},
    ],
)
def test_policy_refuses_out_of_range_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        policy(**kwargs)


# ---------------------------------------------------------------- RFC 9309 §2.3 status rules


def test_2xx_parses_rules() -> None:
    rec = parsed("User-agent: *\nDisallow: /private\n")
    assert rec.verdict is RobotsVerdict.RULES
    assert rec.http_status == 200
    assert rec.expires_at == NOW + MAX_CACHE_S
    assert not rec.allowed(f"{ORIGIN}/private/x")
    assert rec.allowed(f"{ORIGIN}/public")
    assert rec.describe() == "rules(200)"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
def test_4xx_is_unavailable_and_allows_all(status: int) -> None:
    rec = parsed("User-agent: *\nDisallow: /\n", status=status)
    assert rec.verdict is RobotsVerdict.ALLOW_ALL
    assert rec.allowed(f"{ORIGIN}/anything")
    assert rec.expires_at == NOW + MAX_CACHE_S
    assert rec.body == b""
    assert rec.describe() == f"allow_all({status})"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_3xx_after_the_hop_limit_is_unavailable_and_allows_all(status: int) -> None:
    rec = parsed("", status=status)
    assert rec.verdict is RobotsVerdict.ALLOW_ALL
    assert rec.allowed(f"{ORIGIN}/x")


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 599, 100, 600])
def test_429_5xx_and_unknown_statuses_are_unreachable_and_retried_soon(status: int) -> None:
    rec = policy(error_retry_s=90).from_outcome(
        ORIGIN, status=status, body=b"User-agent: *\nAllow: /\n", error_class="", now=NOW
    )
    assert rec.verdict is RobotsVerdict.DISALLOW_ALL
    assert not rec.allowed(f"{ORIGIN}/")
    assert not rec.allowed(f"{ORIGIN}/page")
    assert rec.expires_at == NOW + 90
    assert rec.describe() == f"disallow_all({status})"


@pytest.mark.parametrize("error_class", ["timeout", "connect_error", "dns_error", "tls_error"])
def test_no_response_disallows_all_and_is_retried_soon(error_class: str) -> None:
    rec = policy().from_outcome(ORIGIN, status=0, body=b"", error_class=error_class, now=NOW)
    assert rec.verdict is RobotsVerdict.DISALLOW_ALL
    assert rec.error_class == error_class
    assert not rec.allowed(f"{ORIGIN}/page")
    assert rec.expires_at == NOW + 60.0
    assert rec.describe() == f"disallow_all({error_class})"


def test_an_error_class_wins_over_a_status() -> None:
    rec = policy().from_outcome(
        ORIGIN, status=200, body=b"User-agent: *\nAllow: /\n", error_class="protocol_error", now=NOW
    )
    assert rec.verdict is RobotsVerdict.DISALLOW_ALL


def test_304_renews_the_previous_rules_and_is_unreachable_without_them() -> None:
    pol = policy()
    old = parsed("User-agent: *\nDisallow: /private\nCrawl-delay: 3\n", pol=pol)
    later = NOW + MAX_CACHE_S
    renewed = pol.from_outcome(ORIGIN, status=304, body=b"", error_class="", now=later, previous=old)
    assert renewed.verdict is RobotsVerdict.RULES
    assert renewed.expires_at == later + MAX_CACHE_S
    assert renewed.crawl_delay == 3.0
    assert not renewed.allowed("/private")
    assert renewed.describe() == "rules(304) delay=3.0"
    orphan = pol.from_outcome(ORIGIN, status=304, body=b"", error_class="", now=later)
    assert orphan.verdict is RobotsVerdict.DISALLOW_ALL
    with pytest.raises(ValueError, match="previous record"):
        pol.from_outcome("https://b.example", status=304, body=b"", error_class="", now=later, previous=old)


def test_expired_transitions_exactly_at_expires_at() -> None:
    pol = policy(cache_s=3600, error_retry_s=30)
    ok = parsed("User-agent: *\nAllow: /\n", pol=pol)
    assert not ok.expired(NOW)
    assert not ok.expired(NOW + 3599.999)
    assert ok.expired(NOW + 3600)
    bad = pol.from_outcome(ORIGIN, status=503, body=b"", error_class="", now=NOW)
    assert not bad.expired(NOW + 29.999)
    assert bad.expired(NOW + 30)


def test_a_non_finite_now_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        policy().from_outcome(ORIGIN, status=200, body=b"", error_class="", now=float("nan"))


@settings(max_examples=300)
@given(
    status=st.integers(min_value=0, max_value=999),
    error_class=st.sampled_from(["", "", "timeout", "connect_error"]),
    cache_s=st.floats(min_value=1e-3, max_value=MAX_CACHE_S),
    error_retry_s=st.floats(min_value=1e-3, max_value=MAX_CACHE_S),
    now=st.floats(min_value=0, max_value=4e9),
)
def test_every_record_expires_within_24_hours(
    status: int, error_class: str, cache_s: float, error_retry_s: float, now: float
) -> None:
    pol = RobotsPolicy(UA, cache_s=cache_s, error_retry_s=error_retry_s)
    rec = pol.from_outcome(ORIGIN, status=status, body=b"User-agent: *\n", error_class=error_class, now=now)
    assert now < rec.expires_at <= now + MAX_CACHE_S
    assert rec.expired(rec.expires_at)


# ---------------------------------------------------------------- RFC 9309 §2.2.2 matching


def test_longest_match_wins() -> None:
    rec = parsed("User-agent: *\nDisallow: /shop\nAllow: /shop/public\nDisallow: /shop/public/secret\n")
    assert not rec.allowed("/shop/cart")
    assert rec.allowed("/shop/public/item")
    assert not rec.allowed("/shop/public/secret/1")
    assert rec.allowed("/other")


def test_allow_wins_a_tie_of_equal_length() -> None:
    rec = parsed("User-agent: *\nDisallow: /page\nAllow: /page\nDisallow: /\nAllow: /\n")
    assert rec.allowed("/page")
    assert rec.allowed("/page/sub")
    assert rec.allowed("/elsewhere")
    # Equal length, in the other order in the file: still allow.
    rec = parsed("User-agent: *\nAllow: /a*c\nDisallow: /ab*\n")
    assert rec.allowed("/abc")


def test_dollar_anchors_the_end() -> None:
    rec = parsed("User-agent: *\nDisallow: /*.pdf$\nDisallow: /exact$\n")
    assert not rec.allowed("/docs/file.pdf")
    assert rec.allowed("/docs/file.pdf?download=1")
    assert rec.allowed("/docs/file.pdfx")
    assert not rec.allowed("/exact")
    assert rec.allowed("/exact/more")


def test_star_matches_any_sequence() -> None:
    rec = parsed("User-agent: *\nDisallow: /*/private/\nDisallow: /tmp*\nAllow: /*/private/ok\n")
    assert not rec.allowed("/a/b/private/x")
    assert rec.allowed("/a/private/ok")
    assert not rec.allowed("/tmpfile")
    assert rec.allowed("/private/")  # "/*/private/" needs a segment before /private/


@pytest.mark.parametrize(
    ("rule", "url"),
    [
        ("/foo/bar/%E3%83%84", "/foo/bar/\u30c4"),  # RFC 9309 §2.2.2 example
        ("/foo/bar/\u30c4", "/foo/bar/%E3%83%84"),
        ("/%7Euser", "/~user"),
        ("/~user", "/%7euser"),
        ("/a%2fb", "/a%2Fb"),  # an encoded slash stays encoded, case of hex digits does not matter
        ("/caf%C3%A9", "https://a.example/caf%c3%a9"),
    ],
)
def test_percent_encoding_is_equivalent(rule: str, url: str) -> None:
    rec = parsed(f"User-agent: *\nDisallow: {rule}\n")
    assert not rec.allowed(url)


def test_an_encoded_slash_is_not_a_slash() -> None:
    rec = parsed("User-agent: *\nDisallow: /a%2Fb\n")
    assert rec.allowed("/a/b")


def test_query_strings_are_matched() -> None:
    rec = parsed("User-agent: *\nDisallow: /*?sid=\nDisallow: /*&token=\nDisallow: /search?q=\nAllow: /search?q=ok\n")
    assert not rec.allowed("/cart?sid=42")
    assert rec.allowed("/cart?x=1&sid=42")  # "?sid=" is literal: here it is "&sid="
    assert not rec.allowed("/cart?x=1&token=7")  # "*" crosses from the path into the query
    assert rec.allowed("/cart?x=1")
    assert not rec.allowed(f"{ORIGIN}/search?q=shoes")
    assert rec.allowed(f"{ORIGIN}/search?q=ok&page=2")
    assert rec.allowed(f"{ORIGIN}/search")
    assert rec.allowed(f"{ORIGIN}/cart#?sessionid=1")  # the fragment is not matched


def test_robots_txt_itself_is_always_allowed() -> None:
    disallowing = parsed("User-agent: *\nDisallow: /\n")
    unreachable = policy().from_outcome(ORIGIN, status=503, body=b"", error_class="", now=NOW)
    for rec in (disallowing, unreachable):
        assert rec.allowed(f"{ORIGIN}/robots.txt")
        assert rec.allowed("/robots.txt")
        assert not rec.allowed(f"{ORIGIN}/robots.txt.bak")
        assert not rec.allowed(f"{ORIGIN}/dir/robots.txt")


def test_a_malformed_url_never_raises() -> None:
    rec = parsed("User-agent: *\nDisallow: /private\n")
    assert rec.allowed("http://[::1/robots.txt") is False  # urlsplit refuses it: refused, not raised
    assert rec.allowed("http://[::1/private") is False
    assert rec.allowed("http://[::1/public") is True  # only the path is matched


def test_empty_and_ruleless_files_allow_all() -> None:
    assert parsed("").allowed("/x")
    assert parsed("# only a comment\n").allowed("/x")
    assert parsed("User-agent: other\nDisallow: /\n").allowed("/x")  # no group for us, no "*"
    assert parsed("User-agent: *\nDisallow:\n").allowed("/x")  # empty disallow means nothing


def test_a_utf8_bom_does_not_hide_the_first_group() -> None:
    # protego alone reads "\ufeffUser-agent" as an unknown directive and drops the group.
    assert Protego.parse("\ufeffUser-agent: *\nDisallow: /private\n").can_fetch("/private", "hostring")
    rec = parsed(b"\xef\xbb\xbfUser-agent: *\nDisallow: /private\n")
    assert not rec.allowed("/private")


def _oracle(rules: list[tuple[str, str]], path: str) -> bool:
    """RFC 9309 by brute force: every matching rule, the longest pattern wins, allow wins a tie."""
    best_len, allow = -1, True
    for kind, pattern in rules:
        anchored = pattern.endswith("$")
        body = pattern[:-1] if anchored else pattern
        regex = ".*".join(re.escape(part) for part in body.split("*")) + (r"\Z" if anchored else "")
        if re.match(regex, path, re.DOTALL):
            is_allow = kind == "allow"
            if len(pattern) > best_len or (len(pattern) == best_len and is_allow):
                best_len, allow = len(pattern), is_allow
    return allow


_patterns = st.builds(
    lambda head, tail, anchor: head + tail + anchor,
    st.sampled_from(["/", "*", "/a", "/b"]),
    st.text(alphabet="ab/*", max_size=6),
    st.sampled_from(["", "", "$"]),
)


@settings(max_examples=400, deadline=None)
@given(
    rules=st.lists(st.tuples(st.sampled_from(["allow", "disallow"]), _patterns), min_size=1, max_size=6),
    paths=st.lists(st.text(alphabet="ab/", max_size=8).map(lambda p: "/" + p), min_size=1, max_size=8),
)
def test_matching_agrees_with_a_brute_force_oracle(rules: list[tuple[str, str]], paths: list[str]) -> None:
    text = "User-agent: *\n" + "".join(f"{kind}: {pattern}\n" for kind, pattern in rules)
    rec = parsed(text)
    for path in paths:
        # Absolute URLs, as at dispatch: a bare "//x" would read as a network-path reference.
        assert rec.allowed(ORIGIN + path) == _oracle(rules, path), (text, path)


# ---------------------------------------------------------------- RFC 9309 §2.2.1 group choice

_HOST_GROUP = "User-agent: host\nDisallow: /\n\nUser-agent: *\nDisallow: /star-only\n"


def test_protego_alone_applies_a_group_named_by_a_prefix_of_our_token() -> None:
    raw = Protego.parse(_HOST_GROUP)
    # The "host" group takes the whole site away from "hostring", a different crawler.
    assert not raw.can_fetch(f"{ORIGIN}/page", "hostring")
    assert not raw.can_fetch(f"{ORIGIN}/page", UA)


def test_protego_merges_repeated_groups_as_the_record_does() -> None:
    """A canary for what the record relies on, through protego's public API: groups keyed by lower-cased
    user-agent value and merged, one group for both spellings (so "/c" stays open: no other group applies)."""
    raw = Protego.parse("User-agent: HostRing\nDisallow: /a\n\nUser-agent: hostring\nDisallow: /b\n")
    assert not raw.can_fetch(f"{ORIGIN}/a", "hostring") and not raw.can_fetch(f"{ORIGIN}/b", "hostring")
    assert raw.can_fetch(f"{ORIGIN}/c", "hostring")
    rec = parsed("User-agent: HostRing\nDisallow: /a\n\nUser-agent: hostring\nDisallow: /b\n")
    assert not rec.allowed("/a") and not rec.allowed("/b") and rec.allowed("/c")


def test_a_group_named_by_a_prefix_of_our_token_does_not_apply() -> None:
    rec = parsed(_HOST_GROUP)
    assert rec.allowed(f"{ORIGIN}/page")
    assert not rec.allowed(f"{ORIGIN}/star-only")


@pytest.mark.parametrize(
    "name", ["hostring", "HostRing", "HOSTRING", "  hostring  ", "hostring/0.1", "HostRing/2 (+http://x)", "hostring*"]
)
def test_our_group_applies_case_insensitively(name: str) -> None:
    """Also when the value goes on after the token (a version, a comment): its token is its leading letters, '_'
    and '-', as the RFC's reference parser reads it (a site naming `hostring/0.1` means us)."""
    rec = parsed(f"User-agent: {name}\nDisallow: /ours\n\nUser-agent: *\nDisallow: /\n")
    assert not rec.allowed("/ours")
    assert rec.allowed("/theirs")  # only our group: the "*" group's "Disallow: /" does not apply


@pytest.mark.parametrize("name", ["hostrings", "hostring-bot", "hostring_x", "xhostring", "ring", "*hostring"])
def test_other_tokens_do_not_apply(name: str) -> None:
    rec = parsed(f"User-agent: {name}\nDisallow: /\n\nUser-agent: *\nDisallow: /star\n")
    assert rec.allowed("/page")
    assert not rec.allowed("/star")


# Lines as robots files write them, in the forms protego reads: group boundaries must fall where protego puts
# them. No group is named by a proper prefix of "hostring" here, so protego's own choice is the RFC's.
_GROUP_LINES = st.one_of(
    st.builds(
        str.format,
        st.sampled_from(["User-agent: {}", "user agent {}", "useragent:{}", "USER-AGENT : {} # c", "User-agent {}"]),
        st.sampled_from(["hostring", "HostRing", "*", "other", "hostrings", "ring", "hostring*", "", "**"]),
    ),
    st.builds(
        str.format,
        st.sampled_from(["Allow: {}", "Disallow: {}", "disalow: {}", "disallow {}", "Disallow:", "Allow: {} # x"]),
        st.sampled_from(["/", "/a", "/b/", "/a*", "/b$"]),
    ),
    st.sampled_from(
        [
            "Crawl-delay: 3",
            "crawl delay 5",
            "Crawl-delay: x",
            "Sitemap: http://x/s.xml",
            "Host: x.example",
            "foo: bar",
            "foo:bar",
            "just words",
            "# comment",
            "",
            ":",
            ": x",
            "Request-rate: 1/5",
        ]
    ),
)


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_GROUP_LINES, max_size=12), newline=st.sampled_from(["\n", "\r\n", "\r"]))
@example(lines=["User-agent: other", "Disallow: /", ":", "User-agent: hostring", "Disallow: /a"], newline="\n")
def test_group_choice_agrees_with_protego_when_no_group_is_named_by_a_prefix(lines: list[str], newline: str) -> None:
    text = newline.join(lines)
    rec, raw = parsed(text), Protego.parse(text)
    for path in ("/", "/a", "/a/x", "/b/", "/b", "/c"):
        assert rec.allowed(ORIGIN + path) == raw.can_fetch(ORIGIN + path, "hostring"), (text, path)
    delay = raw.crawl_delay("hostring")
    assert rec.crawl_delay == (None if delay is None else min(delay, 30.0)), text


@pytest.mark.parametrize("star", ["*", "* # everyone", "*  other words"])
def test_a_star_followed_by_words_is_the_star_group(star: str) -> None:
    rec = parsed(f"User-agent: googlebot\nDisallow: /g\n\nUser-agent: {star}\nDisallow: /s\n")
    assert rec.allowed("/g")
    assert not rec.allowed("/s")


def test_star_applies_when_no_group_matches() -> None:
    rec = parsed("User-agent: googlebot\nDisallow: /g\n\nUser-agent: *\nDisallow: /s\n")
    assert rec.allowed("/g")
    assert not rec.allowed("/s")


def test_repeated_groups_for_our_token_merge() -> None:
    text = (
        "User-agent: hostring\nDisallow: /a\nCrawl-delay: 4\n\n"
        "User-agent: *\nDisallow: /\n\n"
        "User-agent: HostRing\nDisallow: /b\n"
    )
    rec = parsed(text)
    assert not rec.allowed("/a")
    assert not rec.allowed("/b")
    assert rec.allowed("/c")
    assert rec.crawl_delay == 4.0


def test_a_shared_group_lists_several_agents() -> None:
    rec = parsed("User-agent: otherbot\nUser-agent: hostring\nDisallow: /shared\n\nUser-agent: *\nDisallow: /\n")
    assert not rec.allowed("/shared")
    assert rec.allowed("/page")


def test_group_choice_follows_the_policy_token() -> None:
    text = "User-agent: hostring\nDisallow: /h\n\nUser-agent: otherbot\nDisallow: /o\n"
    other = parsed(text, pol=RobotsPolicy("otherbot/2.0"))
    assert other.allowed("/h")
    assert not other.allowed("/o")


# ---------------------------------------------------------------- crawl delay


def test_crawl_delay_comes_from_the_matched_group() -> None:
    rec = parsed("User-agent: *\nCrawl-delay: 7\n\nUser-agent: hostring\nCrawl-delay: 2\nDisallow: /x\n")
    assert rec.crawl_delay == 2.0
    assert rec.describe() == "rules(200) delay=2.0"
    assert parsed("User-agent: *\nCrawl-delay: 1.5\n").crawl_delay == 1.5
    assert parsed("User-agent: *\nDisallow: /x\n").crawl_delay is None
    assert parsed("User-agent: host\nCrawl-delay: 9\n").crawl_delay is None


@pytest.mark.parametrize(("value", "expected"), [("3600", 30.0), ("1e300", 30.0), ("30", 30.0), ("0", 0.0)])
def test_crawl_delay_is_capped(value: str, expected: float) -> None:
    assert parsed(f"User-agent: *\nCrawl-delay: {value}\n").crawl_delay == expected


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "soon", ""])
def test_malformed_crawl_delay_is_ignored(value: str) -> None:
    assert parsed(f"User-agent: *\nCrawl-delay: {value}\n").crawl_delay is None


def test_crawl_delay_cap_is_configurable() -> None:
    rec = parsed("User-agent: *\nCrawl-delay: 12\n", pol=policy(max_crawl_delay_s=5))
    assert rec.crawl_delay == 5.0


# ---------------------------------------------------------------- size cap and hostile bodies


def test_rules_past_500_kib_are_ignored() -> None:
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# " + b"x" * 100 + b"\n"
    body = head + filler * ((MAX_ROBOTS_BYTES - len(head)) // len(filler) + 1) + b"Disallow: /late\n"
    assert len(body) > MAX_ROBOTS_BYTES
    rec = parsed(body)
    assert not rec.allowed("/early")
    assert rec.allowed("/late")
    assert len(rec.body) <= MAX_ROBOTS_BYTES


def test_a_line_cut_by_the_cap_is_dropped_not_shortened() -> None:
    head = b"User-agent: *\nDisallow: /\n"
    pad = b"#" * (MAX_ROBOTS_BYTES - len(head) - len(b"\nAllow: /a")) + b"\n"
    body = head + pad + b"Allow: /a/very/specific/path\n"
    # The cap falls inside the last line, leaving "Allow: /a"; it must not open all of /a.
    assert body[:MAX_ROBOTS_BYTES].endswith(b"Allow: /a")
    rec = parsed(body)
    assert not rec.allowed("/a/other")
    assert not rec.allowed("/a/very/specific/path")


def test_a_line_ending_exactly_at_the_cap_is_kept() -> None:
    head = b"User-agent: *\n"
    rule = b"Disallow: /kept"
    pad = b"#" * (MAX_ROBOTS_BYTES - len(head) - len(rule) - 1) + b"\n"
    body = head + pad + rule + b"\n" + b"# more\n"
    assert body[:MAX_ROBOTS_BYTES].endswith(rule)
    assert not parsed(body).allowed("/kept")


def _hostile_bodies() -> list[tuple[str, bytes]]:
    rnd = random.Random(9309)
    return [
        ("binary", rnd.randbytes(2 * MAX_ROBOTS_BYTES)),
        ("one_10mb_line", b"Disallow: /" + b"a" * 10_000_000),
        ("nul_and_controls", bytes(range(32)) * 50_000),
        ("invalid_utf8", b"User-agent: *\nDisallow: /\xff\xfe\xc3(\n" * 1000),
        ("many_groups", b"".join(b"User-agent: bot%d\nDisallow: /%d\n" % (i, i) for i in range(30_000))),
        ("stars", b"User-agent: *\nDisallow: /" + b"*a" * 200_000 + b"$\n"),
        ("deep_nonsense", b"User-agent: *\n" + b"Disallow: /" + b"(((" * 100_000 + b"\n" + b"%" * 100_000),
        ("directive_soup", b"user agent user-agent: crawl-delay: : : allow allow: $$$ ***\n" * 8000),
        ("cr_only", b"User-agent: *\rDisallow: /cr\r" * 20_000),
    ]


@pytest.mark.parametrize(("name", "body"), _hostile_bodies(), ids=[n for n, _ in _hostile_bodies()])
def test_hostile_bodies_yield_a_record_without_raising(name: str, body: bytes) -> None:
    pol = policy()
    started = time.monotonic()
    rec = pol.from_outcome(ORIGIN, status=200, body=body, error_class="", now=NOW)
    for url in ("/", "/a" * 500, "/cr", "/?" + "a" * 5000, f"{ORIGIN}/%ff%00/x"):
        assert isinstance(rec.allowed(url), bool)
    assert len(rec.body) <= MAX_ROBOTS_BYTES
    again = RobotsRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again.allowed("/") == rec.allowed("/")
    assert time.monotonic() - started < 20, name


def test_a_parser_failure_disallows_rather_than_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        @staticmethod
        def parse(text: str) -> None:
            raise RuntimeError("parser bug")

    monkeypatch.setattr("frontier_node.core.robots.Protego", Broken)
    rec = parsed("User-agent: *\nAllow: /\n")
    assert rec.verdict is RobotsVerdict.DISALLOW_ALL
    assert rec.error_class == "robots_parse_error"
    assert rec.expires_at == NOW + 60.0


def test_a_10mb_line_past_the_cap_leaves_no_rule() -> None:
    rec = parsed(b"User-agent: *\nDisallow: /" + b"a" * 10_000_000)
    assert rec.verdict is RobotsVerdict.RULES
    assert rec.allowed("/aaa")


# ---------------------------------------------------------------- persistence


def test_to_dict_from_dict_round_trip_gives_the_same_answers() -> None:
    text = (
        "User-agent: *\nDisallow: /\n\n"
        "User-agent: hostring\nDisallow: /private\nAllow: /private/ok$\nDisallow: /*?sid=\nCrawl-delay: 2.5\n"
    )
    rec = parsed(text.encode() + b"# \xff\x00 binary tail\n")
    d = rec.to_dict()
    again = RobotsRecord.from_dict(json.loads(json.dumps(d)))
    assert again == rec
    assert again.crawl_delay == 2.5
    assert again.describe() == rec.describe() == "rules(200) delay=2.5"
    for url in ("/", "/private/x", "/private/ok", "/private/ok/x", "/a?sid=1", "/robots.txt", "/other"):
        assert again.allowed(url) == rec.allowed(url), url


@pytest.mark.parametrize(("status", "error_class"), [(404, ""), (503, ""), (0, "timeout"), (429, ""), (308, "")])
def test_round_trip_of_verdict_records(status: int, error_class: str) -> None:
    rec = policy().from_outcome(ORIGIN, status=status, body=b"x", error_class=error_class, now=NOW)
    again = RobotsRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again == rec
    assert again.allowed("/x") == rec.allowed("/x")
    assert again.expired(rec.expires_at) and not again.expired(rec.expires_at - 1)


@pytest.mark.parametrize(
    "damage",
    [
        {"format": 99},
        {"verdict": "maybe"},
        {"body_b64": "***"},
        {"http_status": "200"},
        {"http_status": True},
        {"fetched_at": None},
        {"crawl_delay": "2"},
        {"origin": 5},
    ],
)
def test_from_dict_refuses_a_damaged_dict(damage: dict[str, object]) -> None:
    d = parsed("User-agent: *\nDisallow: /x\n").to_dict()
    d.update(damage)
    with pytest.raises(ValueError):
        RobotsRecord.from_dict(d)


def test_from_dict_accepts_integral_times() -> None:
    d = parsed("User-agent: *\nDisallow: /x\n").to_dict()
    d["fetched_at"], d["expires_at"] = 10, 20
    rec = RobotsRecord.from_dict(d)
    assert rec.expires_at == 20.0 and not rec.allowed("/x")


@settings(max_examples=100, deadline=None)
@given(
    rules=st.lists(st.tuples(st.sampled_from(["Allow", "Disallow"]), _patterns), max_size=6),
    agent=st.sampled_from(["*", "hostring", "host", "HostRing", "other"]),
    delay=st.one_of(st.none(), st.floats(min_value=0, max_value=100, allow_nan=False)),
    paths=st.lists(st.text(alphabet="ab/?=*$%2F", max_size=8).map(lambda p: "/" + p), max_size=6),
)
def test_round_trip_property(rules: list[tuple[str, str]], agent: str, delay: float | None, paths: list[str]) -> None:
    lines = [f"User-agent: {agent}"] + [f"{k}: {p}" for k, p in rules]
    if delay is not None:
        lines.append(f"Crawl-delay: {delay}")
    rec = parsed("\n".join(lines) + "\n")
    again = RobotsRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again == rec
    for path in paths:
        assert again.allowed(path) == rec.allowed(path)


# ---------------------------------------------------------------- speed


def test_allowed_does_not_reparse_per_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record parses its rules once; 20k checks against 1,001 rules call protego's parser zero more times."""
    rules = "".join(f"Disallow: /section{i}/\nAllow: /section{i}/pub\n" for i in range(500))
    rec = parsed("User-agent: hostring\n" + rules + "Disallow: /*.php$\n")
    parses: list[str] = []
    original = Protego.parse

    def counting(content: str) -> Protego:
        parses.append(content)
        return original(content)

    monkeypatch.setattr(Protego, "parse", staticmethod(counting))
    urls = [f"{ORIGIN}/section{i % 700}/page{i}?q={i}" for i in range(20_000)]
    answers = [rec.allowed(u) for u in urls]
    assert answers.count(False) > 0 and answers.count(True) > 0
    assert parses == []
