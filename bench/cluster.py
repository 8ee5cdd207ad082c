"""Figures of a hostring cluster on this machine: handoffs on join and leave, and throughput for 1, 2 and 3 nodes.

`python -m bench.cluster [--json] [--quick] [--rounds N]` prints, with the machine and the workload stated:

1. Membership. A redis-server started here on a free loopback port, a coordinator (`--redis`, heartbeat timeout
   3 s) and three `hostring node` processes on that Redis; `hosts` registrable domains (`site{i}.com`, two URLs
   each) discovered through the nodes, routed by ring, so there is state to hand over. Then:
   - join: a fourth node is started. Settle time runs from the moment its process is started (Python start-up
     included, and given separately) until the coordinator's ring has it and every node's Stats report that
     epoch applied (the node's lock is held through release/adopt, so Stats answering the epoch means the
     handoff is done) with health SERVING. The moved fraction is the share of the stored domains whose owner
     changed (ring math over `RedisStore.all_domains()`), checked against the nodes' own "released N, adopted M"
     log lines; the ideal is 1/4.
   - leave: one node gets SIGTERM (it leaves the ring at once). Settle time runs from the signal until the ring
     lacks it and every survivor reports the new epoch applied: its domains are adopted elsewhere (checked
     afterwards: no fence in Redis names it).
   - failure: one more node gets SIGKILL; it leaves after the heartbeat timeout, which dominates the figure.
2. Throughput, for 1, 2 and 3 nodes, each configuration on a flushed Redis with a fresh coordinator and nodes
   (`--delay 0`), and for one node on a SQLite store (the same workload; `hostring node --store sqlite://`, no
   coordinator), each of its phases measured back to back with the one-node Redis phase it is compared with, the
   two pairs in opposite orders (Redis, SQLite, SQLite, Redis: a VM's speed drifts by tens of percent within a
   minute). The client is this process, with two threads per node:
   - Discover: `links` distinct URLs over `hosts` hosts, routed to the ring owner of their domain (routing and
     serialization done before the clock starts; the routing cost is given on its own), batches of 256;
     figure: links admitted per second (every admission journaled).
   - Lease+Complete: the client plays the worker. Robots items are leased and completed 404 first (not timed),
     then Lease(max_items=256) and one CompleteBatch with the lease's items, as a busy worker coalesces them,
     until `lease_pages` pages are done; figure: URLs leased and completed per second.
   - Lease+Complete, lease in reply: the same on a fresh configuration after the same Discover, except that each
     CompleteBatch asks for the next lease (lease_max_items=256) and the reply carries it, as fetch workers take
     theirs: one call and one commit per batch.
   Beside each figure: CPU milliseconds per URL of the node processes and of Redis (INFO cpu, used_cpu_sys +
   used_cpu_user), and Redis round trips, script calls and commands per URL. Round trips are Redis's reply write
   events (INFO stats total_writes_processed: one per request or pipeline answered; the read events are given too,
   but a large request arrives in several reads of 16 KB), script calls the EVALSHA
   and EVAL calls of INFO commandstats, commands INFO stats total_commands_processed (the commands scripts run
   included); each includes the nodes' idle polling (ring watch, inbox, heartbeats) during the phase. "busy" is
   the rate times that CPU per URL: how many CPUs the nodes and Redis kept busy on average. One node on Redis
   read 1.1-1.25 here, where it could read up to 2, while the node landed each flush before sending the next; with
   two flushes out it reads about 1.2 at the default 2 streams (two calls in the node leave little to overlap) and
   about 1.37 at --streams 4, where the node process is near its GIL's one core (see issue 10's notes).

Every process (redis-server, coordinator, nodes and this client) shares this machine's CPUs, so the figures
for 2 and 3 nodes measure how the cluster divides the same cores, not added machines; CPU seconds of each
process are given beside them. No pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

import grpc
import redis

from bench.node import (
    NodeProcess,
    complete_request,
    cpu_seconds,
    end_of_run,
    machine,
    machine_line,
    next_request,
    worker_batches,
)
from frontier_node.store.redis import RedisStore
from hostring.limits import grpc_options
from hostring.ring import Ring
from hostring.urls import identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_cli.args import positive_int
from hostring_testing.cluster import Cluster, wait_for
from hostring_testing.redis_server import RedisServer

SETTLE_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 120.0
POLL_S = 0.01
HEARTBEAT_TIMEOUT_S = 3.0
_DISCOVER_METHOD = "/hostring.v1.Frontier/Discover"
_CHANNEL_OPTIONS = grpc_options()


@dataclass(frozen=True)
class Workload:
    """What is measured; printed with the figures."""

    hosts: int = 10_000
    urls_per_host_membership: int = 2
    links: int = 100_000
    batch: int = 256
    lease_batch: int = 256
    lease_pages: int = 30_000
    streams_per_node: int = 2
    node_counts: tuple[int, ...] = (1, 2, 3)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            url_shape="http://site{u % hosts}.com/p/{u}: every host its own registrable domain (the shard key)",
            nodes="`hostring node --coordinator ... --store redis://... --delay 0` subprocesses, one Python "
            "process each, all on one redis-server started here (no persistence)",
            coordinator=f"`hostring coordinator --redis ... --heartbeat-timeout {HEARTBEAT_TIMEOUT_S}` subprocess",
            discover_client=f"this process; links routed by ring owner, {self.batch} per Discover, serialized "
            f"before the clock starts; {self.streams_per_node} threads per node, one call in flight each",
            lease_client=f"this process plays the worker; {self.streams_per_node} threads per node, each "
            f"Lease(max_items={self.lease_batch}) then one CompleteBatch of the lease's items; outcome 200 with a "
            "unique digest and simhash, no links; robots completed 404 before the clock",
            lease_reply_client=f"the same on fresh nodes (same Discover, robots settled untimed), each thread's "
            f"CompleteBatch asking for its next lease (lease_max_items={self.lease_batch}), which the reply carries, "
            "as fetch workers do (one call and one commit per batch)",
            sqlite="one `hostring node --store sqlite:///... --delay 0` process, no coordinator, same client",
        )
        return d


QUICK = Workload(hosts=1_000, links=10_000, lease_pages=3_000)


# ====================================================================== processes


@dataclass
class BenchCluster(Cluster):
    """The shared cluster harness, knowing the pid of its redis-server too (for CPU seconds by process)."""

    redis_pid: int = 0


@contextlib.contextmanager
def cluster(
    log_dir: Path, srv: RedisServer, node_ids: Sequence[str], log_level: str = "WARNING"
) -> Iterator[BenchCluster]:
    """A coordinator and `node_ids` on `srv` (the shared harness, nodes at --delay 0), settled; every process is
    killed on the way out."""
    with BenchCluster(log_dir, srv.url, heartbeat_timeout=HEARTBEAT_TIMEOUT_S, delay=0, user_agent=None,
                      log_level=log_level, channel_options=_CHANNEL_OPTIONS, redis_pid=srv.pid) as c:  # fmt: skip
        c.start_coordinator()
        c.start_nodes(*node_ids)
        settle(c, set(node_ids), f"the ring to settle on {list(node_ids)}")
        yield c


def settle(c: Cluster, members: set[str], what: str, timeout: float = SETTLE_TIMEOUT_S) -> Ring:
    """The ring once `members` all applied it and serve, polled every POLL_S; the processes' logs if it fails."""
    try:
        return c.wait_settled(members, timeout, interval=POLL_S)
    except AssertionError as e:
        raise RuntimeError(f"timed out waiting for {what}: {e}\n{c.logs()}") from None


def wait(c: Cluster, predicate: Callable[[], bool], what: str, timeout: float = SETTLE_TIMEOUT_S) -> None:
    """Poll `predicate` every POLL_S until it holds; the processes' logs if it does not within `timeout`."""
    try:
        wait_for(predicate, timeout, what, interval=POLL_S)
    except AssertionError as e:
        raise RuntimeError(f"{e}\n{c.logs()}") from None


def handoff(c: Cluster, node_id: str, epoch: int) -> dict[str, Any]:
    """The node's own handoff line for `epoch`: members, released, adopted, seconds ({} if it logged none)."""
    line = c.handoffs(node_id).get(epoch)
    return line._asdict() if line is not None else {}


# ====================================================================== client helpers


def url(u: int, hosts: int) -> str:
    return f"http://site{u % hosts}.com/p/{u}"


@dataclass
class Target:
    """The nodes a throughput run talks to: addresses, channels, the owner of a domain, pids, and their Redis."""

    addresses: dict[str, str]
    channel: Callable[[str], grpc.Channel]
    owner: Callable[[str], str]
    pids: dict[str, int]
    redis: redis.Redis | None = None

    def frontier(self, node_id: str) -> pb_grpc.FrontierStub:
        return pb_grpc.FrontierStub(self.channel(self.addresses[node_id]))  # type: ignore[no-untyped-call]


def cluster_target(c: BenchCluster, ring: Ring, client: redis.Redis | None) -> Target:
    """The nodes of a cluster, routed by `ring` as a worker routes."""

    def owner(domain: str) -> str:
        node = ring.owner(domain)
        assert node is not None
        return node.node_id

    return Target(dict(c.addresses), c.channel, owner, _pids(c), client)


def route(owner: Callable[[str], str], urls: Sequence[str]) -> dict[str, list[str]]:
    """node id -> its URLs, by the owner of each URL's registrable domain (as the worker routes)."""
    out: dict[str, list[str]] = {}
    for u in urls:
        out.setdefault(owner(identify(u).domain), []).append(u)
    return out


def _run_threads(targets: Sequence[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def redis_counters(client: redis.Redis) -> dict[str, Any]:
    """Redis's own CPU seconds, read events, client commands and commandstats calls by command, now."""
    cpu, stats, commands = client.info("cpu"), client.info("stats"), client.info("commandstats")
    return {
        "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "reads": int(stats["total_reads_processed"]),
        "writes": int(stats["total_writes_processed"]),
        "commands": int(stats["total_commands_processed"]),
        "calls": {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in commands.items()},
    }


class CpuWatch:
    """Wall seconds, the CPU seconds of this process and of given pids, and Redis's counters over a `with` block."""

    def __init__(self, pids: dict[str, int], client: redis.Redis | None = None) -> None:
        self.pids = pids
        self.client = client
        self.wall = 0.0
        self.cpu: dict[str, float] = {}
        self.redis: dict[str, Any] = {}

    def __enter__(self) -> CpuWatch:
        self._r = redis_counters(self.client) if self.client is not None else None
        self._t = time.perf_counter()
        self._c = {"client": cpu_seconds(), **{n: cpu_seconds(p) for n, p in self.pids.items()}}
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t
        now = {"client": cpu_seconds(), **{n: cpu_seconds(p) for n, p in self.pids.items()}}
        self.cpu = {n: round(now[n] - self._c[n], 3) for n in now}
        if self.client is not None and self._r is not None:
            after = redis_counters(self.client)
            calls = {k: n - self._r["calls"].get(k, 0) for k, n in after["calls"].items()}
            self.redis = {
                "cpu_s": round(after["cpu_s"] - self._r["cpu_s"], 3),
                "round_trips": after["writes"] - self._r["writes"],
                "read_events": after["reads"] - self._r["reads"],
                "commands": after["commands"] - self._r["commands"],
                "script_calls": calls.get("evalsha", 0) + calls.get("eval", 0),
                "calls_by_command": dict(sorted(((k, n) for k, n in calls.items() if n), key=lambda kv: -kv[1])),
            }

    def per_url(self, urls: int) -> dict[str, float]:
        """CPU milliseconds of the nodes and Redis, Redis round trips and commands, each per URL."""
        n = max(1, urls)
        nodes = _node_cpu(self.cpu)
        redis_cpu = self.redis.get("cpu_s", 0.0)
        return {
            "node_cpu_ms": 1000 * nodes / n,
            "redis_cpu_ms": 1000 * redis_cpu / n,
            "cpu_ms": 1000 * (nodes + redis_cpu) / n,
            "redis_round_trips": self.redis.get("round_trips", 0) / n,
            "redis_commands": self.redis.get("commands", 0) / n,
            "redis_script_calls": self.redis.get("script_calls", 0) / n,
        }


def discover_all(t: Target, urls: Sequence[str], w: Workload) -> dict[str, Any]:
    """Send `urls` to their owners in batches, `streams_per_node` threads per node; timed, with CPU per process."""
    t0 = time.perf_counter()
    routed = route(t.owner, urls)
    routing_s = time.perf_counter() - t0
    payloads = {
        n: [pb.DiscoverRequest(links=[pb.Link(observed=u) for u in us[i : i + w.batch]], worker_id="bench")
            .SerializeToString() for i in range(0, len(us), w.batch)]
        for n, us in routed.items()
    }  # fmt: skip
    tallies: list[Counter[int]] = []
    targets: list[Callable[[], None]] = []
    for n, batches in payloads.items():
        call = t.channel(t.addresses[n]).unary_unary(
            _DISCOVER_METHOD, request_serializer=None, response_deserializer=pb.DiscoverResponse.FromString
        )
        counter = itertools.count()
        for _ in range(w.streams_per_node):
            tally: Counter[int] = Counter()
            tallies.append(tally)

            def stream(
                call: Any = call,
                counter: Iterator[int] = counter,
                batches: list[bytes] = batches,
                tally: Counter[int] = tally,
            ) -> None:
                while (i := next(counter)) < len(batches):
                    tally.update(v.verdict for v in call(batches[i], timeout=RPC_TIMEOUT_S).verdicts)

            targets.append(stream)
    with CpuWatch(t.pids, t.redis) as cw:
        _run_threads(targets)
    total: Counter[int] = sum(tallies, Counter())
    return {
        "links": len(urls),
        "admitted": total[pb.ADMITTED],
        "wrong_owner": total[pb.WRONG_OWNER],
        "other": sum(total.values()) - total[pb.ADMITTED] - total[pb.WRONG_OWNER],
        "seconds": round(cw.wall, 3),
        "admitted_per_s": total[pb.ADMITTED] / cw.wall,
        "admitted_per_node_cpu_s": total[pb.ADMITTED] / _node_cpu(cw.cpu),
        "per_url": cw.per_url(total[pb.ADMITTED]),
        "links_per_node": {n: len(us) for n, us in routed.items()},
        "routing_links_per_s_client": len(urls) / routing_s if routing_s else 0.0,
        "cpu_s": cw.cpu,
        "redis": cw.redis,
    }


def _node_cpu(cpu: dict[str, float]) -> float:
    """CPU seconds of the node processes together (at least a millisecond)."""
    return max(0.001, sum(v for n, v in cpu.items() if re.fullmatch(r"n\d+", n)))


def _pids(c: BenchCluster) -> dict[str, int]:
    pids = {n: p.pid for n, p in c.procs.items() if p.running}
    pids["redis"] = c.redis_pid
    return pids


def _complete(stub: pb_grpc.FrontierStub, items: Sequence[pb.LeaseItem], seq: Iterator[int], worker_id: str) -> int:
    """One CompleteBatch of a lease's items, as the worker that leased them; how many were accepted."""
    batch = pb.CompleteBatchRequest(completions=[complete_request(it, next(seq), worker_id) for it in items])
    return sum(1 for r in stub.CompleteBatch(batch, timeout=RPC_TIMEOUT_S).results if r.accepted)


def robots_first(t: Target, w: Workload, seq: Iterator[int]) -> int:
    """Complete every node's robots.txt items (404), untimed, before the timed pages; how many."""
    robots = 0
    for n in t.addresses:
        stub = t.frontier(n)
        while True:
            items = stub.Lease(pb.LeaseRequest(worker_id="bench", max_items=w.lease_batch), timeout=RPC_TIMEOUT_S).items
            robots_items = [it for it in items if it.kind == pb.ROBOTS]
            if items:
                _complete(stub, items, seq, "bench")
            robots += len(robots_items)
            if not robots_items:
                break
    return robots


def lease_complete_all(t: Target, w: Workload, seq: Iterator[int], *, in_reply: bool = False) -> dict[str, Any]:
    """Lease+CompleteBatch on every node at once until lease_pages more pages are done (after `robots_first`).

    With `in_reply`, each CompleteBatch asks for the next lease (lease_max_items) and its reply carries it, as a
    fetch worker's completions do: after a stream's first Lease, one call and one commit per batch instead of two.
    """
    lock = threading.Lock()
    done = Counter[str]()
    refused = [0]
    targets: list[Callable[[], None]] = []

    def more() -> bool:
        with lock:
            return sum(done.values()) < w.lease_pages

    for n in t.addresses:
        stub = t.frontier(n)
        for s in range(w.streams_per_node):

            def stream(stub: pb_grpc.FrontierStub = stub, n: str = n, worker: str = f"bench-{n}-{s}") -> None:
                build = functools.partial(next_request, seq=seq, worker=worker)
                for items, resp in worker_batches(stub, worker, w.lease_batch, more, build, in_reply=in_reply):
                    accepted = sum(1 for r in resp.results if r.accepted)
                    with lock:
                        done[n] += accepted
                        refused[0] += len(items) - accepted

            targets.append(stream)
    with CpuWatch(t.pids, t.redis) as cw:
        _run_threads(targets)
    total = sum(done.values())
    return {
        "urls": total,
        "refused": refused[0],
        "seconds": round(cw.wall, 3),
        "urls_per_s": total / cw.wall,
        "urls_per_node_cpu_s": total / _node_cpu(cw.cpu),
        "per_url": cw.per_url(total),
        "urls_per_node": dict(done),
        "cpu_s": cw.cpu,
        "redis": cw.redis,
    }


def lease_complete_phase(t: Target, w: Workload, *, in_reply: bool) -> dict[str, Any]:
    """Robots first (untimed), then lease_complete_all."""
    seq = itertools.count(1)
    robots = robots_first(t, w, seq)
    return {**lease_complete_all(t, w, seq, in_reply=in_reply), "robots_completed_untimed": robots}


_PHASES: Final = (("lease_complete", False), ("lease_complete_reply", True))
"""The Lease+Complete phases (figure key, lease in reply), each on fresh nodes after the same Discover: a phase run
after another would find a fuller store (Redis's CPU per URL grows with it, 10-15% from 30k to 60k pages here)."""


# ====================================================================== the figures


def membership_figures(tmp: Path, srv: RedisServer, w: Workload) -> dict[str, Any]:
    """Join, SIGTERM leave and SIGKILL failure on a populated 3-node cluster."""
    srv.flush()
    out: dict[str, Any] = {}
    judge = RedisStore(redis.Redis.from_url(srv.url), node_id="bench-judge", epoch=0)
    try:
        with cluster(tmp, srv, ["n1", "n2", "n3"], log_level="INFO") as c:
            ring3 = c.ring()
            urls = [url(u, w.hosts) for u in range(w.hosts * w.urls_per_host_membership)]
            populated = discover_all(cluster_target(c, ring3, None), urls, w)
            domains = sorted(judge.all_domains())
            out["domains"] = len(domains)
            out["urls"] = populated["admitted"]

            # -- join
            t0 = time.perf_counter()
            c.start_nodes("n4")
            t_port = time.perf_counter() - t0
            wait(c, lambda: "n4" in c.ring().members, "n4 to register")
            t_registered = time.perf_counter() - t0
            ring4 = settle(c, {"n1", "n2", "n3", "n4"}, "the join to settle")
            t_settled = time.perf_counter() - t0
            moved = ring3.moved(ring4, domains)
            logged = {n: handoff(c, n, ring4.epoch) for n in ("n1", "n2", "n3", "n4")}
            out["join"] = {
                "settle_s_from_process_start": round(t_settled, 3),
                "process_start_to_port_s": round(t_port, 3),
                "process_start_to_registered_s": round(t_registered, 3),
                "registered_to_settled_s": round(t_settled - t_registered, 3),
                "moved_fraction": len(moved) / len(domains),
                "ideal_fraction": 1 / 4,
                "moved_domains": len(moved),
                "moved_to_new_node_only": all(new == "n4" for _, new in moved.values()),
                "adopted_logged_by_new_node": logged["n4"].get("adopted"),
                "released_logged": {n: logged[n].get("released") for n in ("n1", "n2", "n3")},
                "handoff_seconds_logged": {n: logged[n].get("seconds") for n in logged},
            }

            # -- leave (SIGTERM: the node leaves the ring at once)
            victim_domains = [d for d in domains if ring4.owns("n2", d)]
            t0 = time.perf_counter()
            c.procs["n2"].send(signal.SIGTERM)
            wait(c, lambda: "n2" not in c.ring().members, "n2 to leave")
            t_left = time.perf_counter() - t0
            ring_left = settle(c, {"n1", "n3", "n4"}, "the leave to settle")
            t_settled = time.perf_counter() - t0
            pipe = judge.client.pipeline(transaction=False)
            for d in victim_domains:
                pipe.hget(f"{judge.namespace}:{{d:{d}}}:fence", "owner")
            owners = Counter(o.decode() if isinstance(o, bytes) else str(o) for o in pipe.execute())
            logged = {n: handoff(c, n, ring_left.epoch) for n in ("n1", "n3", "n4")}
            out["leave_sigterm"] = {
                "settle_s_from_signal": round(t_settled, 3),
                "signal_to_left_ring_s": round(t_left, 3),
                "moved_fraction": len(victim_domains) / len(domains),
                "ideal_fraction": 1 / 4,
                "moved_domains": len(victim_domains),
                "fences_still_naming_leaver": owners.get("n2", 0),
                "adopted_logged": {n: logged[n].get("adopted") for n in logged},
                "handoff_seconds_logged": {n: logged[n].get("seconds") for n in logged},
            }
            c.procs["n2"].stop(signal.SIGTERM)

            # -- failure (SIGKILL: the heartbeat timeout decides)
            t0 = time.perf_counter()
            c.procs["n3"].send(signal.SIGKILL)
            wait(c, lambda: "n3" not in c.ring().members, "n3 to expire", timeout=HEARTBEAT_TIMEOUT_S + 30)
            t_left = time.perf_counter() - t0
            ring_kill = settle(c, {"n1", "n4"}, "the failure to settle")
            t_settled = time.perf_counter() - t0
            out["failure_sigkill"] = {
                "settle_s_from_kill": round(t_settled, 3),
                "kill_to_left_ring_s": round(t_left, 3),
                "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
                "moved_domains": len([d for d in domains if ring_left.owns("n3", d)]),
                "epoch": ring_kill.epoch,
            }
    finally:
        judge.client.close()
    return out


def throughput_figures(
    tmp: Path, srv: RedisServer, w: Workload, phases: Sequence[tuple[str, bool]] = _PHASES
) -> dict[str, Any]:
    """Discover and the Lease+Complete `phases` for each node count, each on a flushed Redis and a fresh cluster."""
    out: dict[str, Any] = {}
    urls = [url(u, w.hosts) for u in range(w.links)]
    client = redis.Redis.from_url(srv.url)
    try:
        for k in w.node_counts:
            node_ids = [f"n{i + 1}" for i in range(k)]
            for phase, in_reply in phases:
                srv.flush()
                run_dir = tmp / f"nodes-{k}-{phase}"
                run_dir.mkdir()
                with cluster(run_dir, srv, node_ids) as c:
                    t = cluster_target(c, c.ring(), client)
                    disc = discover_all(t, urls, w)
                    figures = out.setdefault(str(k), {"discover": disc})
                    figures[phase] = lease_complete_phase(t, w, in_reply=in_reply)
    finally:
        client.close()
    return out


def sqlite_figures(tmp: Path, w: Workload, phases: Sequence[tuple[str, bool]] = _PHASES) -> dict[str, Any]:
    """Discover and the Lease+Complete `phases` on one node on a SQLite store (a fresh one per phase), with the same
    client."""
    urls = [url(u, w.hosts) for u in range(w.links)]
    out: dict[str, Any] = {}
    for phase, in_reply in phases:
        node = NodeProcess(tmp / f"sqlite-{phase}.db", tmp / f"sqlite-{phase}.log")
        channels: dict[str, grpc.Channel] = {}

        def channel(address: str, channels: dict[str, grpc.Channel] = channels) -> grpc.Channel:
            if address not in channels:
                channels[address] = grpc.insecure_channel(address, options=grpc_options())
            return channels[address]

        try:
            t = Target({"n1": f"127.0.0.1:{node.port}"}, channel, lambda _: "n1", {"n1": node.proc.pid})
            disc = discover_all(t, urls, w)
            out.setdefault("discover", disc)
            out[phase] = lease_complete_phase(t, w, in_reply=in_reply)
        finally:
            for ch in channels.values():
                ch.close()
            node.stop()
    return out


def one_node_beside_sqlite(tmp: Path, srv: RedisServer, w: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures of one Redis node (as throughput_figures gives them) and of the SQLite node, each phase of one
    measured right beside the same phase of the other (Redis, SQLite, then SQLite, Redis: each pair back to back, in
    both orders): the ratios compare the two at the same moment, on a VM whose speed drifts by tens of percent
    within a minute. Discover is the first phase's."""
    first, second = _PHASES
    one = replace(w, node_counts=(1,))
    redis_node = throughput_figures(tmp, srv, one, (first,))
    sqlite = sqlite_figures(tmp, w, (first,))
    sqlite.update({k: v for k, v in sqlite_figures(tmp, w, (second,)).items() if k != "discover"})
    reply = throughput_figures(tmp, srv, one, (second,))
    redis_node["1"].update({k: v for k, v in reply["1"].items() if k != "discover"})
    return redis_node, sqlite


def run(w: Workload, membership: bool = True) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": machine(), "workload": w.describe()}
    cores = figures["machine"]["cores_usable"]
    figures["machine"]["note"] = (
        f"every process (redis-server, coordinator, nodes, this client) shares this machine's {cores} CPUs"
    )
    if shutil.which("redis-server") is None:
        raise SystemExit("bench.cluster needs redis-server on PATH")
    with tempfile.TemporaryDirectory(prefix="hostring-bench-cluster-") as tmp, RedisServer(Path(tmp)) as srv:
        if membership:
            mdir = Path(tmp) / "membership"
            mdir.mkdir()
            figures["membership"] = membership_figures(mdir, srv, w)
        figures["throughput"] = {}
        for k in w.node_counts:
            if k == 1:
                redis_node, figures["sqlite"] = one_node_beside_sqlite(Path(tmp), srv, w)
                figures["throughput"].update(redis_node)
            else:
                figures["throughput"].update(throughput_figures(Path(tmp), srv, replace(w, node_counts=(k,))))
        if "sqlite" not in figures:
            figures["sqlite"] = sqlite_figures(Path(tmp), w)
    end_of_run(figures["machine"])
    return figures


def against_targets(f: dict[str, Any]) -> dict[str, float]:
    """The figures the issue sets targets for, from one run: one Redis node's slowdown against one SQLite node
    (rate ratio), CPU per URL of 3 Redis nodes against 1 (all nodes and Redis), and the most round trips per URL."""
    t, out = f["throughput"], {}
    phases = (("discover", "admitted_per_s"), ("lease_complete", "urls_per_s"), ("lease_complete_reply", "urls_per_s"))
    if "1" in t and "sqlite" in f:
        for phase, rate in phases:
            out[f"sqlite_over_redis_{phase}"] = f["sqlite"][phase][rate] / t["1"][phase][rate]
    if "1" in t and "3" in t:
        for phase, _ in phases:
            out[f"cpu_3_over_1_{phase}"] = t["3"][phase]["per_url"]["cpu_ms"] / t["1"][phase]["per_url"]["cpu_ms"]
    out["max_round_trips_per_url"] = max(t[k][phase]["per_url"]["redis_round_trips"] for k in t for phase, _ in phases)
    return out


def _target_parts(ratios: dict[str, float]) -> list[str]:
    parts = []
    if "sqlite_over_redis_discover" in ratios:
        parts.append(
            f"1 SQLite node / 1 Redis node rate: Discover {ratios['sqlite_over_redis_discover']:.2f}x, "
            f"Lease+Complete {ratios['sqlite_over_redis_lease_complete']:.2f}x, lease in reply "
            f"{ratios['sqlite_over_redis_lease_complete_reply']:.2f}x (target <= 2x)"
        )
    if "cpu_3_over_1_discover" in ratios:
        parts.append(
            f"CPU per URL, 3 nodes / 1: Discover {ratios['cpu_3_over_1_discover']:.2f}x, "
            f"Lease+Complete {ratios['cpu_3_over_1_lease_complete']:.2f}x, lease in reply "
            f"{ratios['cpu_3_over_1_lease_complete_reply']:.2f}x (target <= 1.25x)"
        )
    parts.append(f"round trips per URL at most {ratios['max_round_trips_per_url']:.4f} (target <= 0.05)")
    return parts


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median Redis Lease+Complete slowdown against SQLite (each round measures both back to
    back, so its ratios are its own), with every round's target figures under "rounds" and the first round's
    membership figures."""
    ratios = [against_targets(r) for r in rounds]
    key = "sqlite_over_redis_lease_complete"
    order = sorted(range(len(rounds)), key=lambda i: ratios[i].get(key, 0.0))
    median = order[(len(order) - 1) // 2]
    out = {**rounds[median], "targets": ratios[median], "median_round": median + 1, "rounds": ratios}
    if "membership" in rounds[0]:  # measured in the first round only
        out["membership"] = rounds[0]["membership"]
    return out


def _cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{n} {s:.1f}" for n, s in sorted(cpu.items()) if s >= 0.05)


def _membership_lines(mem: dict[str, Any]) -> list[str]:
    j, lv, fk = mem["join"], mem["leave_sigterm"], mem["failure_sigkill"]
    return [
        f"membership, 3 nodes holding {mem['domains']:,} domains / {mem['urls']:,} URLs in Redis:",
        f"  join of a 4th node: moved {j['moved_fraction']:.3f} of the domains (ideal {j['ideal_fraction']:.3f}; "
        f"{j['moved_domains']:,}, all to the new node: {j['moved_to_new_node_only']}, new node logged "
        f"{j['adopted_logged_by_new_node']} adopted)",
        f"    settled {j['settle_s_from_process_start']:.2f}s after the process started (port after "
        f"{j['process_start_to_port_s']:.2f}s, in the ring after {j['process_start_to_registered_s']:.2f}s, "
        f"every node at the new epoch and SERVING {j['registered_to_settled_s']:.2f}s later); handoff work as "
        f"logged: {j['handoff_seconds_logged']}",
        f"  leave (SIGTERM): moved {lv['moved_fraction']:.3f} ({lv['moved_domains']:,} domains); out of the ring "
        f"{lv['signal_to_left_ring_s']:.2f}s after the signal, adopted by the survivors "
        f"{lv['settle_s_from_signal']:.2f}s after it; fences still naming it: {lv['fences_still_naming_leaver']}; "
        f"handoff work as logged: {lv['handoff_seconds_logged']}",
        f"  failure (SIGKILL, heartbeat timeout {fk['heartbeat_timeout_s']}s): out of the ring "
        f"{fk['kill_to_left_ring_s']:.2f}s after the kill, {fk['moved_domains']:,} domains adopted "
        f"{fk['settle_s_from_kill']:.2f}s after it",
        "",
    ]  # fmt: skip


def _phase_line(name: str, what: str, rate: float, p: dict[str, float], cpu: dict[str, float]) -> str:
    busy = rate * p["cpu_ms"] / 1000
    return (
        f"{name:>8} {what:<15} {rate:>9,.0f}/s {p['node_cpu_ms']:>8.3f} {p['redis_cpu_ms']:>8.3f} {p['cpu_ms']:>8.3f}"
        f" {busy:>5.2f} {p['redis_round_trips']:>8.4f} {p['redis_script_calls']:>8.4f} {p['redis_commands']:>8.2f}"
        f"   {_cpu(cpu)}"
    )


def table(f: dict[str, Any]) -> str:
    m, w = f["machine"], f["workload"]
    lines = [
        machine_line(m, sqlite=False),
        f"  {m['note']}: figures for more nodes show how they divide the same cores",
        f"workload: {w['url_shape']}",
        f"  nodes: {w['nodes']}; coordinator: {w['coordinator']}",
        f"  Discover: {w['links']:,} distinct links over {w['hosts']:,} hosts; {w['discover_client']}",
        f"  Lease+Complete: {w['lease_pages']:,} pages; {w['lease_client']}",
        f"  Lease+Complete, lease in reply: {w['lease_reply_client']}",
        f"  SQLite row: {w['sqlite']}",
        "",
        *(_membership_lines(f["membership"]) if "membership" in f else []),
        "per URL: CPU ms of the node processes, of Redis (INFO cpu) and both; busy: rate x that CPU, the CPUs the "
        "nodes and Redis kept busy on average (one node and Redis could keep two); Redis round trips "
        "(reply writes), script calls (EVALSHA) and commands (those scripts run included)",
        f"{'nodes':>8} {'phase':<15} {'rate':>11} {'node ms':>8} {'redis ms':>8} {'CPU ms':>8} {'busy':>5} "
        f"{'trips':>8} {'scripts':>8} {'cmds':>8}   CPU seconds by process",
    ]  # fmt: skip
    rows = [(f"{k} redis", t) for k, t in f["throughput"].items()]
    if "sqlite" in f:
        rows.append(("1 sqlite", f["sqlite"]))
    for name, t in rows:
        d, lc, lr = t["discover"], t["lease_complete"], t["lease_complete_reply"]
        lines.append(_phase_line(name, "Discover", d["admitted_per_s"], d["per_url"], d["cpu_s"]))
        lines.append(_phase_line(name, "Lease+Complete", lc["urls_per_s"], lc["per_url"], lc["cpu_s"]))
        lines.append(_phase_line(name, "lease in reply", lr["urls_per_s"], lr["per_url"], lr["cpu_s"]))
    first = next(iter(f["throughput"].values()))["discover"]
    lines.append(
        f"(client-side routing by ring, identify() + owner(): {first['routing_links_per_s_client']:,.0f} "
        "links/s on one core, not in the figures above)"
    )
    lines += ["", "against the issue's targets:", *(f"  {part}" for part in _target_parts(f["targets"]))]
    if len(f["rounds"]) > 1:
        lines.append(f"the round above is round {f['median_round']}, the median of {len(f['rounds'])} by the Redis "
                     "Lease+Complete ratio; every round:")  # fmt: skip
        lines += [f"  round {i}: {'; '.join(_target_parts(r))}" for i, r in enumerate(f["rounds"], 1)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--quick", action="store_true", help="a short run: 1k hosts, 10k links, 3k pages")
    parser.add_argument("--no-membership", action="store_true", help="throughput figures only")
    parser.add_argument(
        "--nodes", type=int, nargs="+", metavar="N", help="the node counts measured on Redis (default: 1 2 3)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the throughput figures N times (membership once) and print the median round by the Redis "
        "Lease+Complete ratio, with every round's ratios (default: 1)",
    )
    parser.add_argument(
        "--streams",
        type=positive_int,
        metavar="N",
        help="client threads per node, each with one call in flight, as that many workers' batches would be "
        f"(default: {Workload.streams_per_node}, one fetch worker's two completion batches in flight)",
    )
    args = parser.parse_args(argv)
    workload = QUICK if args.quick else Workload()
    if args.nodes:
        workload = replace(workload, node_counts=tuple(args.nodes))
    if args.streams:
        workload = replace(workload, streams_per_node=args.streams)
    figures = over_rounds([run(workload, membership=not args.no_membership and n == 0) for n in range(args.rounds)])
    print(json.dumps(figures, indent=2) if args.json else table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
