"""What the store tests share: items and journal lines to write, a snapshot of every read, the random op
sequences (with the Driver that applies them) that compare a backend with the reference MemoryStore, and priming
the cluster's body index as a CompleteBatch does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from frontier_node.core.frontier import Frontier
from frontier_node.core.ports import Claim, Store
from frontier_node.core.records import Entry, Item, Kind, Outcome
from frontier_node.core.states import State
from frontier_node.store.redis.bodies import RedisBodyIndex
from hostring.clock import VirtualClock
from hostring.domains import registrable_domain


def make_item(key: str, host: str, priority: int, seq: int, state: State = State.SCHEDULED, **kw: Any) -> Item:
    """An item with the identity fields filled in from key and host."""
    return Item(
        key=key, url=key, host=host, origin=f"https://{host}", domain=host.split(".", 1)[-1], kind=Kind.PAGE,
        depth=1, priority=priority, seq=seq, state=state, **kw,
    )  # fmt: skip


def make_entry(seq: int, key: str, frm: str, event: str, to: str, **kw: Any) -> Entry:
    """A journal line with the bookkeeping fields defaulted."""
    fields: dict[str, Any] = {"run_id": "run-1", "attempt": 0, "generation": 0, "at": 1000.0 + seq}
    fields.update(policy_version=1, reason="", evidence="")
    fields.update(kw)
    return Entry(seq=seq, key=key, from_state=frm, event=event, to_state=to, **fields)


def page(key_path: str, host: str, seq: int, state: State = State.SCHEDULED, priority: int = 0) -> Item:
    """A real-looking page item: its domain is the registrable domain of its host."""
    domain = registrable_domain(host)
    return Item(key=f"https://{host}{key_path}", url=f"https://{host}{key_path}", host=host,
                origin=f"https://{host}", domain=domain, kind=Kind.PAGE, depth=0, priority=priority, seq=seq,
                state=state)  # fmt: skip


def admit(s: Store, jseq: int, item: Item) -> int:
    """Journal admit + schedule for `item` (as the core does); returns the next free journal seq."""
    item.state = State.ADMITTED
    s.record(make_entry(jseq, item.key, "discovered", "admit", "admitted", data=item.url), item)
    item.state = State.SCHEDULED
    s.record(make_entry(jseq + 1, item.key, "admitted", "schedule", "scheduled"), item)
    return jseq + 2


def snapshot(store: Store, keys: list[str], hosts: list[str], metas: list[str]) -> dict[str, object]:
    """Every read method's answer, for comparing two stores."""
    out: dict[str, object] = {
        "journal": list(store.journal()),
        "journal_after_3": list(store.journal(3)),
        "items": list(store.items()),
        "items_sched_leased": list(store.items([State.SCHEDULED, State.LEASED])),
        "items_none": list(store.items([])),
        "scheduled_counts": store.scheduled_counts(),
        "counts_by_state": store.counts_by_state(),
        "robots": list(store.robots_records()),
        "max_seqs": store.max_seqs(),
    }
    for k in keys:
        item = out[f"get:{k}"] = store.get(k)
        out[f"history:{k}"] = store.history(k)
        if item is not None:  # the strict bound: starting from an existing item's own order excludes it
            out[f"backlog_after:{k}"] = store.backlog(item.host, item.order, 3)
            out[f"backlog_before:{k}"] = store.backlog(item.host, (item.priority, item.seq - 1), 2)
    for h in hosts:
        out[f"backlog:{h}"] = store.backlog(h, (-(10**9), -1), 1000)
    for m in metas:
        out[f"meta:{m}"] = store.get_meta(m)
    return out


# -- random op sequences -----------------------------------------------------------------------------------

KEYS = [f"https://h{i % 3}.test/p{i}" for i in range(7)]
HOSTS = ["h0.test", "h1.test", "h2.test"]
KEY_HOSTS = [HOSTS[i % 3] for i in range(len(KEYS))]
"""Each key's host: a key is a URL, so an item's host never changes (ports.Store.record)."""
METAS = ["run_id", "scope", "seq.hi"]
small_text = st.text(max_size=6)
finite = st.floats(allow_nan=False, width=64)

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("record"),
            st.integers(0, len(KEYS) - 1),
            st.integers(-2, 2),
            st.sampled_from(list(State)),
            st.booleans(),  # give the item a fresh seq
            st.fixed_dictionaries(
                {
                    "attempt": st.integers(0, 5),
                    "generation": st.integers(0, 2**63 - 1),
                    "deadline": finite,
                    "due_at": finite,
                    "status": st.integers(-(2**63), 2**63 - 1),
                    "reason": small_text,
                    "etag": small_text,
                    "digest": small_text,
                    "kind": st.sampled_from(list(Kind)),
                }
            ),
            small_text,  # journal data
        ),
        st.tuples(st.just("note"), st.integers(0, len(KEYS) - 1), small_text),
        st.tuples(
            st.just("robots"),
            st.sampled_from(["https://h0.test", "https://h1.test", "http://h2.test:81"]),
            st.sampled_from(HOSTS),
            st.dictionaries(
                st.text(max_size=4),
                st.one_of(st.none(), st.booleans(), st.integers(-5, 5), finite, small_text),
                max_size=3,
            ),
        ),
        st.tuples(st.just("meta"), st.sampled_from(METAS), small_text),
        st.tuples(st.just("flush")),
        st.tuples(
            st.just("backlog"),
            st.sampled_from(HOSTS),
            st.integers(0, len(KEYS) - 1),
            st.integers(-1, 1),
            st.integers(-1, 1),
            st.integers(0, 8),
        ),
        st.tuples(st.just("get"), st.integers(0, len(KEYS) - 1)),
    ),
    max_size=40,
)


class Driver:
    """Applies one op sequence to a store, numbering journal lines and item seqs as the core would."""

    def __init__(self) -> None:
        self.jseq = 0
        self.iseq = 0
        self.item_seq: dict[str, int] = {}
        self.order: dict[str, tuple[int, int]] = {}

    def apply(self, store: Store, op: tuple[Any, ...]) -> object:
        kind = op[0]
        if kind == "record":
            _, k, prio, state, reseq, extra, data = op
            key, host = KEYS[k], KEY_HOSTS[k]
            # A key's first line admits it, as in the core: a lease row is only ever written behind (SqliteStore)
            # for an item whose row was written before, so it keeps that row's place in first-write order.
            event = "lease" if key in self.item_seq else "schedule"
            if reseq or key not in self.item_seq:
                self.iseq += 1
                self.item_seq[key] = self.iseq
            self.jseq += 1
            it = make_item(
                key, host, prio, self.item_seq[key], state, **{n: v for n, v in extra.items() if n != "kind"}
            )
            it.kind = extra["kind"]
            self.order[key] = it.order
            store.record(make_entry(self.jseq, key, "scheduled", event, state.value, data=data), it)
        elif kind == "note":
            self.jseq += 1
            store.note(make_entry(self.jseq, KEYS[op[1]], "leased", "late_evidence", "leased", evidence=op[2]))
        elif kind == "robots":
            store.save_robots(op[1], op[2], op[3])
        elif kind == "meta":
            store.set_meta(op[1], op[2])
        elif kind == "flush":
            store.flush()
        elif kind == "backlog":  # `after` lands on, just below or just above a known item's order
            _, host, k, dp, ds, limit = op
            prio, seq = self.order.get(KEYS[k], (0, 0))
            return store.backlog(host, (prio + dp, seq + ds), limit)
        elif kind == "get":
            return store.get(KEYS[op[1]])
        return None


def lease_until(f: Frontier, clock: VirtualClock, key: str, digest: Callable[[str], str], step: float = 1.0) -> Item:
    """Lease until `key` is out, advancing the clock by `step` between rounds. On the way robots.txt files answer
    404 and other pages a body named `digest(key)` the first time, 304 on a revisit."""
    for _ in range(100_000):
        wanted = None
        for it in f.lease("w", 10):
            if it.key == key:
                wanted = it
            elif it.kind is Kind.ROBOTS:
                f.complete(it.key, it.generation, Outcome(status=404))
            else:
                done = Outcome(status=304) if it.checked_at else Outcome(status=200, body_digest=digest(it.key))
                f.complete(it.key, it.generation, done)
        if wanted is not None:
            return wanted
        clock.advance(step)
    raise AssertionError(f"{key} was never leased")


def prime(index: RedisBodyIndex, claims: list[Claim]) -> None:
    """Register `claims` as a CompleteBatch slice does (on the index's own thread), then answer claims from them."""
    index.use_primed(index.prime_later(claims).result(10))
