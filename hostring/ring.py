"""The consistent-hash ring of registrable domains: one immutable view per membership epoch.

Every process builds its ring from the same (epoch, members) it gets from the coordinator and must reach the
same owner for every domain. So the ring depends only on member ids and weights: members are added in sorted
id order, points come from MD5 (never Python's per-process randomised `hash()`), and the hash function is pinned
here rather than left to the library's default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from uhashring import HashRing

VNODES_PER_WEIGHT = 160
"""Points on the ring per unit of weight; 160 keeps each member's share within a few percent of its ideal."""

MAX_WEIGHT = 100
"""A weight of w costs w * VNODES_PER_WEIGHT points in every process; bounded so one member cannot bloat all."""


def _md5_int(key: object) -> int:
    """The 128-bit MD5 of a key's text: uhashring's own default, pinned so a library upgrade cannot move domains."""
    return int(hashlib.md5(str(key).encode("utf-8"), usedforsecurity=False).hexdigest(), 16)


@dataclass(frozen=True)
class Member:
    """One frontier node as the ring sees it: its stable id (what is hashed), where to reach it, its weight."""

    node_id: str
    address: str
    weight: int = 1

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("a member needs a node id")
        if not 1 <= self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight of {self.node_id!r} must be within 1..{MAX_WEIGHT}, got {self.weight}")


class Ring:
    """Which member owns a registrable domain at one epoch; immutable, cheap to share between threads."""

    __slots__ = ("_epoch", "_hashring", "_members")

    def __init__(self, epoch: int, members: Iterable[Member]) -> None:
        if epoch < 0:
            raise ValueError("an epoch is never negative")
        ordered = sorted(members, key=lambda m: m.node_id)
        by_id: dict[str, Member] = {}
        for m in ordered:
            if m.node_id in by_id:
                raise ValueError(f"node id {m.node_id!r} appears twice in one ring")
            by_id[m.node_id] = m
        self._epoch = epoch
        self._members: Mapping[str, Member] = MappingProxyType(by_id)
        # Sorted insertion keeps the rare case of two vnodes colliding on one point independent of input order.
        self._hashring = HashRing(
            nodes={m.node_id: {"weight": m.weight, "vnodes": VNODES_PER_WEIGHT} for m in ordered},
            hash_fn=_md5_int,
        )

    @property
    def epoch(self) -> int:
        """The membership epoch this view belongs to (0: nobody has joined yet)."""
        return self._epoch

    @property
    def members(self) -> Mapping[str, Member]:
        """Members by node id, in id order; read-only."""
        return self._members

    def owner(self, domain: str) -> Member | None:
        """The member owning a registrable domain (case and a trailing dot folded), or None for an empty ring."""
        node_id: str | None = self._hashring.get_node(_key(domain))
        return None if node_id is None else self._members[node_id]

    def owns(self, node_id: str, domain: str) -> bool:
        """True when `node_id` owns `domain` in this view."""
        m = self.owner(domain)
        return m is not None and m.node_id == node_id

    def moved(self, other: Ring, domains: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """Domains whose owner differs between this ring (old) and `other` (new): domain -> (old id, new id)."""
        out: dict[str, tuple[str | None, str | None]] = {}
        for d in domains:
            a, b = self.owner(d), other.owner(d)
            old, new = (a.node_id if a else None), (b.node_id if b else None)
            if old != new:
                out[d] = (old, new)
        return out

    def __len__(self) -> int:
        return len(self._members)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return self._epoch == other._epoch and dict(self._members) == dict(other._members)

    def __hash__(self) -> int:
        return hash((self._epoch, tuple(self._members.values())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{m.node_id}@{m.address}x{m.weight}" for m in self._members.values())
        return f"Ring(epoch={self._epoch}, [{inner}])"


def _key(domain: str) -> str:
    """The text hashed for a domain: DNS names are case-insensitive and a trailing dot names the same zone."""
    return domain.lower().removesuffix(".")


EMPTY_RING = Ring(0, ())
"""The view before anyone has joined: every `owner()` is None."""
