"""The ring: same owners in every process, and membership changes move only the domains they must."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hostring.ring import EMPTY_RING, Member, Ring

ROOT = Path(__file__).resolve().parent.parent
TLDS = ["com", "org", "net", "de", "co.uk", "io", "fr"]


def _domains(n: int, seed: int = 42) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        label = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789-", k=rng.randint(3, 14))).strip("-") or "x"
        out.add(f"{label}.{rng.choice(TLDS)}")
    return sorted(out)


def _members(n: int) -> list[Member]:
    return [Member(f"node-{i}", f"10.0.0.{i}:7000") for i in range(n)]


DOMAINS = _domains(10_000)

_OWNERS_SCRIPT = """
import json, random, sys
from hostring.ring import Member, Ring
spec = json.loads(sys.stdin.read())
members = [Member(*m) for m in spec["members"]]
random.Random(spec["shuffle"]).shuffle(members)
ring = Ring(spec["epoch"], members)
print(json.dumps([ring.owner(d).node_id for d in spec["domains"]]))
"""


def _owners_in_subprocess(hash_seed: str, shuffle: int, members: list[Member], domains: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    spec = {
        "epoch": 7,
        "members": [[m.node_id, m.address, m.weight] for m in members],
        "domains": domains,
        "shuffle": shuffle,
    }
    out = subprocess.run(
        [sys.executable, "-c", _OWNERS_SCRIPT],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    owners: list[str] = json.loads(out.stdout)
    return owners


def test_same_owners_across_processes_hash_seeds_and_member_order() -> None:
    members = [*_members(4), Member("heavy", "10.0.0.9:7000", 3)]
    domains = DOMAINS[:2000]
    a = _owners_in_subprocess("1", shuffle=1, members=members, domains=domains)
    b = _owners_in_subprocess("4242", shuffle=2, members=members, domains=domains)
    here = Ring(7, reversed(members))
    assert a == b == [here.owner(d).node_id for d in domains]  # type: ignore[union-attr]
    assert len(set(a)) == 5


def test_empty_ring_has_no_owner() -> None:
    assert EMPTY_RING.owner("example.com") is None
    assert not EMPTY_RING.owns("node-0", "example.com")
    assert Ring(3, []).owner("example.com") is None


def test_owner_folds_case_and_trailing_dot() -> None:
    ring = Ring(1, _members(5))
    for d in DOMAINS[:200]:
        assert ring.owner(d) == ring.owner(d.upper()) == ring.owner(d + ".")


def test_ring_is_a_value() -> None:
    a, b = Ring(2, _members(3)), Ring(2, list(reversed(_members(3))))
    assert a == b and hash(a) == hash(b)
    assert a != Ring(3, _members(3))
    assert list(a.members) == ["node-0", "node-1", "node-2"]
    with pytest.raises(TypeError):
        a.members["x"] = Member("x", "y")  # type: ignore[index]


def test_bad_members_are_refused() -> None:
    with pytest.raises(ValueError):
        Ring(1, [Member("a", "x"), Member("a", "y")])
    with pytest.raises(ValueError):
        Member("", "x")
    with pytest.raises(ValueError):
        Member("a", "x", 0)


def test_join_moves_about_one_in_n_plus_one_and_only_to_the_new_node() -> None:
    before, after = Ring(1, _members(3)), Ring(2, _members(4))
    moved = before.moved(after, DOMAINS)
    ideal = len(DOMAINS) / 4
    assert ideal / 1.5 <= len(moved) <= ideal * 1.5, f"moved {len(moved) / len(DOMAINS):.3f}, ideal 0.25"
    assert {new for _, new in moved.values()} == {"node-3"}
    assert all(old in {"node-0", "node-1", "node-2"} for old, _ in moved.values())
    assert {d for d in DOMAINS if after.owns("node-3", d)} == set(moved)


def test_leave_moves_only_the_leavers_domains() -> None:
    before = Ring(1, _members(4))
    after = Ring(2, [m for m in _members(4) if m.node_id != "node-2"])
    moved = before.moved(after, DOMAINS)
    assert set(moved) == {d for d in DOMAINS if before.owns("node-2", d)}
    assert all(old == "node-2" and new != "node-2" for old, new in moved.values())
    assert len({new for _, new in moved.values()}) == 3, "the leaver's domains spread over every survivor"


def test_address_change_moves_nothing() -> None:
    before = Ring(1, _members(3))
    after = Ring(2, [Member("node-1", "10.9.9.9:7000"), *(m for m in _members(3) if m.node_id != "node-1")])
    assert before.moved(after, DOMAINS) == {}


def test_moved_to_and_from_an_empty_ring() -> None:
    ring = Ring(1, _members(2))
    assert set(EMPTY_RING.moved(ring, DOMAINS[:10]).values()) <= {(None, "node-0"), (None, "node-1")}
    assert len(ring.moved(EMPTY_RING, DOMAINS[:10])) == 10


def test_weights_shift_share_roughly_proportionally() -> None:
    ring = Ring(1, [Member("a", "x", 1), Member("b", "x", 1), Member("c", "x", 2)])
    share = Counter(ring.owner(d).node_id for d in DOMAINS)  # type: ignore[union-attr]
    assert 0.40 <= share["c"] / len(DOMAINS) <= 0.60, share
    assert 0.17 <= share["a"] / len(DOMAINS) <= 0.33, share
    assert 0.17 <= share["b"] / len(DOMAINS) <= 0.33, share
    # Raising one weight only takes domains towards that node.
    heavier = Ring(2, [Member("a", "x", 1), Member("b", "x", 3), Member("c", "x", 2)])
    moved = ring.moved(heavier, DOMAINS)
    assert moved and {new for _, new in moved.values()} == {"b"}
