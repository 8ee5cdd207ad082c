"""Handing a domain over: its fence, adoption by a new owner in the same Redis, and copies between deployments.

`DomainHandoff` is mixed into RedisStore (store.py), which provides the client, key names, scripts and buffers
declared below. Nodes share one Redis, so a new owner calls `adopt_domains()`: every claim in one pipeline (the
old owner is locked out from that moment, so the reads that follow are stable), then the rows, robots records
and budget breaches in pipelines of a few hundred domains. `export_domain()` / `import_domain()` copy a domain
between namespaces or Redis deployments.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from frontier_node.core.ports import Fenced
from frontier_node.core.records import Entry, Item, Kind
from frontier_node.store.redis.codec import (
    EPOCH_LIMIT,
    EXPORT_FORMAT,
    IMPORT_FORMATS,
    Keys,
    RowFields,
    check_tag_free,
    export_item,
    import_item,
    pack_fields,
    pack_line,
    pack_robots,
    robots_first,
    robots_json,
    row_fields,
    row_first,
    text,
    unpack_robots,
    unpack_row,
    with_first,
)
from frontier_node.store.redis.mail import Mailroom
from frontier_node.store.redis.scripts import Call, Scripts

_SCAN_ROWS: Final = 20_000
_ADOPT_CHUNK: Final = 256


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

    @classmethod
    def of(cls, refused: Sequence[FencedOut]) -> FencedOut:
        """One FencedOut for a flush refused for the domains of `refused` (not empty): the first, the rest in
        `others`."""
        first = refused[0]
        return cls(first.domain, first.writer_epoch, first.fence_epoch, first.owner, others=tuple(refused[1:]))


@dataclass(slots=True)
class AdoptedDomain:
    """What `adopt_domain` hands the new owner: the fence it replaced and the domain's rows and robots records."""

    domain: str
    epoch: int
    previous_owner: str
    previous_epoch: int
    items: list[Item]
    robots: list[tuple[str, str, dict[str, object]]]
    breaches: list[dict[str, object]] = field(default_factory=list)


class Batch:
    """Buffered writes of one domain: applied by one script call, all or nothing.

    `rows` maps a key to (the seq of the line that first wrote it in this batch, its latest row snapshot): a key
    recorded several times is packed once, at the flush. `imax` is the highest item seq.
    """

    __slots__ = ("entries", "imax", "robots", "rows")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.rows: dict[str, tuple[int, RowFields]] = {}
        self.robots: dict[str, str] = {}
        self.imax = -1

    def add_line(self, entry: Entry) -> None:
        self.entries.append(entry)

    def extend(self, later: Batch) -> None:
        """Add `later`'s writes after these, as if they had been buffered here (a flush that did not land)."""
        for entry in later.entries:
            self.add_line(entry)
        for key, (first, fields) in later.rows.items():
            mine = self.rows.get(key)
            self.rows[key] = (first if mine is None else mine[0], fields)
        for origin, packed in later.robots.items():
            mine_robots = self.robots.get(origin)
            self.robots[origin] = packed if mine_robots is None else with_first(packed, robots_first(mine_robots))
        self.imax = max(self.imax, later.imax)

    def packed_rows(self) -> list[str]:
        """key, packed row, key, ... (the write scripts' form)."""
        return [s for key, (first, f) in self.rows.items() for s in (key, pack_fields(f, first))]

    def hosts(self) -> list[str]:
        """The hosts of the buffered rows, sorted."""
        return sorted({f[1] for _, f in self.rows.values()})


class DomainHandoff:
    """Fences and handoffs of RedisStore (see the module docstring)."""

    # What RedisStore provides.
    node_id: str
    mail: Mailroom
    _keys: Keys
    _scripts: Scripts
    _lock: threading.RLock
    _known_domains: set[str]
    _new_domains: set[str]
    _fenced_here: set[str]
    _r: Any

    def _guard(self) -> None:
        raise NotImplementedError

    def _pipeline(self) -> Any:
        raise NotImplementedError

    def _flush_node(self, epoch: int) -> None:
        raise NotImplementedError

    def _flush_locked(self) -> None:
        raise NotImplementedError

    def _settle(self) -> None:
        raise NotImplementedError

    def _learn(self, key: str, host: str, origin: str, domain: str, *, page: bool = True) -> None:
        raise NotImplementedError

    def _breach_key(self, domain: str) -> str:
        raise NotImplementedError

    def _scan_hash(self, name: str) -> Iterator[tuple[str, str]]:
        raise NotImplementedError

    def _sorted_rows(self, domains: list[str], wanted: set[str] | None) -> list[tuple[str, str, str]]:
        raise NotImplementedError

    def _sorted_robots(self, domains: list[str]) -> list[tuple[str, str, str]]:
        raise NotImplementedError

    def _domain_lines(self, domain: str, key: str | None) -> list[tuple[int, Entry, str]]:
        raise NotImplementedError

    def _write_call(
        self, domain: str, batch: Batch, epoch: int, line_writer: str, lines: list[str] | None = None
    ) -> Call:
        raise NotImplementedError

    # -- fence -----------------------------------------------------------------------------------------

    def fence(self, domain: str) -> tuple[str, int] | None:
        """(owner, epoch) of the domain's fence, or None when no node ever wrote or claimed it."""
        with self._lock:
            self._settle()
        owner, epoch = self._r.hmget(self._keys.domain(domain, "fence"), ["owner", "epoch"])
        return None if epoch is None else (text(owner or b""), int(text(epoch)))

    def claim(self, domain: str, epoch: int) -> tuple[str, int]:
        """Take the domain's fence at `epoch` unless a newer epoch holds it; returns the previous (owner, epoch).

        The previous owner is "" and its epoch -1 when the domain had no fence. Raises FencedOut when refused.
        """
        if not 0 <= epoch < EPOCH_LIMIT:
            raise ValueError(f"ring epoch {epoch} out of range")
        check_tag_free("domain", domain)
        self._guard()
        with self._lock:
            if domain not in self._known_domains:
                self._new_domains.add(domain)
            self._flush_node(epoch)
        res = self._scripts.eval("claim", [self._keys.domain(domain, "fence")], [self.node_id, epoch])
        if int(res[0]) == 0:
            raise FencedOut(domain, epoch, int(text(res[2])), text(res[1]))
        self._fenced_here.add(domain)
        return text(res[1]), int(text(res[2]))

    def adopt_domain(self, domain: str, epoch: int) -> AdoptedDomain:
        """Claim `domain` at `epoch`, then read its rows and robots records for the new owner's RAM state.

        The claim comes first: from then on the previous owner's writes are refused, so the read is stable.
        Keys and hosts whose domain the text does not tell are recorded in this node's lookup tables.
        """
        adopted = self.adopt_domains([domain], epoch)
        return adopted[0]

    def adopt_domains(self, domains: Sequence[str], epoch: int) -> list[AdoptedDomain]:
        """adopt_domain for many domains in a few round trips: every claim in one pipeline, then the rows and
        robots records of the claimed domains in pipelines of _ADOPT_CHUNK domains (a domain with more than
        _SCAN_ROWS rows is read by HSCAN on its own, so no single reply is huge). FencedOut when any claim is
        refused (the domains claimed before it stay claimed: the ring that refused will move them on)."""
        if not 0 <= epoch < EPOCH_LIMIT:
            raise ValueError(f"ring epoch {epoch} out of range")
        self._guard()
        names = list(dict.fromkeys(domains))
        for domain in names:
            check_tag_free("domain", domain)
        if not names:
            return []
        with self._lock:
            self._new_domains.update(d for d in names if d not in self._known_domains)
            self._flush_node(epoch)
        calls = {d: ([self._keys.domain(d, "fence")], [self.node_id, epoch]) for d in names}
        sizes = [("HLEN", self._keys.domain(d, "items")) for d in names]
        claimed, lengths = self._scripts.run_checked("claim", calls, sizes)
        for domain in names:
            res = claimed[domain]
            if isinstance(res, BaseException):
                raise res
            if int(res[0]) == 0:
                raise FencedOut(domain, epoch, int(text(res[2])), text(res[1]))
            self._fenced_here.add(domain)
        big = {d for d, n in zip(names, lengths, strict=True) if isinstance(n, int) and n > _SCAN_ROWS}
        rows: dict[str, dict[str, str]] = {d: dict(self._scan_hash(self._keys.domain(d, "items"))) for d in big}
        records: dict[str, dict[str, str]] = {}
        breaches: dict[str, list[dict[str, object]]] = {}
        for start in range(0, len(names), _ADOPT_CHUNK):
            chunk = names[start : start + _ADOPT_CHUNK]
            pipe = self._pipeline()
            for domain in chunk:
                if domain not in big:
                    pipe.hgetall(self._keys.domain(domain, "items"))
                pipe.hgetall(self._keys.domain(domain, "robots"))
                pipe.get(self._breach_key(domain))
            answers = iter(pipe.execute())
            for domain in chunk:
                if domain not in big:
                    rows[domain] = {text(k): text(v) for k, v in next(answers).items()}
                records[domain] = {text(k): text(v) for k, v in next(answers).items()}
                raw = next(answers)
                if raw is not None:
                    breaches[domain] = json.loads(text(raw))
        out: list[AdoptedDomain] = []
        with self._lock:
            for domain in names:
                ordered = sorted((row_first(v), k, v) for k, v in rows[domain].items())
                items = [unpack_row(k, v) for _, k, v in ordered]
                robots = [unpack_robots(o, v) for _, o, v in sorted((v[:20], o, v) for o, v in records[domain].items())]
                for item in items:
                    self._learn(item.key, item.host, item.origin, domain, page=item.kind is Kind.PAGE)
                res = claimed[domain]
                out.append(
                    AdoptedDomain(
                        domain, epoch, text(res[1]), int(text(res[2])), items, robots, breaches.get(domain, [])
                    )
                )
            self._flush_node(epoch)
        self.mail.mark_nonempty(names)
        return out

    # -- handoff between deployments ---------------------------------------------------------------------

    def export_domain(self, domain: str, *, journal_tail: int | None = None) -> dict[str, Any]:
        """Everything of one domain as JSON-ready data: fence, rows, robots records and journal (all writers).

        `journal_tail` keeps only the last that many lines, in the order they were applied.
        """
        with self._lock:
            self._flush_locked()
        fence = self.fence(domain)
        items = [export_item(unpack_row(k, v), int(f)) for f, k, v in self._sorted_rows([domain], None)]
        robots = [[*unpack_robots(o, v), int(f)] for f, o, v in self._sorted_robots([domain])]
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
        if data.get("format") not in IMPORT_FORMATS or data.get("domain") != domain:
            raise ValueError(f"not an export of domain {domain!r} in format {sorted(IMPORT_FORMATS)}")
        self.claim(domain, epoch)
        by_writer: dict[str, list[tuple[int, Entry]]] = {}
        for line in data["journal"]:
            by_writer.setdefault(str(line["writer"]), []).append((int(line["epoch"]), Entry(*line["entry"])))
        batch = Batch()
        for fields in data["items"]:
            item, first = import_item(fields)
            batch.rows[item.key] = (first, row_fields(item))
            batch.imax = max(batch.imax, item.seq)
        for origin, host, record, first in data["robots"]:
            batch.robots[origin] = pack_robots(int(first), host, robots_json(record))
        calls: dict[str, Call] = {}
        writers = sorted(by_writer) or [self.node_id]
        for n, writer in enumerate(writers):
            lines = [pack_line(e, ep) for ep, e in by_writer.get(writer, [])]
            calls[writer] = self._write_call(domain, batch if n == 0 else Batch(), epoch, writer, lines)
        for res in self._scripts.run_pipelined("write", calls).values():
            if isinstance(res, BaseException):
                raise res
            if int(res[0]) == 0:
                raise FencedOut(domain, epoch, int(text(res[2])), text(res[1]))
        with self._lock:
            for fields in data["items"]:
                page = int(fields["kind"]) == int(Kind.PAGE)
                self._learn(str(fields["key"]), str(fields["host"]), str(fields["origin"]), domain, page=page)
            self._flush_node(epoch)
