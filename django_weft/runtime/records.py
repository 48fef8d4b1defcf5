"""What reading a run returns: frozen records the client, the REST serializers and the
admin share, built from the rows; ``as_dict`` gives the dicts ``describe()`` and
``history()`` have always returned."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from ..engine.records import ACTIVE_STATUSES, RunStatus
from ..models import Signal, Step, Timer, Update, WorkflowRun


@dataclass(frozen=True)
class RunRecord:
    """One run as a reader sees it."""

    run_id: str
    workflow_id: str
    workflow: str
    version: str
    status: RunStatus
    args: list[Any]
    kwargs: dict[str, Any]
    result: Any
    error: dict[str, Any] | None
    failure_category: str | None
    attempt: int
    search_attributes: dict[str, Any]
    waiting_on: dict[str, Any] | None
    """What the parked run needs (see :mod:`django_weft.engine.parking`); ``None`` unless waiting."""
    execution_deadline: datetime | None
    owner_id: str | None
    owner_epoch: int
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    parent_run_id: str | None
    cancel_request: dict[str, Any] | None = None
    """The latest cancellation request (``cancel(mode="request")``): ``reason``,
    ``requested_at`` and ``seq``, the position where the workflow received it (``None``
    while pending); ``None`` if there was none."""
    reset_from: dict[str, Any] | None = None
    """The run this one was reset from (``reset()``): ``run_id``, ``seq`` (this run kept
    that run's entries before it), ``reason`` and ``reset_at``; ``None`` if it was not."""
    reset_to: dict[str, Any] | None = None
    """The run that replaced this one by a reset, in the same shape; ``None`` if none did."""
    priority: int = 0
    """Its start's priority, -100..100, higher first (docs/how-to/flow-control.md)."""
    concurrency_key: str | None = None
    """The key its workflow's concurrency limit counts it by: ``""`` for one limit for the
    whole workflow, ``None`` when its workflow has no limit."""
    slot: str = ""
    """``"held"`` (it holds a concurrency slot), ``"queued"`` (it waits for one) or ``""``
    (neither: no limit; none taken yet, as a delayed start before it is due or a child
    before its first claim; or finished, which gives a slot back)."""
    ready_at: datetime | None = None
    """Runnable since (not part of :meth:`as_dict`)."""

    @classmethod
    def of(cls, run: WorkflowRun) -> RunRecord:
        return cls(
            run_id=str(run.pk),
            workflow_id=run.workflow_id,
            workflow=run.workflow_name,
            version=run.workflow_version,
            status=RunStatus(run.status),
            args=run.args,
            kwargs=run.kwargs,
            result=run.result,
            error=run.error,
            failure_category=run.failure_category or None,
            attempt=run.attempt,
            search_attributes=run.search_attributes,
            waiting_on=run.waiting_on,
            execution_deadline=run.execution_deadline,
            owner_id=run.owner_id,
            owner_epoch=run.owner_epoch,
            lease_expires_at=run.lease_expires_at,
            created_at=run.created_at,
            updated_at=run.updated_at,
            finished_at=run.finished_at,
            parent_run_id=str(run.parent_id) if run.parent_id else None,
            cancel_request=run.cancel_request,
            reset_from=run.reset_from,
            reset_to=run.reset_to,
            priority=run.priority,
            concurrency_key=run.concurrency_key,
            # The column keeps its last value after the run ends; a finished run holds and
            # waits for nothing (docs/explanation/flow-control.md counts active runs only).
            slot=run.slot if run.status in ACTIVE_STATUSES else "",
            ready_at=run.ready_at,
        )

    def as_dict(self) -> dict[str, Any]:
        """The run as ``describe()`` returns it (every field but ``ready_at``)."""
        return _fields_of(self, exclude={"ready_at"})


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded step of a run's history."""

    seq: int
    kind: str
    name: str
    status: str
    args: Any
    result: Any
    error: dict[str, Any] | None
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    failed_attempts: list[dict[str, Any]] | None = None
    """An activity's attempts that failed and were retried, oldest first (``attempt``,
    ``error``, ``started_at``, ``finished_at``); the fields above are its last attempt."""

    @classmethod
    def of(cls, step: Step) -> HistoryEntry:
        return cls(
            seq=step.seq,
            kind=step.kind,
            name=step.name,
            status=step.status,
            args=step.args,
            result=step.result,
            error=step.error,
            attempt=step.attempt,
            started_at=step.started_at,
            finished_at=step.finished_at,
            failed_attempts=step.failed_attempts,
        )

    def as_dict(self) -> dict[str, Any]:
        """The step as ``history()`` returns it."""
        return _fields_of(self)


@dataclass(frozen=True)
class SignalRecord:
    """One signal sent to a run: buffered until the workflow consumes it."""

    sequence: int
    """The signal's row id: signals to one run are numbered in the order they arrived."""
    name: str
    signal_id: str | None
    payload: Any
    received_at: datetime
    consumed_seq: int | None
    """The history position that consumed it; ``None`` while it is buffered."""

    @classmethod
    def of(cls, signal: Signal) -> SignalRecord:
        return cls(
            sequence=signal.pk,
            name=signal.name,
            signal_id=signal.signal_id,
            payload=signal.payload,
            received_at=signal.received_at,
            consumed_seq=signal.consumed_seq,
        )


@dataclass(frozen=True)
class UpdateRecord:
    """One update sent to a run, and its outcome once the run has applied (or refused) it."""

    update_id: str
    name: str
    status: str
    """``accepted`` (stored, not applied yet), ``completed``, ``failed`` or ``rejected``."""
    payload: Any
    result: Any
    error: dict[str, Any] | None
    applied_seq: int | None
    received_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, update: Update) -> UpdateRecord:
        return cls(
            update_id=update.update_id,
            name=update.name,
            status=update.status,
            payload=update.payload,
            result=update.result,
            error=update.error,
            applied_seq=update.applied_seq,
            received_at=update.created_at,
            updated_at=update.updated_at,
        )


@dataclass(frozen=True)
class TimerRecord:
    """One durable wake-up of a run."""

    seq: int
    """The history position that waits on it; -1 for a timer of the whole run (deadline, delayed start)."""
    kind: str
    fire_at: datetime
    fired_at: datetime | None

    @classmethod
    def of(cls, timer: Timer) -> TimerRecord:
        return cls(seq=timer.seq, kind=timer.kind, fire_at=timer.fire_at, fired_at=timer.fired_at)


def _fields_of(record: RunRecord | HistoryEntry, exclude: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """The record's fields in their order, values as they are (not copied)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if f.name not in exclude}
