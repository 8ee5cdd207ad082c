"""Trap rules of the budgets against a plain count of path segments."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node.core.budgets import Budgets
from frontier_node.core.config import BudgetConfig


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "", "1"]), max_size=9), st.integers(1, 4))
def test_repeated_segments_rule_matches_a_plain_count(segments: list[str], limit: int) -> None:
    path = "/" + "/".join(segments)
    budgets = Budgets(BudgetConfig(max_repeated_segments=limit))
    counts = Counter(s for s in segments if s)
    breached = max(counts.values(), default=0) > limit
    rule = budgets.check(f"http://a.example{path}", "a.example", "a.example", 0)
    assert (rule == "repeated_segments") == breached
