"""Reading runs: look-up by run id or workflow id, description, history, waiting for a
result, and the status report of ``weft_status``."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min

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


def describe(run: WorkflowRun) -> dict[str, Any]:
    return {
        "run_id": str(run.pk),
        "workflow_id": run.workflow_id,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status,
        "args": run.args,
        "kwargs": run.kwargs,
        "result": run.result,
        "error": run.error,
        "failure_category": run.failure_category or None,
        "attempt": run.attempt,
        "search_attributes": run.search_attributes,
        "waiting_on": run.waiting_on,
        "execution_deadline": run.execution_deadline,
        "owner_id": run.owner_id,
        "owner_epoch": run.owner_epoch,
        "lease_expires_at": run.lease_expires_at,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "parent_run_id": str(run.parent_id) if run.parent_id else None,
    }


def history(run: WorkflowRun) -> list[dict[str, Any]]:
    steps = Step.objects.using(weft_settings.DATABASE_ALIAS).filter(run=run).order_by("seq")
    return [
        {
            "seq": step.seq,
            "kind": step.kind,
            "name": step.name,
            "status": step.status,
            "args": step.args,
            "result": step.result,
            "error": step.error,
            "attempt": step.attempt,
            "started_at": step.started_at,
            "finished_at": step.finished_at,
        }
        for step in steps
    ]


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
    oldest_waiting: WorkflowRun | None
    oldest_runnable: WorkflowRun | None
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
    return StatusReport(
        counts=counts,
        oldest_waiting=runs.filter(status=RunStatus.WAITING).order_by("updated_at").first(),
        oldest_runnable=runs.runnable().order_by("ready_at").first(),
        expired_leases=runs.expired_leases(now, 0).count(),
        due_timers=timers["n"],
        oldest_due_timer=timers["oldest"],
    )
