"""The gRPC shell around the core: translate messages, hold the lock, flush the store before answering."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from frontier_node.core.frontier import Frontier, LeaseError
from frontier_node.core.ports import Fenced
from frontier_node.core.records import Item, Kind
from frontier_node.core.revisit import describe
from frontier_node.core.views import HostView
from frontier_node.metrics import StoreTimer
from frontier_node.report import coverage_report
from hostring.urls import UrlRejected, domain_of, identify
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc

log = logging.getLogger("hostring.node")

_MAX_LEASE_ITEMS = 1000
_MAX_WAIT_S = 30.0


class FrontierService(pb_grpc.FrontierServicer):
    """Serves one Frontier. Every call takes the one lock: the core is a plain single-threaded object."""

    def __init__(
        self,
        frontier: Frontier,
        *,
        node_id: str = "node-0",
        epoch: Callable[[], int] = lambda: 0,
        lock: threading.Condition | None = None,
    ) -> None:
        self.frontier = frontier
        self.node_id = node_id
        self.epoch = epoch
        self.cond = lock or threading.Condition()
        self.store_timer: StoreTimer | None = None
        self.on_fenced: Callable[[set[str]], None] = lambda domains: None
        self.waiting = 0

    def _commit(self) -> set[str]:
        """Make the call's writes durable before answering; the domains whose writes a newer owner refused.

        The other domains' writes have landed (each domain is written atomically on its own), so the caller
        answers per link or per lease: what fell in a refused domain goes back as wrong-owner or forward.
        The node lets go of those domains at once, before its ring catches up with the new owner's.
        """
        try:
            if self.store_timer is None:
                self.frontier.store.flush()
            else:
                with self.store_timer:
                    self.frontier.store.flush()
        except Fenced as e:
            fenced = {e.domain, *(o.domain for o in e.others)}
            log.warning("writes for %d domain(s) refused by a newer owner: %s", len(fenced), sorted(fenced)[:5])
            self.on_fenced(fenced)
            return fenced
        return set()

    # ------------------------------------------------------------------ hot path

    def Discover(self, request: pb.DiscoverRequest, context: grpc.ServicerContext) -> pb.DiscoverResponse:
        with self.cond:
            verdicts = self.frontier.discover(request.links)
            fenced = self._commit()
            self._wake_leases()
        resp = pb.DiscoverResponse(ring_epoch=self.epoch())
        add = resp.verdicts.add
        for v in verdicts:
            if fenced and v.domain in fenced:
                add(verdict=pb.WRONG_OWNER, reason="wrong_owner", fetch_key=v.fetch_key, domain=v.domain)
            else:
                add(verdict=int(v.verdict), reason=v.reason, fetch_key=v.fetch_key, domain=v.domain)
        return resp

    def Lease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseResponse:
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id is required")
        want = min(max(request.max_items, 1), _MAX_LEASE_ITEMS)
        give_up_at = time.monotonic() + min(request.wait_ms / 1000.0, _MAX_WAIT_S)
        with self.cond:
            while True:
                items = self.frontier.lease(request.worker_id, want)
                if items:
                    fenced = self._commit()
                    items = [it for it in items if it.domain not in fenced] if fenced else items
                    break
                remaining = give_up_at - time.monotonic()
                if remaining <= 0 or self.frontier.drained or not context.is_active():
                    break
                nxt = self.frontier.next_event_in()
                self.waiting += 1
                try:
                    self.cond.wait(min(remaining, nxt if nxt is not None else remaining, 1.0) + 0.001)
                finally:
                    self.waiting -= 1
            nxt = self.frontier.next_event_in()
            drained = self.frontier.drained
        resp = pb.LeaseResponse(
            ring_epoch=self.epoch(), drained=drained, next_ready_ms=int(nxt * 1000) if nxt is not None else 0
        )
        for item in items:
            resp.items.append(_lease_item(item))
        return resp

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> pb.RenewResponse:
        with self.cond:
            try:
                deadline = self.frontier.renew(request.lease_id, request.generation, request.extend_ms / 1000.0)
            except LeaseError as e:
                return pb.RenewResponse(ok=False, reason=e.reason)
        return pb.RenewResponse(ok=True, deadline_ms=int(deadline * 1000))

    def Complete(self, request: pb.CompleteRequest, context: grpc.ServicerContext) -> pb.CompleteResponse:
        with self.cond:
            resp, domain = self._complete_one(request, context)
            if not resp.wrong_owner:
                self._settle([(request, resp, domain)], self._commit())
            self._wake_leases()
        if resp.wrong_owner:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"wrong_owner: this node does not own the domain of {request.lease_id!r} at epoch {self.epoch()}",
            )
        return resp

    def CompleteBatch(
        self, request: pb.CompleteBatchRequest, context: grpc.ServicerContext
    ) -> pb.CompleteBatchResponse:
        with self.cond:
            done = [(c, *self._complete_one(c, context)) for c in request.completions]
            self._settle(done, self._commit())
            self._wake_leases()
        return pb.CompleteBatchResponse(results=[resp for _, resp, _ in done])

    def _complete_one(
        self, request: pb.CompleteRequest, context: grpc.ServicerContext
    ) -> tuple[pb.CompleteResponse, str]:
        """Settle one lease (the lock is held); a domain this node does not own answers wrong_owner."""
        if not request.lease_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lease_id is required")
        domain = self.frontier.leased_domain(request.lease_id)
        if domain is None:
            domain = domain_of(request.lease_id)
        if not self.frontier.owns(domain):
            return pb.CompleteResponse(accepted=False, wrong_owner=True, reason="wrong_owner"), domain
        done = self.frontier.complete(request.lease_id, request.generation, request.outcome, request.links)
        resp = pb.CompleteResponse(
            accepted=done.accepted,
            state=done.state,
            follow_links=done.follow_links,
            reason=done.reason,
            admitted=done.admitted,
            forward=[link for link in done.forward if isinstance(link, pb.Link)],
        )
        return resp, domain

    def _settle(self, done: list[tuple[pb.CompleteRequest, pb.CompleteResponse, str]], fenced: set[str]) -> None:
        """After a partly refused commit: a lease in a refused domain answers wrong-owner (its new owner still
        holds it leased and settles the re-sent Complete); links that fell in refused domains go back as forward.
        """
        if not fenced:
            return
        for request, resp, domain in done:
            if resp.wrong_owner:
                continue
            if domain in fenced:
                resp.Clear()
                resp.wrong_owner, resp.reason = True, "wrong_owner"
            elif resp.follow_links:
                resp.forward.extend(link for link in request.links if domain_of(link.observed, link.base_url) in fenced)

    def _wake_leases(self) -> None:
        """Wake Lease calls waiting for work, if any wait (notify_all on every call is measurable)."""
        if self.waiting:
            self.cond.notify_all()

    # ------------------------------------------------------------------ inspection

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        with self.cond:
            s = self.frontier.stats()
        return pb.StatsResponse(
            node_id=self.node_id,
            ring_epoch=self.epoch(),
            run_id=s.run_id,
            urls_by_state={state: n for state, n in s.urls_by_state.items() if n},
            hosts=s.hosts,
            hosts_with_work=s.hosts_with_work,
            hosts_ready=s.hosts_ready,
            in_flight=s.in_flight,
            queued=s.queued,
            seen=s.seen,
            discovered_by_verdict=s.discovered_by_verdict,
            owned_domains=s.owned_domains,
            leases_granted=s.leases_granted,
            leases_expired=s.leases_expired,
            completes_stale=s.completes_stale,
        )

    def GetHost(self, request: pb.GetHostRequest, context: grpc.ServicerContext) -> pb.HostInfo:
        with self.cond:
            host = self.frontier.host(request.host)
        if host is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such host on this node: {request.host!r}")
        return _host_info(host)

    def ListHosts(self, request: pb.ListHostsRequest, context: grpc.ServicerContext) -> pb.ListHostsResponse:
        limit = request.limit or 100
        with self.cond:
            hosts = self.frontier.hosts(only_with_work=request.only_with_work, limit=limit)
        return pb.ListHostsResponse(hosts=[_host_info(h) for h in hosts])

    def GetUrl(self, request: pb.GetUrlRequest, context: grpc.ServicerContext) -> pb.UrlInfo:
        key = request.url
        with contextlib.suppress(UrlRejected):
            key = identify(request.url).fetch_key
        with self.cond:
            row = self.frontier.store.get(key)
            if row is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no such URL or fetch key on this node: {request.url!r}")
            history = self.frontier.store.history(key)
        info = pb.UrlInfo(
            fetch_key=row.key,
            url=row.url,
            state=row.state.value,
            reason=row.reason,
            attempt=row.attempt,
            generation=row.generation,
            depth=row.depth,
        )
        for e in history:
            info.history.add(
                seq=e.seq,
                run_id=e.run_id,
                attempt=e.attempt,
                generation=e.generation,
                from_state=e.from_state,
                event=e.event,
                to_state=e.to_state,
                at=e.at,
                policy_version=e.policy_version,
                reason=e.reason,
                evidence=e.evidence,
            )
        return info

    def PauseHost(self, request: pb.PauseHostRequest, context: grpc.ServicerContext) -> pb.HostInfo:
        with self.cond:
            try:
                host = self.frontier.pause(request.host, request.paused)
            except KeyError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e.args[0]))
            self.cond.notify_all()
        return _host_info(host)

    def SetHostPolicy(self, request: pb.SetHostPolicyRequest, context: grpc.ServicerContext) -> pb.HostInfo:
        if request.whole_domain or _revisit_fields(request):
            return self._set_revisit_policy(request, context)
        with self.cond:
            try:
                host = self.frontier.set_policy(
                    request.host,
                    min_delay_s=request.min_delay_s if request.min_delay_s >= 0 else None,
                    concurrency=request.concurrency if request.concurrency > 0 else None,
                )
            except KeyError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e.args[0]))
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            self.cond.notify_all()
        return _host_info(host)

    def _set_revisit_policy(self, request: pb.SetHostPolicyRequest, context: grpc.ServicerContext) -> pb.HostInfo:
        """Revisit overrides (and any politeness fields given with them) for a host or a whole domain."""
        fields = _revisit_fields(request)
        with self.cond:
            try:
                config = self.frontier.set_revisit_policy(request.host, domain=request.whole_domain, **fields)
                host = None
                if not request.whole_domain and (request.min_delay_s >= 0 or request.concurrency > 0):
                    host = self.frontier.set_policy(
                        request.host,
                        min_delay_s=request.min_delay_s if request.min_delay_s >= 0 else None,
                        concurrency=request.concurrency if request.concurrency > 0 else None,
                    )
                host = host or (None if request.whole_domain else self.frontier.host(request.host))
                self._commit()
            except KeyError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e.args[0]))
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            self.cond.notify_all()
        if host is None:
            return pb.HostInfo(host=request.host, domain=request.host, revisit=describe(config))
        return _host_info(host)

    def Refetch(self, request: pb.RefetchRequest, context: grpc.ServicerContext) -> pb.RefetchResponse:
        if not request.url:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "url is required")
        with self.cond:
            at = request.at_ms / 1000.0 if request.at_ms > 0 else self.frontier.clock.now()
            try:
                key, state, due = self.frontier.refetch(request.url, at)
            except KeyError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e.args[0]))
            except ValueError as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            self._commit()
            self.cond.notify_all()
        return pb.RefetchResponse(fetch_key=key, state=state, due_ms=int(due * 1000))

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        with self.cond:
            report = coverage_report(self.frontier.coverage_input(), dispositions=request.dispositions)
        return pb.ReportResponse(json=json.dumps(report, sort_keys=True))


def _host_info(host: HostView) -> pb.HostInfo:
    return pb.HostInfo(
        host=host.name,
        domain=host.domain,
        queued=host.queued,
        in_flight=host.in_flight,
        concurrency=host.concurrency,
        delay_s=host.delay_s,
        min_delay_s=host.min_delay_s,
        backoff=host.backoff,
        next_eligible_s=host.next_eligible_s,
        paused=host.paused,
        robots="; ".join(f"{origin}: {text}" for origin, text in host.robots),
        fetched=host.fetched,
        errors=host.errors,
        revisit=host.revisit,
        revisits_due=host.revisits_due,
    )


def _revisit_fields(request: pb.SetHostPolicyRequest) -> dict[str, Any]:
    """The revisit overrides a SetHostPolicy request sets (unset and non-positive fields leave values as is)."""
    given: dict[str, Any] = {
        "policy": request.revisit or None,
        "interval_s": request.revisit_interval_s if request.revisit_interval_s > 0 else None,
        "min_s": request.revisit_min_s if request.revisit_min_s > 0 else None,
        "max_s": request.revisit_max_s if request.revisit_max_s > 0 else None,
        "share": request.revisit_share if request.HasField("revisit_share") else None,
    }
    return {k: v for k, v in given.items() if v is not None}


def _lease_item(item: Item) -> pb.LeaseItem:
    return pb.LeaseItem(
        lease_id=item.key,
        generation=item.generation,
        deadline_ms=int(item.deadline * 1000),
        fetch_key=item.key,
        url=item.url,
        kind=pb.ROBOTS if item.kind is Kind.ROBOTS else pb.PAGE,
        etag=item.etag,
        last_modified=item.last_modified,
        depth=item.depth,
        attempt=item.attempt,
        host=item.host,
        redirect_hops=item.redirect_hops,
        domain=item.domain,
        revisit=item.checked_at > 0,
        refers_to=item.evidence if item.checked_at > 0 else "",
        stored_digest=item.digest if item.checked_at > 0 else "",
        stored_at_ms=int(item.stored_at * 1000),
    )
