"""Which IP addresses a fetch may connect to: the worker's SSRF guard.

A crawler follows links written by strangers, so a page can point it at
`http://127.0.0.1:6379/`, at a cloud metadata service on 169.254.169.254, or at
a hostname whose DNS record says `10.0.0.5`. The guard therefore judges the
*resolved address*, at connect time, on the very address the socket is then
opened to (see `transport.PolicyBackend`): checking the hostname when a link is
admitted and connecting later would let DNS rebinding slip through.

An address is allowed when it is globally routable or lies inside the
operator's allowlist. "Globally routable" is decided from an explicit table
taken from the IANA IPv4/IPv6 special-purpose address registries rather than
from `ipaddress.is_global`, whose answers changed between Python patch
releases; every refusal carries a short reason word for logs and metrics.

IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64
64:ff9b::/96, 6to4, Teredo) are unwrapped and the embedded IPv4 address is
judged too, so `::ffff:127.0.0.1` or `2002:7f00:1::` cannot smuggle loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import TypeAlias

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

# Reason words carried by AddressRefused.reason.
UNSPECIFIED = "unspecified"
THIS_NETWORK = "this_network"
LOOPBACK = "loopback"
PRIVATE = "private"
SHARED_CGNAT = "shared_cgnat"
LINK_LOCAL = "link_local"
SITE_LOCAL = "site_local"
IETF_PROTOCOL = "ietf_protocol"
DOCUMENTATION = "documentation"
BENCHMARKING = "benchmarking"
MULTICAST = "multicast"
BROADCAST = "broadcast"
RESERVED = "reserved"
NAT64_LOCAL = "nat64_local"
IPV4_COMPATIBLE = "ipv4_compatible"
INVALID = "invalid"

# Embedding forms carried by AddressRefused.via.
VIA_IPV4_MAPPED = "ipv4_mapped"
VIA_IPV4_COMPATIBLE = "ipv4_compatible"
VIA_NAT64 = "nat64"
VIA_6TO4 = "6to4"
VIA_TEREDO = "teredo"


def _table(rows: Iterable[tuple[str, str]]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(cidr), reason) for cidr, reason in rows)


# IANA IPv4 Special-Purpose Address Registry, blocks not marked globally
# reachable (more specific rows first). 192.0.0.0/24 is refused whole, including
# the two anycast service addresses in it: no web server lives there.
_V4_REFUSED = _table(
    [
        ("0.0.0.0/32", UNSPECIFIED),
        ("0.0.0.0/8", THIS_NETWORK),
        ("10.0.0.0/8", PRIVATE),
        ("100.64.0.0/10", SHARED_CGNAT),
        ("127.0.0.0/8", LOOPBACK),
        ("169.254.0.0/16", LINK_LOCAL),
        ("172.16.0.0/12", PRIVATE),
        ("192.0.0.0/24", IETF_PROTOCOL),
        ("192.0.2.0/24", DOCUMENTATION),
        ("192.88.99.0/24", RESERVED),
        ("192.168.0.0/16", PRIVATE),
        ("198.18.0.0/15", BENCHMARKING),
        ("198.51.100.0/24", DOCUMENTATION),
        ("203.0.113.0/24", DOCUMENTATION),
        ("224.0.0.0/4", MULTICAST),
        ("255.255.255.255/32", BROADCAST),
        ("240.0.0.0/4", RESERVED),
    ]
)

# IPv6 blocks refused inside or beside 2000::/3; everything outside 2000::/3
# (the only global unicast space) is refused as reserved unless listed here.
_V6_REFUSED = _table(
    [
        ("::/128", UNSPECIFIED),
        ("::1/128", LOOPBACK),
        ("64:ff9b:1::/48", NAT64_LOCAL),
        ("2001:db8::/32", DOCUMENTATION),
        ("2001::/23", IETF_PROTOCOL),
        ("3fff::/20", DOCUMENTATION),
        ("fc00::/7", PRIVATE),
        ("fe80::/10", LINK_LOCAL),
        ("fec0::/10", SITE_LOCAL),
        ("ff00::/8", MULTICAST),
    ]
)
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_V6_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V6_COMPATIBLE = ipaddress.IPv6Network("::/96")


class AddressRefused(Exception):
    """A connection target the network policy refuses.

    `host` is the name that was being connected to ("" when a bare address was
    checked), `address` the offending resolved address, `reason` a reason word
    such as "loopback" or "private", and `via` the IPv6 form ("ipv4_mapped",
    "6to4", ...) when the reason belongs to an embedded IPv4 address.
    """

    def __init__(self, host: str, address: str, reason: str, via: str = "") -> None:
        self.host = host
        self.address = address
        self.reason = reason
        self.via = via
        target = f"{host!r} at {address}" if host else address
        embedded = f" (IPv4 address embedded in a {via} IPv6 address)" if via else ""
        super().__init__(f"network policy refuses {target}: {reason}{embedded}")


class ResolutionFailed(Exception):
    """The hostname did not resolve to any address (NXDOMAIN, no records, resolver failure)."""

    def __init__(self, host: str, detail: str) -> None:
        self.host = host
        self.detail = detail
        super().__init__(f"cannot resolve {host!r}: {detail}")


def _v4_refusal(addr: ipaddress.IPv4Address) -> str | None:
    for network, reason in _V4_REFUSED:
        if addr in network:
            return reason
    return None


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]] | None:
    """The IPv4 address(es) an IPv6 address carries, with the embedding form, or None."""
    if addr.ipv4_mapped is not None:
        return VIA_IPV4_MAPPED, [addr.ipv4_mapped]
    if addr in _V6_NAT64:
        return VIA_NAT64, [ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)]
    if addr.sixtofour is not None:
        return VIA_6TO4, [addr.sixtofour]
    if addr.teredo is not None:
        server, client = addr.teredo
        return VIA_TEREDO, [server, client]
    if addr in _V6_COMPATIBLE and int(addr) > 1:
        return VIA_IPV4_COMPATIBLE, [ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)]
    return None


def classify(address: str) -> tuple[str, str] | None:
    """(reason, via) why `address` is not globally routable, or None when it is.

    Ignores any allowlist; `NetworkPolicy.check` is the operator-facing entry.
    """
    try:
        addr = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return INVALID, ""
    if isinstance(addr, ipaddress.IPv4Address):
        reason = _v4_refusal(addr)
        return (reason, "") if reason else None
    embedded = _embedded_v4(addr)
    if embedded is not None:
        via, inner = embedded
        for v4 in inner:
            reason = _v4_refusal(v4)
            if reason:
                return reason, via
        # An IPv4-compatible address is deprecated (RFC 4291 §2.5.5.1) and never routed.
        return (IPV4_COMPATIBLE, "") if via == VIA_IPV4_COMPATIBLE else None
    for network, reason in _V6_REFUSED:
        if addr in network:
            return reason, ""
    if addr not in _V6_GLOBAL_UNICAST:
        return RESERVED, ""
    return None


def _parse_allowlist(allow: Iterable[str] | str) -> tuple[IPNetwork, ...]:
    entries = allow.replace(",", " ").split() if isinstance(allow, str) else list(allow)
    networks: list[IPNetwork] = []
    for entry in entries:
        text = str(entry).strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise ValueError(
                f"invalid CIDR {entry!r} in the network allowlist: {exc} "
                "(expected a network such as '127.0.0.0/8' or '::1/128')"
            ) from None
    return tuple(networks)


class NetworkPolicy:
    """Allows globally routable addresses plus an operator allowlist of CIDRs.

    `allow` is an iterable of CIDR strings ("127.0.0.0/8", "::1/128"); a single
    string is read as a comma- or space-separated list so it can come straight
    from an environment variable. A network with host bits set
    ("127.0.0.1/8") is rejected as a likely typo.
    """

    def __init__(self, allow: Iterable[str] | str = ()) -> None:
        self.allow: tuple[IPNetwork, ...] = _parse_allowlist(allow)

    def __repr__(self) -> str:
        return f"NetworkPolicy(allow={[str(n) for n in self.allow]!r})"

    def _allowlisted(self, address: str) -> bool:
        if not self.allow:
            return False
        try:
            addr = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        candidates: list[IPAddress] = [addr]
        # A mapped address reaches the same IPv4 host, so the IPv4 allowlist applies to it.
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            candidates.append(addr.ipv4_mapped)
        return any(a.version == n.version and a in n for a in candidates for n in self.allow)

    def check(self, address: str, host: str = "") -> None:
        """Raise AddressRefused unless `address` is globally routable or allowlisted."""
        if self._allowlisted(address):
            return
        refusal = classify(address)
        if refusal is not None:
            reason, via = refusal
            raise AddressRefused(host, address, reason, via)

    def allows(self, address: str) -> bool:
        """True when `check` would pass."""
        try:
            self.check(address)
        except AddressRefused:
            return False
        return True

    async def resolve(self, host: str, port: int) -> list[str]:
        """Resolve `host` and return its addresses, in resolver order, all checked.

        If ANY resolved address is refused the whole name is refused, even when
        others would pass: a name that publishes an internal address next to a
        public one is either misconfigured or probing (multi-record rebinding),
        and refusing it keeps the outcome independent of which record a later
        connection happens to pick. Raises ResolutionFailed when nothing resolves.
        """
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [host]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
            except (socket.gaierror, UnicodeError) as exc:
                raise ResolutionFailed(host, str(exc)) from exc
            addresses = []
            for family, _type, _proto, _canon, sockaddr in infos:
                if family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                ip = str(sockaddr[0])
                if ip not in addresses:
                    addresses.append(ip)
            if not addresses:
                raise ResolutionFailed(host, "no IPv4 or IPv6 address")
        for address in addresses:
            self.check(address, host)
        return addresses
