"""The network policy: which resolved addresses a fetch may connect to.

Addresses here are only classified, never connected to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fetch_worker.netpolicy import AddressRefused, NetworkPolicy, ResolutionFailed, classify

REFUSED: list[tuple[str, str, str]] = [
    # (address, reason, via)
    ("0.0.0.0", "unspecified", ""),
    ("0.1.2.3", "this_network", ""),
    ("10.1.2.3", "private", ""),
    ("100.64.0.1", "shared_cgnat", ""),
    ("100.127.255.254", "shared_cgnat", ""),
    ("127.0.0.1", "loopback", ""),
    ("127.255.0.9", "loopback", ""),
    ("169.254.169.254", "link_local", ""),
    ("172.16.0.1", "private", ""),
    ("172.31.255.255", "private", ""),
    ("192.0.0.8", "ietf_protocol", ""),
    ("192.0.2.1", "documentation", ""),
    ("192.88.99.1", "reserved", ""),
    ("192.168.1.1", "private", ""),
    ("198.18.0.1", "benchmarking", ""),
    ("198.19.255.1", "benchmarking", ""),
    ("198.51.100.7", "documentation", ""),
    ("203.0.113.9", "documentation", ""),
    ("224.0.0.1", "multicast", ""),
    ("239.255.255.250", "multicast", ""),
    ("240.0.0.1", "reserved", ""),
    ("255.255.255.255", "broadcast", ""),
    ("::", "unspecified", ""),
    ("::1", "loopback", ""),
    ("fe80::1", "link_local", ""),
    ("fe80::1%eth0", "link_local", ""),
    ("fc00::1", "private", ""),
    ("fd12:3456::1", "private", ""),
    ("fec0::1", "site_local", ""),
    ("ff02::1", "multicast", ""),
    ("2001:db8::1", "documentation", ""),
    ("3fff::1", "documentation", ""),
    ("2001:2::1", "ietf_protocol", ""),
    ("64:ff9b:1::1", "nat64_local", ""),
    ("100::1", "reserved", ""),
    ("4000::1", "reserved", ""),
    ("::ffff:127.0.0.1", "loopback", "ipv4_mapped"),
    ("::ffff:10.0.0.1", "private", "ipv4_mapped"),
    ("::ffff:169.254.169.254", "link_local", "ipv4_mapped"),
    ("::127.0.0.1", "loopback", "ipv4_compatible"),
    ("::8.8.8.8", "ipv4_compatible", ""),
    ("64:ff9b::7f00:1", "loopback", "nat64"),
    ("64:ff9b::a9fe:a9fe", "link_local", "nat64"),
    ("2002:7f00:1::1", "loopback", "6to4"),
    ("2002:c0a8:101::1", "private", "6to4"),
    # Teredo: server 65.54.227.120, client obfuscated 192.168.1.1 (~ of c0a8:0101).
    ("2001:0:4136:e378:8000:63bf:3f57:fefe", "private", "teredo"),
    ("not-an-address", "invalid", ""),
    ("[::1]", "invalid", ""),
]

ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above CGNAT
    "172.32.0.1",  # just above 172.16/12
    "198.17.255.255",
    "198.20.0.0",
    "2606:4700::1",
    "2a00:1450:4001::1",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo with global client 8.8.8.8
]


@pytest.mark.parametrize(("address", "reason", "via"), REFUSED)
def test_refused_addresses_carry_a_reason(address: str, reason: str, via: str) -> None:
    policy = NetworkPolicy()
    with pytest.raises(AddressRefused) as info:
        policy.check(address)
    assert (info.value.reason, info.value.via) == (reason, via)
    assert info.value.address == address
    assert reason in str(info.value)
    assert not policy.allows(address)


@pytest.mark.parametrize("address", ALLOWED)
def test_global_addresses_are_allowed(address: str) -> None:
    NetworkPolicy().check(address)
    assert classify(address) is None


def test_allowlist_admits_only_its_networks() -> None:
    policy = NetworkPolicy(allow=["127.0.0.0/8", "::1/128", "10.1.0.0/16"])
    for address in ["127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "::ffff:127.0.0.1", "8.8.8.8"]:
        policy.check(address)
    for address in ["10.2.0.1", "192.168.0.1", "::2", "169.254.169.254", "fe80::1"]:
        with pytest.raises(AddressRefused):
            policy.check(address)


def test_allowlist_from_a_single_string() -> None:
    policy = NetworkPolicy(allow="127.0.0.0/8, ::1/128")
    assert [str(n) for n in policy.allow] == ["127.0.0.0/8", "::1/128"]
    assert policy.allows("::1")


@pytest.mark.parametrize("bad", ["127.0.0.1/8", "300.0.0.0/8", "localhost", "10.0.0.0/33", "::1/129", ""])
def test_bad_cidr_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match=r"invalid CIDR .* in the network allowlist"):
        NetworkPolicy(allow=[bad])


def test_refusal_message_names_host_address_and_reason() -> None:
    with pytest.raises(AddressRefused) as info:
        NetworkPolicy().check("::ffff:127.0.0.1", host="evil.example")
    text = str(info.value)
    assert "'evil.example'" in text and "::ffff:127.0.0.1" in text and "loopback" in text
    assert "ipv4_mapped" in text


@given(st.ip_addresses(v=4))
def test_v4_verdict_is_the_same_through_a_mapped_v6_address(addr: ipaddress.IPv4Address) -> None:
    plain = classify(str(addr))
    mapped = classify(f"::ffff:{addr}")
    assert (plain is None) == (mapped is None)
    if plain is not None and mapped is not None:
        assert plain[0] == mapped[0]


@given(st.ip_addresses(v=4))
def test_v4_refusals_agree_with_the_standard_library_on_private_space(addr: ipaddress.IPv4Address) -> None:
    # Whatever Python calls private, loopback, link-local, multicast or reserved is refused here too.
    if addr.is_private or addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_reserved:
        assert classify(str(addr)) is not None


def _fake_getaddrinfo(answers: dict[str, list[str]]) -> Any:
    async def getaddrinfo(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for ip in answers[host]:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            out.append((family, socket.SOCK_STREAM, 6, "", (ip, port)))
        return out

    return getaddrinfo


def _resolve(policy: NetworkPolicy, host: str, answers: dict[str, list[str]]) -> list[str]:
    async def go() -> list[str]:
        asyncio.get_running_loop().getaddrinfo = _fake_getaddrinfo(answers)  # type: ignore[method-assign]
        return await policy.resolve(host, 80)

    return asyncio.run(go())


def test_resolve_returns_every_checked_address_in_order() -> None:
    answers = {"pub.test": ["2606:4700::1", "1.1.1.1", "1.1.1.1", "8.8.8.8"]}
    assert _resolve(NetworkPolicy(), "pub.test", answers) == ["2606:4700::1", "1.1.1.1", "8.8.8.8"]


def test_resolve_refuses_a_name_if_any_record_is_refused() -> None:
    answers = {"mixed.test": ["8.8.8.8", "127.0.0.1"]}
    with pytest.raises(AddressRefused) as info:
        _resolve(NetworkPolicy(), "mixed.test", answers)
    assert (info.value.host, info.value.address, info.value.reason) == ("mixed.test", "127.0.0.1", "loopback")


def test_resolve_allowlisted_internal_name() -> None:
    answers = {"intranet.test": ["10.1.2.3"]}
    assert _resolve(NetworkPolicy(allow=["10.0.0.0/8"]), "intranet.test", answers) == ["10.1.2.3"]


def test_resolve_unknown_name_is_resolution_failed() -> None:
    with pytest.raises(ResolutionFailed, match=r"nowhere\.test"):
        _resolve(NetworkPolicy(), "nowhere.test", {})


def test_resolve_ip_literal_skips_dns_and_is_checked() -> None:
    assert _resolve(NetworkPolicy(), "8.8.8.8", {}) == ["8.8.8.8"]
    with pytest.raises(AddressRefused):
        _resolve(NetworkPolicy(), "127.0.0.1", {})


def test_resolve_numeric_trick_spellings_are_caught_after_resolution() -> None:
    # getaddrinfo turns "2130706433" or "0x7f.1" into 127.0.0.1; the verdict is on that result.
    answers = {"2130706433": ["127.0.0.1"], "0x7f.1": ["127.0.0.1"]}
    for host in answers:
        with pytest.raises(AddressRefused):
            _resolve(NetworkPolicy(), host, answers)


def test_real_localhost_resolves_to_loopback_and_is_refused() -> None:
    # /etc/hosts lookup only: no packet leaves the machine.
    async def go() -> None:
        await NetworkPolicy().resolve("localhost", 80)

    with pytest.raises(AddressRefused) as info:
        asyncio.run(go())
    assert info.value.reason == "loopback"
