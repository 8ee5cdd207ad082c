"""The revisit bench runs: `python -m bench.revisit --quick --json` prints every figure, finite and positive.

This checks that the bench works end to end (and that its schedules were of equal cost), not how fast anything is.
"""

from __future__ import annotations

import pytest

from tests.bench_runs import assert_positive, run_quick

FIGURES = (
    "freshness_adaptive",
    "freshness_fixed_equal_cost",
    "freshness_uniform_equal_cost",
    "freshness_fixed_initial_interval",
    "freshness_optimal_equal_cost",
    "window_fetches_adaptive",
    "window_fetches_fixed_equal_cost",
    "equal_cost_interval_s",
    "revisits_per_s_core_memory",
    "revisits_per_s_core_sqlite",
    "revisits_per_cpu_s_core_memory",
    "revisits_per_cpu_s_core_sqlite",
)


@pytest.mark.slow
@pytest.mark.long(120)
@pytest.mark.timeout(420)
def test_quick_revisit_bench_prints_every_figure() -> None:
    figures = run_quick("bench.revisit", 400)
    assert_positive(figures, FIGURES)
    for key in FIGURES[:5]:
        assert figures[key] <= 1.0, key  # freshness is a fraction
    assert figures["window_fetches_fixed_equal_cost"] == pytest.approx(figures["window_fetches_adaptive"], rel=0.02)
    assert figures["machine"]["cores"] >= 1 and figures["machine"]["python"]
    assert figures["workload"]["pages"] == 2_000 and figures["rate_revisits"] == figures["workload"]["rate_pages"]
    assert set(figures["revisits_adaptive"]) <= {"changed", "not_modified", "unchanged", "near_duplicate"}
