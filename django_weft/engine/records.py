"""Plain records exchanged between the engine and its store."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    CONTINUED = "continued"


TERMINAL_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT, RunStatus.CONTINUED}
)
ACTIVE_STATUSES = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.SUSPENDED})


class StepKind(enum.StrEnum):
    ACTIVITY = "activity"
    SLEEP = "sleep"
    SIDE_EFFECT = "side_effect"
    PATCH = "patch"
    WAIT = "wait"  # the recorded choice of ctx.wait_any
    SIGNAL = "signal"  # ctx.wait_signal: the signal it consumed, or its timeout
    CONDITION = "condition"  # ctx.wait_condition: satisfied or timed out
    HANDLER = "handler"  # a signal or update handler applied while the body was blocked
    CHILD = "child"  # a child workflow: started, then its outcome
    SEARCH_ATTRIBUTES = "search_attrs"  # ctx.set_search_attributes (Step.kind holds 16 characters)
    CANCEL_REQUEST = "cancel_request"  # a cancellation request delivered while the body was blocked


class StepStatus(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING = "waiting"  # a blocking operation has started and not finished (sleep)
    RETRYING = "retrying"  # an activity attempt failed; the next attempt waits for a timer
    SCHEDULED = "scheduled"  # a queued activity attempt was sent to a worker queue
    STARTED = "started"  # a worker runs the queued attempt (its lease is the activity timer)
    ATTEMPT_FAILED = "attempt_failed"  # a queued attempt failed; the workflow decides on a retry
    LOST = "lost"  # a queued attempt never started or its worker stopped heartbeating
    DELAYED = "delayed"  # flow control holds the attempt (a rate limit, a concurrency slot)


PENDING_STEP_STATUSES = frozenset(
    {StepStatus.SCHEDULED, StepStatus.STARTED, StepStatus.RETRYING, StepStatus.DELAYED}
)
"""A queued activity in one of these states has not finished and needs nothing from its
run (a ``delayed`` one until its hold is over: :func:`~.flow.hold_is_due`)."""


class TimerKind(enum.StrEnum):
    SLEEP = "sleep"
    SIGNAL_TIMEOUT = "signal_timeout"
    RETRY = "retry"
    DEADLINE = "deadline"
    DELAYED_START = "delayed_start"
    SCHEDULE = "schedule"
    ACTIVITY = "activity"  # a queued attempt's deadline: to start, then to heartbeat
    FINALIZER = "finalizer"  # the finalizer is due (or its attempt's lease)


class FailureCategory(enum.StrEnum):
    APPLICATION = "application"  # the workflow function raised
    ACTIVITY = "activity"  # an activity failed for good and the workflow did not catch it
    NONDETERMINISM = "nondeterminism"
    SYSTEM = "system"  # the engine could not run the workflow (unregistered, bad result...)
    CANCELLATION = "cancellation"  # cancelled (handle.cancel, a parent's close policy)
    TIMEOUT = "timeout"  # passed its execution timeout


RUN_LEVEL_SEQ = -1
"""``Timer.seq`` of timers that belong to the run rather than to a step."""

FINALIZER_SEQ = -2
"""``Timer.seq`` of a run's finalizer, and the position its attempts are dispatched with."""


@dataclass(frozen=True)
class StepRecord:
    """A recorded operation, as the engine sees it."""

    seq: int
    kind: str
    name: str
    status: str
    args_json: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    attempt: int = 1
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failed_attempts: tuple[dict[str, Any], ...] = ()
    """The attempts of this activity that failed and were retried, oldest first: each
    ``{"attempt", "error", "started_at", "finished_at"}`` (see :func:`failed_attempt`)."""


@dataclass(frozen=True)
class StepWrite:
    """A step row to insert or replace, already encoded."""

    seq: int
    kind: str
    name: str
    status: str
    args_json: str | None
    result_json: str | None
    error_json: str | None
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    failed_attempts_json: str | None = None
    """:attr:`StepRecord.failed_attempts`, encoded; ``None`` for none."""


def failed_attempt(
    attempt: int, error: dict[str, Any], started_at: datetime | None, finished_at: datetime | None
) -> dict[str, Any]:
    """One entry of :attr:`StepRecord.failed_attempts`: an attempt that failed and was
    retried, kept so its error stays readable after a later attempt succeeds."""
    return {
        "attempt": attempt,
        "error": error,
        "started_at": started_at.isoformat() if started_at is not None else None,
        "finished_at": finished_at.isoformat() if finished_at is not None else None,
    }


@dataclass(frozen=True)
class TimerWrite:
    seq: int
    kind: str
    fire_at: datetime


@dataclass(frozen=True)
class CancelRequest:
    """A cancellation request (``handle.cancel(mode="request")``, a parent's
    ``request_cancel`` close policy), as stored on the run: pending until the workflow
    reaches a blocking point, then delivered at a recorded position (``seq``)."""

    requested_at: str
    """When it was made (ISO 8601, the database clock)."""
    reason: str | None = None
    seq: int | None = None
    """The position where the workflow received it; ``None`` while it is pending."""
    from_parent: bool = False
    """Sent by a parent's ``request_cancel`` close policy (then the sweep does not send it again)."""

    @property
    def pending(self) -> bool:
        return self.seq is None

    @classmethod
    def of(cls, stored: Any) -> CancelRequest | None:
        """The request stored on a run (``WorkflowRun.cancel_request``), or ``None``."""
        if not isinstance(stored, dict) or not stored.get("requested_at"):
            return None
        seq = stored.get("seq")
        reason = stored.get("reason")
        return cls(
            requested_at=str(stored["requested_at"]),
            reason=reason if isinstance(reason, str) else None,
            seq=seq if isinstance(seq, int) else None,
            from_parent=bool(stored.get("from_parent")),
        )

    def as_json(self) -> dict[str, Any]:
        stored: dict[str, Any] = {"requested_at": self.requested_at, "reason": self.reason, "seq": self.seq}
        if self.from_parent:
            stored["from_parent"] = True
        return stored


@dataclass(frozen=True)
class ClaimedRun:
    """What a successful claim hands the engine: the run, its epoch and its history."""

    run_id: str
    workflow_id: str
    workflow_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    epoch: int
    attempt: int
    created_at: datetime
    db_now: datetime
    steps: dict[int, StepRecord] = field(default_factory=dict)
    parent_run_id: str | None = None
    search_attributes: dict[str, Any] = field(default_factory=dict)
    """As stored when the run was claimed; the engine reads only the ``weft_`` ones set
    at start (a scheduled run's schedule id and time). ``ctx.set_search_attributes``
    writes through the store and does not change this copy."""
    cancel_request: CancelRequest | None = None
    """The run's cancellation request if one is pending (not yet delivered) at the claim."""
    priority: int = 0
    """The run's priority (flow control): every doorbell of the run's own work, a later
    turn or a queued activity, carries it, so the run keeps its place in a worker's queue
    beyond its first turn."""
    takeover: bool = False
    """Whether the claim took the run over from an owner whose lease had expired."""
    due_at: datetime | None = None
    """When the work this claim took was due (the database's clock): the run's ``ready_at``
    (its start, or when it was woken), the first due timer of a run woken by its own
    claim, or the expired lease of a takeover; ``None`` if not known."""
    trace_context: dict[str, str] | None = None
    """The carrier stored by the run's start (:func:`~django_weft.engine.observe.start_carrier`),
    for tracing to continue the starter's trace; ``None`` when none was stored."""


@dataclass(frozen=True)
class Renewal:
    """What a renewal of the leases of the runs an engine holds found
    (:meth:`~django_weft.engine.ports.TurnStore.renew`)."""

    lost: set[str]
    """Held runs that another owner took, or whose epoch moved: no longer this engine's."""
    skipped: frozenset[str] = frozenset()
    """Held runs whose leases were not renewed this time (their rows locked by another
    transaction right then), though still this engine's: their leases run on from the
    last renewal."""


class MessageKind(enum.StrEnum):
    SIGNAL = "signal"
    UPDATE = "update"


@dataclass(frozen=True)
class PendingMessage:
    """A signal not yet consumed or an update accepted and not yet applied, as a turn
    sees it; ``pk`` is the row's id (arrival order within its kind)."""

    kind: str
    pk: int
    name: str
    payload: Any
    update_id: str | None = None
    validated: bool = True
    """False for an update accepted before the run registered its handler."""
    trace_context: dict[str, str] | None = None
    """The sender's trace context (a W3C carrier), or ``None`` when sent untraced."""


PARENT_CLOSE_POLICIES = ("terminate", "request_cancel", "abandon")
"""What happens to a child workflow still running when its parent closes."""


@dataclass(frozen=True)
class ChildStart:
    """A child run to create, already encoded."""

    run_id: str
    workflow_id: str
    workflow_name: str
    workflow_version: str
    args_json: str
    kwargs_json: str
    parent_close_policy: str
    priority: int = 0
    """Its parent's priority, which it takes."""
    trace_context: dict[str, str] | None = None
    """What tracing stores with the child (:func:`~django_weft.engine.observe.start_carrier`)."""


@dataclass(frozen=True)
class ChildOutcome:
    """How a child run ended (its last run, following continue-as-new)."""

    run_id: str
    workflow_id: str
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
