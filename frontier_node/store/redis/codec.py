"""What the Redis store writes: key names, packed rows, journal members and robots records, and their inverses.

Key layout (`ns` is the namespace; the part in braces is the Redis Cluster hash tag):

    ns:{d:<domain>}:fence         hash  owner, epoch: who may write this domain, as of which ring epoch
    ns:{d:<domain>}:items         hash  fetch key -> packed row "state␟host␟order␟first␟json"
    ns:{d:<domain>}:q:<host>      zset  backlog of scheduled items, all scores 0, member "order:key"
    ns:{d:<domain>}:sched         hash  host -> number of scheduled items (scheduled_counts without scans)
    ns:{d:<domain>}:states        hash  state -> number of rows (counts_by_state without scans)
    ns:{d:<domain>}:robots        hash  origin -> "first␟host␟json"
    ns:{d:<domain>}:j:<writer>    zset  journal lines written by node <writer>, all scores 0, member "seq json"
    ns:{d:<domain>}:writers       set   node ids that ever wrote journal lines to this domain
    ns:{d:<domain>}:meta          hash  imax: highest item seq (zero-padded) seen here; jmax, the highest journal
                                        seq, only in stores written before the journals' last lines were read
    ns:{n:<node>}:meta            hash  set_meta values of the node
    ns:{n:<node>}:domains         set   every domain the node ever wrote to, claimed or adopted
    ns:{all}:domains              set   every domain of the namespace (what a new ring's owners look through)
    ns:{n:<node>}:orphans         zset  note() lines whose key names no domain (unparseable keys)
    ns:{n:<node>}:keydom/hostdom  hash  key/host -> domain, only where it differs from the one derived from the text

Ordering: `order` is `f"{priority + 2**63:020d}:{seq:020d}"`, so plain byte order of members is exactly
(priority, seq) order for every signed 64-bit priority and every seq below 10**20, with the key as last
tie-break; a backlog page is one ZRANGEBYLEX. A double score could not do this (53 bits for two numbers).
Journal members start with the 20-digit seq, so one writer's lines are a ZRANGEBYLEX range as well.
`first` orders scans as the reference store's dicts do (first write first): for a row, the seq of the first
journal line that wrote it; for a robots record, a nanosecond clock reading of its first save. The write script
keeps the stored `first` when it replaces a row or record.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any, Final

import orjson

from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State

# Format 2 added the revisit fields of a row (checked_at .. simhash); a row's payload is base64 in both. Format-1
# exports (no revisit fields, a payload or none) still import.
EXPORT_FORMAT: Final = 2
IMPORT_FORMATS: Final = frozenset({1, 2})
SEP: Final = "\x1f"
PRIORITY_OFFSET: Final = 2**63
SEQ_LIMIT: Final = 10**20
EPOCH_LIMIT: Final = 2**53
_ORDER_LEN: Final = 41  # "pppp…(20):ssss…(20)"

# Row JSON: every Item field except the key (the hash field) and state/host/priority/seq (in the prefix). The
# first _BASE_FIELDS always; the _REVISIT_FIELDS when a page has revisit numbers or a payload; the payload
# (base64) last, and only when there is one. So a row is 17 entries long (neither), 25 (revisit numbers) or 26
# (both); a row written before the revisit fields existed is 18 long when it has a payload.
_ROW_FIELDS: Final = (
    "url", "origin", "domain", "kind", "depth", "redirect_hops", "attempt", "generation", "reason", "deadline",
    "due_at", "status", "etag", "last_modified", "evidence", "digest", "source", "checked_at", "stored_at",
    "interval_s", "visits", "changes", "watched_s", "changed_s", "simhash", "payload",
)  # fmt: skip
_BASE_FIELDS: Final = 17
_REVISIT_FIELDS: Final = 8
_WITH_REVISIT: Final = _BASE_FIELDS + _REVISIT_FIELDS
_ALL_ITEM_FIELDS: Final = frozenset({"key", "state", "host", "priority", "seq", *_ROW_FIELDS})
if frozenset(f.name for f in dataclasses.fields(Item)) != _ALL_ITEM_FIELDS:
    raise ImportError("frontier_node.store.redis: Item fields changed; update _ROW_FIELDS and the row format")
if Entry._fields[:3] != ("seq", "run_id", "key") or len(Entry._fields) != 13:
    raise ImportError("frontier_node.store.redis: Entry fields changed; update the journal line format")

_TEXT_STATE: Final[dict[str, State]] = {s.value: s for s in State}
_STATE_TEXT: Final[dict[object, str]] = {**{s: s.value for s in State}, **{s.value: s.value for s in State}}
_NO_REVISIT: Final = (0,) * _REVISIT_FIELDS
_INT_KIND: Final[dict[int, Kind]] = {int(k): k for k in Kind}


_C_ENCODER: Final = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_ENCODE: Final = (
    None
    if _C_ENCODER is None
    else _C_ENCODER(
        None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
)


def _stdlib_json(value: object) -> str:
    """json.dumps(value, separators=(",", ":")) without its per-call set-up: the C encoder made once."""
    if _ENCODE is None:
        return json.dumps(value, separators=(",", ":"))
    return "".join(_ENCODE(value, 0))


def compact_json(value: object) -> str:
    """The compact JSON text of `value` (lists, tuples, str, int, float, bool, None), read back by json.loads as
    json.dumps(value, separators=(",", ":")) would be.

    Rows and journal lines are encoded one by one on the core thread, and encoding was most of packing a flush:
    orjson writes them about 4x faster than the stdlib's C encoder. Its text is the stdlib's except for how a float's
    exponent is spelled (1e16, not 1e+16: the same number). Where they would differ in what is read back, the
    stdlib's encoder writes the text instead, so a stored form means what it always meant: any null (orjson writes
    NaN and infinities as null, the stdlib as NaN and Infinity, which json.loads reads back as floats), any text that
    is not ASCII or holds DEL (the stdlib escapes both), and what orjson refuses (an int beyond 64 bits).
    """
    try:
        out = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _stdlib_json(value)
    if out.isascii() and "null" not in out and "\x7f" not in out:  # checked on str: twice as fast as on bytes
        return out
    return _stdlib_json(value)


def text(value: object) -> str:
    """A reply element as str, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def int_or(value: object, default: int) -> int:
    """A reply element as int, `default` when it is nil."""
    return default if value is None else int(text(value))


def check_tag_free(what: str, value: str) -> None:
    if "{" in value or "}" in value:
        raise ValueError(f"{what} {value!r} must not contain braces: they would break the Cluster hash tag")


def glob_escape(literal: str) -> str:
    """`literal` as a literal in a Redis glob pattern (SCAN / ZSCAN MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in literal)


# -- key names ---------------------------------------------------------------------------------------------


class Keys:
    """The key names of one node in one namespace: per-domain keys carry the `{d:<domain>}` hash tag."""

    def __init__(self, namespace: str, node_id: str) -> None:
        check_tag_free("node_id", node_id)
        check_tag_free("namespace", namespace)
        self.namespace = namespace
        self.node = f"{namespace}:{{n:{node_id}}}:"  # prefix of the node-scoped keys
        self.all_domains = f"{namespace}:{{all}}:domains"

    def domain(self, domain: str, suffix: str) -> str:
        """The key `suffix` of `domain` (`suffix` "" gives the prefix every key of the domain starts with)."""
        return f"{self.namespace}:{{d:{domain}}}:{suffix}"

    def script_keys(self, domain: str, writer: str) -> list[str]:
        """KEYS 1..8 of the write script for `domain`, with `writer`'s journal."""
        check_tag_free("domain", domain)
        d = f"{self.namespace}:{{d:{domain}}}:"
        return [d + "fence", d + "items", d + "meta", d + "states", d + "sched", d + "robots", d + f"j:{writer}",
                d + "writers"]  # fmt: skip


# -- item rows ---------------------------------------------------------------------------------------------


def check_order(priority: int, seq: int) -> None:
    """ValueError when (priority, seq) has no `order` text (see the module docstring)."""
    if not (0 <= priority + PRIORITY_OFFSET < SEQ_LIMIT and 0 <= seq < SEQ_LIMIT):
        raise ValueError(f"priority {priority} / seq {seq} out of range (signed 64-bit priority, 0 <= seq < 1e20)")


def after_bound(after: tuple[int, int]) -> str | None:
    """The ZRANGEBYLEX lower bound for members strictly after (priority, seq); None when nothing can be."""
    priority, seq = after
    p = priority + PRIORITY_OFFSET
    if p < 0:
        return "-"
    if p >= SEQ_LIMIT:
        return None
    if seq < 0:
        return f"[{p:020d}:"
    if seq >= SEQ_LIMIT - 1:
        return f"[{p:020d};"
    return f"[{p:020d}:{seq:020d};"


RowFields = tuple[Any, ...]
"""An item's row fields as they stood at one moment: state, host, priority, seq, then _ROW_FIELDS in order."""


def row_fields(item: Item) -> RowFields:
    """A snapshot of `item`'s row (a tuple, a fraction of a pack_row): buffered at record(), packed once at flush.
    ValueError, as pack_row, for a row that cannot be stored."""
    if SEP in item.host:
        raise ValueError(f"item {item.key!r}: host {item.host!r} holds a unit separator")
    check_order(item.priority, item.seq)
    return (
        item.state, item.host, item.priority, item.seq, item.url, item.origin, item.domain, item.kind, item.depth,
        item.redirect_hops, item.attempt, item.generation, item.reason, item.deadline, item.due_at, item.status,
        item.etag, item.last_modified, item.evidence, item.digest, item.source, item.checked_at, item.stored_at,
        item.interval_s, item.visits, item.changes, item.watched_s, item.changed_s, item.simhash, item.payload,
    )  # fmt: skip


def pack_fields(f: RowFields, first: int) -> str:
    """The stored form of a row snapshot: the fields the script needs up front, the rest as a JSON list.

    `first` is the seq of the journal line that first wrote the row (the script keeps a stored one). The revisit
    numbers and the client payload are added only when there are some (see _ROW_FIELDS). The JSON list is encoded
    from slices of the snapshot (a tuple encodes as a list; Kind, an int, as its number): no list built per row.
    """
    payload = f[29]
    if payload:
        fields: tuple[object, ...] = (*f[4:29], base64.b64encode(payload).decode("ascii"))
    elif f[21:29] != _NO_REVISIT:  # any revisit number set (each is a number: equal to 0 exactly when falsy)
        fields = f[4:29]
    else:
        fields = f[4:21]
    state = _STATE_TEXT.get(f[0]) or State(f[0]).value
    # byte order of the order text is (priority, seq) order; row_fields checked both
    return (
        f"{state}{SEP}{f[1]}{SEP}{f[2] + PRIORITY_OFFSET:020d}:{f[3]:020d}{SEP}{first:020d}{SEP}{compact_json(fields)}"
    )


def pack_row(item: Item, first: int) -> str:
    """The stored form of an item row (pack_fields of its snapshot now)."""
    return pack_fields(row_fields(item), first)


def unpack_row(key: str, packed: str) -> Item:
    """The Item of a stored row (inverse of pack_row)."""
    state, host, order, _, rest = packed.split(SEP, 4)
    f = json.loads(rest)
    n = len(f)
    item = Item(
        key, f[0], host, f[1], f[2], _INT_KIND[f[3]], f[4], int(order[:20]) - PRIORITY_OFFSET, int(order[21:]),
        f[5], _TEXT_STATE[state], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15], f[16],
    )  # fmt: skip
    if n >= _WITH_REVISIT:
        (item.checked_at, item.stored_at, item.interval_s, item.visits, item.changes, item.watched_s,
         item.changed_s, item.simhash) = f[_BASE_FIELDS:_WITH_REVISIT]  # fmt: skip
    if n in (_BASE_FIELDS + 1, _WITH_REVISIT + 1):
        item.payload = base64.b64decode(f[-1])
    return item


def row_state(packed: str) -> str:
    return packed[: packed.index(SEP)]


def row_first(packed: str) -> str:
    """The `first` field of a packed row: its fourth."""
    start = packed.index(SEP, packed.index(SEP) + 1) + _ORDER_LEN + 2
    return packed[start : start + 20]


def export_item(item: Item, first: int) -> dict[str, object]:
    """An item row as JSON-ready fields, with its first-write ordinal."""
    out = dataclasses.asdict(item)
    out["kind"] = int(item.kind)
    out["state"] = item.state.value
    out["payload"] = base64.b64encode(item.payload).decode("ascii")
    out["first"] = first
    return out


def import_item(fields: dict[str, Any]) -> tuple[Item, int]:
    """(item, first-write ordinal) of an exported row (inverse of export_item)."""
    values = dict(fields)
    first = int(values.pop("first"))
    values["kind"] = _INT_KIND[int(values["kind"])]
    values["state"] = _TEXT_STATE[str(values["state"])]
    values["payload"] = base64.b64decode(str(values.get("payload", "")))
    return Item(**values), first


# -- journal lines -----------------------------------------------------------------------------------------


def check_seq(seq: int) -> None:
    if not 0 <= seq < SEQ_LIMIT:
        raise ValueError(f"journal seq {seq} out of range (0 <= seq < 1e20)")


def pack_line(entry: Entry, epoch: int) -> str:
    """A journal member: 20-digit seq (the sort key), then the key first in JSON so ZSCAN MATCH can find it."""
    check_seq(entry.seq)
    return pack_checked_line(entry, epoch)


def pack_checked_line(entry: Entry, epoch: int) -> str:
    """pack_line of an entry whose seq was checked already (the store checks when it buffers the line)."""
    body = (entry[2], epoch, entry[1], *entry[3:])
    return f"{entry[0]:020d}" + compact_json(body)


def unpack_line(member: str) -> tuple[int, Entry]:
    """(epoch, Entry) of a journal member."""
    f = json.loads(member[20:])
    return f[1], Entry(int(member[:20]), f[2], f[0], *f[3:])


def key_pattern(key: str) -> str:
    """ZSCAN MATCH pattern for the journal members of one key: the seq, then `["<key>",` and anything."""
    return "?" * 20 + glob_escape("[" + json.dumps(key) + ",") + "*"


# -- robots records ----------------------------------------------------------------------------------------


def robots_json(record: dict[str, object]) -> str:
    """The JSON text a robots record is stored as."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def pack_robots(first: int, host: str, record_json: str) -> str:
    """The stored form of a robots record: its first-save ordinal, its host and its robots_json() text."""
    return f"{first:020d}{SEP}{host}{SEP}{record_json}"


def robots_first(packed: str) -> int:
    """The first-save ordinal of a stored robots record."""
    return int(packed[:20])


def with_first(packed: str, first: int) -> str:
    """A stored robots record with its first-save ordinal replaced by `first`."""
    return f"{first:020d}{packed[20:]}"


def unpack_robots(origin: str, packed: str) -> tuple[str, str, dict[str, object]]:
    """(origin, host, record) of a stored robots record."""
    _, host, body = packed.split(SEP, 2)
    record: dict[str, object] = json.loads(body)
    return origin, host, record


def json_array(strings: list[str]) -> str:
    """A JSON array of strings for the write script's cjson.decode; "{}" for none (cjson's empty table)."""
    return json.dumps(strings, ensure_ascii=False, separators=(",", ":")) if strings else "{}"
