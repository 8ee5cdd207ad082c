"""The cluster commands of `hostring`: coordinator, worker, status and seed (node lives in cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import grpc

from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc


def cmd_coordinator(args: argparse.Namespace) -> int:
    from coordinator.server import serve_forever, start_coordinator

    coord = start_coordinator(args.listen, redis_url=args.redis or None, heartbeat_timeout_s=args.heartbeat_timeout)
    if args.metrics_port is not None:
        from coordinator.metrics import coordinator_registry
        from hostring.metrics import serve_metrics

        serve_metrics(args.metrics_port, coordinator_registry(coord.service.membership, coord._redis), args.listen)
    print(
        f"hostring coordinator listening on port {coord.port}"
        f" ({'membership in ' + args.redis if args.redis else 'membership in memory'})",
        flush=True,
    )
    serve_forever(coord)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from fetch_worker.fetch import Fetcher, FetchLimits
    from fetch_worker.netpolicy import NetworkPolicy
    from fetch_worker.warc import WarcWriter
    from fetch_worker.worker import Worker
    from hostring.membership import RingWatcher

    try:
        policy = NetworkPolicy(args.allow_network)
    except ValueError as e:
        raise SystemExit(f"hostring: --allow-network: {e}") from e

    async def run() -> None:
        watcher = RingWatcher(args.coordinator)
        await watcher.start(timeout=args.connect_timeout)
        limits = FetchLimits(total_timeout_s=args.fetch_timeout)
        fetcher = Fetcher(policy, args.user_agent, limits, max_connections=args.fetchers)
        warc = WarcWriter(Path(args.out), prefix=f"hostring-{args.id or 'worker'}") if args.out else None
        token = args.user_agent.split("/")[0].split()[0]
        worker = Worker(
            watcher, fetcher, warc=warc, worker_id=args.id, max_in_flight=args.fetchers, product_token=token
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"hostring worker {worker.worker_id} leasing from ring epoch {watcher.ring.epoch}", flush=True)
        try:
            await worker.run(stop, until_drained=args.until_drained, grace_s=args.grace)
        finally:
            await worker.close()
            await watcher.close()

    asyncio.run(run())
    return 0


def _ring(coordinator: str, timeout: float) -> cpb.RingState:
    with grpc.insecure_channel(coordinator) as channel:
        return cpb_grpc.CoordinatorStub(channel).GetRing(cpb.GetRingRequest(), timeout=timeout)  # type: ignore[no-untyped-call]


def cmd_status(args: argparse.Namespace) -> int:
    ring = _ring(args.coordinator, args.timeout)
    rows = []
    for m in ring.members:
        row = {"node": m.node_id, "address": m.address, "weight": m.weight, "healthy": m.healthy}
        try:
            with grpc.insecure_channel(m.address) as channel:
                s = pb_grpc.FrontierStub(channel).Stats(pb.StatsRequest(), timeout=args.timeout)  # type: ignore[no-untyped-call]
            row.update(
                epoch=s.ring_epoch,
                domains=s.owned_domains,
                queued=s.queued,
                in_flight=s.in_flight,
                hosts=s.hosts_with_work,
                fetched=dict(s.urls_by_state).get("fetched", 0),
            )
        except grpc.RpcError as e:
            row["error"] = e.code().name  # type: ignore[attr-defined]
        rows.append(row)
    if args.json:
        json.dump({"ring_epoch": ring.epoch, "nodes": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"ring epoch {ring.epoch}, {len(rows)} node(s)")
    header = (
        f"{'node':<12} {'address':<22} {'w':>2} {'ok':>3} {'epoch':>6} {'domains':>8} {'queued':>8} "
        f"{'in flight':>9} {'hosts':>6} {'fetched':>8}"
    )
    print(header)
    for r in rows:
        if "error" in r:
            print(f"{r['node']:<12} {r['address']:<22} {r['weight']:>2} {'no':>3}  unreachable: {r['error']}")
            continue
        print(
            f"{r['node']:<12} {r['address']:<22} {r['weight']:>2} {'yes' if r['healthy'] else 'no':>3} "
            f"{r['epoch']:>6} {r['domains']:>8} {r['queued']:>8} {r['in_flight']:>9} {r['hosts']:>6} "
            f"{r['fetched']:>8}"
        )
    return 0


def cmd_seed(args: argparse.Namespace) -> int:
    from coordinator.crawl import CrawlError, read_seeds
    from fetch_worker.routing import NodeClients
    from hostring.membership import RingWatcher

    try:
        seeds = read_seeds(args.urls, Path(args.file) if args.file else None)
    except CrawlError as e:
        print(f"hostring: {e}", file=sys.stderr)
        return 2
    if not seeds:
        print("hostring: give URLs or --file", file=sys.stderr)
        return 2

    async def run() -> int:
        watcher = RingWatcher(args.coordinator)
        await watcher.start(timeout=args.timeout)
        clients = NodeClients(watcher, worker_id="seed")
        try:
            lost = await clients.route([pb.Link(observed=s, seed=True) for s in seeds])
        finally:
            await clients.close()
            await watcher.close()
        print(
            f"seeded {len(seeds) - lost} URL(s) into ring epoch {watcher.ring.epoch}"
            + (f"; {lost} found no owner" if lost else "")
        )
        return 1 if lost else 0

    return asyncio.run(run())


def add_cluster_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser], user_agent: str) -> None:
    """Register coordinator, worker, status and seed on the `hostring` parser."""
    c = sub.add_parser(
        "coordinator",
        help="run the coordinator: membership and ring epochs",
        description="Keep cluster membership and publish the ring; in Redis with --redis, so it survives restarts.",
    )
    c.add_argument("--listen", default="127.0.0.1:50050", metavar="HOST:PORT")
    c.add_argument("--redis", default="", metavar="URL", help="keep membership and epochs in this Redis")
    c.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="a node silent this long leaves the ring (default: %(default)s)",
    )
    c.add_argument("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics")
    c.set_defaults(func=cmd_coordinator)

    w = sub.add_parser(
        "worker",
        help="run a stateless fetch worker against a cluster",
        description="Lease from every node of the ring, fetch safely, write WARC, route links.",
    )
    w.add_argument("--coordinator", required=True, metavar="ADDR")
    w.add_argument("--id", default="", help="worker id (default: random)")
    w.add_argument(
        "--allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="let the fetcher connect to these otherwise refused addresses; repeatable",
    )
    w.add_argument("--user-agent", default=user_agent, metavar="UA")
    w.add_argument("--out", default="", metavar="DIR", help="write WARC files here (default: none)")
    w.add_argument("--fetchers", type=int, default=64, metavar="N", help="fetches in flight (default: %(default)s)")
    w.add_argument("--fetch-timeout", type=float, default=60.0, metavar="S")
    w.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help="on SIGTERM, time for in-flight fetches to finish before they are handed back",
    )
    w.add_argument("--until-drained", action="store_true", help="exit when every node has no work left")
    w.add_argument("--connect-timeout", type=float, default=30.0, metavar="S")
    w.add_argument("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics")
    w.set_defaults(func=cmd_worker)

    s = sub.add_parser("status", help="ring epoch, nodes, owned domains, queue depths, leases in flight")
    s.add_argument("--coordinator", required=True, metavar="ADDR")
    s.add_argument("--json", action="store_true")
    s.add_argument("--timeout", type=float, default=10.0)
    s.set_defaults(func=cmd_status)

    sd = sub.add_parser("seed", help="seed a running cluster: each URL goes to the node owning its domain")
    sd.add_argument("urls", nargs="*", metavar="URL")
    sd.add_argument("--coordinator", required=True, metavar="ADDR")
    sd.add_argument("--file", metavar="F", help="URLs, one per line")
    sd.add_argument("--timeout", type=float, default=30.0)
    sd.set_defaults(func=cmd_seed)
