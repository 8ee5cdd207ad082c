"""The line a Redis store's flushes and a body index's claims travel on (store/redis/line.py), on a real redis-server:
- a flush begun with none out is sent by the thread that begins it; one begun while another is out is sent by the
  line's thread once that one is answered, not before, and Redis holds both in order;
- a held connection the server closed between flushes is not written to: the flush goes through the pipeline and
  lands;
- a flush that Redis refuses mid-send (its connection closed under it) answers that error to its flight, the line
  goes on, and the writes land with the next flush on the line;
- claims answered NOSCRIPT (a server whose scripts were flushed) are registered again and answer as before.
Flight order, halting and putting writes back are in test_commit_pipeline.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from frontier_node.core.states import State
from frontier_node.store.redis import RedisStore
from frontier_node.store.redis.bodies import RedisBodyIndex
from frontier_node.store.redis.flight import Flight
from hostring_testing.redis_server import RedisServer
from tests.store_helpers import admit, make_entry, page, prime
from tests.test_commit_pipeline import held_back


def senders_of(store: RedisStore) -> list[str]:
    """Flush what is buffered through the store's line (the first flush goes through the pipeline; the line then holds
    a connection), then spy on that connection: the names of the threads that write on it from now on."""
    flight = store.begin_flush()
    assert isinstance(flight, Flight)
    flight.wait()
    line = store._line
    assert line is not None and line._conn is not None, "no connection held after a flush"
    conn, names = line._conn, []
    send = conn.send_packed_command

    def spy(command: Any, check_health: bool = True) -> None:
        names.append(threading.current_thread().name)
        send(command, check_health)

    conn.send_packed_command = spy
    return names


def test_a_flush_is_sent_by_its_caller_when_none_is_out_else_by_the_line_after_the_one_out(
    srv: RedisServer,
) -> None:
    store = RedisStore.from_url(srv.url, node_id="n1", epoch=1)
    admin = redis.Redis.from_url(srv.url)
    try:
        a, b = page("/a", "h.example", 1), page("/b", "k.example", 2)
        jseq = admit(store, admit(store, 1, a), b)
        names = senders_of(store)
        a.state = State.LEASED
        store.record(make_entry(jseq, a.key, "scheduled", "lease", "leased"), a)
        admin.client_pause(5_000, all=False)
        first = store.begin_flush()
        held_back(admin)
        assert names == ["MainThread"], "a flush with none out was not sent by the thread that began it"
        b.state = State.LEASED
        store.record(make_entry(jseq + 1, b.key, "scheduled", "lease", "leased"), b)
        a.state = State.FETCHED
        store.record(make_entry(jseq + 2, a.key, "leased", "complete", "fetched"), a)
        second = store.begin_flush()
        assert isinstance(first, Flight) and isinstance(second, Flight)
        assert names == ["MainThread"], "a flush was sent while the one before was not answered"
        admin.client_unpause()
        second.wait()
        first.wait()
        assert names == ["MainThread", "redis-flush-n1"], "the flush behind was not sent by the line's thread"
        rows = {it.key: store.get(it.key) for it in (a, b)}
        assert {k: r.state if r else None for k, r in rows.items()} == {a.key: State.FETCHED, b.key: State.LEASED}
        assert [e.event for e in store.history(a.key)] == ["admit", "schedule", "lease", "complete"]
    finally:
        admin.close()
        store.close()


def test_a_held_connection_the_server_closed_is_not_written_to(srv: RedisServer) -> None:
    store = RedisStore.from_url(srv.url, node_id="n1", epoch=1)
    admin = redis.Redis.from_url(srv.url)
    try:
        a = page("/a", "h.example", 1)
        jseq = admit(store, 1, a)
        names = senders_of(store)
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1  # the held connection among them
        a.state = State.LEASED
        store.record(make_entry(jseq, a.key, "scheduled", "lease", "leased"), a)
        flight = store.begin_flush()
        assert isinstance(flight, Flight)
        flight.wait()  # through the pipeline, on a fresh connection: no error
        assert names and set(names) == {"redis-flush-n1"}, "the closed connection was written to by the caller"
        row = RedisStore.from_url(srv.url, node_id="reader", epoch=1).get(a.key)
        assert row is not None and row.state is State.LEASED
    finally:
        admin.close()
        store.close()


def test_a_flush_whose_connection_redis_closes_mid_send_fails_and_lands_with_the_next(srv: RedisServer) -> None:
    """proto-max-bulk-len at its least (1 MB) and a row over it: Redis refuses the flush's argument and closes the
    connection while the flush is being sent or read. The flight answers the error (the connection's, or Redis's
    protocol error when its reply came first) and does not wedge the line; with the limit back, the next flush
    carries the writes again (the connection the server closed is not written to) and everything lands."""
    store = RedisStore.from_url(srv.url, node_id="n1", epoch=1)
    admin = redis.Redis.from_url(srv.url)
    try:
        a = page("/a", "h.example", 1)
        jseq = admit(store, 1, a)
        senders_of(store)  # a connection is held: this flush goes on it from this thread
        admin.config_set("proto-max-bulk-len", 1 << 20)
        big = page("/big", "k.example", 2)
        big.evidence = "x" * (1 << 20)
        jseq = admit(store, jseq, big)
        flight = store.begin_flush()
        assert isinstance(flight, Flight)
        with pytest.raises((redis.ConnectionError, redis.ResponseError)):
            flight.wait()
        admin.config_set("proto-max-bulk-len", 512 << 20)
        a.state = State.LEASED
        store.record(make_entry(jseq, a.key, "scheduled", "lease", "leased"), a)
        again = store.begin_flush()
        assert isinstance(again, Flight)
        again.wait()
        reader = RedisStore.from_url(srv.url, node_id="reader", epoch=1)
        row, landed = reader.get(a.key), reader.get(big.key)
        assert row is not None and row.state is State.LEASED
        assert landed is not None and landed.state is State.SCHEDULED and len(landed.evidence) == 1 << 20
        reader.close()
    finally:
        admin.close()
        store.close()


def test_claims_whose_script_redis_forgot_answer_as_before(srv: RedisServer) -> None:
    client = redis.Redis.from_url(srv.url)
    try:
        claims = [
            ("sha256:aa", 0x1111_2222_3333_4444, "https://a.org/1"),
            ("sha256:bb", 0x1111_2222_3333_4445, "https://b.org/1"),  # near the first
            ("sha256:aa", 0x7777_8888_9999_0000, "https://c.org/1"),  # the first's exact body
        ]
        index = RedisBodyIndex(client, "hr")
        prime(index, claims[:1])
        assert index.claim(*claims[0]).first is None
        client.script_flush()
        prime(index, claims[1:])
        answers = [index.claim(*c) for c in claims[1:]]
        assert [(x.first, x.near) for x in answers] == [(None, True), ("https://a.org/1", False)]
    finally:
        client.close()
