"""The plug-in's side of the wire, without Scrapy: lease loops, renewals, batched Discover and Complete.

One `FrontierSession` per Scrapy process, on Scrapy's asyncio event loop. It leases from every node, hands each
item to `on_lease`, keeps the lease renewed until it is completed, sends discovered links to their owners in
batches, and says when every node has stayed drained (nothing queued, nothing in flight) for the grace period.

Leasing costs one call per page, not two: each CompleteBatch asks for the slots its completions free and waits on
the node (lease_wait_ms) for the next ready item, so a host's next URL comes back as the answer to the call that
completed a page. A long-polling Lease per node (a fair share of the free capacity) is parked only while no such
call waits there: at the start, and whenever the completions' calls have all been answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from hostring.client import CompletionBatcher, FixedRouting, NodeClients, Router, renew_at, successor
from hostring.limits import grpc_options
from hostring.ring import Member, Ring
from hostring.security import INSECURE, TlsConfig
from hostring.urls import domain_of
from hostring.v1 import frontier_pb2 as pb

log = logging.getLogger("hostring.scrapy")

_RPC_TIMEOUT_S = 30.0
_IDLE_POLL_S = 0.2
_ERROR_BACKOFF_S = 0.5
_RENEW_TICK_S = 0.25
_RETRY_FIRST_S = 0.2
_RETRY_CAP_S = 2.0

Stat = Callable[[str, int], None]
SHUTDOWN = pb.Outcome(error_class="worker_shutdown", retry_after_s=-1)
"""What a lease is given back with when the process stops before finishing it (the node retries it)."""


class StaticRing(FixedRouting):
    """A Router over a fixed list of nodes: one owns everything; several share the domains by a ring of their
    addresses (every process given the same list routes alike). For nodes started without a coordinator."""

    def __init__(self, addresses: Sequence[str], tls: TlsConfig | None = None) -> None:
        if not addresses:
            raise ValueError("a StaticRing needs at least one node address")
        self.addresses = list(dict.fromkeys(addresses))
        self.tls = tls or INSECURE
        self._ring = Ring(1, (Member(a, a) for a in self.addresses))

    def nodes(self) -> Sequence[str]:
        return self.addresses

    def owner(self, domain: str) -> str:
        if len(self.addresses) == 1:
            return self.addresses[0]
        member = self._ring.owner(domain)
        assert member is not None
        return member.address

    def split(self, links: Sequence[pb.Link], address: str) -> tuple[list[pb.Link], list[pb.Link]]:
        """(the links `address` owns, the others)."""
        own: list[pb.Link] = []
        other: list[pb.Link] = []
        for link in links:
            (own if self.owner(domain_of(link.observed, link.base_url)) == address else other).append(link)
        return own, other


@dataclass(eq=False)
class Lease:
    """One leased item while this process holds it."""

    item: pb.LeaseItem
    address: str
    deadline: float
    """Unix seconds: the node's deadline, moved on by each renewal."""
    span_s: float
    """How long the node granted at first: each renewal asks for as much again."""
    started: float = 0.0
    """time.monotonic() when the download began (0: not yet)."""
    completing: bool = False
    lost: bool = False
    """A renewal was refused: the node has handed the item out again; the Complete will be stale."""
    renewing: asyncio.Task[Any] | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[str, int]:
        return (self.item.lease_id, self.item.generation)


class FrontierSession:
    """Leases, renewals, Discover and Complete for one process (see the module docstring)."""

    def __init__(
        self,
        router: Router,
        *,
        worker_id: str,
        capacity: int,
        on_lease: Callable[[Lease], None],
        stat: Stat,
        lease_wait_s: float = 1.0,
        drain_grace_s: float = 2.0,
    ) -> None:
        self.router = router
        self.worker_id = worker_id
        self.capacity = capacity
        self.clients = NodeClients(router, worker_id=worker_id, channel_options=grpc_options())
        self._wait_ms = int(lease_wait_s * 1000)
        self._batcher = CompletionBatcher(
            self.clients, want=self._want, leased=self._take_leased, lease_wait_ms=self._wait_ms, stream=True
        )
        self._on_lease = on_lease
        self._stat = stat
        self._grace_s = drain_grace_s
        self._open: dict[tuple[str, int], Lease] = {}
        self._settling = 0  # open leases whose Complete is on its way: their slots are free for new leases
        self._reserved = 0  # slots asked for by calls not answered yet
        self._asking: dict[str, int] = {}  # per node: calls parked there for its next items (Lease, CompleteBatch)
        self._changed = asyncio.Event()  # a call asking for items was answered, or a lease ended
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._drained_since: dict[str, float | None] = {}
        self._outbox: list[tuple[pb.Link, Callable[[pb.LinkVerdict | None], None]]] = []
        self._flush_scheduled = False
        self._discovering = 0
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start leasing from every node the router knows, and keep the node set and leases current."""
        self._spawn(self._supervise(), "hostring-nodes")
        self._spawn(self._renew_loop(), "hostring-renew")

    async def close(self, *, give_back: bool = True, timeout_s: float = 10.0) -> None:
        """Stop leasing; send what is still to be discovered; give unfinished leases back; close the channels."""
        self._closing = True
        for task in self._loops.values():
            task.cancel()
        if self._outbox:
            self._flush()
        pending = [lease for lease in self._open.values() if not lease.completing]
        if give_back and pending:
            self._stat("hostring/lease/given_back", len(pending))
            for lease in pending:
                self.spawn(self.complete(lease, SHUTDOWN))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:  # completions (and what their answers hand back) end
            others = [t for t in self._tasks if t.get_name() not in ("hostring-nodes", "hostring-renew")]
            if not others:
                break
            await asyncio.wait(others, timeout=left)
        for task in list(self._tasks) + list(self._loops.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, *self._loops.values(), return_exceptions=True)
        self._batcher.close()
        await self.clients.close()

    def spawn(self, coro: Coroutine[Any, Any, object], name: str = "hostring") -> asyncio.Task[Any]:
        """Run a coroutine in the background, kept referenced until it ends (close() waits for it)."""
        return self._spawn(coro, name)

    def _spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("hostring background task %s failed", task.get_name(), exc_info=task.exception())

    # ------------------------------------------------------------------ what the scheduler asks

    @property
    def busy(self) -> bool:
        """Whether this process holds leases or still has links to discover."""
        return bool(self._open or self._outbox or self._discovering)

    def finished(self) -> bool:
        """Every node has answered "drained" (no work queued, nothing in flight) for the whole grace period."""
        nodes = list(self.router.nodes())
        if not nodes:
            return False
        since = [self._drained_since.get(a) for a in nodes]
        if any(s is None for s in since):
            return False
        return time.monotonic() - max(s for s in since if s is not None) >= self._grace_s

    # ------------------------------------------------------------------ leasing

    async def _supervise(self) -> None:
        """One lease loop per node in the router's current view; a loop whose node left the ring stops."""
        while not self._closing:
            current = set(self.router.nodes())
            for address in current - set(self._loops):
                self._loops[address] = asyncio.ensure_future(self._lease_loop(address))
            for address in set(self._loops) - current:
                self._loops.pop(address).cancel()
                self._drained_since.pop(address, None)
            await asyncio.sleep(1.0)

    def _free(self, address: str) -> int:
        """Slots to ask `address` for: free ones (neither held by a lease still working nor asked for), up to a
        fair share of the capacity."""
        free = self.capacity - (len(self._open) - self._settling) - self._reserved
        return min(free, max(1, math.ceil(self.capacity / max(1, len(self.router.nodes())))))

    def _ask(self, address: str, n: int) -> None:
        self._reserved += n
        self._asking[address] = self._asking.get(address, 0) + 1

    def _answered(self, address: str, n: int) -> None:
        self._reserved -= n
        self._asking[address] -= 1
        self._changed.set()

    async def _changes(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def _lease_loop(self, address: str) -> None:
        """Keep one Lease parked on `address` while no completion's call waits there for its next items."""
        stub = self.clients.stub(address)
        while not self._closing:
            want = self._free(address)
            if self._asking.get(address, 0) or want <= 0:
                await self._changes()
                continue
            self._ask(address, want)
            try:
                resp = await stub.Lease(
                    pb.LeaseRequest(worker_id=self.worker_id, max_items=want, wait_ms=self._wait_ms),
                    timeout=_RPC_TIMEOUT_S + self._wait_ms / 1000,
                )
            except grpc.aio.AioRpcError as e:
                log.warning("lease from %s failed: %s", address, e.code().name)
                self._drained_since[address] = None
                await asyncio.sleep(_ERROR_BACKOFF_S)
                continue
            finally:
                self._answered(address, want)
            if resp.drained and not resp.items:
                if self._drained_since.get(address) is None:
                    self._drained_since[address] = time.monotonic()
            else:
                self._drained_since[address] = None
            self._hand_out(address, resp.items)
            if not resp.items and resp.drained:
                await asyncio.sleep(_IDLE_POLL_S)

    def _want(self, address: str, completing: int) -> int:
        """Leases a CompleteBatch to `address` asks for (its completions' slots are already counted free)."""
        if self._closing:
            return 0
        want = max(0, self._free(address))
        if want:
            self._ask(address, want)
        return want

    def _take_leased(self, address: str, items: Sequence[pb.LeaseItem], asked: int) -> None:
        """What a CompleteBatch's answer leased (nothing if the call failed); given straight back when closing."""
        self._answered(address, asked)
        if items:
            self._drained_since[address] = None
            self._hand_out(address, items)

    def _hand_out(self, address: str, items: Sequence[pb.LeaseItem]) -> None:
        """Open a lease for each item and give it to `on_lease` (back to the node at once when closing)."""
        now = time.time()
        for item in items:
            lease = Lease(item, address, item.deadline_ms / 1000, max(1.0, item.deadline_ms / 1000 - now))
            self._open[lease.key] = lease
            if self._closing:
                self.spawn(self.complete(lease, SHUTDOWN), "hostring-complete")
                continue
            self._stat("hostring/lease/robots" if item.kind == pb.ROBOTS else "hostring/lease/page", 1)
            try:
                self._on_lease(lease)
            except Exception as e:  # give it back rather than hold (and renew) it for ever
                log.exception("handing out %s failed", item.url)
                failed = pb.Outcome(error_class="client_error", error_detail=repr(e)[:500], retry_after_s=-1)
                self.spawn(self.complete(lease, failed), "hostring-complete")

    # ------------------------------------------------------------------ renewals

    async def _renew_loop(self) -> None:
        """Renew each open lease at half its remaining time, for as long again as first granted."""
        while True:
            await asyncio.sleep(_RENEW_TICK_S)
            now = time.time()
            for lease in list(self._open.values()):
                if lease.lost or lease.completing or lease.renewing is not None:
                    continue
                if lease.deadline - now < lease.span_s / 2:
                    lease.renewing = self._spawn(self._renew(lease), "hostring-renew-one")

    async def _renew(self, lease: Lease) -> None:
        """Renew the lease for as long again as first granted, at the node that owns its domain.

        A node that does not answer (killed) is asked again until the ring names its successor, and that one at
        once; a node that no longer owns the domain (or answers wrong_owner) is not the last word: the renewal goes
        to the owner at the newest ring, which adopts the leased row with its deadline. `lease.address` follows,
        so the lease's Complete starts there too. Only the owner saying the lease is gone marks it lost.
        """
        request = pb.RenewRequest(
            lease_id=lease.item.lease_id,
            generation=lease.item.generation,
            extend_ms=int(lease.span_s * 1000),
            worker_id=self.worker_id,
        )
        domain = lease.item.domain
        try:
            while not (lease.completing or lease.lost):
                address = lease.address
                pause = max(0.5, (lease.deadline - time.time()) / 2)
                try:
                    resp = await self.clients.stub(address).Renew(request, timeout=_RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError as e:
                    log.warning("renewing %s at %s failed: %s", lease.item.url, address, e.code().name)
                    if not domain:
                        return
                    lease.address = await self.router.moved(domain, address, pause)
                    continue
                if resp.ok:
                    lease.deadline = resp.deadline_ms / 1000
                    self._stat("hostring/renew/ok", 1)
                    return
                again = await renew_at(self.router, domain, address, resp.reason)
                if again is None:
                    lease.lost = True
                    self._stat("hostring/renew/lost", 1)
                    log.warning("lease of %s lost (%s): the node handed it out again", lease.item.url, resp.reason)
                    return
                if again == address:  # the node has not taken the domain over yet: ask again shortly
                    await asyncio.sleep(_RETRY_FIRST_S)
                lease.address = again
        finally:
            lease.renewing = None

    # ------------------------------------------------------------------ completing

    async def complete(
        self, lease: Lease, outcome: pb.Outcome, links: Sequence[pb.Link] = ()
    ) -> pb.CompleteResponse | None:
        """Report a lease's outcome to the owner of its domain (re-routed on wrong owner or a lost node); None
        if no node took it (the lease then expires and the item is handed out again)."""
        if lease.completing:
            return None
        lease.completing = True
        if links and isinstance(self.router, StaticRing) and len(self.router.addresses) > 1:
            # Standalone nodes each own everything: only this client's ring says where a link belongs, so links
            # for other nodes are Discovered there (before the Complete, so that none is lost) rather than
            # admitted by the node that leased the page.
            own, foreign = self.router.split(links, lease.address)
            if foreign:
                self._discovering += len(foreign)
                try:
                    await self.clients.route(foreign)
                finally:
                    self._discovered(len(foreign))
            links = own
        request = pb.CompleteRequest(
            lease_id=lease.item.lease_id,
            generation=lease.item.generation,
            outcome=outcome,
            worker_id=self.worker_id,
            links=links,
        )
        address = lease.address
        resp: pb.CompleteResponse | None = None
        self._settling += 1
        try:
            unanswered = 0
            while True:
                try:
                    resp = await self._batcher.submit(address, request)
                    if not resp.wrong_owner:
                        break
                    code, pause = grpc.StatusCode.FAILED_PRECONDITION, _RETRY_FIRST_S  # it may be adopting the domain
                except grpc.aio.AioRpcError as e:
                    code, pause = e.code(), min(_RETRY_FIRST_S * 2**unanswered, _RETRY_CAP_S)
                    unanswered += 1
                resp = None
                left = lease.deadline - time.time()
                if left <= 0:  # the lease has expired: it will be handed out again, nothing is left to settle
                    break
                log.warning("complete of %s on %s failed (%s), retrying", lease.item.url, address, code.name)
                pause = max(0.05, min(pause, left))
                address = await successor(self.router, lease.item.domain, address, pause)
        finally:
            if lease.renewing is not None:
                lease.renewing.cancel()
            self._settling -= 1
            self._open.pop(lease.key, None)
            self._changed.set()
        if resp is None:
            self._stat("hostring/complete/unreachable", 1)
            log.error("could not complete %s; its lease will expire and it will be handed out again", lease.item.url)
            return None
        if not resp.accepted:
            self._stat("hostring/complete/stale", 1)
        else:
            self._stat(f"hostring/complete/{resp.state or 'unknown'}", 1)
        if resp.forward:  # links whose domains another node owns: this process still has them to discover
            self._discovering += len(resp.forward)
            self.spawn(self._forward(list(resp.forward)), "hostring-forward")
        return resp

    async def _forward(self, links: list[pb.Link]) -> None:
        try:
            await self.clients.route(links)
        finally:
            self._discovered(len(links))

    def _discovered(self, n: int) -> None:
        """`n` links this process sent to Discover are answered: a node's "drained" from before may no longer hold
        (it may have admitted them), so finished() waits for drained answers given after."""
        self._discovering -= n
        for address in self._drained_since:
            self._drained_since[address] = None

    # ------------------------------------------------------------------ discovering

    def discover(self, link: pb.Link, on_verdict: Callable[[pb.LinkVerdict | None], None]) -> None:
        """Queue a link for Discover (sent with the others queued in the same event-loop turn); `on_verdict`
        gets its verdict, or None if no node could be reached for it."""
        self._outbox.append((link, on_verdict))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._outbox = self._outbox, []
        if batch:
            self._discovering += len(batch)
            self._spawn(self._send(batch), "hostring-discover")

    async def _send(self, batch: list[tuple[pb.Link, Callable[[pb.LinkVerdict | None], None]]]) -> None:
        waiting = {id(link): callback for link, callback in batch}

        def answered(chunk: Sequence[pb.Link], verdicts: Sequence[pb.LinkVerdict]) -> None:
            for link, verdict in zip(chunk, verdicts, strict=True):
                if verdict.verdict != pb.WRONG_OWNER:
                    callback = waiting.pop(id(link), None)
                    if callback is not None:
                        callback(verdict)

        try:
            await self.clients.route([link for link, _ in batch], on_verdicts=answered)
        finally:
            self._discovered(len(batch))
            for callback in waiting.values():
                callback(None)
