"""Body fingerprints: exact digest, 64-bit simhash over word 3-shingles, Hamming distance."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hostring.fingerprint import (
    NEAR_DUPLICATE_DISTANCE,
    body_digest,
    hamming,
    near_duplicate,
    simhash64,
)

_RNG_VOCABULARY = random.Random(20240601)
VOCABULARY = [
    "".join(_RNG_VOCABULARY.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_RNG_VOCABULARY.randint(2, 9)))
    for _ in range(4000)
]
PANGRAM = "The quick brown fox jumps over the lazy dog"


def page(seed: int, words: int = 1500) -> str:
    """A deterministic page of Zipf-distributed words with some punctuation, like prose."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(VOCABULARY))]
    chosen = rng.choices(VOCABULARY, weights, k=words)
    return " ".join(w + rng.choice(["", "", "", "", ",", "."]) for w in chosen)


def edited(text: str, seed: int, changes: int) -> str:
    """The same text with `changes` words replaced."""
    rng = random.Random(seed)
    words = text.split()
    for _ in range(changes):
        words[rng.randrange(len(words))] = "edited" + str(rng.randrange(10**6))
    return " ".join(words)


# ---------------------------------------------------------------- exact digest


def test_body_digest_is_prefixed_sha256() -> None:
    assert body_digest(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert body_digest(b"abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert body_digest(b"abc") != body_digest(b"abd")


# ---------------------------------------------------------------- simhash


def test_simhash_is_a_64_bit_value_and_pinned() -> None:
    """Fingerprints are persisted and compared across releases: a change here must be deliberate."""
    value = simhash64(PANGRAM)
    assert 0 <= value < 2**64
    assert value == 15478926371218562171


def test_identical_texts_have_equal_fingerprints() -> None:
    text = page(1)
    assert simhash64(text) == simhash64(str(text))
    assert hamming(simhash64(text), simhash64(text)) == 0


def test_case_punctuation_and_spacing_do_not_matter() -> None:
    assert simhash64("Hello, World! How are you?") == simhash64("hello world how   are\nyou")


def test_word_order_matters() -> None:
    a = " ".join(VOCABULARY[:300])
    b = " ".join(reversed(VOCABULARY[:300]))
    assert hamming(simhash64(a), simhash64(b)) > 10


def test_small_edit_gives_small_distance() -> None:
    """One changed word in 1500 changes 3 of ~1500 shingles; only bits whose vote was nearly tied flip.

    That is a statistical promise (about 1.5 bits on average), so it is checked over many pages.
    """
    pairs = [(simhash64(page(s)), simhash64(edited(page(s), s, 1))) for s in range(20)]
    assert max(hamming(a, b) for a, b in pairs) <= 6
    assert sum(near_duplicate(a, b) for a, b in pairs) >= 16


def test_distance_grows_with_the_size_of_the_edit() -> None:
    text = page(42, words=3000)
    base = simhash64(text)
    mean = {
        changes: sum(hamming(base, simhash64(edited(text, s, changes))) for s in range(8)) / 8
        for changes in (3, 300, 1500)
    }
    assert mean[3] < mean[300] < mean[1500]
    assert mean[3] <= 4


def test_unrelated_texts_are_far_apart() -> None:
    distances = [hamming(simhash64(page(100 + i)), simhash64(page(200 + i))) for i in range(20)]
    assert min(distances) >= 16
    assert 26 <= sum(distances) / len(distances) <= 38  # about half of 64 bits, as for random values
    assert not any(near_duplicate(simhash64(page(100 + i)), simhash64(page(200 + i))) for i in range(20))


def test_short_and_empty_texts() -> None:
    assert simhash64("") == 0
    assert simhash64("  ,.;  ") == 0
    assert simhash64("one") != 0
    assert simhash64("one two") != simhash64("two one")
    assert simhash64("one two three") == simhash64("One, two; three.")


def test_non_ascii_and_lone_surrogates_are_hashed() -> None:
    assert simhash64("Größe ändern 日本語 テキスト") != simhash64("grosse andern")
    assert isinstance(simhash64("bad \ud800 surrogate text"), int)


def brute_simhash(text: str) -> int:
    """The definition, written out: one vote per word 3-shingle, each shingle's hash T0[a] ^ T1[b] ^ T2[c] with Tk a
    word's SHA-256 bytes 8k..8k+7 (little-endian); bit i set when more than half of the shingles have it set."""
    for ch in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~":
        text = text.replace(ch, " ")
    words = text.lower().split()
    if not words:
        return 0
    words += [""] * (3 - len(words))

    def table(word: str, k: int) -> int:
        return int.from_bytes(
            hashlib.sha256(word.encode("utf-8", "surrogatepass")).digest()[8 * k : 8 * k + 8], "little"
        )

    shingles = [table(a, 0) ^ table(b, 1) ^ table(c, 2) for a, b, c in zip(words, words[1:], words[2:], strict=False)]
    votes = [sum(h >> bit & 1 for h in shingles) for bit in range(64)]
    return sum(1 << bit for bit, v in enumerate(votes) if 2 * v > len(shingles))


@given(
    st.lists(st.sampled_from([*VOCABULARY[:40], "Ünïcode", "日本", "x\ud800", "a.b", "A,", "\x1c", "\t"]), max_size=40)
)
def test_simhash_is_its_definition(words: list[str]) -> None:
    """The tabulated, popcounted computation gives what one vote per shingle gives, with the word cache cold or warm."""
    text = " ".join(words)
    assert simhash64(text) == brute_simhash(text)
    assert simhash64(text) == brute_simhash(text)


def test_a_long_text_is_its_definition() -> None:
    """More shingles than the popcount masks made once are long (16 Ki): masks made for the text instead."""
    text = page(11, words=20_000) + " " + " ".join(f"novel{i}" for i in range(200))
    assert simhash64(text) == brute_simhash(text)


def test_fingerprint_does_not_depend_on_the_process_hash_seed() -> None:
    """SHA-256, not hash(): two processes with different PYTHONHASHSEED agree."""
    code = "from hostring.fingerprint import simhash64; import sys; print(simhash64(sys.argv[1]))"
    text = page(7, words=200)
    root = Path(__file__).resolve().parents[1]
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code, text], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        outputs.add(int(done.stdout))
    assert outputs == {simhash64(text)}


# ---------------------------------------------------------------- hamming


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_hamming_is_a_metric_on_64_bit_values(a: int, b: int) -> None:
    assert hamming(a, b) == hamming(b, a) == bin(a ^ b).count("1")
    assert (hamming(a, b) == 0) == (a == b)
    assert hamming(a, 0) + hamming(0, b) >= hamming(a, b)


def test_hamming_accepts_signed_64_bit_storage_form() -> None:
    """SQLite and many stores keep 64-bit integers signed; -1 is the same bits as 2**64 - 1."""
    assert hamming(-1, 2**64 - 1) == 0
    assert hamming(-(2**63), 2**63) == 0
    assert hamming(0, -1) == 64


def test_near_duplicate_threshold() -> None:
    assert NEAR_DUPLICATE_DISTANCE == 3
    assert near_duplicate(0b0000, 0b0111)
    assert not near_duplicate(0b0000, 0b1111)
    assert near_duplicate(0b0000, 0b1111, max_distance=4)
