"""What reading a run returns: frozen records the client, the REST serializers and the
admin share, built from the rows; ``as_dict`` gives the dicts ``describe()`` and
``history()`` have always returned."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from ..engine.records import RunStatus
from ..models import Step, WorkflowRun


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
        )

    def as_dict(self) -> dict[str, Any]:
        """The step as ``history()`` returns it."""
        return _fields_of(self)


def _fields_of(record: RunRecord | HistoryEntry, exclude: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """The record's fields in their order, values as they are (not copied)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if f.name not in exclude}
