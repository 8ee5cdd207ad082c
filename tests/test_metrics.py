"""Prometheus metrics of real processes, scraped during a crawl and after it, and checked against the report.

Two set-ups, both crawling the sample web (`hostring_testing.sample_web`) on loopback:

- `hostring crawl --metrics-port P`: the worker (P) and the node (P+1) are scraped while the crawl runs;
  counters only grow, names and labels follow the conventions, and a node reopened on the finished store
  reports the same URL states as report.json.
- a cluster (coordinator, two nodes on Redis, one worker): after the crawl drains every process is still up,
  so the final counters are compared exactly with the nodes' reports, and the coordinator's gauges with its ring.

Metric text is parsed with prometheus-client's own parser, as Prometheus would read it.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing import LocalWeb, sample_oracle, sample_web
from hostring_testing.crawls import (
    UA,
    CrawlProcess,
    crawl_cmd,
    hostring_cmd,
    load_report,
    scope_file,
    serve,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DELAY = 0.05
Sample = tuple[str, tuple[tuple[str, str], ...]]
Scrape = dict[str, dict[Sample, float]]
"""family name -> {(sample name, sorted labels): value}, plus the family's type under the key "__type__"."""

# A label value naming a host or a URL: an IP address, a scheme, or a dotted name ending in letters.
HOSTLIKE = re.compile(r"://|^\d{1,3}(\.\d{1,3}){3}(:\d+)?$|^[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}(:\d+)?$", re.I)


@pytest.fixture(scope="module")
def web() -> Iterator[LocalWeb]:
    with LocalWeb(sample_web()) as w:
        yield w


def free_port_pair() -> int:
    """A loopback port P with P+1 free as well (hostring crawl serves the node's metrics on P+1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no pair of free ports")


def scrape(port: int) -> tuple[Scrape, dict[str, str]]:
    """Parse http://127.0.0.1:port/metrics; (samples by family, type by family)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    families: Scrape = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        families[fam.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
    return families, types


def try_scrape(port: int) -> tuple[Scrape, dict[str, str]] | None:
    """A scrape, or None while nothing serves metrics there: no answer, or an answer with no metric at all (seen once
    in a loaded suite, from a process on its way out). A process that never serves its metrics still fails the
    callers' count of scrapes taken."""
    try:
        got = scrape(port)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return got if got[0] else None


def value(families: Scrape, sample: str, **labels: str) -> float:
    """Sum of the samples named `sample` whose labels include `labels` (0 when none)."""
    family = sample.removesuffix("_total")
    want = set(labels.items())
    return sum(v for (name, lbls), v in families.get(family, {}).items() if name == sample and want <= set(lbls))


def check_conventions(families: Scrape, types: dict[str, str], where: str) -> None:
    """hostring_ROLE_ prefix (one role per process) and build info, _total counters, low-cardinality labels that
    never name a host or URL."""
    assert families, f"{where}: no metrics"
    roles = {f.split("_")[1] for f in families if f != "hostring_build_info"}
    assert len(roles) == 1 and roles <= {"node", "worker", "coordinator"}, f"{where}: names of roles {roles}"
    assert "hostring_build_info" in families, f"{where}: no hostring_build_info"
    for family, samples in families.items():
        assert family.startswith("hostring_"), f"{where}: {family} lacks the hostring_ prefix"
        if types[family] == "counter":
            assert all(name.endswith(("_total", "_created")) for name, _ in samples), f"{where}: {family} not _total"
        assert len(samples) <= 64, f"{where}: {family} has {len(samples)} series"
        for _, labels in samples:
            for label, val in labels:
                assert label == "le" or not HOSTLIKE.search(val), f"{where}: {family}{{{label}={val!r}}} names a host"


def check_growth(series: list[Scrape], types: dict[str, str], where: str) -> None:
    """Every counter sample is still there in each later scrape, and never smaller."""
    for before, after in itertools.pairwise(series):
        for family, samples in before.items():
            if types.get(family) not in ("counter", "histogram"):
                continue
            for key, v in samples.items():
                if key[0].endswith("_created"):
                    continue
                assert key in after.get(family, {}), f"{where}: {key} vanished"
                assert after[family][key] >= v, f"{where}: {key} went down from {v} to {after[family][key]}"


def robots_items(report: dict[str, Any], state: str) -> int:
    return sum(n for k, n in report["robots_files"].items() if k.split(":")[0] == state)


def fetched_2xx(report: dict[str, Any]) -> int:
    return sum(n for status, n in report["fetched_by_status"].items() if status.startswith("2"))


# ============================================================================================== hostring crawl


def test_crawl_metrics_during_and_after(web: LocalWeb, tmp_path: Path, processes: list[CrawlProcess]) -> None:
    port = free_port_pair()
    out = tmp_path / "crawl"
    scope = scope_file(web, tmp_path / "scope.txt")
    cmd = crawl_cmd(
        sample_oracle().seed_urls(web),
        out,
        delay=DELAY,
        scope=scope,
        extra=["--metrics-port", str(port), "--max-pages-per-host", "60", "--max-depth", "12"],
    )
    crawl = CrawlProcess(cmd, out, tmp_path / "logs").start()
    processes.append(crawl)
    worker_series: list[Scrape] = []
    node_series: list[Scrape] = []
    types: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while crawl.running and time.monotonic() < deadline:
        for port_, series in ((port, worker_series), (port + 1, node_series)):
            got = try_scrape(port_)
            if got is not None:
                series.append(got[0])
                types.update(got[1])
                check_conventions(got[0], got[1], f"port {port_}")
        time.sleep(0.1)
    assert crawl.wait(30) == 0, crawl.output()
    report = load_report(out)

    assert len(worker_series) >= 3 and len(node_series) >= 3, "too few scrapes during the crawl"
    check_growth(worker_series, types, "worker")
    check_growth(node_series, types, "node")
    moved = [value(s, "hostring_node_leases_total", event="granted") for s in node_series]
    assert moved[-1] > moved[0], f"the lease counter did not move during the crawl: {moved}"
    # The last scrape during the crawl saw at most what the crawl finally did.
    last_w, last_n = worker_series[-1], node_series[-1]
    assert value(last_w, "hostring_worker_fetch_outcomes_total", outcome="2xx") <= fetched_2xx(report) + len(
        web.origins
    )
    assert value(last_n, "hostring_node_urls", state="fetched") <= report["by_state"]["fetched"] + robots_items(
        report, "fetched"
    )
    assert value(last_n, "hostring_node_links_discovered_total", verdict="admitted") <= report["admitted"]

    # After: a node reopened on the finished store holds exactly the report's states (robots items included).
    node, node_port = serve(
        ["node", "--store", f"sqlite:///{out / 'frontier.sqlite3'}", "--listen", "127.0.0.1:0", "--metrics-port", "0"],
        tmp_path,
        "reopened",
    )
    processes.append(node)
    with grpc.insecure_channel(f"127.0.0.1:{node_port}") as channel:
        stats = pb_grpc.FrontierStub(channel).Stats(pb.StatsRequest(), timeout=10)  # type: ignore[no-untyped-call]
    assert stats.run_id == report["run_id"]
    metrics_port = int(re.search(r"metrics on port (\d+)", node.stdout()).group(1))  # type: ignore[union-attr]
    after, after_types = scrape(metrics_port)
    check_conventions(after, after_types, "reopened node")
    for state, n in report["by_state"].items():
        assert value(after, "hostring_node_urls", state=state) == n + robots_items(report, state), state


# ============================================================================================== cluster


def test_cluster_metrics_agree_with_reports(
    web: LocalWeb, tmp_path: Path, empty_redis: str, processes: list[CrawlProcess]
) -> None:
    coord, coord_port = serve(
        ["coordinator", "--listen", "127.0.0.1:0", "--heartbeat-timeout", "5", "--metrics-port", "0"],
        tmp_path,
        "coordinator",
    )
    processes.append(coord)
    coord_addr = f"127.0.0.1:{coord_port}"
    nodes: dict[str, tuple[str, int]] = {}
    scope = scope_file(web, tmp_path / "scope.txt")
    for node_id in ("node-a", "node-b"):
        proc, port = serve(
            [
                "node",
                "--coordinator",
                coord_addr,
                "--id",
                node_id,
                "--store",
                empty_redis,
                "--listen",
                "127.0.0.1:0",
                "--delay",
                str(DELAY),
                "--scope",
                "list",
                "--scope-file",
                str(scope),
                "--max-pages-per-host",
                "60",
                "--max-depth",
                "12",
                "--metrics-port",
                "0",
            ],
            tmp_path,
            node_id,
        )
        processes.append(proc)
        nodes[node_id] = (f"127.0.0.1:{port}", _metrics_port(proc))
    coord_metrics = _metrics_port(coord)

    def ring_members() -> int:
        with grpc.insecure_channel(coord_addr) as ch:
            ring = cpb_grpc.CoordinatorStub(ch).GetRing(cpb.GetRingRequest(), timeout=5)  # type: ignore[no-untyped-call]
        return len(ring.members)

    wait_until(lambda: ring_members() == 2, 20, "both nodes in the ring")
    coord_scrape, coord_types = scrape(coord_metrics)
    check_conventions(coord_scrape, coord_types, "coordinator")
    assert value(coord_scrape, "hostring_coordinator_members", healthy="true") == 2
    assert value(coord_scrape, "hostring_coordinator_ring_epoch") >= 2

    worker_port = free_port_pair()
    worker = CrawlProcess(
        hostring_cmd(
            "worker",
            "--coordinator",
            coord_addr,
            "--id",
            "w1",
            "--allow-network",
            "127.0.0.0/8",
            "--user-agent",
            UA,
            "--metrics-port",
            str(worker_port),
        ),
        None,
        tmp_path,
        "worker",
    ).start()
    processes.append(worker)
    seeded = CrawlProcess(
        hostring_cmd("seed", "--coordinator", coord_addr, *sample_oracle().seed_urls(web)), None, tmp_path, "seed"
    ).start()
    assert seeded.wait(60) == 0, seeded.output()

    def drained() -> bool:
        total = Counter[str]()
        for addr, _ in nodes.values():
            with grpc.insecure_channel(addr) as ch:
                s = pb_grpc.FrontierStub(ch).Stats(pb.StatsRequest(), timeout=5)  # type: ignore[no-untyped-call]
            total.update(queued=s.queued, in_flight=s.in_flight, fetched=s.urls_by_state["fetched"])
        return total["fetched"] > 0 and total["queued"] == 0 and total["in_flight"] == 0

    wait_until(drained, 60, "the cluster to drain", interval=0.3)
    time.sleep(0.5)  # the worker's last Complete has been answered; let its counters settle
    reports = []
    for addr, _ in nodes.values():
        with grpc.insecure_channel(addr) as ch:
            resp = pb_grpc.FrontierStub(ch).Report(pb.ReportRequest(), timeout=30)  # type: ignore[no-untyped-call]
            reports.append(json.loads(resp.json))
    node_scrapes = []
    for node_id, (_, mport) in nodes.items():
        s, t = scrape(mport)
        check_conventions(s, t, node_id)
        node_scrapes.append(s)
    w, wt = scrape(worker_port)
    check_conventions(w, wt, "worker")

    def total(sample: str, **labels: str) -> float:
        return sum(value(s, sample, **labels) for s in node_scrapes)

    fetched_pages = sum(r["by_state"].get("fetched", 0) for r in reports)
    assert fetched_pages > 0
    assert total("hostring_node_urls", state="fetched") == fetched_pages + sum(
        robots_items(r, "fetched") for r in reports
    )
    assert total("hostring_node_leases_total", event="completed") >= fetched_pages
    assert total("hostring_node_leases_total", event="granted") >= total(
        "hostring_node_leases_total", event="completed"
    )
    assert total("hostring_node_links_discovered_total", verdict="admitted") == sum(r["admitted"] for r in reports)
    page_2xx = sum(fetched_2xx(r) for r in reports)
    assert value(w, "hostring_worker_fetch_outcomes_total", outcome="2xx") == page_2xx + total(
        "hostring_node_robots_fetches_total", status_class="2xx"
    )
    assert value(w, "hostring_worker_fetch_duration_seconds_count") == value(w, "hostring_worker_fetch_bytes_count")
    assert value(w, "hostring_worker_fetches_in_flight") == 0
    assert total("hostring_node_owned_domains") == len(web.origins)  # IP-literal hosts: one domain per origin
    epochs = {value(s, "hostring_node_ring_epoch") for s in node_scrapes}
    coord_scrape, _ = scrape(coord_metrics)
    assert epochs == {value(coord_scrape, "hostring_coordinator_ring_epoch")}


def _metrics_port(proc: CrawlProcess) -> int:
    """The metrics port a process logged ("metrics on port N"), waiting briefly for the line."""
    pattern = re.compile(r"metrics on port (\d+)")
    wait_until(lambda: pattern.search(proc.stdout()) is not None, 10, f"{proc.name}'s metrics port")
    return int(pattern.search(proc.stdout()).group(1))  # type: ignore[union-attr]


# ============================================================================================== one join, N domains

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "hostring-dashboard.json"
DEPLOY_README = DASHBOARD.parent.parent / "README.md"


def increase(expr: str, before: list[Scrape], after: list[Scrape]) -> float:
    """Evaluate `[sum(]increase(METRIC{label="v",...}[RANGE])[)]` over scrapes taken before and after a change,
    as Prometheus would with the two samples inside the range: the sum of (after - before) of matching series."""
    import promql_parser

    node = promql_parser.parse(re.sub(r"\$__(rate_interval|interval|range)", "5m", expr))
    if isinstance(node, promql_parser.AggregateExpr):
        assert str(node.op) == "sum" and node.modifier is None, expr
        node = node.expr
    assert isinstance(node, promql_parser.Call) and node.func.name == "increase", expr
    selector = node.args[0].vector_selector
    labels = {m.name: m.value for m in selector.matchers.matchers}
    sample = selector.name
    return sum(value(a, sample, **labels) - value(b, sample, **labels) for b, a in zip(before, after, strict=True))


def moves_expressions() -> list[str]:
    """Every dashboard and deploy-README expression about ring changes or moved domains."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [
        t["expr"] for p in panels for t in p.get("targets", []) if re.search(r"domains_moved|ring_changes", t["expr"])
    ]
    exprs += re.findall(r"`((?:sum\()?increase\(hostring_\w+(?:\{[^}]*\})?\[5m\]\)\)?)`", DEPLOY_README.read_text())
    return exprs


def test_one_join_moves_n_domains_and_every_counter_says_n(
    tmp_path: Path, empty_redis: str, processes: list[CrawlProcess]
) -> None:
    """Node a holds 24 domains; node b joins and takes over the N of them the new ring gives it. The coordinator
    counts one ring change and N domains as it commits the change, node b N in, node a N out; every dashboard and
    README expression over moved domains evaluates to N (one ring change for the ring-change panel)."""
    coord, coord_port = serve(
        [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            empty_redis,
            "--heartbeat-timeout",
            "5",
            "--metrics-port",
            "0",
        ],
        tmp_path,
        "coordinator",
    )
    processes.append(coord)
    coord_addr = f"127.0.0.1:{coord_port}"

    def node(node_id: str) -> tuple[str, int]:
        proc, port = serve(
            ["node", "--coordinator", coord_addr, "--id", node_id, "--store", empty_redis, "--listen", "127.0.0.1:0",
             "--metrics-port", "0"],
            tmp_path,
            node_id,
        )  # fmt: skip
        processes.append(proc)
        return f"127.0.0.1:{port}", _metrics_port(proc)

    def ring() -> cpb.RingState:
        with grpc.insecure_channel(coord_addr) as ch:
            return cpb_grpc.CoordinatorStub(ch).GetRing(cpb.GetRingRequest(), timeout=5)  # type: ignore[no-untyped-call,no-any-return]

    a_addr, a_metrics = node("node-a")
    wait_until(lambda: len(ring().members) == 1, 20, "node a in the ring")
    domains = [f"d{i}.example" for i in range(24)]
    seeded = CrawlProcess(
        hostring_cmd("seed", "--coordinator", coord_addr, *[f"http://{d}/" for d in domains]), None, tmp_path, "seed"
    ).start()
    assert seeded.wait(60) == 0, seeded.output()

    def owned(address: str) -> int:
        with grpc.insecure_channel(address) as ch:
            return int(pb_grpc.FrontierStub(ch).Stats(pb.StatsRequest(), timeout=5).owned_domains)  # type: ignore[no-untyped-call]

    wait_until(lambda: owned(a_addr) == len(domains), 20, "node a holding every domain")
    coord_metrics = _metrics_port(coord)
    before = [scrape(coord_metrics)[0], scrape(a_metrics)[0]]

    b_addr, b_metrics = node("node-b")
    wait_until(lambda: len(ring().members) == 2, 20, "node b in the ring")
    from hostring.membership import ring_from_proto

    new_ring = ring_from_proto(ring())
    n = sum(1 for d in domains if new_ring.owner(d).node_id == "node-b")  # type: ignore[union-attr]
    assert 0 < n < len(domains)
    wait_until(lambda: owned(b_addr) == n and owned(a_addr) == len(domains) - n, 20, "the handoff")
    after = [scrape(coord_metrics)[0], scrape(a_metrics)[0], scrape(b_metrics)[0]]
    # node b's counters start at 0 with the process: its "before" is an empty scrape.
    before.append({})
    c_before, a_before, b_before = before
    c_after, a_after, b_after = after

    moved = value(c_after, "hostring_coordinator_domains_moved_total") - value(
        c_before, "hostring_coordinator_domains_moved_total"
    )
    changes = value(c_after, "hostring_coordinator_ring_changes_total") - value(
        c_before, "hostring_coordinator_ring_changes_total"
    )
    moved_in = value(b_after, "hostring_node_domains_moved_total", direction="in")
    moved_out = value(a_after, "hostring_node_domains_moved_total", direction="out") - value(
        a_before, "hostring_node_domains_moved_total", direction="out"
    )
    assert (moved, moved_in, moved_out, changes) == (n, n, n, 1)
    assert value(b_after, "hostring_node_domains_moved_total", direction="out") == 0
    for s, role in ((c_after, "coordinator"), (a_after, "node"), (b_after, "node")):
        assert value(s, "hostring_build_info", role=role) == 1
        assert all(f.startswith((f"hostring_{role}_", "hostring_build_info")) for f in s), sorted(s)

    exprs = moves_expressions()
    assert len(exprs) >= 3, exprs
    for expr in exprs:
        want = 1 if "ring_changes" in expr else n
        got = increase(expr, [c_before, a_before, b_before], [c_after, a_after, b_after])
        assert got == want, f"{expr} says {got}, the join moved {n} domains in one ring change"
