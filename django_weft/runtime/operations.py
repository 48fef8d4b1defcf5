"""Every operation a person can perform on a run or a schedule, described once.

An :class:`Operation` says what the operation needs (the ``django_weft`` model permissions),
what input it takes and within which limits (:class:`TextRule`, :class:`WaitRule`,
:class:`WholeNumberRule`, the choices of its options), and which runs or schedules it
leaves as they are and why (:meth:`Operation.refusal_for`). The admin's forms and
permission checks, the REST serializers and permission class, the management commands
and the runtime's own checks read these descriptions: a limit is written here and
nowhere else, and the runtime enforces it, so a limit checked at a surface and again in
the runtime cannot disagree.

Surfaces look an operation up with :func:`operation` (``operation("cancel").reason``);
:data:`OPERATIONS` lists them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..conf import weft_settings
from ..engine import codec
from ..engine.durations import parse_duration
from ..engine.errors import InvalidInput
from ..engine.flow import PRIORITY_MAX, PRIORITY_MIN
from ..engine.records import ACTIVE_STATUSES, TERMINAL_STATUSES, RunStatus
from ..engine.schedule_spec import InvalidSchedule
from ..models import Schedule, WorkflowRun

APP_LABEL = "django_weft"

REASON_MAX_LENGTH = 2000
"""The longest reason a cancellation or a reset stores (shown in the admin and to
``result()`` callers), and the longest note a schedule keeps."""

BACKFILL_LIMIT = 500
"""The most scheduled times one backfill fires: a longer range is refused before anything
starts (split it). Each time is a run, started in the request that asks for it."""

UPDATE_WAIT_DEFAULT = 10.0
"""How long an update's sender waits for the handler's result when it does not say."""


@dataclass(frozen=True)
class TextRule:
    """A text input: a reason or a note."""

    what: str
    """How an error names it ("the cancellation reason")."""
    field: str
    """The input's name at every surface (``reason``, ``note``)."""
    max_length: int = REASON_MAX_LENGTH
    required: bool = False
    """A blank value is refused (a reset needs its reason); otherwise blank means none."""
    missing: str = ""
    """The error for a blank value when :attr:`required`."""
    error: type[InvalidInput] = InvalidInput
    """What :meth:`check` raises (``InvalidSchedule`` for a schedule's note)."""

    def check(self, value: Any) -> str:
        """``value`` as stored: raises ``InvalidInput`` (naming :attr:`field`) for a value
        that is not text, is blank when required, is longer than :attr:`max_length`, or
        holds what the database cannot store (a NUL, a lone surrogate). ``None`` is ""."""
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise self.error(f"{self.field} must be a string; got {type(value).__name__}", field=self.field)
        if self.required and not value.strip():
            raise self.error(
                self.missing or f"{self.what} is required (a non-empty string)", field=self.field
            )
        if len(value) > self.max_length:
            raise self.error(
                f"{self.what} is {len(value)} characters long; the limit is {self.max_length}",
                field=self.field,
            )
        try:
            codec.dumps(value, what=self.what)  # no NUL, no lone surrogate
        except InvalidInput as exc:
            raise self.error(str(exc), field=self.field) from None
        return value


@dataclass(frozen=True)
class WaitRule:
    """How long a sender waits for an outcome, in seconds: never less than 0; at the admin
    and the REST API at most the setting ``WEFT_API_MAX_WAIT`` (a request holds a server
    thread meanwhile: a longer wait is capped to it), while the Python client may wait
    longer."""

    field: str = "wait"
    default: float = UPDATE_WAIT_DEFAULT

    @property
    def surface_maximum(self) -> float:
        """The longest the admin or the REST API waits, read live from the settings."""
        return weft_settings.API_MAX_WAIT

    def check(self, value: Any) -> float:
        """``value`` in seconds; raises ``InvalidInput`` (naming :attr:`field`) for a value
        that is not a finite number or is negative."""
        if isinstance(value, str):  # "30s", as a duration anywhere else
            try:
                value = parse_duration(value, what=self.field)
            except InvalidInput as exc:
                raise InvalidInput(exc.message, field=self.field) from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidInput(f"{self.field} must be a number of seconds; got {value!r}", field=self.field)
        if value < 0:
            raise InvalidInput(f"{self.field} must be at least 0 seconds; got {value:g}", field=self.field)
        return float(value)

    def at_surface(self, value: Any) -> float:
        """:meth:`check`, then capped at :attr:`surface_maximum`."""
        return min(self.check(value), self.surface_maximum)


@dataclass(frozen=True)
class WholeNumberRule:
    """A whole number within a range: a start's priority."""

    field: str
    """The input's name at every surface (``priority``)."""
    minimum: int
    maximum: int
    default: int = 0
    meaning: str = ""
    """What the number does, in a few words an error and a form's help repeat
    ("higher runs first")."""

    def check(self, value: Any) -> int:
        """``value`` if it is a whole number from :attr:`minimum` to :attr:`maximum` (not a
        bool, a float or a numeric string: a caller that sends ``"5"`` is told so), else
        ``InvalidInput`` naming :attr:`field` and the range."""
        if isinstance(value, bool) or not isinstance(value, int) or not self.minimum <= value <= self.maximum:
            meaning = f" ({self.meaning})" if self.meaning else ""
            raise InvalidInput(
                f"{self.field} must be a whole number from {self.minimum} to {self.maximum}{meaning}; "
                f"got {value!r}",
                field=self.field,
            )
        return value


@dataclass(frozen=True)
class Choice:
    """One choice of an option, with the words a form shows beside it."""

    value: str
    label: Any
    """A str or a lazily translated one."""


@dataclass(frozen=True)
class Operation:
    """One operation on a run or a schedule."""

    name: str
    target: Literal["run", "schedule"]
    permissions: tuple[str, ...]
    """The ``django_weft`` permission codenames it needs, all of them."""
    title: str
    """Its name in a sentence's first word ("Cancel", "Request cancellation of")."""
    reason: TextRule | None = None
    """The reason or note it takes, if any."""
    wait: WaitRule | None = None
    priority: WholeNumberRule | None = None
    """The priority it takes, if any (a start's)."""
    choices: Mapping[str, tuple[Choice, ...]] = field(default_factory=dict)
    """Each option's choices."""
    applies_to: frozenset[str] | None = None
    """The run statuses it changes; ``None``: it changes no run's status."""
    needs: str = ""
    """Why a run in another status is left as it is ("not suspended")."""
    finished_is_final: bool = True
    """A finished run is refused as "already finished" (retry says "not failed")."""

    @property
    def permission_names(self) -> tuple[str, ...]:
        """The permissions as ``user.has_perm`` takes them (``django_weft.cancel_workflowrun``)."""
        return tuple(f"{APP_LABEL}.{codename}" for codename in self.permissions)

    def allowed(self, user: Any) -> bool:
        """Whether ``user`` (a Django user, anonymous or ``None``) may perform it: an active
        staff member holding every one of :attr:`permissions`."""
        return bool(
            user is not None
            and getattr(user, "is_active", False)
            and getattr(user, "is_staff", False)
            and all(user.has_perm(name) for name in self.permission_names)
        )

    def values(self, option: str) -> tuple[str, ...]:
        """The values ``option`` takes (the default first)."""
        return tuple(choice.value for choice in self.choices[option])

    def check_choice(self, option: str, value: Any) -> str:
        """``value`` if ``option`` takes it, else ``InvalidInput`` naming the choices."""
        known = self.values(option)
        if value not in known:
            raise InvalidInput(f"{option} must be one of {', '.join(known)}; got {value!r}", field=option)
        return str(value)

    def check_reason(self, value: Any) -> str | None:
        """The reason (or note) as stored, ``None`` for none; raises ``InvalidInput``
        (field ``reason``) for one the operation does not take or its rule refuses."""
        if value is None:
            return None
        if self.reason is None:
            raise InvalidInput(f"{self.name} takes no reason", field="reason")
        return self.reason.check(value)

    def refusal_for(self, status: str) -> str | None:
        """Why the operation leaves a run in ``status`` as it is, in words ("already
        finished (completed)", "not suspended (running)"), or ``None`` if it applies."""
        if self.applies_to is None or status in self.applies_to:
            return None
        if self.finished_is_final and status in TERMINAL_STATUSES:
            return f"already finished ({status_words(status)})"
        return f"{self.needs} ({status_words(status)})"


def status_words(status: str) -> str:
    """A run status as a person reads it ("continued as new")."""
    if status == RunStatus.CONTINUED:
        return "continued as new"
    if status in WorkflowRun.Status.values:
        return str(WorkflowRun.Status(status).label)
    return status


CANCEL_REASON = TextRule("the cancellation reason", "reason")
RESET_REASON = TextRule(
    "the reset reason",
    "reason",
    required=True,
    missing="a reset needs a reason (a non-empty string), stored on both runs",
)
SCHEDULE_NOTE = TextRule("the note", "note", error=InvalidSchedule)
START_PRIORITY = WholeNumberRule(
    "priority", PRIORITY_MIN, PRIORITY_MAX, default=0, meaning="higher runs first"
)
"""A start's priority (docs/how-to/flow-control.md): it orders the runs waiting for a
worker and those queued for a concurrency slot. The range is Django's tasks'."""

CANCEL_MODES = (
    Choice("terminate", "Cancel now"),
    Choice("request", "Request cancellation (the workflow can clean up)"),
)
ON_CONFLICT = (
    Choice("use_existing", "use_existing: show the run that has the id, start nothing"),
    Choice("fail", "fail: refuse the start (the id is taken)"),
    Choice(
        "start_new_if_terminal", "start_new_if_terminal: start a new run if the one with the id has finished"
    ),
)
OVERLAP = tuple(Choice(str(value), label) for value, label in Schedule.Overlap.choices)
_RUNNING_OR_WAITING = frozenset({RunStatus.RUNNING, RunStatus.WAITING})

OPERATIONS: Mapping[str, Operation] = {
    operation.name: operation
    for operation in (
        # -- runs
        Operation("view", "run", ("view_workflowrun",), "View"),
        Operation(
            "start",
            "run",
            ("add_workflowrun",),
            "Start",
            priority=START_PRIORITY,
            choices={"on_conflict": ON_CONFLICT},
        ),
        Operation("signal", "run", ("signal_workflowrun",), "Signal"),
        Operation("update", "run", ("update_workflowrun",), "Update", wait=WaitRule()),
        Operation("query", "run", ("view_workflowrun",), "Query"),
        Operation(
            "cancel",
            "run",
            ("cancel_workflowrun",),
            "Cancel",
            reason=CANCEL_REASON,
            choices={"mode": CANCEL_MODES},
            applies_to=ACTIVE_STATUSES,
            needs="not active",
        ),
        # "cancel" and "terminate" end a run at once (as ``cancel()`` does by default);
        # "request_cancel" sends it a cancellation request its workflow code receives.
        Operation(
            "terminate",
            "run",
            ("cancel_workflowrun",),
            "Terminate",
            reason=CANCEL_REASON,
            applies_to=ACTIVE_STATUSES,
            needs="not active",
        ),
        Operation(
            "request_cancel",
            "run",
            ("cancel_workflowrun",),
            "Request cancellation of",
            reason=CANCEL_REASON,
            applies_to=ACTIVE_STATUSES,
            needs="not active",
        ),
        Operation(
            "suspend",
            "run",
            ("suspend_workflowrun",),
            "Suspend",
            applies_to=_RUNNING_OR_WAITING,
            needs="not running or waiting",
        ),
        Operation(
            "resume",
            "run",
            ("suspend_workflowrun",),
            "Resume",
            applies_to=frozenset({RunStatus.SUSPENDED}),
            needs="not suspended",
        ),
        Operation(
            "retry",
            "run",
            ("cancel_workflowrun",),
            "Retry",
            applies_to=frozenset({RunStatus.FAILED}),
            needs="not failed",
            finished_is_final=False,
        ),
        # A reset closes a run and starts one: it needs both permissions.
        Operation("reset", "run", ("cancel_workflowrun", "add_workflowrun"), "Reset", reason=RESET_REASON),
        # -- schedules
        Operation("view_schedule", "schedule", ("view_schedule",), "View"),
        Operation(
            "create_schedule",
            "schedule",
            ("add_schedule",),
            "Create",
            reason=SCHEDULE_NOTE,
            choices={"overlap": OVERLAP},
        ),
        Operation(
            "change_schedule",
            "schedule",
            ("change_schedule",),
            "Change",
            reason=SCHEDULE_NOTE,
            choices={"overlap": OVERLAP},
        ),
        Operation("delete_schedule", "schedule", ("delete_schedule",), "Delete"),
        Operation("pause", "schedule", ("pause_schedule",), "Pause", reason=SCHEDULE_NOTE),
        Operation("unpause", "schedule", ("pause_schedule",), "Unpause", reason=SCHEDULE_NOTE),
        Operation("trigger", "schedule", ("trigger_schedule",), "Trigger", choices={"overlap": OVERLAP}),
        Operation("backfill", "schedule", ("trigger_schedule",), "Backfill", choices={"overlap": OVERLAP}),
    )
}
"""Every operation, by name."""

BULK_OPERATIONS = ("cancel", "terminate", "request_cancel", "suspend", "resume", "retry")
"""The operations a bulk action or a bulk job applies to many runs."""


def operation(name: str) -> Operation:
    """The operation called ``name``; raises ``InvalidInput`` naming the known ones."""
    try:
        return OPERATIONS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(OPERATIONS))
        raise InvalidInput(f"unknown operation {name!r}; use one of {known}") from None


__all__ = [
    "BACKFILL_LIMIT",
    "BULK_OPERATIONS",
    "CANCEL_REASON",
    "OPERATIONS",
    "REASON_MAX_LENGTH",
    "RESET_REASON",
    "SCHEDULE_NOTE",
    "START_PRIORITY",
    "UPDATE_WAIT_DEFAULT",
    "Choice",
    "Operation",
    "TextRule",
    "WaitRule",
    "WholeNumberRule",
    "operation",
    "status_words",
]
