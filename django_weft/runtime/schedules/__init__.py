"""Schedules: recurring starts of a workflow, fired by the tick.

Each scheduled time starts a run with workflow id ``<schedule id>-<UTC time>`` (see
:func:`~django_weft.engine.schedule_firing.workflow_id_for`) and the search attributes
``weft_schedule_id`` and ``weft_scheduled_at``. The tick locks a due schedule, starts its
runs and advances ``next_fire_at`` in one transaction, so a crash in between leaves
neither a duplicate nor a gap; and a start by that workflow id finds the run of a fire
that did commit, so a fire is idempotent even across separate transactions (triggers,
backfills).

:mod:`.managing` creates, changes, pauses and deletes schedules; :mod:`.firing` fires them
(the tick, a trigger, a backfill); :mod:`.syncing` matches the schedules declared in code;
:mod:`.describing` reads them; :mod:`.checking` checks their input.
"""

from __future__ import annotations

from .checking import DEFAULT_CATCHUP_WINDOW, SCHEDULE_ID, spec_of
from .describing import ScheduleDescription, describe_schedule, describe_schedules, list_schedules
from .firing import BACKFILL_LIMIT, RECENT_ACTIONS, backfill_schedule, fire_due_schedules, trigger_schedule
from .managing import (
    OPERATOR_OPTIONS,
    create_schedule,
    delete_schedule,
    pause_schedule,
    unpause_schedule,
    update_schedule,
)
from .syncing import SyncReport, declared_schedules, sync_schedules

__all__ = [
    "BACKFILL_LIMIT",
    "DEFAULT_CATCHUP_WINDOW",
    "OPERATOR_OPTIONS",
    "RECENT_ACTIONS",
    "SCHEDULE_ID",
    "ScheduleDescription",
    "SyncReport",
    "backfill_schedule",
    "create_schedule",
    "declared_schedules",
    "delete_schedule",
    "describe_schedule",
    "describe_schedules",
    "fire_due_schedules",
    "list_schedules",
    "pause_schedule",
    "spec_of",
    "sync_schedules",
    "trigger_schedule",
    "unpause_schedule",
    "update_schedule",
]
