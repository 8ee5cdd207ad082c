"""The node, crawl and cluster benches run: `--quick --json` prints every figure as a positive number."""

from __future__ import annotations

import pytest

from tests.bench_runs import assert_positive, run_quick

FIGURES = (
    "discover_links_per_s_grpc",
    "discover_admitted_urls_grpc",
    "lease_complete_urls_per_s_grpc",
    "lease_complete_urls_grpc",
    "lease_complete_reply_urls_per_s_grpc",
    "grpc_floor_links_per_s",
    "grpc_floor_links_per_server_cpu_s",
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
@pytest.mark.long(65)
@pytest.mark.timeout(200)
def test_quick_bench_prints_every_figure() -> None:
    figures = run_quick("bench.node", 180)
    assert_positive(figures, FIGURES)
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
@pytest.mark.long(30)
@pytest.mark.timeout(150)
def test_quick_crawl_bench_prints_every_figure() -> None:
    """`python -m bench.crawl --quick --json`: the end-to-end crawl bench runs and every figure is positive."""
    figures = run_quick("bench.crawl", 120)
    assert_positive(figures, CRAWL_FIGURES)
    assert figures["machine"]["cores"] >= 1 and figures["machine"]["cpu_model"] is not None
    assert len(figures["machine"]["loadavg_start"]) == 3 and len(figures["machine"]["loadavg_end"]) == 3
    assert figures["machine"]["reference_loop_ns_end"] > 0 and figures["machine"]["reference_loop_ns"] > 0
    for run in ("throughput", "politeness"):
        assert figures[run]["pages"] > 0 and figures[run]["cpu_s_rusage"] > 0, run
        assert figures[run]["coverage"]["expected_pages"] > 0, run
    assert figures["workload"]["throughput"]["origins"] >= 20


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_turnaround_rounds_report_the_median_round() -> None:
    """`python -m bench.crawl --quick --turnaround-only --rounds 3 --json`: three crawls of the link-heavy web, each
    complete and polite, and the round reported in full is the one with the median makespan/bound."""
    figures = run_quick("bench.crawl", 120, "--turnaround-only", "--rounds", "3")
    rounds = figures["rounds"]
    assert figures["workload"]["rounds"] == 3 and len(rounds) == 3
    for r in rounds:
        assert_positive(r, ("makespan_over_bound", "makespan_s", "cpu_ms_per_page", "cpu_s_worker", "cpu_s_node"))
    turnaround = figures["turnaround"]
    ratios = sorted(r["makespan_over_bound"] for r in rounds)
    assert turnaround["makespan_over_bound"] == ratios[1]
    coverage = turnaround["coverage"]
    assert coverage["missing"] == coverage["duplicates"] == coverage["forbidden"] == 0, coverage
    assert coverage["max_in_flight_per_origin"] == 1, coverage


CLUSTER_PER_URL = ("node_cpu_ms", "cpu_ms", "redis_cpu_ms", "redis_round_trips", "redis_commands")


CLUSTER_TARGETS = (
    "sqlite_over_redis_discover",
    "sqlite_over_redis_lease_complete",
    "sqlite_over_redis_lease_complete_reply",
    "cpu_3_over_1_discover",
    "cpu_3_over_1_lease_complete",
    "cpu_3_over_1_lease_complete_reply",
    "max_round_trips_per_url",
)


@pytest.mark.slow
@pytest.mark.long(50)
@pytest.mark.timeout(150)
def test_quick_cluster_bench_prints_every_figure() -> None:
    """`python -m bench.cluster --quick --no-membership --json`: 1, 2 and 3 nodes on one Redis and one SQLite node
    each admit every link and lease+complete every page (a Lease per batch, then the lease in the CompleteBatch
    reply), with their per-URL costs, Redis's included."""
    figures = run_quick("bench.cluster", 120, "--no-membership")
    links = figures["workload"]["links"]
    assert set(figures["throughput"]) == {"1", "2", "3"}
    for nodes, run in figures["throughput"].items():
        discover, lease, reply = run["discover"], run["lease_complete"], run["lease_complete_reply"]
        assert discover["admitted"] == links and discover["wrong_owner"] == 0, nodes
        pages = figures["workload"]["lease_pages"]
        for phase in (lease, reply):  # each phase goes on to the end of its last batches: at least its pages
            assert phase["urls"] >= pages and phase["refused"] == 0, nodes
            assert_positive(phase, ["urls_per_s", "urls_per_node_cpu_s"], f"{nodes} nodes")
        assert_positive(discover, ["admitted_per_s", "admitted_per_node_cpu_s"], f"{nodes} nodes")
        for phase in (discover, lease, reply):
            assert_positive(phase["per_url"], CLUSTER_PER_URL, f"{nodes} nodes")
            assert phase["redis"]["commands"] >= phase["redis"]["script_calls"] > 0, nodes
        assert set(run["discover"]["links_per_node"]) == {f"n{i}" for i in range(1, int(nodes) + 1)}
    sqlite = figures["sqlite"]
    assert sqlite["discover"]["admitted"] == links and sqlite["discover"]["per_url"]["redis_commands"] == 0
    assert_positive(sqlite["lease_complete"], ["urls_per_s"], "sqlite")
    assert sqlite["lease_complete_reply"]["urls"] >= figures["workload"]["lease_pages"]
    assert figures["machine"]["cores"] >= 1
    # the figures the issue sets targets for, from the same run
    targets = figures["targets"]
    assert_positive(targets, CLUSTER_TARGETS, "targets")
    one = figures["throughput"]["1"]
    assert targets["sqlite_over_redis_lease_complete"] == pytest.approx(
        sqlite["lease_complete"]["urls_per_s"] / one["lease_complete"]["urls_per_s"]
    )
    assert targets["sqlite_over_redis_lease_complete_reply"] == pytest.approx(
        sqlite["lease_complete_reply"]["urls_per_s"] / one["lease_complete_reply"]["urls_per_s"]
    )
    assert targets["cpu_3_over_1_discover"] == pytest.approx(
        figures["throughput"]["3"]["discover"]["per_url"]["cpu_ms"] / one["discover"]["per_url"]["cpu_ms"]
    )
    assert figures["rounds"] == [targets]


def test_machine_line_points_out_a_speed_change_during_the_run() -> None:
    """The machine line gives the reference loop at the start and the end of a run, and says so when the machine's
    speed moved by more than SPEED_DRIFT in between (a VM on a busy host: figures then compare only roughly)."""
    from bench.node import SPEED_DRIFT, machine_line

    m = {"cores": 2, "cores_usable": 2, "cpu_model": "cpu", "ram_bytes": 2**30, "python_implementation": "CPython",
         "python": "3.11", "grpcio": "1", "platform": "linux", "loadavg_start": [0.0] * 3, "loadavg_end": [1.0] * 3,
         "reference_loop_ns": 200.0, "reference_loop_busy_ns": 210.0, "core_build": "from source"}  # fmt: skip
    steady = machine_line({**m, "reference_loop_ns_end": 200.0 * (1 + SPEED_DRIFT / 2)}, sqlite=False)
    assert "reference loop 200.0 ns/step at the start, 215.0 at the end (CPU;" in steady
    slowed = machine_line({**m, "reference_loop_ns_end": 400.0}, sqlite=False)
    assert "400.0 at the end (the loop's time changed by +100% during the run: the machine's speed changed" in slowed
    unread = machine_line(m, sqlite=False)  # figures of a run that did not read it at the end
    assert "reference loop 200.0 ns/step (CPU;" in unread and unread.endswith("core from source")


def test_rounds_report_each_figures_median_and_every_value() -> None:
    """`bench.node --rounds N`: each figure of the table is its median over the rounds (figure by figure, not one
    round's), and every round's value is kept for the table's range column."""
    from bench.node import _ROWS, over_rounds

    keys = [k for row in _ROWS for k in (row[0], row[3]) if k]
    rounds = []
    for n, scale in enumerate((3.0, 1.0, 2.0)):
        figures: dict[str, object] = {k: scale * (i + 1) for i, k in enumerate(keys)}
        figures["discover_links_per_s_grpc"] = (10.0, 30.0, 20.0)[n] if n != 1 else 999.0
        figures["machine"] = {"loadavg_end": [float(n)] * 3, "reference_loop_ns_end": 100.0 + n}
        rounds.append(figures)
    out = over_rounds(rounds)
    assert out["lease_complete_urls_per_s_grpc"] == 2.0 * (keys.index("lease_complete_urls_per_s_grpc") + 1)
    assert out["discover_links_per_s_grpc"] == 20.0
    assert out["rounds"]["discover_links_per_s_grpc"] == [10.0, 999.0, 20.0]
    assert out["machine"]["loadavg_end"] == [2.0] * 3, "the load at the end is the last round's"
    assert out["machine"]["reference_loop_ns_end"] == 102.0, "so is the reference loop at the end"
    single = over_rounds(rounds[:1])
    assert single["discover_links_per_s_grpc"] == 10.0 and single["rounds"]["discover_links_per_s_grpc"] == [10.0]
