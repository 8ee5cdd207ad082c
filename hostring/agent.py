"""The robots.txt name of a User-Agent: RFC 9309's product token, the first product's name.

A node matches robots.txt groups by it, and a worker scopes `X-Robots-Tag: <token>: ...` headers by it; both
take it from the same User-Agent the fetcher sends, through this one rule.
"""

from __future__ import annotations

import re
from typing import Final

_PRODUCT_TOKEN: Final = re.compile(r"[A-Za-z_-]+")


def product_token(user_agent: str) -> str:
    """The name of the first product of a User-Agent header: "hostring/0.1 (+https://x)" -> "hostring".

    ValueError when that name is not an RFC 9309 product token (letters, '_' and '-' only).
    """
    words = user_agent.split(maxsplit=1)
    name = words[0].split("/", 1)[0] if words else ""
    if not _PRODUCT_TOKEN.fullmatch(name):
        raise ValueError(f"User-Agent {user_agent!r} must start with an RFC 9309 product token (letters, '_', '-')")
    return name
