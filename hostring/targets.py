"""A link's fetch target: what a frontier keeps of its URL identity (key, host, origin, domain), found cheaply.

The frontier admits every discovered link through `fetch_target`; it gives identify()'s answer without building
the whole UrlIdentity, on the same fast path for links already in canonical form (hostring.urls), which it shares
the private pieces of.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple, cast

from hostring.urls import (
    _CANONICAL,
    DEFAULT_QUERY_POLICY,
    WEB_SCHEMES,
    QueryPolicy,
    _authority,
    _identify_general,
)

__all__ = ["FetchTarget", "fetch_target"]


class FetchTarget(NamedTuple):
    """What a frontier keeps of a link's identity: the fetch key (which is also the URL fetched), the host, the
    origin and the registrable domain."""

    fetch_key: str
    host: str
    origin: str
    domain: str


_target = cast(Callable[[tuple[str, str, str, str]], FetchTarget], partial(tuple.__new__, FetchTarget))


def fetch_target(
    observed: str,
    base: str = "",
    *,
    policy: QueryPolicy = DEFAULT_QUERY_POLICY,
    max_length: int = 2048,
    schemes: frozenset[str] = WEB_SCHEMES,
) -> FetchTarget:
    """identify()'s fetch key, host, origin and domain (or its UrlRejected), without building the UrlIdentity.

    The frontier admits every link through here: a link already in canonical form costs the regular expression,
    the cached authority and one small tuple (a UrlIdentity's ten slots cost about as much as the rest of the fast
    path). The lines below are hostring.urls._canonical_identity's; tests hold the two to the same answers.
    """
    m = _CANONICAL.fullmatch(observed)
    if m is not None:
        scheme, authority, path, query, _ = m.groups()
        scheme = "https" if len(scheme) == 5 else "http"
        if scheme in schemes and not (path and "/." in path):
            auth = _authority(scheme, authority.lower())
            if auth.reason is None:
                if query:
                    query = policy.filter_query(query)
                key = f"{auth.origin}{path or '/'}?{query}" if query else f"{auth.origin}{path or '/'}"
                if len(key) <= max_length:
                    return _target((observed if key == observed else key, auth.host, auth.origin, auth.domain))
    ident = _identify_general(observed, base, policy, max_length, schemes)
    return _target((ident.fetch_key, ident.host, ident.origin, ident.domain))
