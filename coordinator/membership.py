"""Membership of frontier nodes as a sans-I/O state machine: who is in the ring, since when, at which epoch.

The clock is injected and nothing here sleeps or serves; the gRPC shell calls `register`, `heartbeat`, `leave`
and, periodically, `expire`. Every change batch goes through the backend as one atomic commit that returns the
new epoch, so the epoch grows by exactly one per batch and, with Redis, survives a coordinator restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

import redis
from redis.cluster import RedisCluster

from hostring.clock import Clock
from hostring.ring import Member, Ring

log = logging.getLogger("hostring.coordinator")


class MembershipBackend(Protocol):
    """Where members and the epoch counter live between coordinator runs."""

    def load(self) -> tuple[int, dict[str, Member]]:
        """The last committed epoch and members (0 and none when nothing was ever committed)."""
        ...

    def commit(self, upsert: Mapping[str, Member], remove: Collection[str], floor: int) -> int:
        """Apply one change batch atomically and return its epoch: max(stored epoch, floor) + 1."""
        ...

    def holds(self, epoch: int) -> bool:
        """Whether the backend still holds the state committed at `epoch` (False when it lost it)."""
        ...


class MemoryBackend:
    """Membership that lives as long as this object: a restarted coordinator starts from epoch 0."""

    def __init__(self) -> None:
        self._epoch = 0
        self._members: dict[str, Member] = {}

    def load(self) -> tuple[int, dict[str, Member]]:
        return self._epoch, dict(self._members)

    def commit(self, upsert: Mapping[str, Member], remove: Collection[str], floor: int) -> int:
        for node_id in remove:
            self._members.pop(node_id, None)
        self._members.update(upsert)
        self._epoch = max(self._epoch, floor) + 1
        return self._epoch

    def holds(self, epoch: int) -> bool:
        return True


# KEYS[1]: members hash, KEYS[2]: epoch counter. ARGV[1]: floor, ARGV[2]: n removals, then n ids, then id/json pairs.
# The floor is SET from its original text: a Lua number could be rendered as 1e+15 and break INCR.
_COMMIT_LUA = """
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[2], ARGV[1]) end
local n = tonumber(ARGV[2])
for i = 1, n do redis.call('HDEL', KEYS[1], ARGV[2 + i]) end
for i = 3 + n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return redis.call('INCR', KEYS[2])
"""


class RedisBackend:
    """Members in a hash and the epoch in an INCR counter, both under one hash tag so a Redis Cluster keeps them in
    one slot and a commit is a single atomic script. Assumes one coordinator writes a namespace at a time.

    Keys: `ns:{coordinator}:members` (hash node id -> {"address", "weight"} as JSON), `ns:{coordinator}:epoch`.
    """

    def __init__(self, client: redis.Redis | RedisCluster, namespace: str = "hostring") -> None:
        self._client = client
        self._members_key = f"{namespace}:{{coordinator}}:members"
        self._epoch_key = f"{namespace}:{{coordinator}}:epoch"
        self._commit = client.register_script(_COMMIT_LUA)

    def load(self) -> tuple[int, dict[str, Member]]:
        raw_epoch = self._client.get(self._epoch_key)
        epoch = int(raw_epoch) if raw_epoch is not None else 0
        members: dict[str, Member] = {}
        for raw_id, raw_conf in self._client.hgetall(self._members_key).items():
            node_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            conf = json.loads(raw_conf)
            members[node_id] = Member(node_id, str(conf["address"]), int(conf["weight"]))
        return epoch, members

    def commit(self, upsert: Mapping[str, Member], remove: Collection[str], floor: int) -> int:
        args: list[str | int] = [str(floor), len(remove), *remove]
        for node_id, m in upsert.items():
            args += [node_id, json.dumps({"address": m.address, "weight": m.weight})]
        return int(self._commit(keys=[self._members_key, self._epoch_key], args=args))

    def holds(self, epoch: int) -> bool:
        """The stored epoch counter is there and not behind `epoch` (a Redis restarted empty has neither)."""
        if epoch <= 0:
            return True
        raw = self._client.get(self._epoch_key)
        return raw is not None and int(raw) >= epoch


@dataclass(frozen=True)
class MemberStatus:
    """A member with what the coordinator knows of its liveness, for GetRing and `hostring status`."""

    member: Member
    last_seen: float
    healthy: bool


class Membership:
    """The membership state machine. Not thread-safe: the shell serialises calls.

    A member not heard from (register or heartbeat) for longer than `heartbeat_timeout_s` is dropped by the next
    `expire()`. Members loaded from the backend at construction get a fresh grace period of one timeout, since
    their heartbeats could not reach a coordinator that was not running. With `stall_after_s` set, an `expire()`
    that comes more than that long after the previous one grants the same grace instead of expiring: a coordinator
    that was paused (VM migration, SIGSTOP, a blocked loop) did not see heartbeats, which is not the nodes' fault.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        heartbeat_timeout_s: float = 10.0,
        backend: MembershipBackend,
        stall_after_s: float | None = None,
    ) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError("heartbeat_timeout_s must be > 0")
        self._clock = clock
        self._timeout = heartbeat_timeout_s
        self._stall_after = stall_after_s
        self._backend = backend
        epoch, members = backend.load()
        now = clock.now()
        self._ring = Ring(epoch, members.values())
        self._last_seen = dict.fromkeys(members, now)
        self._floor = epoch
        self._last_expire = now
        self.listeners: list[Callable[[Ring, Ring], None]] = []
        """Called with (old ring, new ring) after each committed change (the metrics count ring changes there)."""

    @property
    def epoch(self) -> int:
        """The current epoch: 0 until the first member ever joins, then +1 per change batch."""
        return self._ring.epoch

    @property
    def heartbeat_timeout_s(self) -> float:
        return self._timeout

    def ring(self) -> Ring:
        """The ring of the current epoch."""
        return self._ring

    def statuses(self) -> list[MemberStatus]:
        """Every member with its last heartbeat; healthy means heard from within half the timeout."""
        now = self._clock.now()
        return [
            MemberStatus(m, self._last_seen[m.node_id], now - self._last_seen[m.node_id] <= self._timeout / 2)
            for m in self._ring.members.values()
        ]

    def observe_epoch(self, epoch: int) -> None:
        """Note an epoch a client has seen: the next change goes above it, so epochs never go backwards for anyone
        who watched them, even after this coordinator lost its state."""
        if epoch > max(self.epoch, self._floor):
            log.warning("a client knows epoch %d, beyond this coordinator's %d: continuing above it", epoch, self.epoch)
            self._floor = epoch

    def register(self, node_id: str, address: str, weight: int = 1, *, known_epoch: int = 0) -> bool:
        """Join or refresh a member; True if the ring changed (new member, or new address or weight)."""
        member = Member(node_id, address, weight)
        self.observe_epoch(known_epoch)
        if self._ring.members.get(node_id) == member:
            self._last_seen[node_id] = self._clock.now()
            return False
        verb = "updated" if node_id in self._ring.members else "joined"
        self._commit({node_id: member}, ())
        self._last_seen[node_id] = self._clock.now()
        log.info("epoch %d: %s %s at %s (weight %d)", self.epoch, verb, node_id, address, weight)
        return True

    def heartbeat(self, node_id: str) -> bool:
        """Record a sign of life; False if the node is not a member and must register again."""
        if node_id not in self._last_seen:
            return False
        self._last_seen[node_id] = self._clock.now()
        return True

    def leave(self, node_id: str) -> bool:
        """Remove a member at once; True if it was one."""
        if node_id not in self._last_seen:
            return False
        self._commit({}, (node_id,))
        log.info("epoch %d: %s left", self.epoch, node_id)
        return True

    def expire(self) -> list[str]:
        """Drop every member not heard from for longer than the timeout, in one epoch; return their ids.

        First checks that the backend still holds the membership (see `recover_lost_state`).
        """
        self.recover_lost_state()
        now = self._clock.now()
        gap, self._last_expire = now - self._last_expire, now
        if self._stall_after is not None and gap > self._stall_after:
            log.warning("no expiry check for %.1f s: granting every member a fresh grace period", gap)
            self._last_seen = dict.fromkeys(self._last_seen, now)
            return []
        dead = sorted(node_id for node_id, seen in self._last_seen.items() if now - seen > self._timeout)
        if dead:
            self._commit({}, dead)
            log.info("epoch %d: expired %s (no heartbeat for %.1f s)", self.epoch, ", ".join(dead), self._timeout)
        return dead

    def recover_lost_state(self) -> bool:
        """When the backend lost the committed membership (a Redis restarted without its data), say so by name
        and write it again from memory, one epoch above, so a restarted coordinator finds it. True if it did."""
        try:
            if self._backend.holds(self.epoch):
                return False
        except Exception as e:  # an unreachable backend is not a lost one: the next change reports it
            log.debug("membership backend check failed: %r", e)
            return False
        log.error(
            "membership_lost: the coordinator's membership state vanished from its Redis (this coordinator is at "
            "epoch %d); writing its %d member(s) again at the next epoch. Run Redis with appendonly yes.",
            self.epoch,
            len(self._ring),
        )
        self._commit(dict(self._ring.members), ())
        return True

    def _commit(self, upsert: Mapping[str, Member], remove: Collection[str]) -> None:
        """Persist one change batch, then adopt it; a backend failure leaves this object unchanged."""
        epoch = self._backend.commit(upsert, remove, max(self.epoch, self._floor))
        members = {k: v for k, v in self._ring.members.items() if k not in remove}
        members.update(upsert)
        old, self._ring = self._ring, Ring(epoch, members.values())
        for listener in self.listeners:
            listener(old, self._ring)
        for node_id in remove:
            self._last_seen.pop(node_id, None)
