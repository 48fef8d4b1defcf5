"""A task's run read as the framework's ``TaskResult``.

A task run's one step (position 0) keeps its attempts: each failed or lost one in its
``failed_attempts`` (with the worker that ran it), the last one in the step itself (a
``started`` mark while it runs, naming its worker; its value and worker once it
succeeded; its error once it failed for good). The run gives the rest: when it was
enqueued and finished, and how it ended.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import runtime
from ..engine.attempt import ActivityInfo
from ..engine.error_types import ErrorType
from ..engine.errors import WorkflowNotFound
from ..engine.records import TERMINAL_STATUSES, RunStatus, StepStatus
from ..engine.workflow_info import WorkflowInfo
from ..runtime import HistoryEntry, RunRecord
from . import framework
from .runner import QUEUE_ATTRIBUTE, RUN_AFTER_ATTRIBUTE, TASK_ATTRIBUTE

TASK_SEQ = 0
"""The position of a task run's one step."""

_ERROR_CLASSES: Mapping[str, str] = {
    ErrorType.WORKER_LOST: "django_weft.tasks.runner.WorkerLost",
    ErrorType.CANCELLED: "django_weft.engine.errors.WorkflowCancelled",
    ErrorType.EXECUTION_TIMEOUT: "django_weft.engine.errors.WorkflowTimedOut",
}
"""The class paths of the errors django_weft records itself, as ``TaskError`` names them."""

_ATTEMPT_STATUSES = frozenset(
    {StepStatus.STARTED, StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.ATTEMPT_FAILED, StepStatus.LOST}
)
"""Step statuses whose fields describe an attempt that ran (or runs): not one waiting to
be retried (its failed attempt is in ``failed_attempts`` already), held by flow control,
or sent to a queue and not yet taken."""


def read(result_id: Any, *, alias: str | None = None) -> framework.TaskResult:
    """The task result ``result_id`` (a task run's id). Raises the framework's
    ``TaskResultDoesNotExist`` for an id that is no run's, a run that is not a task's
    (of backend ``alias``, if given), or a task whose code cannot be imported here."""
    try:
        run_id = str(uuid.UUID(str(result_id)))
    except ValueError:
        raise framework.TaskResultDoesNotExist(f"{result_id!r} is not a task result id (a run id)") from None
    try:
        run, step = runtime.read_run_at(uuid.UUID(run_id), TASK_SEQ)
    except WorkflowNotFound:
        raise framework.TaskResultDoesNotExist(f"no task result has the id {run_id}") from None
    backend = run.search_attributes.get(TASK_ATTRIBUTE)
    if not isinstance(backend, str) or (alias is not None and backend != alias):
        raise framework.TaskResultDoesNotExist(f"run {run_id} is not a task of the task backend {alias!r}")
    return task_result(_task_of(run, backend), run, step)


def first_attempt(
    task: framework.Task, run: WorkflowInfo, info: ActivityInfo, args: Any, kwargs: Any
) -> framework.TaskResult | None:
    """What :func:`read` would return for task run ``run`` while ``info``, its first
    attempt, runs inline in the turn that holds ``run`` (started, its mark written at
    ``info.started_at``), without reading it back; ``None`` for a run of the task nobody
    enqueued."""
    backend = run.search_attributes.get(TASK_ATTRIBUTE)
    if not isinstance(backend, str):
        return None
    return new_result(
        as_enqueued(task, run.priority, run.search_attributes, backend),
        run.run_id,
        args,
        kwargs,
        status=framework.TaskResultStatus.RUNNING,
        enqueued_at=run.started_at,
        started_at=info.started_at,
        last_attempted_at=info.started_at,
        backend=backend,
        worker_ids=[info.worker],
    )


def finished(started: framework.TaskResult, finished_at: datetime, value: Any) -> framework.TaskResult:
    """``started``, the result of a task run's last attempt as it started, once that
    attempt returned ``value`` and the run completed at ``finished_at``: what :func:`read`
    returns then."""
    result = dataclasses.replace(
        started,
        status=framework.TaskResultStatus.SUCCESSFUL,
        finished_at=finished_at,
        errors=list(started.errors),
        worker_ids=list(started.worker_ids),
    )
    object.__setattr__(result, "_return_value", value)
    return result


def step_attempt(task: framework.Task, info: ActivityInfo, args: Any, kwargs: Any) -> framework.TaskResult:
    """The result a task that takes its context sees when it runs as a workflow's step
    (``ctx.run(task)``): running, as attempt ``info.attempt`` of the step, whose
    ``run_id:seq`` is its id."""
    now = timezone.now()
    return new_result(
        task,
        f"{info.run_id}:{info.seq}",
        args,
        kwargs,
        status=framework.TaskResultStatus.RUNNING,
        enqueued_at=now,
        started_at=now,
        last_attempted_at=now,
        worker_ids=[info.worker] * info.attempt,
    )


def new_result(
    task: framework.Task, result_id: str, args: Any, kwargs: Any, **fields: Any
) -> framework.TaskResult:
    """A result of ``task`` with these fields, the others empty: ``READY``, no times, no
    attempts, no errors, on the task's backend."""
    empty: dict[str, Any] = {
        "status": framework.TaskResultStatus.READY,
        "enqueued_at": None,
        "started_at": None,
        "finished_at": None,
        "last_attempted_at": None,
        "backend": task.backend,
        "errors": [],
        "worker_ids": [],
    }
    return _result(task, id=result_id, args=list(args), kwargs=dict(kwargs), **{**empty, **fields})


def task_result(task: framework.Task, run: RunRecord, step: HistoryEntry | None) -> framework.TaskResult:
    """``run`` (a task's) and its step as the framework's result of ``task``."""
    workers: list[str] = []
    errors: list[framework.TaskError] = []
    starts: list[datetime] = []
    current_worker = ""
    for entry in (step.failed_attempts or []) if step is not None else []:
        error = entry.get("error") or {}
        workers.append(str(error.get("worker", "")))
        errors.append(_task_error(error))
        if entry.get("started_at"):
            starts.append(datetime.fromisoformat(entry["started_at"]))
    running = False
    never_started = (
        step is not None and step.status == StepStatus.LOST and not (step.error or {}).get("started")
    )
    if step is not None and step.status in _ATTEMPT_STATUSES and not never_started:
        starts.append(step.started_at)
        recorded = step.result if isinstance(step.result, dict) else {}
        if step.status == StepStatus.COMPLETED:
            current_worker = str(recorded.get("worker", ""))
        elif step.status == StepStatus.STARTED:
            current_worker = str(recorded.get("worker", ""))
            running = True
        else:
            failure = step.error or {}
            current_worker = str(failure.get("worker", "") or recorded.get("worker", ""))
            errors.append(_task_error(failure))
        workers.append(current_worker)
    status = _status(run.status, running)
    if (
        status == framework.TaskResultStatus.FAILED
        and run.error
        and (not errors or run.status in _ENDED_FROM_OUTSIDE)
    ):
        errors.append(_task_error(run.error))  # cancelled or timed out: why it ended, after its attempts
    result = _result(
        task,
        id=run.run_id,
        status=status,
        enqueued_at=run.created_at,
        started_at=min(starts) if starts else None,
        finished_at=run.finished_at if run.status in _FINISHED else None,
        last_attempted_at=max(starts) if starts else None,
        args=run.args,
        kwargs=run.kwargs,
        backend=str(run.search_attributes.get(TASK_ATTRIBUTE) or task.backend),
        errors=errors,
        worker_ids=workers,
    )
    if status == framework.TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", run.result)
    return result


_FINISHED = TERMINAL_STATUSES
_ENDED_FROM_OUTSIDE = frozenset({RunStatus.CANCELLED, RunStatus.TIMED_OUT})


def _status(run_status: str, running: bool) -> framework.TaskResultStatus:
    if run_status == RunStatus.COMPLETED:
        return framework.TaskResultStatus.SUCCESSFUL
    if run_status in _FINISHED:
        return framework.TaskResultStatus.FAILED
    return framework.TaskResultStatus.RUNNING if running else framework.TaskResultStatus.READY


def _task_error(error: Mapping[str, Any]) -> framework.TaskError:
    kind = str(error.get("type") or "Exception")
    path = _ERROR_CLASSES.get(kind) or (kind if "." in kind else f"builtins.{kind}")
    if path.startswith("django_weft.") and path.count(".") == 1:
        path = "django_weft.engine.errors.WeftError"  # another error django_weft recorded itself
    text = str(error.get("traceback") or "") or f"{kind}: {error.get('message', '')}\n"
    return framework.TaskError(exception_class_path=path, traceback=text)


def _task_of(run: RunRecord, backend: str) -> framework.Task:
    """The task a run is of, as it was enqueued (its queue, priority and backend)."""
    from django.utils.module_loading import import_string

    try:
        task = import_string(run.workflow)
    except ImportError:
        task = None
    if not framework.is_task(task):
        raise framework.TaskResultDoesNotExist(
            f"run {run.run_id} is a task of {run.workflow!r}, which is not a task that can be imported here"
        )
    return as_enqueued(task, run.priority, run.search_attributes, backend)


def as_enqueued(
    task: framework.Task, priority: int, attributes: Mapping[str, Any], backend: str
) -> framework.Task:
    """``task`` as it was enqueued: on the queue and with the ``run_after`` its run's
    search ``attributes`` hold, on that backend, with that priority."""
    queue = str(attributes.get(QUEUE_ATTRIBUTE) or task.queue_name)
    run_after = attributes.get(RUN_AFTER_ATTRIBUTE)
    try:
        when = datetime.fromisoformat(run_after) if isinstance(run_after, str) else None
        return task.using(priority=priority, queue_name=queue, backend=backend, run_after=when)
    except (framework.InvalidTask, ValueError):
        return task  # the settings changed since (that queue or backend is gone): as defined


def _result(task: framework.Task, **fields: Any) -> framework.TaskResult:
    return framework.TaskResult(task=task, **fields)
