"""Creating, changing, pausing, unpausing and deleting a schedule."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from ...engine.durations import Duration
from ...engine.errors import ScheduleManaged
from ...engine.run_logging import get_logger
from ...engine.schedule_firing import OverlapPolicy
from ...engine.schedule_spec import InvalidSchedule, ScheduleSpec
from ...models import Schedule
from ..process import get_store
from .checking import (
    DEFAULT_CATCHUP_WINDOW,
    check_id,
    check_note,
    check_overlap,
    check_start,
    check_window,
    spec_fields,
    spec_of,
)

logger = get_logger("django_weft.schedules")

OPERATOR_OPTIONS = frozenset({"note"})
"""What :func:`update_schedule` changes on a schedule declared in code even with
``refuse_managed``: its declaration sets everything else (pausing is separate)."""


def create_schedule(
    schedule_id: str,
    workflow: Any,
    *,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    cron: str | None = None,
    every: Duration | None = None,
    offset: Duration | None = None,
    timezone: str | None = None,
    overlap: str = OverlapPolicy.SKIP,
    catchup_window: Duration = DEFAULT_CATCHUP_WINDOW,
    jitter: Duration | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    paused: bool = False,
    note: str = "",
    search_attributes: dict[str, Any] | None = None,
    managed: bool = False,
) -> Schedule:
    """Create a schedule; everything is checked before anything is written
    (``InvalidSchedule``, ``WorkflowNotRegistered``, ``WorkflowArgumentsError``,
    ``ScheduleAlreadyExists``). Its first fire is the spec's first time after now."""
    schedule_id = check_id(schedule_id)
    spec = ScheduleSpec.build(
        cron=cron,
        every=every,
        offset=offset,
        timezone=timezone,
        start_at=start_at,
        end_at=end_at,
        jitter=jitter,
    )
    run_fields = check_start(workflow, args, kwargs, search_attributes)
    note = check_note(note)
    store = get_store()
    now = store.db_now()
    schedule = store.schedules.insert_schedule(
        {
            "id": schedule_id,
            **run_fields,
            **spec_fields(spec),
            "overlap": check_overlap(overlap),
            "catchup_window_seconds": check_window(catchup_window),
            "paused": bool(paused),
            "note": note,
            "managed": bool(managed),
            "next_fire_at": spec.next_after(now),
        }
    )
    logger.info("schedule %s: created (%s, %s)", schedule_id, run_fields["workflow_name"], spec.describe())
    return schedule


def update_schedule(schedule_id: str, *, refuse_managed: bool = False, **changes: Any) -> Schedule:
    """Change a schedule's spec, policies, workflow or input; takes effect from the next
    fire (a changed spec recomputes ``next_fire_at`` from now). Accepts the keyword
    arguments of :func:`create_schedule` except the id; checks them all first.

    With ``refuse_managed`` (the operators' surfaces: REST, admin), a schedule declared
    in code refuses every change but its note with :class:`ScheduleManaged`, since the
    next ``weft_schedules sync`` would put the declaration back."""
    allowed = {
        "workflow", "args", "kwargs", "cron", "every", "offset", "timezone", "overlap", "catchup_window",
        "jitter", "start_at", "end_at", "note", "search_attributes", "managed",
    }  # fmt: skip
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise InvalidSchedule(f"update_schedule() got unknown option(s): {', '.join(unknown)}")
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        declared = sorted(set(changes) - OPERATOR_OPTIONS)
        if refuse_managed and schedule.managed and declared:
            remedy = f"change its {', '.join(declared)} there and run manage.py weft_schedules sync"
            raise _managed(schedule, remedy, declared)
        fields: dict[str, Any] = {}
        spec_keys = {"cron", "every", "offset", "timezone", "start_at", "end_at", "jitter"}
        if spec_keys & set(changes):
            current = spec_of(schedule)
            options: dict[str, Any] = {
                "cron": current.cron, "every": current.every, "offset": current.offset or None,
                "timezone": current.timezone, "start_at": current.start_at, "end_at": current.end_at,
                "jitter": current.jitter or None,
            }  # fmt: skip
            if "cron" in changes and changes["cron"] is not None:
                options["every"] = options["offset"] = None
            if "every" in changes and changes["every"] is not None:
                options["cron"] = None
            options.update({key: changes[key] for key in spec_keys if key in changes})
            spec = ScheduleSpec.build(**options)
            fields.update(spec_fields(spec))
            if not schedule.paused:
                fields["next_fire_at"] = spec.next_after(store.db_now())
        if {"workflow", "args", "kwargs", "search_attributes"} & set(changes):
            fields.update(
                check_start(
                    changes.get("workflow", schedule.workflow_name),
                    changes.get("args", schedule.args),
                    changes.get("kwargs", schedule.kwargs),
                    changes.get("search_attributes", schedule.search_attributes),
                )
            )
        if "overlap" in changes:
            fields["overlap"] = check_overlap(changes["overlap"])
        if "catchup_window" in changes:
            fields["catchup_window_seconds"] = check_window(changes["catchup_window"])
        if "note" in changes:
            fields["note"] = check_note(changes["note"])
        if "managed" in changes:
            fields["managed"] = bool(changes["managed"])
        for name, value in fields.items():
            setattr(schedule, name, value)
        if fields:
            store.schedules.save_schedule(schedule, list(fields))
    logger.info("schedule %s: updated (%s)", schedule_id, ", ".join(sorted(changes)) or "nothing")
    return schedule


def pause_schedule(schedule_id: str, note: str = "") -> Schedule:
    """Stop firing until :func:`unpause_schedule`; times passing meanwhile do not fire
    (nor count as missed)."""
    note = check_note(note)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        schedule.paused, schedule.note = True, note
        store.schedules.save_schedule(schedule, ["paused", "note"])
    logger.info("schedule %s: paused%s", schedule_id, f" ({note})" if note else "")
    return schedule


def unpause_schedule(schedule_id: str, note: str = "") -> Schedule:
    """Fire again, from the spec's next time after now; ``note`` replaces the pause's. A
    schedule that is not paused is left as it is (its due fires, within their catch-up
    window, still start)."""
    note = check_note(note)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        if not schedule.paused:
            return schedule
        schedule.paused, schedule.note = False, note
        schedule.next_fire_at = spec_of(schedule).next_after(store.db_now())
        store.schedules.save_schedule(schedule, ["paused", "note", "next_fire_at"])
    logger.info("schedule %s: unpaused", schedule_id)
    return schedule


def delete_schedule(schedule_id: str, *, refuse_managed: bool = False) -> None:
    """Delete the schedule; runs it started are kept. With ``refuse_managed``, a
    schedule declared in code is not deleted (:class:`ScheduleManaged`): the next
    ``weft_schedules sync`` would create it again."""
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        if refuse_managed and schedule.managed:
            remedy = "remove its declaration and run manage.py weft_schedules sync --prune"
            raise _managed(schedule, remedy, [])
        store.schedules.delete_schedule(schedule.pk)
    logger.info("schedule %s: deleted", schedule_id)


def _managed(schedule: Schedule, remedy: str, declared: list[str]) -> ScheduleManaged:
    return ScheduleManaged(
        f"schedule {schedule.pk!r} is declared in code (@workflow(schedules=[...])): {remedy}; "
        "by hand it can only be paused, unpaused, triggered, backfilled and given a note",
        schedule_id=schedule.pk,
        declared=declared,
    )
