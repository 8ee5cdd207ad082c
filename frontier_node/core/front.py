"""The front layer of the core: every host this node schedules and which of them may go next.

Hosts wait in one heap keyed by the time each may next be leased, each host in it at most once (a newer entry
supersedes an older one through the host's heap version). Hosts that resolved to one address also share that
address's pacing: it carries the latest next-eligible time of its hosts and their concurrency limit.

A request counts against the address its host had when it was leased, and is freed from that address when it ends,
whatever the host's address is by then (a completion reports the address it reached: DNS may answer another one).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator

from frontier_node.core.config import PolitenessConfig
from frontier_node.core.hosts import Host
from frontier_node.core.views import HostView


class FrontLayer:
    """Hosts by name, the ready heap over them, and per-address pacing."""

    __slots__ = ("_held", "_hosts", "_ip_in_flight", "_ip_next", "_ip_waiters", "_policy", "_ready")

    def __init__(self, policy: PolitenessConfig) -> None:
        self._policy = policy
        self._hosts: dict[str, Host] = {}
        self._ready: list[tuple[float, int, str]] = []
        self._ip_next: dict[str, float] = {}
        self._ip_in_flight: Counter[str] = Counter()
        self._ip_waiters: dict[str, set[str]] = {}
        self._held: dict[str, Counter[str]] = {}  # host name -> the addresses its requests in flight count against

    # ------------------------------------------------------------------ hosts

    def __len__(self) -> int:
        return len(self._hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self._hosts.values())

    def get(self, name: str) -> Host | None:
        return self._hosts.get(name)

    def host(self, name: str, domain: str) -> Host:
        """The host called `name`, made on first use."""
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = Host(name, domain)
        return host

    def forget(self, domains: set[str]) -> list[str]:
        """Drop the hosts of `domains` (their heap entries go stale); the names dropped."""
        gone = [n for n, h in self._hosts.items() if h.domain in domains]
        for name in gone:
            self._hosts.pop(name).in_heap = False
            for ip, n in self._held.pop(name, Counter()).items():  # their requests no longer count here
                self._free_address(ip, n)
        return gone

    # ------------------------------------------------------------------ eligibility

    def eligible_at(self, host: Host) -> float:
        """When `host` may next send a request: its own delay, and its address's when it shares one."""
        return max(host.next_eligible, self._ip_next.get(host.ip, 0.0)) if host.ip else host.next_eligible

    def can_go(self, host: Host, now: float) -> bool:
        """Work, not paused, a free slot and its delay over: it would be leased now."""
        return (
            host.has_work()
            and not host.paused
            and host.in_flight < host.limit(self._policy)
            and self.eligible_at(host) <= now
        )

    def wake(self, host: Host, at: float) -> None:
        """Put `host` in the ready heap for time `at` if it can use a slot; keeps one live entry per host."""
        if host.in_heap and self._ready and host.heap_at <= at:
            return  # first: every link admitted to a queued host ends here, and both tests only return
        if host.paused or host.gave_up or host.in_flight >= host.limit(self._policy) or not host.has_work():
            return
        host.heap_version += 1
        host.heap_at = at
        host.in_heap = True
        heapq.heappush(self._ready, (at, host.heap_version, host.name))

    def wake_now(self, host: Host) -> None:
        """wake() at the host's own eligible time."""
        self.wake(host, self.eligible_at(host))

    def pop_ready(self, now: float) -> Host | None:
        """Take the host whose turn is earliest off the heap if its time has come (<= now), else None."""
        ready, hosts = self._ready, self._hosts
        while ready:
            at, version, name = ready[0]
            host = hosts.get(name)
            if host is None or version != host.heap_version or not host.in_heap:
                heapq.heappop(ready)
                continue
            if at > now:
                return None
            heapq.heappop(ready)
            host.in_heap = False
            return host
        return None

    def next_at(self) -> float | None:
        """The time of the earliest live heap entry (stale entries on top are dropped), or None."""
        ready, hosts = self._ready, self._hosts
        while ready:
            at, version, name = ready[0]
            host = hosts.get(name)
            if host is not None and version == host.heap_version and host.in_heap:
                return at
            heapq.heappop(ready)
        return None

    def next_host(self) -> tuple[float, Host] | None:
        """The host of the earliest live heap entry and that entry's time, or None."""
        at = self.next_at()
        return None if at is None else (at, self._hosts[self._ready[0][2]])

    # ------------------------------------------------------------------ slots

    def address_busy(self, host: Host) -> bool:
        """True when the host's address has its limit in flight; the host then waits for a slot to free."""
        if host.ip and self._ip_in_flight[host.ip] >= host.limit(self._policy):
            self._ip_waiters.setdefault(host.ip, set()).add(host.name)
            return True
        return False

    def take_slot(self, host: Host) -> None:
        """A request of `host` goes out: it counts against the host's address (if known) until free_slot."""
        host.in_flight += 1
        if host.ip:
            self._ip_in_flight[host.ip] += 1
            held = self._held.get(host.name)
            if held is None:
                held = self._held[host.name] = Counter()
            held[host.ip] += 1

    def free_slot(self, host: Host) -> None:
        """One request of `host` is over: free its slot on the address it was counted against (the host's current
        one when it holds a slot there, else another it holds), and wake any host waiting on that address.

        Not simply the host's current address: a completion may have moved the host to another address while its
        other requests were in flight (DNS answering another one). Freeing those there left their first address
        counted busy for good (its hosts never leased again) and freed a slot other hosts' requests held."""
        host.in_flight -= 1
        held = self._held.get(host.name)
        if not held:
            return
        ip = host.ip if held[host.ip] > 0 else next(iter(held))
        held[ip] -= 1
        if held[ip] <= 0:
            del held[ip]
        if not held:
            del self._held[host.name]
        self._free_address(ip, 1)

    def _free_address(self, ip: str, requests: int) -> None:
        """`requests` counted against `ip` are over (ended, or their host left this node): wake its waiting hosts."""
        self._ip_in_flight[ip] -= requests
        if self._ip_in_flight[ip] <= 0:
            del self._ip_in_flight[ip]
        for name in self._ip_waiters.pop(ip, ()):
            other = self._hosts.get(name)
            if other is not None:
                self.wake_now(other)

    def pace_address(self, host: Host) -> None:
        """After a request of `host`: its address rests at least as long as the host does."""
        if host.ip:
            self._ip_next[host.ip] = max(self._ip_next.get(host.ip, 0.0), host.next_eligible)

    # ------------------------------------------------------------------ views

    def view(self, host: Host, now: float) -> HostView:
        policy = self._policy
        return HostView(
            name=host.name,
            domain=host.domain,
            queued=host.queued,
            in_flight=host.in_flight,
            concurrency=host.limit(policy),
            delay_s=host.delay(policy),
            min_delay_s=host.min_delay_s if host.min_delay_s >= 0 else policy.min_delay_s,
            backoff=host.backoff,
            next_eligible_s=self.eligible_at(host) - now,
            paused=host.paused,
            has_work=host.has_work(),
            robots=tuple((o, r.describe()) for o, r in sorted(host.robots.items())),
            fetched=host.fetched,
            errors=host.errors,
            revisits_due=len(host.revisits) + len(host.revisit_wait),
        )
