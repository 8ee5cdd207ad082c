"""Limits on the wire, read from the source and checked against oracles: the caps table, its documentation in the
proto, the validation it drives, control-character escaping, and one message limit on every channel and server.
"""

from __future__ import annotations

import ast
import logging
import math
import re
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontier_node import validate
from frontier_node.wire import DecodeWarnings
from hostring.limits import MAX_MESSAGE_BYTES, grpc_options
from hostring.security import with_limits
from hostring.text import escape_control, escape_tree, has_control
from hostring.v1 import frontier_pb2 as pb
from tests.sources import parse_module

REPO = Path(__file__).resolve().parent.parent
PROTO = (REPO / "proto/hostring/v1/frontier.proto").read_text()
REQUESTS = [m for m in pb.DESCRIPTOR.message_types_by_name.values() if m.name.endswith("Request")]
INPUTS = [*REQUESTS, pb.Link.DESCRIPTOR, pb.Outcome.DESCRIPTOR]
# Numbers and flags that need no rule: any value of their type is meaningful.
FREE = {
    ("Link", "priority"), ("Link", "seed"), ("DiscoverRequest", "ring_epoch"), ("LeaseRequest", "ring_epoch"),
    ("Outcome", "simhash"), ("Outcome", "nofollow"), ("Outcome", "noindex"), ("ListHostsRequest", "only_with_work"),
    ("PauseHostRequest", "paused"), ("ReportRequest", "dispositions"), ("ReleaseLeasesRequest", "every_worker"),
    ("SetHostPolicyRequest", "whole_domain"), ("CompleteBatchRequest", "tag"),
}  # fmt: skip
_F = pb.Link.DESCRIPTOR.fields_by_name["observed"]
SIZED = {_F.TYPE_STRING, _F.TYPE_BYTES}


# ============================================================================================== the table


def _field_line(message: str, field: str) -> str:
    """A field's line in frontier.proto with the comment lines that continue it."""
    block = re.search(rf"^message {message} \{{(.*?)^\}}", PROTO, re.S | re.M)
    assert block is not None, f"message {message} not in frontier.proto"
    field_re = rf"^\s*(?:(?:repeated|optional)\s+)?\w+\s+{field}\s*=\s*\d+;.*(?:\n\s+//.*)*"
    line = re.search(field_re, block.group(1), re.M)
    assert line is not None, f"{message}.{field} not in frontier.proto"
    return line.group(0)


def test_every_string_list_and_number_of_a_request_has_a_rule() -> None:
    missing = []
    for msg in INPUTS:
        rules = validate.RULES.get(msg.name, {})
        for f in msg.fields:
            if f.type == f.TYPE_MESSAGE and not f.is_repeated:
                continue  # its own fields are checked (Outcome)
            if f.name not in rules and (msg.name, f.name) not in FREE:
                missing.append(f"{msg.name}.{f.name}")
            if (f.is_repeated or f.type in SIZED) and f.name in rules:
                rule = rules[f.name]
                assert rule.cap is not None or rule.per_link, f"{msg.name}.{f.name} has no cap"
    assert not missing, f"fields without a rule in frontier_node/validate.py: {missing}"


def test_proto_comments_state_the_rules_of_the_table() -> None:
    """Each rule is written next to its field in frontier.proto exactly as validate.describe() states it."""
    wrong = []
    for message, fields in validate.RULES.items():
        for field in fields:
            stated = validate.describe(message, field)
            if stated not in _field_line(message, field):
                wrong.append(f"{message}.{field}: the proto should say {stated}: {_field_line(message, field)}")
    assert not wrong, "\n".join(wrong)


def test_no_cap_lets_a_message_outgrow_the_limit_unnoticed() -> None:
    """Every sized cap is below the message limit (else the transport, not the rule, would answer)."""
    for message, fields in validate.RULES.items():
        for field, rule in fields.items():
            assert rule.cap is None or rule.cap < MAX_MESSAGE_BYTES, (message, field)


# ============================================================================================== validation


def _oracle(o: pb.Outcome) -> grpc.StatusCode:
    """What the node must answer for a CompleteRequest carrying outcome `o`, written out by hand: the first broken
    rule in field order decides."""
    invalid, too_large = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED
    checks = [
        (not (o.status == 0 or 100 <= o.status <= 999), invalid),
        (len(o.error_class) > 64, too_large),
        (bool(o.error_class) and not re.fullmatch(r"[A-Za-z0-9_.:%-]+", o.error_class), invalid),
        (len(o.error_detail) > 1024, too_large),
        (not (math.isfinite(o.retry_after_s) and -1 <= o.retry_after_s <= 1e9), invalid),
        (o.bytes > 2**40, invalid),
        (not (math.isfinite(o.response_s) and 0 <= o.response_s <= 86_400), invalid),
        (len(o.etag) > 8192, too_large),
    ]
    return next((code for broken, code in checks if broken), grpc.StatusCode.OK)


_reals = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-2, 100_000), st.sampled_from([-1.0, 0.0]))
_text = st.one_of(st.text(max_size=80), st.text(alphabet="abc_:.-", min_size=60, max_size=70), st.just(""))


@settings(max_examples=400, deadline=None)
@given(
    status=st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 99, 100, 599, 999, 1000])),
    error_class=_text,
    detail=st.sampled_from(["", "x" * 1024, "x" * 1025]),
    retry_after=_reals,
    response=_reals,
    size=st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([2**40, 2**40 + 1])),
    etag=st.sampled_from(["", '"abc"', "e" * 8193]),
)
def test_outcome_validation_agrees_with_the_oracle(
    status: int, error_class: str, detail: str, retry_after: float, response: float, size: int, etag: str
) -> None:
    o = pb.Outcome(status=status, error_class=error_class, error_detail=detail, retry_after_s=retry_after,
                   response_s=response, bytes=size, etag=etag)  # fmt: skip
    request = pb.CompleteRequest(lease_id="http://a.example/", outcome=o)
    try:
        validate.check(request)
        got = grpc.StatusCode.OK
    except validate.Refused as e:
        got = e.code
        assert e.reason.startswith("CompleteRequest.outcome."), e.reason
    assert got == _oracle(o)


def test_refusals_name_the_field_and_the_cap() -> None:
    cases = [
        (pb.DiscoverRequest(links=[pb.Link()] * 10_001), "DiscoverRequest.links: 10,001 entries, cap 10,000"),
        (
            pb.CompleteBatchRequest(completions=[pb.CompleteRequest(lease_id="k"), pb.CompleteRequest(lease_id="")]),
            "CompleteBatchRequest.completions[1].lease_id: required, and empty",
        ),
        (
            pb.DiscoverRequest(links=[pb.Link(), pb.Link(source_key="k\x1b[0m")]),
            "DiscoverRequest.links[1].source_key: control characters are not allowed",
        ),
        (pb.LeaseRequest(worker_id="w", wait_ms=30_001), "LeaseRequest.wait_ms: 30001 is above the maximum 30,000"),
        (
            pb.RenewRequest(lease_id="k", generation=2**53),
            "RenewRequest.generation: 9007199254740992 is above the maximum",
        ),
        (pb.ListHostsRequest(limit=1001), "ListHostsRequest.limit: 1001 is above the maximum 1,000"),
        (
            pb.SetHostPolicyRequest(host="h", min_delay_s=math.inf),
            "SetHostPolicyRequest.min_delay_s: inf is not a finite number",
        ),
    ]
    for request, reason in cases:
        with pytest.raises(validate.Refused) as refused:
            validate.check(request)
        assert refused.value.reason.startswith(reason), refused.value.reason
    links = [pb.Link(observed=f"http://a.example/{i}") for i in range(10_000)]
    validate.check(pb.CompleteBatchRequest(completions=[pb.CompleteRequest(lease_id="k", links=links)] * 20))
    with pytest.raises(validate.Refused, match=r"completions\[\*\]\.links: 210,000 links in all, cap 200,000"):
        validate.check(pb.CompleteBatchRequest(completions=[pb.CompleteRequest(lease_id="k", links=links)] * 21))
    # An over-long reference is the kernel's to answer per link (too_long), not a reason to refuse the call.
    validate.check(pb.DiscoverRequest(links=[pb.Link(observed="http://a.example/" + "x" * 100_000)]))


# ============================================================================================== escaping

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@given(st.text())
def test_escaped_text_holds_no_control_character_and_printable_text_is_unchanged(text: str) -> None:
    out = escape_control(text)
    assert CONTROL.search(out) is None
    assert has_control(text) == (CONTROL.search(text) is not None)
    if CONTROL.search(text) is None:
        assert out == text
    assert CONTROL.sub("", text) == CONTROL.sub("", out) or "\\" in out


def test_escape_tree_escapes_keys_and_values() -> None:
    tree = {"a\x1b[31m": ["x\ry", {"k": "\u202egnp.exe"}], "n": 3}
    assert escape_tree(tree) == {"a\\x1b[31m": ["x\\x0dy", {"k": "\\u202egnp.exe"}], "n": 3}


# ============================================================================================== one message limit

CREATORS = {"insecure_channel", "secure_channel", "server"}


def test_every_grpc_channel_and_server_carries_the_message_limit() -> None:
    """Every place our packages create a gRPC channel or server passes options built from hostring.limits (or goes
    through hostring.security, which always adds them)."""
    bare = []
    for package in ("hostring", "frontier_node", "fetch_worker", "coordinator", "hostring_cli", "hostring_testing",
                    "bench"):  # fmt: skip
        for path in sorted((REPO / package).rglob("*.py")):
            if "v1" in path.parts:
                continue  # generated stubs create nothing
            source = path.read_text()
            tree = parse_module(source, str(path))
            for func in ast.walk(tree):
                if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                    continue
                body = ast.get_source_segment(source, func) if not isinstance(func, ast.Module) else source
                for call in ast.walk(func):
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                        continue
                    owner = ast.unparse(call.func.value)
                    if call.func.attr in CREATORS and owner in ("grpc", "grpc.aio"):
                        limited = any(k in (body or "") for k in ("grpc_options(", "with_limits(", "SERVER_OPTIONS"))
                        if not limited:
                            bare.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert not bare, f"gRPC channels or servers without hostring.limits.grpc_options(): {bare}"


def test_with_limits_overrides_other_message_limits() -> None:
    options = with_limits([("grpc.max_receive_message_length", 1 << 30), ("grpc.keepalive_time_ms", 10)])
    assert options == [*grpc_options(), ("grpc.keepalive_time_ms", 10)]


# ============================================================================================== decode warnings


def test_undecodable_requests_warn_once_per_method_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warnings = DecodeWarnings(every_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="hostring.node"):
        for t in (0.0, 1.0, 2.0, 30.0):
            now[0] = t
            warnings.note("Discover")
        warnings.note("Complete")
        now[0] = 61.0
        warnings.note("Discover")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "1 undecodable Discover request(s) answered INVALID_ARGUMENT",
        "1 undecodable Complete request(s) answered INVALID_ARGUMENT",
        "4 undecodable Discover request(s) answered INVALID_ARGUMENT since the last such line",
    ]


def test_completion_batches_are_split_within_the_nodes_caps() -> None:
    """The worker's CompletionBatcher never sends a CompleteBatch the node would refuse for its size."""
    from hostring.client import _within_limits

    def entry(links: int) -> tuple[pb.CompleteRequest, object]:
        link = pb.Link(observed="http://a.example/x")
        return pb.CompleteRequest(lease_id="http://a.example/", links=[link] * links), None

    parts = _within_limits([entry(0) for _ in range(2_500)])  # type: ignore[misc]
    assert [len(p) for p in parts] == [1_000, 1_000, 500]
    parts = _within_limits([entry(120_000), entry(120_000), entry(10)])  # type: ignore[misc]
    assert [len(p) for p in parts] == [1, 2]
    for part in parts:
        validate.check(pb.CompleteBatchRequest(completions=[r for r, _ in part]))
