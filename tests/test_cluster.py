"""The cluster end to end: real processes, real Redis, real gRPC and a real local web on loopback.

A coordinator, frontier nodes (`hostring node --coordinator ... --store redis://...`) and fetch workers
(`hostring worker`) run as subprocesses, each in its own process group so teardown can kill every one of them.
The web is a `LocalWeb` in this process: its request log is the judge of politeness and coverage. The nodes'
journals in Redis (read with `RedisStore.export_domain`, writers and epochs included) are the judge of why a
page was fetched twice, and the nodes' own reports (`Report` RPC, `hostring status`) are the judge of who owns
which domain, checked against the ring math of `hostring.ring.Ring`.

Tests:
- test_cluster_join_and_sigkill_during_crawl (slow, ~20 s): 3 nodes + 3 workers crawl 32 origins; a 4th node
  joins at 15% of the crawl, one node is SIGKILLed at 40%; politeness, coverage, double fetches, ownership moves,
  `hostring status`, fences. Checks that need not stop the run are collected and reported together at the end,
  after a timeline (printed; pytest shows it when the test fails).
- test_two_nodes_route_links_to_owners (slow, ~5 s): 2 nodes + 1 worker, 8 origins; exactly once, owners only.
- handoff races, in process (~1-6 s): the window where the new owner has applied a ring and the old owner has not,
  entered deterministically: state counts after a fenced write, a domain created in the window, and the links of
  a completion whose flush was partly fenced.

Only servers started here on 127.0.0.0/8 are contacted. Every wait is bounded.

Redis: the session's `redis_url` fixture (a throwaway redis-server unless $REDIS_URL is set). The node CLI has
no namespace flag (every node writes the namespace "hostring"), so each test takes a Redis database of its own
that is empty when it starts (`empty_redis`) and deletes its keys afterwards.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.proc import GroupProcess, child_env
from coordinator.localweb import LocalWeb, Oracle, oracle_for, random_model, render_model
from frontier_node.store.redis import ROBOTS_PREFIX, RedisStore
from hostring.membership import ring_from_proto
from hostring.ring import Ring
from hostring.urls import identify
from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from tests.crawl_helpers import (
    LOOPBACK,
    REPO,
    TOKEN,
    UA,
    gaps,
    needed_depth,
    politeness_violations,
)

STARTUP_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 10.0
_HANDOFF_LINE = re.compile(r"ring epoch (\d+): (\d+) members, released (\d+) domains, adopted (\d+)")
_SERVING = health_pb2.HealthCheckResponse.SERVING


# ============================================================================================== processes


class Proc(GroupProcess):
    """One hostring subprocess in its own session (process group); output goes to files in `log_dir`.

    Tests stop with SIGKILL unless told otherwise, and a process that never announces its port fails the test
    with its last log messages.
    """

    stop_signal = signal.SIGKILL

    def __init__(self, name: str, cmd: list[str], log_dir: Path) -> None:
        super().__init__(name, cmd, log_dir, cwd=REPO)

    def port(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        try:
            return super().port(timeout)
        except RuntimeError:
            raise AssertionError(f"{self.name} did not announce its port within {timeout}s\n{self.tail()}") from None

    def tail(self, n: int = 12) -> str:
        """The last `n` distinct log messages (repeats counted, tracebacks cut to their last lines)."""
        out = self.out_path.read_text(errors="replace")[-300:].strip()
        counted: list[list[Any]] = []
        for msg, exc in log_records(self.log()):
            text = re.sub(r"\d+\.\d+s|:\d{4,5}\b", "", msg)  # so that repeats differing in a time or port merge
            if counted and counted[-1][0] == text:
                counted[-1][2] += 1
            else:
                counted.append([text, msg + ("\n    " + "\n    ".join(exc.splitlines()[-3:]) if exc else ""), 1])
        lines = [f"  {full}" + (f"  (x{k})" if k > 1 else "") for _, full, k in counted[-n:]]
        return f"--- {self.name} (pid {self.proc.pid}, rc {self.proc.poll()}); stdout: {out}\n" + "\n".join(lines)


def hostring_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", *args]


class Cluster:
    """A coordinator, nodes and workers as subprocesses, with stubs to each and a timeline of what happened."""

    def __init__(
        self, log_dir: Path, redis_url: str, *, heartbeat_timeout: float, delay: float, lease_s: float
    ) -> None:
        self.log_dir = log_dir
        self.redis_url = redis_url
        self.heartbeat_timeout = heartbeat_timeout
        self.delay = delay
        self.lease_s = lease_s
        self.procs: dict[str, Proc] = {}
        self.addresses: dict[str, str] = {}
        self.coordinator = ""
        self._channels: dict[str, grpc.Channel] = {}
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, str]] = []
        self.hits_of: Callable[[], int] = lambda: 0

    # ---- lifecycle

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process started here (workers first), by process group, and close the channels."""
        for kind in ("w", "n", "coordinator"):
            for name, proc in self.procs.items():
                if name.startswith(kind):
                    proc.stop(signal.SIGKILL)
        for channel in self._channels.values():
            channel.close()
        self._channels = {}

    def note(self, text: str) -> None:
        self.timeline.append((time.monotonic() - self.t0, f"{text} [server hits: {self.hits_of()}]"))

    def timeline_text(self) -> str:
        return "timeline:\n" + "\n".join(f"  {t:7.2f}s  {what}" for t, what in self.timeline)

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs.values())

    def _start(self, name: str, *args: str) -> Proc:
        proc = Proc(name, hostring_cmd("--log-level", "INFO", *args), self.log_dir)
        self.procs[name] = proc
        return proc

    def start_coordinator(self) -> None:
        proc = self._start(
            "coordinator",
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            self.redis_url,
            "--heartbeat-timeout",
            str(self.heartbeat_timeout),
        )
        self.coordinator = f"127.0.0.1:{proc.port()}"
        self.note(f"coordinator up at {self.coordinator}")

    def start_nodes(self, *node_ids: str) -> None:
        """Start nodes at once (their imports overlap), then wait for each one's port."""
        procs = [
            self._start(node_id, "node", "--coordinator", self.coordinator, "--id", node_id,
                        "--listen", "127.0.0.1:0", "--store", self.redis_url, "--delay", str(self.delay),
                        "--lease-s", str(self.lease_s), "--user-agent", UA)
            for node_id in node_ids
        ]  # fmt: skip
        for node_id, proc in zip(node_ids, procs, strict=True):
            self.addresses[node_id] = f"127.0.0.1:{proc.port()}"
            self.note(f"node {node_id} listening at {self.addresses[node_id]}")

    def start_workers(self, *worker_ids: str) -> None:
        for wid in worker_ids:
            self._start(
                wid,
                "worker",
                "--coordinator",
                self.coordinator,
                "--allow-network",
                LOOPBACK,
                "--id",
                wid,
                "--user-agent",
                UA,
                "--fetch-timeout",
                "10",
                "--grace",
                "1",
            )
        self.note(f"workers {', '.join(worker_ids)} started")

    # ---- gRPC

    def _channel(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.insecure_channel(address)
        return channel

    def ring(self) -> Ring:
        stub = cpb_grpc.CoordinatorStub(self._channel(self.coordinator))  # type: ignore[no-untyped-call]
        return ring_from_proto(stub.GetRing(cpb.GetRingRequest(), timeout=RPC_TIMEOUT_S))

    def frontier(self, node_id: str) -> pb_grpc.FrontierStub:
        return pb_grpc.FrontierStub(self._channel(self.addresses[node_id]))  # type: ignore[no-untyped-call]

    def stats(self, node_id: str) -> pb.StatsResponse:
        with self._failing(node_id, "Stats"):
            stats: pb.StatsResponse = self.frontier(node_id).Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
        return stats

    @contextlib.contextmanager
    def _failing(self, node_id: str, method: str) -> Iterator[None]:
        """Turn a failed call into an AssertionError that quotes the exception the node logged, if any."""
        try:
            yield
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise  # transient: callers that poll retry
            details = _safe(e.details) if callable(getattr(e, "details", None)) else ""
            logged = node_errors(self, [node_id]).get(node_id, "nothing logged")
            raise AssertionError(f"{method} on {node_id} failed: {code} {details}; the node logged: {logged}") from None

    def serving(self, node_id: str) -> bool:
        stub = health_pb2_grpc.HealthStub(self._channel(self.addresses[node_id]))
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S).status
        return bool(status == _SERVING)

    def report(self, node_id: str) -> dict[str, Any]:
        with self._failing(node_id, "Report"):
            resp = self.frontier(node_id).Report(pb.ReportRequest(dispositions=True), timeout=RPC_TIMEOUT_S)
        report: dict[str, Any] = json.loads(resp.json)
        return report

    def settled(self, members: set[str]) -> Ring | None:
        """The coordinator's ring when it has exactly `members` and every one of them applied it and is SERVING."""
        try:
            ring = self.ring()
            if set(ring.members) != members:
                return None
            for node_id in members:
                if self.stats(node_id).ring_epoch != ring.epoch or not self.serving(node_id):
                    return None
        except grpc.RpcError:
            return None
        return ring

    def wait_settled(self, members: set[str], timeout: float) -> Ring:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ring = self.settled(members)
            if ring is not None:
                return ring
            time.sleep(0.05)
        raise AssertionError(
            f"ring did not settle on {sorted(members)} within {timeout}s (coordinator: {_safe(self.ring)})"
        )

    # ---- the CLI

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a short `hostring` command to its end (bounded), in its own process group."""
        proc = subprocess.Popen(
            hostring_cmd(*args),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=child_env(),
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
            raise AssertionError(f"hostring {' '.join(args)} did not end within {timeout}s") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def seed(self, urls: Sequence[str]) -> str:
        seeds = self.log_dir / "seeds.txt"
        seeds.write_text("\n".join(urls) + "\n", encoding="utf-8")
        done = self.cli("seed", "--coordinator", self.coordinator, "--file", str(seeds))
        assert done.returncode == 0, f"hostring seed failed ({done.returncode}): {done.stdout}{done.stderr[-2000:]}"
        self.note(f"seeded: {done.stdout.strip()}")
        return done.stdout

    def status(self) -> tuple[str, dict[str, Any]]:
        """`hostring status` as text and as JSON."""
        text = self.cli("status", "--coordinator", self.coordinator)
        assert text.returncode == 0, text.stderr[-2000:]
        js = self.cli("status", "--coordinator", self.coordinator, "--json")
        assert js.returncode == 0, js.stderr[-2000:]
        parsed: dict[str, Any] = json.loads(js.stdout)
        return text.stdout, parsed

    # ---- ownership as the nodes report it

    def reported_owners(self, node_ids: Sequence[str]) -> dict[str, set[str]]:
        """domain -> the nodes whose Report lists URLs of it (rows of domains whose fence names the node)."""
        owners: dict[str, set[str]] = {}
        for node_id in node_ids:
            for row in self.report(node_id)["dispositions"]:
                owners.setdefault(identify(row["url"]).domain, set()).add(node_id)
        return owners

    def handoffs(self, node_id: str) -> dict[int, tuple[int, int, int]]:
        """epoch -> (members, released, adopted) from the node's "ring epoch ..." log lines."""
        out = {}
        for msg, _ in log_records(self.procs[node_id].log()):
            m = _HANDOFF_LINE.search(msg)
            if m is not None:
                out[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        return out


def log_records(text: str) -> list[tuple[str, str]]:
    """(message, traceback) of every record of a process log, in text or JSON-lines format (`--log-format`)."""
    records: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                records.append((str(rec.get("msg", "")), str(rec.get("exc", ""))))
                continue
        if re.match(r"\d{4}-\d\d-\d\d[ T]", line) or not records:
            records.append((line, ""))
        else:  # a traceback line of the text format belongs to the record before it
            msg, exc = records[-1]
            records[-1] = (msg, f"{exc}\n{line}" if exc else line)
    return records


def node_errors(c: Cluster, node_ids: Sequence[str]) -> dict[str, str]:
    """node -> the first exception its process logged (message and the traceback's last lines), for nodes that did."""
    out: dict[str, str] = {}
    for node_id in node_ids:
        failed = [(m, e) for m, e in log_records(c.procs[node_id].log()) if e or "Traceback" in m]
        if failed:
            msg, exc = failed[0]
            out[node_id] = f"{len(failed)} logged exception(s), first: {msg}\n" + "\n".join(exc.splitlines()[-6:])
    return out


def assert_no_node_errors(c: Cluster, node_ids: Sequence[str], when: str) -> None:
    errors = node_errors(c, node_ids)
    assert not errors, f"{when}: nodes failed calls:\n" + "\n".join(f"{n}: {e}" for n, e in errors.items())


def _safe(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # for messages only
        return repr(e)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> float:
    """Poll until `predicate` holds; the seconds it took. AssertionError naming `what` after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start


# ============================================================================================== judging


def single_owner(owners: dict[str, set[str]]) -> dict[str, str]:
    """domain -> its one reporting node; AssertionError naming domains that two nodes report."""
    doubled = {d: sorted(ns) for d, ns in owners.items() if len(ns) != 1}
    assert not doubled, f"domains reported by more than one node: {doubled}"
    return {d: next(iter(ns)) for d, ns in owners.items()}


def redis_progress(judge: RedisStore) -> Counter[str]:
    """Rows by state over every domain in Redis (the write script keeps these counters)."""
    total: Counter[str] = Counter()
    for domain in judge.all_domains():
        total.update(judge.domain_counts(domain))
    return total


def journals(judge: RedisStore) -> dict[str, list[dict[str, Any]]]:
    """fetch key -> its journal lines from every writer, in applied order (epoch, seq), from Redis."""
    out: dict[str, list[dict[str, Any]]] = {}
    for domain in sorted(judge.all_domains()):
        for line in judge.export_domain(domain)["journal"]:
            _seq, _run_id, key, attempt, generation, frm, event, to, at, *_ = line["entry"]
            out.setdefault(key, []).append(
                {
                    "writer": line["writer"],
                    "epoch": line["epoch"],
                    "event": event,
                    "from": frm,
                    "to": to,
                    "gen": generation,
                    "attempt": attempt,
                    "at": at,
                }
            )
    return out


def key_for_resource(web: LocalWeb, oracle: Oracle, origin: str, resource: str) -> str:
    """The fetch key (or robots item key) a server-side (origin, resource) was requested under."""
    label = web.labels[origin]
    if resource == "/robots.txt":
        return ROBOTS_PREFIX + identify(web.url(label)).origin
    for home, target in oracle.robots_redirects.items():
        if target == (label, resource):
            return ROBOTS_PREFIX + identify(web.url(home)).origin
    return identify(origin + resource).fetch_key


def unexplained_duplicates(web: LocalWeb, oracle: Oracle, lines: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Resources the server served more often than once plus the recorded lease expiries of their key."""
    bad = []
    for origin, resource, n in web.duplicates(include_robots=True):
        key = key_for_resource(web, oracle, origin, resource)
        history = lines.get(key, [])
        expiries = sum(1 for e in history if e["event"] == "expire")
        if n > 1 + expiries:
            bad.append(
                f"{origin}{resource} fetched {n}x with {expiries} lease expiries; journal of {key}: "
                + "; ".join(f"{e['writer']}@{e['epoch']} {e['event']} g{e['gen']}" for e in history)
            )
    return bad


def web_and_oracle(seed: int, origins: int, pages: int) -> tuple[dict[str, Any], Oracle, int]:
    """A generated web without slow corners: no 503 robots (Retry-After 60), no traps; every root a seed.

    No robots.txt redirects either: in a cluster a robots file redirecting to a host another node paces is not
    followed (known limitation, see test_robots_redirect_to_another_nodes_domain_is_not_followed).
    """
    model = random_model(
        seed,
        origins=origins,
        pages_per_origin=pages,
        unavailable_robots=0,
        redirect_robots_fraction=0.0,
        trap_fraction=0.0,
        seeds=origins,
        user_agent=TOKEN,
    )
    return render_model(model, seed), oracle_for(model), needed_depth(model)


def domains_of(web: LocalWeb) -> list[str]:
    return sorted({identify(origin + "/").domain for origin in web.labels}, key=ipaddress.ip_address)


# ============================================================================================== the big one

ORIGINS = 32
PAGES = 24
DELAY_S = 0.3
LEASE_S = 3.0
HEARTBEAT_TIMEOUT_S = 2.0
JOIN_AT = 0.15  # fraction of the expected requests served when the fourth node starts
KILL_AT = 0.40  # ... and when a node is SIGKILLed (after the join has settled)
CRAWL_TIMEOUT_S = 60.0
# The web's server runs in this test process, beside ~10 busy processes on a small machine: a server thread that
# is descheduled between writing a response and stamping its end makes the next gap look shorter than it was.
# crawl_helpers' 20 ms (single-node crawls) proved too tight here (one 21 ms shortfall between two requests one
# node leased, in one run out of ~15); 50 ms is still far below the delay and catches every cross-node overlap
# seen so far.
GAP_TOLERANCE_S = 0.05


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_cluster_join_and_sigkill_during_crawl(empty_redis: str, tmp_path: Path) -> None:
    """3 nodes + 3 workers crawl 32 origins; a 4th node joins, later one node is SIGKILLed. Judged from the
    server log (politeness, coverage), the Redis journals (every double fetch has a recorded lease expiry), the
    nodes' own reports (only the domains the ring math moves have moved, and only to/from the changed node) and
    `hostring status` (the new ring)."""
    sites, oracle, depth = web_and_oracle(2024, ORIGINS, PAGES)
    assert depth <= 18, "the generated web needs more than the nodes' default --max-depth"
    expected_requests = len(oracle.reachable_allowed) + len(oracle.robots_fetches)
    judge = RedisStore(redis.Redis.from_url(empty_redis), node_id="test-judge", epoch=0)
    with (
        LocalWeb(sites) as web,
        Cluster(tmp_path, empty_redis, heartbeat_timeout=HEARTBEAT_TIMEOUT_S, delay=DELAY_S, lease_s=LEASE_S) as c,
    ):
        c.hits_of = lambda: len(web.hits)
        domains = domains_of(web)
        assert len(domains) == ORIGINS
        try:
            _scenario(c, web, oracle, judge, domains, expected_requests)
        except BaseException:
            print(c.timeline_text())
            print(c.logs())
            raise
        finally:
            judge.client.close()
        print(c.timeline_text())


def _scenario(
    c: Cluster, web: LocalWeb, oracle: Oracle, judge: RedisStore, domains: list[str], expected_requests: int
) -> None:
    def served() -> float:
        return len(web.hits) / expected_requests

    # ---- three nodes, seeded, three workers
    c.start_coordinator()
    c.start_nodes("n1", "n2", "n3")
    ring3 = c.wait_settled({"n1", "n2", "n3"}, STARTUP_TIMEOUT_S)
    c.note(f"ring settled: epoch {ring3.epoch}, {sorted(ring3.members)}")
    c.seed(oracle.seed_urls(web))
    c.start_workers("w1", "w2", "w3")
    crawl_started = time.monotonic()

    # ---- the fourth node joins
    wait_for(lambda: served() >= JOIN_AT, CRAWL_TIMEOUT_S, f"{JOIN_AT:.0%} of the crawl")
    ring_before_join = c.ring()
    owners_before_join = single_owner(c.reported_owners(["n1", "n2", "n3"]))
    assert set(owners_before_join) == set(domains), "every seeded domain is held by a node before the join"
    for d, node in owners_before_join.items():
        assert ring_before_join.owns(node, d), f"{d} reported by {node}, ring {ring_before_join} says otherwise"
    c.note(f"n4 starting (ring epoch {ring_before_join.epoch})")
    join_t0 = time.monotonic()
    c.start_nodes("n4")
    ring_after_join = c.wait_settled({"n1", "n2", "n3", "n4"}, 20.0)
    c.note(f"join settled in {time.monotonic() - join_t0:.2f}s from process start: epoch {ring_after_join.epoch}")
    owners_after_join = single_owner(c.reported_owners(["n1", "n2", "n3", "n4"]))
    assert ring_after_join.epoch > ring_before_join.epoch

    predicted = ring_before_join.moved(ring_after_join, domains)
    observed = {
        d: (owners_before_join[d], owners_after_join.get(d))
        for d in domains
        if owners_before_join[d] != owners_after_join.get(d)
    }
    c.note(f"join moved {len(observed)}/{len(domains)} domains: {sorted(Counter(observed.values()).items())}")
    assert observed == predicted, f"moves as the nodes report them {observed} != the ring's {predicted}"
    assert all(new == "n4" for _, new in observed.values()), f"a domain moved between old nodes: {observed}"
    moved = len(observed) / len(domains)
    assert 0.25 / 1.5 <= moved <= 0.25 * 1.5, f"moved fraction {moved:.3f} not within 1.5x of 1/4"
    synthetic = [f"site{i}.example" for i in range(10_000)]
    ring_moved = len(ring_before_join.moved(ring_after_join, synthetic)) / len(synthetic)
    assert 0.25 / 1.5 <= ring_moved <= 0.25 * 1.5, f"ring math: {ring_moved:.3f} of 10k domains moved"
    c.note(f"moved fraction {moved:.3f} of the web's domains, {ring_moved:.3f} of 10k synthetic ones")
    # the nodes' own log lines agree
    for node_id in ("n1", "n2", "n3", "n4"):
        handoff = c.handoffs(node_id).get(ring_after_join.epoch)
        assert handoff is not None, f"{node_id} logged no handoff for epoch {ring_after_join.epoch}"
        released = sum(1 for old, _ in observed.values() if old == node_id)
        adopted = sum(1 for _, new in observed.values() if new == node_id)
        assert handoff[1:] == (released, adopted), (
            f"{node_id} logged {handoff} for the join, expected released {released}, adopted {adopted}"
        )
    problems: list[str] = []  # checks that do not stop the run: all are listed at the end
    problems += _check_status(c, ring_after_join, {"n1", "n2", "n3", "n4"}, domains)

    # ---- one node is SIGKILLed while it has work
    def kill_time() -> bool:
        assert_no_node_errors(c, ["n1", "n2", "n3", "n4"], "after the join")  # fail fast, with the traceback
        return served() >= KILL_AT

    wait_for(kill_time, CRAWL_TIMEOUT_S, f"{KILL_AT:.0%} of the crawl")
    work = {n: (s.queued + s.in_flight) for n in ("n1", "n2", "n3") for s in [c.stats(n)]}
    victim = max(work, key=lambda n: (work[n], n))
    assert work[victim] > 0, f"no old node has work left to lose at {KILL_AT:.0%}: {work}"
    ring_before_kill = c.ring()
    owners_before_kill = single_owner(c.reported_owners(["n1", "n2", "n3", "n4"]))
    fetched_by_victim = {row["key"] for row in c.report(victim)["dispositions"] if row["state"] == "fetched"}
    c.note(f"SIGKILL {victim} (queued+in flight {work}; {len(fetched_by_victim)} URLs fetched under it)")
    kill_t0 = time.monotonic()
    c.procs[victim].stop(signal.SIGKILL)
    left_after = wait_for(
        lambda: victim not in c.ring().members, HEARTBEAT_TIMEOUT_S + 8.0, f"{victim} to leave the ring", interval=0.05
    )
    c.note(f"{victim} left the ring {left_after:.2f}s after the kill")
    assert left_after >= HEARTBEAT_TIMEOUT_S / 2, (
        f"{victim} left {left_after:.2f}s after the kill: before its "
        f"heartbeat timeout of {HEARTBEAT_TIMEOUT_S}s could have passed"
    )
    survivors = {"n1", "n2", "n3", "n4"} - {victim}
    ring_after_kill = c.wait_settled(survivors, 20.0)
    c.note(f"survivors settled {time.monotonic() - kill_t0:.2f}s after the kill: epoch {ring_after_kill.epoch}")
    owners_after_kill = single_owner(c.reported_owners(sorted(survivors)))
    assert set(owners_after_kill) >= set(domains)
    predicted = ring_before_kill.moved(ring_after_kill, domains)
    observed = {
        d: (owners_before_kill[d], owners_after_kill[d])
        for d in domains
        if owners_before_kill[d] != owners_after_kill[d]
    }
    c.note(f"kill moved {len(observed)} domains: {sorted(Counter(observed.values()).items())}")
    between_survivors = {d: mv for d, mv in observed.items() if mv[0] in survivors}
    assert not between_survivors, f"domains moved between surviving nodes: {between_survivors}"
    assert observed == predicted, f"moves as the nodes report them {observed} != the ring's {predicted}"
    assert {d for d, n in owners_before_kill.items() if n == victim} == set(observed)
    problems += _check_status(c, ring_after_kill, survivors, domains)
    assert ring_after_kill.epoch > ring_after_join.epoch
    # the survivors took the victim's domains with their state from Redis: what it fetched stays fetched
    states = {row["key"]: row["state"] for n in sorted(survivors) for row in c.report(n)["dispositions"]}
    lost = {k: states.get(k) for k in fetched_by_victim if states.get(k) != "fetched"}
    assert not lost, f"URLs fetched under {victim} are not fetched on the survivors: {sorted(lost.items())[:10]}"

    # ---- the crawl finishes
    def finished() -> bool:
        assert_no_node_errors(c, sorted(survivors), "after the kill")
        progress = redis_progress(judge)
        if progress["scheduled"] or progress["leased"] or progress["retryable"]:
            return False
        return time.time() - max((h.end for h in web.hits), default=0.0) > 1.0

    try:
        wait_for(finished, CRAWL_TIMEOUT_S, "Redis to show nothing scheduled, leased or retryable", interval=0.25)
    except AssertionError as e:
        if "nodes failed calls" in str(e):
            raise
        stats = "; ".join(
            f"{n}: queued {s.queued}, in flight {s.in_flight}, {dict(s.urls_by_state)}"
            for n in sorted(survivors)
            for s in [c.stats(n)]
        )
        raise AssertionError(f"{e}; Redis rows {dict(redis_progress(judge))}; nodes: {stats}") from None
    assert_no_node_errors(c, sorted(survivors), "during the crawl")
    c.note(
        f"crawl finished {time.monotonic() - crawl_started:.2f}s after the workers started: "
        f"Redis rows by state {dict(redis_progress(judge))}"
    )

    def nodes_idle() -> bool:
        stats = [c.stats(n) for n in sorted(survivors)]
        return all(s.queued == 0 and s.in_flight == 0 and not s.urls_by_state.get("retryable") for s in stats)

    try:
        wait_for(nodes_idle, 5.0, "every node's Stats to show nothing queued, in flight or retryable")
    except AssertionError:
        raise AssertionError(
            "Redis says the crawl is over but the nodes' Stats disagree: "
            + "; ".join(
                f"{n}: queued {s.queued}, in flight {s.in_flight}, by state {dict(s.urls_by_state)}"
                for n in sorted(survivors)
                for s in [c.stats(n)]
            )
        ) from None
    for wid in ("w1", "w2", "w3"):
        c.procs[wid].stop(signal.SIGTERM, timeout=5.0)
    victim_address = c.addresses[victim]
    retried = sum(
        1
        for w in ("w1", "w2", "w3")
        for msg, _ in log_records(c.procs[w].log())
        if f"complete on {victim_address} failed" in msg
    )
    c.note(f"workers stopped; they retried {retried} Complete calls meant for the killed {victim} elsewhere")

    # ---- judged from the server log and the journals in Redis; every problem is listed, not just the first
    lines = journals(judge)
    for label in web.origins:
        if web.max_concurrency(label) > 1:
            problems.append(f"{label} saw {web.max_concurrency(label)} requests at once")
    problems += politeness_problems(web, oracle, lines, DELAY_S)
    smallest = min((web.min_gap(label), label) for label in web.origins)
    c.note(f"smallest pause on any origin: {smallest[0]:.3f}s ({smallest[1]}; delay {DELAY_S}s)")
    verdict = oracle.judge(web.fetched())
    for what in ("missing", "forbidden", "unexpected"):
        if verdict[what]:
            problems.append(f"coverage: {len(verdict[what])} {what} pages, e.g. {sorted(verdict[what])[:5]}")
    bad = unexplained_duplicates(web, oracle, lines)
    problems += [f"fetched more than once without a recorded lease expiry: {b}" for b in bad]
    expiries = sum(1 for hist in lines.values() for e in hist if e["event"] == "expire")
    c.note(
        f"{len(web.hits)} requests, {len(web.duplicates(include_robots=True))} resources fetched twice, "
        f"{expiries} lease expiries journaled"
    )
    # every domain's fence names its owner in the final ring, and its URLs live on that node only
    for d in domains:
        fence, owner = judge.fence(d), ring_after_kill.owner(d)
        if fence is None or owner is None or fence[0] != owner.node_id:
            problems.append(f"fence of {d} is {fence}, its owner in the final ring is {owner}")
    final = single_owner(c.reported_owners(sorted(survivors)))
    problems += [f"{d} reported by {n}, not its owner" for d, n in final.items() if not ring_after_kill.owns(n, d)]
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def leased_by(lines: dict[str, list[dict[str, Any]]], key: str, at: float) -> str:
    """Which node journaled the lease of `key` that a request starting at `at` served (the last one before)."""
    leases = [e for e in lines.get(key, []) if e["event"] == "lease" and e["at"] <= at + 0.05]
    return f"{leases[-1]['writer']}@epoch{leases[-1]['epoch']}" if leases else "no lease journaled"


def politeness_problems(
    web: LocalWeb, oracle: Oracle, lines: dict[str, list[dict[str, Any]]], delay: float
) -> list[str]:
    """politeness_violations, each annotated with the node that leased either request (from the journals)."""
    out = []
    for label in web.origins:
        if not politeness_violations(web, label, delay, GAP_TOLERANCE_S):
            continue
        origin = web.origins[label]
        for gap, prev, cur in gaps(web.hits_for(label)):
            if gap >= delay - GAP_TOLERANCE_S and cur.concurrent <= 1:
                continue
            who = [leased_by(lines, key_for_resource(web, oracle, origin, h.resource), h.start) for h in (prev, cur)]
            out.append(
                f"politeness: {label}: {cur.path} started {gap:.3f}s after {prev.path} ended "
                f"(delay {delay}s, {cur.concurrent} in flight); leased by {who[0]} and {who[1]}"
            )
    return out


def _check_status(c: Cluster, ring: Ring, members: set[str], domains: Sequence[str]) -> list[str]:
    """`hostring status` (text and --json) shows `ring`: its epoch, its members, each at that epoch (asserted);
    the problems with what each node says it owns (its domain count against the ring's share of the web)."""
    text, js = c.status()
    assert f"ring epoch {ring.epoch}, {len(members)} node(s)" in text, text
    for node_id in members:
        assert re.search(rf"^{node_id}\s+{re.escape(c.addresses[node_id])}\s", text, re.M), text
    assert js["ring_epoch"] == ring.epoch, js
    rows = {row["node"]: row for row in js["nodes"]}
    assert set(rows) == members, js
    for row in rows.values():
        assert "error" not in row and row["epoch"] == ring.epoch, row
    share = Counter(ring.owner(d).node_id for d in domains)  # type: ignore[union-attr]
    c.note(
        f"hostring status: epoch {ring.epoch}, "
        + ", ".join(
            f"{n} {rows[n]['domains']} domains (ring: {share[n]})/{rows[n]['queued']} queued" for n in sorted(rows)
        )
    )
    return [
        f"hostring status at epoch {ring.epoch}: {n} reports {rows[n]['domains']} owned domains, the ring gives "
        f"it {share[n]} of the web's {len(domains)}"
        for n in sorted(rows)
        if rows[n]["domains"] != share[n]
    ]


# ============================================================================================== two nodes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_nodes_route_links_to_owners(empty_redis: str, tmp_path: Path) -> None:
    """2 nodes + 1 worker, 8 origins linking across each other: every page fetched exactly once, every domain's
    URLs on its ring owner only (node reports and Redis fences), robots files once per origin."""
    sites, oracle, depth = web_and_oracle(7, 8, 6)
    assert depth <= 18
    judge = RedisStore(redis.Redis.from_url(empty_redis), node_id="test-judge", epoch=0)
    with LocalWeb(sites) as web, Cluster(tmp_path, empty_redis, heartbeat_timeout=5.0, delay=0.05, lease_s=30.0) as c:
        c.hits_of = lambda: len(web.hits)
        try:
            domains = domains_of(web)
            c.start_coordinator()
            c.start_nodes("n1", "n2")
            ring = c.wait_settled({"n1", "n2"}, STARTUP_TIMEOUT_S)
            by_owner = Counter(ring.owner(d).node_id for d in domains)  # type: ignore[union-attr]
            assert set(by_owner) == {"n1", "n2"}, f"the ring gives every origin to one node: {by_owner}"
            c.seed(oracle.seed_urls(web))
            c.start_workers("w1")

            def finished() -> bool:
                progress = redis_progress(judge)
                idle = not (progress["scheduled"] or progress["leased"] or progress["retryable"])
                return idle and time.time() - max((h.end for h in web.hits), default=0.0) > 0.5

            wait_for(finished, 60.0, "the crawl to finish", interval=0.2)
            c.note(f"crawl finished; Redis rows by state {dict(redis_progress(judge))}")
            assert c.ring().epoch == ring.epoch, "membership changed during the crawl"

            verdict = oracle.judge(web.fetched())
            assert verdict["missing"] == set(), f"never fetched: {sorted(verdict['missing'])[:10]}"
            assert verdict["forbidden"] == set() and verdict["unexpected"] == set(), verdict
            assert web.duplicates(include_robots=True) == [], "fetched more than once (robots files included)"
            for label in web.origins:
                assert politeness_violations(web, label, 0.05, GAP_TOLERANCE_S) == [], label

            owners = c.reported_owners(["n1", "n2"])
            assert set(owners) >= set(domains)
            for d, nodes in owners.items():
                assert nodes == {ring.owner(d).node_id}, f"{d} reported by {sorted(nodes)}"  # type: ignore[union-attr]
            keys: dict[str, str] = {}
            for node_id in ("n1", "n2"):
                for row in c.report(node_id)["dispositions"]:
                    assert row["key"] not in keys, f"{row['key']} on {keys.get(row['key'])} and {node_id}"
                    keys[row["key"]] = node_id
            for d in domains:
                fence = judge.fence(d)
                assert fence is not None and fence[0] == ring.owner(d).node_id, (d, fence)  # type: ignore[union-attr]
            lines = journals(judge)
            writers = {d: set() for d in domains}  # type: dict[str, set[str]]
            for key, hist in lines.items():
                d = identify(key.removeprefix(ROBOTS_PREFIX)).domain
                writers.setdefault(d, set()).update(e["writer"] for e in hist)
            for d in domains:
                assert writers[d] == {ring.owner(d).node_id}, f"{d} journaled by {writers[d]}"  # type: ignore[union-attr]
            fetched = sum(1 for hist in lines.values() for e in hist if e["event"] == "complete")
            c.note(f"{len(web.hits)} requests, {fetched} completions journaled, domains per node {dict(by_owner)}")
            assert_no_node_errors(c, ["n1", "n2"], "after the crawl")
        except BaseException:
            print(c.timeline_text())
            print(c.logs())
            raise
        finally:
            judge.client.close()
        print(c.timeline_text())


# ============================================================================================== handoff races
#
# In process, on the same Redis: two or three nodes as the node process builds them (RedisStore + Slice +
# Frontier, and the gRPC servicer where a call is involved), with the rings applied by hand so that the window
# between the new owner applying a ring and the old owner applying it can be entered deterministically. In a real
# cluster that window lasts from milliseconds to the slowest node's handoff.


class _Aborted(Exception):
    pass


class _Context:
    """The part of grpc.ServicerContext the servicer uses; abort raises like gRPC's does."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(f"{code.name}: {details}")

    def is_active(self) -> bool:
        return True


def _node(url: str, node_id: str) -> Any:
    """A node's Slice with its Frontier, built as frontier_node.server.start_node builds them (delay 0)."""
    import threading

    from frontier_node.cluster import Slice
    from frontier_node.core.config import FrontierConfig, PolitenessConfig
    from frontier_node.core.frontier import Frontier
    from hostring.clock import WallClock

    lock = threading.Condition()
    holder: list[Slice] = []
    store = RedisStore.from_url(url, node_id=node_id, epoch=lambda: holder[0].epoch())
    node = Slice(node_id, store, lock)
    holder.append(node)
    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0))
    node.frontier = Frontier(store, WallClock(), config, owns=node.owns, recover=False)
    return node


def _rings(*members: Sequence[str]) -> list[Ring]:
    from hostring.ring import Member

    return [Ring(i + 1, [Member(m, f"{m}:1") for m in ms]) for i, ms in enumerate(members)]


def _domain(pred: Callable[[str], bool], prefix: str = "d") -> str:
    return next(d for d in (f"{prefix}{i}.example" for i in range(1000)) if pred(d))


@pytest.mark.timeout(60)
def test_handoff_fenced_write_keeps_state_counts(empty_redis: str) -> None:
    """The old owner, still on the old ring, leases in a domain the new owner already claimed: the write is fenced
    (right), and after it releases the domain its counts by state must still match its store (and Stats work)."""
    from frontier_node.store.redis import FencedOut

    r1, r2 = _rings(["a"], ["a", "b"])
    a, b = _node(empty_redis, "a"), _node(empty_redis, "b")
    try:
        a.apply(r1)
        b.apply(r1)
        moving = _domain(lambda d: r2.owns("b", d))
        a.frontier.discover([pb.Link(observed=f"http://{moving}/p{j}") for j in range(3)])
        a.frontier.store.flush()
        b.apply(r2)  # the new owner claims the domain first
        assert a.frontier.lease("w", 10), "the old owner still leases on its ring"
        with pytest.raises(FencedOut):
            a.frontier.store.flush()
        a.apply(r2)
        counts = {k: v for k, v in a.frontier.stats().urls_by_state.items() if v}
        stored = {k: v for k, v in a.frontier.store.counts_by_state().items() if v}
        assert counts == stored, f"node a counts {counts} after the handoff, its store holds {stored}"
        pb.StatsResponse(urls_by_state=a.frontier.stats().urls_by_state)  # negative counts make Stats fail
    finally:
        a.store.close()
        b.store.close()


def _epoch(node: Any) -> int:
    """The ring epoch a RunningNode of a cluster has applied."""
    assert node.slice is not None
    return int(node.slice.epoch())


@pytest.mark.timeout(60)
def test_domain_first_written_by_old_owner_during_handoff_is_adopted(empty_redis: str) -> None:
    """Two in-process nodes and a coordinator. While node a cannot apply epoch 2 yet (the test holds its lock, as a
    long call or a slow handoff would), b joins and applies it; a, still on epoch 1, admits the first link of a
    brand-new domain that epoch 2 gives to b (no fence exists yet, so the write lands), then applies epoch 2 and
    releases it. Within a few seconds b must hold the domain: otherwise its URLs stay scheduled in Redis forever."""
    from coordinator.server import start_coordinator
    from frontier_node.core.config import FrontierConfig, PolitenessConfig
    from frontier_node.server import start_node

    config = FrontierConfig(politeness=PolitenessConfig(min_delay_s=0.0))
    coord = start_coordinator("127.0.0.1:0", heartbeat_timeout_s=10.0)
    address = f"127.0.0.1:{coord.port}"
    nodes = []
    try:
        a = start_node(empty_redis, "127.0.0.1:0", config, node_id="a", coordinator=address)
        nodes.append(a)
        wait_for(lambda: _epoch(a) >= 1, 10.0, "node a to join")
        r2 = _rings(["a"], ["a", "b"])[1]
        new = _domain(lambda d: r2.owns("b", d), prefix="new")
        with a.service.cond:  # a's ring delivery (Slice.apply) waits for this lock
            b = start_node(empty_redis, "127.0.0.1:0", config, node_id="b", coordinator=address)
            nodes.append(b)
            wait_for(lambda: _epoch(b) >= 2, 10.0, "node b to apply epoch 2")
            assert _epoch(a) == 1
            a.service.frontier.discover([pb.Link(observed=f"http://{new}/page", seed=True)])
            a.service.frontier.store.flush()
        wait_for(lambda: _epoch(a) >= 2, 10.0, "node a to apply epoch 2")

        def held_by_b() -> bool:
            with b.service.cond:
                return new in b.service.frontier.domains

        try:
            wait_for(held_by_b, 5.0, f"node b to hold {new}")
        except AssertionError:
            judge = RedisStore.from_url(empty_redis, node_id="test-judge", epoch=0)
            try:
                rows, fence = judge.domain_counts(new), judge.fence(new)
            finally:
                judge.close()
            with a.service.cond:
                on_a = new in a.service.frontier.domains
            raise AssertionError(
                f"{new} (owner b at epoch 2) is held by neither node (a: {on_a}, b: False) 5 s "
                f"after both applied epoch 2; Redis has {rows} rows under fence {fence}: nobody "
                "will crawl them"
            ) from None
    finally:
        for node in nodes:
            node.stop(grace=1.0)
        coord.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batched", [False, True], ids=["Complete", "CompleteBatch"])
def test_complete_partly_fenced_loses_no_link(empty_redis: str, batched: bool) -> None:
    """Node a, still on ring 1, settles leases while the new owner b already claimed one of a's domains. A
    completion whose own domain stays with a lands, but the call fails because another part of its flush was
    fenced; the worker retries it. Every link of that completion must end up admitted somewhere or handed back for
    routing: none may be lost (DESIGN.md: "nothing is dropped")."""
    from frontier_node.service import FrontierService

    r1, r2 = _rings(["a", "c"], ["a", "b", "c"])
    a, b, c = (_node(empty_redis, n) for n in "abc")
    try:
        for n in (a, b, c):
            n.apply(r1)
        moving = _domain(lambda d: r1.owns("a", d) and r2.owns("b", d))
        staying = _domain(lambda d: r1.owns("a", d) and r2.owns("a", d))
        elsewhere = _domain(lambda d: r1.owns("c", d) and r2.owns("c", d))
        svc = FrontierService(a.frontier, node_id="a", epoch=a.epoch, lock=a.lock)
        a.frontier.discover([pb.Link(observed=f"http://{d}/", seed=True) for d in (moving, staying)])
        for it in a.frontier.lease("w", 10):  # robots items first: 404, allow all
            a.frontier.complete(it.key, it.generation, pb.Outcome(status=404, retry_after_s=-1))
        items = {it.domain: it for it in a.frontier.lease("w", 10)}
        a.frontier.store.flush()
        b.apply(r2)

        page = pb.Outcome(status=200, retry_after_s=-1, content_type="text/html")
        links = [f"http://{moving}/found", f"http://{elsewhere}/found"]

        def request(item: Any, hrefs: Sequence[str]) -> pb.CompleteRequest:
            return pb.CompleteRequest(lease_id=item.key, generation=item.generation, outcome=page, worker_id="w",
                                      links=[pb.Link(observed=u) for u in hrefs])  # fmt: skip

        ctx: Any = _Context()

        def call(reqs: list[pb.CompleteRequest]) -> list[pb.CompleteResponse]:
            if batched:
                return list(svc.CompleteBatch(pb.CompleteBatchRequest(completions=reqs), ctx).results)
            return [svc.Complete(r, ctx) for r in reqs]

        first = [request(items[moving], []), request(items[staying], links)] if batched else [
            request(items[staying], links)]  # fmt: skip
        forwarded: list[str] = []
        try:
            for resp in call(first):
                forwarded += [link.observed for link in resp.forward]
        except _Aborted:
            pass  # the worker sees the call fail and retries it on the owner of its domain
        a.apply(r2)
        for resp in call([request(items[staying], links)]):
            forwarded += [link.observed for link in resp.forward]
        judge = RedisStore.from_url(empty_redis, node_id="test-judge", epoch=0)
        try:
            lost = [u for u in links if judge.get(identify(u).fetch_key) is None and u not in forwarded]
        finally:
            judge.close()
        assert not lost, f"links of a completed page neither admitted nor handed back for routing: {lost}"
    finally:
        for n in (a, b, c):
            n.store.close()
