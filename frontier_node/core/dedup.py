"""Seen-sets: fetch keys already admitted, and bodies already fetched (exact digest and 64-bit simhash)."""

from __future__ import annotations

import hashlib
from array import array

from frontier_node.core.ports import BodyClaim

_EMPTY = 0
_MASK = (1 << 64) - 1


def key_hash(key: str) -> int:
    """A 64-bit fingerprint of a fetch key (never 0, which marks an empty slot)."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return h or 1


class SeenSet:
    """An exact set of 64-bit fingerprints in one flat array, kept between 10 and 16 bytes per key.

    Open addressing with linear probing; the slot of h is (h * size) >> 64, so the table can grow by half
    (not double) when it is 78% full, which keeps the load between 52% and 78%. At 1M keys the chance of any
    fingerprint collision is about 3e-8, and a collision only ever makes the frontier skip a URL it has not
    seen; it can never make it fetch one twice.
    """

    __slots__ = ("_count", "_limit", "_size", "_slots")

    _MAX_LOAD = 0.78
    _GROWTH = 1.5

    def __init__(self, capacity: int = 1 << 16) -> None:
        self._resize(max(16, int(capacity / self._MAX_LOAD) + 1))
        self._count = 0

    def _resize(self, size: int) -> None:
        self._size = size
        self._slots = array("Q", bytes(8 * size))
        self._limit = int(size * self._MAX_LOAD)

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._slots.itemsize * len(self._slots)

    def add(self, h: int) -> bool:
        """Insert fingerprint h; True when it was new."""
        slots, size = self._slots, self._size
        i = (h * size) >> 64
        while True:
            v = slots[i]
            if v == h:
                return False
            if v == _EMPTY:
                slots[i] = h
                self._count += 1
                if self._count > self._limit:
                    self._grow()
                return True
            i += 1
            if i == size:
                i = 0

    def __contains__(self, h: int) -> bool:
        slots, size = self._slots, self._size
        i = (h * size) >> 64
        while True:
            v = slots[i]
            if v == h:
                return True
            if v == _EMPTY:
                return False
            i += 1
            if i == size:
                i = 0

    def _grow(self) -> None:
        old = self._slots
        self._resize(int(self._size * self._GROWTH) + 1)
        self._count = 0
        for v in old:
            if v:
                self.add(v)


class BodyIndex:
    """Bodies already fetched: an exact digest for mirrors and simhash bands for near duplicates.

    Four 16-bit bands: two simhashes within Hamming distance 3 share at least one band (pigeonhole), so
    only the few candidates in those buckets are compared.
    """

    def __init__(self, max_distance: int = 3) -> None:
        self.max_distance = max_distance
        self.digests: dict[str, str] = {}
        self._bands: list[dict[int, list[tuple[int, str]]]] = [{}, {}, {}, {}]

    def seen_digest(self, digest: str) -> str | None:
        """The key first fetched with this exact body, or None."""
        return self.digests.get(digest) if digest else None

    def near(self, simhash: int) -> str | None:
        """The key of a body within max_distance bits of this simhash, or None."""
        if not simhash or self.max_distance < 0:
            return None
        for band in range(4):
            bucket = self._bands[band].get((simhash >> (16 * band)) & 0xFFFF)
            if bucket:
                for other, key in bucket:
                    if (other ^ simhash).bit_count() <= self.max_distance:
                        return key
        return None

    def claim(self, digest: str, simhash: int, key: str) -> BodyClaim:
        """Register the body of `key` (ports.BodyIndex): the key first fetched with this digest, near or not."""
        first = self.seen_digest(digest)
        near = self.near(simhash) not in (None, key)
        self.add(key, digest, simhash)
        return BodyClaim(None if first == key else first, near)

    def remember(self, digest: str, simhash: int, key: str) -> None:
        self.add(key, digest, simhash)

    def mirror_of(self, digest: str, key: str) -> str | None:
        first = self.seen_digest(digest)
        return None if first == key else first

    def add(self, key: str, digest: str, simhash: int) -> None:
        if digest:
            self.digests.setdefault(digest, key)
        if simhash:
            simhash &= _MASK
            for band in range(4):
                self._bands[band].setdefault((simhash >> (16 * band)) & 0xFFFF, []).append((simhash, key))
