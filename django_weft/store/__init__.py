"""The ORM adapter of the engine's store port: every fenced write lives here.

The store is a set of areas, each an object for one kind of caller, and all of them
hold the same database helper, :class:`~.sql.StoreSql` (the alias and connection, the
clock, the run rows, the statements written by hand, signals sent on commit):

- ``turns`` (:class:`~.turns.RunTurns`): the engine's port
  (:class:`~django_weft.engine.ports.TurnStore`), the owner's fenced writes during a turn;
  it hands a turn's messages on to :class:`~.turn_messages.TurnMessages` and its children
  to :class:`~.children.Children`;
- ``transitions`` (:class:`~.transitions.RunTransitions`): cancel, cancellation requests,
  suspend, resume, retry;
- ``intake`` (:class:`~.intake.Intake`): new runs, signals, updates;
- ``attempts`` (:class:`~.attempts.ActivityAttempts`): queued activity attempts on workers;
- ``finalizers`` (:class:`~.finalizers.Finalizers`): a closed run's finalizer attempts;
- ``resets`` (:class:`~.resets.Resets`): reset to a position of the history;
- ``sweep`` (:class:`~.sweep.Sweep`): due timers, undispatched runs, orphaned children;
- ``probe`` (:class:`~.probe.SweepProbe`): which parts of a sweep have work, in one read;
- ``schedules`` (:class:`~.schedules.ScheduleRows`): schedule rows;
- ``bulk_jobs`` (:class:`~.bulk.BulkJobRows`): bulk job rows;
- ``retention`` (:class:`~.retention.Retention`): deleting runs past their retention;
- ``workers`` (:class:`~.workers.WorkerRows`): what each worker process can run;
- ``flow`` (:class:`~.flow.FlowControl`): concurrency slots, taken, queued and handed on;
- ``debounce`` (:class:`~.debounce.DebouncedStarts`): debounced starts collapsed into one
  pending run per key.
- ``activity_flow`` (:class:`~.activity_flow.ActivityFlow`): activity attempts' rate limit
  buckets and concurrency slots.

Areas that wake runs hold :class:`~.waking.Waking` (the facts a wait decision needs,
waking a parent). Callers get the areas from :class:`DjangoStore`.
"""

from __future__ import annotations

from datetime import datetime

from .activity_flow import ActivityFlow
from .attempts import ActivityAttempts, StartedAttempt
from .bulk import BulkJobRows
from .children import Children
from .debounce import DebouncedStarts, JoinedBurst
from .finalizers import Finalizers
from .flow import Admitted, FlowControl
from .intake import Intake
from .notices import WorkNotices
from .probe import SweepProbe, SweepWork
from .resets import Resets
from .retention import PurgedBatch, Retention, RetentionScan
from .schedules import ScheduleRows
from .sql import StoreSql
from .sweep import ClaimAs, Sweep
from .transitions import RunTransitions, Transition
from .turn_messages import TurnMessages
from .turns import RunTurns
from .waking import Waking
from .workers import Advert, WorkerRows


class DjangoStore:
    """The store on a Django database: its areas as attributes, all on one
    :class:`~.sql.StoreSql`. ``turns`` is the engine's
    :class:`~django_weft.engine.ports.TurnStore`. Cheap to build (no database access)."""

    def __init__(self, alias: str | None = None) -> None:
        self.sql = sql = StoreSql(alias)
        waking = Waking(sql)
        self.finalizers = Finalizers(sql)
        self.attempts = ActivityAttempts(sql, waking)
        self.transitions = RunTransitions(sql, waking, self.finalizers)
        children = Children(sql, self.transitions)
        self.flow = FlowControl(sql)
        self.activity_flow = ActivityFlow(sql)
        self.turns = RunTurns(
            sql,
            waking,
            self.attempts,
            self.finalizers,
            children,
            TurnMessages(sql),
            self.flow,
            self.activity_flow,
        )
        self.intake = Intake(sql)
        self.notices = WorkNotices(sql)
        self.debounce = DebouncedStarts(sql, self.intake)
        self.resets = Resets(sql)
        self.sweep = Sweep(sql, waking, self.attempts, self.transitions, children)
        self.schedules = ScheduleRows(sql)
        self.bulk_jobs = BulkJobRows(sql)
        self.probe = SweepProbe(
            sql, self.sweep, self.schedules, self.finalizers, self.flow, self.activity_flow, self.bulk_jobs
        )
        self.retention = Retention(sql)
        self.workers = WorkerRows(sql)

    @property
    def alias(self) -> str:
        """The database the store works on (the caller's transactions use it too)."""
        return self.sql.alias

    def db_now(self) -> datetime:
        """The database clock, or a test's virtual clock (:meth:`StoreSql.db_now`)."""
        return self.sql.db_now()


__all__ = [
    "ActivityAttempts",
    "ActivityFlow",
    "Admitted",
    "Advert",
    "BulkJobRows",
    "Children",
    "ClaimAs",
    "DebouncedStarts",
    "DjangoStore",
    "Finalizers",
    "FlowControl",
    "Intake",
    "JoinedBurst",
    "PurgedBatch",
    "Resets",
    "Retention",
    "RetentionScan",
    "RunTransitions",
    "RunTurns",
    "ScheduleRows",
    "StartedAttempt",
    "StoreSql",
    "Sweep",
    "SweepProbe",
    "SweepWork",
    "Transition",
    "TurnMessages",
    "Waking",
    "WorkerRows",
]
