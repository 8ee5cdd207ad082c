"""The Redis store's outbox and inbox: links (and robots hops) one node leaves for the owner of their domain.

Layout (beside codec.py's):

    ns:{d:<domain>}:inbox     stream  entries with one field "m": a JSON message for the domain's owner
    ns:{all}:inbox            set     domains whose inbox may hold entries (what owners poll)

A message is {"t": "links", "l": [[observed, base_url, source_key, depth, priority, redirect_hops, seed], ...]}
(at most LINKS_PER_ENTRY links; a link with a client payload has it, base64, as an eighth field) or a small
typed dict posted by the core ({"t": "robots_hop", ...}). Writing is
unfenced and append-only (XADD, then SADD of the domain), in the flush that buffered it: any node may leave mail
for any domain, and the mail outlives whoever wrote it. Only the owner drains: it reads a page of entries,
admits them, commits, and only then deletes those entries by id (XDEL), so a crash in between re-delivers them
and dedup makes that harmless; two nodes draining one domain during a handoff delete only what each read.

The pending set never forgets a domain with entries: a writer adds the domain after its XADD; a drainer that
found the inbox empty removes the domain and then looks again, adding it back if an entry slipped in between.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from frontier_node.core.records import Link, LinkLike
from frontier_node.store.redis.codec import text

LINKS_PER_ENTRY: Final = 5000
READ_COUNT: Final = 64
"""Entries read per domain per drain (at most 64 x 5000 links)."""


def link_row(link: LinkLike) -> list[object]:
    """A link as a JSON row; its client payload (base64) is an eighth field only when it has one."""
    row: list[object] = [
        link.observed,
        link.base_url,
        link.source_key,
        int(link.depth),
        int(link.priority),
        int(link.redirect_hops),
        bool(link.seed),
    ]
    if link.payload:
        row.append(base64.b64encode(link.payload).decode("ascii"))
    return row


def row_link(row: Sequence[Any]) -> Link:
    """The link of a row (seven fields, or eight with a payload)."""
    observed, base, source, depth, priority, hops, seed, *rest = row
    payload = base64.b64decode(str(rest[0])) if rest else b""
    return Link(str(observed), str(base), str(source), int(depth), int(priority), int(hops), bool(seed), payload)


def link_messages(rows: list[list[object]]) -> list[str]:
    """The JSON messages carrying `rows` (chunks of LINKS_PER_ENTRY)."""
    return [
        json.dumps({"t": "links", "l": rows[i : i + LINKS_PER_ENTRY]}, separators=(",", ":"), ensure_ascii=False)
        for i in range(0, len(rows), LINKS_PER_ENTRY)
    ]


def encode(message: Mapping[str, object]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


class Mailroom:
    """Inbox reads and acknowledgements of one namespace (the writes go with RedisStore's flush pipeline)."""

    def __init__(self, client: Any, namespace: str) -> None:
        self._r = client
        self.pending_key = f"{namespace}:{{all}}:inbox"
        self._ns = namespace

    def inbox_key(self, domain: str) -> str:
        return f"{self._ns}:{{d:{domain}}}:inbox"

    def queue(self, pipe: Any, mail: Mapping[str, list[str]]) -> None:
        """Add the XADDs of `mail` (domain -> JSON messages) and the pending marks to a pipeline."""
        for domain, messages in mail.items():
            key = self.inbox_key(domain)
            for message in messages:
                pipe.xadd(key, {"m": message})
        if mail:
            pipe.sadd(self.pending_key, *sorted(mail))

    def read(self, domains: Iterable[str], count: int = READ_COUNT) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """domain -> up to `count` (entry id, message) of its inbox, oldest first, in one round trip."""
        names = sorted(domains)
        if not names:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for domain in names:
            pipe.xrange(self.inbox_key(domain), "-", "+", count=count)
        out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for domain, entries in zip(names, pipe.execute(), strict=True):
            got = []
            for entry_id, fields in entries:
                raw = fields.get(b"m", fields.get("m"))
                if raw is None:
                    continue
                try:
                    message = json.loads(text(raw))
                except ValueError:
                    message = {"t": "unreadable"}
                got.append((text(entry_id), message if isinstance(message, dict) else {"t": "unreadable"}))
            out[domain] = got
        return out

    def ack(self, done: Mapping[str, Sequence[str]], drained: Iterable[str] = ()) -> None:
        """Delete handled entries (by id) and unmark the `drained` domains whose inbox is then empty."""
        pipe = self._r.pipeline(transaction=False)
        for domain, ids in done.items():
            if ids:
                pipe.xdel(self.inbox_key(domain), *ids)
        if done:
            pipe.execute()
        self.unmark_if_empty(drained)

    def unmark_if_empty(self, domains: Iterable[str]) -> None:
        """Remove empty inboxes from the pending set, then add back any that received an entry meanwhile."""
        names = sorted(domains)
        if not names:
            return
        pipe = self._r.pipeline(transaction=False)
        for domain in names:
            pipe.xlen(self.inbox_key(domain))
        empty = [d for d, n in zip(names, pipe.execute(), strict=True) if int(n) == 0]
        if not empty:
            return
        self._r.srem(self.pending_key, *empty)
        pipe = self._r.pipeline(transaction=False)
        for domain in empty:
            pipe.xlen(self.inbox_key(domain))
        refilled = [d for d, n in zip(empty, pipe.execute(), strict=True) if int(n) > 0]
        if refilled:
            self._r.sadd(self.pending_key, *refilled)

    def mark_nonempty(self, domains: Iterable[str]) -> list[str]:
        """Put the domains whose inbox holds entries (back) in the pending set; which they are."""
        names = sorted(domains)
        if not names:
            return []
        pipe = self._r.pipeline(transaction=False)
        for domain in names:
            pipe.xlen(self.inbox_key(domain))
        full = [d for d, n in zip(names, pipe.execute(), strict=True) if int(n) > 0]
        if full:
            self._r.sadd(self.pending_key, *full)
        return full

    def sizes(self, domains: Iterable[str]) -> dict[str, int]:
        """domain -> entries in its inbox (for inspection and tests)."""
        names = sorted(domains)
        pipe = self._r.pipeline(transaction=False)
        for domain in names:
            pipe.xlen(self.inbox_key(domain))
        return {d: int(n) for d, n in zip(names, pipe.execute(), strict=True)}
