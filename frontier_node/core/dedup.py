"""Seen-sets: fetch keys already admitted, and bodies already fetched (exact digest and 64-bit simhash)."""

from __future__ import annotations

from array import array

from frontier_node.core.ports import BodyClaim

_EMPTY = 0
_MASK = (1 << 64) - 1


def key_hash(key: str) -> int:
    """A 64-bit fingerprint of a fetch key (never 0, which marks an empty slot), for this process's sets only.

    Python's string hash (SipHash, keyed per process, cached in the string): ten times cheaper than a blake2b
    digest. Nothing keeps these fingerprints beyond the process: every set is rebuilt from the store's rows on a
    restart or a handoff.
    """
    return (hash(key) & _MASK) or 1


def _probe(slots: array[int], size: int, h: int) -> int:
    """The slot holding fingerprint h, or the empty slot where it would go: open addressing from slot
    (h * size) >> 64 with linear probing (the tables never fill: they grow at 78% load)."""
    i = (h * size) >> 64
    while True:
        v = slots[i]
        if v in (h, _EMPTY):
            return i
        i += 1
        if i == size:
            i = 0


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
        slots = self._slots
        i = _probe(slots, self._size, h)
        if slots[i] == h:
            return False
        slots[i] = h
        self._count += 1
        if self._count > self._limit:
            self._grow()
        return True

    def __contains__(self, h: int) -> bool:
        """_probe written out: every discovered link asks, most of them duplicates."""
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
        slots, size = self._slots, self._size
        for v in old:  # each to the slot add() would give it, without a call per key: keys are distinct here
            if v:
                i = (v * size) >> 64
                while slots[i]:
                    i += 1
                    if i == size:
                        i = 0
                slots[i] = v


class FingerprintMap:
    """An exact map of 64-bit fingerprints to 64-bit values in two flat arrays, 20 to 31 bytes per entry.

    The same open addressing as SeenSet (slot (h * size) >> 64, linear probing, grown by half at 78% load);
    0 marks an empty slot, so fingerprints are never 0 (key_hash never is).
    """

    __slots__ = ("_count", "_keys", "_limit", "_size", "_values")

    _MAX_LOAD = 0.78
    _GROWTH = 1.5

    def __init__(self, capacity: int = 1024) -> None:
        self._resize(max(16, int(capacity / self._MAX_LOAD) + 1))
        self._count = 0

    def _resize(self, size: int) -> None:
        self._size = size
        self._keys = array("Q", bytes(8 * size))
        self._values = array("Q", bytes(8 * size))
        self._limit = int(size * self._MAX_LOAD)

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return 16 * self._size

    def get(self, h: int) -> int | None:
        i = _probe(self._keys, self._size, h)
        return self._values[i] if self._keys[i] == h else None

    def setdefault(self, h: int, value: int) -> int:
        """The value of h, storing `value` first when h is new (first wins)."""
        keys = self._keys
        i = _probe(keys, self._size, h)
        if keys[i] == h:
            return self._values[i]
        keys[i] = h
        self._values[i] = value
        self._count += 1
        if self._count > self._limit:
            self._grow()
        return value

    def _grow(self) -> None:
        old_keys, old_values = self._keys, self._values
        self._resize(int(self._size * self._GROWTH) + 1)
        keys, values, size = self._keys, self._values, self._size
        for k, v in zip(old_keys, old_values, strict=True):  # as SeenSet._grow: the slot setdefault() would give
            if k:
                i = (k * size) >> 64
                while keys[i]:
                    i += 1
                    if i == size:
                        i = 0
                keys[i] = k
                values[i] = v


def body_name(key_fingerprint: int) -> str:
    """How the in-RAM body index names a page it keeps no key of: its key's fingerprint."""
    return f"#{key_fingerprint:016x}"


_NO_ENTRY = -1
_BAND_VALUES = 1 << 16


class BodyIndex:
    """Bodies already fetched: an exact digest for mirrors and simhash bands for near duplicates, in RAM.

    Only fingerprints are kept (about 60 bytes per body, where strings of digests and keys took ~600): the
    digest's fingerprint maps to the fingerprint of the first key fetched with it, and each simhash is kept with
    its key's fingerprint. So a body is named by `body_name(fingerprint)` rather than by its key: the core only
    asks whether another page had it. A cluster's shared index (store/redis/bodies.py) names keys.

    Four 16-bit bands: two simhashes within Hamming distance 3 share at least one band (pigeonhole), so only the
    few candidates chained under those band values are compared. Chains are linked through flat arrays: per band,
    the last entry of each of the 65,536 band values and, per entry, the one before it under the same value.
    """

    __slots__ = ("_digests", "_heads", "_links", "_owners", "_sims", "max_distance")

    def __init__(self, max_distance: int = 3) -> None:
        self.max_distance = max_distance
        self._digests = FingerprintMap()
        self._sims = array("Q")
        self._owners = array("Q")
        self._heads: list[array[int]] = []  # allocated with the first simhash (2 MiB in all)
        self._links: list[array[int]] = [array("i") for _ in range(4)]

    def __len__(self) -> int:
        return max(len(self._digests), len(self._sims))

    @property
    def nbytes(self) -> int:
        arrays = [self._sims, self._owners, *self._heads, *self._links]
        return self._digests.nbytes + sum(a.itemsize * len(a) for a in arrays)

    def seen_digest(self, digest: str) -> str | None:
        """The name of the key first fetched with this exact body, or None."""
        owner = self._digests.get(key_hash(digest)) if digest else None
        return None if owner is None else body_name(owner)

    def near(self, simhash: int, other_than: int = 0) -> str | None:
        """The name of a body within max_distance bits of this simhash (of a key whose fingerprint is not
        `other_than`), or None."""
        if not simhash or self.max_distance < 0 or not self._heads:
            return None
        simhash &= _MASK
        sims, owners, limit = self._sims, self._owners, self.max_distance
        for band in range(4):
            links = self._links[band]
            i = self._heads[band][(simhash >> (16 * band)) & 0xFFFF]
            while i != _NO_ENTRY:
                if (sims[i] ^ simhash).bit_count() <= limit and owners[i] != other_than:
                    return body_name(owners[i])
                i = links[i]
        return None

    def claim(self, digest: str, simhash: int, key: str) -> BodyClaim:
        """Register the body of `key` (ports.BodyIndex): the key first fetched with this digest, near or not."""
        fp = key_hash(key)
        first = self._digests.setdefault(key_hash(digest), fp) if digest else fp
        near = self.near(simhash, other_than=fp) is not None
        self._add_simhash(simhash, fp)
        return BodyClaim(None if first == fp else body_name(first), near)

    def remember(self, digest: str, simhash: int, key: str) -> None:
        """Register a body known from the store (adoption, replay) without asking what was there before."""
        fp = key_hash(key)
        if digest:
            self._digests.setdefault(key_hash(digest), fp)
        self._add_simhash(simhash, fp)

    def mirror_of(self, digest: str, key: str) -> str | None:
        if not digest:
            return None
        first = self._digests.get(key_hash(digest))
        return None if first is None or first == key_hash(key) else body_name(first)

    def _add_simhash(self, simhash: int, owner: int) -> None:
        if not simhash:
            return
        simhash &= _MASK
        if not self._heads:
            self._heads = [array("i", [_NO_ENTRY]) * _BAND_VALUES for _ in range(4)]
        entry = len(self._sims)
        self._sims.append(simhash)
        self._owners.append(owner)
        for band in range(4):
            heads = self._heads[band]
            value = (simhash >> (16 * band)) & 0xFFFF
            self._links[band].append(heads[value])
            heads[value] = entry
