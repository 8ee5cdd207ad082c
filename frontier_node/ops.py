"""What one call asks of the core, as an operation the core thread applies in one or more slices.

An operation runs on the core thread only (frontier_node/core_thread.py): `run` applies its next slice to the
core, its writes are committed with the rest of the batch, `refused` learns which domains a newer owner fenced
in that commit, and `finish` builds the plain result the RPC coroutine turns into a reply. Big calls are sliced
so that other calls interleave between the slices: a Discover by links, a CompleteBatch by completions (a
completion and its links stay in one slice: they are committed in one transaction, as the journal promises).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Claim, Outbox
from frontier_node.core.records import Item, LinkLike, LinkVerdict
from hostring.client import WRONG_OWNER
from hostring.urls import domain_of

T = TypeVar("T")

DISCOVER_SLICE = 1_000
"""Links of one Discover applied per batch (about 10 ms of core time)."""
COMPLETE_SLICE = 1_000
"""Completions plus their links applied per batch (at least one completion, whatever its links)."""


class Primer(Protocol):
    """Registers a slice's bodies off the core thread (a cluster's shared body index: RedisBodyIndex)."""

    def prime_later(self, claims: list[Claim]) -> Future[Any]:
        """Start registering `claims`; the Future answers what `use_primed` takes."""
        ...

    def use_primed(self, primed: Any) -> None:
        """Answer the core's claims from `primed` until the next call ({}: claim one by one)."""
        ...


class Step(enum.Enum):
    """What `run` left to do: nothing, another slice in a later batch, wait for work (a long-poll Lease), or run
    again once `Op.parked_on` is done, having changed nothing (bodies registered off the core thread)."""

    DONE = "done"
    MORE = "more"
    WAIT = "wait"
    PARK = "park"


class Op(Generic[T]):
    """One call's work on the core thread. `data_plane`: refused once the store is lost; `changes`: it may change
    what Stats shows (an inspection call does not, so the published snapshot stays current)."""

    data_plane = True
    changes = True

    def __init__(self) -> None:
        self.future: asyncio.Future[T] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fenced: set[str] = set()
        self.started = False
        self.parked_on: Future[Any] | None = None  # what a PARK step waits for

    def run(self, core: Frontier) -> Step:
        """Apply the next slice (the core thread holds the service lock)."""
        raise NotImplementedError

    def refused(self, fenced: set[str], outbox: Outbox | None) -> bool:
        """A commit that held this op's writes was refused for `fenced` domains; True when this buffered more writes
        (links handed to the outbox) that the core thread must commit before answering."""
        self.fenced |= fenced
        return False

    def finish(self, core: Frontier) -> T:
        """The result, once every slice is committed."""
        raise NotImplementedError

    def abandoned(self) -> bool:
        """The caller went away before the op started (a cancelled or timed-out RPC): skip it."""
        return not self.started and self.future is not None and self.future.cancelled()

    def leases(self) -> list[Item]:
        """The items this op leased for its caller (taken back when its call is answered with an error)."""
        return []


class Call(Op[T]):
    """A small bounded call (inspection, administration, Renew): one function of the core."""

    def __init__(self, fn: Callable[[Frontier], T], *, data_plane: bool = False, changes: bool = False) -> None:
        super().__init__()
        self.fn = fn
        self.data_plane = data_plane
        self.changes = changes or data_plane
        self._value: T | None = None

    def run(self, core: Frontier) -> Step:
        self._value = self.fn(core)
        return Step.DONE

    def finish(self, core: Frontier) -> T:
        return self._value  # type: ignore[return-value]


class Discover(Op[tuple[list[LinkVerdict], set[str]]]):
    """Admit links in slices of DISCOVER_SLICE; the verdicts and the domains a newer owner fenced meanwhile."""

    def __init__(self, links: Sequence[LinkLike]) -> None:
        super().__init__()
        self.links = links
        self.verdicts: list[LinkVerdict] = []

    def run(self, core: Frontier) -> Step:
        self.started = True
        done = len(self.verdicts)
        self.verdicts += core.discover(self.links[done : done + DISCOVER_SLICE])
        return Step.DONE if len(self.verdicts) >= len(self.links) else Step.MORE

    def finish(self, core: Frontier) -> tuple[list[LinkVerdict], set[str]]:
        return self.verdicts, self.fenced


@dataclass(slots=True)
class Leased:
    """A Lease's answer: the items (none in a fenced domain), whether the node is drained, the next-ready hint."""

    items: list[Item]
    drained: bool
    next_ready_s: float | None


class Lease(Op[Leased]):
    """Up to `want` items now; or, with a deadline in the future, a place among the waiting Leases."""

    def __init__(self, worker_id: str, want: int, wait_s: float) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.want = want
        self.deadline = time.monotonic() + wait_s
        self.waits = wait_s > 0
        self.items: list[Item] = []

    def run(self, core: Frontier) -> Step:
        self.started = True
        return Step.WAIT if self.waits else self.take(core)

    def take(self, core: Frontier) -> Step:
        """Lease now; DONE with items (or nothing, when the op does not wait), else WAIT."""
        self.items = core.lease(self.worker_id, self.want)
        return Step.DONE if self.items or not self.waits else Step.WAIT

    def leases(self) -> list[Item]:
        return self.items

    def finish(self, core: Frontier) -> Leased:
        items = [it for it in self.items if it.domain not in self.fenced] if self.fenced else self.items
        return Leased(items, core.drained, core.next_event_in())


def lease_domain(core: Frontier, lease_id: str) -> str:
    """The registrable domain of a lease: its current item's, else the one its key names."""
    domain = core.leased_domain(lease_id)
    return domain_of(lease_id) if domain is None else domain


@dataclass(slots=True)
class Settled:
    """One completion's answer; `forward` holds links other nodes own when there is no outbox to leave them in."""

    accepted: bool = False
    state: str = ""
    follow_links: bool = False
    reason: str = ""
    admitted: int = 0
    forward: list[LinkLike] = field(default_factory=list)
    wrong_owner: bool = False


class Complete(Op[list[Settled]]):
    """Settle leases in request order, in slices of about COMPLETE_SLICE completions-plus-links.

    With `primer` (a cluster's shared body index), the bodies a slice's completions will register are registered
    first in one call, in request order, off the core thread: the slice parks (Step.PARK) until the answers are in,
    and then runs, its claims reading them. A completion whose lease changed meanwhile is judged as it stands then
    (`_one` checks everything again); its body, registered under its own key, answers nobody as a mirror of itself.

    Links whose domain another node owns go to the outbox in the same commit when there is one (the reply then
    carries none), else back in `forward`. A lease whose domain this node does not own answers wrong_owner; one
    whose holder is not the completion's worker_id (an empty one included) is refused as not_holder.
    With `lease` (worker id, how many), up to that many items are then leased for the worker in the same commit
    (zero-wait turnaround: a host a completion released goes out at once when its politeness allows), by
    `lease_reply`; they are in `leased` once the op finished (none in a domain a newer owner fenced). A slice that
    parks may lease some of them first (`lease_ahead`, from the hosts ready then); `lease_reply` fills the rest.
    """

    def __init__(
        self,
        completions: Sequence[Any],
        outbox: Outbox | None,
        lease: tuple[str, int] | None = None,
        primer: Primer | None = None,
    ) -> None:
        super().__init__()
        self.completions = completions
        self.outbox = outbox
        self.lease = lease
        self.leased: list[Item] = []
        self.primer = primer
        self.settled: list[tuple[Settled, str]] = []  # (answer, the lease's domain), in request order
        self._slice_from = 0  # the first completion of the slice the current commit holds
        self.leased_ahead = False  # lease_ahead ran (once at most)

    def leases(self) -> list[Item]:
        return self.leased

    def run(self, core: Frontier) -> Step:
        self.started = True
        start = self._slice_from = len(self.settled)
        end, budget = start, COMPLETE_SLICE
        while end < len(self.completions) and (budget > 0 or end == start):
            budget -= 1 + len(self.completions[end].links)
            end += 1
        primer = self.primer if end - start > 1 else None  # one completion claims on its own: nothing to save
        if primer is not None:
            primed, self.parked_on = self.parked_on, None
            if primed is None:
                claims = [
                    c
                    for r in self.completions[start:end]
                    if (c := core.body_claim(r.lease_id, r.generation, r.outcome, worker_id=r.worker_id)) is not None
                ]
                if claims:
                    self.parked_on = primer.prime_later(claims)
                    return Step.PARK
                primer = None
            else:  # a registration that failed fails the slice before it changes anything
                primer.use_primed(primed.result())
        try:
            for request in self.completions[start:end]:
                self.settled.append(self._one(core, request))
        finally:
            if primer is not None:
                primer.use_primed({})  # answers not asked for must not answer a later claim
        return Step.MORE if len(self.settled) < len(self.completions) else Step.DONE

    @property
    def lease_for(self) -> str | None:
        """The worker the completions asked leases for while the reply has room left (they are leased once every
        slice ran, some perhaps ahead), or None."""
        return self.lease[0] if self.lease is not None and self.lease[1] > len(self.leased) else None

    def lease_ahead(self, core: Frontier) -> None:
        """Lease the reply from the hosts ready now, while a slice waits for its bodies' registration (the core
        thread calls this once the slice parked, once per op). The completions' own hosts are still leased, so these
        are other hosts; `lease_reply` adds the hosts the completions release if the reply has room left."""
        if not self.leased_ahead:
            self.leased_ahead = True
            self.lease_reply(core)

    def lease_reply(self, core: Frontier) -> None:
        """Lease what the completions asked for and `lease_ahead` did not, in the commit that settles them (the
        core thread calls this once the op is done, before or after the waiting Leases had their turn)."""
        lease = self.lease
        if lease is not None and lease[1] > len(self.leased):
            self.leased += core.lease(lease[0], lease[1] - len(self.leased))

    def _one(self, core: Frontier, request: Any) -> tuple[Settled, str]:
        domain = lease_domain(core, request.lease_id)
        if not core.owns(domain):
            return Settled(reason=WRONG_OWNER, wrong_owner=True), domain
        done = core.complete(
            request.lease_id, request.generation, request.outcome, request.links, worker_id=request.worker_id
        )
        forward = done.forward
        if forward and self.outbox is not None:
            self.outbox.forward(forward)
            forward = []
        return Settled(done.accepted, done.state, done.follow_links, done.reason, done.admitted, forward), domain

    def refused(self, fenced: set[str], outbox: Outbox | None) -> bool:
        """Leases in a refused domain answer wrong_owner (the new owner settles the re-sent Complete); links that fell
        in refused domains go to the outbox (then the caller commits again) or back in `forward`."""
        super().refused(fenced, outbox)
        more = False
        for i in range(self._slice_from, len(self.settled)):
            answer, domain = self.settled[i]
            if answer.wrong_owner:
                continue
            if domain in fenced:
                self.settled[i] = (Settled(reason=WRONG_OWNER, wrong_owner=True), domain)
            elif answer.follow_links:
                request = self.completions[i]
                lost = [link for link in request.links if domain_of(link.observed, link.base_url) in fenced]
                if lost and self.outbox is not None:
                    self.outbox.forward(lost)
                    more = True
                elif lost:
                    answer.forward.extend(lost)
        return more

    def finish(self, core: Frontier) -> list[Settled]:
        if self.fenced and self.leased:
            self.leased = [it for it in self.leased if it.domain not in self.fenced]
        return [answer for answer, _ in self.settled]
