"""Reading runs: look-up by run id or workflow id, description, history, waiting for a
result, and the status report of ``weft_status``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q

from ..conf import weft_settings
from ..engine.errors import (
    ResultTimeout,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTimedOut,
)
from ..engine.records import (
    TERMINAL_STATUSES,
    RunStatus,
)
from ..models import Step, Timer, WorkflowRun
from .process import get_store
from .records import HistoryEntry, RunRecord


def get_run(ref: str | uuid.UUID) -> WorkflowRun:
    """The run with this run id, or the latest run with this workflow id."""
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
    run = None
    try:
        run_uuid = ref if isinstance(ref, uuid.UUID) else uuid.UUID(str(ref))
    except ValueError:
        run_uuid = None
    if run_uuid is not None:
        run = runs.filter(pk=run_uuid).first()
    if run is None:
        run = runs.for_workflow_id(str(ref)).first()
    if run is None:
        raise WorkflowNotFound(f"no workflow run has run id or workflow id {str(ref)!r}", ref=str(ref))
    return run


def read_run(ref: str | uuid.UUID) -> RunRecord:
    """The run with this run id (or the latest with this workflow id), as a record."""
    return RunRecord.of(get_run(ref))


_ENTRY_COLUMNS = tuple(field.name for field in fields(HistoryEntry))
"""The step columns a :class:`HistoryEntry` is made of (same names)."""
_PAYLOAD_COLUMNS = ("args", "result")


def read_history(run: WorkflowRun, *, payloads: bool = True) -> list[HistoryEntry]:
    """The run's recorded steps, in order.

    With ``payloads=False`` the steps' ``args`` and ``result`` are not read (``None`` in
    the entries): for a view of a long history that shows neither, like the admin's
    timeline, which reads the payloads of the steps it lists with :func:`read_steps_at`.
    Rows are read as tuples, without making model instances."""
    columns = _ENTRY_COLUMNS if payloads else tuple(c for c in _ENTRY_COLUMNS if c not in _PAYLOAD_COLUMNS)
    unread: dict[str, Any] = {} if payloads else dict.fromkeys(_PAYLOAD_COLUMNS)
    steps = Step.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run).order_by("seq")
    return [
        HistoryEntry(**dict(zip(columns, row, strict=True)), **unread) for row in steps.values_list(*columns)
    ]


def read_steps_at(positions: Mapping[str, Iterable[int]]) -> dict[str, dict[int, HistoryEntry]]:
    """The recorded steps at the given positions of several runs (run id -> seqs), in one
    query: what a page of parked runs waits on. Positions without a step are left out."""
    wanted = Q()
    for run_id, seqs in positions.items():
        listed = sorted(set(seqs))
        if listed:
            wanted |= Q(run_id=run_id, seq__in=listed)
    found: dict[str, dict[int, HistoryEntry]] = {}
    if not wanted:
        return found
    # No order: Step's default ordering would join the run table to sort by it.
    steps = Step.objects.using(weft_settings.DATABASE_ALIAS).filter(wanted).order_by()
    for run_id, *row in steps.values_list("run_id", *_ENTRY_COLUMNS):
        entry = HistoryEntry(**dict(zip(_ENTRY_COLUMNS, row, strict=True)))
        found.setdefault(str(run_id), {})[entry.seq] = entry
    return found


def describe(run: WorkflowRun) -> dict[str, Any]:
    """The run as a dict (:meth:`RunRecord.as_dict`)."""
    return RunRecord.of(run).as_dict()


def history(run: WorkflowRun) -> list[dict[str, Any]]:
    """The run's recorded steps as dicts (:meth:`HistoryEntry.as_dict`)."""
    return [entry.as_dict() for entry in read_history(run)]


def result_of(run_id: str, timeout: float | None = None, poll: float = 0.01) -> Any:
    """Wait for the run to finish and return its result, or raise its outcome's error.

    A ``continued`` run is followed to its successor.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = poll
    current = str(run_id)
    runs = WorkflowRun.objects.using(weft_settings.DATABASE_ALIAS)
    while True:
        row = runs.filter(pk=current).values("status", "result", "error", "workflow_id").first()
        if row is None:
            raise WorkflowNotFound(f"run {current} no longer exists", ref=current)
        status = row["status"]
        if status == RunStatus.COMPLETED:
            return row["result"]
        if status == RunStatus.CONTINUED:
            current = (row["result"] or {})["continued_as"]
            continue
        if status in TERMINAL_STATUSES:
            raise _outcome_error(current, row["workflow_id"], status, row["error"] or {})
        if deadline is not None and time.monotonic() >= deadline:
            raise ResultTimeout(
                f"run {current} is still {status} after {timeout} s; call result() again later",
                run_id=current,
                status=status,
            )
        pause = delay if deadline is None else min(delay, max(deadline - time.monotonic(), 0))
        time.sleep(pause)
        delay = min(delay * 1.5, 0.25)


def _outcome_error(run_id: str, workflow_id: str, status: str, error: dict[str, Any]) -> Exception:
    if status == RunStatus.FAILED:
        return WorkflowFailed(
            f"run {run_id} ({workflow_id}) failed: {error.get('type')}: {error.get('message')}",
            run_id=run_id,
            workflow_id=workflow_id,
            error_type=error.get("type"),
            error_message=error.get("message"),
            error_traceback=error.get("traceback"),
            details=error,
        )
    if status == RunStatus.CANCELLED:
        return WorkflowCancelled(
            f"run {run_id} ({workflow_id}) was cancelled",
            run_id=run_id,
            workflow_id=workflow_id,
            reason=error.get("reason"),
        )
    return WorkflowTimedOut(
        f"run {run_id} ({workflow_id}) passed its execution timeout", run_id=run_id, workflow_id=workflow_id
    )


@dataclass(frozen=True)
class StatusReport:
    counts: dict[str, int]
    oldest_waiting: RunRecord | None
    oldest_runnable: RunRecord | None
    expired_leases: int
    due_timers: int
    oldest_due_timer: datetime | None


def status_report() -> StatusReport:
    store = get_store()
    runs = WorkflowRun.objects.using(store.alias)
    counts: dict[str, int] = {str(status): 0 for status in RunStatus}
    for row in runs.order_by().values("status").annotate(n=Count("pk")):
        counts[row["status"]] = row["n"]
    now = store.db_now()
    timers = Timer.objects.using(store.alias).due(now).aggregate(n=Count("pk"), oldest=Min("fire_at"))
    oldest_waiting = runs.filter(status=RunStatus.WAITING).order_by("updated_at").first()
    oldest_runnable = runs.runnable().order_by("ready_at").first()
    return StatusReport(
        counts=counts,
        oldest_waiting=RunRecord.of(oldest_waiting) if oldest_waiting is not None else None,
        oldest_runnable=RunRecord.of(oldest_runnable) if oldest_runnable is not None else None,
        expired_leases=runs.expired_leases(now, 0).count(),
        due_timers=timers["n"],
        oldest_due_timer=timers["oldest"],
    )
