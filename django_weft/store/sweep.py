"""The sweep (``tick``): due timers, runnable runs and expired leases nobody dispatched,
orphaned children and parents left waiting (retention is :mod:`.retention`). Rows are taken with
``select_for_update(skip_locked=True)``, so several sweepers share the work."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Value

from ..engine import observe
from ..engine.records import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    ClaimedRun,
    RunStatus,
    StepKind,
    StepStatus,
    TimerKind,
)
from ..engine.run_logging import get_logger
from ..models import Timer
from .attempts import ActivityAttempts
from .children import Children
from .claims import claimed_run
from .sql import StoreSql
from .statement_parts import CLAIM_COLUMNS, HOLDS_SLOT, RUN_TABLE, any_of
from .transitions import LOCKED_FIELDS, RunTransitions
from .waking import Waking

logger = get_logger("django_weft.store")
timer_log = get_logger("django_weft.timers")


class DispatchBatch(NamedTuple):
    """What :meth:`Sweep.claim_dispatch_batch` marked dispatched, or claimed."""

    runnable: list[str]
    expired: list[str]
    priorities: dict[str, int]
    """The priority of each run whose priority is not 0, runnable or taken over."""
    claimed: tuple[ClaimedRun, ...] = ()
    """Runnable runs claimed for the sweep's own engine (``claim_as``), in the order they
    were taken; not in ``runnable``."""


class ClaimAs(NamedTuple):
    """The engine a sweep claims runnable runs for (``weft_worker``'s own): its id, its
    lease, how many runs at most (the rest are only sent) and the workflows it has."""

    owner: str
    ttl: float
    limit: int
    workflows: Collection[str] | None = None


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
            due_timers = self.due_timers(now).order_by("fire_at")
            candidates = set(due_timers.values_list("run_id", flat=True)[:batch])
            if not candidates:
                return []
            # With each run, the trace context its start stored (the timer's span joins its trace).
            locked_runs = dict(
                self.sql.runs()
                .filter(any_of("pk", candidates))
                .select_for_update(skip_locked=True)
                .values_list("pk", "trace_context")
            )
            due = list(
                self.due_timers(now)
                .filter(any_of("run_id", locked_runs))
                .select_for_update(skip_locked=True)
                .values_list("pk", "run_id", "seq", "kind", "fire_at")
            )
            if not due:
                return []
            timers.filter(any_of("pk", [pk for pk, _, _, _, _ in due])).update(fired_at=now)
            for pk, run, seq, kind, _ in due:
                timer_log.debug("fired timer %s (run %s, position %s, %s) in the sweep", pk, run, seq, kind)
            self.attempts.lose_attempts(
                [(run, seq) for _, run, seq, kind, _ in due if kind == TimerKind.ACTIVITY], now
            )
            timed_out = self._time_out_due({run for _, run, _, kind, _ in due if kind == TimerKind.DEADLINE})
            delayed = {run for _, run, _, kind, _ in due if kind == Timer.Kind.DELAYED_START} - timed_out
            waking = {run for _, run, _, kind, _ in due if kind != Timer.Kind.DELAYED_START} - timed_out
            woken = list(
                self.sql.runs()
                .filter(
                    (any_of("pk", waking) & Q(status=RunStatus.WAITING))
                    | (any_of("pk", delayed) & Q(status=RunStatus.PENDING))
                )
                .values_list("pk", flat=True)
            )
            if woken:
                self.sql.runs().filter(any_of("pk", woken)).update(
                    status=RunStatus.RUNNING, ready_at=now, waiting_on=None, updated_at=now
                )
            parents = set(
                self.sql.runs()
                .filter(pk__in=timed_out, parent__isnull=False)
                .values_list("parent_id", flat=True)
            )
        for _, run, seq, kind, fire_at in due:
            observe.timer_fired(
                run_id=str(run),
                seq=seq,
                kind=kind,
                fire_at=fire_at,
                fired_at=now,
                carrier=locked_runs.get(run),
            )
        for parent in parents:
            with transaction.atomic(using=self.sql.alias):
                if self.waking.wake_parent(parent):
                    woken.append(parent)
        return [str(run) for run in woken]

    def due_timers(self, now: Any) -> Any:
        """The timers due at ``now`` (a time or the SQL clock) that the sweep fires,
        unlocked. Finalizer timers are the finalizers' (``claim_due_finalizers``)."""
        return Timer.objects.using(self.sql.alias).due(now).exclude(kind=TimerKind.FINALIZER)

    def waiting_parents(self) -> Any:
        """Parents still waiting on a child position whose child has finished, unlocked."""
        finished = sorted(TERMINAL_STATUSES - {RunStatus.CONTINUED})
        return self.sql.runs().filter(
            status=RunStatus.WAITING,
            # Said outright, though the join implies it: the children are then read from
            # the index of runs that have a parent, not from every finished run.
            children__parent__isnull=False,
            children__status__in=finished,
            # A child that was reset is not the child the parent waits for: its
            # replacement is (child_outcome reads the newest run at that position).
            children__reset_to__isnull=True,
            steps__kind=StepKind.CHILD,
            steps__status=StepStatus.WAITING,
            steps__seq=F("children__parent_seq"),
        )

    def wake_waiting_parents(self, batch: int) -> list[str]:
        """The sweep's backstop for child completions whose parent was not woken in the
        same transaction (a timed-out child's parent is woken after the sweep's batch):
        a parent still waiting while a child it has not recorded yet has finished."""
        candidates = list(self.waiting_parents().values_list("pk", flat=True).distinct()[:batch])
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

    def sample_queues(self) -> observe.QueueSample:
        """The work waiting, for gauges, from indexes only: active runs per status (the
        status index's active range), terminal runs per status (PostgreSQL: estimated
        from the planner's statistics, ``pg_class.reltuples`` times the status's share in
        ``pg_stats``; SQLite: counted), due timers and the oldest due timer (the partial
        index on unfired timers), the oldest runnable run (the runnable runs' partial
        index) and the runs queued for a concurrency slot (the flow queue's)."""
        now = self.sql.db_now()
        runs = self.sql.runs().order_by()
        counts = {str(status): 0 for status in RunStatus}
        for status, number in (
            runs.filter(status__in=sorted(ACTIVE_STATUSES)).values_list("status").annotate(n=Count("pk"))
        ):
            counts[status] = number
        estimated: frozenset[str] = frozenset()
        if self.sql.is_postgres:
            estimates = self._terminal_estimates()
            counts.update(estimates)
            estimated = frozenset(str(status) for status in TERMINAL_STATUSES)
        else:
            for status, number in (
                runs.filter(status__in=sorted(TERMINAL_STATUSES))
                .values_list("status")
                .annotate(n=Count("pk"))
            ):
                counts[status] = number
        timers = (
            Timer.objects.using(self.sql.alias)
            .order_by()
            .due(now)
            .aggregate(n=Count("pk"), oldest=Min("fire_at"))
        )
        oldest_runnable = runs.runnable().aggregate(oldest=Min("ready_at"))["oldest"]
        due = [moment for moment in (timers["oldest"], oldest_runnable) if moment is not None]
        queued: dict[tuple[str, str], int] = {}
        for name, key, number in (
            runs.filter(slot="queued", status=RunStatus.PENDING)
            .values_list("workflow_name", "concurrency_key")
            .annotate(n=Count("pk"))
        ):
            queued[(name, key or "")] = number
        return observe.QueueSample(
            read_at=now,
            runs_by_status=counts,
            estimated=estimated,
            due_timers=timers["n"],
            oldest_due_age=max(0.0, (now - min(due)).total_seconds()) if due else None,
            queued_by_key=queued,
        )

    def _terminal_estimates(self) -> dict[str, int]:
        """Terminal runs per status as PostgreSQL's statistics see them (as of the last
        ``ANALYZE``): the table's estimated rows times each status's frequency among its
        most common values. Statuses the statistics do not list are left out."""
        table = self.sql.runs().model._meta.db_table
        with self.sql.connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname "
                "AND s.attname = 'status' WHERE c.relname = %s AND n.nspname = ANY(current_schemas(false))",
                [table],
            )
            row = cursor.fetchone()
        if row is None or row[1] is None or row[0] is None or row[0] < 0:
            return {}
        total, values, shares = row
        return {
            str(value): round(total * share)
            for value, share in zip(values, shares, strict=False)
            if value in TERMINAL_STATUSES
        }

    def runnable_runs(self, workflows: Collection[str] | None = None) -> Any:
        """Runs a worker may claim now (of ``workflows`` if given), unlocked."""
        return self.sql.runs().runnable().filter(_of(workflows))

    def expired_runs(self, now: Any, grace: float, workflows: Collection[str] | None = None) -> Any:
        """Owned runs whose lease expired ``grace`` seconds before ``now`` (of
        ``workflows`` if given), unlocked."""
        return self.sql.runs().expired_leases(now, grace).filter(_of(workflows))

    def claim_dispatch_batch(
        self,
        batch: int,
        redispatch_after: float,
        grace: float,
        workflows: Collection[str] | None = None,
        *,
        claim_as: ClaimAs | None = None,
    ) -> DispatchBatch:
        """Runnable runs and expired leases that nobody dispatched recently, ``batch`` at
        most and an expired lease whenever there is one (one over the batch if the
        runnable runs filled it); marks them dispatched (so concurrent sweepers do not
        both send them) and returns the ids of both, runnable first, the runnable ones
        higher priority first and then the longest waiting, with the priorities of those
        that have one.

        A run whose dispatch has not led to a claim is sent again after
        ``redispatch_after``, and then at growing intervals: a run is re-sent only once
        the time since its last dispatch is at least the time it had been waiting when
        it was dispatched. On a cluster that is behind, queues are not flooded with
        copies of the same work.

        With ``workflows`` (a sweep feeding its own worker's threads), only runs of those
        workflow names: a worker does not mark dispatched, to itself, runs it cannot
        claim, which would hold them back from the workers that can.

        With ``claim_as`` (PostgreSQL; a sweep feeding its own threads), the runnable runs
        are claimed for that engine in the same transaction, their histories read, and
        returned as ``claimed``: one statement for the batch instead of a claim and a
        history read per run (:meth:`_claim_locked`). Expired leases are only dispatched:
        their claim is a takeover, made by the thread that takes it."""
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
                self.runnable_runs(workflows)
                .alias(waited=waited("ready_at"))
                .filter(due("ready_at"))
                .select_for_update(skip_locked=True)
                # created_at breaks ties: SQLite's now() has millisecond steps, so runs
                # started together share a ready_at, and would leave in any order.
                .order_by("-priority", "ready_at", "created_at")
                .values_list("pk", "priority")[:batch]
            )
            # At least one expired lease per sweep, beyond the batch if the runnable runs
            # filled it: a run its worker lost is not left behind a backlog for as long
            # as the backlog lasts (a worker's sweep may dispatch only a few at a time).
            expired = list(
                self.expired_runs(now, grace, workflows)
                .alias(waited=waited("lease_expires_at"))
                .filter(due("lease_expires_at"))
                .select_for_update(skip_locked=True)
                .values_list("pk", "priority")[: max(batch - len(runnable), min(batch, 1))]
            )
            claimed: tuple[ClaimedRun, ...] = ()
            if claim_as is not None and runnable and self.sql.is_postgres:
                claimed = self._claim_locked([pk for pk, _ in runnable][: claim_as.limit], claim_as, now)
                taken = {uuid.UUID(run.run_id) for run in claimed}
                runnable = [(pk, priority) for pk, priority in runnable if pk not in taken]
            ids = [pk for pk, _ in runnable] + [pk for pk, _ in expired]
            if ids:
                self.sql.runs().filter(any_of("pk", ids)).update(dispatched_at=now)
        return DispatchBatch(
            [str(run) for run, _ in runnable],
            [str(run) for run, _ in expired],
            {str(run): priority for run, priority in runnable + expired if priority},
            claimed,
        )

    def _claim_locked(
        self, keys: list[uuid.UUID], claim_as: ClaimAs, now: datetime
    ) -> tuple[ClaimedRun, ...]:
        """Claim the runnable runs ``keys`` (locked by the caller's transaction, in the
        order given) for ``claim_as``, as :meth:`RunClaims.claim
        <django_weft.store.claims.RunClaims.claim>` claims one: a runnable run of one of
        its workflows, a new epoch, the lease, ``claimed_at``; a run counted by a
        concurrency limit only if it holds a slot. Its time is the database's when the
        rows are written (the transaction's began before the batch was read). Then read
        their histories, in the same transaction: the claim waited for no lock (the rows
        were taken with ``SKIP LOCKED``), and a previous owner's steps were committed
        before its run became runnable. Returns them in the order of ``keys``."""
        params: dict[str, Any] = {"owner": claim_as.owner, "ids": keys, "ttl": claim_as.ttl}
        if self.sql.clock_in_sql:
            moment = "clock_timestamp()"
        else:  # a virtual clock: its time, bound
            moment, params["now"] = "%(now)s::timestamptz", self.sql.dt(now)
        names = ""
        if claim_as.workflows is not None:
            names, params["names"] = "AND workflow_name = ANY(%(names)s) ", sorted(claim_as.workflows)
        sql = (
            f"UPDATE {RUN_TABLE} SET owner_id = %(owner)s, owner_epoch = owner_epoch + 1, "
            "lease_expires_at = moment.at + %(ttl)s * interval '1 second', claimed_at = moment.at, "
            "waiting_on = NULL, updated_at = moment.at, dispatched_at = moment.at "
            f"FROM (SELECT {moment} AS at) moment WHERE id = ANY(%(ids)s) AND owner_id IS NULL AND "
            f"status = 'running' {names}{HOLDS_SLOT}RETURNING id, "
            + ", ".join(f"{RUN_TABLE}.{column}" for column in CLAIM_COLUMNS.split(", "))
            + ", moment.at, false, ready_at"
        )
        with self.sql.connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = {str(row[0]): row[1:] for row in cursor.fetchall()}
        histories = self.sql.load_histories([run for run, row in rows.items() if int(row[4]) > 1])
        return tuple(
            claimed_run(run, rows[run], histories.get(run, {})) for run in map(str, keys) if run in rows
        )

    def orphans(self) -> Any:
        """Live children of finished parents whose policy is not "abandon", unlocked."""
        return (
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
        )

    def close_orphaned_children(self, batch: int) -> list[str]:
        """The sweep's backstop for :meth:`Children.close_children` (a process that closed a parent
        and died before its children were handled): live children of finished parents
        whose policy is not "abandon"."""
        orphans = list(self.orphans().values_list("parent_id", flat=True).distinct()[:batch])
        cancelled: list[str] = []
        for parent in orphans:
            cancelled += self.children.close_children(str(parent), f"its parent run {parent} closed")
        return cancelled


def _of(workflows: Collection[str] | None) -> Q:
    return Q(workflow_name__in=sorted(workflows)) if workflows is not None else Q()
