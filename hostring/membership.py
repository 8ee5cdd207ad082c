"""What nodes and workers use to talk to the coordinator: stay a member, and keep the current Ring.

`NodeMembership` (threads, for frontier nodes) registers, heartbeats, registers again when the coordinator
forgot it, and hands every newer ring to a callback. `RingWatcher` (asyncio, for workers) keeps `.ring` current
and doubles as the worker's `Router` (`nodes()`, `owner()`, `refresh()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import grpc

from hostring.ring import EMPTY_RING, Member, Ring
from hostring.security import INSECURE, TlsConfig, admin_metadata
from hostring.v1 import coordinator_pb2 as pb
from hostring.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.coordinator.client")

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # Notice a vanished coordinator on an idle WatchRing stream (the server permits these pings).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A control-plane channel should find a restarted coordinator within seconds, not gRPC's default 2 minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


def ring_from_proto(state: pb.RingState) -> Ring:
    """The Ring of a RingState (liveness fields are informational and not part of the ring)."""
    return Ring(state.epoch, (Member(m.node_id, m.address, m.weight or 1) for m in state.members))


class _Backoff:
    """Exponential retry delay with jitter, so a coordinator restart is not met by every client at once."""

    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first, self.cap, self._next = first, cap, first

    def reset(self) -> None:
        self._next = self.first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay * random.uniform(0.5, 1.0)


class NodeMembership:
    """Keeps one frontier node in the ring and tells it about every newer ring.

    Three daemon threads: heartbeat (register, heartbeat, register again when unknown, re-read the ring if a
    heartbeat shows a newer epoch), watch (the WatchRing stream, reconnecting with the last known epoch) and
    delivery (calls `on_ring` in epoch order; a slow callback never delays heartbeats, and rings that arrive
    while it runs are coalesced into the newest).
    """

    def __init__(
        self,
        coordinator_addr: str,
        node_id: str,
        address: str,
        weight: int = 1,
        *,
        heartbeat_s: float = 2.0,
        on_ring: Callable[[Ring], None] | None = None,
        rpc_timeout_s: float = 5.0,
        tls: TlsConfig | None = None,
        admin_token: str | None = None,
    ) -> None:
        """`tls` secures the channel to the coordinator; `admin_token` is sent with Register, Heartbeat and Leave."""
        Member(node_id, address, weight)  # validate early, in the caller's thread
        self.coordinator_addr = coordinator_addr
        self.node_id, self.address, self.weight = node_id, address, weight
        self._heartbeat_s = heartbeat_s
        self._interval = heartbeat_s
        self._on_ring = on_ring
        self._rpc_timeout = rpc_timeout_s
        self._admin = admin_metadata(admin_token)
        self._channel = (tls or INSECURE).channel(coordinator_addr, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call]
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._latest = EMPTY_RING  # newest ring received
        self._delivered = EMPTY_RING  # newest ring handed to on_ring
        self._registered = False
        self._watch_call: Any = None
        self._threads: dict[str, threading.Thread] = {}

    # ------------------------------------------------------------------ public

    def start(self) -> NodeMembership:
        """Start the threads; returns at once (see `wait_ring`)."""
        if self._threads:
            raise RuntimeError("already started")
        for name, target in (
            ("heartbeat", self._heartbeat_loop),
            ("watch", self._watch_loop),
            ("deliver", self._deliver_loop),
        ):
            t = threading.Thread(target=target, name=f"membership-{name}-{self.node_id}", daemon=True)
            self._threads[name] = t
            t.start()
        return self

    @property
    def ring(self) -> Ring:
        """The newest ring `on_ring` has returned from (EMPTY_RING before the first)."""
        return self._delivered

    @property
    def registered(self) -> bool:
        """Whether the coordinator currently counts this node as a member, as far as this client knows."""
        return self._registered

    def wait_ring(self, predicate: Callable[[Ring], bool] | None = None, timeout: float = 10.0) -> Ring:
        """Block until `ring` (as on_ring has processed it) satisfies `predicate` (default: has this node).

        Raises TimeoutError when it does not within `timeout` seconds.
        """
        pred = predicate or (lambda r: self.node_id in r.members)
        with self._cond:
            if not self._cond.wait_for(lambda: pred(self._delivered), timeout):
                raise TimeoutError(f"{self.node_id}: no matching ring within {timeout} s (have {self._delivered})")
            return self._delivered

    def stop(self, *, leave: bool = True) -> None:
        """Stop heartbeating and, with `leave`, leave the ring at once (without it, as if the process died).

        No `on_ring` call starts after this. Idempotent: only the first call acts.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        me = threading.current_thread()
        heartbeat = self._threads.get("heartbeat")
        if heartbeat is not None and heartbeat is not me:
            heartbeat.join(self._rpc_timeout + 1.0)
        if leave and self._registered:
            try:
                self._stub.Leave(pb.LeaveRequest(node_id=self.node_id), timeout=self._rpc_timeout, metadata=self._admin)
                self._registered = False
            except grpc.RpcError as e:
                log.warning("%s: leave failed (%s); the coordinator will expire it", self.node_id, _code(e))
        call = self._watch_call
        if call is not None:
            call.cancel()
        for t in self._threads.values():
            if t is not me:
                t.join(self._rpc_timeout + 1.0)
        self._channel.close()

    def __enter__(self) -> NodeMembership:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ threads

    def _offer(self, ring: Ring) -> None:
        """Keep a received ring if it is newer than any seen, and wake the delivery thread."""
        with self._cond:
            if ring.epoch > self._latest.epoch:
                self._latest = ring
                self._cond.notify_all()

    def _heartbeat_loop(self) -> None:
        backoff = _Backoff(cap=self._heartbeat_s)
        while not self._stop.is_set():
            try:
                if not self._registered:
                    self._register()
                else:
                    resp = self._stub.Heartbeat(
                        pb.HeartbeatRequest(node_id=self.node_id),
                        wait_for_ready=True,
                        metadata=self._admin,
                        timeout=max(0.1, min(self._rpc_timeout, self._interval * 1.5)),
                    )
                    if not resp.ok:
                        log.warning("%s: the coordinator does not know this node; registering again", self.node_id)
                        self._registered = False
                        continue
                    if resp.epoch > self._latest.epoch:
                        self._offer(ring_from_proto(self._stub.GetRing(pb.GetRingRequest(), timeout=self._rpc_timeout)))
                backoff.reset()
                wait = self._interval
            except grpc.RpcError as e:
                wait = backoff.next()
                log.warning("%s: coordinator call failed (%s); retrying in %.2f s", self.node_id, _code(e), wait)
            except Exception:
                wait = backoff.next()
                log.exception("%s: unexpected failure talking to the coordinator", self.node_id)
            self._stop.wait(wait)

    def _register(self) -> None:
        resp = self._stub.Register(
            pb.RegisterRequest(
                node_id=self.node_id, address=self.address, weight=self.weight, known_epoch=self._latest.epoch
            ),
            wait_for_ready=True,
            timeout=self._rpc_timeout,
            metadata=self._admin,
        )
        if resp.heartbeat_timeout_ms:
            self._interval = min(self._heartbeat_s, resp.heartbeat_timeout_ms / 3000)
        self._registered = True
        log.info("%s: registered at %s, epoch %d", self.node_id, self.address, resp.epoch)
        self._offer(ring_from_proto(resp.ring))

    def _watch_loop(self) -> None:
        backoff = _Backoff()
        while not self._stop.is_set():
            call = self._stub.WatchRing(pb.WatchRequest(known_epoch=self._latest.epoch), wait_for_ready=True)
            self._watch_call = call
            if self._stop.is_set():
                call.cancel()
                return
            try:
                for state in call:
                    backoff.reset()
                    self._offer(ring_from_proto(state))
                log.info("%s: coordinator ended the ring stream; reconnecting", self.node_id)
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                log.warning("%s: ring stream failed (%s); reconnecting", self.node_id, _code(e))
            except Exception:
                log.exception("%s: bad ring update; reconnecting", self.node_id)
            self._stop.wait(backoff.next())

    def _deliver_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop.is_set() or self._latest.epoch > self._delivered.epoch)
                if self._stop.is_set():
                    return
                ring = self._latest
            if self._on_ring is not None:
                try:
                    self._on_ring(ring)
                except Exception:
                    log.exception("%s: on_ring failed for epoch %d", self.node_id, ring.epoch)
            with self._cond:
                self._delivered = ring
                self._cond.notify_all()


class RingWatcher:
    """The current ring for an asyncio process (a fetch worker), kept fresh by the WatchRing stream.

    It also satisfies the worker's Router protocol: `nodes()` lists member addresses, `owner(domain)` gives the
    owner's address, `refresh()` re-reads the ring after a wrong-owner answer.
    """

    def __init__(
        self,
        coordinator_addr: str,
        *,
        on_ring: Callable[[Ring], None] | None = None,
        rpc_timeout_s: float = 5.0,
        tls: TlsConfig | None = None,
    ) -> None:
        """`tls` secures the channel to the coordinator, and (as `.tls`) the workers' channels to the nodes."""
        self.coordinator_addr = coordinator_addr
        self.tls = tls or INSECURE
        self._on_ring = on_ring
        self._rpc_timeout = rpc_timeout_s
        self._ring = EMPTY_RING
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.CoordinatorStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Condition | None = None

    async def start(self, timeout: float = 10.0) -> Ring:
        """Read the ring now (waiting up to `timeout` for the coordinator), then follow it in the background."""
        if self._channel is not None:
            raise RuntimeError("already started")
        self._channel = self.tls.aio_channel(self.coordinator_addr, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call]
        self._changed = asyncio.Condition()
        try:
            await self.refresh(timeout)
        except BaseException:
            await self.close()
            raise
        self._task = asyncio.create_task(self._watch(), name="ring-watch")
        return self._ring

    @property
    def ring(self) -> Ring:
        """The newest ring seen."""
        return self._ring

    async def refresh(self, timeout: float | None = None) -> Ring:
        """Read the ring from the coordinator now (after a wrong-owner answer); returns the newest ring known."""
        if self._stub is None:
            raise RuntimeError("start() first")
        state = await self._stub.GetRing(
            pb.GetRingRequest(), wait_for_ready=True, timeout=timeout if timeout is not None else self._rpc_timeout
        )
        await self._offer(ring_from_proto(state))
        return self._ring

    async def wait_for(self, predicate: Callable[[Ring], bool], timeout: float = 10.0) -> Ring:
        """Wait until the ring satisfies `predicate`; TimeoutError otherwise."""
        if self._changed is None:
            raise RuntimeError("start() first")
        changed = self._changed

        async def _wait() -> Ring:
            async with changed:
                await changed.wait_for(lambda: predicate(self._ring))
                return self._ring

        return await asyncio.wait_for(_wait(), timeout)

    async def moved(self, domain: str, address: str, timeout_s: float) -> str:
        """Wait up to `timeout_s` for a ring in which another node than `address` owns `domain` (the WatchRing
        stream brings it); that node's address, else `address`."""

        def elsewhere(ring: Ring) -> bool:
            member = ring.owner(domain)
            return member is not None and member.address != address

        if self._changed is None:  # not following the ring: nothing can move
            await asyncio.sleep(timeout_s)
        elif not elsewhere(self._ring):
            with contextlib.suppress(TimeoutError):
                await self.wait_for(elsewhere, timeout_s)
        member = self._ring.owner(domain)
        return member.address if member is not None else address

    def nodes(self) -> list[str]:
        """Addresses of every member, in node id order."""
        return [m.address for m in self._ring.members.values()]

    def owner(self, domain: str) -> str:
        """Address of the node owning `domain`; LookupError while the ring is empty."""
        m = self._ring.owner(domain)
        if m is None:
            raise LookupError(f"no frontier node in the ring (epoch {self._ring.epoch})")
        return m.address

    async def close(self) -> None:
        """Stop following the ring and close the channel."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
            self._stub = None

    async def __aenter__(self) -> RingWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _offer(self, ring: Ring) -> None:
        if ring.epoch <= self._ring.epoch:
            return
        self._ring = ring
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()
        if self._on_ring is not None:
            try:
                self._on_ring(ring)
            except Exception:
                log.exception("on_ring failed for epoch %d", ring.epoch)

    async def _watch(self) -> None:
        assert self._stub is not None
        backoff = _Backoff()
        while True:
            try:
                call = self._stub.WatchRing(pb.WatchRequest(known_epoch=self._ring.epoch), wait_for_ready=True)
                async for state in call:
                    backoff.reset()
                    await self._offer(ring_from_proto(state))
                log.info("coordinator ended the ring stream; reconnecting")
            except grpc.aio.AioRpcError as e:
                log.warning("ring stream failed (%s); reconnecting", e.code().name)
            except Exception:
                log.exception("bad ring update; reconnecting")
            await asyncio.sleep(backoff.next())


def _code(e: grpc.RpcError) -> str:
    code = getattr(e, "code", None)
    return code().name if callable(code) else type(e).__name__
