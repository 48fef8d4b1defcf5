"""``WeftTaskBackend``: Django's task framework on durable runs.

``TASKS = {"default": {"BACKEND": "django_weft.tasks.WeftTaskBackend"}}``: each
``enqueue`` starts a run in the caller's transaction (docs/how-to/django-tasks.md), a
worker (``weft_worker`` or Celery with ``django_weft.contrib.celery``) claims it under an
epoch and runs the task's function as the run's one step, and ``get_result`` reads the
run back as a ``TaskResult``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from .. import runtime
from ..conf import weft_settings
from ..engine import clock
from ..engine.durations import MAX_SECONDS
from ..engine.errors import ConfigurationError, WorkflowArgumentsError
from ..engine.registry import registry
from ..engine.retry import RetryPolicy
from ..signals import run_cancelled, run_completed, run_failed, run_timed_out
from . import framework, results, runner

if TYPE_CHECKING:
    _Task = framework.Task[Any, Any]
else:
    _Task = framework.Task  # generic in the backport only


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeftTask(_Task):
    """A task of :class:`WeftTaskBackend` (what ``@task`` makes with it): the framework's
    ``Task`` with a ``retry`` policy (``@task(retry=RetryPolicy(max_attempts=5))``, which
    Django 6.1 and the backport pass on; the backend's ``OPTIONS["retry"]`` otherwise;
    without either, one attempt)."""

    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        super().__post_init__()  # the backend validates the task
        runner.register(self)


class WeftTaskBackend(framework.BaseTaskBackend):
    """Tasks as durable runs: recorded, claimed under an epoch, recovered after a crash,
    retried by a policy, deferred by a durable timer, ordered by priority."""

    task_class = WeftTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.default_retry = _retry_option(self.options.get("retry"))
        """The retry policy of tasks that name none (``OPTIONS["retry"]``), or ``None``."""

    def validate_task(self, task: framework.Task) -> None:
        super().validate_task(task)
        retry = getattr(task, "retry", None)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise framework.InvalidTask(
                f"retry= takes a django_weft.RetryPolicy (RetryPolicy(max_attempts=3)); got {retry!r}"
            )

    def enqueue(self, task: framework.Task, args: Any, kwargs: Any) -> framework.TaskResult:
        """Start the task's run, in the caller's transaction if there is one (its worker
        is told once it commits, and nothing is left if it rolls back); ``run_after``
        leaves it pending until then. ``task_enqueued`` is sent once the start commits."""
        self.validate_task(task)
        runner.register(task)
        delay = None
        if task.run_after is not None:
            virtual = clock.installed()  # a test's virtual clock, which the store's timers follow
            delay = (task.run_after - (virtual.now() if virtual else timezone.now())).total_seconds()
            if delay > MAX_SECONDS:  # a run's start delay is 100 years at most
                raise framework.InvalidTask(
                    f"run_after is {task.run_after.isoformat()}, more than 100 years ahead: give a "
                    "nearer time"
                )
        attributes = {runner.TASK_ATTRIBUTE: self.alias, runner.QUEUE_ATTRIBUTE: task.queue_name}
        if task.run_after is not None:
            attributes[runner.RUN_AFTER_ATTRIBUTE] = task.run_after.isoformat()
        options = runtime.StartOptions(
            start_delay=delay if delay is not None and delay > 0 else None,
            # The framework takes any whole number (5.0, True) in its range; the run's is an int.
            priority=int(task.priority),
            search_attributes=attributes,
        )
        try:
            started = runtime.start_with(task.module_path, list(args), dict(kwargs), options)
        except WorkflowArgumentsError as exc:
            # As calling the function with them would: nothing was written.
            raise TypeError(f"task {task.module_path} cannot take these arguments: {exc}") from None
        # The run's own time (a deferred start's is read back: its start returns no record).
        record = started.record
        enqueued_at = record.created_at if record is not None else runtime.get_run(started.run_id).created_at
        result = results.new_result(
            task, started.run_id, args, kwargs, enqueued_at=enqueued_at, backend=self.alias
        )
        transaction.on_commit(
            lambda: framework.task_enqueued.send(type(self), task_result=result),
            using=weft_settings.DATABASE_ALIAS,
        )
        return result

    async def aenqueue(self, task: framework.Task, args: Any, kwargs: Any) -> framework.TaskResult:
        """:meth:`enqueue`, awaited (the async client's path: one call on the caller's sync
        thread, which then gives its connection back)."""
        return await runtime.once(self.enqueue)(task, args, kwargs)

    async def aget_result(self, result_id: str) -> framework.TaskResult:
        """:meth:`get_result`, awaited, as :meth:`aenqueue` is."""
        return await runtime.once(self.get_result)(result_id)

    def get_result(self, result_id: str) -> framework.TaskResult:
        """The task's run as a ``TaskResult``; ``TaskResultDoesNotExist`` for an id that
        is not a task of this backend."""
        return results.read(result_id, alias=self.alias)


def _retry_option(value: Any) -> RetryPolicy | None:
    """``OPTIONS["retry"]`` as a policy: a ``RetryPolicy`` or a dict of its fields; a bad
    value is ``None`` here (``manage.py check`` reports it: ``django_weft.E026``)."""
    try:
        return RetryPolicy.coerce(value) if value is not None else None
    except (ConfigurationError, TypeError, ValueError):
        return None


def announce_finished(
    sender: Any,
    run_id: str,
    workflow_name: str,
    signal: Any,
    finished_at: datetime | None = None,
    **kwargs: Any,
) -> None:
    """The framework's ``task_finished`` for a task run that ended (completed, failed,
    cancelled, timed out), sent after the end committed, in the process that ended it. A
    run this thread has just completed is reported from what it ran; any other is read."""
    act = registry.activities.get(workflow_name)
    if act is None or not act.marks_attempts:
        return
    ending = runner.take_ending(run_id)
    if ending is not None and signal is run_completed and finished_at is not None:
        result = results.finished(ending[0], finished_at, ending[1])
    else:
        try:
            result = results.read(run_id)
        except framework.TaskResultDoesNotExist:
            return
    framework.task_finished.send(type(result.task.get_backend()), task_result=result)


for _signal in (run_completed, run_failed, run_cancelled, run_timed_out):
    _signal.connect(announce_finished, dispatch_uid="django_weft.tasks.announce_finished")
