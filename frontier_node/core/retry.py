"""Which outcomes are retried, after how long, and when retrying stops."""

from __future__ import annotations

import enum
import random
from typing import NamedTuple

from frontier_node.core.config import RetryConfig


class Action(enum.Enum):
    """What to do with a completed item."""

    DONE = "done"
    RETRY = "retry"
    FAIL = "fail"


class Disposition(NamedTuple):
    action: Action
    reason: str


# Transport errors worth another try: the server or the path to it may recover.
RETRYABLE_ERRORS = frozenset(
    {
        "timeout",
        "connect_timeout",
        "read_timeout",
        "write_timeout",
        "total_timeout",
        "connect_error",
        "dns_error",
        "network_error",
        "protocol_error",
        "tls_error",
        "worker_shutdown",
    }
)
# Statuses that say "not now" rather than "no".
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Statuses that say the host is struggling: back the host off as well as the URL.
OVERLOAD_STATUSES = frozenset({429, 503})


def classify(status: int, error_class: str) -> Disposition:
    """The classification rule: transport errors and overload statuses retry; other errors fail; responses are done.

    Remembered per (status, error_class): a completion asks up to three times, and few pairs ever occur.
    """
    key = (status, error_class)
    known = _CLASSIFIED.get(key)
    if known is None:
        known = _classify(status, error_class)
        if len(_CLASSIFIED) < _CLASSIFIED_MAX:
            _CLASSIFIED[key] = known
    return known


_CLASSIFIED: dict[tuple[int, str], Disposition] = {}
_CLASSIFIED_MAX = 4_096  # error classes are worker-given text: the memo stays bounded whatever they send


def _classify(status: int, error_class: str) -> Disposition:
    if error_class:
        if error_class in RETRYABLE_ERRORS:
            return Disposition(Action.RETRY, error_class)
        return Disposition(Action.FAIL, error_class)
    if status in RETRYABLE_STATUSES:
        return Disposition(Action.RETRY, f"http_{status}")
    if status <= 0:
        return Disposition(Action.FAIL, "no_response")
    return Disposition(Action.DONE, str(status))


def backoff_s(attempt: int, config: RetryConfig, rng: random.Random) -> float:
    """Delay before attempt `attempt + 1`: base x 2^(attempt-1), capped, times 1 + jitter in [0, config.jitter]."""
    base = min(config.cap_s, config.base_s * 2.0 ** max(0, attempt - 1))
    return base * (1.0 + rng.uniform(0.0, config.jitter))
