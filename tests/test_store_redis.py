"""What only the Redis store has, against real Redis processes (a single server and a three-shard Cluster):
fencing by ring epoch, one slot per domain, the handoff helpers, exact orders, clients and scripts. The contract
it shares with the other backends (reopen and the comparisons with MemoryStore included) is in
test_store_contract.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from frontier_node.core.ports import BodyClaim
from frontier_node.core.records import Item, Link
from frontier_node.core.states import State
from frontier_node.store.redis import FencedOut, RedisStore, flight
from frontier_node.store.redis.bodies import RedisBodyIndex
from frontier_node.store.redis.codec import pack_row
from frontier_node.store.redis.handoff import Batch
from frontier_node.store.redis.mail import row_link
from tests.store_helpers import admit, make_entry, page, prime

Client = redis.Redis | RedisCluster
MakeStore = Callable[..., RedisStore]


@pytest.fixture(params=["single", "cluster"])
def client(request: pytest.FixtureRequest) -> Client:
    """A client of the single Redis or of the three-shard Cluster; the test's namespace is cleaned afterwards."""
    name = "redis_client" if request.param == "single" else "redis_cluster_client"
    c: Client = request.getfixturevalue(name)
    return c


@pytest.fixture
def make_store(client: Client, redis_namespace: str) -> Iterator[MakeStore]:
    """Open RedisStores on the test's namespace; closed at the end of the test."""
    opened: list[RedisStore] = []

    def make(node_id: str = "n1", epoch: Callable[[], int] | int = 1, namespace: str = redis_namespace) -> RedisStore:
        s = RedisStore(client, node_id=node_id, epoch=epoch, namespace=namespace)
        opened.append(s)
        return s

    yield make
    for s in opened:
        with contextlib.suppress(FencedOut):
            s.close()


# -- fencing -----------------------------------------------------------------------------------------------


def test_a_node_that_lost_a_domain_cannot_write_to_it(make_store: MakeStore, client: Client) -> None:
    epoch_a = [1]
    a = make_store("node-a", lambda: epoch_a[0])
    b = make_store("node-b", 2)
    assert a.claim("moved.com", 1) == ("", -1)
    assert a.claim("kept.com", 1) == ("", -1)
    jseq = admit(a, 1, page("/1", "www.moved.com", 1))
    jseq = admit(a, jseq, page("/1", "www.kept.com", 2))
    a.flush()
    assert a.fence("moved.com") == ("node-a", 1)

    assert b.claim("moved.com", 2) == ("node-a", 1)  # the ring moved the domain at epoch 2
    jseq = admit(a, jseq, page("/2", "www.moved.com", 3))  # A does not know yet
    jseq = admit(a, jseq, page("/2", "www.kept.com", 4))
    a.save_robots("https://www.moved.com", "www.moved.com", {"status": 200})
    before = {k: client.dump(k) for k in a.domain_keys("moved.com")}
    with pytest.raises(FencedOut) as refused:
        a.flush()
    err = refused.value
    assert (err.domain, err.writer_epoch, err.fence_epoch, err.owner, err.others) == ("moved.com", 1, 2, "node-b", ())
    assert {k: client.dump(k) for k in a.domain_keys("moved.com")} == before  # nothing of A's batch landed
    assert a.get("https://www.moved.com/2") is None
    assert [e.seq for e in b.history("https://www.moved.com/2")] == []
    got = a.get("https://www.kept.com/2")  # the other domain's batch did land
    assert got is not None and got.state is State.SCHEDULED
    assert [e.seq for e in a.history("https://www.kept.com/2")] == [7, 8]
    a.flush()  # the refused batch is dropped, not retried forever

    admit(b, 100, page("/3", "www.moved.com", 50))
    b.flush()  # the new owner writes fine
    assert [i.key for i in b.backlog("www.moved.com", (-1, 0), 10)] == [
        "https://www.moved.com/1",
        "https://www.moved.com/3",
    ]
    assert "moved.com" not in a.held_domains() and "moved.com" in b.held_domains()
    assert {i.key for i in a.items()} == {"https://www.kept.com/1", "https://www.kept.com/2"}

    # an old epoch stays locked out; an equal epoch with another owner too; a newer epoch takes the fence
    epoch_a[0] = 2
    admit(a, 200, page("/4", "www.moved.com", 60))
    with pytest.raises(FencedOut, match="owner 'node-b' at epoch 2, writer epoch 2"):
        a.flush()
    with pytest.raises(FencedOut):
        a.claim("moved.com", 1)
    epoch_a[0] = 3
    admit(a, 300, page("/5", "www.moved.com", 70))
    a.flush()
    assert a.fence("moved.com") == ("node-a", 3)
    admit(b, 400, page("/6", "www.moved.com", 80))
    with pytest.raises(FencedOut):
        b.flush()


@pytest.mark.parametrize("part_rows", [flight.PART_ROWS, 1])
def test_one_flush_refused_for_several_domains_names_them_all(
    make_store: MakeStore, part_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With part_rows 1 each domain is a write_all call of its own: refusals of two parts are named together."""
    monkeypatch.setattr(flight, "PART_ROWS", part_rows)
    a, b = make_store("node-a", 1), make_store("node-b", 5)
    for d in ("one.org", "two.org"):
        b.claim(d, 5)
    jseq = 1
    for host in ("www.one.org", "www.two.org", "www.three.org"):
        jseq = admit(a, jseq, page("/", host, jseq))
    with pytest.raises(FencedOut) as refused:
        a.flush()
    assert sorted([refused.value.domain, *(o.domain for o in refused.value.others)]) == ["one.org", "two.org"]
    assert [i.key for i in a.items()] == ["https://www.three.org/"]


def test_keys_of_a_domain_share_one_cluster_slot(make_store: MakeStore, client: Client) -> None:
    s = make_store("node-a", 1)
    jseq = 1
    for i, host in enumerate(["example.co.uk", "www.example.co.uk", "img.example.co.uk", "other.net"]):
        jseq = admit(s, jseq, page(f"/{i}", host, i + 1))
    s.save_robots("https://www.example.co.uk", "www.example.co.uk", {"status": 404})
    s.note(make_entry(jseq, "https://img.example.co.uk/0", "scheduled", "late_evidence", "scheduled"))
    s.flush()
    keys = s.domain_keys("example.co.uk")
    assert sorted(k.split("}:", 1)[1] for k in keys) == [
        "fence", "items", "j:node-a", "meta", "q:example.co.uk", "q:img.example.co.uk", "q:www.example.co.uk",
        "robots", "sched", "states", "writers",
    ]  # fmt: skip
    if isinstance(client, RedisCluster):
        slots = {int(client.cluster_keyslot(k)) for k in keys}
        assert slots == {_keyslot(k) for k in keys}
    else:
        slots = {_keyslot(k) for k in keys}
    assert len(slots) == 1
    assert slots != {_keyslot(k) for k in s.domain_keys("other.net")}


def _keyslot(key: str) -> int:
    """CRC16 hash slot of a key with its hash tag, as Redis Cluster computes it (the single server has no slots)."""
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


# -- handoff ----------------------------------------------------------------------------------------


def test_adopt_domain_hands_rows_and_robots_to_the_new_owner(make_store: MakeStore) -> None:
    a, b = make_store("node-a", 1), make_store("node-b", 2)
    jseq = 1
    for i in range(5):
        jseq = admit(a, jseq, page(f"/{i}", "www.moving.io", i + 1, priority=-i))
    jseq = admit(a, jseq, page("/", "www.staying.io", 9))
    a.save_robots("https://www.moving.io", "www.moving.io", {"status": 200, "delay": 2.5})
    a.flush()
    adopted = b.adopt_domain("moving.io", 2)
    assert (adopted.previous_owner, adopted.previous_epoch, adopted.epoch) == ("node-a", 1, 2)
    assert [i.key for i in adopted.items] == [f"https://www.moving.io/{i}" for i in range(5)]
    assert all(i.state is State.SCHEDULED for i in adopted.items)
    assert adopted.robots == [("https://www.moving.io", "www.moving.io", {"status": 200, "delay": 2.5})]
    assert [i.key for i in b.backlog("www.moving.io", (-(2**62), -1), 2)] == [
        "https://www.moving.io/4",
        "https://www.moving.io/3",
    ]
    # the new owner's lines continue the key's history after the old owner's, whatever their seqs
    it = adopted.items[0]
    it.state = State.LEASED
    b.record(make_entry(3, it.key, "scheduled", "lease", "leased"), it)
    b.flush()
    assert [(e.seq, e.event) for e in b.history(it.key)] == [(1, "admit"), (2, "schedule"), (3, "lease")]
    assert [e.seq for e in b.journal()] == [3]
    assert b.counts_by_state() == {"scheduled": 4, "leased": 1}
    assert a.counts_by_state() == {"scheduled": 1}
    assert list(a.robots_records()) == []
    assert [e.seq for e in a.journal()] == list(range(1, jseq))  # the old owner's journal is its own history
    admit(a, jseq, page("/late", "www.moving.io", 99))
    with pytest.raises(FencedOut):
        a.flush()


def test_export_import_round_trip(make_store: MakeStore, redis_namespace: str) -> None:
    a = make_store("node-a", 1)
    jseq = 1
    for i in range(6):
        it = page(f"/{i}", "shop.example.net" if i % 2 else "www.example.net", i + 1, priority=i % 2)
        jseq = admit(a, jseq, it)
    it.state, it.attempt = State.LEASED, 1
    a.record(make_entry(jseq, it.key, "scheduled", "lease", "leased"), it)
    a.save_robots("https://www.example.net", "www.example.net", {"status": 404})
    a.save_robots("https://shop.example.net", "shop.example.net", {"status": 200, "rules": []})
    a.flush()
    data = a.export_domain("example.net")
    assert data["fence"] == {"owner": "node-a", "epoch": 1}
    assert len(data["items"]) == 6 and len(data["journal"]) == jseq and len(data["robots"]) == 2
    assert len(a.export_domain("example.net", journal_tail=3)["journal"]) == 3

    other = make_store("node-z", 7, namespace=redis_namespace + "-copy")
    other.import_domain("example.net", data, 7)
    assert other.fence("example.net") == ("node-z", 7)
    copy = other.export_domain("example.net")
    assert copy["items"] == data["items"] and copy["robots"] == data["robots"]
    assert copy["journal"] == data["journal"] and copy["fence"] == {"owner": "node-z", "epoch": 7}
    assert list(other.items()) == list(a.items())
    assert list(other.robots_records()) == list(a.robots_records())
    assert other.scheduled_counts() == a.scheduled_counts() == {"www.example.net": 3, "shop.example.net": 2}
    assert other.history(it.key) == a.history(it.key)
    assert other.backlog("www.example.net", (-1, 0), 10) == a.backlog("www.example.net", (-1, 0), 10)
    with pytest.raises(FencedOut):
        make_store("node-y", 3, namespace=redis_namespace + "-copy").import_domain("example.net", data, 3)


def _drop(s: RedisStore) -> None:
    """Delete the keys of a store opened outside the make_store fixture."""
    for key in list(s.client.scan_iter(match=s.namespace + ":*")):
        s.client.delete(key)


# -- odds and ends -------------------------------------------------------------------------------------------


def test_orders_are_exact_across_the_whole_priority_and_seq_range(make_store: MakeStore) -> None:
    s = make_store()
    prios = [-(2**63), -(2**31) - 1, -1, 0, 1, 2**31, 2**53 + 1, 2**63 - 1]
    jseq = 1
    for n, p in enumerate(prios):
        for seq in (2**53 + 1, 2**53, 1, 0):
            it = page(f"/{n}/{seq}", "www.range.dev", seq, priority=p)
            it.state = State.SCHEDULED
            s.record(make_entry(jseq, it.key, "admitted", "schedule", "scheduled"), it)
            jseq += 1
    got = [(i.priority, i.seq) for i in s.backlog("www.range.dev", (-(2**64), 0), 1 << 62)]
    assert got == sorted((p, q) for p in prios for q in (2**53 + 1, 2**53, 1, 0))
    assert [(i.priority, i.seq) for i in s.backlog("www.range.dev", (0, 2**53), 3)] == [(0, 2**53 + 1), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match="out of range"):
        s.record(make_entry(jseq, "https://www.range.dev/x", "a", "b", "c"), page("/x", "www.range.dev", -1))


def test_decoded_responses_and_from_url(redis_url: str, redis_namespace: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        s = RedisStore(client, node_id="n1", epoch=1, namespace=redis_namespace)
        admit(s, 1, page("/", "www.decoded.dev", 1))
        s.save_robots("https://www.decoded.dev", "www.decoded.dev", {"status": 404})
        s.set_meta("run_id", "x")
        s.close()
        t = RedisStore.from_url(redis_url, node_id="n1", epoch=1, namespace=redis_namespace)
        assert isinstance(t.client, redis.Redis)
        assert [e.seq for e in t.journal()] == [1, 2] and t.get_meta("run_id") == "x"
        assert list(t.robots_records()) == [("https://www.decoded.dev", "www.decoded.dev", {"status": 404})]
        t.close()
    finally:
        _drop(RedisStore(client, node_id="n1", epoch=1, namespace=redis_namespace))
        client.close()


def test_from_url_names_the_connections_after_the_node(redis_url: str, redis_namespace: str) -> None:
    """CLIENT LIST says which node holds a connection, even for an id CLIENT SETNAME would refuse as it is."""
    s = RedisStore.from_url(redis_url, node_id="node 1\u00e9", epoch=1, namespace=redis_namespace)
    admin = redis.Redis.from_url(redis_url)
    try:
        admit(s, 1, page("/", "www.named.dev", 1))
        assert "hostring-node:node_1_" in {c["name"] for c in admin.client_list()}
    finally:
        s.close()
        _drop(RedisStore(admin, node_id="n1", epoch=1, namespace=redis_namespace))
        admin.close()


def test_from_url_picks_the_cluster_client(redis_cluster_url: str, redis_namespace: str) -> None:
    s = RedisStore.from_url(redis_cluster_url, node_id="n1", epoch=1, namespace=redis_namespace)
    try:
        assert isinstance(s.client, RedisCluster)
        admit(s, 1, page("/", "www.cluster.dev", 1))
        assert [i.key for i in s.backlog("www.cluster.dev", (-1, 0), 5)] == ["https://www.cluster.dev/"]
    finally:
        _drop(s)
        s.close()


def test_scripts_come_back_after_script_flush(make_store: MakeStore, client: Client) -> None:
    s = make_store()
    admit(s, 1, page("/", "www.flushed.dev", 1))
    s.flush()
    client.script_flush()
    admit(s, 3, page("/2", "www.flushed.dev", 2))
    s.flush()
    assert [i.key for i in s.backlog("www.flushed.dev", (-1, 0), 5)] == [
        "https://www.flushed.dev/",
        "https://www.flushed.dev/2",
    ]
    got = s.get("https://www.flushed.dev/2")
    assert got is not None and got.seq == 2


def test_a_replayed_write_changes_nothing(make_store: MakeStore) -> None:
    """The write script is idempotent, which is what makes resending a batch after a lost answer safe."""
    s = make_store()
    jseq = 1
    for i in range(4):
        jseq = admit(s, jseq, page(f"/{i}", "www.again.dev", i + 1))
    batch = s._batches["again.dev"]
    call = s._write_call("again.dev", batch, 1, s.node_id)
    s.flush()
    before = (s.counts_by_state(), s.scheduled_counts(), list(s.journal()), list(s.items()), s.max_seqs())
    assert int(s._scripts.run_pipelined("write", {"again.dev": call})["again.dev"][0]) == 1
    assert (s.counts_by_state(), s.scheduled_counts(), list(s.journal()), list(s.items()), s.max_seqs()) == before


def test_forwarded_links_keep_their_client_payload(make_store: MakeStore) -> None:
    """A link left in another owner's inbox arrives with its payload (a Scrapy request rides there); a row written
    without one, as before payloads travelled, still reads back."""
    store = make_store()
    sent = [
        Link("http://a.example/x", source_key="http://b.example/", depth=2, payload=b"\x00scrapy\xff"),
        Link("http://a.example/y", depth=1),
    ]
    store.forward(sent)
    store.flush()
    mail = store.mail.read(["a.example"])
    rows = [row for _id, message in mail["a.example"] for row in message["l"]]
    assert [row_link(r) for r in rows] == sent
    assert row_link(["http://a.example/z", "", "", 1, 0, 0, False]).payload == b""


# -- round trips -------------------------------------------------------------------------------------------


def _calls(client: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}


def test_leases_and_completions_leave_the_domain_meta_alone(make_store: MakeStore, client: Client) -> None:
    """A flush writes a domain's meta only when its highest item seq grows; max_seqs still finds the highest
    journal seq (the journals' last lines), and keeps a jmax that a store written by an older version holds."""
    s = make_store()
    it = page("/1", "www.meta.com", 5)
    jseq = admit(s, 1, it)
    s.flush()
    (meta,) = [k for k in s.domain_keys("meta.com") if k.endswith(":meta")]
    assert client.hgetall(meta) == {b"imax": f"{5:020d}".encode()}
    before = client.dump(meta)
    it.state, it.attempt, it.generation = State.LEASED, 1, 1
    s.record(make_entry(jseq, it.key, "scheduled", "lease", "leased"), it)
    it.state = State.FETCHED
    s.record(make_entry(jseq + 1, it.key, "leased", "complete", "fetched"), it)
    s.flush()
    assert client.dump(meta) == before
    assert s.max_seqs() == (jseq + 1, 5)
    assert make_store("n1").max_seqs() == (jseq + 1, 5)  # reopened
    client.hset(meta, "jmax", f"{999:020d}")  # as versions that kept jmax there left it
    assert s.max_seqs() == (999, 5)


def test_a_flush_of_many_domains_on_one_server_is_one_script_call(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    s = RedisStore(redis_client, node_id="n1", epoch=1, namespace=redis_namespace)
    jseq = 1
    for i in range(40):
        jseq = admit(s, jseq, page("/", f"www.site{i}.org", i + 1))
    before = _calls(redis_client)
    s.flush()
    after = _calls(redis_client)
    assert after["evalsha"] - before.get("evalsha", 0) == 1
    assert [i.key for i in s.backlog("www.site7.org", (-(2**63), -1), 10)] == ["https://www.site7.org/"]
    assert s.counts_by_state() == {"scheduled": 40}
    assert sum(s.scheduled_counts().values()) == 40


def test_a_flush_with_text_outside_ascii_lands_string_for_string(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    """write_all frames the flush's strings by byte length: a key outside ASCII between ASCII ones lands exactly
    as pack_row forms it, and every row, line and backlog entry reads back."""
    s = RedisStore(redis_client, node_id="n1", epoch=1, namespace=redis_namespace)
    items = [page("/a", "www.plain.org", 1), page("/ç/été", "www.other.de", 2), page("/z", "zz.plain.org", 3)]
    jseq = 1
    for it in items:
        jseq = admit(s, jseq, it)
    s.flush()
    reopened = RedisStore(redis_client, node_id="n1", epoch=1, namespace=redis_namespace)
    assert [reopened.get(it.key) for it in items] == items
    assert [e.key for e in reopened.journal()] == [it.key for it in items for _ in range(2)]
    assert [i.key for i in reopened.backlog("www.other.de", (-(2**63), -1), 10)] == ["https://www.other.de/ç/été"]
    assert reopened.scheduled_counts() == {"www.plain.org": 1, "www.other.de": 1, "zz.plain.org": 1}
    stored = redis_client.hget(f"{redis_namespace}:{{d:other.de}}:items", items[1].key)
    assert stored is not None and stored.decode() == pack_row(items[1], 3)


def test_primed_body_claims_answer_as_claims_one_by_one(client: Client, redis_namespace: str) -> None:
    claims = [
        ("sha256:aa", 0x1111_2222_3333_4444, "https://a.org/1"),
        ("sha256:bb", 0x1111_2222_3333_4445, "https://b.org/1"),  # near the first
        ("sha256:aa", 0x7777_8888_9999_0000, "https://c.org/1"),  # the first's exact body
        ("sha256:cc", 0, "https://d.org/1"),
        ("sha256:aa", 0x1111_2222_3333_4444, "https://a.org/1"),  # a key claiming its own body again
    ]
    one_by_one = RedisBodyIndex(client, redis_namespace + "-seq")
    expected = [one_by_one.claim(*c) for c in claims]
    primed = RedisBodyIndex(client, redis_namespace)
    prime(primed, claims)
    if isinstance(client, redis.Redis):
        before = _calls(client)
        assert [primed.claim(*c) for c in claims] == expected
        assert sum(_calls(client).values()) - sum(before.values()) == 1  # the claims sent nothing (INFO counts)
    else:
        assert [primed.claim(*c) for c in claims] == expected
    assert [e.first for e in expected] == [None, None, "https://a.org/1", None, None]
    assert [e.near for e in expected] == [False, True, False, False, True]  # the last: b.org is near


# -- the write script against the previous version ---------------------------------------------------------


def _flush(s: RedisStore) -> None:
    """Flush; a domain another node fenced is refused while the rest lands."""
    with contextlib.suppress(FencedOut):
        s.flush()


def _write_all_scenario(s: RedisStore) -> None:
    """Flushes that take every branch of write_all: see tests/data/README.md."""
    jseq = 1
    hosts = ["www.one.org", "www.many.org", "two.many.org", "www.moved.org", "www.redo.org"]
    items = {h: [page(f"/{i}", h, 0) for i in range(3)] for h in hosts}
    seq = 0
    for h in hosts:  # many rows and many lines per domain, every row new
        for it in items[h]:
            seq += 1
            it.seq = seq
            jseq = admit(s, jseq, it)
    s.save_robots("https://www.one.org", "www.one.org", {"verdict": "allow_all", "n": 1})
    _flush(s)

    def move(it: Item, state: State, event: str, **changes: object) -> None:
        nonlocal jseq
        before = it.state
        for name, value in changes.items():
            setattr(it, name, value)
        it.state = state
        s.record(make_entry(jseq, it.key, before.value, event, state.value, attempt=1, generation=1), it)
        jseq += 1

    # one row per domain: scheduled -> leased (a backlog entry and a counter out, a counter in)
    for h in ("www.one.org", "www.moved.org", "www.redo.org"):
        move(items[h][0], State.LEASED, "lease", generation=1, deadline=2000.5)
    # many rows of one domain over two hosts
    move(items["www.many.org"][0], State.LEASED, "lease")
    move(items["two.many.org"][1], State.LEASED, "lease")
    _flush(s)
    # leased -> fetched (the leased counter reaches zero), a note beside a row, a robots record replaced
    move(items["www.one.org"][0], State.FETCHED, "complete", status=200, digest="sha256:x", simhash=7,
         checked_at=2001.25, stored_at=2001.25)  # fmt: skip
    s.note(make_entry(jseq, items["www.one.org"][1].key, "scheduled", "note", "scheduled"))
    jseq += 1
    s.save_robots("https://www.one.org", "www.one.org", {"verdict": "allow_all", "n": 2})
    # scheduled -> scheduled at a new priority: out of the backlog and back in, no counter changes
    move(items["www.redo.org"][1], State.SCHEDULED, "reschedule", priority=-5)
    # one row moving between hosts of its domain (out of one host's backlog, into the other's)
    move(items["www.moved.org"][1], State.SCHEDULED, "reschedule", host="moved.org", priority=3)
    # a row with no change of state, not in a backlog
    move(items["www.many.org"][0], State.LEASED, "renew", deadline=2100.0)
    # a line with no row in a domain of its own
    s.note(make_entry(jseq, "https://www.noted.org/x", "fetched", "note", "fetched"))
    jseq += 1
    _flush(s)
    # fetched -> scheduled (a revisit: into the backlog only), then everything settled on a newer epoch
    move(items["www.one.org"][0], State.SCHEDULED, "revisit")
    for it in items["www.many.org"][1:]:
        move(it, State.FAILED, "fail", reason="gone")
    s.save_robots("https://www.robots-only.org", "www.robots-only.org", {"verdict": "disallow_all"})
    _flush(s)


@pytest.mark.parametrize("refused", [False, True])
def test_write_all_writes_what_its_previous_version_wrote(
    redis_client: redis.Redis, redis_namespace: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key the current write_all writes DUMPs byte for byte as the one the previous version (commit 82e0a1d,
    tests/data) wrote: old and new nodes share a Redis during a rolling upgrade."""
    monkeypatch.setattr(time, "time_ns", lambda: 10**18)  # robots records' first-save ordinals, the same twice
    previous = (Path(__file__).parent / "data" / "redis_write_all_82e0a1d.lua").read_text()
    previous_sha = redis_client.script_load(previous)
    dumps: list[dict[str, bytes]] = []
    epochs = [1]
    for version in ("previous", "current"):
        ns = f"{redis_namespace}-{version}"
        epochs.append(1)
        s = RedisStore(redis_client, node_id="n1", epoch=lambda: epochs[-1], namespace=ns)
        if version == "previous":
            s._scripts.shas["write_all"] = previous_sha
        if refused:  # another node holds one domain at a newer epoch: its batch is refused, the rest land
            RedisStore(redis_client, node_id="n2", epoch=5, namespace=ns).claim("moved.org", 5)
        _write_all_scenario(s)
        epochs.append(2)
        s.record(make_entry(900, "https://www.one.org/new", "admitted", "schedule", "scheduled"),
                 page("/new", "www.one.org", 90))  # fmt: skip
        s.flush()  # a new row alone in its domain's batch, and a fence moved to the newer epoch
        names = sorted(k.decode().removeprefix(ns) for k in redis_client.scan_iter(match=f"{ns}:*"))
        dumps.append({n: redis_client.dump(ns + n) or b"" for n in names if not n.endswith(":instance")})
    previous_dump, current_dump = dumps
    assert sorted(previous_dump) == sorted(current_dump)
    assert len(previous_dump) > 30
    for name, value in previous_dump.items():
        assert current_dump[name] == value, name


@pytest.mark.parametrize("refused", [False, True])
def test_a_flush_sent_in_parts_writes_what_one_call_writes(
    redis_client: redis.Redis, redis_namespace: str, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush cut into several write_all calls (flight.parts) leaves every key as one call for the whole flush
    does, and a domain refused in any part is named while the other parts land."""
    monkeypatch.setattr(time, "time_ns", lambda: 10**18)  # robots records' first-save ordinals, the same twice
    dumps: dict[int, dict[str, bytes]] = {}
    for part_rows in (10**9, 3):
        monkeypatch.setattr(flight, "PART_ROWS", part_rows)
        ns = f"{redis_namespace}-{part_rows}"
        s = RedisStore(redis_client, node_id="n1", epoch=1, namespace=ns)
        if refused:  # another node holds one domain at a newer epoch: its batch is refused, the rest land
            RedisStore(redis_client, node_id="n2", epoch=5, namespace=ns).claim("moved.org", 5)
        before = _calls(redis_client).get("evalsha", 0)
        _write_all_scenario(s)
        calls = _calls(redis_client)["evalsha"] - before
        assert calls == 4 if part_rows == 10**9 else calls > 4  # the scenario's 4 flushes, one call each or more
        names = sorted(k.decode().removeprefix(ns) for k in redis_client.scan_iter(match=f"{ns}:*"))
        dumps[part_rows] = {n: redis_client.dump(ns + n) or b"" for n in names if not n.endswith(":instance")}
    whole, in_parts = dumps.values()
    assert len(whole) > 30 and sorted(whole) == sorted(in_parts)
    for name, value in whole.items():
        assert in_parts[name] == value, name


def test_parts_keep_domains_whole_and_in_order() -> None:
    def batch(rows: int) -> Batch:
        b = Batch()
        for n in range(rows):
            b.rows[f"k{n}"] = (n, ())
            b.add_line(make_entry(n + 1, f"k{n}", "admitted", "schedule", "scheduled"))
        return b

    batches = {f"d{n}.org": batch(n % 4) for n in range(200)}  # 0 to 6 rows and lines a domain
    cut = flight.parts(batches)
    assert [d for part in cut for d in part] == list(batches)
    sizes = [sum(len(b.rows) + len(b.entries) for b in part.values()) for part in cut]
    assert len(cut) == 2 and all(flight.PART_ROWS <= size < flight.PART_ROWS + 7 for size in sizes[:-1])
    assert len(flight.parts({"one.org": batch(1000)})) == 1
    small = {d: b for d, b in list(batches.items())[:10]}
    assert flight.parts(small) == [small]
    tail = {**{f"a{n}.org": batch(3) for n in range(43)}, "z.org": batch(1)}  # 258 then 2: the tail joins
    assert len(flight.parts(tail)) == 1


@pytest.mark.parametrize("version", [(6, 2, 14), (7, 0, 0)])
def test_the_claim_script_of_each_server_version_registers_and_answers_alike(
    redis_client: redis.Redis, redis_namespace: str, version: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SET NX GET (Redis >= 7.0) and GET then SET (older) leave the same keys and answer the same batch of claims:
    first wins, a key's own body is no duplicate of itself, a near body is seen in any band it shares."""
    from frontier_node.store.redis import bodies

    if bodies.server_version(redis_client) < version:
        pytest.skip(f"this Redis predates {version}: it refuses SET NX GET")
    claims = [
        ("sha256:aa", 0x1111_2222_3333_4444, "https://a.org/1"),
        ("sha256:aa", 0x9999_8888_7777_6666, "https://b.org/1"),  # same digest, another key: duplicate of a.org/1
        ("sha256:aa", 0x1111_2222_3333_4444, "https://a.org/1"),  # the first key again: not its own duplicate
        ("sha256:bb", 0x1111_2222_3333_4445, "https://c.org/1"),  # one bit from a.org/1's simhash: near
        ("", 0x5555_0000_0000_0000, "https://d.org/1"),  # no digest: bands only
        ("sha256:cc", 0, "https://e.org/1"),  # no simhash: digest only
    ]
    answers, dumps = {}, {}
    for label, claimed in (("reference", (6, 2, 14)), ("version", version)):
        monkeypatch.setattr(bodies, "server_version", lambda client, v=claimed: v)
        ns = f"{redis_namespace}-{label}"
        index = bodies.RedisBodyIndex(redis_client, ns)
        prime(index, claims[:3])
        answers[label] = [index.claim(*c) for c in claims[:3]]
        prime(index, claims[3:])
        answers[label] += [index.claim(*c) for c in claims[3:]]
        names = sorted(k.decode().removeprefix(ns) for k in redis_client.scan_iter(match=f"{ns}:*"))
        dumps[label] = {n: redis_client.dump(ns + n) for n in names}
    first, second, again, near, bands_only, digest_only = answers["version"]
    assert first == BodyClaim(None, False) and second == BodyClaim("https://a.org/1", False)
    assert again == BodyClaim(None, False) and near == BodyClaim(None, True)
    assert bands_only == digest_only == BodyClaim(None, False)
    assert answers["version"] == answers["reference"]
    assert dumps["version"] == dumps["reference"] and len(dumps["version"]) == 3 + 13  # digests, band values


def test_a_user_not_allowed_info_opens_the_body_index_with_the_oldest_claim_script(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    """An ACL user without INFO cannot learn the server's version: the index still opens, with GET then SET."""
    from frontier_node.store.redis import bodies

    user = f"{redis_namespace}-no-info"
    redis_client.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-info"])
    try:
        kw = redis_client.connection_pool.connection_kwargs
        if "host" not in kw:
            pytest.skip("the test Redis is not reached over TCP: this test connects as another user by host and port")
        limited = redis.Redis(host=kw["host"], port=kw["port"], db=kw.get("db", 0), username=user, password="pw")
        with contextlib.closing(limited):
            with pytest.raises(redis.exceptions.NoPermissionError):
                limited.info("server")
            assert bodies.server_version(limited) == (0,)
            index = bodies.RedisBodyIndex(limited, redis_namespace)
            claims = [("sha256:ee", 0, "https://a.org/"), ("sha256:ee", 0, "https://b.org/")]
            prime(index, claims)  # a batch, through the claim script the index chose
            assert index.claim(*claims[0]) == BodyClaim(None, False)
            assert index.claim(*claims[1]) == BodyClaim("https://a.org/", False)
    finally:
        redis_client.acl_deluser(user)


def test_a_claims_band_keys_are_its_simhash_in_16_bit_bands(redis_client: redis.Redis, redis_namespace: str) -> None:
    """The band keys and member a claim writes, cut from the simhash's hex text, are band_key() of each 16-bit
    band: the layout nodes of every version share."""
    from frontier_node.store.redis.bodies import RedisBodyIndex

    index = RedisBodyIndex(redis_client, redis_namespace)
    for simhash in (1, 0xFFFF_0000_0000_0001, 0x0123_4567_89AB_CDEF, 2**64 - 1, 2**64 + 5):
        plan = index._plan("sha256:ab", simhash, "https://a.org/")
        assert plan is not None
        masked = simhash & (2**64 - 1)
        assert plan.bands == [index.band_key(b, (masked >> (16 * b)) & 0xFFFF) for b in range(4)]
        assert plan.member.startswith(f"{masked:016x}:") and plan.digest_key == index.digest_key("sha256:ab")
    index.claim("sha256:cd", 0x0123_4567_89AB_CDEF, "https://b.org/")
    own = hashlib.blake2b(b"https://b.org/", digest_size=4).hexdigest()
    for band, value in enumerate((0xCDEF, 0x89AB, 0x4567, 0x0123)):
        assert redis_client.smembers(f"{redis_namespace}:{{s:{band}:{value:04x}}}") == {
            f"0123456789abcdef:{own}".encode()
        }
    no_bands = index._plan("sha256:ab", 0, "https://a.org/")
    assert no_bands is not None and no_bands.member == "" and no_bands.bands == ["", "", "", ""]
