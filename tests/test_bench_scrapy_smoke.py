"""The Scrapy bench runs: `python -m bench.scrapy --quick --json` prints every figure as a positive number.

This checks that the bench works end to end (three crawls, each complete), not how fast anything is.
"""

from __future__ import annotations

import pytest

from tests.bench_runs import assert_positive, run_quick

RUN_FIGURES = (
    "pages_per_s",
    "makespan_s",
    "politeness_bound_s",
    "makespan_over_bound",
    "cpu_ms_per_page_steady",
    "cpu_ms_per_page_total",
)


@pytest.mark.slow
@pytest.mark.long(30)
@pytest.mark.timeout(240)
def test_quick_scrapy_bench_prints_every_figure() -> None:
    figures = run_quick("bench.scrapy", 220)
    for run in ("plain", "hostring_1", "hostring_2"):
        assert_positive(figures[run], RUN_FIGURES, run)
        assert figures[run]["coverage"]["missing"] == 0, (run, figures[run]["coverage"])
        assert figures[run]["coverage"]["max_in_flight_per_origin"] == 1, run
    for run in ("hostring_1", "hostring_2"):  # hostring fetches each page once, whichever process leased it
        assert figures[run]["coverage"]["duplicates"] == 0, (run, figures[run]["coverage"])
        assert set(figures[run]["cpu_s_by_process"]) >= {"node", "spider-0"}, run
        assert 0 <= figures[run]["node_cpu_ms_per_page_steady"] <= figures[run]["cpu_ms_per_page_steady"], run
    assert figures["plain"]["node_cpu_ms_per_page_steady"] == 0
    assert set(figures["hostring_2"]["cpu_s_by_process"]) == {"node", "spider-0", "spider-1"}
    assert figures["machine"]["cores"] >= 1 and len(figures["machine"]["loadavg_end"]) == 3
    assert figures["workload"]["web"]["origins"] == 3 and figures["cpu_per_page_vs_plain"] > 0
