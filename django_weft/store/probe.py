"""The sweep's first read: which of its parts have work, all asked in one statement.

A sweep with nothing to do is most sweeps (a million runs parked on timers hours away,
schedules not yet due). Each part of the sweep (timers, schedules, orphaned children,
waiting parents, finalizers, concurrency hand-ons, dispatch, bulk jobs) would read its
own candidates, in a transaction of its own; here each part's candidate query, the very
queryset the part reads first, becomes an ``EXISTS`` of one ``SELECT``, without a lock or
a transaction, and the sweep runs only the parts that answered yes. Each ``EXISTS`` reads
the partial index its part reads (docs/explanation/scaling.md, "What a step costs the
primary")."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from ..engine.flow import Concurrency
from .activity_flow import ActivityFlow
from .bulk import BulkJobRows
from .finalizers import Finalizers
from .flow import FlowControl
from .schedules import ScheduleRows
from .sql import StoreSql
from .sweep import Sweep


class SweepWork(NamedTuple):
    """Which parts of a sweep have work now (a part not asked about is ``False``)."""

    timers: bool = False
    schedules_due: bool = False
    schedules_buffered: bool = False
    orphans: bool = False
    parents: bool = False
    finalizers: bool = False
    admissions: bool = False
    hand_ons: bool = False
    dispatch: bool = False
    bulk: bool = False


class SweepProbe:
    """:meth:`pending`: the sweep's parts that have work, from one statement."""

    def __init__(
        self,
        sql: StoreSql,
        sweep: Sweep,
        schedules: ScheduleRows,
        finalizers: Finalizers,
        flow: FlowControl,
        activity_flow: ActivityFlow,
        bulk_jobs: BulkJobRows,
    ) -> None:
        self.sql = sql
        self.sweep = sweep
        self.schedules = schedules
        self.finalizers = finalizers
        self.flow = flow
        self.activity_flow = activity_flow
        self.bulk_jobs = bulk_jobs

    def pending(
        self,
        *,
        grace: float,
        workflows: Collection[str] | None = None,
        workflow_limits: Mapping[str, Concurrency] | None = None,
        activity_limits: Mapping[str, Concurrency] | None = None,
        dispatch: bool = True,
        unlimited: Collection[str] = (),
    ) -> SweepWork:
        """Ask every part at once. ``dispatch`` says whether the sweep dispatches runs and
        finalizers (a dispatcher that delivers); ``workflows`` limits those to a worker's
        own workflows, as the sweep does; flow control parts are asked only for the
        limits given, and for runs still queued of the ``unlimited`` workflows (known to
        the sweep's process without a limit)."""
        # On PostgreSQL the statement reads the clock itself, so it depends only on these
        # arguments: compiled once per process (the querysets cost more than the statement).
        limits = (_names(workflow_limits), _names(activity_limits), tuple(sorted(unlimited)))
        key = (self.sql.alias, grace, _names(workflows), limits, dispatch)
        cached = _statements.get(key) if self.sql.clock_in_sql else None
        if cached is None:
            cached = self._statement(grace, workflows, workflow_limits, activity_limits, dispatch, unlimited)
            if self.sql.clock_in_sql:
                # Its values (statuses, kinds, names, the grace) are the same at every
                # sweep: written into the statement, its one plan reads each part's
                # partial index (StoreSql.with_values).
                names, statement, params = cached
                cached = names, self.sql.with_values(statement, params), []
                if len(_statements) >= _KEPT:  # registries that keep changing (tests)
                    _statements.clear()
                _statements[key] = cached
        names, statement, params = cached
        found = dict(zip(names, self.sql.run_exists(statement, params), strict=True))
        expired = found.pop("expired", False)
        found["dispatch"] = found.get("dispatch", False) or expired
        return SweepWork(**found)

    def _statement(
        self,
        grace: float,
        workflows: Collection[str] | None,
        workflow_limits: Mapping[str, Concurrency] | None,
        activity_limits: Mapping[str, Concurrency] | None,
        dispatch: bool,
        unlimited: Collection[str] = (),
    ) -> tuple[list[str], str, list[Any]]:
        now = self.sql.now_expression()
        reads: dict[str, Any] = {
            "timers": self.sweep.due_timers(now),
            "schedules_due": self.schedules.due_schedules(now),
            "schedules_buffered": self.schedules.buffered_schedules(),
            "orphans": self.sweep.orphans(),
            "parents": self.sweep.waiting_parents(),
            "bulk": self.bulk_jobs.open_jobs(),
        }
        if dispatch and (workflows is None or workflows):
            # (A worker with no workflow registered dispatches nothing: its reads would
            # filter on an empty list, which Django refuses to compile.)
            reads["finalizers"] = self.finalizers.due_finalizers(now, workflows)
            reads["dispatch"] = self.sweep.runnable_runs(workflows)
            reads["expired"] = self.sweep.expired_runs(now, grace, workflows)
        if workflow_limits or unlimited:
            reads["admissions"] = self.flow.queued([*(workflow_limits or ()), *unlimited])
        if activity_limits:
            reads["hand_ons"] = self.activity_flow.waiting(activity_limits)
        return [*reads], *self.sql.exists_statement(list(reads.values()))


_statements: dict[tuple[Any, ...], tuple[list[str], str, list[Any]]] = {}
"""The compiled statements of :meth:`SweepProbe.pending`, by its arguments."""
_KEPT = 32


def _names(names: Collection[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(sorted(names))
