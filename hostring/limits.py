"""What the wire allows: one message-size limit that every gRPC client and server sets, identically.

gRPC's default receive limit is 4 MiB and its send limit unlimited, so a server could answer with a message its
client refuses to read. Every channel and server in hostring takes its options from here instead; per-field caps
of the frontier protocol live next to this limit and are documented in proto/hostring/v1/frontier.proto.
"""

from __future__ import annotations

from typing import Final

MAX_MESSAGE_BYTES: Final = 16 * 2**20
MAX_LINK_PAYLOAD_BYTES: Final = 8 * 2**10
"""Cap of Link.payload, the opaque client data a node keeps with an item (the Scrapy plug-in's serialised
request). 1000 leased items at the cap still fit in one message."""


def grpc_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Channel or server options that receive and send at most `max_message_bytes` per message."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
