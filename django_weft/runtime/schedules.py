"""Schedules: recurring starts of a workflow, fired by the tick.

Each scheduled time starts a run with workflow id ``<schedule id>-<UTC time>`` (see
:func:`~django_weft.engine.schedule_firing.workflow_id_for`) and the search attributes
``weft_schedule_id`` and ``weft_scheduled_at``. The tick locks a due schedule, starts its
runs and advances ``next_fire_at`` in one transaction, so a crash in between leaves
neither a duplicate nor a gap; and a start by that workflow id finds the run of a fire
that did commit, so a fire is idempotent even across separate transactions (triggers,
backfills).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine import codec, faults
from ..engine.durations import Duration, parse_duration
from ..engine.errors import InvalidDuration, PayloadError, ScheduleManaged, WeftError
from ..engine.records import TERMINAL_STATUSES
from ..engine.registry import registry
from ..engine.schedule_firing import (
    FireAction,
    OverlapPolicy,
    decide_overlap,
    due_fires,
    workflow_id_for,
)
from ..engine.schedule_spec import InvalidSchedule, ScheduleSpec
from ..models import Schedule
from ..models.schedules import SCHEDULE_ID_MAX_LENGTH
from .lifecycle import cancel
from .process import get_store
from .starts import StartOptions, start_with

logger = logging.getLogger("django_weft.schedules")

RECENT_ACTIONS = 20
"""How many of its latest actions a schedule keeps (``describe()["recent_actions"]``)."""

SCHEDULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
DEFAULT_CATCHUP_WINDOW = 60.0
BACKFILL_LIMIT = 10_000
"""The most scheduled times one backfill call fires."""
OPERATOR_OPTIONS = frozenset({"note"})
"""What :func:`update_schedule` changes on a schedule declared in code even with
``refuse_managed``: its declaration sets everything else (pausing is separate)."""


# -- checking input ------------------------------------------------------------------------


def _check_id(schedule_id: Any) -> str:
    if not isinstance(schedule_id, str) or not SCHEDULE_ID.fullmatch(schedule_id):
        raise InvalidSchedule(
            "a schedule id is letters, digits, '-' and '_', starting with a letter or digit; "
            f"got {schedule_id!r}",
            field="id",
        )
    if len(schedule_id) > SCHEDULE_ID_MAX_LENGTH:
        raise InvalidSchedule(
            f"a schedule id is at most {SCHEDULE_ID_MAX_LENGTH} characters; got {len(schedule_id)}",
            field="id",
        )
    return schedule_id


def _check_overlap(overlap: Any) -> str:
    try:
        return OverlapPolicy(overlap).value
    except ValueError:
        choices = ", ".join(policy.value for policy in OverlapPolicy)
        raise InvalidSchedule(f"overlap must be one of {choices}; got {overlap!r}", field="overlap") from None


def _check_window(value: Duration) -> float:
    try:
        return parse_duration(value, what="catchup_window")
    except InvalidDuration as exc:
        raise InvalidSchedule(str(exc), field="catchup_window") from None


def _check_start(workflow: Any, args: Any, kwargs: Any, search_attributes: Any) -> dict[str, Any]:
    """The run fields every fire uses, checked as a start would check them."""
    name = getattr(workflow, "name", workflow)
    definition = registry.get_workflow(name)
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, list | tuple):
        raise InvalidSchedule(f"args must be a list; got {type(args).__name__}", field="args")
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise InvalidSchedule("kwargs must be a dict with string keys", field="kwargs")
    attributes = {} if search_attributes is None else search_attributes
    if not isinstance(attributes, dict):
        raise InvalidSchedule("search_attributes must be a dict", field="search_attributes")
    reserved = sorted(key for key in attributes if str(key).startswith("weft_"))
    if reserved:
        raise InvalidSchedule(
            f"search attributes starting with 'weft_' are set by the schedule: {', '.join(reserved)}",
            field="search_attributes",
        )
    args_value = _json(list(args), "args")
    kwargs_value = _json(kwargs, "kwargs")
    definition.check_arguments(args_value, kwargs_value)
    return {
        "workflow_name": definition.name,
        "args": args_value,
        "kwargs": kwargs_value,
        "search_attributes": _json(attributes, "search_attributes"),
    }


def _json(value: Any, what: str) -> Any:
    """The value as each fire's start will see it, within ``WEFT_MAX_PAYLOAD_BYTES``: a
    schedule refuses at once what its runs would be refused."""
    try:
        return codec.loads(codec.dumps(value, what=what, limit=weft_settings.MAX_PAYLOAD_BYTES))
    except PayloadError as exc:
        raise InvalidSchedule(str(exc), field=what) from None


def _check_note(note: Any) -> str:
    if not isinstance(note, str):
        raise InvalidSchedule(f"note must be a string; got {type(note).__name__}", field="note")
    _json(note, "note")  # no NUL, no lone surrogate: text the database can store
    return note


def spec_of(schedule: Schedule) -> ScheduleSpec:
    """The schedule's spec as stored (checked when it was written)."""
    return ScheduleSpec(
        cron=schedule.cron or None,
        every=schedule.every_seconds,
        offset=schedule.offset_seconds,
        timezone=schedule.timezone,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
        jitter=schedule.jitter_seconds,
    )


def _spec_fields(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "cron": spec.cron or "",
        "every_seconds": spec.every,
        "offset_seconds": spec.offset,
        "timezone": spec.timezone,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "jitter_seconds": spec.jitter,
    }


# -- the client's operations -----------------------------------------------------------------


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
    schedule_id = _check_id(schedule_id)
    spec = ScheduleSpec.build(
        cron=cron,
        every=every,
        offset=offset,
        timezone=timezone,
        start_at=start_at,
        end_at=end_at,
        jitter=jitter,
    )
    run_fields = _check_start(workflow, args, kwargs, search_attributes)
    note = _check_note(note)
    store = get_store()
    now = store.db_now()
    schedule = store.schedules.insert_schedule(
        {
            "id": schedule_id,
            **run_fields,
            **_spec_fields(spec),
            "overlap": _check_overlap(overlap),
            "catchup_window_seconds": _check_window(catchup_window),
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
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
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
            fields.update(_spec_fields(spec))
            if not schedule.paused:
                fields["next_fire_at"] = spec.next_after(store.db_now())
        if {"workflow", "args", "kwargs", "search_attributes"} & set(changes):
            fields.update(
                _check_start(
                    changes.get("workflow", schedule.workflow_name),
                    changes.get("args", schedule.args),
                    changes.get("kwargs", schedule.kwargs),
                    changes.get("search_attributes", schedule.search_attributes),
                )
            )
        if "overlap" in changes:
            fields["overlap"] = _check_overlap(changes["overlap"])
        if "catchup_window" in changes:
            fields["catchup_window_seconds"] = _check_window(changes["catchup_window"])
        if "note" in changes:
            fields["note"] = _check_note(changes["note"])
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
    note = _check_note(note)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
        schedule.paused, schedule.note = True, note
        store.schedules.save_schedule(schedule, ["paused", "note"])
    logger.info("schedule %s: paused%s", schedule_id, f" ({note})" if note else "")
    return schedule


def unpause_schedule(schedule_id: str, note: str = "") -> Schedule:
    """Fire again, from the spec's next time after now; ``note`` replaces the pause's."""
    note = _check_note(note)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
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
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
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


def trigger_schedule(schedule_id: str, *, overlap: str | None = None) -> dict[str, Any]:
    """Fire now (scheduled time: now, to the second), under the schedule's overlap policy
    or ``overlap``; paused schedules can be triggered. Returns the action recorded."""
    policy = _check_overlap(overlap) if overlap is not None else None
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
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
    limit: int = BACKFILL_LIMIT,
) -> list[dict[str, Any]]:
    """Fire each scheduled time in ``[start, end]`` once, as if it had come (in order,
    under ``overlap``, by default ``allow_all``); a time that already has its run
    starts nothing new, so a second backfill of the same range is a no-op. A range of
    more than ``limit`` times is refused (``InvalidSchedule``) before anything starts."""
    policy = _check_overlap(overlap)
    store = get_store()
    with transaction.atomic(using=store.alias):
        schedule = store.schedules.lock_schedule(_check_id(schedule_id))
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
        times = list(_limited(spec_of(schedule).between(start, end), limit))
        actions = _fire(schedule, times, store.db_now(), policy=policy, source="backfill")
        store.schedules.save_schedule(schedule, _STATE_FIELDS)
    return actions


def _limited(times: Iterable[datetime], limit: int) -> Iterable[datetime]:
    for index, moment in enumerate(times):
        if index == limit:
            raise InvalidSchedule(
                f"the backfill range holds more than {limit} scheduled times; split it", field="end"
            )
        yield moment


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


def describe_schedule(schedule_id: str, *, next_count: int = 5) -> ScheduleDescription:
    """The schedule's next fire times, its recent actions (with each run's current
    status as ``run_status`` where it started one) and its counters."""
    schedule = get_store().schedules.read_schedule(_check_id(schedule_id))
    return describe_schedules([schedule], next_count=next_count)[0]


def describe_schedules(schedules: Sequence[Schedule], *, next_count: int = 5) -> list[ScheduleDescription]:
    """:func:`describe_schedule` of rows already read (a page of a listing), with one
    query for the statuses of all their recent runs."""
    run_ids = [a["run_id"] for schedule in schedules for a in schedule.recent_actions if a.get("run_id")]
    statuses = get_store().schedules.run_statuses(run_ids)
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


# -- the tick ----------------------------------------------------------------------------------

_STATE_FIELDS = [
    "next_fire_at", "buffered", "buffered_count", "latest_workflow_id", "fired_count", "skipped_count",
    "missed_count", "last_missed_at", "recent_actions",
]  # fmt: skip


def fire_due_schedules(batch: int) -> int:
    """Fire the schedules due now, ``batch`` per transaction, until none is due, then
    start the buffered fires whose blocking run has finished (one pass); returns how
    many schedules were handled. Several processes may call it at once: each schedule
    is locked (``SKIP LOCKED``) by one of them."""
    store = get_store()
    handled = 0
    any_due, any_buffered = store.schedules.schedule_work_pending()
    while any_due:
        with transaction.atomic(using=store.alias):
            now = store.db_now()
            due = store.schedules.claim_due_schedules(now, batch)
            for schedule in due:
                _tick_schedule(schedule, now)
                # Its runs are started (in this transaction); the schedule has not moved on.
                faults.hit("schedule_before_advance", schedule_id=schedule.pk)
            store.schedules.save_schedules(due, _STATE_FIELDS)
        handled += len(due)
        if len(due) < batch:
            break
    after = ""
    while any_buffered:
        with transaction.atomic(using=store.alias):
            now = store.db_now()
            buffered = store.schedules.claim_buffered_schedules(after, batch)
            for schedule in buffered:
                if _start_buffered(schedule, now):
                    store.schedules.save_schedule(schedule, _STATE_FIELDS)
                    handled += 1
        if len(buffered) < batch:
            break
        after = buffered[-1].pk
    return handled


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
    due = due_fires(spec_of(schedule), schedule.next_fire_at, now, schedule.catchup_window_seconds)
    if due.missed:
        schedule.missed_count += due.missed
        schedule.last_missed_at = due.last_missed
        _record(schedule, {"scheduled_at": _iso(due.last_missed), "actual_at": _iso(now), "outcome": "missed",
                           "detail": f"{due.missed} fire(s) older than the catch-up window"})  # fmt: skip
        logger.warning(
            "schedule %s: %s fire(s) missed (the last at %s)", schedule.id, due.missed, due.last_missed
        )
    _fire(schedule, due.start, now, policy=None, source="schedule")
    schedule.next_fire_at = due.next_fire_at


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
        if action in (FireAction.CANCEL_OTHER_AND_START, FireAction.TERMINATE_OTHER_AND_START) and open_run:
            with contextlib.suppress(WeftError):  # it finished meanwhile
                cancel(open_run, f"schedule {schedule.id}: overlapped by the fire at {_iso(moment)}")
        actions.append(_start(schedule, moment, now, source=source))
    return actions


def _start(schedule: Schedule, moment: datetime, now: datetime, *, source: str) -> dict[str, Any]:
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
    schedule.recent_actions = [action, *schedule.recent_actions][:RECENT_ACTIONS]
    return action


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- schedules declared in code --------------------------------------------------------------

_SPEC_FIELDS = ("cron", "every_seconds", "offset_seconds", "timezone", "start_at", "end_at", "jitter_seconds")


@dataclass
class SyncReport:
    """What :func:`sync_schedules` did (or would do, with ``dry_run``), by schedule id."""

    created: list[str] = field(default_factory=list)
    updated: dict[str, list[str]] = field(default_factory=dict)
    """Changed schedules with the fields that changed."""
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    """Declared in code, but an unmanaged schedule (made by hand) has that id: left alone."""
    deleted: list[str] = field(default_factory=list)


def declared_schedules() -> dict[str, tuple[str, Any]]:
    """``{schedule id: (workflow name, declaration)}`` of every registered workflow;
    raises ``InvalidSchedule`` when two declarations share an id."""
    found: dict[str, tuple[str, Any]] = {}
    for name, definition in sorted(registry.workflows.items()):
        for declaration in definition.schedules:
            if declaration.id in found:
                raise InvalidSchedule(
                    f"schedule id {declaration.id!r} is declared by both "
                    f"{found[declaration.id][0]} and {name}"
                )
            found[declaration.id] = (name, declaration)
    return found


def _declared_fields(schedule_id: str, workflow: str, options: dict[str, Any]) -> dict[str, Any]:
    spec_keys = ("cron", "every", "offset", "timezone", "start_at", "end_at", "jitter")
    spec = ScheduleSpec.build(**{key: options.get(key) for key in spec_keys})
    return {
        **_check_start(
            workflow, options.get("args"), options.get("kwargs"), options.get("search_attributes")
        ),
        **_spec_fields(spec),
        "overlap": _check_overlap(options.get("overlap", OverlapPolicy.SKIP)),
        "catchup_window_seconds": _check_window(options.get("catchup_window", DEFAULT_CATCHUP_WINDOW)),
        "managed": True,
    }


def sync_schedules(*, prune: bool = False, dry_run: bool = False) -> SyncReport:
    """Make the database's managed schedules match the declarations in code: create the
    missing ones, update changed ones (a changed spec takes effect from its next time
    after now), leave schedules made by hand alone (reported as conflicts), and with
    ``prune`` delete managed schedules no longer declared. Pausing and the note are the
    operators' and are not touched (a declared note is only the initial one).
    Everything is checked before anything is written."""
    declared = declared_schedules()
    wanted = {
        sid: _declared_fields(_check_id(sid), workflow, decl.options)
        for sid, (workflow, decl) in declared.items()
    }
    report = SyncReport()
    store = get_store()
    with transaction.atomic(using=store.alias):
        now = store.db_now()
        existing = {s.pk: s for s in store.schedules.lock_schedules(list(wanted))}
        for schedule_id, fields in wanted.items():
            current = existing.get(schedule_id)
            if current is None:
                report.created.append(schedule_id)
                if not dry_run:
                    spec = ScheduleSpec(**{key: fields[name] for key, name in _SPEC_ARGUMENTS})
                    note = str(declared[schedule_id][1].options.get("note") or "")  # then the operators'
                    store.schedules.insert_schedule(
                        {"id": schedule_id, **fields, "note": note, "next_fire_at": spec.next_after(now)}
                    )
                continue
            if not current.managed:
                report.conflicts.append(schedule_id)
                continue
            changed = sorted(name for name, value in fields.items() if getattr(current, name) != value)
            if not changed:
                report.unchanged.append(schedule_id)
                continue
            report.updated[schedule_id] = changed
            if dry_run:
                continue
            for name in changed:
                setattr(current, name, fields[name])
            if set(changed) & set(_SPEC_FIELDS) and not current.paused:
                current.next_fire_at = spec_of(current).next_after(now)
                changed.append("next_fire_at")
            store.schedules.save_schedule(current, changed)
        if prune:
            for schedule_id in store.schedules.managed_schedule_ids(exclude=list(wanted)):
                report.deleted.append(schedule_id)
                if not dry_run:
                    store.schedules.delete_schedule(schedule_id)
    return report


_SPEC_ARGUMENTS = (
    ("cron", "cron"), ("every", "every_seconds"), ("offset", "offset_seconds"), ("timezone", "timezone"),
    ("start_at", "start_at"), ("end_at", "end_at"), ("jitter", "jitter_seconds"),
)  # fmt: skip


def list_schedules() -> list[Schedule]:
    """Every schedule, by id."""
    return list(get_store().schedules.all_schedules())
