"""The membership state machine on a virtual clock: epochs, heartbeats, expiry, and Redis across a restart."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pytest
import redis

from coordinator.membership import Membership, MemoryBackend, RedisBackend
from hostring.clock import VirtualClock
from hostring.ring import Member

TIMEOUT = 10.0


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def ms(clock: VirtualClock) -> Membership:
    return Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=MemoryBackend())


def test_starts_empty_at_epoch_zero(ms: Membership) -> None:
    assert ms.epoch == 0
    assert len(ms.ring()) == 0
    assert ms.ring().owner("example.com") is None


def test_each_join_bumps_the_epoch_once(ms: Membership) -> None:
    assert ms.register("a", "h:1")
    assert ms.epoch == 1
    assert ms.register("b", "h:2", 2)
    assert ms.epoch == 2
    assert ms.ring().members == {"a": Member("a", "h:1"), "b": Member("b", "h:2", 2)}
    assert ms.ring().epoch == 2


def test_reregister_is_idempotent_but_a_new_address_or_weight_is_a_change(ms: Membership) -> None:
    ms.register("a", "h:1")
    ring = ms.ring()
    assert not ms.register("a", "h:1")
    assert ms.epoch == 1 and ms.ring() is ring
    assert ms.register("a", "h:9")
    assert ms.epoch == 2 and ms.ring().members["a"].address == "h:9"
    assert ms.register("a", "h:9", 3)
    assert ms.epoch == 3 and ms.ring().members["a"].weight == 3


def test_bad_registration_changes_nothing(ms: Membership) -> None:
    with pytest.raises(ValueError):
        ms.register("a", "h:1", 0)
    with pytest.raises(ValueError):
        ms.register("", "h:1")
    assert ms.epoch == 0


def test_heartbeat_of_unknown_node_says_register_again(ms: Membership) -> None:
    assert not ms.heartbeat("ghost")
    ms.register("a", "h:1")
    assert ms.heartbeat("a")
    assert ms.epoch == 1


def test_silent_member_expires_after_the_timeout_and_heartbeats_keep_it(ms: Membership, clock: VirtualClock) -> None:
    ms.register("a", "h:1")
    ms.register("b", "h:2")
    clock.advance(6)
    assert ms.heartbeat("a")
    clock.advance(TIMEOUT - 6)
    assert ms.expire() == []  # b is exactly at the timeout: not older than it yet
    clock.advance(0.5)
    assert ms.expire() == ["b"]
    assert ms.epoch == 3 and set(ms.ring().members) == {"a"}
    assert not ms.heartbeat("b")
    clock.advance(TIMEOUT)
    assert ms.expire() == ["a"]
    assert ms.epoch == 4 and len(ms.ring()) == 0


def test_many_expiries_are_one_epoch(ms: Membership, clock: VirtualClock) -> None:
    for n in "abcd":
        ms.register(n, f"{n}:1")
    clock.advance(5)
    ms.heartbeat("d")
    clock.advance(TIMEOUT)
    assert ms.expire() == ["a", "b", "c"]
    assert ms.epoch == 5
    assert ms.expire() == []
    assert ms.epoch == 5


def test_leave(ms: Membership) -> None:
    ms.register("a", "h:1")
    ms.register("b", "h:2")
    assert ms.leave("a")
    assert ms.epoch == 3 and set(ms.ring().members) == {"b"}
    assert not ms.leave("a")
    assert ms.epoch == 3


def test_register_refreshes_liveness(ms: Membership, clock: VirtualClock) -> None:
    ms.register("a", "h:1")
    clock.advance(TIMEOUT - 1)
    assert not ms.register("a", "h:1")
    clock.advance(5)
    assert ms.expire() == []


def test_health_is_half_the_timeout(ms: Membership, clock: VirtualClock) -> None:
    ms.register("a", "h:1")
    ms.register("b", "h:2")
    clock.advance(TIMEOUT / 2 + 1)
    ms.heartbeat("a")
    status = {s.member.node_id: s for s in ms.statuses()}
    assert status["a"].healthy and not status["b"].healthy
    assert status["a"].last_seen == clock.now()


def test_epochs_continue_above_what_clients_have_seen(ms: Membership) -> None:
    ms.observe_epoch(41)
    assert ms.epoch == 0, "observing alone changes nothing"
    ms.register("a", "h:1", known_epoch=40)
    assert ms.epoch == 42
    ms.register("b", "h:1", known_epoch=7)
    assert ms.epoch == 43


def test_a_stalled_coordinator_grants_grace_instead_of_expiring_everyone(clock: VirtualClock) -> None:
    ms = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=MemoryBackend(), stall_after_s=TIMEOUT / 2)
    ms.register("a", "h:1")
    for _ in range(3):
        clock.advance(1)
        assert ms.expire() == []
    clock.advance(60)  # nothing checked for a minute: the coordinator, not the node, was away
    assert ms.expire() == []
    expired: list[str] = []
    for _ in range(int(TIMEOUT) + 1):  # regular checks again, and still silent: now it goes
        clock.advance(1)
        expired += ms.expire()
    assert expired == ["a"]
    assert ms.epoch == 2 and len(ms.ring()) == 0


class _FailingBackend(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def commit(self, upsert: Mapping[str, Member], remove: Collection[str], floor: int) -> int:
        if self.fail:
            raise ConnectionError("backend down")
        return super().commit(upsert, remove, floor)


def test_a_failed_commit_changes_nothing(clock: VirtualClock) -> None:
    backend = _FailingBackend()
    ms = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=backend)
    ms.register("a", "h:1")
    backend.fail = True
    with pytest.raises(ConnectionError):
        ms.register("b", "h:2")
    clock.advance(TIMEOUT + 1)
    with pytest.raises(ConnectionError):
        ms.expire()
    assert ms.epoch == 1 and set(ms.ring().members) == {"a"}
    backend.fail = False
    assert ms.expire() == ["a"]
    assert ms.epoch == 2


def test_memory_backend_outlives_one_membership(clock: VirtualClock) -> None:
    backend = MemoryBackend()
    Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=backend).register("a", "h:1")
    again = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=backend)
    assert again.epoch == 1 and set(again.ring().members) == {"a"}


def test_redis_membership_survives_a_restart(
    redis_client: redis.Redis, redis_namespace: str, clock: VirtualClock
) -> None:
    ns = redis_namespace
    first = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(redis_client, ns))
    first.register("a", "h:1")
    first.register("b", "h:2", 3)
    first.register("c", "h:3")
    first.leave("c")
    assert first.epoch == 4
    clock.advance(TIMEOUT * 5)  # the coordinator was down for a while; nobody could heartbeat

    second = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(redis_client, ns))
    assert second.epoch == 4
    assert second.ring() == first.ring()
    assert second.expire() == [], "members loaded from Redis get a fresh grace period"
    clock.advance(TIMEOUT / 2)
    assert second.heartbeat("a")
    clock.advance(TIMEOUT / 2 + 1)
    assert second.expire() == ["b"]
    assert second.epoch == 5
    second.register("d", "h:4")
    assert second.epoch == 6

    third = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(redis_client, ns))
    assert third.epoch == 6 and set(third.ring().members) == {"a", "d"}


def test_redis_epoch_floor_and_namespaces(redis_client: redis.Redis, redis_namespace: str, clock: VirtualClock) -> None:
    ns = redis_namespace
    ms = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(redis_client, ns))
    ms.register("a", "h:1", known_epoch=10**15)  # large enough that Lua would print it as 1e+15
    assert ms.epoch == 10**15 + 1
    assert int(redis_client.get(f"{ns}:{{coordinator}}:epoch") or 0) == 10**15 + 1
    other = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(redis_client, ns + ":other"))
    assert other.epoch == 0 and len(other.ring()) == 0


def test_redis_backend_reads_decoded_clients(
    redis_url: str, redis_client: redis.Redis, redis_namespace: str, clock: VirtualClock
) -> None:
    ns = redis_namespace  # redis_client deletes the namespace afterwards
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(client, ns)).register("a", "h:1", 2)
        again = Membership(clock, heartbeat_timeout_s=TIMEOUT, backend=RedisBackend(client, ns))
        assert again.ring().members == {"a": Member("a", "h:1", 2)}
    finally:
        client.close()
