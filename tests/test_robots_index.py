"""RuleIndex (frontier_node/core/robots_index.py) against protego itself: the same answer for every group and URL.

The index asks only the rules whose prefix, tail or part a path holds, so its mistakes would be off-by-one keys:
the generators below build patterns and paths from one small alphabet, so that prefixes, tails and parts collide.
"""

from __future__ import annotations

import json
import random

from hypothesis import example, given, settings
from hypothesis import strategies as st
from protego import Protego

from frontier_node.core.robots import RobotsPolicy, RobotsRecord
from frontier_node.core.robots_index import RuleIndex

AGENT = "*"

# Pieces of rule values and paths alike: literal text, wildcards, anchors, escapes of the same characters (%61 is
# "a", %24 is "$", %2F is "/", %3D is "="), characters protego must encode, and the index.html it widens.
_PIECES = ["a", "b", "ab", "/", "/a", "*", "$", "%", "%24", "%61", "%2F", "%2f", "%3D", "=", "?", ".", "é", "%C3%A9",
           "index.html", "%25", "#"]  # fmt: skip
_pattern = st.lists(st.sampled_from([p for p in _PIECES if p != "#"]), max_size=7).map("".join)
_value = st.one_of(_pattern.map(lambda p: "/" + p), _pattern)
_line = st.tuples(st.sampled_from(["Allow", "Disallow"]), _value).map(lambda fv: f"{fv[0]}: {fv[1]}")
_group = st.lists(_line, max_size=40)
_path = st.lists(st.sampled_from([*_PIECES, "b", "a", "/"]), max_size=9).map("".join)
_url = st.one_of(_path.map(lambda p: "/" + p), _path.map(lambda p: "https://a.example/" + p), _path)


def _text(lines: list[str]) -> str:
    return "\n".join([f"User-agent: {AGENT}", *lines])


def _protego(parser: Protego, url: str) -> bool | None:
    """protego's answer, None when it raises (a URL urllib cannot split)."""
    try:
        return bool(parser.can_fetch(url, AGENT))
    except ValueError:
        return None


def _indexed(index: RuleIndex, url: str) -> bool | None:
    try:
        return index.can_fetch(url)
    except ValueError:
        return None


def _assert_agrees(lines: list[str], urls: list[str], *, crowded: int | None = None) -> None:
    parser = Protego.parse(_text(lines))
    index = RuleIndex(parser, AGENT) if crowded is None else RuleIndex(parser, AGENT, crowded=crowded)
    for url in urls:
        assert _indexed(index, url) == _protego(parser, url), (lines, url)


@settings(max_examples=600, deadline=None)
@given(_group, st.lists(_url, min_size=1, max_size=8))
@example(["Disallow: /ab", "Allow: /a"], ["/a", "/ab", "/abc", "/b"])
@example(["Disallow: /a$", "Allow: /a*"], ["/a", "/a$", "/a%24", "/ab"])
@example(["Disallow: /*b$", "Allow: /a*b"], ["/ab", "/abb", "/ba", "/a/b"])
@example(["Disallow: /a/", "Allow: /a/index.html"], ["/a/", "/a/index.html", "/a/b"])
@example(["Disallow: /%61", "Allow: /a%2Fb"], ["/a", "/%61", "/a/b", "/a%2fb", "/robots.txt", "/robots.txt;x"])
def test_index_answers_as_protego(lines: list[str], urls: list[str]) -> None:
    _assert_agrees(lines, urls)


# Wildcard rules that all share the prefix "/": most are keyed by a part, as in a file crowded with `/*...` rules.
_floating = st.tuples(st.sampled_from(["Allow", "Disallow"]), _pattern).map(lambda fv: f"{fv[0]}: /*{fv[1]}")


@settings(max_examples=400, deadline=None)
@given(st.lists(_floating, min_size=1, max_size=30), _group, st.lists(_url, min_size=1, max_size=8))
@example(["Disallow: /*ab*b", "Allow: /*a*b$"], [], ["/ab", "/abb", "/aab", "/b/ab/b", "/ba"])
def test_index_keyed_by_parts_answers_as_protego(floating: list[str], lines: list[str], urls: list[str]) -> None:
    """Every wildcard rule keyed by the rarest of its prefix, tail and part substrings, as in a crowded file."""
    _assert_agrees(floating + lines, urls, crowded=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(_value, max_size=12), st.lists(_url, min_size=1, max_size=8))
def test_record_answers_as_protego(values: list[str], urls: list[str]) -> None:
    """Through the record (group choice, the robots.txt exception, a URL that cannot be split refused)."""
    text = _text([f"Disallow: {v}" if i % 2 else f"Allow: {v}" for i, v in enumerate(values)])
    record = RobotsPolicy("hostring/1.0").from_outcome("https://a.example", status=200, body=text.encode(),
                                                       error_class="", now=0.0)  # fmt: skip
    parser = Protego.parse(text)
    for url in urls:
        expected = _protego(parser, url)
        assert record.allowed(url) == (False if expected is None else expected), (text, url)


def _hostile_robots(seed: int) -> str:
    """About 500 KB in one group: /*.php$-style rules, floating wildcards, and plain prefixes, mixed."""
    r = random.Random(seed)
    lines = ["User-agent: *", "Crawl-delay: 2"]
    size = 0
    while size < 500_000:
        n = r.randrange(10**6)
        field = r.choice(["Allow", "Disallow"])
        value = r.choice([f"/*{n}.php$", f"/*{n}*x{n % 97}", f"/*?s={n}", f"/p/{n}/", f"/p/{n}/*.pdf$", f"/*{n}"])
        lines.append(f"{field}: {value}")
        size += len(lines[-1]) + 1
    lines += ["Disallow: /*.php$", "Allow: /p/", "Disallow: /*secret*"]
    return "\n".join(lines)


def test_a_500_kb_hostile_file_still_answers_as_protego() -> None:
    text = _hostile_robots(7)
    assert len(text) >= 500_000
    record = RobotsPolicy("hostring/1.0").from_outcome(
        "https://a.example", status=200, body=text.encode(), error_class="", now=0.0
    )
    assert record.verdict.value == "rules" and record.crawl_delay == 2.0
    parser = Protego.parse(text)
    values = [line.split(": ", 1)[1] for line in text.splitlines()[2:200]]
    urls = ["https://a.example/", "https://a.example/x.php", "https://a.example/p/1/a.html", "/p/1/secret/a",
            "/a/b?c=d", "/robots.txt"]  # fmt: skip
    urls += ["https://a.example" + v.replace("*", "q").rstrip("$") for v in values[:6]]
    answers = {url: record.allowed(url) for url in urls}
    assert answers == {url: parser.can_fetch(url, AGENT) for url in urls}
    assert answers["/robots.txt"] and not answers["https://a.example/x.php"] and not answers["/p/1/secret/a"]
    again = RobotsRecord.from_dict(json.loads(json.dumps(record.to_dict())))  # a restart rebuilds the index
    assert {url: again.allowed(url) for url in urls} == answers
