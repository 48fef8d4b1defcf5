"""The Python client: start workflows and talk to their runs through handles.

Every call on runs has an ``a``-prefixed twin to ``await`` in async code (an ASGI view,
a consumer): ``astart``, ``handle.asignal``, ``handle.aresult``... A twin that reads or
writes once runs the call on the caller's sync thread (asgiref's ``sync_to_async`` with
``thread_sensitive=True``, as Django's own async ORM calls run) and gives the
connection back when it returns (closed unless ``CONN_MAX_AGE`` keeps it). A twin that
waits (``aresult``, ``aupdate``, ``aupdate_result``) looks at the database with one
short read now and then, on a thread all awaited waits of the process share, and holds
no thread and no connection between looks (:mod:`django_weft.runtime.awaiting`).
"""

from __future__ import annotations

import uuid
from typing import Any

from . import runtime
from .engine.durations import Duration, parse_duration


class WorkflowHandle:
    """A reference to one run. Cheap to create; every method reads the database."""

    def __init__(self, run_id: str, workflow_id: str) -> None:
        self.run_id = str(run_id)
        self.workflow_id = workflow_id

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id} run={self.run_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.run_id == self.run_id

    def __hash__(self) -> int:
        return hash(self.run_id)

    def status(self) -> str:
        return runtime.get_run(self.run_id).status

    def describe(self) -> dict[str, Any]:
        """The run as a dict; :meth:`read` gives it as a typed record."""
        return self.read().as_dict()

    def read(self) -> runtime.RunRecord:
        """The run as a :class:`~django_weft.runtime.RunRecord`."""
        return runtime.read_run(self.run_id)

    def history(self) -> list[dict[str, Any]]:
        """The recorded steps as dicts; :meth:`read_history` gives typed records."""
        return [entry.as_dict() for entry in self.read_history()]

    def read_history(self) -> list[runtime.HistoryEntry]:
        """The recorded steps, in order, as :class:`~django_weft.runtime.HistoryEntry` records."""
        return runtime.read_history(runtime.get_run(self.run_id))

    def signal(
        self, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> runtime.SignalAccepted:
        """Send signal ``name`` to this run; durable on return. A repeated ``signal_id``
        stores nothing new and returns the first acceptance. Raises
        ``WorkflowTerminalError`` if the run has finished."""
        return runtime.signal(self.run_id, name, payload, signal_id=signal_id)

    def query(self, name: str, *args: Any) -> Any:
        """Call the run's query handler ``name`` on its current state (read-only replay)."""
        return runtime.query(self.run_id, name, list(args))

    def update(
        self, name: str, payload: Any = None, *, update_id: str | None = None, wait: Duration = 10
    ) -> Any:
        """Send update ``name`` and return its handler's result. Validated before it is
        stored (``UpdateValidationError``); ``UpdateTimeout`` after ``wait`` seconds
        carries the ``update_id`` to poll with :meth:`update_result`."""
        return runtime.update(self.run_id, name, payload, update_id=update_id, wait=wait)

    def update_result(self, update_id: str, *, wait: Duration = 0) -> Any:
        """The outcome of an accepted update (waits up to ``wait`` seconds for it)."""
        return runtime.update_result(self.run_id, update_id, wait=wait)

    def cancel(self, reason: str | None = None, *, mode: str = "terminate") -> str:
        """Cancel the run (see :func:`django_weft.runtime.cancel`) and return its status.

        ``mode="terminate"`` (default): ``cancelled`` now, whatever the workflow is doing.
        ``mode="request"``: the workflow receives ``CancellationRequested`` at its current
        or next blocking point and may clean up (or carry on); returns the status then
        (``running`` for a parked run it woke)."""
        return runtime.cancel(self.run_id, reason, mode=mode)

    def suspend(self) -> str:
        """Suspend the run until :meth:`resume`; returns ``"suspended"``."""
        return runtime.suspend(self.run_id)

    def resume(self) -> str:
        """Resume a suspended run; returns ``"running"``."""
        return runtime.resume(self.run_id)

    def retry(self) -> str:
        """Reactivate a failed run from its failed step; returns ``"running"``."""
        return runtime.retry(self.run_id)

    def reset(
        self,
        to_seq: int,
        *,
        args: list[Any] | tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        reason: str,
    ) -> WorkflowHandle:
        """Start a new run of this workflow id that replays this run's history before
        position ``to_seq`` and continues live from there (see
        :func:`django_weft.runtime.reset`); this run, if still active, is closed. Returns the
        new run's handle. ``args``/``kwargs`` replace the input; ``reason`` is required."""
        outcome = runtime.reset(self.run_id, to_seq, args=args, kwargs=kwargs, reason=reason)
        return WorkflowHandle(outcome.run_id, outcome.workflow_id)

    def result(self, timeout: Duration | None = None) -> Any:
        """Wait for the run to finish; return its result.

        Raises ``WorkflowFailed``, ``WorkflowCancelled`` or ``WorkflowTimedOut`` for those
        outcomes, and ``ResultTimeout`` after ``timeout`` (seconds or a duration string).
        """
        seconds = parse_duration(timeout, what="timeout") if timeout is not None else None
        return runtime.result_of(self.run_id, seconds)

    # -- async twins -------------------------------------------------------------------

    async def astatus(self) -> str:
        """:meth:`status`, awaited."""
        return await runtime.once(self.status)()

    async def aread(self) -> runtime.RunRecord:
        """:meth:`read`, awaited."""
        return await runtime.once(self.read)()

    async def adescribe(self) -> dict[str, Any]:
        """:meth:`describe`, awaited."""
        return await runtime.once(self.describe)()

    async def asignal(
        self, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> runtime.SignalAccepted:
        """:meth:`signal`, awaited: durable when the await returns."""
        return await runtime.once(self.signal)(name, payload, signal_id=signal_id)

    async def aquery(self, name: str, *args: Any) -> Any:
        """:meth:`query`, awaited (the read-only replay runs on the caller's sync thread)."""
        return await runtime.once(self.query)(name, *args)

    async def aupdate(
        self, name: str, payload: Any = None, *, update_id: str | None = None, wait: Duration = 10
    ) -> Any:
        """:meth:`update`, awaited. The update is validated and stored by one call; the
        wait for the handler's outcome holds no thread and no database connection between
        its looks. ``UpdateTimeout`` after ``wait`` seconds carries the ``update_id``."""
        return await runtime.aupdate(self.run_id, name, payload, update_id=update_id, wait=wait)

    async def aupdate_result(self, update_id: str, *, wait: Duration = 0) -> Any:
        """:meth:`update_result`, awaited (waits as :meth:`aupdate` does)."""
        return await runtime.aupdate_result(self.run_id, update_id, wait=wait)

    async def acancel(self, reason: str | None = None, *, mode: str = "terminate") -> str:
        """:meth:`cancel`, awaited."""
        return await runtime.once(self.cancel)(reason, mode=mode)

    async def aresult(self, timeout: Duration | None = None) -> Any:
        """:meth:`result`, awaited: the same outcomes and errors (``ResultTimeout`` after
        ``timeout``). Each look at the run is one short read on the thread the process's
        awaited waits share; between looks (10 ms growing to 250 ms apart) the wait holds
        no thread and no database connection, so many concurrent waits cost one
        connection. Cancelling the awaiting task stops the wait and leaves nothing behind."""
        seconds = parse_duration(timeout, what="timeout") if timeout is not None else None
        return await runtime.aresult_of(self.run_id, seconds)


def start(
    workflow: str | Any,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    on_conflict: str = "use_existing",
    execution_timeout: Duration | None = None,
    start_delay: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
    related_object: Any = None,
    priority: int = 0,
) -> WorkflowHandle:
    """Start a run of ``workflow`` (a registered name or a ``@workflow`` object).

    The run is left unowned and runnable; a worker claims it. See
    :func:`django_weft.runtime.start` for ``on_conflict`` and for workflows with a
    concurrency limit. ``related_object`` (a saved model instance, such as the order the
    run is for) is kept with the run: its admin page links to the object's.
    ``priority`` (-100..100, higher first, 0 by default) orders it among the runs
    waiting for a worker or a concurrency slot.
    """
    name = workflow if isinstance(workflow, str) else getattr(workflow, "name", workflow)
    options = runtime.StartOptions(
        id=id,
        on_conflict=on_conflict,
        execution_timeout=execution_timeout,
        start_delay=start_delay,
        search_attributes=search_attributes,
        related_object=related_object,
        priority=priority,
    )
    started = runtime.start_with(name, args, kwargs, options)
    return WorkflowHandle(started.run_id, started.workflow_id)


def signal_with_start(
    workflow: str | Any,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str,
    signal: str,
    payload: Any = None,
    signal_id: str | None = None,
    execution_timeout: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
) -> WorkflowHandle:
    """Signal the live run with workflow id ``id``, starting it first if there is none,
    atomically; returns the handle of the run that got the signal."""
    name = workflow if isinstance(workflow, str) else getattr(workflow, "name", workflow)
    outcome = runtime.signal_with_start(
        name,
        args,
        kwargs,
        id=id,
        signal=signal,
        payload=payload,
        signal_id=signal_id,
        execution_timeout=execution_timeout,
        search_attributes=search_attributes,
    )
    return WorkflowHandle(outcome.run_id, outcome.workflow_id)


def get_handle(ref: str | uuid.UUID) -> WorkflowHandle:
    """A handle to the run with run id ``ref``, or to the latest run with workflow id ``ref``.

    Raises ``WorkflowNotFound``.
    """
    run = runtime.get_run(ref)
    return WorkflowHandle(str(run.pk), run.workflow_id)


async def astart(
    workflow: str | Any,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str | None = None,
    on_conflict: str = "use_existing",
    execution_timeout: Duration | None = None,
    start_delay: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
    related_object: Any = None,
    priority: int = 0,
) -> WorkflowHandle:
    """:func:`start`, awaited: the run is stored (and its doorbell rung) by one call on
    the caller's sync thread. Not inside a transaction: Django's async code has none."""
    return await runtime.once(start)(
        workflow,
        args,
        kwargs,
        id=id,
        on_conflict=on_conflict,
        execution_timeout=execution_timeout,
        start_delay=start_delay,
        search_attributes=search_attributes,
        related_object=related_object,
        priority=priority,
    )


async def asignal_with_start(
    workflow: str | Any,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    id: str,
    signal: str,
    payload: Any = None,
    signal_id: str | None = None,
    execution_timeout: Duration | None = None,
    search_attributes: dict[str, Any] | None = None,
) -> WorkflowHandle:
    """:func:`signal_with_start`, awaited."""
    return await runtime.once(signal_with_start)(
        workflow,
        args,
        kwargs,
        id=id,
        signal=signal,
        payload=payload,
        signal_id=signal_id,
        execution_timeout=execution_timeout,
        search_attributes=search_attributes,
    )


async def aget_handle(ref: str | uuid.UUID) -> WorkflowHandle:
    """:func:`get_handle`, awaited. Raises ``WorkflowNotFound``."""
    return await runtime.once(get_handle)(ref)


# -- schedules ---------------------------------------------------------------------------------


class ScheduleHandle:
    """A reference to one schedule, by id. Every method reads or writes the database."""

    def __init__(self, schedule_id: str) -> None:
        self.id = schedule_id

    def __repr__(self) -> str:
        return f"<ScheduleHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScheduleHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def describe(self, *, next_count: int = 5) -> runtime.ScheduleDescription:
        """The next ``next_count`` fire times, the recent actions (scheduled and actual
        time, run id, outcome, the run's status now) and the counters."""
        return runtime.describe_schedule(self.id, next_count=next_count)

    def pause(self, note: str = "") -> None:
        """Stop firing until :meth:`unpause`; times that pass meanwhile do not fire."""
        runtime.pause_schedule(self.id, note)

    def unpause(self, note: str = "") -> None:
        """Fire again from the spec's next time after now."""
        runtime.unpause_schedule(self.id, note)

    def trigger(self, *, overlap: str | None = None) -> dict[str, Any]:
        """Fire now, under the schedule's overlap policy or ``overlap``; returns the action."""
        return runtime.trigger_schedule(self.id, overlap=overlap)

    def update(self, **changes: Any) -> None:
        """Change options (those of :func:`create_schedule`); effective from the next fire."""
        runtime.update_schedule(self.id, **changes)

    def delete(self) -> None:
        """Delete the schedule (its runs are kept)."""
        runtime.delete_schedule(self.id)

    def backfill(self, start: Any, end: Any, *, overlap: str = "allow_all") -> list[dict[str, Any]]:
        """Fire each scheduled time in ``[start, end]`` once; repeating it starts nothing new."""
        return runtime.backfill_schedule(self.id, start, end, overlap=overlap)


def create_schedule(schedule_id: str, workflow: str | Any, **options: Any) -> ScheduleHandle:
    """Create a schedule starting ``workflow`` (a registered name or a ``@workflow``
    object) at each time of its spec: ``cron=`` (5 fields, or 6 with leading seconds, or
    ``@daily``-style aliases) in ``timezone=`` (IANA, default UTC), or ``every=`` with an
    optional ``offset=``. Other options: ``args``, ``kwargs``, ``overlap`` (``skip``,
    ``buffer_one``, ``buffer_all``, ``cancel_other``, ``terminate_other``,
    ``allow_all``), ``catchup_window`` (default 60 s), ``jitter``, ``start_at``,
    ``end_at``, ``paused``, ``note``, ``search_attributes``.

    Bad input raises a ``WeftError`` subclass (``InvalidSchedule``,
    ``WorkflowNotRegistered``, ``WorkflowArgumentsError``, ``ScheduleAlreadyExists``)
    and writes nothing."""
    schedule = runtime.create_schedule(schedule_id, workflow, **options)
    return ScheduleHandle(schedule.id)


def get_schedule_handle(schedule_id: str) -> ScheduleHandle:
    """A handle to an existing schedule; raises ``ScheduleNotFound``."""
    runtime.describe_schedule(schedule_id, next_count=0)
    return ScheduleHandle(schedule_id)
