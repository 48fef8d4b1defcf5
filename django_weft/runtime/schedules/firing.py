"""Firing a schedule: the tick's due fires and buffered starts, a trigger, a backfill.

The tick locks a due schedule, starts its runs and advances ``next_fire_at`` in one
transaction, so a crash in between leaves neither a duplicate nor a gap; and a start by
the fire's workflow id finds the run of a fire that did commit, so a fire is idempotent
even across separate transactions (triggers, backfills)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from ...engine import faults, observe
from ...engine.errors import WeftError
from ...engine.records import TERMINAL_STATUSES
from ...engine.registry import registry
from ...engine.run_logging import get_logger
from ...engine.schedule_firing import (
    FireAction,
    OverlapPolicy,
    decide_overlap,
    due_fires,
    workflow_id_for,
)
from ...engine.schedule_spec import InvalidSchedule, ScheduleSpec
from ...models import Schedule
from ..lifecycle import cancel
from ..operations import BACKFILL_LIMIT
from ..process import get_store
from ..starts import StartOptions, start_with
from .checking import (
    check_id,
    check_overlap,
    spec_of,
)

logger = get_logger("django_weft.schedules")

RECENT_ACTIONS = 20
"""How many of its latest actions a schedule keeps (``describe()["recent_actions"]``)."""

_STATE_FIELDS = [
    "next_fire_at", "buffered", "buffered_count", "latest_workflow_id", "fired_count", "skipped_count",
    "missed_count", "last_missed_at", "recent_actions",
]  # fmt: skip


def trigger_schedule(schedule_id: str, *, overlap: str | None = None) -> dict[str, Any]:
    """Fire now (scheduled time: now, to the second), under the schedule's overlap policy
    or ``overlap``; paused schedules can be triggered. Returns the action recorded."""
    policy = check_overlap(overlap) if overlap is not None else None
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        now = store.db_now()
        moment = now.replace(microsecond=0)
        actions = _fire(schedule, [moment], now, policy=policy, source="trigger")
        store.schedules.save_schedule(schedule, _STATE_FIELDS)
    return actions[0]


def backfill_schedule(
    schedule_id: str,
    start: datetime,
    end: datetime,
    *,
    overlap: str = OverlapPolicy.ALLOW_ALL,
) -> list[dict[str, Any]]:
    """Fire each scheduled time in ``[start, end]`` once, as if it had come (in order,
    under ``overlap``, by default ``allow_all``); a time that already has its run
    starts nothing new, so a second backfill of the same range is a no-op. A range of
    more than :data:`~django_weft.runtime.operations.BACKFILL_LIMIT` times is refused
    (``InvalidSchedule`` on ``end``) before anything starts, whichever surface asks."""
    policy = check_overlap(overlap)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(check_id(schedule_id))
        for moment, what in ((start, "start"), (end, "end")):
            if not isinstance(moment, datetime) or moment.tzinfo is None:
                raise InvalidSchedule(
                    f"backfill {what} must be a timezone-aware datetime; got {moment!r}", field=what
                )
        if end < start:
            raise InvalidSchedule(
                f"backfill end ({end.isoformat()}) is before its start ({start.isoformat()})",
                field="end",
            )
        times = list(_limited(spec_of(schedule).between(start, end), BACKFILL_LIMIT))
        actions = _fire(schedule, times, store.db_now(), policy=policy, source="backfill")
        store.schedules.save_schedule(schedule, _STATE_FIELDS)
    return actions


def _limited(times: Iterable[datetime], limit: int) -> Iterable[datetime]:
    for index, moment in enumerate(times):
        if index == limit:
            raise InvalidSchedule(
                f"the range holds more than {limit} scheduled times; backfill at most {limit} at a time: "
                "split it (a backfill is idempotent, so the pieces may overlap)",
                field="end",
            )
        yield moment


def fire_due_schedules(batch: int, pending: tuple[bool, bool] | None = None) -> int:
    """Fire the schedules due now, ``batch`` per transaction, until none is due, then
    start the buffered fires whose blocking run has finished (one pass); returns how
    many schedules were handled. Several processes may call it at once: each schedule
    is locked (``SKIP LOCKED``) by one of them.

    ``pending`` is ``(any due, any buffered)`` when the caller has read it already (the
    sweep's probe); otherwise it is read first."""
    store = get_store()
    handled = 0
    # Only the schedules of workflows registered here: a process without a workflow's code
    # (an older one during a deploy, a worker for other workflows) could not start its run
    # and would lose the fire; it leaves it due for a process that can.
    workflows = registry.workflow_names()
    any_due, any_buffered = pending if pending is not None else store.schedules.schedule_work_pending()
    # Schedules a tick left due (a cron counting a long outage's missed times, or more
    # fires than one tick starts) go on at the next tick: later batches of this one take
    # the others, which would otherwise wait behind them.
    still_due: set[str] = set()
    while any_due:
        with transaction.atomic(using=store.alias):
            now = store.db_now()
            due = store.schedules.claim_due_schedules(now, batch, workflows, passed=still_due)
            ticked = [schedule for schedule in due if _tick_one(schedule, now)]
            store.schedules.save_schedules(ticked, _STATE_FIELDS)
        handled += len(ticked)
        still_due.update(s.pk for s in ticked if s.next_fire_at is not None and s.next_fire_at <= now)
        if len(due) < batch or not ticked:  # (a batch that all failed would come back as it is)
            break
    after = ""
    while any_buffered:
        with transaction.atomic(using=store.alias):
            now = store.db_now()
            buffered = store.schedules.claim_buffered_schedules(after, batch, workflows)
            for schedule in buffered:
                if _start_buffered(schedule, now):
                    store.schedules.save_schedule(schedule, _STATE_FIELDS)
                    handled += 1
        if len(buffered) < batch:
            break
        after = buffered[-1].pk
    return handled


def _tick_one(schedule: Schedule, now: datetime) -> bool:
    """Tick one locked schedule in a savepoint of its own: one that fails (a time zone
    this process's tz database lacks, a bug) is logged and left as it was, due, without
    holding up the other schedules of the batch. ``False`` if it failed."""
    store = get_store()
    try:
        with transaction.atomic(using=store.alias):
            _tick_schedule(schedule, now)
    except Exception:
        logger.exception("schedule %s: its fire failed; it stays due and is tried again at the next tick",
                         schedule.pk)  # fmt: skip
        return False
    # Its runs are started (in this transaction); the schedule has not moved on.
    faults.hit("schedule_before_advance", schedule_id=schedule.pk)
    return True


def _start_buffered(schedule: Schedule, now: datetime) -> bool:
    """Start the oldest buffered fire if the schedule's run has finished."""
    if not schedule.buffered or _open_run(schedule):
        return False
    first, rest = schedule.buffered[0], schedule.buffered[1:]
    schedule.buffered, schedule.buffered_count = rest, len(rest)
    _start(schedule, datetime.fromisoformat(first), now, source="buffer")
    return True


def _tick_schedule(schedule: Schedule, now: datetime) -> None:
    """Start what is due for one locked schedule (its buffered fires first)."""
    _start_buffered(schedule, now)
    if schedule.next_fire_at is None or schedule.next_fire_at > now:
        return
    spec = spec_of(schedule)
    due = due_fires(spec, schedule.next_fire_at, now, schedule.catchup_window_seconds)
    if due.missed:
        count = due.missed
        if _goes_on_counting(schedule, spec):
            # The ticks of one catch-up make one action: the earlier ones' count is added.
            count += int(schedule.recent_actions[0].get("count", 0))
            schedule.recent_actions = schedule.recent_actions[1:]
        schedule.missed_count += due.missed
        schedule.last_missed_at = due.last_missed
        detail = f"{count} fire(s) older than the catch-up window" + (" so far" if due.counting else "")
        _record(schedule, {"scheduled_at": _iso(due.last_missed), "actual_at": _iso(now), "outcome": "missed",
                           "detail": detail, "count": count, "counting": due.counting})  # fmt: skip
        more = "; counting goes on at the next tick" if due.counting else ""
        logger.warning("schedule %s: %s fire(s) missed (the last at %s)%s", schedule.id, due.missed,
                       due.last_missed, more)  # fmt: skip
    _fire(schedule, due.start, now, policy=None, source="schedule")
    schedule.next_fire_at = due.next_fire_at


def _goes_on_counting(schedule: Schedule, spec: ScheduleSpec) -> bool:
    """Whether this tick's missed times continue the catch-up the newest recorded action
    is counting: its last missed time is the one before the schedule's next fire (not an
    earlier outage's, left by a pause in the middle of it)."""
    latest = schedule.recent_actions[0] if schedule.recent_actions else {}
    if latest.get("outcome") != "missed" or not latest.get("counting") or schedule.last_missed_at is None:
        return False
    return spec.next_after(schedule.last_missed_at) == schedule.next_fire_at


def _fire(
    schedule: Schedule, times: list[datetime], now: datetime, *, policy: str | None, source: str
) -> list[dict[str, Any]]:
    """Apply the overlap policy to each scheduled time in turn; return the actions."""
    actions = []
    for moment in times:
        open_run = _open_run(schedule)
        action = decide_overlap(policy or schedule.overlap, open_run=open_run is not None,
                                buffered=len(schedule.buffered))  # fmt: skip
        if action == FireAction.SKIP:
            schedule.skipped_count += 1
            actions.append(_record(schedule, {"scheduled_at": _iso(moment), "actual_at": _iso(now),
                                              "outcome": "skipped", "source": source,
                                              "detail": f"run {open_run} is still open"}))  # fmt: skip
            continue
        if action == FireAction.BUFFER:
            schedule.buffered = [*schedule.buffered, _iso(moment)]
            schedule.buffered_count = len(schedule.buffered)
            actions.append(_record(schedule, {"scheduled_at": _iso(moment), "actual_at": _iso(now),
                                              "outcome": "buffered", "source": source,
                                              "detail": f"starts when run {open_run} finishes"}))  # fmt: skip
            continue
        reason = f"schedule {schedule.id}: overlapped by the fire at {_iso(moment)}"
        if action == FireAction.CANCEL_OTHER_AND_WAIT and open_run:
            # Asked to cancel, the run may clean up first: this fire waits for it to finish.
            with contextlib.suppress(WeftError):  # it finished meanwhile
                cancel(open_run, reason, mode="request")
            schedule.buffered = [*schedule.buffered, _iso(moment)]
            schedule.buffered_count = len(schedule.buffered)
            actions.append(_record(schedule, {"scheduled_at": _iso(moment), "actual_at": _iso(now),
                                              "outcome": "buffered", "source": source,
                                              "detail": f"starts when run {open_run} finishes (asked to "
                                                        "cancel)"}))  # fmt: skip
            continue
        if action == FireAction.TERMINATE_OTHER_AND_START and open_run:
            with contextlib.suppress(WeftError):  # it finished meanwhile
                cancel(open_run, reason)
        actions.append(_start(schedule, moment, now, source=source))
    return actions


def _start(schedule: Schedule, moment: datetime, now: datetime, *, source: str) -> dict[str, Any]:
    with observe.firing(schedule.id, schedule.workflow_name):
        return _start_fire(schedule, moment, now, source=source)


def _start_fire(schedule: Schedule, moment: datetime, now: datetime, *, source: str) -> dict[str, Any]:
    workflow_id = workflow_id_for(schedule.id, moment)
    delay = spec_of(schedule).jitter_for(schedule.id, moment)
    attributes = {**schedule.search_attributes, "weft_schedule_id": schedule.id,
                  "weft_scheduled_at": _iso(moment)}  # fmt: skip
    entry: dict[str, Any] = {"scheduled_at": _iso(moment), "actual_at": _iso(now), "source": source}
    try:
        # A refused start raises before writing; the start's own savepoint covers the rest.
        started = start_with(
            schedule.workflow_name,
            schedule.args,
            schedule.kwargs,
            StartOptions(
                id=workflow_id,
                on_conflict="use_existing",
                start_delay=delay.total_seconds() or None,
                search_attributes=attributes,
            ),
        )
    except WeftError as exc:
        logger.error("schedule %s: the fire at %s could not start: %s", schedule.id, _iso(moment), exc)
        return _record(schedule, {**entry, "outcome": "error", "detail": f"{type(exc).__name__}: {exc}"})
    # The run the overlap policy looks at: a run this fire started, unless it is a backfill's
    # beside one still open (the open run stays the one later fires wait for).
    if (started.created and source != "backfill") or _open_run(schedule) is None:
        schedule.latest_workflow_id = workflow_id
    if started.created:
        schedule.fired_count += 1
        logger.info("schedule %s: started run %s (%s)", schedule.id, started.run_id, workflow_id)
    return _record(schedule, {**entry, "outcome": "started" if started.created else "already_started",
                              "run_id": started.run_id, "workflow_id": workflow_id})  # fmt: skip


def _open_run(schedule: Schedule) -> str | None:
    """The schedule's latest run if it is still open."""
    if not schedule.latest_workflow_id:
        return None
    found = get_store().schedules.latest_run_of(schedule.latest_workflow_id)
    if found is None or found[1] in TERMINAL_STATUSES:
        return None
    return found[0]


def _record(schedule: Schedule, action: dict[str, Any]) -> dict[str, Any]:
    """Every fire's action goes through here, once: kept in the schedule's recent actions
    and reported to the observers."""
    schedule.recent_actions = [action, *schedule.recent_actions][:RECENT_ACTIONS]
    observe.schedule_fired(
        schedule_id=schedule.id,
        workflow=schedule.workflow_name,
        outcome=action["outcome"],
        run_id=action.get("run_id"),
    )
    return action


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
