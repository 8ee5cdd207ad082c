"""The named states of a frontier item and the explicit table of legal transitions."""

from __future__ import annotations

import enum

from mypy_extensions import mypyc_attr


class State(enum.StrEnum):
    """Where an item stands. Terminal states end an identity's life in this run (a later run may reconsider a
    policy refusal)."""

    DISCOVERED = "discovered"
    ADMITTED = "admitted"
    REJECTED = "rejected"
    SCHEDULED = "scheduled"
    LEASED = "leased"
    FETCHED = "fetched"
    RETRYABLE = "retryable"
    FAILED = "failed"
    SUPPRESSED = "suppressed"


class Event(enum.StrEnum):
    """What happened to an item; each event names one edge of the transition table."""

    ADMIT = "admit"
    REJECT = "reject"
    SCHEDULE = "schedule"
    LEASE = "lease"
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    EXPIRE = "expire"
    RESCHEDULE = "reschedule"
    SUPPRESS = "suppress"
    GIVE_UP = "give_up"
    REVISIT = "revisit"
    # A robots.txt answered with a redirect: the same item goes back to the queue of the target's host, so the
    # next hop is paced by that host's politeness (RFC 9309 asks crawlers to follow up to five hops).
    REDIRECT = "redirect"
    # A lease handed back unfinished (a worker stopping, or one that is gone): the item is scheduled again at
    # once, with no retry delay and no backoff of its host, since nothing is known about the URL.
    RELEASE = "release"
    # A refusal by a policy the operator can widen (network policy, scope) is looked at again under the policy
    # of a new run: the item is scheduled again (and refused again if the policy still says no).
    RECONSIDER = "reconsider"
    # Revisits: an operator asked for a fetched page to be fetched again at a given time (the line carries it),
    # and retention cleared the change history of a page retired from revisiting. Neither changes the state.
    REFETCH = "refetch"
    PRUNE = "prune"
    # An observation, not a move: a stale Complete kept as late evidence. Legal in every state, changes none.
    LATE_EVIDENCE = "late_evidence"


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.DISCOVERED, Event.ADMIT): State.ADMITTED,
    (State.DISCOVERED, Event.REJECT): State.REJECTED,
    (State.ADMITTED, Event.SCHEDULE): State.SCHEDULED,
    (State.SCHEDULED, Event.LEASE): State.LEASED,
    (State.SCHEDULED, Event.SUPPRESS): State.SUPPRESSED,
    (State.LEASED, Event.COMPLETE): State.FETCHED,
    (State.LEASED, Event.RETRY): State.RETRYABLE,
    (State.LEASED, Event.FAIL): State.FAILED,
    (State.LEASED, Event.EXPIRE): State.SCHEDULED,
    (State.LEASED, Event.REDIRECT): State.SCHEDULED,
    (State.LEASED, Event.RELEASE): State.SCHEDULED,
    (State.RETRYABLE, Event.RESCHEDULE): State.SCHEDULED,
    (State.RETRYABLE, Event.GIVE_UP): State.FAILED,
    (State.FETCHED, Event.REVISIT): State.SCHEDULED,
    (State.FAILED, Event.RECONSIDER): State.SCHEDULED,
    (State.SUPPRESSED, Event.RECONSIDER): State.SCHEDULED,
    (State.REJECTED, Event.RECONSIDER): State.SCHEDULED,
    (State.FETCHED, Event.REFETCH): State.FETCHED,
    (State.FAILED, Event.PRUNE): State.FAILED,
    (State.SUPPRESSED, Event.PRUNE): State.SUPPRESSED,
}

TERMINAL: frozenset[State] = frozenset({State.REJECTED, State.FETCHED, State.FAILED, State.SUPPRESSED})


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of a builtin exception
class IllegalTransition(RuntimeError):
    """An event that the transition table does not allow from the item's current state."""

    def __init__(self, state: State, event: Event, key: str = "") -> None:
        super().__init__(f"illegal transition: {event.value!r} from {state.value!r}" + (f" for {key}" if key else ""))
        self.state = state
        self.event = event
        self.key = key


def next_state(state: State, event: Event, key: str = "") -> State:
    """The state `event` leads to from `state`, or IllegalTransition."""
    if event is Event.LATE_EVIDENCE:
        return state
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event, key) from None
