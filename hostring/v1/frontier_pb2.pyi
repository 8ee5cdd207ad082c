from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    ADMITTED: _ClassVar[Verdict]
    DUPLICATE: _ClassVar[Verdict]
    REJECTED: _ClassVar[Verdict]
    WRONG_OWNER: _ClassVar[Verdict]
    SUPPRESSED: _ClassVar[Verdict]

class ItemKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ITEM_KIND_UNSPECIFIED: _ClassVar[ItemKind]
    PAGE: _ClassVar[ItemKind]
    ROBOTS: _ClassVar[ItemKind]
VERDICT_UNSPECIFIED: Verdict
ADMITTED: Verdict
DUPLICATE: Verdict
REJECTED: Verdict
WRONG_OWNER: Verdict
SUPPRESSED: Verdict
ITEM_KIND_UNSPECIFIED: ItemKind
PAGE: ItemKind
ROBOTS: ItemKind

class Link(_message.Message):
    __slots__ = ("observed", "base_url", "source_key", "depth", "priority", "redirect_hops", "seed", "payload")
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_KEY_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_HOPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    observed: str
    base_url: str
    source_key: str
    depth: int
    priority: int
    redirect_hops: int
    seed: bool
    payload: bytes
    def __init__(self, observed: _Optional[str] = ..., base_url: _Optional[str] = ..., source_key: _Optional[str] = ..., depth: _Optional[int] = ..., priority: _Optional[int] = ..., redirect_hops: _Optional[int] = ..., seed: _Optional[bool] = ..., payload: _Optional[bytes] = ...) -> None: ...

class DiscoverRequest(_message.Message):
    __slots__ = ("links", "ring_epoch", "worker_id")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    ring_epoch: int
    worker_id: str
    def __init__(self, links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., ring_epoch: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class LinkVerdict(_message.Message):
    __slots__ = ("verdict", "reason", "fetch_key", "domain")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FETCH_KEY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    reason: str
    fetch_key: str
    domain: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., reason: _Optional[str] = ..., fetch_key: _Optional[str] = ..., domain: _Optional[str] = ...) -> None: ...

class DiscoverResponse(_message.Message):
    __slots__ = ("verdicts", "ring_epoch")
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[LinkVerdict]
    ring_epoch: int
    def __init__(self, verdicts: _Optional[_Iterable[_Union[LinkVerdict, _Mapping]]] = ..., ring_epoch: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("worker_id", "max_items", "wait_ms", "ring_epoch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    max_items: int
    wait_ms: int
    ring_epoch: int
    def __init__(self, worker_id: _Optional[str] = ..., max_items: _Optional[int] = ..., wait_ms: _Optional[int] = ..., ring_epoch: _Optional[int] = ...) -> None: ...

class LeaseItem(_message.Message):
    __slots__ = ("lease_id", "generation", "deadline_ms", "fetch_key", "url", "kind", "etag", "last_modified", "depth", "attempt", "host", "redirect_hops", "domain", "payload", "revisit", "refers_to", "stored_digest", "stored_at_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    FETCH_KEY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_HOPS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REVISIT_FIELD_NUMBER: _ClassVar[int]
    REFERS_TO_FIELD_NUMBER: _ClassVar[int]
    STORED_DIGEST_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    generation: int
    deadline_ms: int
    fetch_key: str
    url: str
    kind: ItemKind
    etag: str
    last_modified: str
    depth: int
    attempt: int
    host: str
    redirect_hops: int
    domain: str
    payload: bytes
    revisit: bool
    refers_to: str
    stored_digest: str
    stored_at_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., generation: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., fetch_key: _Optional[str] = ..., url: _Optional[str] = ..., kind: _Optional[_Union[ItemKind, str]] = ..., etag: _Optional[str] = ..., last_modified: _Optional[str] = ..., depth: _Optional[int] = ..., attempt: _Optional[int] = ..., host: _Optional[str] = ..., redirect_hops: _Optional[int] = ..., domain: _Optional[str] = ..., payload: _Optional[bytes] = ..., revisit: _Optional[bool] = ..., refers_to: _Optional[str] = ..., stored_digest: _Optional[str] = ..., stored_at_ms: _Optional[int] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("items", "ring_epoch", "next_ready_ms", "drained")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_READY_MS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[LeaseItem]
    ring_epoch: int
    next_ready_ms: int
    drained: bool
    def __init__(self, items: _Optional[_Iterable[_Union[LeaseItem, _Mapping]]] = ..., ring_epoch: _Optional[int] = ..., next_ready_ms: _Optional[int] = ..., drained: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "generation", "extend_ms", "worker_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EXTEND_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    generation: int
    extend_ms: int
    worker_id: str
    def __init__(self, lease_id: _Optional[str] = ..., generation: _Optional[int] = ..., extend_ms: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("ok", "deadline_ms", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    deadline_ms: int
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., deadline_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("status", "error_class", "error_detail", "retry_after_s", "location", "content_type", "bytes", "response_s", "body_digest", "simhash", "evidence", "remote_ip", "etag", "last_modified", "robots_body", "nofollow", "noindex")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_DETAIL_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_S_FIELD_NUMBER: _ClassVar[int]
    BODY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIMHASH_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_IP_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    ROBOTS_BODY_FIELD_NUMBER: _ClassVar[int]
    NOFOLLOW_FIELD_NUMBER: _ClassVar[int]
    NOINDEX_FIELD_NUMBER: _ClassVar[int]
    status: int
    error_class: str
    error_detail: str
    retry_after_s: float
    location: str
    content_type: str
    bytes: int
    response_s: float
    body_digest: str
    simhash: int
    evidence: str
    remote_ip: str
    etag: str
    last_modified: str
    robots_body: bytes
    nofollow: bool
    noindex: bool
    def __init__(self, status: _Optional[int] = ..., error_class: _Optional[str] = ..., error_detail: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., location: _Optional[str] = ..., content_type: _Optional[str] = ..., bytes: _Optional[int] = ..., response_s: _Optional[float] = ..., body_digest: _Optional[str] = ..., simhash: _Optional[int] = ..., evidence: _Optional[str] = ..., remote_ip: _Optional[str] = ..., etag: _Optional[str] = ..., last_modified: _Optional[str] = ..., robots_body: _Optional[bytes] = ..., nofollow: _Optional[bool] = ..., noindex: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("lease_id", "generation", "outcome", "worker_id", "links")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    generation: int
    outcome: Outcome
    worker_id: str
    links: _containers.RepeatedCompositeFieldContainer[Link]
    def __init__(self, lease_id: _Optional[str] = ..., generation: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, _Mapping]] = ..., worker_id: _Optional[str] = ..., links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("accepted", "state", "follow_links", "reason", "forward", "admitted", "wrong_owner")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_LINKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    WRONG_OWNER_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    state: str
    follow_links: bool
    reason: str
    forward: _containers.RepeatedCompositeFieldContainer[Link]
    admitted: int
    wrong_owner: bool
    def __init__(self, accepted: _Optional[bool] = ..., state: _Optional[str] = ..., follow_links: _Optional[bool] = ..., reason: _Optional[str] = ..., forward: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., admitted: _Optional[int] = ..., wrong_owner: _Optional[bool] = ...) -> None: ...

class CompleteBatchRequest(_message.Message):
    __slots__ = ("completions", "worker_id", "lease_max_items", "lease_wait_ms", "tag")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[CompleteRequest]
    worker_id: str
    lease_max_items: int
    lease_wait_ms: int
    tag: int
    def __init__(self, completions: _Optional[_Iterable[_Union[CompleteRequest, _Mapping]]] = ..., worker_id: _Optional[str] = ..., lease_max_items: _Optional[int] = ..., lease_wait_ms: _Optional[int] = ..., tag: _Optional[int] = ...) -> None: ...

class CompleteBatchResponse(_message.Message):
    __slots__ = ("results", "leases", "tag")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CompleteResponse]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseItem]
    tag: int
    def __init__(self, results: _Optional[_Iterable[_Union[CompleteResponse, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[LeaseItem, _Mapping]]] = ..., tag: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("node_id", "ring_epoch", "urls_by_state", "hosts", "hosts_with_work", "hosts_ready", "in_flight", "queued", "seen", "discovered_by_verdict", "owned_domains", "run_id", "leases_granted", "leases_expired", "completes_stale", "fault", "next_ready_s", "waiting_for")
    class UrlsByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DiscoveredByVerdictEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    URLS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_WITH_WORK_FIELD_NUMBER: _ClassVar[int]
    HOSTS_READY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    DISCOVERED_BY_VERDICT_FIELD_NUMBER: _ClassVar[int]
    OWNED_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASES_GRANTED_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    COMPLETES_STALE_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    NEXT_READY_S_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    ring_epoch: int
    urls_by_state: _containers.ScalarMap[str, int]
    hosts: int
    hosts_with_work: int
    hosts_ready: int
    in_flight: int
    queued: int
    seen: int
    discovered_by_verdict: _containers.ScalarMap[str, int]
    owned_domains: int
    run_id: str
    leases_granted: int
    leases_expired: int
    completes_stale: int
    fault: str
    next_ready_s: float
    waiting_for: str
    def __init__(self, node_id: _Optional[str] = ..., ring_epoch: _Optional[int] = ..., urls_by_state: _Optional[_Mapping[str, int]] = ..., hosts: _Optional[int] = ..., hosts_with_work: _Optional[int] = ..., hosts_ready: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., seen: _Optional[int] = ..., discovered_by_verdict: _Optional[_Mapping[str, int]] = ..., owned_domains: _Optional[int] = ..., run_id: _Optional[str] = ..., leases_granted: _Optional[int] = ..., leases_expired: _Optional[int] = ..., completes_stale: _Optional[int] = ..., fault: _Optional[str] = ..., next_ready_s: _Optional[float] = ..., waiting_for: _Optional[str] = ...) -> None: ...

class GetHostRequest(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: str
    def __init__(self, host: _Optional[str] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ("limit", "only_with_work")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ONLY_WITH_WORK_FIELD_NUMBER: _ClassVar[int]
    limit: int
    only_with_work: bool
    def __init__(self, limit: _Optional[int] = ..., only_with_work: _Optional[bool] = ...) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ("host", "queued", "in_flight", "concurrency", "delay_s", "min_delay_s", "backoff", "next_eligible_s", "paused", "robots", "fetched", "errors", "domain", "revisit", "revisits_due")
    HOST_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    DELAY_S_FIELD_NUMBER: _ClassVar[int]
    MIN_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    NEXT_ELIGIBLE_S_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    ROBOTS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    REVISIT_FIELD_NUMBER: _ClassVar[int]
    REVISITS_DUE_FIELD_NUMBER: _ClassVar[int]
    host: str
    queued: int
    in_flight: int
    concurrency: int
    delay_s: float
    min_delay_s: float
    backoff: float
    next_eligible_s: float
    paused: bool
    robots: str
    fetched: int
    errors: int
    domain: str
    revisit: str
    revisits_due: int
    def __init__(self, host: _Optional[str] = ..., queued: _Optional[int] = ..., in_flight: _Optional[int] = ..., concurrency: _Optional[int] = ..., delay_s: _Optional[float] = ..., min_delay_s: _Optional[float] = ..., backoff: _Optional[float] = ..., next_eligible_s: _Optional[float] = ..., paused: _Optional[bool] = ..., robots: _Optional[str] = ..., fetched: _Optional[int] = ..., errors: _Optional[int] = ..., domain: _Optional[str] = ..., revisit: _Optional[str] = ..., revisits_due: _Optional[int] = ...) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts",)
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostInfo]
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostInfo, _Mapping]]] = ...) -> None: ...

class GetUrlRequest(_message.Message):
    __slots__ = ("url",)
    URL_FIELD_NUMBER: _ClassVar[int]
    url: str
    def __init__(self, url: _Optional[str] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ("seq", "run_id", "attempt", "generation", "from_state", "event", "to_state", "at", "policy_version", "reason", "evidence")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    run_id: str
    attempt: int
    generation: int
    from_state: str
    event: str
    to_state: str
    at: float
    policy_version: int
    reason: str
    evidence: str
    def __init__(self, seq: _Optional[int] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., generation: _Optional[int] = ..., from_state: _Optional[str] = ..., event: _Optional[str] = ..., to_state: _Optional[str] = ..., at: _Optional[float] = ..., policy_version: _Optional[int] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ...) -> None: ...

class UrlInfo(_message.Message):
    __slots__ = ("fetch_key", "url", "state", "reason", "attempt", "generation", "depth", "history", "history_omitted")
    FETCH_KEY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_OMITTED_FIELD_NUMBER: _ClassVar[int]
    fetch_key: str
    url: str
    state: str
    reason: str
    attempt: int
    generation: int
    depth: int
    history: _containers.RepeatedCompositeFieldContainer[Transition]
    history_omitted: int
    def __init__(self, fetch_key: _Optional[str] = ..., url: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ..., generation: _Optional[int] = ..., depth: _Optional[int] = ..., history: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ..., history_omitted: _Optional[int] = ...) -> None: ...

class PauseHostRequest(_message.Message):
    __slots__ = ("host", "paused")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    host: str
    paused: bool
    def __init__(self, host: _Optional[str] = ..., paused: _Optional[bool] = ...) -> None: ...

class SetHostPolicyRequest(_message.Message):
    __slots__ = ("host", "min_delay_s", "concurrency", "revisit", "revisit_interval_s", "revisit_min_s", "revisit_max_s", "revisit_share", "whole_domain")
    HOST_FIELD_NUMBER: _ClassVar[int]
    MIN_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    REVISIT_FIELD_NUMBER: _ClassVar[int]
    REVISIT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    REVISIT_MIN_S_FIELD_NUMBER: _ClassVar[int]
    REVISIT_MAX_S_FIELD_NUMBER: _ClassVar[int]
    REVISIT_SHARE_FIELD_NUMBER: _ClassVar[int]
    WHOLE_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    host: str
    min_delay_s: float
    concurrency: int
    revisit: str
    revisit_interval_s: float
    revisit_min_s: float
    revisit_max_s: float
    revisit_share: float
    whole_domain: bool
    def __init__(self, host: _Optional[str] = ..., min_delay_s: _Optional[float] = ..., concurrency: _Optional[int] = ..., revisit: _Optional[str] = ..., revisit_interval_s: _Optional[float] = ..., revisit_min_s: _Optional[float] = ..., revisit_max_s: _Optional[float] = ..., revisit_share: _Optional[float] = ..., whole_domain: _Optional[bool] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("dispositions",)
    DISPOSITIONS_FIELD_NUMBER: _ClassVar[int]
    dispositions: bool
    def __init__(self, dispositions: _Optional[bool] = ...) -> None: ...

class RefetchRequest(_message.Message):
    __slots__ = ("url", "at_ms")
    URL_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    url: str
    at_ms: int
    def __init__(self, url: _Optional[str] = ..., at_ms: _Optional[int] = ...) -> None: ...

class RefetchResponse(_message.Message):
    __slots__ = ("fetch_key", "state", "due_ms")
    FETCH_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DUE_MS_FIELD_NUMBER: _ClassVar[int]
    fetch_key: str
    state: str
    due_ms: int
    def __init__(self, fetch_key: _Optional[str] = ..., state: _Optional[str] = ..., due_ms: _Optional[int] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class ReportChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ReleaseLeasesRequest(_message.Message):
    __slots__ = ("worker_id", "every_worker", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EVERY_WORKER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    every_worker: bool
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., every_worker: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseLeasesResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ReconsiderRequest(_message.Message):
    __slots__ = ("reasons",)
    REASONS_FIELD_NUMBER: _ClassVar[int]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class ReconsiderResponse(_message.Message):
    __slots__ = ("rescheduled", "by_reason")
    class ByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RESCHEDULED_FIELD_NUMBER: _ClassVar[int]
    BY_REASON_FIELD_NUMBER: _ClassVar[int]
    rescheduled: int
    by_reason: _containers.ScalarMap[str, int]
    def __init__(self, rescheduled: _Optional[int] = ..., by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...
