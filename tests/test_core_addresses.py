"""Per-address politeness in the front layer (frontier_node/core/front.py), sans I/O: hosts that resolved to one
address share its slots, and a host waiting for one is woken whenever a slot of that address is freed."""

from __future__ import annotations

from frontier_node.core.config import PolitenessConfig
from frontier_node.core.front import FrontLayer

ADDRESS = "192.0.2.1"


def _front_with_a_waiter() -> FrontLayer:
    """Hosts a and c on one address, one request at a time: a holds the slot, c has work and waits for it."""
    front = FrontLayer(PolitenessConfig(min_delay_s=0.0, concurrency=1))
    a, c = front.host("a.example", "a.example"), front.host("c.example", "c.example")
    for host in (a, c):
        host.ip, host.overflow = ADDRESS, 1  # work waiting in the store
    front.take_slot(a)
    assert front.address_busy(c), "c should wait: its address has its one request in flight"
    assert front.pop_ready(now=1e9) is None
    return front


def test_a_waiter_wakes_when_the_slot_is_freed() -> None:
    front = _front_with_a_waiter()
    a = front.get("a.example")
    assert a is not None
    front.free_slot(a)
    woken = front.pop_ready(now=1e9)
    assert woken is not None and woken.name == "c.example"
    assert not front.address_busy(woken)


def test_a_waiter_wakes_when_the_host_holding_the_slot_leaves_the_node() -> None:
    """A handoff forgets a's domain while its request is out: that request no longer counts here, so c goes."""
    front = _front_with_a_waiter()
    assert front.forget({"a.example"}) == ["a.example"]
    woken = front.pop_ready(now=1e9)
    assert woken is not None and woken.name == "c.example", "c stayed asleep after its address was freed"
    assert not front.address_busy(woken)
