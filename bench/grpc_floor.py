"""What gRPC alone costs on this machine: a grpc.aio server that answers every Discover with a prebuilt reply.

A node's Discover figure includes its transport. This server does what a node's shell does with a call except the
work: the same method and message limits, the request decoded into a DiscoverRequest, and a reply of the node's
shape (one verdict per link, with its fetch key and domain) sent, but built once beforehand. Its rate is the
ceiling gRPC and protobuf set for a node on this machine, the figure a node's rate is read against.

    python -m bench.grpc_floor --serve LINKS    # the server (prints "listening on port N"); bench.node starts it
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from hostring.limits import grpc_options
from hostring.v1 import frontier_pb2 as pb
from hostring_testing.proc import stop_process

REPO = Path(__file__).resolve().parent.parent
_PORT_LINE = re.compile(r"listening on port (\d+)")
_METHOD = "/hostring.v1.Frontier/Discover"
STARTUP_TIMEOUT_S = 30.0


def prebuilt_reply(links: int) -> bytes:
    """A DiscoverResponse of `links` admitted verdicts, each with a fetch key and domain like the bench's URLs."""
    resp = pb.DiscoverResponse(ring_epoch=1)
    for u in range(links):
        entry = resp.verdicts.add()
        entry.verdict = pb.ADMITTED
        entry.fetch_key = f"http://site{u}.com/p/{u}"
        entry.domain = f"site{u}.com"
    return resp.SerializeToString()


async def _serve(links: int) -> None:
    reply = prebuilt_reply(links)

    async def discover(request: pb.DiscoverRequest, context: Any) -> bytes:
        return reply

    handler = grpc.unary_unary_rpc_method_handler(
        discover, request_deserializer=pb.DiscoverRequest.FromString, response_serializer=None
    )
    server = grpc.aio.server(options=grpc_options())
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("hostring.v1.Frontier", {"Discover": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on port {port}", flush=True)
    await server.wait_for_termination()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def floor(payloads: Sequence[bytes], links: int, streams: int) -> dict[str, float]:
    """Send every payload (a serialized DiscoverRequest of `links` links) to a fresh floor server on `streams` threads,
    one call in flight each; calls/s, links/s and the server's CPU per call and per link."""
    cmd = [sys.executable, "-m", "bench.grpc_floor", "--serve", str(links)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
        m = _PORT_LINE.search(proc.stdout.readline().decode() if ready else "")
        if m is None:
            raise RuntimeError("the gRPC floor server did not start")
        with grpc.insecure_channel(f"127.0.0.1:{m.group(1)}", options=grpc_options()) as channel:
            call = channel.unary_unary(
                _METHOD, request_serializer=None, response_deserializer=pb.DiscoverResponse.FromString
            )
            call(payloads[0], timeout=STARTUP_TIMEOUT_S)  # connected and warm before the clock starts
            counter = itertools.count()

            def stream() -> None:
                while (n := next(counter)) < len(payloads):
                    call(payloads[n], timeout=STARTUP_TIMEOUT_S)

            threads = [threading.Thread(target=stream) for _ in range(streams)]
            cpu0, t0 = _cpu_seconds(proc.pid), time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall, cpu = time.perf_counter() - t0, _cpu_seconds(proc.pid) - cpu0
    finally:
        stop_process(proc)
    calls = len(payloads)
    return {
        "calls_per_s": calls / wall,
        "links_per_s": calls * links / wall,
        "server_cpu_us_per_call": 1e6 * cpu / calls,
        "links_per_server_cpu_s": calls * links / cpu if cpu > 0 else float("inf"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, required=True, metavar="LINKS", help="serve replies of LINKS verdicts")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.serve))
    return 0


if __name__ == "__main__":
    sys.exit(main())
