"""Flushes of the Redis store on their way: the buffers each took, the pipeline's answers to come, and its outcome.

`RedisStore.begin_flush()` packs every buffered write into one pipeline, takes the buffers (writes buffered from
then on start afresh) and sends the pipeline on the store's line (line.py): the caller goes on with other work and
calls `Flight.wait()` when it needs the outcome. Several flights may be out at once (the core thread keeps up to
two: core_thread.FLIGHTS); the line sends them one after the other, each once the one before is answered, so Redis
applies the store's writes in the order they were begun. The store lands flights in that order (reads the answers
and settles the buffers by them, exactly as a synchronous flush does): a flight's `wait()` lands it and those before
it, and every store call that reads Redis lands them all first, so every read sees every write begun before it.

A flight that did not land whole (a connection error, a failed script) halts the line: no flight behind it is
sent. Landing it puts what it took, then what each flight behind it took, back in front of the writes buffered
since (`Taken.then`), answers those flights with the same error, and lets the line go on: to the store it is as
if those flushes had failed when they were begun, and the next flush sends them all, in order. A script call
answered NOSCRIPT (a restarted server) is loaded and sent again on the line's thread, before the next flight goes:
sent later, it would land behind newer writes.

A big flush goes as several write_all calls in the same pipeline, each about PART_ROWS rows and lines (`parts`):
redis-server runs a script to its end before it serves anyone else, but it reads an argument over 32 KB on its own
and goes back to its event loop after the call it completes, serving the clients that are waiting before the next
part (a part of 256 rows and lines carries ~60 KB). So the body claims of the next CompleteBatch, another node's
call or a backlog read wait for one part, not for the whole flush; with the lease in a completion's reply, claims
arrive while the flush before is in Redis, and the node then applies that batch while Redis runs the rest (about 15%
more URLs a second in bench.cluster's lease-in-reply phase on one node). A domain's batch is never cut: each
domain's writes stay atomic, as they are on a Cluster, and the round trips stay one a flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import NoScriptError

from frontier_node.commit import Flushed
from frontier_node.core.records import Entry
from frontier_node.store.redis.handoff import Batch, FencedOut
from frontier_node.store.redis.line import Line
from frontier_node.store.redis.scripts import Call, Scripts

PART_ROWS: Final = 256
"""Rows and journal lines a write_all call of a flush holds before the next domain starts another (see the module
docstring): a few milliseconds of Redis's time. A lease-in-reply flush of 256 URLs holds about 1,000."""


def parts(batches: dict[str, Batch]) -> list[dict[str, Batch]]:
    """`batches` cut, in order, into runs of whole domains of about PART_ROWS rows and lines each; a last run under
    half that joins the one before."""
    out: list[dict[str, Batch]] = [{}]
    size = 0
    for domain, batch in batches.items():
        if size >= PART_ROWS:
            out.append({})
            size = 0
        out[-1][domain] = batch
        size += len(batch.rows) + len(batch.entries)
    if len(out) > 1 and size < PART_ROWS // 2:
        out[-2].update(out.pop())
    return out


@dataclass(slots=True)
class Taken:
    """The buffered writes of a RedisStore (see store.py): each domain's batch and the node-scoped writes."""

    batches: dict[str, Batch] = field(default_factory=dict)
    orphans: list[Entry] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    new_domains: set[str] = field(default_factory=set)
    new_keydom: dict[str, str] = field(default_factory=dict)
    new_hostdom: dict[str, str] = field(default_factory=dict)
    links_out: dict[str, list[list[object]]] = field(default_factory=dict)
    posts: dict[str, list[str]] = field(default_factory=dict)
    breaches: dict[str, str] = field(default_factory=dict)

    def then(self, later: Taken) -> Taken:
        """These writes followed by `later`'s, as one buffer holds them when both were buffered in that order (the
        later row, record, value wins; lines, links and messages keep their order). Reuses both."""
        batches = self.batches
        for domain, batch in later.batches.items():
            earlier = batches.get(domain)
            if earlier is None:
                batches[domain] = batch
            else:
                earlier.extend(batch)
        links_out, posts = self.links_out, self.posts
        for domain, rows in later.links_out.items():
            links_out.setdefault(domain, []).extend(rows)
        for domain, messages in later.posts.items():
            posts.setdefault(domain, []).extend(messages)
        return Taken(
            batches,
            self.orphans + later.orphans,
            {**self.meta, **later.meta},
            self.new_domains | later.new_domains,
            {**self.new_keydom, **later.new_keydom},
            {**self.new_hostdom, **later.new_hostdom},
            links_out,
            posts,
            {**self.breaches, **later.breaches},
        )


@dataclass(slots=True)
class Packed:
    """A flush packed and not sent yet: its pipeline, whether node-scoped writes lead it, and its write_all calls
    (each with the batches it carries)."""

    pipe: Any
    node: bool
    calls: list[tuple[dict[str, Batch], Call]]


class Flight:
    """One flush sent and not landed yet. `wait()` lands it (unless a store call did first) and raises what the
    flush raised: FencedOut for refused domains, StoreLost, a connection error."""

    def __init__(
        self,
        settle: Callable[[Flight], None],
        answers: Future[list[Any]],
        taken: Taken,
        *,
        epoch: int,
        node: bool,
        calls: list[tuple[dict[str, Batch], Call]],
    ) -> None:
        self._settle = settle
        self.answers = answers
        self.taken = taken
        self.epoch = epoch
        self.node = node  # node-scoped writes were queued (their answers first, then the instance marker's)
        self.calls = calls  # the write_all calls, last in the pipeline: each with the batches it carries
        self.error: BaseException | None = None
        self.done = False  # landed

    @property
    def ready(self) -> bool:
        """The answers are in: `wait()` will not block on Redis (unless a flight before it is still out)."""
        return self.done or self.answers.done()

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call back (on the line's thread, or now) once the answers are in."""
        self.answers.add_done_callback(lambda _: callback())

    def wait(self) -> None:
        if not self.done:
            self._settle(self)
        if self.error is not None:
            raise self.error


class Flights:
    """Flushes in flight for RedisStore (mixed in; see the module docstring). The store's lock is held."""

    # What RedisStore provides.
    node_id: str
    namespace: str
    instance: str
    _instance_key: str
    _scripts: Scripts
    _flights: list[Flight]
    _line: Line | None
    _r: Any
    _lock: threading.RLock
    _known_domains: set[str]
    _batches: dict[str, Batch]
    _orphans: list[Entry]
    _meta: dict[str, str]
    _new_domains: set[str]
    _new_keydom: dict[str, str]
    _new_hostdom: dict[str, str]
    _links_out: dict[str, list[list[object]]]
    _posts: dict[str, list[str]]
    _breaches: dict[str, str]

    def _pipeline(self) -> Any:
        raise NotImplementedError

    def _queue_node(self, pipe: Any, epoch: int) -> bool:
        raise NotImplementedError

    def _sections(self, epoch: int, batches: dict[str, Batch]) -> tuple[str, str, str]:
        raise NotImplementedError

    def _applied(self, batches: dict[str, Batch], epoch: int, res: Any) -> list[FencedOut]:
        raise NotImplementedError

    def _verify_instance(self, value: object) -> None:
        raise NotImplementedError

    @property
    def flights_out(self) -> int:
        """Flushes sent (or queued on the line) and not landed yet."""
        return len(self._flights)

    def _settle(self) -> None:
        """Land every flight out, in order; each one's error is kept for its `wait()` (the lock is held)."""
        while self._flights:
            self._land_first()

    def _settle_flight(self, flight: Flight) -> None:
        with self._lock:
            while not flight.done and self._flights:
                self._land_first()

    def _land_first(self) -> None:
        """Wait for the oldest flight out and settle the buffers by its answers (see `_landed`)."""
        flight = self._flights.pop(0)
        try:
            self._landed(flight)
        except Exception as e:
            flight.error = e
        flight.done = True

    def _send_one(self, epoch: int, *, inline: bool) -> Flight | Flushed:
        """A flush on a single server in one round trip: the node-scoped writes, then write_all script calls for
        the domains' batches (the fences checked in the script; one call per part, see `parts`), in one pipeline,
        sent on the store's line behind the flights out, or `inline` (the caller landed them first: `_begin`); the
        buffers go with it."""
        packed = self._pack(epoch)
        if packed is None:
            return Flushed()
        if inline:
            answers: Future[list[Any]] = Future()
            try:
                answers.set_result(self._finish(packed, packed.pipe.execute(raise_on_error=False), None))
            except Exception as e:
                answers.set_exception(e)
        else:
            if self._line is None:
                self._line = Line(self._r, f"redis-flush-{self.node_id}")
            line = self._line
            answers = line.submit(packed.pipe, lambda found: self._finish(packed, found, line))
        flight = Flight(self._settle_flight, answers, self._take(), epoch=epoch, node=packed.node, calls=packed.calls)
        self._flights.append(flight)
        return flight

    def _pack(self, epoch: int) -> Packed | None:
        """The buffers as one pipeline (see `_send_one`); None when nothing is buffered."""
        pipe = self._pipeline()
        node = self._queue_node(pipe, epoch)
        calls: list[tuple[dict[str, Batch], Call]] = []
        if self._batches:
            head: list[object] = [self.node_id, epoch, self.namespace, self.instance]
            sha = self._scripts.shas["write_all"]
            for batches in parts(self._batches):
                call: Call = ([self._instance_key], [*head, *self._sections(epoch, batches)])
                pipe.execute_command("EVALSHA", sha, 1, *call[0], *call[1])
                calls.append((batches, call))
        elif not node:
            return None
        return Packed(pipe, node, calls)

    def _finish(self, packed: Packed, answers: list[Any], line: Line | None) -> list[Any]:
        """A packed flush's answers, with any write_all part answered NOSCRIPT loaded and sent again here, before
        anything behind it. Any answer still an error halts `line` (see the module docstring)."""
        first = len(answers) - len(packed.calls)
        for n, (_, call) in enumerate(packed.calls):
            if isinstance(answers[first + n], NoScriptError):
                try:
                    answers[first + n] = self._scripts.eval("write_all", *call)
                except Exception as e:
                    answers[first + n] = e
        if line is not None and any(isinstance(a, BaseException) for a in answers):
            line.halt()
        return answers

    def _landed(self, flight: Flight) -> None:
        """Settle the buffers by a flight's answers: what landed is done; what did not goes back in front of the
        writes buffered since (with the flights behind it, none of them sent), and its error is raised; StoreLost or
        FencedOut as a flush raises them."""
        taken, calls = flight.taken, flight.calls
        try:
            answers = flight.answers.result()
            for answer in answers[: len(answers) - len(calls)]:  # the node-scoped writes and the instance marker
                if isinstance(answer, BaseException):
                    raise answer
        except Exception as e:
            self._put_back(taken, e)
            raise
        if flight.node:
            self._known_domains |= taken.new_domains
            self._verify_instance(answers[len(answers) - len(calls) - 1])
        if not calls:
            return
        results = answers[len(answers) - len(calls) :]
        for res in results:
            if isinstance(res, BaseException):
                self._put_back(Taken(taken.batches), res)  # parts that landed are sent again: the script is idempotent
                raise res
        refused: list[FencedOut] = []
        for (batches, _), res in zip(calls, results, strict=True):
            refused += self._applied(batches, flight.epoch, res)
        if refused:
            raise FencedOut.of(refused)

    def _take(self) -> Taken:
        """Every buffered write (notes placed), taken from the buffers: the store buffers afresh."""
        taken = Taken(
            self._batches, self._orphans, self._meta, self._new_domains, self._new_keydom, self._new_hostdom,
            self._links_out, self._posts, self._breaches,
        )  # fmt: skip
        self._batches, self._orphans, self._meta, self._new_domains = {}, [], {}, set()
        self._new_keydom, self._new_hostdom, self._links_out, self._posts, self._breaches = {}, {}, {}, {}, {}
        return taken

    def _put_back(self, taken: Taken, error: BaseException) -> None:
        """Buffer `taken` again, in front of what was buffered since (a flush that did not land), with what the
        flights behind it took in between: the line halted at the failure and sent none of them. They are
        answered with the same `error`, and the line goes on."""
        behind, self._flights = self._flights, []
        for flight in behind:
            flight.answers.exception()  # answered NotSent by the halted line: wait for it, so none can still go
            taken = taken.then(flight.taken)
            flight.error, flight.done = error, True
        m = taken.then(self._take())
        self._batches, self._orphans, self._meta = m.batches, m.orphans, m.meta
        self._new_domains, self._new_keydom, self._new_hostdom = m.new_domains, m.new_keydom, m.new_hostdom
        self._links_out, self._posts, self._breaches = m.links_out, m.posts, m.breaches
        if self._line is not None:
            self._line.resume()
