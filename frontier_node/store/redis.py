"""The Redis store of a frontier node: one Cluster slot per registrable domain, every write fenced by ring epoch.

Key layout (`ns` is the namespace; the part in braces is the Redis Cluster hash tag):

    ns:{d:<domain>}:fence         hash  owner, epoch: who may write this domain, as of which ring epoch
    ns:{d:<domain>}:items         hash  fetch key -> packed row "state␟host␟order␟first␟json"
    ns:{d:<domain>}:q:<host>      zset  backlog of scheduled items, all scores 0, member "order:key"
    ns:{d:<domain>}:sched         hash  host -> number of scheduled items (scheduled_counts without scans)
    ns:{d:<domain>}:states        hash  state -> number of rows (counts_by_state without scans)
    ns:{d:<domain>}:robots        hash  origin -> "first␟host␟json"
    ns:{d:<domain>}:j:<writer>    zset  journal lines written by node <writer>, all scores 0, member "seq json"
    ns:{d:<domain>}:writers       set   node ids that ever wrote journal lines to this domain
    ns:{d:<domain>}:meta          hash  jmax, imax: highest journal and item seq (zero-padded) seen here
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

Fencing: every flush writes each domain with one Lua script (EVALSHA, all keys in the domain's slot) that
first reads the fence: the batch is refused whole when the fence epoch is greater than the writer's, or equal
with another owner, and the store raises FencedOut. Otherwise the batch lands atomically, and when the
writer's epoch is newer than the fence the write also moves the fence to (writer, epoch): under the newer ring
the writer owns the domain, and every node still on an older epoch is locked out from then on. `claim()` sets
the fence explicitly (epoch >= fence epoch, any owner).

Flush: node-scoped writes (domain set, lookup tables, meta, orphan lines) go first, in their own round trip
and only when there are any, so the domain set names a domain before the domain holds data; then every
domain's script call in one non-transactional pipeline. Atomic per domain, not across domains (a Cluster has
no cross-slot transaction): a FencedOut names the refused domains, and every other domain's batch landed.
A `note()` goes to the domain its key names (the node's key table, else the URL in the key); a key that is
not a URL goes to the node's orphan lines.

Journal ordering: lines live in per-domain, per-writer sets and keep the core's seq. `journal()` is this
node's own journal: its lines of every domain it ever wrote, merged by seq (a node's seqs are unique and
increasing). A domain's history across owners is ordered by (epoch, seq): the fence makes epochs non-decreasing
along a domain's writes and one owner per epoch, so that order is the order the writes were applied in.

Reads: point reads (`get`, `backlog`, `history`) go to the key's domain. Scans (`items`, `scheduled_counts`,
`counts_by_state`, `robots_records`) cover the domains this node holds: those in its domain set whose fence
names it, so a restarted node never reloads a domain another node took. `items()` and `robots_records()` are
snapshots taken at the call, as in the other stores: they read every matching row before yielding the first
(packed text, decoded lazily), so a restart holds the packed rows of the node's domains in memory once.

Handoff: nodes share one Redis, so the new owner calls `adopt_domain()`: it claims the fence first (the old
owner is locked out from that moment, so the read that follows is stable) and returns the domain's rows and
robots records to rebuild RAM state. `export_domain()` / `import_domain()` copy a domain between namespaces
or Redis deployments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from frontier_node.core.ports import Fenced
from frontier_node.core.records import Entry, Item, Kind
from frontier_node.core.states import State
from hostring.domains import registrable_domain
from hostring.urls import UrlRejected, identify

RedisClient = redis.Redis | RedisCluster

ROBOTS_PREFIX: Final = "robots:"
EXPORT_FORMAT: Final = 1
_SEP: Final = "\x1f"
_PRIORITY_OFFSET: Final = 2**63
_SEQ_LIMIT: Final = 10**20
_EPOCH_LIMIT: Final = 2**53
_ORDER_LEN: Final = 41  # "pppp…(20):ssss…(20)"
_JOURNAL_WINDOW: Final = 8192
_SCAN_COUNT: Final = 2000

# Row JSON: every Item field except the key (the hash field) and state/host/priority/seq (in the prefix).
_ROW_FIELDS: Final = (
    "url", "origin", "domain", "kind", "depth", "redirect_hops", "attempt", "generation", "reason", "deadline",
    "due_at", "status", "etag", "last_modified", "evidence", "digest", "source",
)  # fmt: skip
_ALL_ITEM_FIELDS: Final = frozenset({"key", "state", "host", "priority", "seq", *_ROW_FIELDS})
if frozenset(f.name for f in dataclasses.fields(Item)) != _ALL_ITEM_FIELDS:
    raise ImportError("frontier_node.store.redis: Item fields changed; update _ROW_FIELDS and the row format")
if Entry._fields[:3] != ("seq", "run_id", "key") or len(Entry._fields) != 13:
    raise ImportError("frontier_node.store.redis: Entry fields changed; update the journal line format")

_TEXT_STATE: Final[dict[str, State]] = {s.value: s for s in State}
_INT_KIND: Final[dict[int, Kind]] = {int(k): k for k in Kind}

# KEYS: 1 fence, 2 items, 3 domain meta, 4 states, 5 sched, 6 robots, 7 journal of the line writer, 8 writers,
# 9.. backlogs of the batch's hosts (declared for Cluster routing; all in the same slot).
# ARGV: 1 writer, 2 epoch, 3 backlog key prefix, 4 line writer, 5 jmax, 6 imax, 7 JSON array of the lines,
# 8 JSON array of key, packed row, key, ..., 9 JSON array of origin, packed record, ... (three arguments rather
# than thousands: redis-py packs each argument in Python, and that was the bulk of a flush's time).
_WRITE_LUA: Final = r"""
local writer, epoch = ARGV[1], tonumber(ARGV[2])
local fence = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if fence[2] then
  local fenced = tonumber(fence[2])
  if fenced > epoch or (fenced == epoch and fence[1] ~= writer) then
    return {0, fence[1] or '', fence[2]}
  end
  if epoch > fenced then redis.call('HSET', KEYS[1], 'owner', writer, 'epoch', ARGV[2]) end
else
  redis.call('HSET', KEYS[1], 'owner', writer, 'epoch', ARGV[2])
end
local qprefix = ARGV[3]
local lines, rows, robots = cjson.decode(ARGV[7]), cjson.decode(ARGV[8]), cjson.decode(ARGV[9])
if #lines > 0 then
  redis.call('SADD', KEYS[8], ARGV[4])
  for s = 1, #lines, 4000 do
    local chunk = {}
    for n = s, math.min(s + 3999, #lines) do
      chunk[#chunk + 1] = 0
      chunk[#chunk + 1] = lines[n]
    end
    redis.call('ZADD', KEYS[7], unpack(chunk))
  end
end
for f, v in pairs({jmax = ARGV[5], imax = ARGV[6]}) do
  if v ~= '' then
    local cur = redis.call('HGET', KEYS[3], f)
    if not cur or v > cur then redis.call('HSET', KEYS[3], f, v) end
  end
end
local pat = '^([^\031]*)\031([^\031]*)\031([^\031]*)\031([^\031]*)\031()'
for i = 1, #rows, 2 do
  local key, value = rows[i], rows[i + 1]
  local ns, nh, no, nf, rest = string.match(value, pat)
  local old = redis.call('HGET', KEYS[2], key)
  if old then
    local os, oh, oo, of = string.match(old, pat)
    if redis.call('HINCRBY', KEYS[4], os, -1) <= 0 then redis.call('HDEL', KEYS[4], os) end
    if os == 'scheduled' and redis.call('ZREM', qprefix .. oh, oo .. ':' .. key) == 1 then
      if redis.call('HINCRBY', KEYS[5], oh, -1) <= 0 then redis.call('HDEL', KEYS[5], oh) end
    end
    if of ~= nf then
      value = ns .. '\031' .. nh .. '\031' .. no .. '\031' .. of .. '\031' .. string.sub(value, rest)
    end
  end
  redis.call('HSET', KEYS[2], key, value)
  redis.call('HINCRBY', KEYS[4], ns, 1)
  if ns == 'scheduled' and redis.call('ZADD', qprefix .. nh, 0, no .. ':' .. key) == 1 then
    redis.call('HINCRBY', KEYS[5], nh, 1)
  end
end
for i = 1, #robots, 2 do
  local origin, value = robots[i], robots[i + 1]
  local old = redis.call('HGET', KEYS[6], origin)
  if old then
    local of = string.match(old, '^([^\031]*)\031')
    local nf, rest = string.match(value, '^([^\031]*)\031()')
    if of ~= nf then value = of .. '\031' .. string.sub(value, rest) end
  end
  redis.call('HSET', KEYS[6], origin, value)
end
return {1}
"""

# KEYS: 1 fence. ARGV: 1 owner, 2 epoch. Sets the fence unless it is newer; answers the previous one.
_CLAIM_LUA: Final = r"""
local fence = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if fence[2] and tonumber(fence[2]) > tonumber(ARGV[2]) then
  return {0, fence[1] or '', fence[2]}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ARGV[2])
return {1, fence[1] or '', fence[2] or '-1'}
"""

# KEYS: 1 backlog, 2 items. ARGV: 1 ZRANGEBYLEX min, 2 limit. One round trip for a page of rows.
_BACKLOG_LUA: Final = r"""
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, ARGV[2])
local keys, rows = {}, {}
for n, m in ipairs(members) do keys[n] = string.sub(m, 43) end
for s = 1, #keys, 4000 do
  local chunk = redis.call('HMGET', KEYS[2], unpack(keys, s, math.min(s + 3999, #keys)))
  for _, r in ipairs(chunk) do rows[#rows + 1] = r end
end
return {keys, rows}
"""


class FencedOut(Fenced):
    """A write batch refused by a domain's fence: another node owns the domain at the writer's epoch or later.

    Nothing of the batch landed for `domain`. When one flush is refused for several domains, the first is
    raised and the rest are in `others`; the batches of every other domain did land.
    """

    def __init__(
        self, domain: str, writer_epoch: int, fence_epoch: int, owner: str, *, others: tuple[FencedOut, ...] = ()
    ) -> None:
        super().__init__(
            f"domain {domain!r} is fenced: owner {owner!r} at epoch {fence_epoch}, writer epoch {writer_epoch}"
            + (f" (and {len(others)} more domains)" if others else "")
        )
        self.domain = domain
        self.writer_epoch = writer_epoch
        self.fence_epoch = fence_epoch
        self.owner = owner
        self.others = others


@dataclass(slots=True)
class AdoptedDomain:
    """What `adopt_domain` hands the new owner: the fence it replaced and the domain's rows and robots records."""

    domain: str
    epoch: int
    previous_owner: str
    previous_epoch: int
    items: list[Item]
    robots: list[tuple[str, str, dict[str, object]]]


@dataclass(slots=True)
class _Batch:
    """Buffered writes of one domain: applied by one script call, all or nothing."""

    entries: list[Entry] = field(default_factory=list)
    rows: dict[str, str] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    robots: dict[str, str] = field(default_factory=dict)
    imax: int = -1


def _text(value: object) -> str:
    """A reply element as str, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _check_tag_free(what: str, value: str) -> None:
    if "{" in value or "}" in value:
        raise ValueError(f"{what} {value!r} must not contain braces: they would break the Cluster hash tag")


def _order(priority: int, seq: int) -> str:
    """The fixed-width text whose byte order is (priority, seq) order."""
    p = priority + _PRIORITY_OFFSET
    if not (0 <= p < _SEQ_LIMIT and 0 <= seq < _SEQ_LIMIT):
        raise ValueError(f"priority {priority} / seq {seq} out of range (signed 64-bit priority, 0 <= seq < 1e20)")
    return f"{p:020d}:{seq:020d}"


def _pack_row(item: Item, first: int) -> str:
    """The stored form of an item row: the fields the script needs up front, the rest as a JSON list.

    `first` is the seq of the journal line that first wrote the row (the script keeps a stored one).
    """
    if _SEP in item.host:
        raise ValueError(f"item {item.key!r}: host {item.host!r} holds a unit separator")
    rest = json.dumps(
        [item.url, item.origin, item.domain, int(item.kind), item.depth, item.redirect_hops, item.attempt,
         item.generation, item.reason, item.deadline, item.due_at, item.status, item.etag, item.last_modified,
         item.evidence, item.digest, item.source],
        separators=(",", ":"),
    )  # fmt: skip
    order = _order(item.priority, item.seq)
    return f"{State(item.state).value}{_SEP}{item.host}{_SEP}{order}{_SEP}{first:020d}{_SEP}{rest}"


def _unpack_row(key: str, packed: str) -> Item:
    """The Item of a stored row (inverse of _pack_row)."""
    state, host, order, _, rest = packed.split(_SEP, 4)
    f = json.loads(rest)
    return Item(
        key, f[0], host, f[1], f[2], _INT_KIND[f[3]], f[4], int(order[:20]) - _PRIORITY_OFFSET, int(order[21:]),
        f[5], _TEXT_STATE[state], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15], f[16],
    )  # fmt: skip


def _row_state(packed: str) -> str:
    return packed[: packed.index(_SEP)]


def _row_first(packed: str) -> str:
    """The `first` field of a packed row: its fourth."""
    start = packed.index(_SEP, packed.index(_SEP) + 1) + _ORDER_LEN + 2
    return packed[start : start + 20]


def _check_seq(seq: int) -> None:
    if not 0 <= seq < _SEQ_LIMIT:
        raise ValueError(f"journal seq {seq} out of range (0 <= seq < 1e20)")


def _pack_line(entry: Entry, epoch: int) -> str:
    """A journal member: 20-digit seq (the sort key), then the key first in JSON so ZSCAN MATCH can find it."""
    _check_seq(entry.seq)
    body = [entry.key, epoch, *entry[1:2], *entry[3:]]
    return f"{entry.seq:020d}" + json.dumps(body, separators=(",", ":"))


def _unpack_line(member: str) -> tuple[int, Entry]:
    """(epoch, Entry) of a journal member."""
    f = json.loads(member[20:])
    return f[1], Entry(int(member[:20]), f[2], f[0], *f[3:])


def _glob_escape(text: str) -> str:
    """`text` as a literal in a Redis glob pattern (SCAN / ZSCAN MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _key_pattern(key: str) -> str:
    """ZSCAN MATCH pattern for the journal members of one key: the seq, then `["<key>",` and anything."""
    return "?" * 20 + _glob_escape("[" + json.dumps(key) + ",") + "*"


def derived_domain(key: str) -> str | None:
    """The registrable domain named by a fetch key or robots key, or None when the key is not a URL."""
    text = key.removeprefix(ROBOTS_PREFIX)
    try:
        return identify(text).domain
    except UrlRejected:
        return None


def _json_array(strings: list[str]) -> str:
    """A JSON array of strings for the write script's cjson.decode; "{}" for none (cjson's empty table)."""
    return json.dumps(strings, ensure_ascii=False, separators=(",", ":")) if strings else "{}"


def _unpack_robots(origin: str, packed: str) -> tuple[str, str, dict[str, object]]:
    """(origin, host, record) of a stored robots record."""
    _, host, text = packed.split(_SEP, 2)
    record: dict[str, object] = json.loads(text)
    return origin, host, record


def _export_item(item: Item, first: int) -> dict[str, object]:
    """An item row as JSON-ready fields, with its first-write ordinal."""
    out = dataclasses.asdict(item)
    out["kind"] = int(item.kind)
    out["state"] = item.state.value
    out["first"] = first
    return out


def _import_item(fields: dict[str, Any]) -> tuple[Item, int]:
    """(item, first-write ordinal) of an exported row (inverse of _export_item)."""
    values = dict(fields)
    first = int(values.pop("first"))
    values["kind"] = _INT_KIND[int(values["kind"])]
    values["state"] = _TEXT_STATE[str(values["state"])]
    return Item(**values), first


def _item_domain(item: Item) -> str:
    return item.domain or registrable_domain(item.host)


def _int_or(value: object, default: int) -> int:
    return default if value is None else int(_text(value))


class RedisStore:
    """Implements core.ports.Store on Redis or Redis Cluster; see the module docstring for layout and fencing.

    `epoch` is the writer's ring epoch, read once per flush (a callable follows the node's ring watch).
    Thread-safe: one lock guards the buffers and the flush.
    """

    def __init__(
        self, client: RedisClient, *, node_id: str, epoch: Callable[[], int] | int, namespace: str = "hostring"
    ) -> None:
        if not node_id:
            raise ValueError("node_id must not be empty")
        _check_tag_free("node_id", node_id)
        _check_tag_free("namespace", namespace)
        self.client = client
        self.node_id = node_id
        self.namespace = namespace
        self._epoch: Callable[[], int] = epoch if callable(epoch) else (lambda: epoch)
        self._owns_client = False
        self._r: Any = client
        self._lock = threading.RLock()
        self._batches: dict[str, _Batch] = {}
        self._notes: list[Entry] = []
        self._orphans: list[Entry] = []
        self._meta: dict[str, str] = {}
        self._new_domains: set[str] = set()
        self._new_keydom: dict[str, str] = {}
        self._new_hostdom: dict[str, str] = {}
        self._node = f"{namespace}:{{n:{node_id}}}:"
        self._all_domains = f"{namespace}:{{all}}:domains"
        self._shas = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in _SCRIPTS.items()}
        self._load_scripts()
        self._known_domains: set[str] = {_text(d) for d in self._r.smembers(self._node + "domains")}
        self._key_dom: dict[str, str] = {}
        self._host_dom: dict[str, str] = {
            _text(h): _text(d) for h, d in self._r.hgetall(self._node + "hostdom").items()
        }
        self._robots_clock = 0
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, node_id: str, epoch: Callable[[], int] | int, namespace: str = "hostring"
    ) -> RedisStore:
        """Open a store on `url`, with the Cluster client when the server says cluster mode is on; close() closes it."""
        plain = redis.Redis.from_url(url)
        try:
            clustered = bool(plain.info("cluster").get("cluster_enabled"))
        except BaseException:
            plain.close()
            raise
        client: RedisClient = plain
        if clustered:
            plain.close()
            client = RedisCluster.from_url(url)
        store = cls(client, node_id=node_id, epoch=epoch, namespace=namespace)
        store._owns_client = True
        return store

    # -- keys ------------------------------------------------------------------------------------------

    def _dkey(self, domain: str, suffix: str) -> str:
        return f"{self.namespace}:{{d:{domain}}}:{suffix}"

    def _domain_keys(self, domain: str, writer: str) -> list[str]:
        """KEYS 1..8 of the write script for `domain`, with `writer`'s journal."""
        _check_tag_free("domain", domain)
        d = f"{self.namespace}:{{d:{domain}}}:"
        return [d + "fence", d + "items", d + "meta", d + "states", d + "sched", d + "robots", d + f"j:{writer}",
                d + "writers"]  # fmt: skip

    def domain_keys(self, domain: str) -> list[str]:
        """Every key the store has created for `domain` (for inspection and tests)."""
        pattern = _glob_escape(self._dkey(domain, "")) + "*"
        return sorted({_text(k) for k in self._r.scan_iter(match=pattern, count=_SCAN_COUNT)})

    # -- scripts ---------------------------------------------------------------------------------------

    def _load_scripts(self) -> None:
        """Load the Lua scripts (on every primary of a Cluster) and check the server agrees on their digests."""
        for name, src in _SCRIPTS.items():
            sha = _text(self._r.script_load(src))
            if sha != self._shas[name]:
                raise RuntimeError(f"redis answered digest {sha} for script {name}, expected {self._shas[name]}")

    def _eval(self, name: str, keys: list[str], args: list[object]) -> Any:
        """EVALSHA with one reload on NOSCRIPT (a restarted or failed-over server forgets scripts)."""
        try:
            return self._r.evalsha(self._shas[name], len(keys), *keys, *args)
        except NoScriptError:
            self._load_scripts()
            return self._r.evalsha(self._shas[name], len(keys), *keys, *args)

    def _pipeline(self) -> Any:
        return self._r.pipeline(transaction=False)

    # -- writes: buffered ------------------------------------------------------------------------------

    def _batch(self, domain: str) -> _Batch:
        batch = self._batches.get(domain)
        if batch is None:
            _check_tag_free("domain", domain)
            batch = self._batches[domain] = _Batch()
            if domain not in self._known_domains:
                self._new_domains.add(domain)
        return batch

    def _learn(self, key: str, host: str, origin: str, domain: str) -> None:
        """Remember (and later persist) where a key or host lives when its text does not say so."""
        if self._host_dom.get(host, registrable_domain(host)) != domain:
            self._host_dom[host] = self._new_hostdom[host] = domain
        base = key.removeprefix(ROBOTS_PREFIX)
        plain = (base == origin or base.startswith(origin + "/")) and registrable_domain(host) == domain
        known = self._key_dom.get(key)
        if known != domain and (known is not None or (not plain and derived_domain(key) != domain)):
            self._key_dom[key] = self._new_keydom[key] = domain

    def record(self, entry: Entry, item: Item) -> None:
        """Buffer one journal line and the item's row as it stands after it (the last row per key wins)."""
        domain = _item_domain(item)
        _check_seq(entry.seq)
        with self._lock:
            self._learn(item.key, item.host, item.origin, domain)
            batch = self._batch(domain)
            batch.entries.append(entry)
            batch.rows[item.key] = _pack_row(item, batch.first.setdefault(item.key, entry.seq))
            batch.hosts.add(item.host)
            batch.imax = max(batch.imax, item.seq)

    def note(self, entry: Entry) -> None:
        """Buffer a journal line that changes no row; its domain is looked up at flush."""
        with self._lock:
            self._notes.append(entry)

    def save_robots(self, origin: str, host: str, record: dict[str, object]) -> None:
        """Buffer the robots record of an origin, serialized now (a later mutation of `record` is not saved).

        It goes to the registrable domain of the origin (of `host` if the origin does not parse): one place per
        origin, and the domain the ring routes the origin's items to.
        """
        text = json.dumps(record, separators=(",", ":"), sort_keys=True)
        domain = derived_domain(origin)
        with self._lock:
            batch = self._batch(registrable_domain(host) if domain is None else domain)
            buffered = batch.robots.get(origin)
            if buffered is None:
                self._robots_clock = max(self._robots_clock + 1, time.time_ns())
                first = f"{self._robots_clock:020d}"
            else:
                first = buffered[:20]
            batch.robots[origin] = f"{first}{_SEP}{host}{_SEP}{text}"

    def set_meta(self, name: str, value: str) -> None:
        with self._lock:
            self._meta[name] = value

    # -- flush -----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Apply the buffers: node-scoped writes first, then one fenced script call per domain, pipelined.

        Each domain's batch is atomic. A refused domain's batch is dropped and FencedOut raised after every
        other domain landed; on a connection error the batches that did not answer stay buffered (the script
        is idempotent, so a retry that repeats a landed batch changes nothing).
        """
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._closed:
            raise RuntimeError("store is closed")
        if self._notes:
            self._place_notes()
        if not (
            self._batches or self._orphans or self._meta or self._new_domains or self._new_keydom or self._new_hostdom
        ):
            return
        epoch = int(self._epoch())
        if not 0 <= epoch < _EPOCH_LIMIT:
            raise ValueError(f"ring epoch {epoch} out of range")
        self._flush_node(epoch)
        if self._batches:
            self._flush_domains(epoch)

    def _place_notes(self) -> None:
        """Move buffered notes into their domain's batch, or the node's orphan lines when the key names none."""
        unknown = [e.key for e in self._notes if not self._buffered_domain(e.key)]
        stored: dict[str, str] = {}
        if unknown:
            found = self._r.hmget(self._node + "keydom", unknown)
            stored = {k: _text(d) for k, d in zip(unknown, found, strict=True) if d is not None}
        orphans: list[Entry] = []
        for entry in self._notes:
            domain = self._buffered_domain(entry.key) or stored.get(entry.key) or derived_domain(entry.key)
            if domain is None:
                orphans.append(entry)
            else:
                self._batch(domain).entries.append(entry)
        self._notes = []
        self._orphans.extend(orphans)

    def _buffered_domain(self, key: str) -> str | None:
        hit = self._key_dom.get(key)
        if hit is not None:
            return hit
        for domain, batch in self._batches.items():
            if key in batch.rows:
                return domain
        return None

    def _flush_node(self, epoch: int) -> None:
        """Node-scoped writes, before any domain's: the domain set must name a domain before it holds data."""
        orphans = self._orphans
        if not (self._meta or self._new_domains or self._new_keydom or self._new_hostdom or orphans):
            return
        pipe = self._pipeline()
        if self._new_domains:
            pipe.sadd(self._node + "domains", *sorted(self._new_domains))
            pipe.sadd(self._all_domains, *sorted(self._new_domains))
        if self._new_keydom:
            pipe.hset(self._node + "keydom", mapping=self._new_keydom)
        if self._new_hostdom:
            pipe.hset(self._node + "hostdom", mapping=self._new_hostdom)
        if self._meta:
            pipe.hset(self._node + "meta", mapping=self._meta)
        if orphans:
            pipe.zadd(self._node + "orphans", {_pack_line(e, epoch): 0 for e in orphans})
        pipe.execute()
        self._known_domains |= self._new_domains
        self._new_domains = set()
        self._new_keydom = {}
        self._new_hostdom = {}
        self._meta = {}
        self._orphans = []

    def _write_call(
        self, domain: str, batch: _Batch, epoch: int, line_writer: str, lines: list[str] | None = None
    ) -> tuple[list[str], list[object]]:
        """KEYS and ARGV of one write-script call for `batch`; `lines` replaces the batch's own journal members."""
        keys = self._domain_keys(domain, line_writer)
        qprefix = self._dkey(domain, "q:")
        keys.extend(qprefix + h for h in sorted(batch.hosts))
        if lines is None:
            lines = [_pack_line(e, epoch) for e in batch.entries]
        jmax = max((int(m[:20]) for m in lines), default=-1)
        args: list[object] = [
            self.node_id, epoch, qprefix, line_writer,
            f"{jmax:020d}" if jmax >= 0 else "", f"{batch.imax:020d}" if batch.imax >= 0 else "",
            _json_array(lines),
            _json_array([s for pair in batch.rows.items() for s in pair]),
            _json_array([s for pair in batch.robots.items() for s in pair]),
        ]  # fmt: skip
        return keys, args

    def _flush_domains(self, epoch: int) -> None:
        domains = list(self._batches)
        calls = {d: self._write_call(d, self._batches[d], epoch, self.node_id) for d in domains}
        results = self._run_pipelined("write", calls)
        fenced: list[FencedOut] = []
        error: BaseException | None = None
        for domain in domains:
            res = results[domain]
            if isinstance(res, BaseException):
                error = error or res
                continue
            del self._batches[domain]
            if int(res[0]) == 0:
                fenced.append(FencedOut(domain, epoch, int(_text(res[2])), _text(res[1])))
        if fenced:
            first = fenced[0]
            raise FencedOut(first.domain, epoch, first.fence_epoch, first.owner, others=tuple(fenced[1:])) from error
        if error is not None:
            raise error

    def _run_pipelined(self, script: str, calls: dict[str, tuple[list[str], list[object]]]) -> dict[str, Any]:
        """Send script calls in one non-transactional pipeline; reload and resend those that met NOSCRIPT."""
        results: dict[str, Any] = {}
        todo = list(calls)
        for attempt in range(2):
            pipe = self._pipeline()
            for name in todo:
                keys, args = calls[name]
                pipe.execute_command("EVALSHA", self._shas[script], len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            results.update(zip(todo, answers, strict=True))
            todo = [name for name in todo if isinstance(results[name], NoScriptError)]
            if not todo or attempt:
                break
            self._load_scripts()
        return results

    # -- fence -----------------------------------------------------------------------------------------

    def fence(self, domain: str) -> tuple[str, int] | None:
        """(owner, epoch) of the domain's fence, or None when no node ever wrote or claimed it."""
        owner, epoch = self._r.hmget(self._dkey(domain, "fence"), ["owner", "epoch"])
        return None if epoch is None else (_text(owner or b""), int(_text(epoch)))

    def claim(self, domain: str, epoch: int) -> tuple[str, int]:
        """Take the domain's fence at `epoch` unless a newer epoch holds it; returns the previous (owner, epoch).

        The previous owner is "" and its epoch -1 when the domain had no fence. Raises FencedOut when refused.
        """
        if not 0 <= epoch < _EPOCH_LIMIT:
            raise ValueError(f"ring epoch {epoch} out of range")
        _check_tag_free("domain", domain)
        with self._lock:
            if domain not in self._known_domains:
                self._new_domains.add(domain)
            self._flush_node(epoch)
        res = self._eval("claim", [self._dkey(domain, "fence")], [self.node_id, epoch])
        if int(res[0]) == 0:
            raise FencedOut(domain, epoch, int(_text(res[2])), _text(res[1]))
        return _text(res[1]), int(_text(res[2]))

    def adopt_domain(self, domain: str, epoch: int) -> AdoptedDomain:
        """Claim `domain` at `epoch`, then read its rows and robots records for the new owner's RAM state.

        The claim comes first: from then on the previous owner's writes are refused, so the read is stable.
        Keys and hosts whose domain the text does not tell are recorded in this node's lookup tables.
        """
        previous_owner, previous_epoch = self.claim(domain, epoch)
        items = [_unpack_row(k, v) for _, k, v in self._sorted_rows([domain], None)]
        robots = [_unpack_robots(o, v) for _, o, v in self._sorted_robots([domain])]
        with self._lock:
            for item in items:
                self._learn(item.key, item.host, item.origin, domain)
            self._flush_node(epoch)
        return AdoptedDomain(domain, epoch, previous_owner, previous_epoch, items, robots)

    # -- handoff between deployments ---------------------------------------------------------------------

    def export_domain(self, domain: str, *, journal_tail: int | None = None) -> dict[str, Any]:
        """Everything of one domain as JSON-ready data: fence, rows, robots records and journal (all writers).

        `journal_tail` keeps only the last that many lines, in the order they were applied.
        """
        with self._lock:
            self._flush_locked()
        fence = self.fence(domain)
        items = [_export_item(_unpack_row(k, v), int(f)) for f, k, v in self._sorted_rows([domain], None)]
        robots = [[*_unpack_robots(o, v), int(f)] for f, o, v in self._sorted_robots([domain])]
        lines = self._domain_lines(domain, None)
        if journal_tail is not None:
            lines = lines[-journal_tail:] if journal_tail > 0 else []
        return {
            "format": EXPORT_FORMAT,
            "domain": domain,
            "fence": None if fence is None else {"owner": fence[0], "epoch": fence[1]},
            "items": items,
            "robots": robots,
            "journal": [{"writer": w, "epoch": ep, "entry": list(e)} for ep, e, w in lines],
        }

    def import_domain(self, domain: str, data: dict[str, Any], epoch: int) -> None:
        """Claim `domain` at `epoch` and write an `export_domain` copy into this store, under the same fence.

        Journal lines keep their writer, epoch and seq; rows and robots records replace what is there.
        """
        if data.get("format") != EXPORT_FORMAT or data.get("domain") != domain:
            raise ValueError(f"not an export of domain {domain!r} in format {EXPORT_FORMAT}")
        self.claim(domain, epoch)
        by_writer: dict[str, list[tuple[int, Entry]]] = {}
        for line in data["journal"]:
            by_writer.setdefault(str(line["writer"]), []).append((int(line["epoch"]), Entry(*line["entry"])))
        batch = _Batch()
        for fields in data["items"]:
            item, first = _import_item(fields)
            batch.rows[item.key] = _pack_row(item, first)
            batch.hosts.add(item.host)
            batch.imax = max(batch.imax, item.seq)
        for origin, host, record, first in data["robots"]:
            text = json.dumps(record, separators=(",", ":"), sort_keys=True)
            batch.robots[origin] = f"{int(first):020d}{_SEP}{host}{_SEP}{text}"
        calls: dict[str, tuple[list[str], list[object]]] = {}
        writers = sorted(by_writer) or [self.node_id]
        for n, writer in enumerate(writers):
            lines = [_pack_line(e, ep) for ep, e in by_writer.get(writer, [])]
            calls[writer] = self._write_call(domain, batch if n == 0 else _Batch(), epoch, writer, lines)
        for res in self._run_pipelined("write", calls).values():
            if isinstance(res, BaseException):
                raise res
            if int(res[0]) == 0:
                raise FencedOut(domain, epoch, int(_text(res[2])), _text(res[1]))
        with self._lock:
            for fields in data["items"]:
                self._learn(str(fields["key"]), str(fields["host"]), str(fields["origin"]), domain)
            self._flush_node(epoch)

    # -- reads -----------------------------------------------------------------------------------------

    def get_meta(self, name: str) -> str | None:
        with self._lock:
            if name in self._meta:
                return self._meta[name]
        value = self._r.hget(self._node + "meta", name)
        return None if value is None else _text(value)

    def _host_domain(self, host: str) -> str:
        return self._host_dom.get(host) or registrable_domain(host)

    def _key_domain(self, key: str) -> str | None:
        """The domain holding `key`: this process's table, the node's stored table, else the key's own text."""
        hit = self._key_dom.get(key)
        if hit is not None:
            return hit
        stored = self._r.hget(self._node + "keydom", key)
        if stored is not None:
            return _text(stored)
        return derived_domain(key)

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list[Item]:
        """Scheduled items of `host` with (priority, seq) > `after`, in that order: one range read of its zset."""
        with self._lock:
            self._flush_locked()
        if limit <= 0:
            return []
        lower = _after_bound(after)
        if lower is None:
            return []
        domain = self._host_domain(host)
        res = self._eval("backlog", [self._dkey(domain, f"q:{host}"), self._dkey(domain, "items")], [lower, limit])
        keys, rows = res
        return [_unpack_row(_text(k), _text(v)) for k, v in zip(keys, rows, strict=True) if v is not None]

    def get(self, key: str) -> Item | None:
        """The row of `key`; a buffered row is answered from the buffer without a flush."""
        with self._lock:
            for batch in self._batches.values():
                packed = batch.rows.get(key)
                if packed is not None:
                    return _unpack_row(key, packed)
        domain = self._key_domain(key)
        if domain is None:
            return None
        value = self._r.hget(self._dkey(domain, "items"), key)
        return None if value is None else _unpack_row(key, _text(value))

    def history(self, key: str) -> list[Entry]:
        """Every journal line of one key, by any owner, in the order they were applied. Scans: not for hot paths.

        Looks in the domain the node's table names for the key and in the one its text names, should they differ.
        """
        with self._lock:
            self._flush_locked()
        domains = {self._key_domain(key), derived_domain(key)} - {None}
        lines = [line for d in sorted(d for d in domains if d is not None) for line in self._domain_lines(d, key)]
        orphans = self._scan_zset(self._node + "orphans", _key_pattern(key))
        lines.extend((*_unpack_line(m), self.node_id) for m in orphans)
        lines.sort(key=lambda t: (t[0], t[1].seq))
        return [e for _, e, _ in lines if e.key == key]

    def _domain_lines(self, domain: str, key: str | None) -> list[tuple[int, Entry, str]]:
        """(epoch, entry, writer) of a domain's journal, optionally one key's, in applied order."""
        writers = sorted(_text(w) for w in self._r.smembers(self._dkey(domain, "writers")))
        pattern = _key_pattern(key) if key is not None else None
        out: list[tuple[int, Entry, str]] = []
        for writer in writers:
            for member in self._scan_zset(self._dkey(domain, f"j:{writer}"), pattern):
                epoch, entry = _unpack_line(member)
                out.append((epoch, entry, writer))
        out.sort(key=lambda t: (t[0], t[1].seq))
        return out

    def _scan_zset(self, name: str, pattern: str | None) -> list[str]:
        if pattern is None:
            return [_text(m) for m in self._r.zrangebylex(name, "-", "+")]
        return list({_text(m) for m, _ in self._r.zscan_iter(name, match=pattern, count=_SCAN_COUNT)})

    def _scan_hash(self, name: str) -> Iterator[tuple[str, str]]:
        """Fields of a hash, each once, without one long HGETALL on a big domain."""
        seen: set[str] = set()
        for f, v in self._r.hscan_iter(name, count=_SCAN_COUNT):
            field_ = _text(f)
            if field_ not in seen:
                seen.add(field_)
                yield field_, _text(v)

    def journal(self, after_seq: int = 0) -> Iterator[Entry]:
        """This node's journal lines with seq > after_seq, in seq order, up to the highest seq at the call."""
        with self._lock:
            self._flush_locked()
        sources = [self._dkey(d, f"j:{self.node_id}") for d in sorted(self._domains())]
        sources.append(self._node + "orphans")
        pipe = self._pipeline()
        for name in sources:
            pipe.zrevrangebylex(name, "+", "-", 0, 1)
        tops = {}
        for name, top in zip(sources, pipe.execute(), strict=True):
            if top and int(_text(top[0])[:20]) > after_seq:
                tops[name] = int(_text(top[0])[:20])
        return self._journal_windows(tops, after_seq)

    def _journal_windows(self, tops: dict[str, int], after_seq: int) -> Iterator[Entry]:
        """Read the sources window by window of seqs, merging each window in seq order."""
        lo, hi = after_seq, max(tops.values(), default=after_seq)
        while lo < hi:
            top = min(lo + _JOURNAL_WINDOW, hi)
            live = [name for name, last in tops.items() if last > lo]
            pipe = self._pipeline()
            for name in live:
                pipe.zrangebylex(name, f"[{lo + 1:020d}", f"({top + 1:020d}")
            chunks = [sorted(_text(m) for m in chunk) for chunk in pipe.execute()]
            for member in heapq.merge(*chunks):
                yield _unpack_line(member)[1]
            lo = top

    def _domains(self) -> set[str]:
        with self._lock:
            return set(self._known_domains | {_text(d) for d in self._r.smembers(self._node + "domains")})

    def all_domains(self) -> set[str]:
        """Every domain any node of this namespace ever wrote: what a new ring's owners must look at."""
        with self._lock:
            self._flush_locked()
        return {_text(d) for d in self._r.smembers(self._all_domains)}

    def domain_counts(self, domain: str) -> dict[str, int]:
        """state -> number of rows of one domain (kept by the write script, no scan)."""
        return {_text(k): int(v) for k, v in self._r.hgetall(self._dkey(domain, "states")).items()}

    def held_domains(self) -> list[str]:
        """Domains this node holds: in its domain set, with a fence that names it."""
        with self._lock:
            self._flush_locked()
        domains = sorted(self._domains())
        pipe = self._pipeline()
        for d in domains:
            pipe.hget(self._dkey(d, "fence"), "owner")
        return [d for d, owner in zip(domains, pipe.execute(), strict=True) if owner and _text(owner) == self.node_id]

    def _read_held(self, suffix: str) -> list[dict[str, str]]:
        """HGETALL of one small per-domain hash for every held domain, in one pipeline."""
        held = self.held_domains()
        pipe = self._pipeline()
        for d in held:
            pipe.hgetall(self._dkey(d, suffix))
        return [{_text(k): _text(v) for k, v in h.items()} for h in pipe.execute()]

    def items(self, states: Iterable[State] | None = None) -> Iterator[Item]:
        """Rows of the held domains (optionally only `states`) in first-write order, as of the call."""
        wanted = None if states is None else {State(s).value for s in states}
        rows = self._sorted_rows(self.held_domains(), wanted)
        return (_unpack_row(key, packed) for _, key, packed in rows)

    def _sorted_rows(self, domains: list[str], wanted: set[str] | None) -> list[tuple[str, str, str]]:
        """(first, key, packed row) of the domains' rows in `wanted` states, sorted: first-write order."""
        rows = [
            (_row_first(packed), key, packed)
            for domain in domains
            for key, packed in self._scan_hash(self._dkey(domain, "items"))
            if wanted is None or _row_state(packed) in wanted
        ]
        rows.sort()
        return rows

    def _sorted_robots(self, domains: list[str]) -> list[tuple[str, str, str]]:
        """(first, origin, packed record) of the domains' robots records, in first-save order."""
        records = [
            (packed[:20], origin, packed)
            for domain in domains
            for origin, packed in self._scan_hash(self._dkey(domain, "robots"))
        ]
        records.sort()
        return records

    def scheduled_counts(self) -> dict[str, int]:
        """host -> number of scheduled items, from the per-domain counters the write script keeps."""
        counts: dict[str, int] = {}
        for per_host in self._read_held("sched"):
            for host, n in per_host.items():
                counts[host] = counts.get(host, 0) + int(n)
        return counts

    def counts_by_state(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for per_state in self._read_held("states"):
            for state, n in per_state.items():
                counts[state] = counts.get(state, 0) + int(n)
        return counts

    def robots_records(self) -> Iterator[tuple[str, str, dict[str, object]]]:
        """(origin, host, record) of every robots record in the held domains, in first-save order, as of the call."""
        records = self._sorted_robots(self.held_domains())
        return (_unpack_robots(origin, packed) for _, origin, packed in records)

    def max_seqs(self) -> tuple[int, int]:
        """(highest journal seq, highest item seq) over every domain this node ever wrote and its orphan lines."""
        with self._lock:
            self._flush_locked()
        domains = sorted(self._domains())
        pipe = self._pipeline()
        for d in domains:
            pipe.hmget(self._dkey(d, "meta"), ["jmax", "imax"])
        pipe.zrevrangebylex(self._node + "orphans", "+", "-", 0, 1)
        *metas, orphan_top = pipe.execute()
        jmax = max((_int_or(j, 0) for j, _ in metas), default=0)
        imax = max((_int_or(i, 0) for _, i in metas), default=0)
        if orphan_top:
            jmax = max(jmax, int(_text(orphan_top[0])[:20]))
        return jmax, imax

    def close(self) -> None:
        """Flush; close the client too when `from_url` opened it."""
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_locked()
            finally:
                self._closed = True
                if self._owns_client:
                    self.client.close()


def _after_bound(after: tuple[int, int]) -> str | None:
    """The ZRANGEBYLEX lower bound for members strictly after (priority, seq); None when nothing can be."""
    priority, seq = after
    p = priority + _PRIORITY_OFFSET
    if p < 0:
        return "-"
    if p >= _SEQ_LIMIT:
        return None
    if seq < 0:
        return f"[{p:020d}:"
    if seq >= _SEQ_LIMIT - 1:
        return f"[{p:020d};"
    return f"[{p:020d}:{seq:020d};"


_SCRIPTS: Final[dict[str, str]] = {"write": _WRITE_LUA, "claim": _CLAIM_LUA, "backlog": _BACKLOG_LUA}
