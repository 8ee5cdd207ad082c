"""A host's rest between requests: the delay it was given, Crawl-delay, and its response time only when slow or
backing off (frontier_node/core/hosts.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontier_node.core.config import PolitenessConfig
from frontier_node.core.hosts import Host


def answered(policy: PolitenessConfig, *response_s: float) -> Host:
    host = Host("h.example", "h.example")
    for r in response_s:
        host.on_response(r, now=0.0, policy=policy)
    return host


def test_a_fast_host_rests_only_its_delay() -> None:
    policy = PolitenessConfig(min_delay_s=0.0)
    host = answered(policy, 0.015, 0.016, 0.014)
    assert host.delay(policy) == 0.0 and host.next_eligible == 0.0
    assert answered(PolitenessConfig(min_delay_s=0.2), 0.015).delay(PolitenessConfig(min_delay_s=0.2)) == 0.2


def test_a_slow_host_rests_its_response_time_times_the_factor() -> None:
    policy = PolitenessConfig(min_delay_s=0.0, response_factor=2.0, slow_response_s=0.5)
    host = answered(policy, 0.8)
    assert host.delay(policy) == pytest.approx(1.6)
    assert host.next_eligible == pytest.approx(1.6)
    assert answered(policy, 0.8).delay(PolitenessConfig(min_delay_s=0.0, response_factor=0.0)) == 0.0


def test_a_host_in_trouble_rests_its_response_time_even_when_fast() -> None:
    policy = PolitenessConfig(min_delay_s=0.0, slow_response_s=0.5)
    host = answered(policy, 0.05)
    host.on_trouble(now=10.0, retry_after_s=-1.0, policy=policy)
    assert host.backoff == policy.backoff_step
    assert host.delay(policy) == pytest.approx(0.05 * policy.backoff_step)
    assert host.next_eligible == pytest.approx(10.0 + 0.05 * policy.backoff_step)


def test_a_timeout_counts_its_wait_as_response_time() -> None:
    """A fetch that timed out after 2 s on a host that had answered in 10 ms: the host rests factor x its
    response time with those 2 s in it (x backoff), not 10 ms x backoff, before the next request."""
    policy = PolitenessConfig(min_delay_s=0.05, response_factor=1.0, slow_response_s=0.5)
    host = answered(policy, 0.01)
    host.on_trouble(now=10.0, retry_after_s=-1.0, policy=policy, response_s=2.0)
    latency = 0.7 * 0.01 + 0.3 * 2.0
    assert host.latency_s == pytest.approx(latency)
    assert host.delay(policy) == pytest.approx(latency * policy.backoff_step)
    assert host.next_eligible == pytest.approx(10.0 + latency * policy.backoff_step)


def test_a_fast_hosts_jitter_is_not_a_rise_in_latency() -> None:
    """Loopback-fast answers that jitter (1 ms, then 4 ms, 9 ms, 30 ms) are no struggling server: no backoff. The
    same threefold rise above rise_floor_s (60 ms, then 200 ms) is one, and the host backs off."""
    policy = PolitenessConfig(min_delay_s=0.25)
    fast = answered(policy, 0.001, 0.004, 0.001, 0.009, 0.001, 0.030)
    assert fast.backoff == 1.0 and fast.delay(policy) == 0.25
    slow = answered(policy, 0.060, 0.200)
    assert slow.backoff == policy.backoff_step
    assert answered(PolitenessConfig(min_delay_s=0.25, rise_floor_s=0.0), 0.001, 0.004).backoff == policy.backoff_step


@given(
    delay=st.floats(0, 5),
    factor=st.floats(0, 4),
    threshold=st.floats(0, 2),
    responses=st.lists(st.floats(0.001, 3), min_size=1, max_size=6),
)
def test_the_rest_is_the_largest_of_delay_and_slow_rest(
    delay: float, factor: float, threshold: float, responses: list[float]
) -> None:
    """Oracle: max(delay, factor x latency if latency >= threshold or backing off) x backoff, capped."""
    policy = PolitenessConfig(min_delay_s=delay, response_factor=factor, slow_response_s=threshold)
    host = answered(policy, *responses)
    slow = host.latency_s >= threshold or host.backoff > 1.0
    d = max(delay, factor * host.latency_s if slow else 0.0)
    expected = min(policy.max_delay_s, d * host.backoff) if d > 0 else 0.0
    assert host.delay(policy) == pytest.approx(expected)
    assert host.delay(policy) >= min(delay, policy.max_delay_s) - 1e-9
