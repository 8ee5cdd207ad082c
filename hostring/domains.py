"""Registrable domains, the shard key of the ring, from the public-suffix list bundled with the package.

The list is read once from the wheel's own data file; nothing here ever touches the network, so two
processes with the same package version always agree on which node owns a domain.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from publicsuffixlist import PublicSuffixList

# The constructor with no source opens the bundled public_suffix_list.dat (no download, no update check).
# The private section stays on, so every `*.github.io` site is its own domain, as it is its own operator.
_PSL = PublicSuffixList(accept_unknown=True, only_icann=False)


def _is_ip_literal(host: str) -> bool:
    """True for an IPv4 dotted quad or an IPv6 address (with or without brackets)."""
    if ":" in host:
        return True
    if not host[-1:].isdigit():
        return False
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=65536)
def registrable_domain(host: str) -> str:
    """The registrable domain ("eTLD+1") of a canonical host: `a.b.example.co.uk` -> `example.co.uk`.

    IP literals, single labels (`localhost`) and hosts that are themselves a public suffix (`co.uk`,
    `github.io`) have no registrable part and are returned unchanged: they are their own shard key.
    An unknown top-level label counts as a public suffix, so `printer.lan` -> `printer.lan`.
    """
    host = host.lower().removesuffix(".")
    if not host or _is_ip_literal(host):
        return host
    domain = _PSL.privatesuffix(host)
    return domain if domain else host
