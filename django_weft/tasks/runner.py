"""How a task of Django's task framework runs as a durable run.

Each task is a workflow named by its module path (``"mail.tasks.send_welcome"``) whose
body is one step: the task's function, run as an activity that marks each attempt
before it runs (which worker, when), so an attempt lost with its worker is counted and
run again (docs/how-to/django-tasks.md). The task's queue is the activity's queue: the
framework's default queue runs the function inline in the run's turn (one claim, one
step, one completion); any other runs it as a queued activity on the weft queue (and
the Celery queue) of that name.

Both are registered when the task is defined (``@task`` builds a
:class:`~django_weft.tasks.WeftTask`), in every process that imports its module: a
worker imports the ``tasks`` module of each installed app when a
:class:`~django_weft.tasks.WeftTaskBackend` is configured.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from ..engine import activity_overrides
from ..engine.attempt import ActivityInfo, activity_info, run_to_completion
from ..engine.context import WorkflowContext
from ..engine.registry import Activity, Workflow, registry
from ..engine.retry import RetryPolicy
from ..engine.workflow_info import WorkflowInfo
from . import framework

TASK_ATTRIBUTE = "weft_task"
"""The search attribute that makes a run a task's: the alias of its backend in ``TASKS``
(``weft_task=default`` finds a backend's tasks in the admin and the REST API)."""

QUEUE_ATTRIBUTE = "weft_queue"
"""The search attribute holding a task run's ``queue_name``."""

RUN_AFTER_ATTRIBUTE = "weft_run_after"
"""The search attribute holding a deferred task run's ``run_after`` (ISO 8601), so its
result's task is the task as it was enqueued."""

RUNS_ONCE = RetryPolicy(max_attempts=1)
"""A task without a retry policy runs once, as the framework specifies (an attempt lost
with its worker is run again all the same: it did not fail)."""


class WorkerLost(Exception):
    """An attempt of a task did not end: the worker running it stopped (killed, crashed,
    out of memory) or lost the run. Its entry in ``TaskResult.errors`` names this class;
    the task was run again."""


def register(task: framework.Task) -> None:
    """Register ``task``'s workflow and activity, once per task (a copy that ``using()``
    made runs the same function: it changes nothing). Its retry policy and queue are
    decided for each run or step (:func:`policy_of`, the queue it was enqueued on), not
    here, so what this process happened to register last never decides them."""
    name = task.module_path
    registered = registry.activities.get(name)
    if registered is not None and registered.marks_attempts and registry.workflows.get(name) is not None:
        return
    attempt = _named_like(task, _attempt_of(task))
    act: Activity[..., Any] = Activity(fn=attempt, name=name, marks_attempts=True)
    act.__doc__ = task.func.__doc__
    body = _named_like(task, _body_of(name))
    # The workflow first: a name some workflow has already raises before anything is added.
    registry.add_workflow(Workflow(fn=body, name=name, parameters=_parameters_of(task), kind="task"))
    registry.add_activity(act)


def policy_of(task: framework.Task, backend_alias: str | None = None) -> RetryPolicy:
    """The retry policy of ``task``'s attempts: its own (``@task(retry=...)``), else the
    ``OPTIONS["retry"]`` of its backend (``backend_alias``, the one it was enqueued on,
    or its own), else one attempt."""
    own = getattr(task, "retry", None)
    if own is not None:
        return own
    try:
        backend = framework.task_backends[backend_alias or task.backend]
    except Exception:  # a backend gone from the settings: the task's own terms only
        backend = None
    return getattr(backend, "default_retry", None) or RUNS_ONCE


def task_activity(task: framework.Task) -> Activity[..., Any]:
    """The activity that runs ``task`` as a workflow's step (``ctx.run(task, ...)``), with
    its retry policy and on its queue: inline for the default queue. Registered, so a
    queued one's worker finds it."""
    register(task)
    act = registry.activities[task.module_path]
    return _on_queue(dataclasses.replace(act, retry=policy_of(task)), task.queue_name)


def _on_queue(act: Activity[..., Any], queue: str) -> Activity[..., Any]:
    if queue == framework.DEFAULT_TASK_QUEUE_NAME:
        return act
    return dataclasses.replace(act, queue=queue)


def _body_of(name: str) -> Callable[..., Any]:
    def body(ctx: WorkflowContext, /, *args: Any, **kwargs: Any) -> Any:
        attributes = ctx.info.search_attributes
        queue = attributes.get(QUEUE_ATTRIBUTE) or framework.DEFAULT_TASK_QUEUE_NAME
        alias = attributes.get(TASK_ATTRIBUTE)
        act = registry.activities[name]
        task = _task_by_activity[name]
        policy = policy_of(task, alias if isinstance(alias, str) else None)
        _here.started = None
        token = _turn_run.set(ctx.info)
        try:
            outcome = ctx.run(_on_queue(dataclasses.replace(act, retry=policy), str(queue)), *args, **kwargs)
        finally:
            _turn_run.reset(token)
            started, _here.started = _here.started, None
        if started is not None and started.id == ctx.info.run_id:
            _here.ending = (started, outcome["value"])  # for task_finished, once the run ends
        return outcome["value"]

    return body


_task_by_activity: dict[str, framework.Task] = {}
"""The task each registered task activity runs, by its name (the task's module path)."""

_turn_run: ContextVar[WorkflowInfo | None] = ContextVar("django_weft_task_run", default=None)
"""The task run whose turn runs its step in this context: its attempt, inline, builds the
result it reports from what the turn holds instead of reading it back."""


class _Reported(threading.local):
    """What this thread reported of the task run it runs, so the framework's signals of
    that run need no read of what it has just written: the result ``task_started`` was
    sent with (set by the attempt, taken by its run's body), then that result with the
    step's value (set by the body, taken by ``task_finished`` when the run ends)."""

    started: framework.TaskResult | None = None
    ending: tuple[framework.TaskResult, Any] | None = None


_here = _Reported()


def take_ending(run_id: str) -> tuple[framework.TaskResult, Any] | None:
    """The started result and the value of task run ``run_id`` if this thread ran its
    step in the turn that ended it; once."""
    ending, _here.ending = _here.ending, None
    return ending if ending is not None and ending[0].id == run_id else None


def _attempt_of(task: framework.Task) -> Callable[..., Any]:
    """One attempt of ``task``. As a task run's step: the framework's ``task_started``
    signal, its function (with the task's context if it takes one; a test's mock of it
    instead, without), and its value with the worker that produced it, for
    ``TaskResult.worker_ids``. As a workflow's step (``ctx.run(task)``): the same, and
    its value as it is."""
    _task_by_activity[task.module_path] = task

    def attempt(*args: Any, **kwargs: Any) -> Any:
        from . import results  # the runtime is loaded by then

        info = activity_info()
        as_run = info.workflow_name == task.module_path and info.seq == results.TASK_SEQ
        current = None
        if as_run:
            current = _started(task, info, args, kwargs)
            _here.started = current
            if current is not None:
                framework.task_started.send(type(task.get_backend()), task_result=current)
        mock = activity_overrides.override_of(task.module_path)
        if mock is not None:
            value = mock(*args, **kwargs)
        elif task.takes_context:
            seen = current if current is not None else results.step_attempt(task, info, args, kwargs)
            value = task.func(framework.TaskContext(task_result=seen), *args, **kwargs)
        else:
            value = task.func(*args, **kwargs)
        if inspect.iscoroutine(value):  # an async def task: on an event loop of its own
            value = run_to_completion(value)
        return {"value": value, "worker": info.worker} if as_run else value

    return attempt


def _started(task: framework.Task, info: ActivityInfo, args: Any, kwargs: Any) -> framework.TaskResult | None:
    """The result of the task run whose attempt ``info`` is starting (its ``started``
    mark is written), or ``None`` for a run of the task nobody enqueued (a schedule's). A
    first attempt run inline is built from the turn's run; any other is read."""
    from . import results

    run = _turn_run.get()
    if run is not None and run.run_id == info.run_id and info.attempt == 1 and info.started_at is not None:
        return results.first_attempt(task, run, info, args, kwargs)
    try:
        return results.read(info.run_id)
    except framework.TaskResultDoesNotExist:
        return None


def _named_like(task: framework.Task, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` carrying the task function's module and qualified name, so the registry
    tells this task's registration from another function's under the same name."""
    fn.__module__ = task.func.__module__
    fn.__qualname__ = task.func.__qualname__
    fn.__name__ = task.func.__name__
    return fn


def _parameters_of(task: framework.Task) -> inspect.Signature | None:
    """The workflow's signature (``ctx`` first, then the task's parameters, without its
    ``context``), so an enqueue with arguments the function cannot take is refused."""
    try:
        signature = inspect.signature(task.func)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if task.takes_context and parameters:
        parameters = parameters[1:]
    ctx = inspect.Parameter("_weft_ctx", inspect.Parameter.POSITIONAL_ONLY)
    return signature.replace(parameters=[ctx, *parameters])
