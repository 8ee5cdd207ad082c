"""Journal lines in and out: how an admitted item's data is packed, and current state rebuilt by replay."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.revisit import apply_revisit, is_revisit_data
from frontier_node.core.states import Event, State, next_state

# Field order of the tab-separated `data` of an admit line. Normalized URLs and hosts hold no tabs. The
# payload (base64, no tabs either) is an eleventh field only when the item has one, so lines without stay as
# they always were.
ADMIT_FIELDS = ("url", "host", "origin", "domain", "kind", "depth", "priority", "seq", "redirect_hops", "source")


def pack_admit(item: Item) -> str:
    """The `data` of an admit line (and of lines that move an item elsewhere): what replay needs to rebuild it."""
    data = "\t".join(
        (
            item.url,
            item.host,
            item.origin,
            item.domain,
            str(int(item.kind)),
            str(item.depth),
            str(item.priority),
            str(item.seq),
            str(item.redirect_hops),
            item.source,
        )
    )
    return data + "\t" + base64.b64encode(item.payload).decode("ascii") if item.payload else data


def unpack_admit(key: str, data: str) -> Item:
    """Rebuild a fresh (discovered) item from the `data` of its admit line."""
    fields = data.split("\t")
    payload = b""
    if len(fields) == len(ADMIT_FIELDS) + 1:
        try:
            payload = base64.b64decode(fields.pop(), validate=True)
        except binascii.Error as e:
            raise ValueError(f"admit line of {key!r}: payload is not base64: {e}") from e
    url, host, origin, domain, kind, depth, priority, seq, hops, source = fields
    return Item(
        key=key,
        url=url,
        host=host,
        origin=origin,
        domain=domain,
        kind=Kind(int(kind)),
        depth=int(depth),
        priority=int(priority),
        seq=int(seq),
        redirect_hops=int(hops),
        source=source,
        payload=payload,
    )


@dataclass(slots=True)
class Replayed:
    """What replay knows of one key: enough to compare with the live row."""

    item: Item | None
    state: State
    attempt: int
    generation: int
    reason: str


def replay(entries: Iterable[Entry]) -> dict[str, Replayed]:
    """Fold journal lines into the current state of every key, checking each move against the table.

    Lines that set a page's revisit state carry it (revisit.pack_revisit): the replayed item then holds its
    due time and change history as of its last such line.
    """
    out: dict[str, Replayed] = {}
    for e in entries:
        event = Event(e.event)
        cur = out.get(e.key)
        if event is Event.LATE_EVIDENCE:
            continue
        if cur is None:
            cur = out[e.key] = Replayed(None, State(e.from_state), 0, 0, "")
        if is_revisit_data(e.data):
            if cur.item is not None:
                apply_revisit(cur.item, e.data)
        elif e.data:
            cur.item = unpack_admit(e.key, e.data)
        if State(e.from_state) is not cur.state:
            raise ValueError(f"journal line {e.seq} moves {e.key} from {e.from_state}, but replay has {cur.state}")
        cur.state = next_state(cur.state, event, e.key)
        if cur.state.value != e.to_state:
            raise ValueError(f"journal line {e.seq} says {e.to_state}, the table says {cur.state}")
        cur.attempt, cur.generation, cur.reason = e.attempt, e.generation, e.reason
    return out
