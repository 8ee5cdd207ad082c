"""The client side of the frontier wire: one channel per node, links routed to their owners, completions batched.

Shared by the fetch worker and the `hostring` command (and any other client of the frontier nodes), so none of
them imports another service for it. Which node owns a domain is a Router's to say: hostring.membership's
RingWatcher in a cluster, StaticRouter when one node owns everything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from hostring.limits import MAX_COMPLETIONS_PER_BATCH, MAX_LINKS_PER_COMPLETE, MAX_MESSAGE_BYTES
from hostring.security import INSECURE, TlsConfig
from hostring.urls import domain_of
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.client")

DISCOVER_BATCH = 256
# How long links wait for an owner: longer than a heartbeat timeout, so a node that died (and still stands in
# the ring until the coordinator notices) does not make its links vanish.
ROUTE_DEADLINE_S = 120.0
_BATCH_BYTES = MAX_MESSAGE_BYTES // 2  # a CompleteBatch's request, leaving the reply room for forwarded links


class Router(Protocol):
    """Which nodes exist and which one owns a registrable domain (hostring.membership.RingWatcher is one)."""

    def nodes(self) -> Sequence[str]: ...

    def owner(self, domain: str) -> str: ...

    async def refresh(self) -> object:
        """Read the ring again (after a wrong-owner answer or a lost node); what it answers is not used."""
        ...


class StaticRouter:
    """One node owns everything: the embedded `hostring crawl` setup."""

    def __init__(self, address: str, tls: TlsConfig | None = None) -> None:
        self.address = address
        self.tls = tls or INSECURE

    def nodes(self) -> Sequence[str]:
        return [self.address]

    def owner(self, domain: str) -> str:
        return self.address

    async def refresh(self) -> None:
        return None


class NodeClients:
    """One channel per node address, and Discover routed to owners with re-sends on wrong-owner or a lost node.

    Channels use `tls` when given, else the router's own `.tls` (a RingWatcher or StaticRouter carries the
    process's TlsConfig), else plaintext: a worker reaches the nodes exactly as it reaches the coordinator.
    """

    def __init__(
        self,
        router: Router,
        *,
        worker_id: str,
        channel_options: Sequence[tuple[str, object]] = (),
        tls: TlsConfig | None = None,
    ) -> None:
        self.router = router
        self.worker_id = worker_id
        self.tls: TlsConfig = tls or getattr(router, "tls", None) or INSECURE
        self._options = list(channel_options)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.FrontierStub] = {}

    def stub(self, address: str) -> pb_grpc.FrontierStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self.tls.aio_channel(address, options=self._options)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)

    async def route(
        self,
        links: Sequence[pb.Link],
        on_verdicts: Callable[[Sequence[pb.Link], Sequence[pb.LinkVerdict]], None] | None = None,
    ) -> int:
        """Send links to the owners of their domains; the number that found no owner by the deadline.

        `on_verdicts(chunk, verdicts)` sees every answered Discover (WRONG_OWNER verdicts included: those links
        are sent again, and answered again later).
        """
        pending = list(links)
        deadline = asyncio.get_running_loop().time() + ROUTE_DEADLINE_S
        round_ = 0
        while True:
            by_owner: dict[str, list[pb.Link]] = {}
            try:
                for link in pending:
                    by_owner.setdefault(self.router.owner(domain_of(link.observed, link.base_url)), []).append(link)
            except LookupError:
                by_owner = {}
            retry: list[pb.Link] = [] if by_owner else pending
            for address, batch in by_owner.items():
                for i in range(0, len(batch), DISCOVER_BATCH):
                    chunk = batch[i : i + DISCOVER_BATCH]
                    try:
                        resp = await self.stub(address).Discover(
                            pb.DiscoverRequest(links=chunk, worker_id=self.worker_id), timeout=30
                        )
                    except grpc.aio.AioRpcError as e:
                        log.warning("discover on %s failed (%s); will re-route", address, e.code().name)
                        retry += chunk
                        continue
                    if on_verdicts is not None:
                        on_verdicts(chunk, resp.verdicts)
                    retry += [link for link, v in zip(chunk, resp.verdicts, strict=True) if v.verdict == pb.WRONG_OWNER]
            if not retry:
                return 0
            pending = retry
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(min(2.0, 0.1 * 2**round_))
            round_ += 1
            try:
                await self.router.refresh()
            except Exception as e:  # the coordinator may be restarting: keep the links and try again
                log.warning("ring refresh failed: %s", e)
        log.error("%d links found no owner within %.0f s", len(pending), ROUTE_DEADLINE_S)
        return len(pending)


class CompletionBatcher:
    """Completions that finish in the same event-loop turn go to their node as one CompleteBatch call.

    Nothing waits for a batch to fill: the send is scheduled with call_soon, so a lone completion goes at once
    and a busy worker naturally sends many per call (one RPC and one commit on the node instead of many). A batch
    beyond the node's caps (hostring.limits) goes as several calls.
    """

    def __init__(self, clients: NodeClients) -> None:
        self.clients = clients
        self._pending: dict[str, list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]]] = {}
        self._sends: set[asyncio.Task[None]] = set()

    def submit(self, address: str, request: pb.CompleteRequest) -> asyncio.Future[pb.CompleteResponse]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.CompleteResponse] = loop.create_future()
        batch = self._pending.setdefault(address, [])
        batch.append((request, future))
        if len(batch) == 1:
            loop.call_soon(self._start, address)
        return future

    def _start(self, address: str) -> None:
        task = asyncio.ensure_future(self._send(address))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, address: str) -> None:
        batch = self._pending.pop(address, [])
        parts = _within_limits(batch)
        if len(parts) > 1:  # rare: many link-heavy pages at once; each part is one call within the node's caps
            await asyncio.gather(*(self._send_part(address, part) for part in parts))
        elif batch:
            await self._send_part(address, batch)

    async def _send_part(
        self, address: str, batch: list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]]
    ) -> None:
        try:
            resp = await self.clients.stub(address).CompleteBatch(
                pb.CompleteBatchRequest(completions=[r for r, _ in batch]), timeout=30
            )
        except grpc.aio.AioRpcError as e:
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, future), result in zip(batch, resp.results, strict=True):
            if not future.done():
                future.set_result(result)


def _within_limits(
    batch: list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]],
) -> list[list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]]]:
    """Split completions into CompleteBatch calls within the node's caps (completions, links, message bytes)."""
    parts: list[list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]]] = [[]]
    links = size = 0
    for entry in batch:
        n, b = len(entry[0].links), entry[0].ByteSize() + 8
        part = parts[-1]
        if part and (
            len(part) >= MAX_COMPLETIONS_PER_BATCH or links + n > MAX_LINKS_PER_COMPLETE or size + b > _BATCH_BYTES
        ):
            parts.append([])
            links = size = 0
        parts[-1].append(entry)
        links += n
        size += b
    return [p for p in parts if p]
