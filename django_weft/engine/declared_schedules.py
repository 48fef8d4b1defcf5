"""Schedules declared in code, next to their workflow::

    @workflow(name="reports.nightly", schedules=[
        schedule("nightly-report", cron="0 2 * * *", timezone="Europe/Oslo", overlap="skip"),
    ])
    def nightly_report(ctx): ...

``manage.py weft_schedules sync`` creates them, or updates them to match the code, and
marks them *managed*: the admin shows their spec read-only, so an edit there cannot
silently fight the next sync (pausing stays an operator's choice and sync leaves it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .durations import Duration
from .schedule_firing import OverlapPolicy
from .schedule_spec import InvalidSchedule, ScheduleSpec


@dataclass(frozen=True)
class DeclaredSchedule:
    """A schedule as the code declares it; :func:`schedule` builds and checks one."""

    id: str
    options: dict[str, Any] = field(default_factory=dict)
    """The keyword arguments of ``client.create_schedule`` (no workflow: the decorated one)."""


def schedule(
    schedule_id: str,
    *,
    cron: str | None = None,
    every: Duration | None = None,
    offset: Duration | None = None,
    timezone: str | None = None,
    args: list[Any] | tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    overlap: str = OverlapPolicy.SKIP,
    catchup_window: Duration = 60,
    jitter: Duration | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    search_attributes: dict[str, Any] | None = None,
    note: str = "",
) -> DeclaredSchedule:
    """Declare a schedule of the workflow it is given to (``@workflow(schedules=[...])``).
    The spec is checked now (``InvalidSchedule`` at import), the rest by the sync."""
    ScheduleSpec.build(
        cron=cron,
        every=every,
        offset=offset,
        timezone=timezone,
        start_at=start_at,
        end_at=end_at,
        jitter=jitter,
    )
    try:
        OverlapPolicy(overlap)
    except ValueError:
        choices = ", ".join(policy.value for policy in OverlapPolicy)
        raise InvalidSchedule(f"overlap must be one of {choices}; got {overlap!r}") from None
    options = {
        "cron": cron, "every": every, "offset": offset, "timezone": timezone,
        "args": list(args or []), "kwargs": dict(kwargs or {}), "overlap": str(overlap),
        "catchup_window": catchup_window, "jitter": jitter, "start_at": start_at, "end_at": end_at,
        "search_attributes": dict(search_attributes or {}), "note": note,
    }  # fmt: skip
    return DeclaredSchedule(id=schedule_id, options=options)
