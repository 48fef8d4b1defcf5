"""Schedules' rows: created, changed and deleted for the runtime's schedule functions,
and claimed by the tick with ``select_for_update(skip_locked=True)``, so several
tickers share the due schedules and each is fired by one of them at a time."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Min

from ..engine.errors import ScheduleAlreadyExists, ScheduleNotFound
from ..models import Schedule
from ..models.querysets import WorkflowRunQuerySet
from .sql import StoreSql
from .statement_parts import any_of

SYNC_LOCK = 7325
"""The advisory lock space of the declared schedules' sync (the others: 7321-7324)."""


class ScheduleRows:
    """Schedule rows; the decisions about them are the engine's (``schedule_firing``)."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def _schedules(self) -> Any:
        return Schedule.objects.using(self.sql.alias)

    def insert_schedule(self, fields: dict[str, Any]) -> Schedule:
        """Insert a schedule; ``ScheduleAlreadyExists`` if its id is taken."""
        try:
            with transaction.atomic(using=self.sql.alias):
                return self._schedules().create(**fields)
        except IntegrityError:
            if self._schedules().filter(pk=fields["id"]).exists():
                raise ScheduleAlreadyExists(
                    f"a schedule with id {fields['id']!r} exists already; update it, or delete it first"
                ) from None
            raise

    def lock_schedule(self, schedule_id: str) -> Schedule:
        """The schedule, locked until the caller's transaction ends (the tick waits)."""
        found = self._schedules().select_for_update().filter(pk=schedule_id).first()
        if found is None:
            raise ScheduleNotFound(f"no schedule with id {schedule_id!r}")
        return found

    def read_schedule(self, schedule_id: str) -> Schedule:
        found = self._schedules().filter(pk=schedule_id).first()
        if found is None:
            raise ScheduleNotFound(f"no schedule with id {schedule_id!r}")
        return found

    def lock_sync(self) -> None:
        """In the caller's transaction, wait for any other sync of the declared schedules
        to commit (PostgreSQL: a transaction-scoped advisory lock; SQLite's transactions
        hold the write lock from their start already), so two deploys syncing at once do
        not both insert a schedule that is missing."""
        if self.sql.is_postgres:
            with self.sql.connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended('schedules sync', %s))", [SYNC_LOCK]
                )

    def lock_schedules(self, schedule_ids: list[str]) -> list[Schedule]:
        """The schedules among ``schedule_ids`` that exist, locked (in id order)."""
        return list(self._schedules().select_for_update().filter(pk__in=schedule_ids).order_by("pk"))

    def managed_schedule_ids(self, *, exclude: list[str]) -> list[str]:
        """Ids of schedules declared in code (managed), except ``exclude``."""
        return list(
            self._schedules().filter(managed=True).exclude(pk__in=exclude).values_list("pk", flat=True)
        )

    def all_schedules(self) -> Any:
        return self._schedules().order_by("pk")

    def save_schedule(self, schedule: Schedule, fields: list[str]) -> None:
        """Write ``fields`` of a schedule the caller has locked."""
        schedule.save(using=self.sql.alias, update_fields=[*fields, "updated_at"])

    def save_schedules(self, schedules: list[Schedule], fields: list[str]) -> None:
        """Write ``fields`` of schedules the caller has locked, in one statement."""
        if not schedules:
            return
        now = self.sql.db_now()
        for schedule in schedules:
            schedule.updated_at = now
        self._schedules().bulk_update(schedules, [*fields, "updated_at"])

    def delete_schedule(self, schedule_id: str) -> None:
        deleted, _ = self._schedules().filter(pk=schedule_id).delete()
        if not deleted:
            raise ScheduleNotFound(f"no schedule with id {schedule_id!r}")

    def schedule_work_pending(self) -> tuple[bool, bool]:
        """``(any schedule due, any schedule holding buffered fires)``: one statement, no
        lock, no transaction, on the two partial indexes; a tick with nothing to do
        stops here."""
        now = self.sql.now_expression()
        due, buffered = self.sql.exist([self.due_schedules(now), self.buffered_schedules()])
        return due, buffered

    def due_schedules(self, now: Any) -> Any:
        """The schedules due at ``now`` (a time or the SQL clock), unlocked."""
        return self._schedules().filter(paused=False, next_fire_at__isnull=False, next_fire_at__lte=now)

    def due_by_workflow(self, now: datetime, leaving_out: Collection[str]) -> list[tuple[str, int, datetime]]:
        """``(workflow, schedules due, the oldest due time)`` for each workflow, not in
        ``leaving_out``, with schedules due at ``now``: one grouped read of the due index."""
        due = self.due_schedules(now).exclude(workflow_name__in=list(leaving_out))
        rows = due.order_by().values("workflow_name").annotate(due=Count("pk"), oldest=Min("next_fire_at"))
        return sorted((row["workflow_name"], row["due"], row["oldest"]) for row in rows)

    def buffered_schedules(self) -> Any:
        """The schedules holding buffered fires, unlocked."""
        return self._schedules().filter(buffered_count__gt=0, paused=False)

    def claim_due_schedules(
        self,
        now: datetime,
        batch: int,
        workflows: Collection[str] | None = None,
        passed: Collection[str] = (),
    ) -> list[Schedule]:
        """Lock up to ``batch`` schedules due at ``now`` (oldest first), skipping those
        another ticker holds, of the ``workflows`` given (all without), but for the ids
        ``passed`` (ticked already by this caller, still due). In the caller's transaction."""
        due = _of(self.due_schedules(now), workflows)
        if passed:
            due = due.exclude(any_of("pk", passed))
        return list(due.order_by("next_fire_at").select_for_update(skip_locked=True)[:batch])

    def claim_buffered_schedules(
        self, after: str, batch: int, workflows: Collection[str] | None = None
    ) -> list[Schedule]:
        """Lock up to ``batch`` schedules holding buffered fires, ids after ``after``
        (keyset order, so a pass over them ends), skipping those another ticker holds, of
        the ``workflows`` given (all without)."""
        buffered = _of(self.buffered_schedules(), workflows)
        return list(buffered.filter(pk__gt=after).order_by("pk").select_for_update(skip_locked=True)[:batch])

    def latest_run_of(self, workflow_id: str) -> tuple[str, str] | None:
        """``(run id, status)`` of the newest run with ``workflow_id``: the live one if any."""
        runs: WorkflowRunQuerySet = self.sql.runs().for_workflow_id(workflow_id)
        found = (runs.active().values_list("pk", "status").first()) or runs.values_list(
            "pk", "status"
        ).first()
        return (str(found[0]), str(found[1])) if found else None

    def run_statuses(self, run_ids: list[str]) -> dict[str, str]:
        """The current status of each of ``run_ids`` that still exists."""
        if not run_ids:
            return {}
        rows = self.sql.runs().filter(pk__in=run_ids).values_list("pk", "status")
        return {str(pk): str(status) for pk, status in rows}


def _of(schedules: Any, workflows: Collection[str] | None) -> Any:
    return schedules if workflows is None else schedules.filter(workflow_name__in=sorted(workflows))
