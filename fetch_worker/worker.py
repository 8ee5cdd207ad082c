"""The stateless fetch worker: lease from every node, fetch safely, archive, complete, and route links.

Links found on a page travel inside Complete, so the owning node admits them in the same transaction as the
completion; links another node owns are left by that node in its store's outbox for their owners (a node
without one hands them back in `forward`, and they go to their owner with Discover).

A node that does not answer is backed off (hostring.client.NodeBackoff: exponential, capped, one log line per
node per interval). A completion is re-sent to whichever node owns its domain until the lease's deadline: a
dead owner's successor adopts the leased row and settles it. A node that lost its store (NodeStoreLost) ends a
run that waits for the crawl to drain, since that crawl can no longer end; a long-running worker keeps trying.

A lease is renewed while its fetch runs; once the domain's owner says it is gone, the request is cut off at once
(one request per host, cluster-wide) and nothing of it is archived or reported.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from fetch_worker.fetch import Fetcher, FetchResult
from fetch_worker.links import extract_links
from fetch_worker.metrics import WorkerMetrics
from fetch_worker.warc import WarcWriter, payload_digest, warc_date
from hostring.client import (
    CompletionBatcher,
    NodeClients,
    NodeStoreLost,
    Router,
    renew_at,
    store_lost_reason,
    successor,
)
from hostring.fingerprint import SIMHASH_TEXT_CHARS, body_digest, simhash64
from hostring.html import media_type
from hostring.limits import MAX_ROBOTS_BODY_BYTES
from hostring.urls import reference_key, reference_keys
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.worker")

COMPLETE_LINKS = 10_000
"""Links sent inside one Complete (well under the message limit); a page's further links are routed with Discover
once the node said they are to be followed."""
ROUTE_BATCH = 2048
_SENT_LIMIT = 1 << 17
_NEVER_SENT = 1 << 62  # the depth of a link this worker has not sent
_IDLE_S = 0.05  # a node that answered empty without waiting (or drained) is asked again after this
_ARCHIVE_ON_LOOP_BYTES = 256 * 1024
"""A body up to this size is archived on the event loop (compressing it takes well under a millisecond, less than
handing it to a thread costs); a bigger one on a thread, so fetches in flight are not held."""
_START_MARGIN_S = 1.0
"""A lease that ends sooner than this (or than a quarter of what was left of it when it arrived) by the time its
fetch would start is handed back unfetched: once it expires the node may hand its host to another worker, and a
fetch started this late could land beside that one."""
_BATCHES_IN_FLIGHT = 2
"""Completion batches a worker has in flight per node; completions made while that many are wait and go together.
With one, a completion made while a batch was on the node waited for its answer first (a round trip of ~3-4 ms
behind the worker's own busy loop), and hosts waited ~21 ms between fetches on the issue-10 web; two let the next
completion leave at once: makespan/bound ~2.05 -> ~1.8 over interleaved runs. The price is more, smaller batches
(the node's thread wake-ups per batch) and, on a VM whose two CPUs share one core, the worker and node slowing
each other while they overlap: CPU per page measured 5.2-5.8 -> 6.4-7.7 ms there, most of it that slowdown."""


@dataclass
class WorkerStats:
    """What this worker did, for progress displays and metrics."""

    fetched: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes: int = 0
    in_flight: int = 0
    links_sent: int = 0
    stale: int = 0
    late_starts: int = 0
    leases_lost: int = 0
    """Fetches cut off because a renewal said the lease was gone (nothing archived or reported for them)."""


class Worker:
    """Leases items, fetches them with `Fetcher`, writes WARC records and reports outcomes."""

    def __init__(
        self,
        router: Router,
        fetcher: Fetcher,
        *,
        warc: WarcWriter | None = None,
        worker_id: str = "",
        max_in_flight: int = 64,
        lease_batch: int = 32,
        product_token: str = "hostring",
        metrics: WorkerMetrics | None = None,
        channel_options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self.router = router
        self.fetcher = fetcher
        self.warc = warc
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        self.max_in_flight = max_in_flight
        self.lease_batch = lease_batch
        self.product_token = product_token
        self.stats = WorkerStats()
        self.metrics = metrics
        self.clients = NodeClients(router, worker_id=self.worker_id, channel_options=channel_options)
        self._batcher = CompletionBatcher(
            self.clients, want=self._want, leased=self._take_leased, stream=True, in_flight=_BATCHES_IN_FLIGHT
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._processing = asyncio.Lock()
        """A page's turn to be processed (parse, hash, archive) and its completion sent: one page at a time, its
        completion on its way before the next page is processed, so the node works on it meanwhile and a host's
        next URL is not held back behind the pages of other hosts that came in at the same moment."""
        self._asked = 0  # leases asked for (parked Leases, completions) and not answered yet
        self._ended = 0  # fetches ended (a node's drained answer holds only if none ended since it was asked)
        self._open = False  # run() takes new items (completions ask for leases only then)
        self._stop = asyncio.Event()
        self._handback: set[asyncio.Future[None]] = set()
        self._sent: dict[object, int] = {}  # reference key -> the least depth a node has taken it at
        self._written: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self.drained_nodes: set[str] = set()
        self.fatal: NodeStoreLost | None = None
        """Why a run that waits for the crawl to drain ended early (a node lost its store)."""
        self._until_drained = False

    def stub(self, address: str) -> pb_grpc.FrontierStub:
        return self.clients.stub(address)

    async def close(self) -> None:
        self._batcher.close()
        await self.clients.close()
        await self.fetcher.aclose()
        if self.warc is not None:
            self.warc.close()

    # ------------------------------------------------------------------ the loop

    async def run(
        self,
        stop: asyncio.Event,
        *,
        until_drained: bool = False,
        grace_s: float = 10.0,
        force: asyncio.Event | None = None,
    ) -> None:
        """Lease and fetch until `stop` is set (or, with until_drained, until every node says it is drained).

        Fetches in flight then have `grace_s` to finish; those still running (or all, once `force` is set) are
        cancelled and handed back to their node at once (a worker_shutdown outcome). With until_drained, a node
        that lost its store ends the run: NodeStoreLost is raised after the in-flight fetches settled (the crawl
        can no longer drain).
        """
        tasks = self._tasks
        self._until_drained = until_drained
        self._stop, self._open = stop, True
        backoff = self.clients.backoff
        loop = asyncio.get_running_loop()
        pumps: dict[str, asyncio.Task[int]] = {}  # the Lease waiting on each node
        quiet: dict[str, float] = {}  # a drained node is asked again after this (loop time), or once a fetch ended
        rest: dict[str, float] = {}  # a node that answered empty without waiting is asked again after this
        drained_at: dict[str, int] = {}  # fetches ended when the node's Lease that found it drained was sent
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set() and self.fatal is None:
                nodes = list(self.router.nodes())
                now = loop.time()
                for address in nodes:
                    if address in pumps or backoff.ready_in(address) > 0 or rest.get(address, 0.0) > now:
                        continue
                    if quiet.get(address, 0.0) > now and drained_at.get(address) == self._ended:
                        continue
                    free = self.max_in_flight - len(tasks) - self._asked
                    if free <= 0 or self.fatal is not None:
                        break
                    drained_at.pop(address, None)
                    pumps[address] = asyncio.create_task(self._pump(address, min(free, self.lease_batch), drained_at))
                if (
                    until_drained
                    and not tasks
                    and not pumps
                    and nodes
                    and all(drained_at.get(a) == self._ended for a in nodes)
                ):
                    return
                timeout = 0.5
                for a in nodes:
                    if a not in pumps:
                        due = max(backoff.ready_in(a), quiet.get(a, 0.0) - now, rest.get(a, 0.0) - now)
                        timeout = min(timeout, max(0.01, due))
                await asyncio.wait(
                    {stopped, *pumps.values(), *tasks}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for address, pump in list(pumps.items()):
                    if pump.done():
                        del pumps[address]
                        if address in drained_at:
                            quiet[address] = loop.time() + _IDLE_S
                        elif not pump.cancelled() and pump.exception() is None and pump.result() < 0:
                            rest[address] = loop.time() + _IDLE_S
        finally:
            self._open = False
            stopped.cancel()
            if pumps:
                await asyncio.wait(pumps.values(), timeout=1.0)
                for pump in pumps.values():
                    pump.cancel()
            await self._settle(tasks, grace_s, force)
        if self.fatal is not None:
            raise self.fatal

    async def _pump(self, address: str, n: int, drained_at: dict[str, int]) -> int:
        """One long-poll Lease on `address` for up to `n` items (parked on the node until one is ready, so a host's
        next URL arrives the moment its politeness allows); fetches what it gets. `drained_at[address]` is set when
        the node answered drained. How many items came, or -1 for an empty answer that did not wait."""
        ended, t0 = self._ended, time.monotonic()
        self._asked += n
        try:
            items = await self._lease(address, n)
        finally:
            self._asked -= n
        self._spawn(address, items)
        if not items and address in self.drained_nodes:
            drained_at[address] = ended
        if not items and time.monotonic() - t0 < _IDLE_S:
            return -1  # answered empty without waiting (a node that stops, or has too many waiting): rest a little
        return len(items)

    def _spawn(self, address: str, items: Sequence[pb.LeaseItem]) -> None:
        tasks = self._tasks
        for item in items:
            task = asyncio.create_task(self._process(address, item, time.time()))
            tasks.add(task)
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._ended += 1

    def _want(self, address: str, completing: int) -> int:
        """Leases to ask for with a batch of `completing` completions: the slots they free and the free ones, up
        to a lease batch (none once the run stops taking items)."""
        if not self._open or self._stop.is_set() or self.fatal is not None:
            return 0
        busy = len(self._tasks) - completing + self._asked
        n = max(0, min(self.max_in_flight - busy, self.lease_batch))
        self._asked += n
        return n

    def _take_leased(self, address: str, items: Sequence[pb.LeaseItem], asked: int) -> None:
        """Items a node leased along with a completion batch: fetched like leased ones; handed back at once when
        the run no longer takes items."""
        self._asked -= asked
        if not items:
            return
        self.clients.backoff.succeeded(address)
        if self._open:
            self._spawn(address, items)
            return
        back = pb.Outcome(error_class="worker_shutdown", retry_after_s=-1)
        for item in items:
            task = asyncio.ensure_future(self._complete(address, item, back, [], item.deadline_ms / 1000.0))
            self._handback.add(task)
            task.add_done_callback(self._handback.discard)

    async def _settle(self, tasks: set[asyncio.Task[None]], grace_s: float, force: asyncio.Event | None) -> None:
        """On shutdown: let in-flight fetches finish within the grace period (or until `force`); hand the rest back."""
        if not tasks:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        forced = asyncio.ensure_future(force.wait() if force is not None else asyncio.Event().wait())
        try:
            while not forced.done():
                left = [t for t in tasks if not t.done()]
                if not left or loop.time() >= deadline:
                    break
                await asyncio.wait({*left, forced}, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*pending, return_exceptions=True)

    def _store_lost(self, error: NodeStoreLost) -> None:
        """A node lost its store: fatal for a run until drained (the first one is kept); logged either way."""
        if self._until_drained:
            if self.fatal is None:
                log.error("%s", error)
                self.fatal = error
        else:
            self.clients.backoff.failed(error.address, "a call", f"store_lost: {error.reason}")

    async def _lease(self, address: str, n: int) -> list[pb.LeaseItem]:
        try:
            resp = await self.stub(address).Lease(
                pb.LeaseRequest(worker_id=self.worker_id, max_items=n, wait_ms=500), timeout=10
            )
        except grpc.aio.AioRpcError as e:
            reason = store_lost_reason(e)
            if reason is not None:
                self._store_lost(NodeStoreLost(address, reason))
            else:
                self.clients.backoff.failed(address, "Lease", e)
            return []
        self.clients.backoff.succeeded(address)
        if resp.drained:
            self.drained_nodes.add(address)
        else:
            self.drained_nodes.discard(address)
        return list(resp.items)

    # ------------------------------------------------------------------ one item

    async def _process(self, address: str, item: pb.LeaseItem, received: float) -> None:
        ends = item.deadline_ms / 1000.0
        if time.time() > ends - min(_START_MARGIN_S, (ends - received) / 4):
            # Started too late (a loop too busy to start it): hand it back rather than fetch on borrowed time.
            self.stats.late_starts += 1
            back = pb.Outcome(error_class="worker_shutdown", error_detail="lease ending before the fetch could start")
            await self._complete(address, item, back, [], item.deadline_ms / 1000.0)
            return
        self.stats.in_flight += 1
        if self.metrics is not None:
            self.metrics.in_flight.inc()
        deadline = [item.deadline_ms / 1000.0]
        cut = asyncio.timeout(None)
        renewer = asyncio.create_task(self._keep_renewed(address, item, deadline, cut))
        outcome = pb.Outcome(retry_after_s=-1)
        links: list[pb.Link] = []
        turn: asyncio.Lock | None = None  # the processing turn, once this page has it
        try:
            try:
                async with cut:
                    if item.kind == pb.ROBOTS:
                        result = await self.fetcher.fetch_robots(item.url, follow=False)
                    else:
                        result = await self.fetcher.fetch(item.url, etag=item.etag, last_modified=item.last_modified)
            except TimeoutError:
                if not cut.expired():
                    raise
                self._lease_lost(item, renewer.result())  # the renewer cut the fetch, and ended with why
                return
            await self._processing.acquire()
            turn = self._processing
            outcome = self._outcome(result)
            if item.kind == pb.ROBOTS:
                outcome.robots_body = result.body[:MAX_ROBOTS_BODY_BYTES]
            else:
                links = self._links(item, result, outcome)
            if self.warc is not None and result.status:
                if len(result.body) <= _ARCHIVE_ON_LOOP_BYTES:
                    outcome.evidence = self._archive(result, item)
                else:
                    outcome.evidence = await asyncio.to_thread(self._archive, result, item)
            self.stats.bytes += result.decoded_bytes
            if self.metrics is not None:
                self.metrics.observe(result)
            if result.error_class:
                self.stats.errors[result.error_class] += 1
            else:
                self.stats.fetched += 1
        except BaseException as e:
            if turn is not None:
                turn.release()
            if not isinstance(e, asyncio.CancelledError):
                raise
            outcome = pb.Outcome(error_class="worker_shutdown", retry_after_s=-1)
            renewer.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                await asyncio.shield(self._complete(address, item, outcome, [], deadline[0]))
            raise
        finally:
            renewer.cancel()
            self.stats.in_flight -= 1
            if self.metrics is not None:
                self.metrics.in_flight.dec()
        await self._complete(address, item, outcome, links, deadline[0], turn)

    def _outcome(self, r: FetchResult) -> pb.Outcome:
        return pb.Outcome(
            status=r.status,
            error_class=r.error_class,
            error_detail=r.error_detail[:500],
            retry_after_s=r.retry_after_s,
            location=r.location,
            content_type=r.content_type,
            bytes=r.decoded_bytes,
            response_s=r.total_s,
            remote_ip=r.remote_ip,
            etag=r.etag,
            last_modified=r.last_modified,
        )

    def _links(self, item: pb.LeaseItem, r: FetchResult, outcome: pb.Outcome) -> list[pb.Link]:
        """Digest and simhash the body, and turn its links (or a redirect's Location) into Link messages."""
        if 300 <= r.status < 400 and r.location:
            return [
                pb.Link(
                    observed=r.location,
                    base_url=item.url,
                    source_key=item.fetch_key,
                    depth=item.depth,
                    redirect_hops=item.redirect_hops + 1,
                )
            ]
        if not r.body or r.error_class:
            return []
        outcome.body_digest = body_digest(r.body)
        if r.status >= 300 or media_type(r.content_type) not in self.fetcher.limits.parse_types:
            outcome.simhash = simhash64(r.body[:SIMHASH_TEXT_CHARS].decode("utf-8", "replace"))
            return []
        extracted = extract_links(
            r.body,
            item.url,
            x_robots_tag=r.header_values("x-robots-tag"),
            product_token=self.product_token,
            content_type=r.header("content-type"),  # with its charset: r.content_type is the bare media type
        )
        # The visible text, not the markup: a site's pages share their templates (hostring/html.py).
        outcome.simhash = simhash64(extracted.text[:SIMHASH_TEXT_CHARS])
        outcome.nofollow, outcome.noindex = extracted.nofollow, extracted.noindex
        depth, base, sent, source = item.depth + 1, extracted.base_url, self._sent, item.fetch_key
        hrefs = extracted.links
        return [
            pb.Link(observed=href, base_url=base, source_key=source, depth=depth)
            for href, key in zip(hrefs, reference_keys(hrefs, base), strict=True)
            if sent.get(key, _NEVER_SENT) > depth  # a link taken deeper may be admitted at this depth
        ]

    def _remember(self, links: list[pb.Link]) -> None:
        """Links a node has taken (admitted, deduplicated, rejected or handed back for routing) need not be sent
        again by this worker at the same depth or deeper: navigation repeated on every page then costs neither
        messages nor node time, and a link refused for its depth is sent again when found shallower."""
        sent = self._sent
        if len(sent) > _SENT_LIMIT:
            sent.clear()
        for link in links:
            if not link.redirect_hops:
                key = reference_key(link.observed, link.base_url)
                if link.depth < sent.get(key, _NEVER_SENT):
                    sent[key] = link.depth

    def _archive(self, r: FetchResult, item: pb.LeaseItem | None = None) -> str:
        """Write the fetch to WARC: a revisit record for a 304 to a revisit, for a revisit whose body is the one
        stored, and when this worker already stored the same payload; a response record otherwise."""
        assert self.warc is not None
        if item is not None and item.revisit:
            stored = warc_date(item.stored_at_ms / 1000.0) if item.stored_at_ms > 0 else ""
            if r.status == 304:
                return self.warc.write_not_modified(r, item.refers_to, item.url, stored)
            if item.refers_to and item.stored_digest and r.body and body_digest(r.body) == item.stored_digest:
                return self.warc.write_revisit(
                    r, refers_to=item.refers_to, refers_to_uri=item.url, digest=payload_digest(r.body),
                    refers_to_date=stored,
                )  # fmt: skip
        digest = payload_digest(r.body) if r.body else ""
        earlier = self._written.get(digest) if digest else None
        if earlier is not None:
            return self.warc.write_revisit(r, refers_to=earlier[0], refers_to_uri=earlier[1], digest=digest)
        record_id = self.warc.write_fetch(r, digest)
        if digest:
            self._written[digest] = (record_id, r.url)
            if len(self._written) > 100_000:
                self._written.popitem(last=False)
        return record_id

    async def _complete(
        self,
        address: str,
        item: pb.LeaseItem,
        outcome: pb.Outcome,
        links: list[pb.Link],
        deadline: float,
        turn: asyncio.Lock | None = None,
    ) -> None:
        """Settle the lease on the owner of its domain, trying until the lease's deadline (wall clock).

        A wrong-owner answer or a node that does not answer sends it to the domain's owner at the newest ring
        (the lease lives on in the shared store: the new owner adopted the leased row and settles it), the moment
        the ring names another owner: a dead node's address stays backed off, and waiting that out could take the
        completion past the deadline, and the page to a second fetch. After the
        deadline the lease has expired and the item will be handed out again, so there is nothing left to settle.
        `turn`, the processing turn the caller holds, is released once the first attempt has left.
        """
        try:
            links, more = links[:COMPLETE_LINKS], links[COMPLETE_LINKS:]
            request = pb.CompleteRequest(
                lease_id=item.lease_id, generation=item.generation, outcome=outcome, worker_id=self.worker_id,
                links=links,
            )  # fmt: skip
            backoff = self.clients.backoff
            while True:
                wait = backoff.ready_in(address)
                if wait <= 0:
                    answer = self._batcher.submit(address, request)
                    if turn is not None:
                        held = turn
                        turn = None
                        try:
                            await self._batcher.sent()
                        finally:
                            held.release()
                    try:
                        resp = await answer
                    except grpc.aio.AioRpcError as e:
                        reason = store_lost_reason(e)
                        if reason is not None:
                            self._store_lost(NodeStoreLost(address, reason))
                            if self._until_drained:
                                return
                        else:
                            backoff.failed(address, "Complete", e)
                    else:
                        if not resp.wrong_owner:
                            backoff.succeeded(address)
                            break
                        wait = 0.2
                    wait = max(wait, backoff.ready_in(address))
                if turn is not None:  # not sent at once (a node backed off): the next page need not wait for it
                    turn.release()
                    turn = None
                if time.time() + min(wait, 0.05) >= deadline:
                    log.error(
                        "could not complete %s before its lease's deadline; it will be handed out again", item.url
                    )
                    return
                pause = max(0.05, min(wait, deadline - time.time()))
                address = await successor(self.router, item.domain, address, pause)
        finally:
            if turn is not None:
                turn.release()
        if not resp.accepted:
            self.stats.stale += 1
        elif resp.follow_links:
            self._remember(links)
            if more:
                await self.route(more)
        self.stats.links_sent += len(links) + (len(more) if resp.accepted and resp.follow_links else 0)
        if resp.forward:
            await self.route(resp.forward)

    async def route(self, links: Sequence[pb.Link]) -> None:
        """Send links to the nodes that own their domains, waiting as long as it takes (see NodeClients.route)."""
        try:
            await self.clients.route(links, deadline_s=None, batch=ROUTE_BATCH)
        except NodeStoreLost as e:
            self._store_lost(e)

    async def _keep_renewed(self, address: str, item: pb.LeaseItem, deadline: list[float], cut: asyncio.Timeout) -> str:
        """Renew the lease at half its remaining time, for as long again as first granted, while the fetch goes on;
        `deadline[0]` follows the deadline the node granted.

        When the domain's owner answers that the lease is gone (expired, released, or leased again under a newer
        generation), the fetch is cut (`cut` expires at once: the node may have given the host to another fetch)
        and the reason returned. A node that no longer owns the domain is not the last word: the next renewal goes
        to the new owner, which adopts the leased row with its deadline as it takes the domain over. A node that
        does not answer (killed) is asked again until the ring names its successor, and that one at once.
        """
        span_ms = int(max(1.0, deadline[0] - time.time()) * 1000)
        request = pb.RenewRequest(
            lease_id=item.lease_id, generation=item.generation, extend_ms=span_ms, worker_id=self.worker_id
        )
        unanswered = False
        while True:
            pause = max(0.5, (deadline[0] - time.time()) / 2)
            if unanswered and item.domain:  # the node is down: ask its successor as soon as the ring names one
                address = await self.router.moved(item.domain, address, pause)
            else:
                await asyncio.sleep(pause)
            try:
                resp = await self.stub(address).Renew(request, timeout=10)
            except grpc.aio.AioRpcError:
                unanswered = True
                continue
            unanswered = False
            if resp.ok:
                deadline[0] = resp.deadline_ms / 1000.0
                continue
            again = await renew_at(self.router, item.domain, address, resp.reason)
            if again is not None:
                address = again  # a ring change: asked again there (it may still be adopting the domain)
                continue
            with contextlib.suppress(RuntimeError):  # the fetch already ended: nothing left to cut
                cut.reschedule(-1.0)
            return resp.reason or "lease_gone"

    def _lease_lost(self, item: pb.LeaseItem, reason: str) -> None:
        """Count and log a fetch cut off because its lease is gone: nothing of it is archived or reported (the
        node would keep a Complete as late evidence only)."""
        self.stats.leases_lost += 1
        if self.metrics is not None:
            self.metrics.lease_lost()
        log.warning("lease of %s is gone (%s): fetch cut off, nothing archived or reported", item.url, reason)
