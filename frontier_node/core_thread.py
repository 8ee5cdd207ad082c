"""The one thread that runs the core: batches of operations, one commit per batch, waiting Leases, the timer.

The core (`Frontier`) is a plain single-threaded object. RPC coroutines on the event loop never touch it: they
`submit` an operation (frontier_node/ops.py) and await its future. This thread takes everything queued, applies
it under the service lock (so a handoff in frontier_node/cluster.py never runs at the same time), hands ready
items to waiting Leases, expires leases and releases retries (`tick`), commits the store ONCE for the whole batch
(group commit), and only then resolves each call's future on its loop: an item is reported admitted, leased or
completed only after its journal line is committed.

A batch's commit, all in `_batch`: `_apply` runs the ops (their writes are buffered in the store), `_start` begins
the batch's flush (frontier_node/commit.py), `_land` waits for it and then answers the batch's calls. A store that
pipelines (Redis) sends the flush and returns; while flushes are in flight and more calls are queued, the thread does
not wait: it applies the next batch, lands the flushes already answered, and sends the next flush behind the others,
up to FLIGHTS out at once (beyond, the oldest lands first). So Redis applies batches N and N+1 while the core runs
N+2; flushes go out and batches are answered in batch order, and every store call that reads or writes (a backlog
page, a row, a synchronous flush) lands the flushes out first, so it sees their writes
(frontier_node/store/redis/flight.py). Other stores flush inside `_start`: nothing overlaps.
A wake-up that runs nothing (a tick, the wake-up of a flush that already landed) leaves the flushes in flight and
sleeps again until an answer or the next call: landing them there made a call that came meanwhile wait for them.
A flush partly refused by a newer owner's fence is handled for the ops of its own batch (`on_fenced`, `refused`);
when that needs another flush, that one also carries the later batches' writes, so its refusals are told to their
ops too; a later batch's own flush meets the same fence and is handled when it lands. A failed flush answers its
batch's calls with the error, and so are those of the flushes behind it (none sent): their writes go back in front
of the next batch's (sent again, in order). The leases those calls made reach no worker: they are taken back at
once (`Frontier.take_back`: scheduled again, not a try), so a store's blip does not hold their hosts until the
leases expire.
Completions parked on the cluster's body index (Step.PARK: their bodies registered off this thread) run once it
answers, first in the next batch. An op with slices left runs its next slice only once its batch landed. Between
batches the lock is let go with flushes in flight: a handoff or the mail poller then lands them through the store
like any other call.

Long-poll Leases hold no thread: they wait here as operations, served in arrival order after every batch, so a
completion that frees a host wakes a waiting Lease in the same commit. The leases a completion batch asks for in
its reply are leased after the batch's ops, before the waiting Leases unless a worker with fewer leases waits
(`_lease`). On a store that pipelines, when no Lease waits, they are leased by the next batch (`_defer`): the
completions' flush goes to Redis first and the core picks the leases while Redis applies it (about 6% more URLs a
second in bench.cluster's lease-in-reply phase on one node); the reply is answered once both flushes landed.
A completion batch that parks on the cluster's body index leases its reply ahead, in the batch where it parks, from
the hosts ready then (`_lease_ahead`, unless a Lease waits): those leases go to Redis with that batch's flush while
Redis answers the claims, and the reply is topped up with the hosts its completions freed when it has room left.
When the leases ahead fill it, the completions' flush is the reply's last: one round trip fewer on its way (about
10% more URLs a second in bench.cluster's lease-in-reply phase on one node).
The thread sleeps until the next call, the next event of the core while Leases wait (`next_event_in`), the first
Lease deadline, or TICK_S.

A store that lost data (`StoreLost`) is fatal: one ERROR line, `fault` set, every data-plane call answered
UNAVAILABLE from then on, and nothing more written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from mypy_extensions import mypyc_attr

from frontier_node.commit import Batch, begin_flush, pipelines
from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Fenced, Outbox, StoreLost
from frontier_node.core.views import FrontierStats
from frontier_node.ops import Call, Complete, Lease, Op, Step
from hostring.thread_names import name_os_thread

log = logging.getLogger("hostring.node")

T = TypeVar("T")

FLIGHTS = 2
"""Batches whose flushes may be out at once on a store that pipelines (Redis): the core runs the next batch and
sends its flush while Redis applies the ones before; with that many out, the oldest lands before the next is sent.
Two let Redis and the core work at once when several calls are queued (`bench.cluster --streams 4`, one node:
1.37 CPUs busy on average in Lease+Complete against 1.11 with one flush out); three did no better."""
TICK_S = 0.2
"""Longest sleep with no call and no waiting Lease: leases expire and retries come due within this."""
MAX_WAITING = 10_000
"""Leases that may wait at once; beyond it a Lease answers at once with what is ready (empty: the client polls)."""
_IDLE_FLOOR_S = 0.005
_SNAPSHOT_MAX_AGE_S = 1.0


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of a builtin exception
class NodeUnavailable(RuntimeError):
    """The node cannot take data-plane calls: its store lost data, or it is stopping. `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The core's counters at the end of one batch, for Stats and /metrics (never the live core)."""

    stats: FrontierStats
    version: int  # batches with calls committed before it was taken
    taken: float  # time.monotonic()
    fault: str


class CoreThread:
    """Applies operations to one Frontier on a thread of its own; see the module docstring."""

    def __init__(
        self,
        frontier: Frontier,
        lock: threading.Condition,
        *,
        outbox: Outbox | None = None,
        on_fenced: Callable[[set[str]], None] = lambda domains: None,
        on_fault: Callable[[str], None] = lambda reason: None,
        store_timer: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.frontier = frontier
        self.lock = lock
        self.outbox = outbox
        self.on_fenced = on_fenced
        self.on_fault = on_fault
        self.store_timer = store_timer
        self.fault = ""
        self.version = 0
        self._queue: collections.deque[Op[Any]] = collections.deque()
        self._more: list[Op[Any]] = []  # ops with slices left, run again next batch
        self._parked: list[Op[Any]] = []  # ops that run again once what they parked on is done (Step.PARK)
        self._replies_next: list[Complete] = []  # settled completion batches whose reply leases the next batch picks
        self._inflight: collections.deque[Batch] = collections.deque()  # batches whose flushes are out, in order
        self._waiters: collections.deque[Lease] = collections.deque()
        self._earliest = math.inf  # the first deadline among the waiting Leases
        self._wake = threading.Event()
        self._timeout = 0.0
        self._stopping = False
        self._draining = False
        self._runner: threading.Thread | None = None  # not `_thread`: compiled, its C name meets C's __thread
        self._snapshot_cost = 0.0
        self.snapshot = self._take_snapshot()

    # ------------------------------------------------------------------ the loop's side

    def submit(self, op: Op[T]) -> asyncio.Future[T]:
        """Queue `op` (called on an event loop); its future resolves on that loop after the op's commit."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._stopping:
            future.set_exception(NodeUnavailable("node stopping"))
            return future
        if op.data_plane and self.fault:
            future.set_exception(NodeUnavailable(self.fault))
            return future
        op.future, op.loop = future, loop
        self._queue.append(op)
        self._wake.set()
        return future

    def fresh(self) -> bool:
        """Whether the published snapshot still shows the core as it is (no call committed since, and recent)."""
        snap = self.snapshot
        return snap.version == self.version and time.monotonic() - snap.taken < _SNAPSHOT_MAX_AGE_S

    def snapshot_op(self) -> Call[Snapshot]:
        """An op that answers a snapshot taken at its batch (at most one per batch, and at most ~10% of core time)."""
        return Call(lambda core: self._publish())

    # ------------------------------------------------------------------ life

    def start(self) -> CoreThread:
        """Start the thread (again, after a stop: a shell may pause its core)."""
        if self.running:
            return self
        self._stopping = self._draining = False
        self._runner = threading.Thread(target=self._run, name="core", daemon=True)
        self._runner.start()
        return self

    def release_waiters(self) -> None:
        """Answer every waiting Lease now (with whatever is ready), and let no Lease wait from now on (stopping)."""
        self._draining = True
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new calls, finish what is queued, answer waiting Leases, commit, and end the thread."""
        self._draining = self._stopping = True
        self._wake.set()
        if self._runner is not None:
            self._runner.join(timeout)

    @property
    def running(self) -> bool:
        return self._runner is not None and self._runner.is_alive()

    def _run(self) -> None:
        name_os_thread()
        while True:
            self._wake.wait(self._timeout)
            self._wake.clear()
            with self.lock:
                try:
                    self._batch()
                except Exception:  # a bug must not end the thread that every call waits on
                    log.exception("core batch failed")
                    self._timeout = TICK_S
            if self._stopping and not (
                self._queue or self._more or self._waiters or self._inflight or self._parked or self._replies_next
            ):
                return

    # ------------------------------------------------------------------ one batch (the lock is held)

    def _batch(self) -> None:
        """Run the queued ops; land the batches whose flushes are answered (and the oldest, when FLIGHTS are out);
        start this batch's flush, and land it now unless it is in flight: then the thread sleeps until an answer or
        the next call, whichever comes first (see the module docstring). Batches are answered in order."""
        batch = self._apply()
        inflight = self._inflight
        if inflight and batch.idle and not inflight[0].pending.ready:
            # Woken with nothing to do (the wake-up of a flush that already landed, say): wait for the oldest flush
            # or the next call rather than for the flush alone, or a call that comes meanwhile waits for all of it.
            self._timeout = self._next_timeout()
            return
        while inflight and (inflight[0].pending.ready or sum(not b.pending.done for b in inflight) >= FLIGHTS):
            self._land_oldest(batch)
        self._start(batch)
        if batch.pending.done and (batch.idle or not inflight):
            self._land(batch, [])
        else:
            inflight.append(batch)  # answered after the batches before it, even when its flush is done already
            if not batch.pending.done:
                batch.pending.when_ready(self._wake.set)
        while inflight and inflight[0].pending.done:  # landed by a store call meanwhile, or done at its start
            self._land_oldest(None)
        self._timeout = self._next_timeout()

    def _land_oldest(self, batch: Batch | None) -> None:
        """Land the oldest batch in flight; the ops of the batches after it (and of `batch`, run meanwhile) follow
        it: their writes were buffered after its own."""
        oldest = self._inflight.popleft()
        following = [op for later in self._inflight for op in later.wrote]
        self._land(oldest, [*following, *batch.wrote] if batch is not None else following)

    def _apply(self) -> Batch:
        """Run every queued op (those with slices left first) on the core, then serve the waiting Leases."""
        ops, self._more = self._more, []
        if self._parked:
            parked, self._parked = self._parked, []
            for op in parked:  # one look per op: a registration may end between two
                (ops if _unparked(op) else self._parked).append(op)
        while self._queue:
            ops.append(self._queue.popleft())
        batch = Batch(ops)
        core = self.frontier
        try:
            if not self.fault:
                core.tick()
            for op in ops:
                if op.abandoned():
                    continue
                if op.data_plane and (self.fault or (self._stopping and not op.started)):
                    batch.failed.append((op, NodeUnavailable(self.fault or "node stopping")))
                    continue
                try:
                    step = op.run(core)
                except StoreLost:
                    raise
                except Fenced as e:  # a store read that flushed first met a newer owner's fence
                    self.on_fenced({e.domain, *(o.domain for o in e.others)})
                    batch.failed.append((op, e))
                    continue
                except Exception as e:
                    batch.failed.append((op, e))
                    continue
                if step is Step.PARK:
                    self._park(op)
                    self._lease_ahead(op, batch)
                    continue
                if step is Step.WAIT:
                    assert isinstance(op, Lease)
                    if len(self._waiters) >= MAX_WAITING:
                        self._drop_cancelled()
                    if len(self._waiters) < MAX_WAITING:
                        self._waiters.append(op)  # it joins the queue of waiting Leases, served below
                        self._earliest = min(self._earliest, op.deadline)
                        batch.parked.append(op)
                        continue
                    op.waits = False  # the waiting set is full: answer now with what is ready
                    step = op.take(core)
                batch.ran.append(op)
                (batch.finished if step is Step.DONE else batch.more).append(op)
            if not self.fault:
                self._lease(batch)
        except Exception as e:
            batch.error = e
        return batch

    def _park(self, op: Op[Any]) -> None:
        """Keep `op` aside until what it parked on is done; then the thread wakes and runs it first."""
        self._parked.append(op)
        if op.parked_on is not None:
            op.parked_on.add_done_callback(lambda _: self._wake.set())

    def _lease_ahead(self, op: Op[Any], batch: Batch) -> None:
        """A completion batch that parked on its bodies' registration leases its reply now, from the hosts ready
        (none of its own: they are still leased), unless a Lease waits: those leases go to Redis with this batch's
        flush while Redis answers the claims, not in a flush of their own once the completions ran. The op joins
        the batch's `ahead`: told which domains its flush refused (only its leases: none of its completions ran
        yet), and answered by its own batch later, not by this one (a failure here puts the leases back in front of
        the next flush, which its answer waits for)."""
        if not isinstance(op, Complete) or op.leased_ahead or self._waiters or op.lease_for is None:
            return
        self._lease_reply(op, ahead=True)
        if op.leased:
            batch.ahead.append(op)

    def _lease(self, batch: Batch) -> None:
        """Serve the waiting Leases, and the leases the batch's finished completions asked for in reply.

        A worker's reply is leased before the waiting Leases unless another worker waits holding fewer leases: then
        the waiting Leases go first. A worker that waits has room for work, so when several workers share few hosts
        a host a completion freed goes to the one with fewer, until they hold alike; else the first worker to lease
        would keep every host and the others idle (`hostring crawl --workers N` on a small web).

        On a store that pipelines, with no Lease waiting, the replies are leased by the next batch instead (`_defer`):
        the completions' flush goes out first, and the core picks their leases while Redis applies it.
        """
        core = self.frontier
        replies = self._defer(batch)
        waiting = {w.worker_id: core.leases_held(w.worker_id) for w in self._waiters} if replies else {}
        later: list[Complete] = []
        for op in replies:
            worker = op.lease_for or ""
            held = core.leases_held(worker)
            if any(n < held for w, n in waiting.items() if w != worker):
                later.append(op)
            else:
                self._lease_reply(op)
        batch.ran += self._serve_waiters(batch.finished)
        for op in later:
            self._lease_reply(op)

    def _defer(self, batch: Batch) -> list[Complete]:
        """The completion batches whose reply leases this batch picks: those the batch before deferred, then, unless
        they are deferred in turn, those that finished here.

        A reply deferred leaves `finished` (it is answered with the batch that leases for it, once that batch's
        flush landed too) and stays in `ran` (told which domains this flush refused). Deferring keeps the order in
        which replies are leased and leaves waiting Leases as they were: it happens only when none waits, so the
        replies are still leased before any Lease that comes meanwhile (unless a worker with fewer leases waits).
        On a store that flushes inside the batch it would only add a commit: the replies are leased at once.
        A reply whose completions' flush failed is answered with the error and not leased for (`_land`), unless the
        next batch ran before that flush landed: its leases then expire unanswered, as those of a failed reply do.
        """
        carried, self._replies_next = self._replies_next, []
        fresh = [op for op in batch.finished if isinstance(op, Complete) and op.lease_for is not None]
        if fresh and not self._waiters and pipelines(self.frontier.store):
            deferred = {id(op) for op in fresh}
            batch.finished = [op for op in batch.finished if id(op) not in deferred]
            self._replies_next, fresh = fresh, []
        batch.ran += carried
        batch.finished += carried
        return carried + fresh

    def _lease_reply(self, op: Complete, *, ahead: bool = False) -> None:
        """The leases of a completion batch's reply (`ahead`: those picked while it parks). The completions are
        settled whatever happens here: a lease that fails (a newer owner's fence met by a backlog read, say) leaves
        the reply without those leases."""
        try:
            if ahead:
                op.lease_ahead(self.frontier)
            else:
                op.lease_reply(self.frontier)
        except StoreLost:
            raise
        except Fenced as e:
            self.on_fenced({e.domain, *(o.domain for o in e.others)})
        except Exception:
            log.exception("leasing for a completion batch's reply failed; the reply carries none of those leases")

    def _start(self, batch: Batch) -> None:
        """Start the batch's flush (nothing is written once the store lost data, or when the batch failed)."""
        if batch.error is None and self.fault:
            batch.error = StoreLost(self.fault)
        if batch.error is not None:
            return
        if self.store_timer is not None:
            batch.timing.enter_context(self.store_timer())
        batch.pending = begin_flush(self.frontier.store)

    def _land(self, batch: Batch, following: list[Op[Any]]) -> None:
        """Wait for the batch's flush and answer its calls. `following`: the ops of the batch that ran while this
        one's flush was in flight (their writes are buffered: a flush again carries them)."""
        core = self.frontier
        failed = batch.failed
        finished = batch.finished
        try:
            if batch.error is not None:
                raise batch.error
            self._commit(batch, following)
            self._more += batch.more
        except StoreLost as e:
            self._lose(e)
            lost = NodeUnavailable(self.fault)
            finished = [op for op in finished if not op.data_plane]
            kept = {id(op) for op in finished}
            failed += [(op, lost) for op in [*batch.ops, *batch.ran] if id(op) not in kept]
        except Exception as e:
            log.exception("commit failed; the calls of this batch are answered with the error")
            # Every call of the batch not answered yet and not waiting gets the error: those that ran, the waiting
            # Leases whose wait ended here (in `finished` only), and those a failure in `tick` kept from running.
            skip = {id(op) for op, _ in failed} | {id(op) for op in [*batch.parked, *self._parked]}
            skip -= {id(op) for op in finished}
            gone = {id(op): op for op in [*batch.ops, *batch.ran, *finished] if id(op) not in skip}
            failed += [(op, e) for op in gone.values()]
            # Their leases reach no worker: scheduled again now, rather than holding their hosts until they expire.
            try:
                core.take_back([item for op in gone.values() for item in op.leases()])
            except Exception:
                log.exception("taking back the leases of the failed calls failed; they wait for their deadlines")
            finished = []
            if self._replies_next:  # a reply deferred by this batch is answered with its error: no leases for it
                self._replies_next = [op for op in self._replies_next if id(op) not in gone]
        if any(op.changes for op in finished) or any(op.changes for op, _ in failed):
            self.version += 1
        results: list[tuple[Op[Any], Any, BaseException | None]] = [(op, None, exc) for op, exc in failed]
        for op in finished:
            try:
                results.append((op, op.finish(core), None))
            except Exception as e:
                results.append((op, None, e))
        self._deliver(results)

    def _serve_waiters(self, finished: list[Op[Any]]) -> list[Op[Any]]:
        """Hand ready items to waiting Leases, oldest first, until one finds nothing (the rest would find nothing
        either); then, only when a deadline has passed (or the node drained or stops), answer the Leases whose wait
        is over. The ones served."""
        waiters = self._waiters
        if not waiters:
            return []
        core = self.frontier
        served: list[Op[Any]] = []
        while waiters:
            w = waiters[0]
            if w.future is not None and w.future.cancelled():
                waiters.popleft()
            elif w.take(core) is Step.DONE:
                served.append(waiters.popleft())
                finished.append(w)
            else:
                break
        now = time.monotonic()
        if waiters and (now >= self._earliest or self._draining or core.drained):
            over = self._draining or core.drained
            keep: collections.deque[Lease] = collections.deque()
            self._earliest = math.inf
            for w in waiters:
                if w.future is not None and w.future.cancelled():
                    continue
                if over or now >= w.deadline:
                    finished.append(w)
                else:
                    keep.append(w)
                    self._earliest = min(self._earliest, w.deadline)
            self._waiters = keep
        return served

    def _drop_cancelled(self) -> None:
        """Let go of the waiting Leases whose callers went away (a full waiting set only: it costs a pass over it).
        _serve_waiters drops them only from the head, or once a wait ends: one waiting in front kept them in the
        set for up to its whole wait, and a Lease meanwhile could not wait."""
        kept = collections.deque(w for w in self._waiters if w.future is None or not w.future.cancelled())
        if len(kept) < len(self._waiters):
            self._waiters = kept
            self._earliest = min((w.deadline for w in kept), default=math.inf)

    def _commit(self, batch: Batch, following: list[Op[Any]]) -> None:
        """Wait for the batch's flush. A partly refused flush tells each op which domains were refused (an op may
        then leave links in the outbox: flushed again) and lets the node let go of those domains. A flush again
        also carries the writes of `following`, so its refusals are told to those ops as well."""
        ran, wait = batch.wrote, batch.pending.wait
        for _ in range(3):
            try:
                with batch.timing:
                    wait()
                return
            except Fenced as e:
                fenced = {e.domain, *(o.domain for o in e.others)}
                log.warning("writes for %d domain(s) refused by a newer owner: %s", len(fenced), sorted(fenced)[:5])
                self.on_fenced(fenced)
                again = [op.refused(fenced, self.outbox) for op in ran]
                if not any(again):
                    return
                ran, wait = [*batch.wrote, *following], self._flush
        self._flush()

    def _flush(self) -> None:
        store = self.frontier.store
        with self.store_timer() if self.store_timer is not None else nullcontext():
            store.flush()

    def _lose(self, e: StoreLost) -> None:
        """The store lost data: say so once, stop writing, and refuse data-plane calls from now on."""
        if self.fault:
            return
        self.fault = f"store_lost: {e.reason}"
        log.error("STORE LOST: %s; this node stops serving (restart it once the store is sound)", e.reason)
        for op in [*self._more, *self._parked, *self._replies_next]:
            self._deliver([(op, None, NodeUnavailable(self.fault))])
        self._more, self._parked, self._replies_next = [], [], []
        self._deliver([(w, None, NodeUnavailable(self.fault)) for w in self._waiters])
        self._waiters.clear()
        self._earliest = math.inf
        self.snapshot = self._take_snapshot()
        try:
            self.on_fault(self.fault)
        except Exception:
            log.exception("reporting the store fault failed")

    def _next_timeout(self) -> float:
        """How long to sleep: not at all with slices or deferred replies left; while Leases wait, until the core's
        next event or the first deadline; else TICK_S (the core's next event may be a host nobody asks for)."""
        if self._more or self._queue or self._replies_next or any(_unparked(op) for op in self._parked):
            return 0.0
        if not self._waiters or self.fault:
            return TICK_S
        wait = self._earliest - time.monotonic()
        nxt = self.frontier.next_event_in()
        if nxt is not None:
            wait = min(wait, nxt)
        return min(max(wait, _IDLE_FLOOR_S), TICK_S * 5)

    # ------------------------------------------------------------------ answers

    def _publish(self) -> Snapshot:
        """A new snapshot, unless the last one still holds (no call since, and recent) or was taken too recently for
        its cost (stats() is linear in hosts: it takes at most ~10% of the core's time)."""
        snap = self.snapshot
        age = time.monotonic() - snap.taken
        if (snap.version == self.version and age < _SNAPSHOT_MAX_AGE_S) or age < 10 * self._snapshot_cost:
            return snap
        self.snapshot = self._take_snapshot()
        return self.snapshot

    def _take_snapshot(self) -> Snapshot:
        # The cost is this thread's CPU time, the budget it is held to: wall time counted a thread descheduled on a
        # loaded machine, and a snapshot that took 50 ms of wall kept answering Stats for 0.5 s after later writes.
        t0 = time.thread_time()
        stats = self.frontier.stats()
        self._snapshot_cost = time.thread_time() - t0
        return Snapshot(stats, self.version, time.monotonic(), self.fault)

    @staticmethod
    def _deliver(results: list[tuple[Op[Any], Any, BaseException | None]]) -> None:
        """Resolve futures on their loops, one hop per loop for the whole batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for op, value, exc in results:
            if op.future is not None and op.loop is not None:
                by_loop.setdefault(op.loop, []).append((op.future, value, exc))
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve, batch)


def _resolve(batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, value, exc in batch:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)


def _unparked(op: Op[Any]) -> bool:
    """What `op` parked on is done: it runs again."""
    return op.parked_on is None or op.parked_on.done()
