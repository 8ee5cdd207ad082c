"""Retry-After (RFC 9110 §10.2.3) as seconds from now, read the same way by the fetch worker and the Scrapy plug-in."""

from __future__ import annotations

import email.utils
import math
import time
from datetime import UTC


def parse_retry_after(value: str | bytes | None, now: float | None = None) -> float:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP-date); -1 if absent or unreadable."""
    if not value:
        return -1.0
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
    if not text:
        return -1.0
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else -1.0
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return -1.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
