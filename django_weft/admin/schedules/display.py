"""How the schedule admin shows a schedule's times, recorded actions and runs: a time in the
operator's zone and in UTC, an action's outcome as a badge, the run it started as a link,
and what it says of a schedule declared in code.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ...models import Schedule, WorkflowRun
from ..common.display import status_badge
from ..common.urls import admin_url

OUTCOME_LABELS = {
    "started": "started",
    "already_started": "already started",
    "skipped": "skipped",
    "buffered": "buffered",
    "missed": "missed",
    "error": "error",
}


def local_and_utc(value: datetime | str | None) -> tuple[str, str]:
    """A time in the operator's time zone (with its abbreviation) and in UTC."""
    if value is None:
        return "-", "-"
    if isinstance(value, str):
        parsed = as_datetime(value)
        if parsed is None:
            return value, value
        value = parsed
    return (
        date_format(timezone.localtime(value), "Y-m-d H:i:s T"),
        value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
    )


def operator_in_utc() -> bool:
    """Whether the operator's time zone is UTC (then a UTC column would repeat it)."""
    return timezone.get_current_timezone_name() in ("UTC", "Etc/UTC")


def time_columns(schedule: Schedule) -> list[tuple[str, tzinfo]]:
    """The time zones to show a schedule's fire times in: the operator's, UTC, and for a
    cron schedule its own zone (whose wall clock the expression is matched against)."""
    current = timezone.get_current_timezone_name()
    columns: list[tuple[str, tzinfo]] = [(f"your time ({current})", timezone.get_current_timezone())]
    if not operator_in_utc():
        columns.append(("UTC", UTC))
    if schedule.cron and schedule.timezone not in (current, "UTC"):
        # A zone this machine's tz database no longer has: the other columns still say it.
        with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
            columns.append((f"the schedule's ({schedule.timezone})", ZoneInfo(schedule.timezone)))
    return columns


def schedule_zone(schedule: Schedule) -> tzinfo:
    """The zone a schedule's times read best in: a cron schedule's own (its expression is
    matched against that wall clock), else the operator's."""
    if schedule.cron:
        with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
            return ZoneInfo(schedule.timezone)
    return timezone.get_current_timezone()


def schedule_moment(schedule: Schedule, value: datetime) -> SafeString:
    """A fire time of ``schedule`` on two lines, date then time with its zone: in the
    schedule's own zone for a cron schedule (whose wall clock its expression is matched
    against), else in the operator's; the operator's time and UTC on hover."""
    there = value.astimezone(schedule_zone(schedule))
    local, utc = local_and_utc(value)
    return format_html(
        '<time datetime="{}" title="{} / {} UTC" class="weft-fire-time">{}<br>{} {}</time>',
        value.astimezone(UTC).isoformat(),
        local,
        utc,
        there.strftime("%Y-%m-%d"),
        there.strftime("%H:%M:%S"),
        there.tzname() or schedule.timezone,
    )


def run_link(action: dict[str, Any], label: str | None = None) -> SafeString | str:
    """The run a recorded action started, linked (by ``label``, else its workflow id), and
    its current status."""
    run_id = action.get("run_id")
    if not run_id:
        return ""
    url = admin_url(WorkflowRun, "change", run_id)
    badge: SafeString | str = ""
    if "run_status" in action:  # described: the run's status now (None: removed by retention)
        status = action["run_status"]
        badge = (
            status_badge(status) if status else format_html('<span class="quiet">{}</span>', "no longer kept")
        )
    workflow_id = action.get("workflow_id") or run_id
    return format_html(
        '<a href="{}" class="weft-schedule-run" title="run {}">{}</a> {}',
        url,
        workflow_id,
        label or workflow_id,
        badge,
    )


def outcome_badge(outcome: str) -> SafeString:
    """A recorded action's outcome as a small badge (``weft-outcome-<outcome>``)."""
    label = OUTCOME_LABELS.get(outcome, outcome)
    return format_html(
        '<span class="weft-outcome-badge weft-outcome-{}">{}</span>', outcome.replace("_", "-"), label
    )


def managed_note(schedule: Schedule) -> SafeString:
    return format_html(
        "Declared in code (workflow {}); change it there and run <code>manage.py weft_schedules sync</code>. "
        "Here its note can be changed, and it can be paused, unpaused, triggered and backfilled.",
        schedule.workflow_name,
    )


def managed_refusal(schedule: Schedule) -> str:
    return (
        f"Schedule {schedule.pk} is declared in code (workflow {schedule.workflow_name}), so it is not "
        "deleted here: the next manage.py weft_schedules sync would create it again. Remove its "
        "declaration and run manage.py weft_schedules sync --prune."
    )


def action_row(action: dict[str, Any]) -> dict[str, Any]:
    """One row of a schedule's recent actions table."""
    scheduled, scheduled_utc = local_and_utc(action.get("scheduled_at"))
    actual, _ = local_and_utc(action.get("actual_at"))
    return {
        "scheduled": scheduled,
        "scheduled_utc": scheduled_utc,
        "actual": actual,
        "outcome": outcome_badge(str(action.get("outcome"))),
        "source": action.get("source") or "schedule",
        "detail": action.get("detail") or "",
        "run": run_link(action),
    }


def as_datetime(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


__all__ = [
    "OUTCOME_LABELS",
    "action_row",
    "as_datetime",
    "local_and_utc",
    "managed_note",
    "managed_refusal",
    "operator_in_utc",
    "outcome_badge",
    "run_link",
    "schedule_moment",
    "schedule_zone",
    "time_columns",
]
