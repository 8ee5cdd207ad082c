"""Body fingerprints for dedup: an exact digest catches mirrors, a 64-bit simhash catches near duplicates.

simhash (Charikar 2002; Manku, Jain, Das Sarma 2007): every feature of a page votes on each of 64 bits
with the bits of its hash; the fingerprint keeps the majority. Pages that share most features share most
bits, so the Hamming distance of two fingerprints estimates how different the pages are. The features
are word 3-shingles, which keep word order and survive small edits far better than whole lines.

Hashes come from SHA-256, so fingerprints are identical in every process, machine and Python version
(the built-in hash() is salted per process). SHA-256 rather than blake2b: any well-mixed hash will do,
and blake2b's keyword arguments (digest_size=...) double the cost of its call per word here. The work is
arranged for pure Python speed: one digest per distinct word, a shingle's hash made by tabulation, and
the 64 votes counted with big-integer popcounts (about 3-5 ms for a 50 KB page).
"""

from __future__ import annotations

import hashlib

__all__ = ["NEAR_DUPLICATE_DISTANCE", "SIMHASH_TEXT_CHARS", "body_digest", "hamming", "near_duplicate", "simhash64"]

# Manku et al. found k = 3 differing bits of 64 the best precision/recall trade-off on 8B web pages.
NEAR_DUPLICATE_DISTANCE = 3
SIMHASH_TEXT_CHARS = 64 * 1024
"""Characters of a page's text a simhash reads (worker and Scrapy plug-in alike): past them a page is long enough
to be told apart, and a huge one costs no more."""

_LANE = 8  # bytes per 64-bit hash
_TABLES = 24  # bytes of a word's digest used: its tabulation values T0, T1, T2
_DIGESTS: dict[str, bytes] = {}
_DIGESTS_MAX = 1 << 16  # distinct words kept (a few MB); the cache starts again empty when full
# ASCII punctuation separates words; letters, digits and every non-ASCII character stay in them.
_PUNCTUATION_TO_SPACE = str.maketrans(dict.fromkeys("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", " "))
_MASK_BYTES = 1 << 14
# Bit masks for _majority_bits' popcounts, made once: ANDed with a shorter column, a mask keeps only its length.
_MASKS = [int.from_bytes(bytes([1 << bit]) * _MASK_BYTES, "little") for bit in range(8)]


def body_digest(data: bytes) -> str:
    """The exact identity of a body: "sha256:<64 hex digits>"."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _words(text: str) -> list[str]:
    """Lower-cased words: runs of characters between whitespace and ASCII punctuation."""
    return text.lower().translate(_PUNCTUATION_TO_SPACE).split()


def _word_digests(words: list[str]) -> dict[str, bytes]:
    """The first 24 bytes of the SHA-256 of every word, from a bounded cache kept across pages: a site's pages share
    most of their words (navigation, templates), so most of a page's digests were made for an earlier one."""
    cache = _DIGESTS
    missing = set(words).difference(cache)
    if missing:
        if len(cache) + len(missing) > _DIGESTS_MAX:
            cache.clear()
        sha256 = hashlib.sha256
        for w in missing:
            cache[w] = sha256(w.encode("utf-8", "surrogatepass")).digest()[:_TABLES]
    return cache


def _shingle_hashes(words: list[str]) -> tuple[int, int]:
    """The hashes of all word 3-shingles packed as 64-bit lanes of one integer, and their number.

    Simple tabulation hashing (Pătraşcu & Thorup 2012): each distinct word gets three independent
    64-bit values T0, T1, T2 (bytes 0-7, 8-15, 16-23 of its SHA-256), and shingle (a, b, c) hashes to
    T0[a] ^ T1[b] ^ T2[c]. That is 3-independent, costs one digest per distinct word instead of one per
    shingle, and all shingles are XORed at once: three strided slices, three big-integer XORs.
    """
    if len(words) < 3:
        words = words + [""] * (3 - len(words))  # a short text is one shingle, padded with empty words
    try:  # most pages' words are all cached: one lookup each, no set of the page's words
        joined = b"".join(map(_DIGESTS.__getitem__, words))
    except KeyError:
        joined = b"".join(map(_word_digests(words).__getitem__, words))
    # 3 lanes of 8 bytes per word; the cast only sets the stride, the bytes are never reinterpreted.
    table = memoryview(joined).cast("Q")
    n = len(words) - 2
    lanes = int.from_bytes(table[0 : 3 * n : 3].tobytes(), "little")  # T0 of word k
    lanes ^= int.from_bytes(table[4 : 3 * n + 4 : 3].tobytes(), "little")  # T1 of word k + 1
    lanes ^= int.from_bytes(table[8 : 3 * n + 8 : 3].tobytes(), "little")  # T2 of word k + 2
    return lanes, n


def _majority_bits(lanes: int, n: int) -> int:
    """Bit i of the result is set when more than half of the n 64-bit lanes have bit i set.

    The lanes are transposed by byte position (bytes[j::8] gathers byte j of every lane), then each of the
    8 bits of that byte is counted with one AND and one popcount over the whole column.
    """
    packed = lanes.to_bytes(n * _LANE, "little")
    masks = _MASKS if n <= _MASK_BYTES else [int.from_bytes(bytes([1 << bit]) * n, "little") for bit in range(8)]
    fingerprint = 0
    for byte in range(_LANE):
        column = int.from_bytes(packed[byte::_LANE], "little")
        for bit, mask in enumerate(masks):
            if 2 * (column & mask).bit_count() > n:
                fingerprint |= 1 << (8 * byte + bit)
    return fingerprint


def simhash64(text: str) -> int:
    """The 64-bit simhash of a text over its word 3-shingles, each occurrence one vote; 0 for no words.

    Pass the page's extracted text, not its markup: shared templates would make every page of a site
    look alike.
    """
    words = _words(text)
    if not words:
        return 0
    lanes, n = _shingle_hashes(words)
    return _majority_bits(lanes, n)


def hamming(a: int, b: int) -> int:
    """The number of bits in which two 64-bit fingerprints differ."""
    return ((a ^ b) & 0xFFFF_FFFF_FFFF_FFFF).bit_count()


def near_duplicate(a: int, b: int, max_distance: int = NEAR_DUPLICATE_DISTANCE) -> bool:
    """True when two simhashes are at most `max_distance` bits apart: the same page with small changes.

    Unrelated pages differ in about 32 of 64 bits; 3 keeps the false-positive rate negligible while still
    catching a changed date, counter or ad slot on an otherwise identical page.
    """
    return hamming(a, b) <= max_distance
