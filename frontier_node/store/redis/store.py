"""RedisStore: buffered writes, fenced flushes, reads and handoff of a frontier node's state in Redis.

Key layout and the stored forms of rows, journal lines and robots records are in codec.py; the Lua scripts
that apply a domain's batch, claim its fence and read a backlog page are in scripts.py.

Fencing: every flush writes each domain's batch with a Lua script that first reads the domain's fence (one call
per domain on a Cluster, all keys in the domain's slot; one call for every domain on a single server): the batch
is refused whole when the fence epoch is greater than the writer's, or equal with another owner, and the store
raises FencedOut. Otherwise the batch lands atomically, and when the
writer's epoch is newer than the fence the write also moves the fence to (writer, epoch): under the newer ring
the writer owns the domain, and every node still on an older epoch is locked out from then on. `claim()` sets
the fence explicitly (epoch >= fence epoch, any owner).

Flush on a single server: one round trip. One non-transactional pipeline holds the node-scoped writes (domain
set, lookup tables, meta, orphan lines, mail), so the domain set names a domain before the domain holds data,
then write_all script calls for the domains' batches, one per part of about flight.PART_ROWS rows and lines
(scripts.WRITE_ALL_LUA: the same per-domain fence rule, every row, line and record passed as one string with their
lengths, so neither side escapes or parses JSON; Redis serves other clients between the parts).
On a Cluster: the node-scoped writes in their own round trip, then one script call per domain in one pipeline
(a script cannot span slots there). Atomic per domain either way, not across domains: a FencedOut names the
refused domains, and every other domain's batch landed.
`begin_flush()` starts the single server's flush and returns before its answer (the core thread runs its next
batch meanwhile): the pipeline goes out on the store's line (line.py: sent by the caller when no flush is out, else
by the line's thread once the one before is answered) with the buffers it took, behind the flushes already out,
and every other call that touches Redis (a read, a synchronous flush, a claim) lands them all first, so writes
apply in order and reads see them; a flush that did not land puts its writes, and those of the flushes
behind it (none sent), back in front of newer ones (flight.py).
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

Lost data: a Redis that restarted empty (or a Cluster shard that lost its keys) must not be trusted, since the
node's RAM would go on naming rows that no longer exist. The store opens with the namespace's instance marker
(`ns:{all}:instance`, a random id set once with SET NX): every flush reads it in its own pipeline, the inbox
poll reads it every fraction of a second, and a marker that is missing or changed raises StoreLost from then on,
from every call. The marker lives in the data, so a Redis that restarted with its data (an append-only file)
keeps it and is not reported lost; Redis's run_id would change there too, which is why it is not used. Writes
also check, in the same pipeline, that the fences this store set still exist: that catches one Cluster shard
losing its keys while the marker's shard kept them.

Outbox (core.ports.Outbox): `forward()` and `post()` buffer mail for other domains' owners; the flush writes it
to their inboxes (mail.py), unfenced, in the node-scoped pipeline.

Handoff (handoff.py, mixed in): nodes share one Redis, so a new owner calls `adopt_domains()`, which claims
the fences first (the old owner is locked out from that moment, so the reads that follow are stable) and returns
the rows, robots records and breaches; `export_domain()` / `import_domain()` copy a domain between deployments.
"""

from __future__ import annotations

import heapq
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import redis
from redis.cluster import RedisCluster

from frontier_node.commit import Flushed
from frontier_node.core.ports import StoreLost
from frontier_node.core.records import Entry, Item, Kind, LinkLike
from frontier_node.core.states import State
from frontier_node.store.redis.codec import (
    EPOCH_LIMIT,
    Keys,
    after_bound,
    check_seq,
    check_tag_free,
    compact_json,
    glob_escape,
    int_or,
    json_array,
    key_pattern,
    pack_checked_line,
    pack_fields,
    pack_line,
    pack_robots,
    robots_first,
    robots_json,
    row_fields,
    row_first,
    row_state,
    text,
    unpack_line,
    unpack_robots,
    unpack_row,
)
from frontier_node.store.redis.flight import Flight, Flights
from frontier_node.store.redis.handoff import Batch, DomainHandoff, FencedOut
from frontier_node.store.redis.line import Line
from frontier_node.store.redis.mail import Mailroom, encode, link_messages, link_row
from frontier_node.store.redis.scripts import Call, Scripts
from hostring.domains import registrable_domain
from hostring.urls import ROBOTS_PREFIX, domain_of

RedisClient = redis.Redis | RedisCluster

_JOURNAL_WINDOW: Final = 8192
_SCAN_COUNT: Final = 2000
_UNNAMEABLE: Final = re.compile(r"[^!-~]")


def client_name(node_id: str) -> str:
    """The name a node's Redis connections carry: "hostring-node:<id>", with what CLIENT SETNAME refuses (spaces,
    control and non-ASCII characters) as "_"."""
    return "hostring-node:" + _UNNAMEABLE.sub("_", node_id)


class RedisStore(Flights, DomainHandoff):
    """Implements core.ports.Store on Redis or Redis Cluster; see codec.py for the layout, above for fencing.

    `epoch` is the writer's ring epoch, read once per flush (a callable follows the node's ring watch).
    Thread-safe: one lock guards the buffers and the flush.
    """

    def __init__(
        self, client: RedisClient, *, node_id: str, epoch: Callable[[], int] | int, namespace: str = "hostring"
    ) -> None:
        if not node_id:
            raise ValueError("node_id must not be empty")
        self._keys = Keys(namespace, node_id)
        self.client = client
        self.node_id = node_id
        self.namespace = namespace
        self._epoch: Callable[[], int] = epoch if callable(epoch) else (lambda: epoch)
        self._owns_client = False
        self._r: Any = client
        self._lock = threading.RLock()
        self._batches: dict[str, Batch] = {}
        self._notes: list[Entry] = []
        self._orphans: list[Entry] = []
        self._meta: dict[str, str] = {}
        self._new_domains: set[str] = set()
        self._new_keydom: dict[str, str] = {}
        self._new_hostdom: dict[str, str] = {}
        self._scripts = Scripts(client)
        self._single = not isinstance(client, RedisCluster)
        self._known_domains: set[str] = {text(d) for d in self._r.smembers(self._keys.node + "domains")}
        self._key_dom: dict[str, str] = {}
        self._host_dom: dict[str, str] = {
            text(h): text(d) for h, d in self._r.hgetall(self._keys.node + "hostdom").items()
        }
        self._robots_clock = 0
        self._closed = False
        self.mail = Mailroom(client, namespace)
        self._breaches: dict[str, str] = {}
        self._links_out: dict[str, list[list[object]]] = {}
        self._posts: dict[str, list[str]] = {}
        self._fenced_here: set[str] = set()
        self._named_writer: set[str] = set()  # domains whose writers set names this node (write_all skips the SADD)
        self._imax_landed: dict[str, int] = {}  # domain -> the highest imax this node's flushes landed there
        self._lost: StoreLost | None = None
        self._flights: list[Flight] = []  # flushes sent and not landed yet, oldest first (flight.py)
        self._line: Line | None = None  # the flushes' connection and reader, opened at the first begin_flush
        self._instance_key = f"{namespace}:{{all}}:instance"
        self._r.set(self._instance_key, uuid.uuid4().hex, nx=True)
        self.instance = text(self._r.get(self._instance_key))

    @classmethod
    def from_url(
        cls, url: str, *, node_id: str, epoch: Callable[[], int] | int, namespace: str = "hostring"
    ) -> RedisStore:
        """Open a store on `url`, with the Cluster client when the server says cluster mode is on; close() closes it.
        Its connections carry the node's name (CLIENT LIST shows which node holds which connection)."""
        name = client_name(node_id)
        plain = redis.Redis.from_url(url, client_name=name)
        try:
            clustered = bool(plain.info("cluster").get("cluster_enabled"))
        except BaseException:
            plain.close()
            raise
        client: RedisClient = plain
        if clustered:
            plain.close()
            client = RedisCluster.from_url(url, client_name=name)
        store = cls(client, node_id=node_id, epoch=epoch, namespace=namespace)
        store._owns_client = True
        return store

    # -- keys ------------------------------------------------------------------------------------------

    def domain_keys(self, domain: str) -> list[str]:
        """Every key the store has created for `domain` (for inspection and tests)."""
        with self._lock:
            self._settle()
        pattern = glob_escape(self._keys.domain(domain, "")) + "*"
        return sorted({text(k) for k in self._r.scan_iter(match=pattern, count=_SCAN_COUNT)})

    def _pipeline(self) -> Any:
        return self._r.pipeline(transaction=False)

    # -- writes: buffered ------------------------------------------------------------------------------

    def _batch(self, domain: str) -> Batch:
        batch = self._batches.get(domain)
        if batch is None:
            if domain not in self._known_domains:
                check_tag_free("domain", domain)
                self._new_domains.add(domain)
            batch = self._batches[domain] = Batch()
        return batch

    def _learn(self, key: str, host: str, origin: str, domain: str, *, page: bool = True) -> None:
        """Remember (and later persist) where a key or host lives when its text does not say so.

        A host's pages always live in its registrable domain; a robots item following a redirect may stand on a
        hop's host in its origin's domain. Such a row is remembered only for a host nothing else was learned for,
        and `backlog` reads the host's registrable domain as well, so the pages are never hidden by it.
        """
        own = registrable_domain(host)
        if self._host_dom.get(host, own) != domain and (page or host not in self._host_dom):
            self._host_dom[host] = self._new_hostdom[host] = domain
        base = key.removeprefix(ROBOTS_PREFIX)
        plain = own == domain and (base == origin or base.startswith(origin + "/"))
        known = self._key_dom.get(key)
        if known != domain and (known is not None or (not plain and domain_of(key) != domain)):
            self._key_dom[key] = self._new_keydom[key] = domain

    def record(self, entry: Entry, item: Item) -> None:
        """Buffer one journal line and the item's row as it stands after it (the last row per key wins).

        The row is kept as a snapshot (codec.row_fields) and packed once, at the flush. Where the key lives is
        learned once per batch (again only if its host or origin changed in between)."""
        domain = item.domain or registrable_domain(item.host)
        seq = entry.seq
        check_seq(seq)
        fields = row_fields(item)
        key = item.key
        with self._lock:
            batch = self._batch(domain)
            rows = batch.rows
            buffered = rows.get(key)
            if buffered is None or buffered[1][1] != item.host or buffered[1][5] != item.origin:
                self._learn(key, item.host, item.origin, domain, page=item.kind is Kind.PAGE)
            batch.add_line(entry)
            rows[key] = (seq if buffered is None else buffered[0], fields)
            if item.seq > batch.imax:
                batch.imax = item.seq

    def note(self, entry: Entry) -> None:
        """Buffer a journal line that changes no row; its domain is looked up at flush."""
        check_seq(entry.seq)
        with self._lock:
            self._notes.append(entry)

    def save_robots(self, origin: str, host: str, record: dict[str, object]) -> None:
        """Buffer the robots record of an origin, serialized now (a later mutation of `record` is not saved).

        It goes to the registrable domain of the origin (of `host` if the origin does not parse): one place per
        origin, and the domain the ring routes the origin's items to.
        """
        body = robots_json(record)
        with self._lock:
            batch = self._batch(domain_of(origin) or registrable_domain(host))
            buffered = batch.robots.get(origin)
            if buffered is None:
                self._robots_clock = max(self._robots_clock + 1, time.time_ns())
                first = self._robots_clock
            else:
                first = robots_first(buffered)
            batch.robots[origin] = pack_robots(first, host, body)

    def set_meta(self, name: str, value: str) -> None:
        with self._lock:
            self._meta[name] = value

    # -- budget breaches (core.ports.BreachLog) ---------------------------------------------------------

    def _breach_key(self, domain: str) -> str:
        return self._keys.domain(domain, "breaches") if domain else self._keys.node + "breaches"

    def save_breaches(self, domain: str, breaches: Sequence[Mapping[str, object]]) -> None:
        """Buffer a domain's breaches: a JSON string in its slot (unfenced: counts only ever grow), or the node's
        for the whole crawl's rules ("")."""
        if domain:
            check_tag_free("domain", domain)
        with self._lock:
            self._breaches[domain] = json.dumps(list(breaches), separators=(",", ":"), sort_keys=True)

    def load_breaches(self, domains: Iterable[str] | None = None) -> dict[str, list[dict[str, object]]]:
        """domain -> stored breaches of `domains` (of the held domains and the node's own with None)."""
        self._guard()
        with self._lock:
            self._flush_locked()
        names = sorted(set(self.held_domains()) | {""} if domains is None else set(domains))
        pipe = self._pipeline()
        for domain in names:
            pipe.get(self._breach_key(domain))
        return {d: json.loads(text(v)) for d, v in zip(names, pipe.execute(), strict=True) if v is not None}

    # -- outbox (core.ports.Outbox) -----------------------------------------------------------------------

    def forward(self, links: Sequence[LinkLike]) -> None:
        """Buffer links for the inboxes of their domains' owners; a link without a domain is dropped (it could
        only be rejected)."""
        with self._lock:
            out = self._links_out
            for link in links:
                domain = domain_of(link.observed, link.base_url)
                if domain:
                    out.setdefault(domain, []).append(link_row(link))

    def post(self, domain: str, message: Mapping[str, object]) -> None:
        """Buffer a small message for the owner of `domain`'s inbox."""
        check_tag_free("domain", domain)
        with self._lock:
            self._posts.setdefault(domain, []).append(encode(message))

    # -- lost data -------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lost(self) -> StoreLost | None:
        """Why this store is not to be trusted any more, once it noticed."""
        return self._lost

    def _guard(self) -> None:
        if self._lost is not None:
            raise self._lost

    def _verify_instance(self, value: object) -> None:
        """Raise StoreLost (for good) when the instance marker read is not the one this store opened with."""
        if value is not None and text(value) == self.instance:
            return
        what = "is gone" if value is None else f"changed to {text(value)!r}"
        self._lose(
            f"redis instance marker {self._instance_key} {what} (was {self.instance!r}): the server restarted "
            "without its data or was flushed"
        )

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = StoreLost(reason)
        raise self._lost

    def check(self) -> None:
        """Read the instance marker now; StoreLost when the data this store wrote is gone."""
        self._guard()
        self._verify_instance(self._r.get(self._instance_key))

    def pending_mail(self) -> set[str]:
        """Domains whose inbox may hold mail; reads the instance marker in the same round trip (StoreLost)."""
        self._guard()
        pipe = self._pipeline()
        pipe.smembers(self.mail.pending_key)
        pipe.get(self._instance_key)
        pending, instance = pipe.execute()
        self._verify_instance(instance)
        return {text(d) for d in pending}

    # -- flush -----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Apply the buffers: node-scoped writes first, then one fenced script call per domain, pipelined.

        Each domain's batch is atomic. A refused domain's batch is dropped and FencedOut raised after every
        other domain landed; on a connection error the batches that did not answer stay buffered (the script
        is idempotent, so a retry that repeats a landed batch changes nothing).
        """
        with self._lock:
            self._flush_locked()

    def begin_flush(self) -> Flight | Flushed:
        """Start a flush and return without its answer: on a single server its pipeline is sent on the store's
        line behind the flushes out, and `wait()` on the result lands it (and those before it) as `flush()`
        would have (see flight.py). Every other call that touches Redis lands them all first. On a Cluster the flush
        runs at once."""
        with self._lock:
            return self._begin(inline=False)

    def _flush_locked(self) -> None:
        self._begin(inline=True).wait()

    def _begin(self, *, inline: bool) -> Flight | Flushed:
        """Start flushing the buffers: on the line behind the flights out, or `inline` once they landed (even
        with nothing buffered: a reader flushes to see every write begun). A Cluster has no flights out."""
        if inline:
            self._settle()
        if self._closed:
            raise RuntimeError("store is closed")
        self._guard()
        if self._notes:
            self._place_notes()
        if not (
            self._batches
            or self._orphans
            or self._meta
            or self._new_domains
            or self._new_keydom
            or self._new_hostdom
            or self._links_out
            or self._posts
            or self._breaches
        ):
            return Flushed()
        epoch = int(self._epoch())
        if not 0 <= epoch < EPOCH_LIMIT:
            raise ValueError(f"ring epoch {epoch} out of range")
        if self._single:
            return self._send_one(epoch, inline=inline)
        try:
            self._flush_node(epoch)
            if self._batches:
                self._flush_domains(epoch)
        except Exception as e:
            if inline:
                raise
            return Flushed(e)
        return Flushed()

    def _place_notes(self) -> None:
        """Move buffered notes into their domain's batch, or the node's orphan lines when the key names none."""
        unknown = [e.key for e in self._notes if not self._buffered_domain(e.key)]
        stored: dict[str, str] = {}
        if unknown:
            self._settle()  # the table read below must see every write begun
            found = self._r.hmget(self._keys.node + "keydom", unknown)
            stored = {k: text(d) for k, d in zip(unknown, found, strict=True) if d is not None}
        orphans: list[Entry] = []
        for entry in self._notes:
            domain = self._buffered_domain(entry.key) or stored.get(entry.key) or domain_of(entry.key)
            if not domain:
                orphans.append(entry)
            else:
                self._batch(domain).add_line(entry)
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

    def _sections(self, epoch: int, batches: dict[str, Batch]) -> tuple[str, str, str]:
        """The domains' `batches` as one write_all call takes them (see scripts.WRITE_ALL_LUA): the strings end to
        end, their lengths in bytes and five numbers per domain. No JSON string escaping on either side: that, and
        decoding it in Lua, cost more than the rest of packing a flush.

        A domain's meta is left alone unless its imax grows (an item admitted): a lease or a completion rewrites an
        item seq the domain has seen, and reading and writing the meta was a tenth of Redis's time per leased and
        completed URL. jmax is not sent: max_seqs() reads the journals' last lines instead."""
        strings: list[str] = []
        counts: list[int] = []
        add, count = strings.append, counts.extend
        fenced, named, landed = self._fenced_here, self._named_writer, self._imax_landed
        for domain, batch in batches.items():
            imax, entries, rows, robots = batch.imax, batch.entries, batch.rows, batch.robots
            add(domain)
            add("")
            add(f"{imax:020d}" if imax > landed.get(domain, -1) else "")
            for entry in entries:
                add(pack_checked_line(entry, epoch))
            for key, (first, f) in rows.items():  # batch.packed_rows(), without a list per domain
                add(key)
                add(pack_fields(f, first))
            for pair in robots.items():
                strings += pair
            count((1 if domain in fenced else 0, 1 if domain in named else 0, len(entries), len(rows), len(robots)))
        blob = "".join(strings)
        lengths = list(map(len, strings)) if blob.isascii() else [len(s.encode()) for s in strings]
        return blob, compact_json(counts), compact_json(lengths)

    def _applied(self, batches: dict[str, Batch], epoch: int, res: Any) -> list[FencedOut]:
        """Settle after a write_all answer for `batches`: StoreLost, else the refusals of the refused domains (their
        batches not applied; every other domain's was)."""
        status = int(res[0])
        if status == 0:
            self._verify_instance(res[1])
        if status == 2:
            vanished = [text(d) for d in res[1]]
            self._lose(
                f"the fence of {len(vanished)} domain(s) this node holds vanished (e.g. {vanished[0]!r}): a Redis "
                "server lost its data"
            )
        flat = [text(v) for v in res[1]]
        fenced = [FencedOut(flat[i], epoch, int(flat[i + 2]), flat[i + 1]) for i in range(0, len(flat), 3)]
        refused = {f.domain for f in fenced}
        landed = batches.keys() - refused if refused else batches.keys()
        self._fenced_here.update(landed)
        self._named_writer.update(d for d in landed if batches[d].entries)
        imax_landed = self._imax_landed
        for d in landed:
            imax = batches[d].imax
            if imax > imax_landed.get(d, -1):
                imax_landed[d] = imax
        return fenced

    def _flush_node(self, epoch: int) -> None:
        """Node-scoped writes, before any domain's: the domain set must name a domain before it holds data."""
        self._settle()
        pipe = self._pipeline()
        if not self._queue_node(pipe, epoch):
            return
        *_, instance = pipe.execute()
        self._node_done()
        self._verify_instance(instance)

    def _queue_node(self, pipe: Any, epoch: int) -> bool:
        """Add the node-scoped writes and a read of the instance marker (last) to `pipe`; False when none."""
        orphans = self._orphans
        if (
            not (self._meta or self._new_domains or self._new_keydom or self._new_hostdom or orphans or self._links_out)
            and not self._posts
            and not self._breaches
        ):
            return False
        mail = {d: link_messages(rows) for d, rows in self._links_out.items()}
        for domain, posts in self._posts.items():
            mail.setdefault(domain, []).extend(posts)
        if self._new_domains:
            pipe.sadd(self._keys.node + "domains", *sorted(self._new_domains))
            pipe.sadd(self._keys.all_domains, *sorted(self._new_domains))
        if self._new_keydom:
            pipe.hset(self._keys.node + "keydom", mapping=self._new_keydom)
        if self._new_hostdom:
            pipe.hset(self._keys.node + "hostdom", mapping=self._new_hostdom)
        if self._meta:
            pipe.hset(self._keys.node + "meta", mapping=self._meta)
        if orphans:
            pipe.zadd(self._keys.node + "orphans", {pack_line(e, epoch): 0 for e in orphans})
        for domain, value in self._breaches.items():
            pipe.set(self._breach_key(domain), value)
        self.mail.queue(pipe, mail)
        pipe.get(self._instance_key)
        return True

    def _node_done(self) -> None:
        """Empty the node-scoped buffers once their writes landed."""
        self._links_out = {}
        self._posts = {}
        self._breaches = {}
        self._known_domains |= self._new_domains
        self._new_domains = set()
        self._new_keydom = {}
        self._new_hostdom = {}
        self._meta = {}
        self._orphans = []

    def _write_call(
        self, domain: str, batch: Batch, epoch: int, line_writer: str, lines: list[str] | None = None
    ) -> Call:
        """KEYS and ARGV of one write-script call for `batch`; `lines` replaces the batch's own journal members."""
        keys = self._keys.script_keys(domain, line_writer)
        qprefix = self._keys.domain(domain, "q:")
        keys.extend(qprefix + h for h in batch.hosts())
        if lines is None:
            lines = [pack_line(e, epoch) for e in batch.entries]
        args: list[object] = [
            self.node_id, epoch, qprefix, line_writer, "", f"{batch.imax:020d}" if batch.imax >= 0 else "",
            json_array(lines),
            json_array(batch.packed_rows()),
            json_array([s for pair in batch.robots.items() for s in pair]),
        ]  # fmt: skip
        return keys, args

    def _flush_domains(self, epoch: int) -> None:
        domains = list(self._batches)
        calls = {d: self._write_call(d, self._batches[d], epoch, self.node_id) for d in domains}
        expected = sorted(d for d in domains if d in self._fenced_here)
        checks = [("EXISTS", self._keys.domain(d, "fence")) for d in expected] + [("GET", self._instance_key)]
        results, found = self._scripts.run_checked("write", calls, checks)
        *exists, instance = found
        self._verify_instance(instance)
        vanished = [d for d, n in zip(expected, exists, strict=True) if not isinstance(n, BaseException) and not n]
        if vanished:
            self._lose(
                f"the fence of {len(vanished)} domain(s) this node holds vanished (e.g. {vanished[0]!r}): a Redis "
                "server or Cluster shard lost its data"
            )
        fenced: list[FencedOut] = []
        error: BaseException | None = None
        for domain in domains:
            res = results[domain]
            if isinstance(res, BaseException):
                error = error or res
                continue
            del self._batches[domain]
            if int(res[0]) == 0:
                fenced.append(FencedOut(domain, epoch, int(text(res[2])), text(res[1])))
            else:
                self._fenced_here.add(domain)
        if fenced:
            raise FencedOut.of(fenced) from error
        if error is not None:
            raise error

    def prune(self, keys: Sequence[str]) -> None:
        """Delete the rows of `keys` and their journal lines (every writer's) now, buffered writes first.

        The rows go in one script call per domain, fenced as a write (FencedOut when a newer owner holds the
        domain) and pipelined with the same checks as a flush (the instance marker, the fences this store set:
        StoreLost); the journal lines are then found by one scan of each writer's journal of the domain: the
        core prunes rarely.
        """
        if not keys:
            return
        with self._lock:
            self._flush_locked()
        epoch = int(self._epoch())
        by_domain: dict[str, list[str]] = {}
        for key in keys:
            domain = self._key_domain(key)
            if domain:
                by_domain.setdefault(domain, []).append(key)
        if not by_domain:
            return
        calls = {
            d: ([self._keys.domain(d, s) for s in ("fence", "items", "states")], [self.node_id, epoch, json_array(k)])
            for d, k in by_domain.items()
        }
        expected = sorted(d for d in by_domain if d in self._fenced_here)
        checks = [("EXISTS", self._keys.domain(d, "fence")) for d in expected] + [("GET", self._instance_key)]
        results, found = self._scripts.run_checked("prune", calls, checks)
        *exists, instance = found
        self._verify_instance(instance)
        if any(not isinstance(n, BaseException) and not n for n in exists):
            self._lose("the fence of a domain this node holds vanished while pruning: a Redis server lost its data")
        for domain, doomed in sorted(by_domain.items()):
            res = results[domain]
            if isinstance(res, BaseException):
                raise res
            if int(res[0]) == 0:
                raise FencedOut(domain, epoch, int(text(res[2])), text(res[1]))
            gone = set(doomed)
            for writer in sorted(text(w) for w in self._r.smembers(self._keys.domain(domain, "writers"))):
                name = self._keys.domain(domain, f"j:{writer}")
                lines = {text(m) for m, _ in self._r.zscan_iter(name, count=_SCAN_COUNT)}
                drop = [m for m in lines if unpack_line(m)[1].key in gone]
                for start in range(0, len(drop), 1000):
                    self._r.zrem(name, *drop[start : start + 1000])

    # -- reads -----------------------------------------------------------------------------------------

    def get_meta(self, name: str) -> str | None:
        with self._lock:
            if name in self._meta:
                return self._meta[name]
            self._settle()
        value = self._r.hget(self._keys.node + "meta", name)
        return None if value is None else text(value)

    def _host_domain(self, host: str) -> str:
        return self._host_dom.get(host) or registrable_domain(host)

    def _key_domain(self, key: str) -> str:
        """The domain holding `key`: this process's table, the node's stored table, else the key's own text.

        "" when none of them names one (the key is not a URL and no row of it was written).
        """
        hit = self._key_dom.get(key)
        if hit is not None:
            return hit
        stored = self._r.hget(self._keys.node + "keydom", key)
        if stored is not None:
            return text(stored)
        return domain_of(key)

    def backlog(self, host: str, after: tuple[int, int], limit: int) -> list[Item]:
        """Scheduled items of `host` with (priority, seq) > `after`, in that order: one range read of its zset."""
        self._guard()
        with self._lock:
            self._flush_locked()
        if limit <= 0:
            return []
        lower = after_bound(after)
        if lower is None:
            return []
        found: list[Item] = []
        for domain in dict.fromkeys((registrable_domain(host), self._host_domain(host))):
            backlog, items = self._keys.domain(domain, f"q:{host}"), self._keys.domain(domain, "items")
            keys, rows = self._scripts.eval("backlog", [backlog, items], [lower, limit])
            found += [unpack_row(text(k), text(v)) for k, v in zip(keys, rows, strict=True) if v is not None]
        if len(found) > limit or len(set(i.domain for i in found)) > 1:
            found.sort(key=lambda i: (i.priority, i.seq, i.key))
        return found[:limit]

    def get(self, key: str) -> Item | None:
        """The row of `key`; a buffered row is answered from the buffer without a flush."""
        self._guard()
        with self._lock:
            for batch in self._batches.values():
                buffered = batch.rows.get(key)
                if buffered is not None:
                    return unpack_row(key, pack_fields(buffered[1], buffered[0]))
            self._settle()
        domain = self._key_domain(key)
        if not domain:
            return None
        value = self._r.hget(self._keys.domain(domain, "items"), key)
        return None if value is None else unpack_row(key, text(value))

    def history(self, key: str) -> list[Entry]:
        """Every journal line of one key, by any owner, in the order they were applied. Scans: not for hot paths.

        Looks in the domain the node's table names for the key and in the one its text names, should they differ.
        """
        with self._lock:
            self._flush_locked()
        domains = {self._key_domain(key), domain_of(key)} - {""}
        lines = [line for d in sorted(domains) for line in self._domain_lines(d, key)]
        orphans = self._scan_zset(self._keys.node + "orphans", key_pattern(key))
        lines.extend((*unpack_line(m), self.node_id) for m in orphans)
        lines.sort(key=lambda t: (t[0], t[1].seq))
        return [e for _, e, _ in lines if e.key == key]

    def _domain_lines(self, domain: str, key: str | None) -> list[tuple[int, Entry, str]]:
        """(epoch, entry, writer) of a domain's journal, optionally one key's, in applied order."""
        writers = sorted(text(w) for w in self._r.smembers(self._keys.domain(domain, "writers")))
        pattern = key_pattern(key) if key is not None else None
        out: list[tuple[int, Entry, str]] = []
        for writer in writers:
            for member in self._scan_zset(self._keys.domain(domain, f"j:{writer}"), pattern):
                epoch, entry = unpack_line(member)
                out.append((epoch, entry, writer))
        out.sort(key=lambda t: (t[0], t[1].seq))
        return out

    def _scan_zset(self, name: str, pattern: str | None) -> list[str]:
        if pattern is None:
            return [text(m) for m in self._r.zrangebylex(name, "-", "+")]
        return list({text(m) for m, _ in self._r.zscan_iter(name, match=pattern, count=_SCAN_COUNT)})

    def _scan_hash(self, name: str) -> Iterator[tuple[str, str]]:
        """Fields of a hash, each once, without one long HGETALL on a big domain."""
        seen: set[str] = set()
        for f, v in self._r.hscan_iter(name, count=_SCAN_COUNT):
            field_ = text(f)
            if field_ not in seen:
                seen.add(field_)
                yield field_, text(v)

    def journal(self, after_seq: int = 0) -> Iterator[Entry]:
        """This node's journal lines with seq > after_seq, in seq order, up to the highest seq at the call."""
        with self._lock:
            self._flush_locked()
        sources = [self._keys.domain(d, f"j:{self.node_id}") for d in sorted(self._domains())]
        sources.append(self._keys.node + "orphans")
        pipe = self._pipeline()
        for name in sources:
            pipe.zrevrangebylex(name, "+", "-", 0, 1)
        tops = {}
        for name, top in zip(sources, pipe.execute(), strict=True):
            if top and int(text(top[0])[:20]) > after_seq:
                tops[name] = int(text(top[0])[:20])
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
            chunks = [sorted(text(m) for m in chunk) for chunk in pipe.execute()]
            for member in heapq.merge(*chunks):
                yield unpack_line(member)[1]
            lo = top

    def _domains(self) -> set[str]:
        with self._lock:
            return set(self._known_domains | {text(d) for d in self._r.smembers(self._keys.node + "domains")})

    def all_domains(self) -> set[str]:
        """Every domain any node of this namespace ever wrote: what a new ring's owners must look at."""
        with self._lock:
            self._flush_locked()
        return self.written_domains()

    def written_domains(self) -> set[str]:
        """Every domain written to Redis so far, without flushing this store first (a reader outside the core's
        batches: it never commits the core's writes for it)."""
        return {text(d) for d in self._r.smembers(self._keys.all_domains)}

    def written_domain_count(self) -> int:
        """How many domains were ever written (the set only grows, so an unchanged count means no new domain)."""
        return int(self._r.scard(self._keys.all_domains))

    def domain_counts(self, domain: str) -> dict[str, int]:
        """state -> number of rows of one domain (kept by the write script, no scan)."""
        with self._lock:
            self._settle()
        return {text(k): int(v) for k, v in self._r.hgetall(self._keys.domain(domain, "states")).items()}

    def held_domains(self) -> list[str]:
        """Domains this node holds: in its domain set, with a fence that names it."""
        with self._lock:
            self._flush_locked()
        domains = sorted(self._domains())
        pipe = self._pipeline()
        for d in domains:
            pipe.hget(self._keys.domain(d, "fence"), "owner")
        return [d for d, owner in zip(domains, pipe.execute(), strict=True) if owner and text(owner) == self.node_id]

    def _read_held(self, suffix: str) -> list[dict[str, str]]:
        """HGETALL of one small per-domain hash for every held domain, in one pipeline."""
        held = self.held_domains()
        pipe = self._pipeline()
        for d in held:
            pipe.hgetall(self._keys.domain(d, suffix))
        return [{text(k): text(v) for k, v in h.items()} for h in pipe.execute()]

    def items(self, states: Iterable[State] | None = None) -> Iterator[Item]:
        """Rows of the held domains (optionally only `states`) in first-write order, as of the call."""
        wanted = None if states is None else {State(s).value for s in states}
        rows = self._sorted_rows(self.held_domains(), wanted)
        return (unpack_row(key, packed) for _, key, packed in rows)

    def _sorted_rows(self, domains: list[str], wanted: set[str] | None) -> list[tuple[str, str, str]]:
        """(first, key, packed row) of the domains' rows in `wanted` states, sorted: first-write order."""
        rows = [
            (row_first(packed), key, packed)
            for domain in domains
            for key, packed in self._scan_hash(self._keys.domain(domain, "items"))
            if wanted is None or row_state(packed) in wanted
        ]
        rows.sort()
        return rows

    def _sorted_robots(self, domains: list[str]) -> list[tuple[str, str, str]]:
        """(first, origin, packed record) of the domains' robots records, in first-save order."""
        records = [
            (packed[:20], origin, packed)
            for domain in domains
            for origin, packed in self._scan_hash(self._keys.domain(domain, "robots"))
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
        return (unpack_robots(origin, packed) for _, origin, packed in records)

    def max_seqs(self) -> tuple[int, int]:
        """(highest journal seq, highest item seq) over every domain this node ever wrote and its orphan lines.

        The journal seq is the last line of each writer's journal in each domain (members start with the zero-padded
        seq) and the domain meta's jmax, which the flush no longer keeps but stores written before hold."""
        with self._lock:
            self._flush_locked()
        domains = sorted(self._domains())
        pipe = self._pipeline()
        for d in domains:
            pipe.hmget(self._keys.domain(d, "meta"), ["jmax", "imax"])
            pipe.smembers(self._keys.domain(d, "writers"))
        pipe.zrevrangebylex(self._keys.node + "orphans", "+", "-", 0, 1)
        *found, orphan_top = pipe.execute()
        metas = found[0::2]
        jmax = max((int_or(j, 0) for j, _ in metas), default=0)
        imax = max((int_or(i, 0) for _, i in metas), default=0)
        pipe = self._pipeline()
        for d, writers in zip(domains, found[1::2], strict=True):
            for writer in sorted(text(w) for w in writers):
                pipe.zrevrangebylex(self._keys.domain(d, f"j:{writer}"), "+", "-", 0, 1)
        for top in [orphan_top, *pipe.execute()]:
            if top:
                jmax = max(jmax, int(text(top[0])[:20]))
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
                if self._line is not None:
                    self._line.close()
                if self._owns_client:
                    self.client.close()
