"""Schedules declared in code (``@workflow(schedules=[...])``), made to match the
database's managed schedules by ``weft_schedules sync``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ...engine.registry import registry
from ...engine.schedule_firing import OverlapPolicy
from ...engine.schedule_spec import InvalidSchedule, ScheduleSpec
from ..process import get_store
from .checking import (
    DEFAULT_CATCHUP_WINDOW,
    check_id,
    check_overlap,
    check_start,
    check_window,
    spec_fields,
    spec_of,
)

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
        **check_start(workflow, options.get("args"), options.get("kwargs"), options.get("search_attributes")),
        **spec_fields(spec),
        "overlap": check_overlap(options.get("overlap", OverlapPolicy.SKIP)),
        "catchup_window_seconds": check_window(options.get("catchup_window", DEFAULT_CATCHUP_WINDOW)),
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
        sid: _declared_fields(check_id(sid), workflow, decl.options)
        for sid, (workflow, decl) in declared.items()
    }
    report = SyncReport()
    store = get_store()
    with transaction.atomic(using=store.alias):
        store.schedules.lock_sync()  # a sync running at once (another deploy) commits first
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
