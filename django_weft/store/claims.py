"""Claiming a run for a turn: the one conditional statement that mints the owner's epoch,
a waiting run woken by its due timers in the same transaction, a run counted by a
concurrency limit once it holds a slot, and a wake-up that reached an engine that cannot
claim the run (docs/explanation/guarantees.md, "Ownership, epochs and fencing")."""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction

from ..engine import observe
from ..engine.parking import TimerDisposition, discarded_wake_disposition, timers_surviving_collection
from ..engine.records import CancelRequest, ClaimedRun, RunStatus, StepRecord, TimerKind
from ..engine.registry import registry
from ..engine.run_logging import get_logger
from ..models import Timer
from .attempts import ActivityAttempts
from .flow import HELD, FlowControl
from .sql import StoreSql
from .statement_parts import CLAIM_COLUMNS, HOLDS_SLOT, RUN_TABLE, aware, json_value

timer_log = get_logger("django_weft.timers")

_NEEDS_SLOT: tuple[Any, ...] = ("needs a concurrency slot",)
"""What :meth:`RunClaims._claim_woken` returns for a woken run that must take a concurrency
slot before it is claimed."""


def claimed_run(run_id: str, row: Sequence[Any], steps: dict[int, StepRecord]) -> ClaimedRun:
    """The engine's view of a claim: a row of ``CLAIM_COLUMNS``, the database's time,
    the takeover flag and the due time, with the run's recorded ``steps``."""
    (workflow_id, name, args, kwargs, epoch, attempt, created_at, parent_id, attributes, cancel_request,
     priority, trace_context, db_now, takeover, due_at) = row  # fmt: skip
    request = CancelRequest.of(json_value(cancel_request))
    return ClaimedRun(
        run_id=run_id,
        workflow_id=workflow_id,
        workflow_name=name,
        args=json_value(args) or [],
        kwargs=json_value(kwargs) or {},
        epoch=int(epoch),
        attempt=int(attempt),
        created_at=aware(created_at),
        db_now=aware(db_now),
        steps=steps,
        parent_run_id=str(parent_id) if parent_id else None,
        search_attributes=json_value(attributes) or {},
        cancel_request=request if request is not None and request.pending else None,
        priority=int(priority),
        takeover=bool(takeover),
        due_at=aware(due_at) if due_at is not None else None,
        trace_context=json_value(trace_context),
    )


class RunClaims:
    """A worker's claims of runs (:meth:`claim`), for :class:`~.turns.RunTurns`."""

    def __init__(self, sql: StoreSql, attempts: ActivityAttempts, flow: FlowControl) -> None:
        self.sql = sql
        self.attempts = attempts
        self.flow = flow

    def claim(
        self, run_id: str, owner: str, ttl: float, grace: float, workflows: Collection[str] | None = None
    ) -> ClaimedRun | None:
        """Claim a runnable run, or take over one whose lease expired more than ``grace``
        seconds ago. A waiting run whose timer is due is woken and claimed at once. With
        ``workflows``, only a run of one of those names: another is left as it is (no
        write, its epoch unchanged) for a worker that has its code.

        The history is read by a statement of its own *after* the claim: a claim that
        waited for the row lock of a previous owner must see that owner's last commits,
        which a read in the claiming statement (one snapshot) would miss. The first claim
        of a run (epoch 1) skips the read: steps are only ever written under an owner's
        epoch, so a run nobody owned before has none."""
        row = self._claim_runnable(run_id, owner, ttl, grace, workflows)
        if row is None:
            # Not runnable: only a waiting or delayed run can still be claimed (woken by a
            # due timer), or a runnable one counted by a concurrency limit that has no slot
            # yet. A cheap unlocked look first spares the transaction in the common case
            # of a duplicate delivery for a run that is owned or finished.
            found = (
                self.sql.runs()
                .filter(pk=run_id)
                .values_list("status", "workflow_name", "concurrency_key", "slot", "owner_id")
                .first()
            )
            status, name, key, slot, owner_now = found if found is not None else (None, None, None, "", None)
            if workflows is not None and name is not None and name not in workflows:
                return None  # its timers stay: the worker that has the code needs them
            if status == RunStatus.RUNNING and key is not None and slot != HELD and owner_now is None:
                row = self._claim_with_slot(run_id, owner, ttl, grace, workflows, str(name), key)
            elif status in (RunStatus.WAITING, RunStatus.PENDING):
                row = self._claim_woken(run_id, owner, ttl)
                if row is _NEEDS_SLOT:  # a delayed start of a limited workflow, due now
                    row = self._claim_with_slot(run_id, owner, ttl, grace, workflows, str(name), str(key))
            else:
                self._discard_wake(run_id, status)
            if row is None:
                return None
        return claimed_run(str(run_id), row, {} if int(row[4]) == 1 else self.sql.load_steps(run_id))

    def _claim_runnable(
        self, run_id: str, owner: str, ttl: float, grace: float, workflows: Collection[str] | None = None
    ) -> tuple[Any, ...] | None:
        # One conditional statement: it takes the row lock, so two claimers serialise and
        # the second sees the first's owner. owner_epoch + 1 mints the new fencing token.
        # ``workflows`` narrows it to the names the claiming worker has: the row is found
        # by its primary key all the same, the names are one more condition on it. A run
        # counted by a concurrency limit is claimed here only once it holds a slot.
        names, names_param = "", dict[str, Any]()
        if workflows is not None:
            if self.sql.is_postgres:
                names, names_param = "AND workflow_name = ANY(%(names)s) ", {"names": sorted(workflows)}
            else:
                names = "AND workflow_name IN (SELECT value FROM json_each(%(names)s)) "
                names_param = {"names": json.dumps(sorted(workflows))}
        # The claim also reports what it took over, for the observation points: the
        # previous owner (a takeover when there was one) and when the work was due (the
        # run's ready_at, or the expired lease). PostgreSQL reads them from the row it
        # locks first in the same statement (FOR UPDATE re-reads the latest version after
        # a wait, so they are the values the update replaced); SQLite's writes are
        # serialised, and a read just before the update sees them (a claim racing
        # another on SQLite may report the other's owner: only a count is off; without an
        # observer in the process, SQLite's read is not made).
        columns = CLAIM_COLUMNS
        if self.sql.is_postgres:
            params: dict[str, Any] = {"owner": owner, "id": self.sql.run_key(run_id)}
            if self.sql.clock_in_sql:
                params.update(ttl=ttl, grace=grace)
                now_sql = "now()"
                until = "now() + %(ttl)s * interval '1 second'"
                cutoff = "now() - %(grace)s * interval '1 second'"
            else:  # a virtual clock: its time, bound
                now = self.sql.local_now()
                params.update(
                    now=self.sql.dt(now),
                    until=self.sql.dt(now + timedelta(seconds=ttl)),
                    cutoff=self.sql.dt(now - timedelta(seconds=grace)),
                )
                now_sql, until, cutoff = "%(now)s", "%(until)s", "%(cutoff)s"
            returned = ", ".join(f"{RUN_TABLE}.{column}" for column in columns.split(", "))
            sql = (
                f"WITH old AS (SELECT id, owner_id, lease_expires_at, ready_at FROM {RUN_TABLE} "
                "WHERE id = %(id)s AND status IS NOT DISTINCT FROM 'running' AND (owner_id IS NULL OR "
                f"lease_expires_at < {cutoff}) {names}{HOLDS_SLOT}"
                f"FOR UPDATE) UPDATE {RUN_TABLE} SET owner_id = %(owner)s, owner_epoch = owner_epoch + 1, "
                f"lease_expires_at = {until}, claimed_at = {now_sql}, "
                f"waiting_on = NULL, updated_at = {now_sql} FROM old WHERE {RUN_TABLE}.id = old.id "
                f"RETURNING {returned}, {now_sql}, "
                "old.owner_id IS NOT NULL, CASE WHEN old.owner_id IS NULL THEN old.ready_at "
                "ELSE old.lease_expires_at END"
            )
            # Prepared, as the step write is: planning it costs more than running it.
            return self.sql.fetch_prepared(sql, {**params, **names_param})
        # SQLite: the times are computed here and bound.
        now = self.sql.local_now()
        condition = (
            "WHERE id = %(id)s AND status = 'running' AND "
            f"(owner_id IS NULL OR lease_expires_at < %(cutoff)s) {names}{HOLDS_SLOT}"
        )
        sql = (
            f"UPDATE {RUN_TABLE} SET owner_id = %(owner)s, owner_epoch = owner_epoch + 1, "
            "lease_expires_at = %(until)s, claimed_at = %(now)s, waiting_on = NULL, "
            f"updated_at = %(now)s {condition}RETURNING {columns}, %(now)s"
        )
        params = {
            "owner": owner,
            "id": self.sql.run_key(run_id),
            "now": self.sql.dt(now),
            "until": self.sql.dt(now + timedelta(seconds=ttl)),
            "cutoff": self.sql.dt(now - timedelta(seconds=grace)),
        }
        with self.sql.connection.cursor() as cursor:
            before: tuple[Any, ...] = (None, None)
            if observe.observers():  # only observers ask: the read is spared otherwise
                cursor.execute(
                    f"SELECT owner_id, CASE WHEN owner_id IS NULL THEN ready_at ELSE lease_expires_at END "
                    f"FROM {RUN_TABLE} {condition}",
                    {**params, **names_param},
                )
                found = cursor.fetchone()
                if found is None:
                    return None
                before = tuple(found)
            cursor.execute(sql, {**params, **names_param})
            row = cursor.fetchone()
        if row is None:
            return None
        return (*row, before[0] is not None, before[1])

    def _claim_with_slot(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        grace: float,
        workflows: Collection[str] | None,
        name: str,
        key: str,
    ) -> tuple[Any, ...] | None:
        """Claim a runnable run counted by a concurrency limit once it holds a slot: it
        takes a free one, or is queued (docs/explanation/flow-control.md). A run whose
        workflow this process does not know is left for a worker that knows its limit; a
        run of a workflow known here without a limit is claimed as any run.
        Runs let in ahead of it are runnable; the sweep rings their doorbells."""
        limit = registry.concurrency_limits().get(name)
        if limit is None:
            if name not in registry.workflow_names():
                return None
            # Its workflow has no limit now (a deploy removed it): the run drops its key
            # and is claimed as any run.
            self.flow.drop_limit(name, 1, run_id=run_id)
            return self._claim_runnable(run_id, owner, ttl, grace, workflows)
        admission = self.flow.admit_on_claim(run_id, name, key, limit)
        if not admission.admitted:
            return None
        return self._claim_runnable(run_id, owner, ttl, grace, workflows)

    def _claim_woken(self, run_id: str, owner: str, ttl: float) -> tuple[Any, ...] | None:
        """Fire the due timers of a waiting run and claim it, in one transaction."""
        with transaction.atomic(using=self.sql.alias):
            run = (
                self.sql.runs()
                .select_for_update(skip_locked=True)
                .filter(pk=run_id, status__in=[RunStatus.WAITING, RunStatus.PENDING])
                .first()
            )
            if run is None:
                return None
            now = self.sql.db_now()
            # Lock order is always run row, then timer rows (the sweep and park do the
            # same), so a claim racing the sweep cannot deadlock; a timer the sweep holds
            # is skipped, and the sweep then makes the run runnable itself.
            timers = Timer.objects.using(self.sql.alias)
            # A due deadline is the sweep's: it times the run out (an external transition).
            due = list(
                timers.filter(run_id=run.pk)
                .due(now)
                .exclude(kind=TimerKind.DEADLINE)
                .select_for_update(skip_locked=True)
                .values_list("pk", "seq", "kind", "fire_at")
            )
            if not due:
                return None
            timers.filter(pk__in=[pk for pk, _, _, _ in due]).update(fired_at=now)
            for pk, seq, kind, _ in due:
                timer_log.debug("fired timer %s (run %s, position %s, %s) on claim", pk, run.pk, seq, kind)
            self.attempts.lose_attempts(
                [(run.pk, seq) for _, seq, kind, _ in due if kind == TimerKind.ACTIVITY], now
            )
            if run.concurrency_key is not None and run.slot != HELD:
                # Counted by a concurrency limit and holding no slot yet: runnable now, and
                # claimed only once it has a slot (the caller asks for one).
                self.sql.runs().filter(pk=run.pk).update(
                    status=RunStatus.RUNNING, ready_at=now, waiting_on=None, updated_at=now
                )
                return _NEEDS_SLOT
            run.owner_epoch += 1
            self.sql.runs().filter(pk=run.pk).update(
                status=RunStatus.RUNNING,
                owner_id=owner,
                owner_epoch=run.owner_epoch,
                lease_expires_at=now + timedelta(seconds=ttl),
                claimed_at=now,
                ready_at=now,
                waiting_on=None,
                updated_at=now,
            )
            return (
                run.workflow_id,
                run.workflow_name,
                run.args,
                run.kwargs,
                run.owner_epoch,
                run.attempt,
                run.created_at,
                run.parent_id,
                run.search_attributes,
                run.cancel_request,
                run.priority,
                run.trace_context,
                now,
                False,
                min(fire_at for _, _, _, fire_at in due),  # it was due when its first timer was
            )

    def _discard_wake(self, run_id: str, status: str | None) -> TimerDisposition:
        """A wake-up (a turn's doorbell, say a timer's) reached an engine that cannot claim
        the run: it is discarded, and the run's timers are kept or collected as
        :func:`~django_weft.engine.parking.discarded_wake_disposition` decides."""
        if discarded_wake_disposition(status) == TimerDisposition.KEPT:
            return TimerDisposition.KEPT
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            # Read again under the row lock: a resume and a new park in between would
            # have re-armed the very timer rows this would delete.
            status = (
                self.sql.runs().select_for_update().filter(pk=key).values_list("status", flat=True).first()
            )
            if discarded_wake_disposition(status) == TimerDisposition.KEPT:
                return TimerDisposition.KEPT
            self._collect_timers(run_id, key, status)
            return TimerDisposition.COLLECTED

    def _collect_timers(self, run_id: str, key: uuid.UUID, status: str | None) -> None:
        timers = Timer.objects.using(self.sql.alias).filter(run_id=key).unfired()
        surviving = timers_surviving_collection(status)
        if surviving:
            timers = timers.exclude(kind__in=sorted(surviving))
        collected, _ = timers.delete()
        if collected:
            timer_log.info("run %s (%s): collected %d orphaned timer(s)", run_id, status or "gone", collected)
