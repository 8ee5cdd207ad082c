"""The node bench runs: `python -m bench.node --quick --json` prints every figure as a positive number.

This checks that the bench works end to end, not how fast anything is.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import frontier_node

REPO = Path(frontier_node.__file__).resolve().parent.parent

FIGURES = (
    "discover_links_per_s_grpc",
    "discover_admitted_urls_grpc",
    "lease_complete_urls_per_s_grpc",
    "lease_complete_urls_grpc",
    "discover_links_per_s_core_sqlite",
    "discover_links_per_s_core_memory",
    "lease_complete_urls_per_s_core",
    "lease_complete_urls_per_s_core_memory",
    "ram_bytes_per_url",
    "seen_bytes_per_url",
    "ram_urls",
    "peer_discover_links_per_s",
    "peer_drain_urls_per_s",
)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_quick_bench_prints_every_figure() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.node", "--quick", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout)
    for key in FIGURES:
        value = figures.get(key)
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, value)
    assert figures["machine"]["cores"] >= 1 and figures["machine"]["python"]
    workload = figures["workload"]
    assert workload["batch"] == 256 and workload["links"] > 0
    # dedup happened on the normalized key: exactly the distinct URLs were admitted, through gRPC and in process
    assert figures["discover_admitted_urls_grpc"] == workload["unique_urls"]
    assert figures["discover_admitted_urls_core"] == workload["unique_urls"]
    assert figures["ram_urls"] == workload["ram_urls"]
    # the workload: every distinct URL admitted once, and every one of them drained
    assert figures["peer_drained_urls"] == figures["peer_admitted_urls"] > 0


CRAWL_FIGURES = (
    "pages_per_s",
    "cpu_ms_per_page",
    "politeness_makespan_s",
    "politeness_bound_s",
    "makespan_over_bound",
    "politeness_cpu_ms_per_page",
)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_quick_crawl_bench_prints_every_figure() -> None:
    """`python -m bench.crawl --quick --json`: the end-to-end crawl bench runs and every figure is positive."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.crawl", "--quick", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout)
    for key in CRAWL_FIGURES:
        value = figures.get(key)
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (key, value)
    assert figures["machine"]["cores"] >= 1 and figures["machine"]["cpu_model"] is not None
    assert len(figures["machine"]["loadavg_start"]) == 3 and len(figures["machine"]["loadavg_end"]) == 3
    for run in ("throughput", "politeness"):
        assert figures[run]["pages"] > 0 and figures[run]["cpu_s_rusage"] > 0, run
        assert figures[run]["coverage"]["expected_pages"] > 0, run
    assert figures["workload"]["throughput"]["origins"] >= 20
