"""Finalizers: a run that ends cancelled or timed out runs its workflow's finalizer
activity at least once.

Its progress is the run's ``finalizer`` column, and its timer row (seq FINALIZER_SEQ) is
the durable backstop: due while an attempt is waiting to be sent or retried, and the
lease of a started attempt (a worker killed mid-attempt lets it come due, and the sweep
sends the next attempt).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ..conf import weft_settings
from ..engine.error_types import ErrorType
from ..engine.finalizers import (
    STARTABLE_FINALIZER_STATUSES,
    UNFINISHED_FINALIZER_STATUSES,
    FinalizerStatus,
    lost_attempt_ends,
)
from ..engine.records import (
    FINALIZER_SEQ,
    TimerKind,
)
from ..engine.registry import registry
from ..models import Timer
from .sql import StoreSql


class Finalizers:
    """A closed run's finalizer: scheduled by the close, attempts taken and recorded by workers."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def schedule_finalizer(
        self, run_pk: uuid.UUID, workflow_name: str, now: datetime
    ) -> dict[str, Any] | None:
        definition = registry.workflows.get(workflow_name)
        if definition is not None and definition.finalizer is None:
            return None
        # A workflow this process does not know may have a finalizer: the worker that
        # takes the attempt looks it up (and drops the finalizer if there is none).
        name = definition.finalizer.name if definition is not None and definition.finalizer else None
        finalizer = {"activity": name, "status": FinalizerStatus.PENDING, "attempt": 0}
        self.sql.runs().filter(pk=run_pk).update(finalizer=finalizer)
        Timer.objects.using(self.sql.alias).update_or_create(
            run_id=run_pk,
            seq=FINALIZER_SEQ,
            kind=TimerKind.FINALIZER,
            defaults={"fire_at": now, "fired_at": None},
        )
        return finalizer

    def _timers(self, workflows: Collection[str] | None) -> Any:
        timers = Timer.objects.using(self.sql.alias).filter(kind=TimerKind.FINALIZER)
        if workflows is not None:
            timers = timers.filter(run__workflow_name__in=sorted(workflows))
        return timers

    def due_finalizers(self, now: Any, workflows: Collection[str] | None = None) -> Any:
        """The finalizer timers due at ``now`` (a time or the SQL clock), of runs of
        ``workflows`` if given, unlocked."""
        return self._timers(workflows).due(now)

    def claim_due_finalizers(
        self, batch: int, resend_after: float, workflows: Collection[str] | None = None
    ) -> list[tuple[str, int]]:
        """Finalizer attempts to send: ``(run_id, attempt)`` for each due finalizer timer.
        An attempt that had started is lost (its lease ran out) and counts as made. The
        timer is pushed ``resend_after`` ahead, so a busy cluster is not sent it again
        every sweep; starting the attempt replaces that with the attempt's lease.

        With ``workflows`` (a worker's own sweep), only finalizers of runs of those
        workflows: a worker without a workflow's code would find no finalizer to run."""
        timers = self._timers(workflows)
        due: list[tuple[str, int]] = []
        with transaction.atomic(using=self.sql.alias):
            now = self.sql.db_now()
            # Run rows first, then their timers (the order start/finish_finalizer take).
            candidates = list(timers.due(now).order_by("fire_at").values_list("run_id", flat=True)[:batch])
            locked = dict(
                self.sql.runs()
                .filter(pk__in=candidates)
                .select_for_update(skip_locked=True)
                .values_list("pk", "finalizer")
            )
            rows = list(
                timers.filter(run_id__in=list(locked))
                .due(now)
                .select_for_update(skip_locked=True)
                .values_list("pk", "run_id")
            )
            for pk, run_pk in rows:
                finalizer = locked[run_pk] or {}
                if finalizer.get("status") not in UNFINISHED_FINALIZER_STATUSES:
                    timers.filter(pk=pk).delete()
                    continue
                if finalizer["status"] == FinalizerStatus.RUNNING:
                    lost = {
                        "type": ErrorType.WORKER_LOST,
                        "message": "the worker running the finalizer stopped before recording it",
                    }
                    act = registry.activities.get(str(finalizer.get("activity")))
                    policy = (act.retry if act else None) or weft_settings.DEFAULT_RETRY_POLICY
                    if lost_attempt_ends(policy, int(finalizer.get("attempt", 0))):
                        self.sql.runs().filter(pk=run_pk).update(
                            finalizer={**finalizer, "status": FinalizerStatus.FAILED, "error": lost}
                        )
                        timers.filter(pk=pk).delete()
                        continue
                    finalizer = {**finalizer, "status": FinalizerStatus.RETRYING, "error": lost}
                    self.sql.runs().filter(pk=run_pk).update(finalizer=finalizer)
                timers.filter(pk=pk).update(fire_at=now + timedelta(seconds=resend_after))
                due.append((str(run_pk), int(finalizer.get("attempt", 0)) + 1))
        return due

    def start_finalizer(self, run_id: str, attempt: int, lease: float) -> tuple[str | None, Any] | None:
        """Take attempt ``attempt`` of the run's finalizer: ``(activity name, state)``, or
        ``None`` for a duplicate or stale delivery (exactly one caller takes an attempt)."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            run = (
                self.sql.runs()
                .select_for_update()
                .filter(pk=key)
                .values("finalizer", "finalizer_state")
                .first()
            )
            if run is None:
                return None
            finalizer = run["finalizer"] or {}
            if (
                finalizer.get("status") not in STARTABLE_FINALIZER_STATUSES
                or finalizer.get("attempt", 0) != attempt - 1
            ):
                return None
            now = self.sql.db_now()
            self.sql.runs().filter(pk=key).update(
                finalizer={
                    **finalizer,
                    "status": FinalizerStatus.RUNNING,
                    "attempt": attempt,
                    "started_at": now.isoformat(),
                }
            )
            Timer.objects.using(self.sql.alias).update_or_create(
                run_id=key,
                seq=FINALIZER_SEQ,
                kind=TimerKind.FINALIZER,
                defaults={"fire_at": now + timedelta(seconds=lease), "fired_at": None},
            )
        return finalizer.get("activity"), run["finalizer_state"]

    def finish_finalizer(
        self,
        run_id: str,
        attempt: int,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        retry_in: float | None = None,
        drop: bool = False,
    ) -> bool:
        """Record the outcome of a started attempt: ``completed``, ``failed``, or
        ``retrying`` in ``retry_in`` seconds. ``False`` if the attempt is no longer current
        (its lease ran out and a later attempt was sent): nothing is recorded."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            finalizer = (
                self.sql.runs().select_for_update().filter(pk=key).values_list("finalizer", flat=True).first()
                or {}
            )
            if finalizer.get("status") != FinalizerStatus.RUNNING or finalizer.get("attempt") != attempt:
                return False
            now = self.sql.db_now()
            timers = Timer.objects.using(self.sql.alias).filter(
                run_id=key, seq=FINALIZER_SEQ, kind=TimerKind.FINALIZER
            )
            outcome: dict[str, Any] | None = {**finalizer, "finished_at": now.isoformat()}
            assert outcome is not None
            if drop:
                outcome = None  # the workflow has no finalizer after all
                timers.delete()
            elif error is None:
                outcome.update(status=FinalizerStatus.COMPLETED, result=result, error=None)
                timers.delete()
            elif retry_in is not None:
                outcome.update(status=FinalizerStatus.RETRYING, error=error)
                timers.update(fire_at=now + timedelta(seconds=retry_in), fired_at=None)
            else:
                outcome.update(status=FinalizerStatus.FAILED, error=error)
                timers.delete()
            self.sql.runs().filter(pk=key).update(finalizer=outcome)
        return True
