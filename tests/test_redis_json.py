"""The Redis store's JSON encoder (codec.compact_json, orjson with the stdlib's encoder where they differ) against
the stdlib's json.dumps as the oracle: every value reads back as the stdlib's text of it does."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from frontier_node.core.records import Entry, Item, Kind
from frontier_node.store.redis.codec import compact_json, pack_checked_line, pack_row, unpack_line, unpack_row

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.text(alphabet=st.characters(max_codepoint=0x7F))
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner), max_leaves=30)


def _same(a: object, b: object) -> bool:
    """Equal JSON values, NaN equal to NaN and floats told from ints (json.loads keeps 1.0 a float)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


def _has_float(value: object) -> bool:
    if isinstance(value, list | tuple):
        return any(_has_float(v) for v in value)
    return isinstance(value, float)


@given(_VALUES)
def test_compact_json_reads_back_as_the_stdlib_text(value: object) -> None:
    ours = compact_json(value)
    oracle = json.dumps(value, separators=(",", ":"))
    assert _same(json.loads(ours), json.loads(oracle))
    assert ours.isascii(), "text that is not ASCII must be escaped, as the stdlib does"
    if not _has_float(value):  # a float's exponent may be spelled 1e16 rather than 1e+16; nothing else differs
        assert ours == oracle


def test_a_row_with_non_finite_and_huge_numbers_reads_back() -> None:
    """orjson writes NaN and infinities as null and refuses ints beyond 64 bits: such a row takes the stdlib's text."""
    item = Item("http://a.example/x", "http://a.example/x", "a.example", "http://a.example", "a.example", Kind.PAGE, 0,
                0, 1, 0)  # fmt: skip
    item.interval_s = math.inf
    item.deadline = -math.inf
    item.simhash = 2**64 - 1
    item.visits = 2**70
    back = unpack_row(item.key, pack_row(item, 1))
    assert (back.interval_s, back.deadline, back.simhash, back.visits) == (math.inf, -math.inf, 2**64 - 1, 2**70)


def test_a_journal_line_with_text_beyond_ascii_reads_back() -> None:
    entry = Entry(7, "run", "http://b.example/é", 0, 1, "scheduled", "lease", "leased", 1e16, 1, "wörker", "", "")
    line = pack_checked_line(entry, 3)
    assert line.isascii()
    assert unpack_line(line) == (3, entry)
