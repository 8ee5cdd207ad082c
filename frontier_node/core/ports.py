"""The one interface the core needs from durable storage; SQLite, Redis and memory stores implement it.

Writes are buffered by the store and made durable by `flush()`, which the service shell calls before it
answers an RPC: an item is only reported admitted, leased or completed once its journal line is committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

from frontier_node.core.records import Entry, Item, LinkLike
from frontier_node.core.states import State


class Fenced(RuntimeError):
    """A store refused writes for `domain` (and `others`): a newer owner holds its fence. Other domains landed."""

    domain: str
    others: tuple[Fenced, ...]


class StoreLost(RuntimeError):
    """The store lost data this node wrote (a Redis restarted empty, a fence or instance marker gone): nothing it
    answers can be trusted any more. Fatal for the node: the shell logs it once by name, turns health to
    NOT_SERVING and answers data-plane calls UNAVAILABLE with details "store_lost: <reason>"."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"store_lost: {reason}")
        self.reason = reason


class Outbox(Protocol):
    """Where a clustered node leaves links whose domains another node owns, for the owner to admit.

    Buffered like every write and made durable by the store's flush, before the Complete that found the links
    is answered: a forwarded link is never only in a reply that its receiver might fail to read.
    """

    def forward(self, links: Sequence[LinkLike]) -> None:
        """Buffer links for the owners of their domains."""

    def post(self, domain: str, message: Mapping[str, object]) -> None:
        """Buffer a small JSON-ready message for the owner of `domain` (a robots.txt redirect hop to fetch
        there, or the outcome of one for the origin's home): delivered like forwarded links."""


class BodyClaim(NamedTuple):
    """What a body index knew of a body before it was claimed: the key first fetched with the exact same body
    (None when this is the first; a node's own RAM index, which keeps no keys, names it by the key's fingerprint,
    core.dedup.body_name), and whether a near duplicate (simhash within the distance) was seen."""

    first: str | None
    near: bool


Claim = tuple[str, int, str]
"""A body a completion registers in a BodyIndex: (digest, simhash, key)."""


class BodyIndex(Protocol):
    """Bodies already fetched, for dedup: one node's memory alone, or shared by every node of a cluster.

    `claim` is atomic first-wins for the exact digest: of two nodes claiming the same digest at once, one gets
    first=None and the other that one's key. A key claiming its own digest again (a revisit) gets first=None.
    """

    def claim(self, digest: str, simhash: int, key: str) -> BodyClaim:
        """Register the body of `key`; what was known of it before."""

    def remember(self, digest: str, simhash: int, key: str) -> None:
        """Register a body fetched before a restart or a handoff (a shared index already has it)."""

    def mirror_of(self, digest: str, key: str) -> str | None:
        """The key first fetched with this exact body when that is another key than `key`, else None; registers
        nothing (a revisit asks whether a page's new body mirrors another page's, node-wide or cluster-wide)."""


class Store(Protocol):
    """Journal plus current item rows, robots records and a few meta values."""

    def record(self, entry: Entry, item: Item) -> None:
        """Buffer one journal line and the item's row as it stands after it (its host and domain are its key's:
        they never change from one record of a key to the next)."""

    def note(self, entry: Entry) -> None:
        """Buffer a journal line that changes no row (late evidence, rejections of unknown keys)."""

    def save_robots(self, origin: str, host: str, record: dict[str, object]) -> None:
        """Buffer the robots record of an origin (RobotsRecord.to_dict())."""

    def set_meta(self, name: str, value: str) -> None:
        """Buffer a small named value (run id, scope, sequence high-water marks)."""

    def get_meta(self, name: str) -> str | None: ...

    def flush(self) -> None:
        """Commit everything buffered, atomically."""

    def prune(self, keys: Sequence[str]) -> None:
        """Delete the rows of `keys` and their journal lines now, buffered writes landing first (retention of
        revisited pages that are gone: nothing of them is kept after it)."""

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list[Item]:
        """Scheduled items of `host` whose (priority, seq) is greater than `after`, in that order, buffered writes
        included (a store may flush first, or lay its buffered rows over what it reads)."""

    def get(self, key: str) -> Item | None: ...

    def history(self, key: str) -> list[Entry]:
        """Every journal line of one key, in order."""

    def journal(self, after_seq: int = 0) -> Iterator[Entry]:
        """Journal lines with seq > after_seq, in order."""

    def items(self, states: Iterable[State] | None = None) -> Iterator[Item]:
        """Item rows, optionally only those in the given states."""

    def scheduled_counts(self) -> dict[str, int]:
        """host -> number of scheduled items: enough to rebuild queues lazily after a restart."""

    def robots_records(self) -> Iterator[tuple[str, str, dict[str, object]]]:
        """(origin, host, record) for every saved robots record."""

    def counts_by_state(self) -> dict[str, int]: ...

    def max_seqs(self) -> tuple[int, int]:
        """(highest journal seq, highest item seq): counters resume above them after a restart."""

    def close(self) -> None: ...


class BreachLog(Protocol):
    """Where budget breaches persist (rule, pattern, first example, count), per registrable domain ("" for rules
    of the whole crawl): a restarted node, a node that adopts the domain and an offline report see them."""

    def save_breaches(self, domain: str, breaches: Sequence[Mapping[str, object]]) -> None:
        """Buffer the current breaches of `domain` (they replace the stored ones at the next flush)."""

    def load_breaches(self, domains: Iterable[str] | None = None) -> dict[str, list[dict[str, object]]]:
        """domain -> its stored breaches, for `domains` (every domain the store knows with None)."""
        ...
