"""A schedule operation applied to many schedules (pause, unpause, trigger, delete), as
:mod:`.bulk` applies a lifecycle operation to many runs: the schedule admin's actions.

:func:`apply_schedule_bulk` calls the single-schedule function (:func:`.pause_schedule`,
``unpause_schedule``, ``trigger_schedule``, ``delete_schedule``) on each schedule, each in
its own transaction: a schedule that cannot change, or fails unexpectedly, never holds
back the others. It returns a :class:`ScheduleBulkOutcome` saying which schedules changed,
which were skipped and why (grouped by reason, :func:`schedule_refusal_for`), which failed,
and what each trigger fired.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.errors import InvalidInput, ScheduleManaged, ScheduleNotFound
from ..engine.run_logging import get_logger
from ..models import Schedule
from .schedules import delete_schedule, pause_schedule, trigger_schedule, unpause_schedule

logger = get_logger("django_weft.runtime")

NO_SUCH_SCHEDULE = "no such schedule"
DELETED_MEANWHILE = "no such schedule (deleted meanwhile)"


def declared_in_code(schedule: Schedule) -> str:
    """Why a schedule declared in code is not deleted (the next sync would create it again)."""
    return f"declared in code (workflow {schedule.workflow_name})"


@dataclass
class ScheduleBulkOutcome:
    """What an operation did, schedule by schedule."""

    changed: list[Schedule] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Schedule ids by the reason they were skipped."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """``(schedule id, error)`` of the schedules the runtime refused unexpectedly."""
    fires: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A trigger's recorded action per schedule id (its ``outcome``, ``run_id``, ``detail``)."""

    def skip(self, schedule_id: str, reason: str) -> None:
        self.skipped.setdefault(reason, []).append(schedule_id)


@dataclass(frozen=True)
class ScheduleBulkOperation:
    """One schedule operation as :func:`apply_schedule_bulk` applies it."""

    name: str
    apply: Callable[[Schedule, str, str | None, ScheduleBulkOutcome], Schedule | None]
    """Changes one schedule, given the note (pause) and the overlap (trigger); returns the
    schedule as it is now when the call says."""
    refusal: Callable[[Schedule], str | None]
    """Why the operation skips a schedule as things stand, or ``None``."""


def _pause(schedule: Schedule, note: str, overlap: str | None, outcome: ScheduleBulkOutcome) -> Schedule:
    return pause_schedule(schedule.pk, note)


def _unpause(schedule: Schedule, note: str, overlap: str | None, outcome: ScheduleBulkOutcome) -> Schedule:
    return unpause_schedule(schedule.pk)


def _trigger(schedule: Schedule, note: str, overlap: str | None, outcome: ScheduleBulkOutcome) -> None:
    outcome.fires[schedule.pk] = trigger_schedule(schedule.pk, overlap=overlap)


def _delete(schedule: Schedule, note: str, overlap: str | None, outcome: ScheduleBulkOutcome) -> None:
    delete_schedule(schedule.pk, refuse_managed=True)


SCHEDULE_OPERATIONS: Mapping[str, ScheduleBulkOperation] = {
    operation.name: operation
    for operation in (
        ScheduleBulkOperation("pause", _pause, lambda s: "already paused" if s.paused else None),
        ScheduleBulkOperation("unpause", _unpause, lambda s: None if s.paused else "not paused"),
        # A paused schedule can be triggered (and backfilled): only its own fires stop.
        ScheduleBulkOperation("trigger", _trigger, lambda s: None),
        ScheduleBulkOperation("delete", _delete, lambda s: declared_in_code(s) if s.managed else None),
    )
}
"""The operations :func:`apply_schedule_bulk` knows, by name."""


def schedule_operation_named(name: str) -> ScheduleBulkOperation:
    """The operation called ``name``; raises ``InvalidInput`` naming the known ones."""
    try:
        return SCHEDULE_OPERATIONS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(SCHEDULE_OPERATIONS))
        raise InvalidInput(f"unknown schedule operation {name!r}; use one of {known}") from None


def schedule_refusal_for(operation: str, schedule: Schedule) -> str | None:
    """Why ``operation`` leaves ``schedule`` as it is, in words (the reason an outcome
    skips it under, e.g. "already paused"), or ``None`` if the operation applies to it."""
    return schedule_operation_named(operation).refusal(schedule)


def apply_schedule_bulk(
    operation: str, schedules: Iterable[Schedule], *, note: str = "", overlap: str | None = None
) -> ScheduleBulkOutcome:
    """Each schedule through its runtime call, in its own transaction; a schedule deleted
    or changed meanwhile is skipped, an unexpected error is logged and reported.
    ``note`` is a pause's note, ``overlap`` a trigger's overlap policy (``None``: the
    schedule's own)."""
    known = schedule_operation_named(operation)
    outcome = ScheduleBulkOutcome()
    for schedule in schedules:
        refusal = known.refusal(schedule)
        if refusal is not None:
            outcome.skip(schedule.pk, refusal)
            continue
        try:
            changed = known.apply(schedule, note, overlap, outcome)
        except ScheduleNotFound:
            outcome.skip(schedule.pk, DELETED_MEANWHILE)
        except ScheduleManaged:
            outcome.skip(schedule.pk, declared_in_code(schedule))
        except Exception as exc:
            logger.exception("bulk %s of schedule %s failed", known.name, schedule.pk)
            outcome.failed.append((schedule.pk, f"{type(exc).__name__}: {exc}"))
        else:
            outcome.changed.append(changed or schedule)
    return outcome


__all__ = [
    "DELETED_MEANWHILE",
    "NO_SUCH_SCHEDULE",
    "SCHEDULE_OPERATIONS",
    "ScheduleBulkOperation",
    "ScheduleBulkOutcome",
    "apply_schedule_bulk",
    "declared_in_code",
    "schedule_operation_named",
    "schedule_refusal_for",
]
