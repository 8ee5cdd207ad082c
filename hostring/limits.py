"""What the wire allows: one message-size limit that every gRPC client and server sets, identically.

gRPC's default receive limit is 4 MiB and its send limit unlimited, so a server could answer with a message its
client refuses to read. Every channel and server in hostring takes its options from here instead; per-field caps
of the frontier protocol live next to this limit and are documented in proto/hostring/v1/frontier.proto.

The caps below are the ones a client needs to know to stay within them (how many links per call, how long a
Lease may wait, ...); frontier_node/validate.py holds the complete table, field by field, and applies it.
"""

from __future__ import annotations

from typing import Final

MAX_MESSAGE_BYTES: Final = 16 * 2**20
MAX_LINK_PAYLOAD_BYTES: Final = 8 * 2**10
"""Cap of Link.payload, the opaque client data a node keeps with an item (the Scrapy plug-in's serialised
request). 1000 leased items at the cap still fit in one message."""

MAX_URL_CHARS: Final = 8_192
"""URLs and fetch keys a node stores (source_key, lease_id, GetUrl): above any max URL length a node admits."""
MAX_ID_CHARS: Final = 256
"""Worker ids (they are journaled with every lease)."""
MAX_LINKS_PER_DISCOVER: Final = 10_000
"""Links in one Discover (clients route in batches of 256)."""
MAX_LINKS_PER_COMPLETE: Final = 200_000
"""Links in one Complete, and in all completions of one CompleteBatch together: a page with 150k links fits."""
MAX_COMPLETIONS_PER_BATCH: Final = 1_000
MAX_LEASE_ITEMS: Final = 1_000
MAX_WAIT_MS: Final = 30_000
"""The longest a Lease may wait for an item (long poll)."""
MAX_ROBOTS_BODY_BYTES: Final = 500 * 1024
"""A robots.txt body as a worker sends it: RFC 9309 asks parsers to read at least 500 KiB; the rest is cut."""
MAX_GENERATION: Final = 2**53 - 1
"""Lease generations (and anything journaled as an integer) stay exact in JSON and in SQLite's INTEGER."""
REPORT_CHUNK_BYTES: Final = 2**20
"""ReportStream sends the coverage report's JSON in pieces of at most this many bytes."""


def grpc_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Channel or server options that receive and send at most `max_message_bytes` per message."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
