"""The client side of the frontier wire: one channel per node, links routed to their owners, completions batched.

Shared by the fetch worker and the `hostring` command (and any other client of the frontier nodes), so none of
them imports another service for it. Which node owns a domain is a Router's to say: hostring.membership's
RingWatcher in a cluster, StaticRouter when one node owns everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from hostring.limits import (
    MAX_COMPLETIONS_PER_BATCH,
    MAX_LEASE_ITEMS,
    MAX_LINKS_PER_COMPLETE,
    MAX_MESSAGE_BYTES,
    grpc_options,
)
from hostring.security import INSECURE, TlsConfig
from hostring.urls import domain_of
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.client")

DISCOVER_BATCH = 256
# How long `route` waits for owners by default (the `hostring seed` command): longer than a heartbeat timeout, so
# a node that died (and still stands in the ring until the coordinator notices) does not make its links vanish.
# A worker passes None: its links wait as long as it takes.
ROUTE_DEADLINE_S = 120.0
_BATCH_BYTES = MAX_MESSAGE_BYTES // 2  # a CompleteBatch's request, leaving the reply room for forwarded links
STORE_LOST = "store_lost"
"""The prefix of the details of a node's answer when its store lost data (UNAVAILABLE "store_lost: <reason>")."""
WRONG_OWNER = "wrong_owner"
"""The reason a node gives for a lease (Renew, Complete) or link of a domain it does not own at its ring epoch: the
owner at a newer ring has it, so the caller asks that node, and a lease is not taken for gone."""
# Codes that say "this node cannot answer now" (as opposed to "your request is wrong"): back off from it.
_UNREACHABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
)


class Router(Protocol):
    """Which nodes exist and which one owns a registrable domain (hostring.membership.RingWatcher is one)."""

    def nodes(self) -> Sequence[str]: ...

    def owner(self, domain: str) -> str: ...

    async def refresh(self) -> object:
        """Read the ring again (after a wrong-owner answer or a lost node); what it answers is not used."""
        ...

    async def moved(self, domain: str, address: str, timeout_s: float) -> str:
        """Wait up to `timeout_s` for a ring in which another node than `address` owns `domain`; that node's address
        (at once when the ring already says so), else `address`. What waits on a dead owner goes to its successor
        the moment the ring names it, not at the end of a backoff."""
        ...


class FixedRouting:
    """What a Router without a coordinator shares: its ring never changes, so there is nothing to read again and
    ownership never moves."""

    async def refresh(self) -> None:
        return None

    async def moved(self, domain: str, address: str, timeout_s: float) -> str:
        """Ownership never moves here: waits `timeout_s`."""
        await asyncio.sleep(timeout_s)
        return address


class StaticRouter(FixedRouting):
    """One node owns everything: the embedded `hostring crawl` setup."""

    def __init__(self, address: str, tls: TlsConfig | None = None) -> None:
        self.address = address
        self.tls = tls or INSECURE

    def nodes(self) -> Sequence[str]:
        return [self.address]

    def owner(self, domain: str) -> str:
        return self.address


async def owner_now(router: Router, domain: str, address: str) -> str:
    """The node that owns `domain` at the newest ring read from the coordinator (`address` when there is no domain
    or the ring cannot say): where a call the owner refused goes next."""
    if not domain:
        return address
    with contextlib.suppress(Exception):
        await router.refresh()
    with contextlib.suppress(LookupError):
        return router.owner(domain)
    return address


async def successor(router: Router, domain: str, address: str, pause_s: float) -> str:
    """Where a lease's next call goes after at most `pause_s` once `address` did not settle it: at once to the node
    the ring names as the domain's owner when that is no longer `address` (the WatchRing stream brings a dead
    owner's successor while its address is still backed off), else to the owner at the newest ring read at the
    end of the pause."""
    if not domain:
        await asyncio.sleep(pause_s)
        return address
    owner = await router.moved(domain, address, pause_s)
    return owner if owner != address else await owner_now(router, domain, address)


async def renew_at(router: Router, domain: str, address: str, reason: str) -> str | None:
    """Where a Renew that `address` refused with `reason` is asked again: the domain's owner at the newest ring
    when ownership moved or the node said wrong_owner (the new owner adopts the leased row with its deadline; it
    may still be taking the domain over); None when the lease is gone (expired, released or leased again)."""
    owner = await owner_now(router, domain, address)
    return owner if owner != address or reason == WRONG_OWNER else None


class NodeStoreLost(RuntimeError):
    """A node answered that its store lost data: nothing it says can be trusted until an operator restores it."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(
            f"store_lost: node {address} lost its store ({reason}); its queued and in-flight URLs are gone. "
            "Fix: run Redis with appendonly yes (deploy/README.md), restore it or start a new crawl, and restart "
            "the nodes"
        )
        self.address = address
        self.reason = reason


def store_lost_reason(error: grpc.RpcError) -> str | None:
    """The reason of a node's "store_lost: <reason>" answer, or None when the error is something else.

    The node answers UNAVAILABLE with those details; an older node whose shell does not map the error answers
    UNKNOWN with the exception's text, which carries the same words.
    """
    details_of = getattr(error, "details", None)
    details = (details_of() if callable(details_of) else "") or ""
    at = details.find(STORE_LOST + ":")
    if at < 0:
        return None
    return details[at + len(STORE_LOST) + 1 :].strip() or "unknown"


class NodeBackoff:
    """Per node address: consecutive failures, when to try it again, and one log line per node per interval.

    A node that does not answer is tried again after an exponential delay (capped, with jitter), so a dead
    owner costs each worker a call every few seconds rather than dozens; what waits for it (links,
    completions) waits, it is never dropped. A node that answers again is logged once and tried at once.
    """

    def __init__(
        self,
        *,
        first_s: float = 0.2,
        cap_s: float = 5.0,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first_s, self.cap_s, self.log_every_s = first_s, cap_s, log_every_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._ready_at: dict[str, float] = {}
        self._logged_at: dict[str, float] = {}

    def ready_in(self, address: str) -> float:
        """Seconds until `address` may be tried again (0 when it may be tried now)."""
        return max(0.0, self._ready_at.get(address, 0.0) - self._clock())

    def failures(self, address: str) -> int:
        return self._failures.get(address, 0)

    def failed(self, address: str, what: str, error: grpc.RpcError | str) -> float:
        """Note a failed call; the seconds to wait before the next one. Logs at most once per node per interval."""
        n = self._failures[address] = self._failures.get(address, 0) + 1
        delay: float = min(self.cap_s, self.first_s * 2.0 ** (n - 1)) * random.uniform(0.75, 1.0)
        now = self._clock()
        self._ready_at[address] = now + delay
        if now - self._logged_at.get(address, -1e18) >= self.log_every_s:
            self._logged_at[address] = now
            log.warning(
                "node %s: %s failed (%s), %d failure(s) in a row; backing off up to %.1f s between tries, "
                "its links and completions wait",
                address,
                what,
                _describe(error),
                n,
                self.cap_s,
            )
        return delay

    def succeeded(self, address: str) -> None:
        n = self._failures.pop(address, 0)
        self._ready_at.pop(address, None)
        if n:
            self._logged_at.pop(address, None)
            log.info("node %s answers again after %d failed call(s)", address, n)


def _describe(error: grpc.RpcError | str) -> str:
    if isinstance(error, str):
        return error
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    name = code().name if callable(code) else type(error).__name__
    text = (details() if callable(details) else "") or ""
    return f"{name}: {text[:200]}" if text else name


class NodeClients:
    """One channel per node, and Discover routed to owners with re-sends on wrong-owner or an unreachable node.

    Channels use `tls` when given, else the router's own `.tls` (a RingWatcher or StaticRouter carries the
    process's TlsConfig), else plaintext: a worker reaches the nodes exactly as it reaches the coordinator. They
    carry the one message limit of hostring.limits (and `channel_options` on top). `backoff` remembers which
    nodes failed lately: callers skip a node while it rests.
    """

    def __init__(
        self,
        router: Router,
        *,
        worker_id: str,
        channel_options: Sequence[tuple[str, object]] = (),
        tls: TlsConfig | None = None,
        backoff: NodeBackoff | None = None,
    ) -> None:
        self.router = router
        self.worker_id = worker_id
        self.tls: TlsConfig = tls or getattr(router, "tls", None) or INSECURE
        options: dict[str, object] = dict(grpc_options())
        options.update(channel_options)
        self._options = list(options.items())
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.FrontierStub] = {}
        self.backoff = backoff or NodeBackoff()

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
        *,
        deadline_s: float | None = ROUTE_DEADLINE_S,
        batch: int = DISCOVER_BATCH,
    ) -> int:
        """Send links to the owners of their domains; the number still without an owner after `deadline_s`.

        With deadline_s=None the links wait for as long as it takes (a dead owner leaves the ring after its
        heartbeat timeout, and its successor takes them). Raises NodeStoreLost when an owner lost its store.
        `on_verdicts(chunk, verdicts)` sees every answered Discover (WRONG_OWNER verdicts included: those links
        are sent again, and answered again later).
        """
        pending = list(links)
        loop = asyncio.get_running_loop()
        deadline = None if deadline_s is None else loop.time() + deadline_s
        backoff = self.backoff
        while True:
            by_owner: dict[str, list[pb.Link]] = {}
            try:
                for link in pending:
                    by_owner.setdefault(self.router.owner(domain_of(link.observed, link.base_url)), []).append(link)
            except LookupError:
                by_owner = {}
            retry: list[pb.Link] = [] if by_owner else pending
            for address, group in by_owner.items():
                if backoff.ready_in(address) > 0:
                    retry += group
                    continue
                for i in range(0, len(group), batch):
                    chunk = group[i : i + batch]
                    try:
                        resp = await self.stub(address).Discover(
                            pb.DiscoverRequest(links=chunk, worker_id=self.worker_id), timeout=30
                        )
                    except grpc.aio.AioRpcError as e:
                        reason = store_lost_reason(e)
                        if reason is not None:
                            raise NodeStoreLost(address, reason) from None
                        backoff.failed(address, "Discover", e)
                        retry += group[i:]
                        break
                    backoff.succeeded(address)
                    if on_verdicts is not None:
                        on_verdicts(chunk, resp.verdicts)
                    retry += [link for link, v in zip(chunk, resp.verdicts, strict=True) if v.verdict == pb.WRONG_OWNER]
            if not retry:
                return 0
            pending = retry
            if deadline is not None and loop.time() >= deadline:
                break
            waits = [backoff.ready_in(a) for a in by_owner] or [1.0]
            await asyncio.sleep(min(max(min(waits), 0.05), 2.0))
            try:
                await self.router.refresh()
            except Exception as e:  # the coordinator may be restarting: keep the links and try again
                backoff.failed("coordinator", "GetRing", str(e))
        log.error("%d links found no owner within %.0f s", len(pending), deadline_s or 0.0)
        return len(pending)


class CompletionBatcher:
    """Completions that finish in the same event-loop turn go to their node as one CompleteBatch call.

    Nothing waits for a batch to fill: the send is scheduled with call_soon, so a lone completion goes at once
    and a busy worker naturally sends many per call (one RPC and one commit on the node instead of many). A batch
    beyond the node's caps (hostring.limits) goes as several calls.
    """

    def __init__(
        self,
        clients: NodeClients,
        *,
        want: Callable[[str, int], int] | None = None,
        leased: Callable[[str, Sequence[pb.LeaseItem], int], None] | None = None,
        lease_wait_ms: int = 0,
        stream: bool = False,
        in_flight: int = 0,
    ) -> None:
        """`want(address, completing)`: how many new leases to ask the node for with a batch of `completing`
        completions (0: none); `leased(address, items, asked)` then takes the ones it answered (none when the call
        failed), before the completions' futures resolve (zero-wait turnaround: a released host's next URL
        travels with the completion). With `lease_wait_ms`, a batch that asks waits on the node up to that long
        for an item when none is ready (its completions' answers wait with it). With `stream`, batches go as
        messages of one CompleteStream per node instead of calls (cheaper when they come one at a time). With
        `in_flight` > 0, a node has at most that many batches in flight: completions made meanwhile wait for an
        answer and then go together (one message and one commit for them all); 0 sends every batch at once."""
        self.clients = clients
        self.want = want
        self.leased = leased
        self.lease_wait_ms = lease_wait_ms
        self.stream = stream
        self.in_flight = in_flight
        self._busy: dict[str, int] = {}  # batches in flight per node (with an `in_flight` bound)
        self._streams: dict[str, CompletionStream] = {}
        self._pending: dict[str, list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]]] = {}
        self._sends: set[asyncio.Task[None]] = set()
        self._left: dict[str, asyncio.Future[None]] = {}  # per node: resolved once its pending batch has left
        self._leaving: set[asyncio.Future[None]] = set()  # those of batches started and not written yet

    def submit(self, address: str, request: pb.CompleteRequest) -> asyncio.Future[pb.CompleteResponse]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.CompleteResponse] = loop.create_future()
        batch = self._pending.setdefault(address, [])
        batch.append((request, future))
        if len(batch) == 1 and not self._full(address):
            self._left[address] = loop.create_future()
            loop.call_soon(self._start, address)
        return future

    async def sent(self) -> None:
        """Return once every completion submitted so far has left (its batch written to the node's stream, or its
        call started, or failed) or waits for a batch in flight. A caller that waits here before its next piece of
        CPU-heavy work lets the node work on what it submitted meanwhile."""
        waiting = [f for f in (*self._left.values(), *self._leaving) if not f.done()]
        if waiting:
            await asyncio.wait(waiting)

    def _full(self, address: str) -> bool:
        """Whether a new batch for `address` must wait for an answer (as many in flight as allowed)."""
        return 0 < self.in_flight <= self._busy.get(address, 0)

    def _start(self, address: str) -> None:
        left = self._left.pop(address)
        if self.in_flight:
            self._busy[address] = self._busy.get(address, 0) + 1
        self._leaving.add(left)
        left.add_done_callback(self._leaving.discard)
        task = asyncio.ensure_future(self._send(address, left))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, address: str, left: asyncio.Future[None]) -> None:
        try:
            batch = self._pending.pop(address, [])
            parts = _within_limits(batch)
            if len(parts) > 1:  # rare: many link-heavy pages at once; each part is one call within the node's caps
                await asyncio.gather(*(self._send_part(address, part, left) for part in parts))
            elif batch:
                await self._send_part(address, batch, left)
        finally:
            if not left.done():
                left.set_result(None)
            if self.in_flight:
                self._busy[address] -= 1
            if self.in_flight and self._pending.get(address) and address not in self._left:
                # what waited for an answer goes now (else a batch is already on its way to start)
                self._left[address] = asyncio.get_running_loop().create_future()
                self._start(address)

    async def _send_part(
        self,
        address: str,
        batch: list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResponse]]],
        left: asyncio.Future[None],
    ) -> None:
        request = pb.CompleteBatchRequest(completions=[r for r, _ in batch])
        asked = 0
        if self.want is not None and self.leased is not None:
            asked = max(0, min(self.want(address, len(batch)), MAX_LEASE_ITEMS))
            if asked:
                request.worker_id, request.lease_max_items = self.clients.worker_id, asked
                request.lease_wait_ms = self.lease_wait_ms
        timeout_s = 30 + request.lease_wait_ms / 1000
        try:
            if self.stream:
                resp = await self._stream(address).ask(request, timeout_s, left)
            else:
                call = self.clients.stub(address).CompleteBatch(request, timeout=timeout_s)
                if not left.done():
                    left.set_result(None)  # the call is started
                resp = await call
        except BaseException as e:
            if asked and self.leased is not None:
                self.leased(address, (), asked)
            if not isinstance(e, grpc.aio.AioRpcError):
                raise
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        if asked and self.leased is not None:
            self.leased(address, resp.leases, asked)
        for (_, future), result in zip(batch, resp.results, strict=True):
            if not future.done():
                future.set_result(result)

    def _stream(self, address: str) -> CompletionStream:
        stream = self._streams.get(address)
        if stream is None or stream.broken is not None:
            stream = self._streams[address] = CompletionStream(self.clients.stub(address))
        return stream

    def close(self) -> None:
        """End the completion streams (a batch still waiting on one fails with CANCELLED)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()


class CompletionStream:
    """One CompleteStream call to a node: each batch written with a tag, its answer handed back by tag. The first
    error breaks it for good (every batch waiting gets that error; the batcher then opens a new stream)."""

    def __init__(self, stub: pb_grpc.FrontierStub) -> None:
        self._call = stub.CompleteStream()
        self._waiting: dict[int, asyncio.Future[pb.CompleteBatchResponse]] = {}
        self._tags = itertools.count(1)
        self._writing = asyncio.Lock()
        self.broken: grpc.aio.AioRpcError | None = None
        self._reader = asyncio.ensure_future(self._read())

    async def ask(
        self, request: pb.CompleteBatchRequest, timeout_s: float, written: asyncio.Future[None] | None = None
    ) -> pb.CompleteBatchResponse:
        """Send one batch and wait for its answer; AioRpcError when the stream breaks or `timeout_s` passes.
        `written` is resolved once the batch is written to the stream."""
        if self.broken is not None:
            raise self.broken
        tag = request.tag = next(self._tags)
        future: asyncio.Future[pb.CompleteBatchResponse] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = future
        try:
            async with self._writing:
                await self._call.write(request)
            if written is not None and not written.done():
                written.set_result(None)
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self._waiting.pop(tag, None)
            late = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in {timeout_s:.0f} s")
            raise self._break(late) from None
        except grpc.aio.AioRpcError as e:
            self._break(e)
            raise
        except Exception as e:  # a write on a call that already ended
            raise self._break(_rpc_error(grpc.StatusCode.UNAVAILABLE, f"the completion stream ended: {e!r}")) from e
        finally:
            self._waiting.pop(tag, None)
            if future.done() and not future.cancelled():
                future.exception()  # a break answered it after its write failed: the caller has the error already

    def close(self) -> None:
        self._break(_rpc_error(grpc.StatusCode.CANCELLED, "the completion stream was closed"))
        self._reader.cancel()

    async def _read(self) -> None:
        try:
            while True:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:  # type: ignore[attr-defined]
                    raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "the node ended the completion stream")
                assert isinstance(resp, pb.CompleteBatchResponse)
                future = self._waiting.get(resp.tag)
                if future is not None and not future.done():
                    future.set_result(resp)
        except grpc.aio.AioRpcError as e:
            self._break(e)
        except asyncio.CancelledError:
            self._break(_rpc_error(grpc.StatusCode.CANCELLED, "the completion stream was cancelled"))
            raise

    def _break(self, error: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """Break the stream for good (the first error stays); the error it broke with."""
        if self.broken is None:
            self.broken = error
            self._call.cancel()
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(error)
            self._waiting.clear()
        return self.broken


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, details)


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
