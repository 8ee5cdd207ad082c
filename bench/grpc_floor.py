"""What gRPC alone costs on this machine: a grpc.aio server that answers every Discover with a prebuilt reply.

A node's Discover figure includes its transport. This server does what a node's shell does with a call except the
work: the same method and message limits, the request decoded into a DiscoverRequest, and a reply of the node's
shape (one verdict per link, with its fetch key and domain) sent, but built once beforehand. Its rate is the
ceiling gRPC and protobuf set for a node on this machine, the figure a node's rate is read against. bench.node
drives it (`serving`) with the client it drives a node with.

    python -m bench.grpc_floor --serve LINKS    # the server (prints "listening on port N")
"""

from __future__ import annotations

import argparse
import asyncio
import re
import select
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


@contextmanager
def serving(links: int) -> Iterator[tuple[grpc.Channel, int]]:
    """A floor server answering replies of `links` verdicts, in a subprocess: a connected, warmed-up channel to it
    and its pid (for its CPU time); stopped on the way out."""
    cmd = [sys.executable, "-m", "bench.grpc_floor", "--serve", str(links)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
        m = _PORT_LINE.search(proc.stdout.readline().decode() if ready else "")
        if m is None:
            raise RuntimeError("the gRPC floor server did not start")
        with grpc.insecure_channel(f"127.0.0.1:{m.group(1)}", options=grpc_options()) as channel:
            warm_up = pb.DiscoverRequest(links=[pb.Link(observed="http://warm.example/")]).SerializeToString()
            channel.unary_unary(_METHOD, request_serializer=None, response_deserializer=None)(
                warm_up, timeout=STARTUP_TIMEOUT_S
            )  # connected before any clock starts
            yield channel, proc.pid
    finally:
        stop_process(proc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, required=True, metavar="LINKS", help="serve replies of LINKS verdicts")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.serve))
    return 0


if __name__ == "__main__":
    sys.exit(main())
