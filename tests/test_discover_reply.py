"""A Discover reply carries each link's verdict, reason, fetch key and domain in request order; a fenced domain's
links answer WRONG_OWNER whatever the core said."""

from __future__ import annotations

from frontier_node.core.records import LinkVerdict, Verdict
from frontier_node.service import _discover_response
from hostring.limits import MAX_MESSAGE_BYTES
from hostring.v1 import frontier_pb2 as pb

VERDICTS = [
    LinkVerdict(Verdict.ADMITTED, "", "http://a.example/1", "a.example"),
    LinkVerdict(Verdict.DUPLICATE, "", "http://a.example/1", "a.example"),
    LinkVerdict(Verdict.REJECTED, "bad_scheme", "", ""),
    LinkVerdict(Verdict.SUPPRESSED, "pages_per_host", "http://b.example/2", "b.example"),
    LinkVerdict(Verdict.ADMITTED, "", "http://c.example/3", "c.example"),
]


def test_every_verdict_is_answered_in_order_with_its_fields() -> None:
    resp = _discover_response(VERDICTS, set(), 7)
    assert resp.ring_epoch == 7
    got = [(v.verdict, v.reason, v.fetch_key, v.domain) for v in resp.verdicts]
    assert got == [(int(v.verdict), v.reason, v.fetch_key, v.domain) for v in VERDICTS]


def test_a_fenced_domains_links_answer_wrong_owner() -> None:
    resp = _discover_response(VERDICTS, {"b.example", "c.example"}, 3)
    got = [(v.verdict, v.reason, v.fetch_key, v.domain) for v in resp.verdicts]
    assert got[:3] == [(int(v.verdict), v.reason, v.fetch_key, v.domain) for v in VERDICTS[:3]]
    assert got[3:] == [
        (pb.WRONG_OWNER, "wrong_owner", "http://b.example/2", "b.example"),
        (pb.WRONG_OWNER, "wrong_owner", "http://c.example/3", "c.example"),
    ]


def test_a_reply_over_the_message_limit_drops_the_keys_and_keeps_the_rest() -> None:
    key = "http://a.example/" + "x" * 8_000
    many = [LinkVerdict(Verdict.DUPLICATE, "", key, "a.example")] * (MAX_MESSAGE_BYTES // 8_000 + 10)
    resp = _discover_response(many, set(), 1)
    assert resp.ByteSize() <= MAX_MESSAGE_BYTES
    assert len(resp.verdicts) == len(many)
    assert all(v.verdict == pb.DUPLICATE and v.fetch_key == "" and v.domain == "a.example" for v in resp.verdicts)
