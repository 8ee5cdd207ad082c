"""URL identity as the test web's servers (and its generator) see it: the oracle's own, on purpose.

A request target names a page the way real servers read it: percent-encoded unreserved characters decoded, hex
case ignored, dot segments removed (RFC 3986 §6.2.2, §5.2.4), ``utm_*`` parameters and the fragment ignored.
This is written here independently of ``hostring.urls``: the judge must not share code with what it judges.
"""

from __future__ import annotations

import re

__all__ = ["PCT_RE", "TRACKING_PREFIX", "UNRESERVED", "canonical_target", "pct_normalize", "remove_dot_segments"]

UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
TRACKING_PREFIX = "utm_"
PCT_RE = re.compile(r"%([0-9A-Fa-f]{2})")


def pct_normalize(s: str) -> str:
    """Upper-case percent-encoding hex and decode unreserved characters (RFC 3986 §6.2.2.1-2)."""

    def fix(m: re.Match[str]) -> str:
        ch = chr(int(m.group(1), 16))
        return ch if ch in UNRESERVED else "%" + m.group(1).upper()

    return PCT_RE.sub(fix, s)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4."""
    out: list[str] = []
    inp = path
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith(("./", "/./")):
            inp = inp[2:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = inp[3:]
            if out:
                out.pop()
        elif inp == "/..":
            inp = "/"
            if out:
                out.pop()
        elif inp in (".", ".."):
            inp = ""
        else:
            i = inp.find("/", 1 if inp.startswith("/") else 0)
            seg, inp = (inp, "") if i < 0 else (inp[:i], inp[i:])
            out.append(seg)
    return "".join(out)


def canonical_target(target: str) -> str:
    """The resource a request target names: normalized path, tracking (utm_*) params and fragment dropped."""
    target = target.split("#", 1)[0]
    path, sep, query = target.partition("?")
    path = remove_dot_segments(pct_normalize(path)) or "/"
    if not sep:
        return path
    kept = [p for p in query.split("&") if p and not pct_normalize(p).lower().startswith(TRACKING_PREFIX)]
    return path + ("?" + pct_normalize("&".join(kept)) if kept else "")
