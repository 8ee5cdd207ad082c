"""The gRPC shell around `Membership`: translate messages, run expiry, and fan ring changes out to watchers.

It is a grpc.aio servicer, so a WatchRing stream costs a coroutine rather than a pool thread: hundreds of watching
workers cannot starve the heartbeats that keep nodes in the ring. Everything runs on one event loop, which is
what serialises calls into the (single-threaded) state machine; no lock is needed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc

from coordinator.membership import Membership
from hostring.v1 import coordinator_pb2 as pb
from hostring.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.coordinator")

MAX_NODE_ID_LEN = 256
T = TypeVar("T")
if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """Serves one Membership; every mutation that changes the epoch wakes the WatchRing streams."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self._changed = asyncio.Condition()
        self._closing = False

    # ------------------------------------------------------------------ membership

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        if not request.node_id or len(request.node_id) > MAX_NODE_ID_LEN:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"node_id must be 1..{MAX_NODE_ID_LEN} characters")
        if not request.address:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "address is required")
        m = self.membership
        await self._mutate(
            context,
            lambda: m.register(request.node_id, request.address, request.weight or 1, known_epoch=request.known_epoch),
        )
        return pb.RegisterResponse(
            epoch=m.epoch, ring=self.state(), heartbeat_timeout_ms=int(m.heartbeat_timeout_s * 1000)
        )

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        ok = self.membership.heartbeat(request.node_id)
        return pb.HeartbeatResponse(epoch=self.membership.epoch, ok=ok)

    async def Leave(self, request: pb.LeaveRequest, context: Context) -> pb.LeaveResponse:
        left = await self._mutate(context, lambda: self.membership.leave(request.node_id))
        return pb.LeaveResponse(epoch=self.membership.epoch, left=left)

    # ------------------------------------------------------------------ the ring

    async def GetRing(self, request: pb.GetRingRequest, context: Context) -> pb.RingState:
        return self.state()

    async def WatchRing(self, request: pb.WatchRequest, context: Context) -> None:
        known = request.known_epoch
        self.membership.observe_epoch(known)
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._wake, known))
            if self._closing or context.done():
                return
            state = self.state()
            known = state.epoch
            try:
                await context.write(state)
            except Exception as e:  # the watcher went away while its update was on the way: nothing to do
                log.debug("ring update to a departed watcher failed: %r", e)
                return

    def _wake(self, known: int) -> bool:
        """Whether a watcher that has seen `known` has something to do: a newer epoch, or the end."""
        return self._closing or self.membership.epoch > known

    def state(self) -> pb.RingState:
        """The current epoch and members with their liveness."""
        return pb.RingState(
            epoch=self.membership.epoch,
            members=[
                pb.Member(
                    node_id=s.member.node_id,
                    address=s.member.address,
                    weight=s.member.weight,
                    healthy=s.healthy,
                    last_seen_ms=int(s.last_seen * 1000),
                )
                for s in self.membership.statuses()
            ],
        )

    # ------------------------------------------------------------------ lifecycle

    async def run_expiry(self, interval_s: float) -> None:
        """Drop silent members every `interval_s` until cancelled; a failing backend is logged and retried."""
        while True:
            await asyncio.sleep(interval_s)
            before = self.membership.epoch
            try:
                self.membership.expire()
            except Exception:
                log.exception("expiry failed; retrying in %.1f s", interval_s)
            if self.membership.epoch != before:
                await self._notify()

    async def close(self) -> None:
        """End every WatchRing stream cleanly (status OK) and refuse to start new ones."""
        self._closing = True
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _mutate(self, context: Context, change: Callable[[], T]) -> T:
        """Apply a membership change, mapping bad input and backend failures to status codes, then wake watchers."""
        before = self.membership.epoch
        try:
            result = change()
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:
            log.exception("membership backend failed")
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"membership backend failed: {e}")
        if self.membership.epoch != before:
            await self._notify()
        return result


async def _abort(context: Context, code: grpc.StatusCode, details: str) -> NoReturn:
    """context.abort, typed as never returning."""
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")
