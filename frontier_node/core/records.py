"""The plain records the core trades in: items, journal entries, and what links and outcomes look like."""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from frontier_node.core.states import State


class Kind(enum.IntEnum):
    """What an item is; values match the wire enum ItemKind."""

    PAGE = 1
    ROBOTS = 2


class Verdict(enum.IntEnum):
    """The answer to one discovered link; values match the wire enum Verdict."""

    ADMITTED = 1
    DUPLICATE = 2
    REJECTED = 3
    WRONG_OWNER = 4
    SUPPRESSED = 5


class LinkVerdict(NamedTuple):
    """One Discover answer: the verdict, its reason, the fetch key and the registrable domain."""

    verdict: Verdict
    reason: str = ""
    fetch_key: str = ""
    domain: str = ""


class LinkLike(Protocol):
    """A discovered link. The protobuf `Link` message satisfies this as it is (no copy on the hot path)."""

    @property
    def observed(self) -> str: ...
    @property
    def base_url(self) -> str: ...
    @property
    def source_key(self) -> str: ...
    @property
    def depth(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def redirect_hops(self) -> int: ...
    @property
    def seed(self) -> bool: ...
    @property
    def payload(self) -> builtins.bytes: ...


@dataclass(slots=True)
class Link:
    """A plain LinkLike for seeds, redirects and tests."""

    observed: str
    base_url: str = ""
    source_key: str = ""
    depth: int = 0
    priority: int = 0
    redirect_hops: int = 0
    seed: bool = False
    payload: builtins.bytes = b""


class OutcomeLike(Protocol):
    """What a worker reports for one fetch. The protobuf `Outcome` message satisfies this."""

    @property
    def status(self) -> int: ...
    @property
    def error_class(self) -> str: ...
    @property
    def error_detail(self) -> str: ...
    @property
    def retry_after_s(self) -> float: ...
    @property
    def location(self) -> str: ...
    @property
    def content_type(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def response_s(self) -> float: ...
    @property
    def body_digest(self) -> str: ...
    @property
    def simhash(self) -> int: ...
    @property
    def evidence(self) -> str: ...
    @property
    def remote_ip(self) -> str: ...
    @property
    def etag(self) -> str: ...
    @property
    def last_modified(self) -> str: ...
    @property
    def robots_body(self) -> builtins.bytes: ...
    @property
    def nofollow(self) -> bool: ...
    @property
    def noindex(self) -> bool: ...


@dataclass(slots=True)
class Outcome:
    """A plain OutcomeLike for tests and simulations."""

    status: int = 0
    error_class: str = ""
    error_detail: str = ""
    retry_after_s: float = -1.0
    location: str = ""
    content_type: str = ""
    bytes: int = 0
    response_s: float = 0.0
    body_digest: str = ""
    simhash: int = 0
    evidence: str = ""
    remote_ip: str = ""
    etag: str = ""
    last_modified: str = ""
    robots_body: builtins.bytes = b""
    nofollow: bool = False
    noindex: bool = False


@dataclass(slots=True)
class Item:
    """One fetch key's current state: the row a store keeps and the object the core schedules.

    Only items in a host's window, in flight or waiting out a retry live in RAM; the rest stay in the store.
    """

    key: str
    url: str
    host: str
    origin: str
    domain: str
    kind: Kind
    depth: int
    priority: int
    seq: int
    redirect_hops: int = 0
    state: State = State.DISCOVERED
    attempt: int = 0
    generation: int = 0
    reason: str = ""
    deadline: float = 0.0
    due_at: float = 0.0
    status: int = 0
    etag: str = ""
    last_modified: str = ""
    evidence: str = ""
    digest: str = ""
    source: str = ""
    # Revisits (core/revisit.py): when the page last answered and when its stored body was fetched, its
    # current revisit interval, and its change history for the estimator: visits compared, changes seen,
    # seconds watched over those visits and seconds of the intervals that held a change; the stored body's
    # simhash (a near duplicate of it is no change). All zero for a page never fetched.
    checked_at: float = 0.0
    stored_at: float = 0.0
    interval_s: float = 0.0
    visits: float = 0.0
    changes: float = 0.0
    watched_s: float = 0.0
    changed_s: float = 0.0
    simhash: int = 0
    payload: bytes = b""
    """Opaque client data from the admitting link (Link.payload), handed back on every lease."""

    @property
    def order(self) -> tuple[int, int]:
        """Queue order within a host: priority first (lower is sooner), then age."""
        return (self.priority, self.seq)


class Entry(NamedTuple):
    """One journal line: every state transition of every item, in order.

    `data` carries what replay needs to rebuild an item (on admit: url, host, depth, ...) as compact JSON.
    """

    seq: int
    run_id: str
    key: str
    attempt: int
    generation: int
    from_state: str
    event: str
    to_state: str
    at: float
    policy_version: int
    reason: str
    evidence: str
    data: str = ""


@dataclass(slots=True)
class Completion:
    """The answer to a Complete: whether it counted, the item's state after it, and what became of its links."""

    accepted: bool
    state: str
    follow_links: bool
    reason: str
    admitted: int = 0
    forward: list[LinkLike] = field(default_factory=list)
    forwarded: int = 0
    """Links left in the node's outbox for their owners (a cluster node), instead of returned in `forward`."""
