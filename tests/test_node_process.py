"""The node as a real process: `hostring node` on SQLite, driven over gRPC, SIGKILLed mid-run and restarted.

The test plays the fetch worker itself. Nothing is fetched: the `h{i}.example` hosts are never contacted, the
only sockets are gRPC calls to the node on loopback. What is checked is the recovery promise of DESIGN.md:
after `kill -9` every admitted URL is back in a state the client's last view can legally lead to, completed
items stay fetched, leased items come back only once their lease has expired and are then leased under a
higher generation, a Complete carrying the pre-kill generation is kept as late evidence without moving the
state, and the run keeps its id.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import grpc
import pytest

import frontier_node
from frontier_node.core.states import TRANSITIONS, State
from frontier_node.offline_report import store_report
from hostring.urls import identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

REPO = Path(frontier_node.__file__).resolve().parent.parent
LEASE_S = 2.0
HOSTS = 20
PAGES_PER_HOST = 15
STARTUP_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 10.0
_PORT_LINE = re.compile(r"listening on port (\d+)")


def successors(state: str) -> set[str]:
    """Every state reachable from `state` by the transition table, `state` included."""
    seen = {State(state)}
    todo = [State(state)]
    while todo:
        cur = todo.pop()
        for (frm, _event), to in TRANSITIONS.items():
            if frm is cur and to not in seen:
                seen.add(to)
                todo.append(to)
    return {s.value for s in seen}


class NodeProcess:
    """One `hostring node` subprocess and a gRPC stub to it; stderr goes to a file shown when a check fails."""

    def __init__(self, store: Path, log: Path, lease_s: float = LEASE_S) -> None:
        self.log_path = log
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115 - closed in close()
        cmd = [
            sys.executable, "-m", "hostring_cli", "node", "--store", f"sqlite:///{store}",
            "--listen", "127.0.0.1:0", "--delay", "0", "--lease-s", str(lease_s),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        self.port = self._read_port()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_TIMEOUT_S)
        self.stub = pb_grpc.FrontierStub(self.channel)

    def _read_port(self) -> int:
        """The port from the node's first stdout line, waiting a bounded time for it."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], STARTUP_TIMEOUT_S)
        line = self.proc.stdout.readline().decode() if ready else ""
        m = _PORT_LINE.search(line)
        if m is None:
            self.kill()
            raise AssertionError(f"node did not announce its port (got {line!r}); log:\n{self.log()}")
        return int(m.group(1))

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL and reap: no flush, no close, no atexit, exactly like the OOM killer."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        """Kill if still running, and release the channel, pipes and log file."""
        if hasattr(self, "channel"):
            self.channel.close()
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Callable[[], NodeProcess]]:
    """A factory of node processes on one store in tmp_path; every one started is killed at teardown."""
    started: list[NodeProcess] = []
    store = tmp_path / "n.sqlite3"

    def start() -> NodeProcess:
        node = NodeProcess(store, tmp_path / f"node-{len(started)}.log")
        started.append(node)
        return node

    yield start
    for node in started:
        node.close()


def page(status: int = 200) -> pb.Outcome:
    """The outcome of a page fetch that never happened (the test is the worker)."""
    return pb.Outcome(status=status, retry_after_s=-1, content_type="text/html", bytes=100, response_s=0.0)


def discover(stub: pb_grpc.FrontierStub, urls: list[str]) -> list[pb.LinkVerdict]:
    resp = stub.Discover(
        pb.DiscoverRequest(links=[pb.Link(observed=u, seed=True) for u in urls]), timeout=RPC_TIMEOUT_S
    )
    assert len(resp.verdicts) == len(urls)
    return list(resp.verdicts)


def lease(stub: pb_grpc.FrontierStub, n: int = 1000, wait_ms: int = 0) -> list[pb.LeaseItem]:
    return list(
        stub.Lease(pb.LeaseRequest(worker_id="test-worker", max_items=n, wait_ms=wait_ms), timeout=RPC_TIMEOUT_S).items
    )


def complete(
    stub: pb_grpc.FrontierStub, key: str, generation: int, outcome: pb.Outcome, links: Sequence[str] = ()
) -> pb.CompleteResponse:
    return stub.Complete(
        pb.CompleteRequest(
            lease_id=key,
            generation=generation,
            outcome=outcome,
            worker_id="test-worker",
            links=[pb.Link(observed=u) for u in links],
        ),
        timeout=RPC_TIMEOUT_S,
    )


def url_info(stub: pb_grpc.FrontierStub, key: str) -> pb.UrlInfo:
    return stub.GetUrl(pb.GetUrlRequest(url=key), timeout=RPC_TIMEOUT_S)


def dispositions(stub: pb_grpc.FrontierStub) -> dict[str, str]:
    report = json.loads(stub.Report(pb.ReportRequest(dispositions=True), timeout=RPC_TIMEOUT_S).json)
    return {row["key"]: row["state"] for row in report["dispositions"]}


class Background:
    """Discover batches of fresh links in a loop until the node dies; remembers the keys it was told ADMITTED."""

    def __init__(self, stub: pb_grpc.FrontierStub) -> None:
        self.stub = stub
        self.admitted: list[str] = []
        self.batches = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="background-discover", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        try:
            while True:
                urls = [f"http://h{(n + i) % HOSTS}.example/bg{n + i}" for i in range(64)]
                n += 64
                verdicts = discover(self.stub, urls)
                self.admitted += [v.fetch_key for v in verdicts if v.verdict == pb.ADMITTED]
                self.batches += 1
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                self.error = e
        except BaseException as e:
            self.error = e

    def wait_batches(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.batches < n and time.monotonic() < end and self._thread.is_alive():
            time.sleep(0.01)
        assert self.batches >= n, f"background discover made {self.batches} batches ({self.error!r})"

    def join(self) -> None:
        self._thread.join(timeout=RPC_TIMEOUT_S + 5)
        assert not self._thread.is_alive()
        assert self.error is None, repr(self.error)


def test_sigkill_mid_run_loses_nothing_and_fences_stale_generations(
    start_node: Callable[[], NodeProcess], tmp_path: Path
) -> None:
    """Admit, lease, complete and hold leases; kill -9 while discovery is streaming; restart and check it all."""
    node = start_node()
    stub = node.stub
    seen: dict[str, str] = {}  # fetch key -> the last state the client was told
    run_id = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).run_id
    assert run_id

    # -- seeds, with duplicates spelled differently: dedup happens on the fetch key, after normalization
    seeds = [f"http://h{i}.example/p{j}" for j in range(PAGES_PER_HOST) for i in range(HOSTS)]
    for start in range(0, len(seeds), 100):
        for url, v in zip(seeds[start : start + 100], discover(stub, seeds[start : start + 100]), strict=True):
            assert v.verdict == pb.ADMITTED, (url, v)
            assert v.fetch_key == identify(url).fetch_key
            seen[v.fetch_key] = "scheduled"
    variants = ["HTTP://H3.EXAMPLE:80/p1#top", "http://h4.example/p2?utm_source=x", "http://h5.EXAMPLE./p3"]
    for url, v in zip(variants, discover(stub, variants), strict=True):
        assert v.verdict == pb.DUPLICATE, (url, v)
        assert v.fetch_key in seen

    # -- robots first: one robots item per host and no page before it; 404 means allow all
    first = lease(stub)
    assert [it.kind for it in first] == [pb.ROBOTS] * HOSTS
    assert sorted(it.host for it in first) == sorted(f"h{i}.example" for i in range(HOSTS))
    for it in first:
        done = complete(stub, it.lease_id, it.generation, pb.Outcome(status=404, retry_after_s=-1))
        assert done.accepted and done.state == "fetched", done

    # -- round 1: one page per host, all completed 200 with two new links each (admitted in the same commit)
    fetched: dict[str, int] = {}  # key -> generation it was completed under
    round1 = lease(stub)
    assert len(round1) == HOSTS and all(it.kind == pb.PAGE for it in round1)
    for it in round1:
        links = [f"{it.url}/child{k}" for k in range(2)]
        done = complete(stub, it.lease_id, it.generation, page(200), links)
        assert done.accepted and done.state == "fetched" and done.admitted == 2, done
        fetched[it.fetch_key] = it.generation
        seen[it.fetch_key] = "fetched"
        for link in links:
            seen[identify(link).fetch_key] = "scheduled"

    # -- round 2: half completed, one failing transiently (retryable), the rest held under their leases
    round2 = lease(stub)
    assert len(round2) == HOSTS
    held: dict[str, pb.LeaseItem] = {}
    for n, it in enumerate(round2):
        if n < HOSTS // 2:
            assert complete(stub, it.lease_id, it.generation, page(200)).accepted
            fetched[it.fetch_key] = it.generation
            seen[it.fetch_key] = "fetched"
        elif n == HOSTS // 2:
            done = complete(stub, it.lease_id, it.generation, page(503))
            assert done.accepted and done.state == "retryable", done
            seen[it.fetch_key] = "retryable"
        else:
            held[it.fetch_key] = it
            seen[it.fetch_key] = "leased"
    leased_at = time.time()

    # -- kill -9 while another client is streaming Discover batches
    background = Background(stub)
    background.wait_batches(3, timeout=10)
    node.proc.send_signal(signal.SIGKILL)
    assert node.proc.wait(timeout=10) == -signal.SIGKILL
    background.join()
    for key in background.admitted:
        seen[key] = "scheduled"
    assert time.time() - leased_at < LEASE_S, "the run took longer than a lease: held leases expired before the kill"

    # -- the dead node's file, read offline, shows the held leases (their rows may only be in the journal's tail)
    offline = store_report(tmp_path / "n.sqlite3", dispositions=True)
    offline_states = {row["key"]: row["state"] for row in offline["dispositions"]}
    assert all(offline_states[key] == "leased" for key in held), {k: offline_states[k] for k in held}
    assert offline["journal"]["disagreeing_items"] == 0, offline["journal"]

    # -- restart on the same store
    node = start_node()
    stub = node.stub
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert stats.run_id == run_id
    assert stats.seen >= len(seen)

    # nothing admitted is lost, and every state is one the client's last view can lead to
    disp = dispositions(stub)
    missing = sorted(set(seen) - set(disp))
    assert not missing, f"{len(missing)} admitted keys lost, e.g. {missing[:5]}"
    for key, last in seen.items():
        info = url_info(stub, key)
        assert info.state in successors(last), (key, last, info.state)
        # read after the report: a held lease may expire between the two reads on a slow restart
        assert info.state in successors(disp[key]), (key, disp[key], info.state)
        if last == "fetched":
            assert info.state == "fetched" and info.generation == fetched[key], (key, info)
        if last == "leased":
            assert info.generation >= held[key].generation

    # -- held leases come back after their (pre-kill) deadline, under a higher generation
    deadline_s = max(it.deadline_ms for it in held.values()) / 1000.0
    # from now, not from the deadline: on a loaded machine the checks above can outlast the deadline by seconds
    give_up = time.monotonic() + max(deadline_s - time.time(), 0.0) + 8.0
    released: dict[str, pb.LeaseItem] = {}
    others: list[pb.LeaseItem] = []
    while len(released) < len(held) and time.monotonic() < give_up:
        for it in lease(stub, wait_ms=300):
            if it.fetch_key in held:
                released[it.fetch_key] = it
            else:
                others.append(it)
    assert set(released) == set(held), f"not re-leased: {sorted(set(held) - set(released))}\n{node.log()}"
    for key, it in released.items():
        old = held[key]
        assert it.generation > old.generation, (key, old.generation, it.generation)
        assert it.attempt > old.attempt
        history = url_info(stub, key).history
        expire = [t for t in history if t.event == "expire"]
        assert expire and expire[-1].generation == old.generation
        assert expire[-1].at >= old.deadline_ms / 1000.0 - 0.001, "a lease was reclaimed before its deadline"
    for it in others:
        assert complete(stub, it.lease_id, it.generation, page(200)).accepted
        seen[it.fetch_key] = "fetched"

    # -- a Complete under the pre-kill generation is late evidence: refused, journaled, state unmoved
    key, again = next(iter(released.items()))
    old = held[key]
    stale = complete(stub, key, old.generation, page(200))
    assert not stale.accepted and stale.reason == "stale_generation" and stale.state == "leased", stale
    info = url_info(stub, key)
    assert info.state == "leased" and info.generation == again.generation
    late = [t for t in info.history if t.event == "late_evidence"]
    assert len(late) == 1 and late[0].generation == old.generation, list(info.history)
    assert late[0].from_state == late[0].to_state == "leased" and late[0].reason.startswith("stale_generation")
    # the current generation still settles it
    done = complete(stub, key, again.generation, page(200))
    assert done.accepted and done.state == "fetched"

    # a stale Complete of an item fetched before the kill does not move it either
    done_key, done_gen = next(iter(fetched.items()))
    stale = complete(stub, done_key, done_gen, page(500))
    assert not stale.accepted and stale.state == "fetched", stale
    info = url_info(stub, done_key)
    assert info.state == "fetched" and info.history[-1].event == "late_evidence"

    final = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert final.run_id == run_id
    assert final.completes_stale >= 2
    assert final.leases_expired >= len(held)
    disp = dispositions(stub)
    assert set(seen) <= set(disp)
    assert all(disp[k] == "fetched" for k in fetched)


def test_sigterm_stops_cleanly_and_restarts(start_node: Callable[[], NodeProcess]) -> None:
    """SIGTERM drains and exits 0 within a few seconds; the next start recovers the same run and items."""
    node = start_node()
    urls = [f"http://h{i}.example/t{j}" for i in range(5) for j in range(10)]
    keys = [v.fetch_key for v in discover(node.stub, urls) if v.verdict == pb.ADMITTED]
    assert len(keys) == len(urls)
    robots = lease(node.stub)
    assert robots and all(it.kind == pb.ROBOTS for it in robots)
    run_id = node.stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).run_id

    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=10) == 0, node.log()
    assert "Traceback" not in node.log()

    node = start_node()
    stats = node.stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert stats.run_id == run_id
    assert stats.urls_by_state["scheduled"] == len(urls)
    assert stats.in_flight == len(robots)
    assert all(url_info(node.stub, k).state == "scheduled" for k in keys)
