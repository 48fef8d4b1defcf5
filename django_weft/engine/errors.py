"""The error hierarchy of django_weft.

Every error the library raises derives from :class:`WeftError`. Errors carry their
attributes as keyword arguments and pickle cleanly, because they cross process
boundaries (Celery results, subprocess workers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .records import ClaimedRun


def _rebuild(cls: type[WeftError], message: str, attrs: dict[str, Any]) -> WeftError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(attrs)
    return error


class WeftError(Exception):
    """Base class of every django_weft error."""

    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        self.__dict__.update(attrs)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


class ConfigurationError(WeftError):
    """A setting or a declaration is invalid; the message says which and how to fix it."""


class InvalidInput(WeftError, ValueError):
    """A caller passed something django_weft cannot accept (bad id, payload, duration...)."""


class InvalidDuration(InvalidInput):
    """A duration string or number could not be understood."""


class PayloadError(InvalidInput):
    """Arguments, results or payloads are not JSON-serialisable or are too large."""


class WorkflowArgumentsError(InvalidInput):
    """A start's arguments do not fit the workflow function's signature (a missing,
    extra or unexpected keyword argument); nothing was written."""

    workflow: str


class WorkflowNotRegistered(WeftError, LookupError):
    """No workflow (or activity) is registered under the requested name."""


class DuplicateRegistration(ConfigurationError):
    """Two different functions were registered under the same workflow or activity name."""


class WorkflowNotFound(WeftError, LookupError):
    """No run matches the given run id or workflow id."""


class WorkflowAlreadyExists(WeftError):
    """A start with ``on_conflict="fail"`` found a run with that workflow id."""


class ConcurrencyLimited(WeftError):
    """A start of a workflow whose ``Concurrency(on_limit="cancel_new")`` found every slot
    of its key taken; nothing was written. ``run_id`` names the oldest run holding one."""

    workflow: str
    key: str
    limit: int
    run_id: str | None


class ScheduleNotFound(WeftError, LookupError):
    """No schedule has the given id."""


class BulkJobNotFound(WeftError, LookupError):
    """No bulk job has the given id."""


class ScheduleAlreadyExists(WeftError):
    """A schedule with that id exists already (update it, or delete it first)."""


class ScheduleManaged(WeftError):
    """The schedule is declared in code (``@workflow(schedules=[...])``): what its
    declaration sets changes there, and ``manage.py weft_schedules sync`` applies it.
    ``declared`` lists the options a caller tried to change by hand."""

    schedule_id: str
    declared: list[str]


class WorkflowTerminalError(WeftError):
    """The operation needs a non-terminal run, but the run has finished."""


class InvalidTransition(WeftError):
    """The run is not in a state that allows the requested lifecycle operation."""


class NonDeterminismError(WeftError):
    """Workflow code asked for a different operation than the one recorded at this position."""

    run_id: str
    position: int
    recorded: dict[str, Any]
    requested: dict[str, Any]


def nondeterminism_error(
    run: ClaimedRun,
    *,
    position: int,
    finding: str,
    remedy: str | None,
    recorded: dict[str, Any],
    requested: dict[str, Any],
) -> NonDeterminismError:
    """The one place a :class:`NonDeterminismError` is built: ``finding`` says what the
    replay found at ``position``, ``remedy`` what to change before retrying the run."""
    message = f"run {run.run_id} ({run.workflow_name}) is not deterministic: {finding}"
    if remedy:
        message = f"{message}. {remedy}; then retry the run"
    return NonDeterminismError(
        message, run_id=run.run_id, position=position, recorded=recorded, requested=requested
    )


class SignalTimeout(WeftError, TimeoutError):
    """``ctx.wait_signal`` reached its timeout before a signal arrived."""


class UpdateValidationError(WeftError, ValueError):
    """An update's validator rejected its payload; nothing was stored.

    ``issues`` lists what to fix: dicts with ``field`` (a dotted path, or ``None`` for the
    payload as a whole) and ``message``."""

    issues: list[dict[str, Any]]


class UnknownHandler(WeftError, LookupError):
    """A query or update names a handler the workflow has not registered (at the point its
    run has reached); ``registered`` lists the names it has."""

    kind: str
    name: str
    registered: list[str]


class UpdateFailed(WeftError):
    """The update was applied, but its handler raised; carries that error's type, message
    and traceback. The run itself goes on."""

    run_id: str
    update_id: str
    error_type: str | None
    error_message: str | None
    error_traceback: str | None


class UpdateTimeout(WeftError, TimeoutError):
    """The update was accepted and is durable, but no outcome arrived within ``wait``
    seconds; poll with ``handle.update_result(update_id)``."""

    run_id: str
    update_id: str


class UpdateNotFound(WeftError, LookupError):
    """No update with that ``update_id`` exists for the run (or the run was purged)."""


class QueryFailed(WeftError):
    """The query handler raised (or returned a value that is not JSON)."""


class ActivityFailed(WeftError):
    """An activity failed for good (non-retryable error or attempts exhausted).

    Raised inside the workflow at the ``ctx.run`` call, live and on replay alike, so the
    workflow may catch it. ``cause_type``, ``cause_message`` and ``cause_traceback``
    describe the activity's own last exception.
    """

    activity: str
    seq: int
    attempt: int
    cause_type: str | None
    cause_message: str | None
    cause_traceback: str | None


class ChildWorkflowFailed(WeftError):
    """Raised in a parent workflow when a child workflow it waits for did not complete:
    it ``failed``, was ``cancelled`` or ``timed_out`` (``status``). The parent may catch it."""

    child_run_id: str
    child_workflow_id: str
    seq: int
    status: str
    error_type: str | None
    error_message: str | None


class WorkflowFailed(WeftError):
    """``result()`` of a failed run: carries the original error's type, message and traceback."""

    run_id: str
    workflow_id: str
    error_type: str | None
    error_message: str | None
    error_traceback: str | None
    details: dict[str, object]


class WorkflowCancelled(WeftError):
    """``result()`` of a cancelled run.

    Raised inside workflow code too, as :class:`CancellationRequested`, where the run
    receives a cancellation request; a workflow that lets it (or any ``WorkflowCancelled``)
    escape finishes ``cancelled``."""


class CancellationRequested(WorkflowCancelled):
    """A cancellation was requested (``handle.cancel(mode="request")``, or a parent's
    ``request_cancel`` close policy).

    In a workflow: raised at the blocking point (a sleep, a wait, an activity's or a
    child's result) where the run received the request, at a position recorded in its
    history, so replay raises it at the same point. Let it propagate and the run finishes
    ``cancelled``; catch it to clean up with durable steps (``try/except/finally``) and
    then re-raise, or to carry on. In an activity: raised by ``activity_info().heartbeat()``
    once the activity's run asked for cancellation (or has finished). ``reason`` is the
    request's reason, ``requested_at`` when it was made (ISO 8601)."""

    reason: str | None
    requested_at: str | None


class WorkflowTimedOut(WeftError, TimeoutError):
    """``result()`` of a run that passed its execution timeout."""


class ResultTimeout(WeftError, TimeoutError):
    """``result(timeout=...)`` waited longer than ``timeout`` for the run to finish."""


class Deposed(WeftError):
    """This engine no longer owns the run: a newer epoch exists or the lease was lost.

    Raised by fenced writes. The engine stops driving that run only; the write it
    attempted is rolled back and never visible.
    """
