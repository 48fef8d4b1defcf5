"""Reading schedules: a schedule's description (next fire times, recent actions with
their runs' statuses, counters) and the list of every schedule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ...models import Schedule
from ..process import get_store
from .checking import (
    check_id,
    spec_of,
)


@dataclass(frozen=True)
class ScheduleDescription:
    """What :meth:`ScheduleHandle.describe` returns: the schedule's options, its spec in
    words, its next fire times, recent actions and counters. Durations are seconds."""

    id: str
    workflow: str
    args: list[Any]
    kwargs: dict[str, Any]
    search_attributes: dict[str, Any]
    cron: str | None
    every: float | None
    offset: float
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    jitter: float
    spec: str
    overlap: str
    catchup_window: float
    paused: bool
    note: str
    managed: bool
    next_fire_at: datetime | None
    next_fire_times: list[datetime]
    recent_actions: list[dict[str, Any]]
    fired: int
    skipped: int
    missed: int
    last_missed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    buffered: list[str] = field(default_factory=list)


def describe_schedule(schedule_id: str, *, next_count: int = 5, may_lag: bool = False) -> ScheduleDescription:
    """The schedule's next fire times, its recent actions (with each run's current
    status as ``run_status`` where it started one) and its counters; from the primary
    database, or with ``may_lag`` from ``WEFT_READ_DATABASE``."""
    schedule = get_store(may_lag=may_lag).schedules.read_schedule(check_id(schedule_id))
    return describe_schedules([schedule], next_count=next_count)[0]


def describe_schedules(schedules: Sequence[Schedule], *, next_count: int = 5) -> list[ScheduleDescription]:
    """:func:`describe_schedule` of rows already read (a page of a listing), with one
    query for the statuses of all their recent runs, on the database the rows were read
    from."""
    run_ids = [a["run_id"] for schedule in schedules for a in schedule.recent_actions if a.get("run_id")]
    statuses = get_store(same_database_as=schedules[0] if schedules else None).schedules.run_statuses(run_ids)
    return [_description(schedule, statuses, next_count) for schedule in schedules]


def _description(schedule: Schedule, statuses: dict[str, str], next_count: int) -> ScheduleDescription:
    spec = spec_of(schedule)
    upcoming: list[datetime] = []
    if not schedule.paused and schedule.next_fire_at is not None and next_count > 0:
        upcoming = [schedule.next_fire_at, *spec.fire_times(schedule.next_fire_at, next_count - 1)]
    actions = [
        {**action, "run_status": statuses.get(action["run_id"])} if action.get("run_id") else dict(action)
        for action in schedule.recent_actions
    ]
    return ScheduleDescription(
        id=schedule.id,
        workflow=schedule.workflow_name,
        args=list(schedule.args),
        kwargs=dict(schedule.kwargs),
        search_attributes=dict(schedule.search_attributes),
        cron=spec.cron,
        every=spec.every,
        offset=spec.offset,
        timezone=spec.timezone,
        start_at=spec.start_at,
        end_at=spec.end_at,
        jitter=spec.jitter,
        spec=spec.describe(),
        overlap=schedule.overlap,
        catchup_window=schedule.catchup_window_seconds,
        paused=schedule.paused,
        note=schedule.note,
        managed=schedule.managed,
        next_fire_at=schedule.next_fire_at,
        next_fire_times=upcoming,
        recent_actions=actions,
        fired=schedule.fired_count,
        skipped=schedule.skipped_count,
        missed=schedule.missed_count,
        last_missed_at=schedule.last_missed_at,
        created_at=schedule.created_at,
        updated_at=schedule.updated_at,
        buffered=list(schedule.buffered),
    )


def list_schedules() -> list[Schedule]:
    """Every schedule, by id."""
    return list(get_store().schedules.all_schedules())
