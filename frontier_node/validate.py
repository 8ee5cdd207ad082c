"""Bounded, validated input: every cap of the frontier protocol in one table, and the check that applies it.

A request that breaks a rule is refused before any work, with a reason that names the field and the rule:
RESOURCE_EXHAUSTED when a string, body or list is larger than its cap, INVALID_ARGUMENT for a bad value (a
non-finite or out-of-range number, a control character where none belongs, a missing id). Nothing of a
refused request is stored. The same caps are documented next to each field in proto/hostring/v1/frontier.proto
(`[cap ...]`, `[range ...]`); tests/test_wire_limits.py keeps the two in step.

Links are the one exception on purpose: a reference as written in a page (`Link.observed`, `Link.base_url`)
comes from a crawled server, so an over-long one is answered per link (REJECTED too_long by the kernel, above
16 x the node's max URL length) instead of failing the whole call of an honest worker; it is never stored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from mypy_extensions import mypyc_attr

from hostring.limits import (
    MAX_COMPLETIONS_PER_BATCH,
    MAX_GENERATION,
    MAX_ID_CHARS,
    MAX_LEASE_ITEMS,
    MAX_LINKS_PER_COMPLETE,
    MAX_LINKS_PER_DISCOVER,
    MAX_ROBOTS_BODY_BYTES,
    MAX_URL_CHARS,
    MAX_WAIT_MS,
)
from hostring.text import has_control
from hostring.v1 import frontier_pb2 as pb

MAX_LIST_HOSTS: Final = 1_000
MAX_HOST_CHARS: Final = 1_024
MAX_REFERENCE_CHARS: Final = 65_536
MAX_REVISIT_S: Final = 3_650 * 86_400  # ten years: longer than any revisit interval, retention or policy bound
MAX_UNIX_MS: Final = 253_402_300_799_999  # the last millisecond of the year 9999
_TOKEN: Final = re.compile(r"[A-Za-z0-9_.:%-]*")


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of a builtin exception
class Refused(ValueError):
    """A request the node will not act on: the gRPC status to answer, the field (a path) and why."""

    def __init__(self, code: grpc.StatusCode, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}" if field else detail)
        self.code = code
        self.field = field
        self.detail = detail

    def within_entry(self, field: str) -> Refused:
        """This list entry's refusal with the entry's own field path appended."""
        return Refused(self.code, f"{self.field}.{field}" if field else self.field, self.detail)

    @property
    def reason(self) -> str:
        """The answer's details: the field's path, then what is wrong with it."""
        return str(self)

    def within(self, prefix: str) -> Refused:
        """The same refusal with its field path under `prefix` (the enclosing message or list entry)."""
        field = self.field if not self.field or self.field.startswith("[") else f".{self.field}"
        return Refused(self.code, prefix + field, self.detail)


@dataclass(frozen=True, slots=True)
class Rule:
    """What one field may hold. Numbers of a double field must also be finite."""

    cap: int | None = None  # most characters (string), bytes (bytes) or entries (repeated field)
    lo: float | None = None  # least value of a number
    hi: float | None = None  # greatest value of a number
    also: tuple[float, ...] = ()  # values allowed outside [lo, hi] (status 0: no response)
    required: bool = False  # must not be empty
    token: bool = False  # letters, digits and _ . : % - only
    printable: bool = False  # no control characters (they would be journaled and shown to operators)
    per_link: bool = False  # not refused whole: the kernel rejects an over-long reference per link


# Every string, bytes, list and number of every request, by message. A field absent here has no rule beyond
# its type (booleans, enums, the ring epoch a client echoes, a link's priority).
RULES: Final[Mapping[str, Mapping[str, Rule]]] = {
    "Link": {
        "observed": Rule(per_link=True),
        "base_url": Rule(per_link=True),
        "source_key": Rule(cap=MAX_URL_CHARS, printable=True),
        "depth": Rule(hi=1_000_000),
        "redirect_hops": Rule(hi=100),
        "payload": Rule(per_link=True),  # the core rejects one over MAX_LINK_PAYLOAD_BYTES: payload_too_large
    },
    "DiscoverRequest": {
        "links": Rule(cap=MAX_LINKS_PER_DISCOVER),
        "worker_id": Rule(cap=MAX_ID_CHARS, printable=True),
    },
    "LeaseRequest": {
        "worker_id": Rule(cap=MAX_ID_CHARS, required=True, printable=True),
        "max_items": Rule(hi=MAX_LEASE_ITEMS),
        "wait_ms": Rule(hi=MAX_WAIT_MS),
    },
    "RenewRequest": {
        "lease_id": Rule(cap=MAX_URL_CHARS, required=True, printable=True),
        "generation": Rule(hi=MAX_GENERATION),
        "extend_ms": Rule(hi=3_600_000),
        "worker_id": Rule(cap=MAX_ID_CHARS, printable=True),
    },
    "Outcome": {
        "status": Rule(lo=100, hi=999, also=(0,)),
        "error_class": Rule(cap=64, token=True),
        "error_detail": Rule(cap=1_024),
        "retry_after_s": Rule(lo=-1, hi=1e9),
        "location": Rule(cap=MAX_REFERENCE_CHARS),
        "content_type": Rule(cap=1_024),
        "bytes": Rule(hi=2**40),
        "response_s": Rule(lo=0, hi=86_400),
        "body_digest": Rule(cap=128, token=True),
        "evidence": Rule(cap=512, printable=True),
        "remote_ip": Rule(cap=64, token=True),
        "etag": Rule(cap=8_192),
        "last_modified": Rule(cap=256),
        "robots_body": Rule(cap=MAX_ROBOTS_BODY_BYTES),
    },
    "CompleteRequest": {
        "lease_id": Rule(cap=MAX_URL_CHARS, required=True, printable=True),
        "generation": Rule(hi=MAX_GENERATION),
        "worker_id": Rule(cap=MAX_ID_CHARS, printable=True),
        "links": Rule(cap=MAX_LINKS_PER_COMPLETE),
    },
    "CompleteBatchRequest": {
        "completions": Rule(cap=MAX_COMPLETIONS_PER_BATCH),
        "worker_id": Rule(cap=MAX_ID_CHARS, printable=True),
        "lease_max_items": Rule(hi=MAX_LEASE_ITEMS),
        "lease_wait_ms": Rule(hi=MAX_WAIT_MS),
    },
    "GetHostRequest": {"host": Rule(cap=MAX_HOST_CHARS)},
    "ListHostsRequest": {"limit": Rule(hi=MAX_LIST_HOSTS)},
    "GetUrlRequest": {"url": Rule(cap=MAX_REFERENCE_CHARS)},
    "PauseHostRequest": {"host": Rule(cap=MAX_HOST_CHARS)},
    "SetHostPolicyRequest": {
        "host": Rule(cap=MAX_HOST_CHARS),
        "min_delay_s": Rule(hi=86_400),
        "concurrency": Rule(hi=1_000),
        "revisit": Rule(cap=16, token=True),
        "revisit_interval_s": Rule(hi=MAX_REVISIT_S),
        "revisit_min_s": Rule(hi=MAX_REVISIT_S),
        "revisit_max_s": Rule(hi=MAX_REVISIT_S),
        "revisit_share": Rule(lo=0, hi=1),
    },
    "RefetchRequest": {
        "url": Rule(cap=MAX_REFERENCE_CHARS),
        "at_ms": Rule(lo=0, hi=MAX_UNIX_MS),
    },
    "ReleaseLeasesRequest": {
        "worker_id": Rule(cap=MAX_ID_CHARS, printable=True),
        "reason": Rule(cap=64, token=True),
    },
    "ReconsiderRequest": {"reasons": Rule(cap=16)},
}

_T = FieldDescriptor
_TEXT, _BYTES, _MESSAGE = _T.TYPE_STRING, _T.TYPE_BYTES, _T.TYPE_MESSAGE
_REAL = frozenset({_T.TYPE_DOUBLE, _T.TYPE_FLOAT})


@dataclass(frozen=True, slots=True)
class _Check:
    """One field of one message, its rule and, for a message field, the plan of the nested message; `apply`
    checks a value of the field (raising Refused with no field path), made once per plan by _applier."""

    name: str
    type: int
    repeated: bool
    rule: Rule | None
    nested: tuple[_Check, ...] = ()
    apply: Callable[[Any], None] = field(default=lambda value: None, compare=False, repr=False)


def _plan(descriptor: Any) -> tuple[_Check, ...]:
    """The checks of a message: its ruled fields, and every message field whose type has rules somewhere."""
    rules = RULES.get(descriptor.name, {})
    out: list[_Check] = []
    for f in descriptor.fields:
        nested = _plan(f.message_type) if f.type == _MESSAGE else ()
        rule = rules.get(f.name)
        if rule is not None and rule.per_link:
            continue  # answered per link by the kernel, nothing to refuse here
        if rule is not None or nested:
            check = _Check(f.name, f.type, f.is_repeated, rule, nested)
            out.append(dataclasses.replace(check, apply=_applier(check)))
    return tuple(out)


def _applier(c: _Check) -> Callable[[Any], None]:
    """The check of one field's value as a closure over its rule: the common passing value returns after a test
    or two; anything else goes through the general functions, which raise what they always raised."""
    rule, nested = c.rule, c.nested
    if c.repeated:
        cap = rule.cap if rule is not None else None

        def repeated(value: Any) -> None:
            if cap is not None and len(value) > cap:
                raise _too_large(len(value), cap, "entries")
            if nested:
                _each(value, nested)

        return repeated
    if nested:
        return lambda value: _check(value, nested)
    if rule is None:
        return lambda value: None
    if c.type == _TEXT:
        text_rule, required = rule, rule.required
        plain = not (rule.token or rule.printable)
        cap_or_none = rule.cap

        def text(value: str) -> None:
            if not value:  # most text fields of a request are unset
                if required:
                    _text(value, text_rule)
                return
            if plain and (cap_or_none is None or len(value) <= cap_or_none):
                return
            _text(value, text_rule)

        return text
    if c.type == _BYTES:
        bytes_cap = rule.cap

        def blob(value: bytes) -> None:
            if bytes_cap is not None and len(value) > bytes_cap:
                raise _too_large(len(value), bytes_cap, "bytes")

        return blob
    number_rule, real, lo, hi = rule, c.type in _REAL, rule.lo, rule.hi

    def number(value: int | float) -> None:
        if (lo is None or value >= lo) and (hi is None or value <= hi) and (not real or math.isfinite(value)):
            return
        _number(value, number_rule, real=real)

    return number


_PLANS: Final[dict[str, tuple[_Check, ...]]] = {}


def check(request: Message) -> None:
    """Raise Refused when `request` breaks a rule of the table (the first one found, named by its path)."""
    name = request.DESCRIPTOR.name
    plan = _PLANS.get(name)
    if plan is None:
        plan = _PLANS[name] = _plan(request.DESCRIPTOR)
    try:
        _check(request, plan)
    except Refused as e:
        raise e.within(name) from None
    if isinstance(request, pb.CompleteBatchRequest):
        _batch_caps(request)


def check_batch(request: pb.CompleteBatchRequest) -> dict[int, Refused]:
    """Check a CompleteBatch completion by completion: the batch's own caps (how many completions, how many links in
    all) raise Refused for the whole call; a completion that breaks a rule of its own is only named in the answer
    (index -> why), so one hostile page an honest worker reports does not sink the completions sent with it."""
    if len(request.completions) > MAX_COMPLETIONS_PER_BATCH:
        raise _too_large(len(request.completions), MAX_COMPLETIONS_PER_BATCH, "entries").within(
            "CompleteBatchRequest.completions"
        )
    _batch_caps(request)
    _batch_fields(request)
    plan = _PLANS.get("CompleteRequest")
    if plan is None:
        plan = _PLANS["CompleteRequest"] = _plan(pb.CompleteRequest.DESCRIPTOR)
    refused: dict[int, Refused] = {}
    for i, completion in enumerate(request.completions):
        try:
            _check(completion, plan)
        except Refused as e:
            refused[i] = (
                Refused(e.code, f"[{i}]", e.detail).within_entry(e.field).within("CompleteBatchRequest.completions")
            )
    return refused


def _batch_fields(request: pb.CompleteBatchRequest) -> None:
    """The batch's own fields (the leases it asks for): a broken one refuses the whole call."""
    plan = _PLANS.get("CompleteBatchRequest/own")
    if plan is None:
        own = tuple(c for c in _plan(pb.CompleteBatchRequest.DESCRIPTOR) if c.name != "completions")
        plan = _PLANS["CompleteBatchRequest/own"] = own
    try:
        _check(request, plan)
    except Refused as e:
        raise e.within("CompleteBatchRequest") from None
    if request.lease_max_items and not request.worker_id:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "CompleteBatchRequest.worker_id", "required when lease_max_items > 0"
        )


def _batch_caps(request: pb.CompleteBatchRequest) -> None:
    total = sum(len(c.links) for c in request.completions)
    if total > MAX_LINKS_PER_COMPLETE:
        raise Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "CompleteBatchRequest.completions[*].links",
            f"{total:,} links in all, cap {MAX_LINKS_PER_COMPLETE:,}",
        )


def _check(msg: Any, plan: tuple[_Check, ...]) -> None:
    for c in plan:
        try:
            c.apply(getattr(msg, c.name))
        except Refused as e:
            raise e.within(c.name) from None


def _each(entries: Any, plan: tuple[_Check, ...]) -> None:
    """Check every entry of a repeated message field (the path names the entry only when one fails)."""
    for i, entry in enumerate(entries):
        try:
            _check(entry, plan)
        except Refused as e:
            raise Refused(e.code, f"[{i}]", e.detail).within_entry(e.field) from None


def _text(value: str, rule: Rule) -> None:
    if rule.cap is not None and len(value) > rule.cap:
        raise _too_large(len(value), rule.cap, "characters")
    if not value:
        if rule.required:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", "required, and empty")
        return
    if rule.token and _TOKEN.fullmatch(value) is None:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", "only letters, digits and _ . : % - are allowed in a token")
    if rule.printable and has_control(value):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", "control characters are not allowed")


def _number(value: int | float, rule: Rule, *, real: bool) -> None:  # not `float`: compiled, an int would become one
    if real and not math.isfinite(value):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", f"{value} is not a finite number")
    if value in rule.also:
        return
    lo, hi = rule.lo, rule.hi
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is None:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", f"{value} is above the maximum {_fmt(hi or 0)}")
        span = f"{_fmt(lo)}..{_fmt(hi) if hi is not None else '...'}"
        extra = "".join(f" or {_fmt(a)}" for a in rule.also)
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "", f"{value} is out of range {span}{extra}")


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def _too_large(size: int, cap: int, unit: str) -> Refused:
    return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "", f"{size:,} {unit}, cap {cap:,}")


def describe(message: str, field: str) -> str:
    """The rule of one field as its proto comment states it: [per link], [cap N], [max N], [range LO..HI] or ""."""
    rule = RULES.get(message, {}).get(field)
    if rule is None:
        return ""
    if rule.per_link:
        return "[per link]"
    if rule.cap is not None:
        return f"[cap {rule.cap:,}]"
    hi = _fmt(rule.hi) if rule.hi is not None else "..."
    if rule.lo is None:
        return f"[max {hi}]"
    return f"[range {_fmt(rule.lo)}..{hi}{''.join(f' or {_fmt(a)}' for a in rule.also)}]"
