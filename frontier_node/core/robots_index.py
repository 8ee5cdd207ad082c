"""Per-URL robots.txt matching whose cost does not grow with the number of rules (RFC 9309 §2.2.2).

protego answers a check by trying the group's rules one by one, longest first, so a 500 KB robots.txt (tens of
thousands of Allow/Disallow lines) costs milliseconds of the core thread per URL, for every URL of that origin.
RuleIndex gives exactly protego's answers, from protego's own parsed rules and matcher, but asks only rules that
can match the path, found through a key each rule is bucketed under:

- its literal prefix (up to the first `*` or `$`), which every path it matches starts with: a check looks up the
  path's own prefixes, one dict look-up per distinct prefix length (a couple of dozen in real files);
- for a `*...$` rule (`/*.php$`), its literal tail (after the last `*`), which every path it matches ends with;
- for a wildcard rule whose prefix and tail many rules share (`/*sessionid=`: "/"), a substring of one of its
  parts between `*`s (_GRAM long, or the part if shorter), which every path it matches holds: a check looks up
  each substring of the path that long.

The answer is protego's: among the rules that match, the longest pattern (protego's priority, the length of the
normalised pattern) wins and Allow wins a tie; no match allows. Each bucket is sorted by that rank, so a bucket is
left at its first match or as soon as it cannot beat the best match so far; identical rules are kept once. What
stays costly is a file whose rules share every key: thousands of distinct patterns made of parts that occur in
ordinary paths (`/*a*b*c`, `/*b*a*c`, ...) are all asked, as protego asks them.

This reads protego's internals (the matching rule set, its rules, each pattern's priority and matcher, and the URL
normalisation), which is why pyproject.toml pins protego to the 0.7 series; tests/test_robots_index.py checks the
answers against protego's public can_fetch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from urllib.parse import urlparse

from protego import Protego
from protego._utils import _quote_path

_ROBOTS_PATH = "/robots.txt"

# (rank, matcher): rank = 2 * priority + 1 for Allow, + 0 for Disallow, so the higher rank is protego's winner.
_Entry = tuple[int, Callable[[str], bool]]


_GRAM = 4
"""Length of the substrings a floating part of a rule is keyed by: a check looks up the path's substrings this long."""

_CROWDED = 16
"""A prefix or tail key shared by more rules than this sends them to look for a rarer key among their parts."""

_PREFIX, _TAIL, _PART = 0, 1, 2  # kinds of key, in order of preference on a tie (cheapest look-ups first)

_Key = tuple[int, str]


def _anchors(pattern: str) -> list[_Key]:
    """The text every path a (normalised) pattern matches starts with and, for a `*...$` pattern, ends with.

    As protego's matcher reads a pattern: a `*` anywhere makes it a wildcard, and only a final `$` anchors it. The
    literal prefix runs to the first `*` or `$`; an anchored wildcard's tail runs from its last `*` to the `$`.
    """
    cut = len(pattern)
    for special in "*$":
        at = pattern.find(special)
        if at != -1 and at < cut:
            cut = at
    keys = [(_PREFIX, pattern[:cut])]
    if "*" in pattern and pattern.endswith("$"):
        tail = pattern[:-1].rsplit("*", 1)[1]
        if tail:
            keys.append((_TAIL, tail))
    return keys


def _parts(pattern: str) -> list[_Key]:
    """Text every path a wildcard pattern matches holds: each part after its first `*`, cut into substrings _GRAM
    long (a shorter part whole)."""
    if "*" not in pattern:
        return []
    keys: set[_Key] = set()
    for part in (pattern[:-1] if pattern.endswith("$") else pattern).split("*")[1:]:
        if len(part) <= _GRAM:
            if part:
                keys.add((_PART, part))
        else:
            keys.update((_PART, part[i : i + _GRAM]) for i in range(len(part) - _GRAM + 1))
    return list(keys)


def _count(keys: list[_Key], shared: dict[_Key, int]) -> None:
    for key in keys:
        shared[key] = shared.get(key, 0) + 1


class _Buckets:
    """Rules bucketed under one kind of key, each bucket sorted by rank (highest first), and the key lengths."""

    __slots__ = ("buckets", "lengths")

    def __init__(self, buckets: dict[str, list[_Entry]]) -> None:
        for entries in buckets.values():
            entries.sort(key=lambda entry: entry[0], reverse=True)
        self.buckets = buckets
        self.lengths = sorted({len(key) for key in buckets})


class RuleIndex:
    """One group's Allow/Disallow rules, bucketed for checks that ask only the rules that can match."""

    __slots__ = ("_parts", "_prefixes", "_tails")

    def __init__(self, parser: Protego, agent: str, *, crowded: int = _CROWDED) -> None:
        """Index the rules `parser` applies to `agent` (none when no group applies: everything is allowed).

        A rule goes under its prefix or its tail, whichever fewer rules share; when more than `crowded` share
        both, under whichever of its keys, parts included, the fewest rules share.
        """
        rule_set = parser._get_matching_rule_set(agent)
        rules: dict[tuple[int, str], tuple[_Entry, list[_Key]]] = {}
        for rule in [] if rule_set is None else rule_set._rules:
            pattern = rule.value
            text: str = pattern._pattern
            rank = 2 * int(pattern.priority) + (1 if rule.field == "allow" else 0)
            if (rank, text) not in rules:  # the same line twice answers the same
                rules[(rank, text)] = ((rank, pattern.match), _anchors(text))
        shared: dict[_Key, int] = {}
        for _, keys in rules.values():
            _count(keys, shared)
        kinds: list[dict[str, list[_Entry]]] = [{}, {}, {}]
        deferred: list[tuple[_Entry, list[_Key]]] = []
        for (_, text), (entry, keys) in rules.items():
            kind, key = min(keys, key=lambda k: (shared[k], k[0]))
            parts = _parts(text) if shared[(kind, key)] > crowded else []
            if parts:
                _count(parts, shared)
                deferred.append((entry, keys + parts))
            else:
                kinds[kind].setdefault(key, []).append(entry)
        for entry, keys in deferred:
            kind, key = min(keys, key=lambda k: (shared[k], k[0], -len(k[1])))
            kinds[kind].setdefault(key, []).append(entry)
        self._prefixes = _Buckets(kinds[_PREFIX])
        self._tails = _Buckets(kinds[_TAIL])
        self._parts = _Buckets(kinds[_PART])

    def __len__(self) -> int:
        """How many distinct rules are indexed."""
        return sum(
            len(entries) for index in (self._prefixes, self._tails, self._parts) for entries in index.buckets.values()
        )

    def can_fetch(self, url: str) -> bool:
        """protego's `can_fetch(url, agent)` for the indexed group: same answers, same ValueErrors."""
        if _ROBOTS_PATH in url and urlparse(url).path == _ROBOTS_PATH:
            return True
        path = _quote_path(url)
        size = len(path)
        best = -1
        lengths = self._prefixes.lengths
        buckets = self._prefixes.buckets
        for i in range(bisect_right(lengths, size) - 1, -1, -1):  # longest prefixes first: they tend to win
            entries = buckets.get(path[: lengths[i]])
            if entries is not None:
                best = _best(entries, path, best)
        lengths = self._tails.lengths
        buckets = self._tails.buckets
        for i in range(bisect_right(lengths, size) - 1, -1, -1):
            entries = buckets.get(path[size - lengths[i] :])
            if entries is not None:
                best = _best(entries, path, best)
        buckets = self._parts.buckets
        if buckets:
            seen: set[str] = set()
            for length in self._parts.lengths:
                for start in range(size - length + 1):
                    key = path[start : start + length]
                    entries = buckets.get(key)
                    if entries is not None and key not in seen:
                        seen.add(key)
                        best = _best(entries, path, best)
        return best < 0 or best % 2 == 1


def _best(entries: list[_Entry], path: str, best: int) -> int:
    """The higher of `best` and the rank of the first rule of a rank-sorted bucket that matches `path`."""
    for rank, match in entries:
        if rank <= best:
            break
        if match(path):
            return rank
    return best
