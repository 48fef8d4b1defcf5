"""The ``type`` of the errors django_weft stores itself (on runs, steps, updates and
finalizers), as opposed to the exceptions of user code (``module.QualName``)."""

from __future__ import annotations

import enum

from .records import RunStatus


class ErrorType(enum.StrEnum):
    CANCELLED = "django_weft.Cancelled"  # the run was cancelled
    EXECUTION_TIMEOUT = "django_weft.ExecutionTimeout"  # the run passed its execution deadline
    RUN_FINISHED = "django_weft.RunFinished"  # an update the run finished without applying
    RUN_CANCELLED = "django_weft.RunCancelled"  # an update pending when the run was cancelled
    RUN_TIMED_OUT = "django_weft.RunTimedOut"  # an update pending when the run timed out
    DISPATCH_LOST = "django_weft.DispatchLost"  # a queued attempt nobody picked up in time
    WORKER_LOST = "django_weft.WorkerLost"  # the worker running an attempt stopped heartbeating
    CHILD_GONE = "django_weft.ChildGone"  # a child run was purged before its parent saw it end
    ACTIVITY_NOT_REGISTERED = "django_weft.ActivityNotRegistered"  # unknown to the worker
    UNKNOWN_HANDLER = "django_weft.UnknownHandler"  # an update the run blocked without a handler for
    UPDATE_REJECTED = "django_weft.UpdateValidationError"  # an update its validator rejected in the run
    RESET = "django_weft.Reset"  # the run was closed by a reset (and an update pending then: carried over)


UPDATE_ERROR_ON_CLOSE: dict[str, ErrorType] = {
    RunStatus.CANCELLED: ErrorType.RUN_CANCELLED,
    RunStatus.TIMED_OUT: ErrorType.RUN_TIMED_OUT,
}
"""The error of an update still pending when its run is closed externally, by the status."""
