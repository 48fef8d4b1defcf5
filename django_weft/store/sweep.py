"""The sweep (``tick``): due timers, runnable runs and expired leases nobody dispatched,
orphaned children and parents left waiting (retention is :mod:`.retention`). Rows are taken with
``select_for_update(skip_locked=True)``, so several sweepers share the work."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from datetime import timedelta

from django.db import transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q, Value

from ..engine.records import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    RunStatus,
    StepKind,
    StepStatus,
    TimerKind,
)
from ..models import Timer
from .attempts import ActivityAttempts
from .children import Children
from .sql import StoreSql
from .transitions import LOCKED_FIELDS, RunTransitions
from .waking import Waking

logger = logging.getLogger("django_weft.store")
timer_log = logging.getLogger("django_weft.timers")


class Sweep:
    """The sweep's batches; every row is taken with ``SKIP LOCKED``."""

    def __init__(
        self,
        sql: StoreSql,
        waking: Waking,
        attempts: ActivityAttempts,
        transitions: RunTransitions,
        children: Children,
    ) -> None:
        self.sql = sql
        self.waking = waking
        self.attempts = attempts
        self.transitions = transitions
        self.children = children

    def fire_due_timers(self, batch: int) -> list[str]:
        """Fire up to ``batch`` due timers and make their runs runnable; return the run ids
        to dispatch. ``skip_locked`` lets several sweepers share the work: each timer is
        fired by exactly one of them."""
        timers = Timer.objects.using(self.sql.alias)
        with transaction.atomic(using=self.sql.alias):
            now = self.sql.db_now()
            # Find candidates without locks, then lock run rows before timer rows: the
            # same order as park and claim, so the sweep never deadlocks with a turn.
            # Finalizer timers are the finalizers' (claim_due_finalizers): their runs are finished.
            due_timers = timers.due(now).exclude(kind=TimerKind.FINALIZER)
            candidates = set(due_timers.order_by("fire_at").values_list("run_id", flat=True)[:batch])
            if not candidates:
                return []
            locked_runs = list(
                self.sql.runs()
                .filter(pk__in=candidates)
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)
            )
            due = list(
                timers.filter(run_id__in=locked_runs)
                .due(now)
                .exclude(kind=TimerKind.FINALIZER)
                .select_for_update(skip_locked=True)
                .values_list("pk", "run_id", "seq", "kind")
            )
            if not due:
                return []
            timers.filter(pk__in=[pk for pk, _, _, _ in due]).update(fired_at=now)
            for pk, run, seq, kind in due:
                timer_log.debug("fired timer %s (run %s, position %s, %s) in the sweep", pk, run, seq, kind)
            self.attempts.lose_attempts(
                [(run, seq) for _, run, seq, kind in due if kind == TimerKind.ACTIVITY], now
            )
            timed_out = self._time_out_due({run for _, run, _, kind in due if kind == TimerKind.DEADLINE})
            delayed = {run for _, run, _, kind in due if kind == Timer.Kind.DELAYED_START} - timed_out
            waking = {run for _, run, _, kind in due if kind != Timer.Kind.DELAYED_START} - timed_out
            woken = list(
                self.sql.runs()
                .filter(
                    Q(pk__in=waking, status=RunStatus.WAITING) | Q(pk__in=delayed, status=RunStatus.PENDING)
                )
                .values_list("pk", flat=True)
            )
            if woken:
                self.sql.runs().filter(pk__in=woken).update(
                    status=RunStatus.RUNNING, ready_at=now, waiting_on=None, updated_at=now
                )
            parents = set(
                self.sql.runs()
                .filter(pk__in=timed_out, parent__isnull=False)
                .values_list("parent_id", flat=True)
            )
        for parent in parents:
            with transaction.atomic(using=self.sql.alias):
                if self.waking.wake_parent(parent):
                    woken.append(parent)
        return [str(run) for run in woken]

    def wake_waiting_parents(self, batch: int) -> list[str]:
        """The sweep's backstop for child completions whose parent was not woken in the
        same transaction (a timed-out child's parent is woken after the sweep's batch):
        a parent still waiting while a child it has not recorded yet has finished."""
        finished = sorted(TERMINAL_STATUSES - {RunStatus.CONTINUED})
        candidates = list(
            self.sql.runs()
            .filter(
                status=RunStatus.WAITING,
                children__status__in=finished,
                # A child that was reset is not the child the parent waits for: its
                # replacement is (child_outcome reads the newest run at that position).
                children__reset_to__isnull=True,
                steps__kind=StepKind.CHILD,
                steps__status=StepStatus.WAITING,
                steps__seq=F("children__parent_seq"),
            )
            .values_list("pk", flat=True)
            .distinct()[:batch]
        )
        woken = []
        for parent in candidates:
            with transaction.atomic(using=self.sql.alias):
                if self.waking.wake_parent(parent):
                    woken.append(str(parent))
        return woken

    def _time_out_due(self, runs: set[uuid.UUID]) -> set[uuid.UUID]:
        """Time out the active runs among ``runs`` (locked by the caller, their deadline
        timers due): an external transition, so a worker still driving one is deposed."""
        timed_out = set()
        for run_pk in runs:
            run = self.sql.runs().filter(pk=run_pk).values(*LOCKED_FIELDS, "execution_deadline").first()
            if run is None or run["status"] not in ACTIVE_STATUSES:
                continue
            self.transitions.time_out_locked(run_pk, run, run["execution_deadline"] or self.sql.db_now())
            timed_out.add(run_pk)
            logger.info("run %s (%s %s): timed out", run_pk, run["workflow_name"], run["workflow_id"])
        return timed_out

    def claim_dispatch_batch(
        self, batch: int, redispatch_after: float, grace: float, workflows: Collection[str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Runnable runs and expired leases that nobody dispatched recently; marks them
        dispatched (so concurrent sweepers do not both send them) and returns the ids of
        both, runnable first.

        A run whose dispatch has not led to a claim is sent again after
        ``redispatch_after``, and then at growing intervals: a run is re-sent only once
        the time since its last dispatch is at least the time it had been waiting when
        it was dispatched. On a cluster that is behind, queues are not flooded with
        copies of the same work.

        With ``workflows`` (a sweep feeding its own worker's threads), only runs of those
        workflow names: a worker does not mark dispatched, to itself, runs it cannot
        claim, which would hold them back from the workers that can."""
        of_known = Q(workflow_name__in=sorted(workflows)) if workflows is not None else Q()
        with transaction.atomic(using=self.sql.alias):
            now = self.sql.db_now()
            recently = now - timedelta(seconds=redispatch_after)
            since_last = ExpressionWrapper(Value(now) - F("dispatched_at"), output_field=DurationField())

            def due(waiting_since: str) -> Q:
                return Q(dispatched_at__isnull=True) | Q(
                    dispatched_at__lt=recently,
                    waited__lte=since_last,
                    **{f"{waiting_since}__isnull": False},
                )

            def waited(waiting_since: str) -> ExpressionWrapper:
                return ExpressionWrapper(F("dispatched_at") - F(waiting_since), output_field=DurationField())

            runnable = list(
                self.sql.runs()
                .runnable()
                .alias(waited=waited("ready_at"))
                .filter(due("ready_at"), of_known)
                .select_for_update(skip_locked=True)
                .order_by("ready_at")
                .values_list("pk", flat=True)[:batch]
            )
            expired = list(
                self.sql.runs()
                .expired_leases(now, grace)
                .alias(waited=waited("lease_expires_at"))
                .filter(due("lease_expires_at"), of_known)
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[: max(batch - len(runnable), 0)]
            )
            ids = runnable + expired
            if ids:
                self.sql.runs().filter(pk__in=ids).update(dispatched_at=now)
        return [str(run) for run in runnable], [str(run) for run in expired]

    def close_orphaned_children(self, batch: int) -> list[str]:
        """The sweep's backstop for :meth:`Children.close_children` (a process that closed a parent
        and died before its children were handled): live children of finished parents
        whose policy is not "abandon"."""
        orphans = list(
            self.sql.runs()
            .filter(parent__isnull=False, status__in=list(ACTIVE_STATUSES))
            .filter(parent__status__in=sorted(TERMINAL_STATUSES))
            .exclude(parent_close_policy="abandon")
            # A "request_cancel" child sent its parent's request lives on until it finishes.
            .filter(
                ~Q(parent_close_policy="request_cancel")
                | Q(cancel_request__isnull=True)
                | ~Q(cancel_request__has_key="from_parent")
            )
            .values_list("parent_id", flat=True)
            .distinct()[:batch]
        )
        cancelled: list[str] = []
        for parent in orphans:
            cancelled += self.children.close_children(str(parent), f"its parent run {parent} closed")
        return cancelled
