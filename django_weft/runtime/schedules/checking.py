"""A schedule's input checked before anything is written, the same way by every
operation (create, update, sync), and its spec as stored."""

from __future__ import annotations

import re
from typing import Any

from ...conf import weft_settings
from ...engine import codec
from ...engine.durations import Duration, parse_duration
from ...engine.errors import InvalidDuration, PayloadError
from ...engine.registry import registry
from ...engine.schedule_firing import OverlapPolicy
from ...engine.schedule_spec import InvalidSchedule, ScheduleSpec
from ...models import Schedule
from ...models.schedules import SCHEDULE_ID_MAX_LENGTH
from ..operations import SCHEDULE_NOTE

SCHEDULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
DEFAULT_CATCHUP_WINDOW = 60.0


def check_id(schedule_id: Any) -> str:
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


def check_overlap(overlap: Any) -> str:
    try:
        return OverlapPolicy(overlap).value
    except ValueError:
        choices = ", ".join(policy.value for policy in OverlapPolicy)
        raise InvalidSchedule(f"overlap must be one of {choices}; got {overlap!r}", field="overlap") from None


MIN_CATCHUP_WINDOW = 3.0
"""Seconds: a due fire is reached by the next sweep, up to a ``WEFT_TICK_INTERVAL`` (1 s by
default) and its own work later; a shorter window would count such fires as missed."""


def check_window(value: Duration) -> float:
    try:
        seconds = parse_duration(value, what="catchup_window")
    except InvalidDuration as exc:
        raise InvalidSchedule(str(exc), field="catchup_window") from None
    if seconds < MIN_CATCHUP_WINDOW:
        raise InvalidSchedule(
            f"catchup_window must be at least {MIN_CATCHUP_WINDOW:g}s (got {seconds:g}s): a fire is reached "
            "up to a tick after it is due, and a shorter window would count it as missed; keep it well "
            "above WEFT_TICK_INTERVAL",
            field="catchup_window",
        )
    return seconds


def check_start(workflow: Any, args: Any, kwargs: Any, search_attributes: Any) -> dict[str, Any]:
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


def check_note(note: Any) -> str:
    """A schedule's note, by the catalogue's rule (``None`` is not a note; "" is none)."""
    if note is None:
        raise InvalidSchedule("note must be a string; got NoneType", field="note")
    return SCHEDULE_NOTE.check(note)


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


def spec_fields(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "cron": spec.cron or "",
        "every_seconds": spec.every,
        "offset_seconds": spec.offset,
        "timezone": spec.timezone,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "jitter_seconds": spec.jitter,
    }
