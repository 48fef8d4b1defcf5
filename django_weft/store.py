"""The ORM adapter of the engine's store port: every fenced write lives here.

Fencing (DESIGN §4): a write an owner makes for its run succeeds only while the run
row still names that owner at that epoch. The hot step commit is one statement, a
conditional row lock feeding the step upsert (PostgreSQL: a ``FOR UPDATE`` CTE; SQLite:
``INSERT ... SELECT ... WHERE`` under SQLite's single writer). External transitions
lock the same row and rotate the epoch, so whichever commits second sees the other.

Lease times use the database clock on PostgreSQL (``now()``), so clock skew between
worker hosts cannot make a live lease look expired. SQLite is embedded: its clock is the
local clock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction

try:
    import psycopg
except ImportError:  # SQLite-only installs
    psycopg = None  # type: ignore[assignment]
from django.db.models import Case, DurationField, ExpressionWrapper, F, JSONField, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import signals
from .conf import weft_settings
from .engine import codec
from .engine.errors import (
    Deposed,
    InvalidTransition,
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowTerminalError,
)
from .engine.records import (
    ACTIVE_STATUSES,
    FINALIZER_SEQ,
    PENDING_STEP_STATUSES,
    RUN_LEVEL_SEQ,
    TERMINAL_STATUSES,
    ChildOutcome,
    ChildStart,
    ClaimedRun,
    FailureCategory,
    MessageKind,
    PendingMessage,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
)
from .engine.registry import registry
from .models import Signal, Step, Timer, Update, WorkflowRun
from .models.messages import UpdateStatus

logger = logging.getLogger("django_weft.store")
timer_log = logging.getLogger("django_weft.timers")

RUN_TABLE = WorkflowRun._meta.db_table
STEP_TABLE = Step._meta.db_table
TIMER_TABLE = Timer._meta.db_table
UPDATE_TABLE = Update._meta.db_table

_STEP_COLUMNS = (
    "run_id, seq, kind, name, status, args, result, error, attempt, "
    "started_at, finished_at, created_at, updated_at"
)
_STEP_ON_CONFLICT = (
    "ON CONFLICT (run_id, seq) DO UPDATE SET status = excluded.status, "
    "result = excluded.result, error = excluded.error, attempt = excluded.attempt, "
    "finished_at = excluded.finished_at, updated_at = excluded.updated_at"
)


_STEP_SQL: dict[str, str] = {}


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value


def _json(value: Any) -> Any:
    return codec.loads(value) if isinstance(value, str | bytes) else value


def _step_record(row: Any) -> StepRecord:
    """A :class:`StepRecord` from ``seq, kind, name, status, result, error, attempt,
    started_at, finished_at`` columns."""
    seq, kind, name, status, result, error, attempt, started, finished = row
    return StepRecord(
        seq=seq,
        kind=kind,
        name=name,
        status=status,
        result=_json(result),
        error=_json(error),
        attempt=attempt,
        started_at=_aware(started) if started is not None else None,
        finished_at=_aware(finished) if finished is not None else None,
    )


def _unanswered_error(status: str) -> dict[str, str]:
    return {
        "type": "django_weft.RunFinished",
        "message": f"the run finished ({status}) before it applied this update",
    }


def _deposed(run_id: str, owner: str, epoch: int, what: str) -> Deposed:
    return Deposed(
        f"run {run_id}: {what} rejected, engine {owner} no longer owns it at epoch {epoch}",
        run_id=run_id,
        owner=owner,
        epoch=epoch,
    )


class DjangoStore:
    """The engine's :class:`~django_weft.engine.ports.TurnStore` on a Django database."""

    def __init__(self, alias: str | None = None) -> None:
        self._alias = alias

    # -- plumbing ----------------------------------------------------------------------

    @property
    def alias(self) -> str:
        return self._alias or weft_settings.DATABASE_ALIAS

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    @property
    def is_postgres(self) -> bool:
        return self.connection.vendor == "postgresql"

    def _run_key(self, run_id: str | uuid.UUID) -> Any:
        value = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        return WorkflowRun._meta.pk.get_db_prep_value(value, self.connection)

    def _dt(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def db_now(self) -> datetime:
        if self.is_postgres:
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT now()")
                return _aware(cursor.fetchone()[0])
        return timezone.now()

    def _runs(self) -> Any:
        return WorkflowRun.objects.using(self.alias)

    # -- claim -------------------------------------------------------------------------

    def claim(self, run_id: str, owner: str, ttl: float, grace: float) -> ClaimedRun | None:
        """Claim a runnable run, or take over one whose lease expired more than ``grace``
        seconds ago. A waiting run whose timer is due is woken and claimed at once.

        The history is read by a statement of its own *after* the claim: a claim that
        waited for the row lock of a previous owner must see that owner's last commits,
        which a read in the claiming statement (one snapshot) would miss. The first claim
        of a run (epoch 1) skips the read: steps are only ever written under an owner's
        epoch, so a run nobody owned before has none."""
        row = self._claim_runnable(run_id, owner, ttl, grace)
        if row is None:
            # Not runnable: only a waiting or delayed run can still be claimed (woken by a
            # due timer). A cheap unlocked look first spares the transaction in the
            # common case of a duplicate delivery for a run that is owned or finished.
            status = self._runs().filter(pk=run_id).values_list("status", flat=True).first()
            if status in (RunStatus.WAITING, RunStatus.PENDING):
                row = self._claim_woken(run_id, owner, ttl)
            else:
                self._discard_wake(run_id, status)
            if row is None:
                return None
        workflow_id, name, args, kwargs, epoch, attempt, created_at, parent_id, db_now = row
        return ClaimedRun(
            run_id=str(run_id),
            workflow_id=workflow_id,
            workflow_name=name,
            args=_json(args) or [],
            kwargs=_json(kwargs) or {},
            epoch=int(epoch),
            attempt=int(attempt),
            created_at=_aware(created_at),
            db_now=_aware(db_now),
            steps={} if int(epoch) == 1 else self.load_steps(run_id),
            parent_run_id=str(parent_id) if parent_id else None,
        )

    def _claim_runnable(self, run_id: str, owner: str, ttl: float, grace: float) -> Any:
        # One conditional UPDATE: it takes the row lock, so two claimers serialise and the
        # second sees the first's owner. owner_epoch + 1 mints the new fencing token.
        returning = (
            "RETURNING workflow_id, workflow_name, args, kwargs, owner_epoch, attempt, created_at, parent_id"
        )
        if self.is_postgres:
            sql = (
                f"UPDATE {RUN_TABLE} SET owner_id = %(owner)s, owner_epoch = owner_epoch + 1, "
                "lease_expires_at = now() + %(ttl)s * interval '1 second', claimed_at = now(), "
                "waiting_on = NULL, updated_at = now() "
                "WHERE id = %(id)s AND status = 'running' AND (owner_id IS NULL OR "
                "lease_expires_at < now() - %(grace)s * interval '1 second') "
                f"{returning}, now()"
            )
            params: dict[str, Any] = {"owner": owner, "ttl": ttl, "grace": grace, "id": self._run_key(run_id)}
        else:
            now = timezone.now()
            sql = (
                f"UPDATE {RUN_TABLE} SET owner_id = %(owner)s, owner_epoch = owner_epoch + 1, "
                "lease_expires_at = %(until)s, claimed_at = %(now)s, waiting_on = NULL, "
                "updated_at = %(now)s WHERE id = %(id)s AND status = 'running' AND "
                "(owner_id IS NULL OR lease_expires_at < %(cutoff)s) "
                f"{returning}, %(now)s"
            )
            params = {
                "owner": owner,
                "id": self._run_key(run_id),
                "now": self._dt(now),
                "until": self._dt(now + timedelta(seconds=ttl)),
                "cutoff": self._dt(now - timedelta(seconds=grace)),
            }
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    def _claim_woken(self, run_id: str, owner: str, ttl: float) -> Any:
        """Fire the due timers of a waiting run and claim it, in one transaction."""
        with transaction.atomic(using=self.alias):
            run = (
                self._runs()
                .select_for_update(skip_locked=True)
                .filter(pk=run_id, status__in=[RunStatus.WAITING, RunStatus.PENDING])
                .first()
            )
            if run is None:
                return None
            now = self.db_now()
            # Lock order is always run row, then timer rows (the sweep and park do the
            # same), so a claim racing the sweep cannot deadlock; a timer the sweep holds
            # is skipped, and the sweep then makes the run runnable itself.
            timers = Timer.objects.using(self.alias)
            # A due deadline is the sweep's: it times the run out (an external transition).
            due = list(
                timers.filter(run_id=run.pk)
                .due(now)
                .exclude(kind=TimerKind.DEADLINE)
                .select_for_update(skip_locked=True)
                .values_list("pk", "seq", "kind")
            )
            if not due:
                return None
            timers.filter(pk__in=[pk for pk, _, _ in due]).update(fired_at=now)
            for pk, seq, kind in due:
                timer_log.debug("fired timer %s (run %s, position %s, %s) on claim", pk, run.pk, seq, kind)
            self._lose_attempts([(run.pk, seq) for _, seq, kind in due if kind == TimerKind.ACTIVITY], now)
            run.owner_epoch += 1
            self._runs().filter(pk=run.pk).update(
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
                now,
            )

    def load_steps(self, run_id: str) -> dict[int, StepRecord]:
        """The recorded steps of a run, in one query."""
        sql = (
            "SELECT seq, kind, name, status, result, error, attempt, started_at, finished_at "
            f"FROM {STEP_TABLE} WHERE run_id = %(id)s ORDER BY seq"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, {"id": self._run_key(run_id)})
            return {row[0]: _step_record(row) for row in cursor.fetchall()}

    # -- fenced writes -----------------------------------------------------------------

    def _step_sql(self) -> str:
        vendor = self.connection.vendor
        sql = _STEP_SQL.get(vendor)
        if sql is None:
            sql = _STEP_SQL[vendor] = self._build_step_sql()
        return sql

    def _build_step_sql(self) -> str:
        cast = "::jsonb" if self.is_postgres else ""
        values = (
            f"%(seq)s, %(kind)s, %(name)s, %(status)s, %(args)s{cast}, %(result)s{cast}, "
            f"%(error)s{cast}, %(attempt)s, %(started)s, %(finished)s, %(stamp)s, %(stamp)s"
        )
        if self.is_postgres:
            return (
                f"WITH fence AS (SELECT id FROM {RUN_TABLE} WHERE id = %(id)s AND "
                "owner_id = %(owner)s AND owner_epoch = %(epoch)s FOR UPDATE) "
                f"INSERT INTO {STEP_TABLE} ({_STEP_COLUMNS}) SELECT fence.id, {values} FROM fence "
                f"{_STEP_ON_CONFLICT} RETURNING id"
            )
        return (
            f"INSERT INTO {STEP_TABLE} ({_STEP_COLUMNS}) SELECT id, {values} FROM {RUN_TABLE} "
            "WHERE id = %(id)s AND owner_id = %(owner)s AND owner_epoch = %(epoch)s "
            f"{_STEP_ON_CONFLICT} RETURNING id"
        )

    def _step_params(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> dict[str, Any]:
        connection = self.connection
        adapt = connection.ops.adapt_datetimefield_value
        return {
            "id": WorkflowRun._meta.pk.get_db_prep_value(uuid.UUID(str(run_id)), connection),
            "owner": owner,
            "epoch": epoch,
            "seq": step.seq,
            "kind": step.kind,
            "name": step.name,
            "status": step.status,
            "args": step.args_json,
            "result": step.result_json,
            "error": step.error_json,
            "attempt": step.attempt,
            "started": adapt(step.started_at),
            "finished": adapt(step.finished_at),
            "stamp": adapt(step.finished_at or step.started_at),
        }

    def _write_step(self, cursor: Any, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        cursor.execute(self._step_sql(), self._step_params(run_id, owner, epoch, step))
        self._check_step_written(cursor.fetchone(), run_id, owner, epoch, step)

    @staticmethod
    def _check_step_written(row: Any, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        if row is None:
            raise _deposed(run_id, owner, epoch, f"step {step.seq} ({step.kind} {step.name})")

    def commit_step(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        """Record one step in one statement, fenced on (owner, epoch). Raises ``Deposed``."""
        connection = self.connection
        if connection.vendor == "postgresql":
            # The hottest statement: send it as a server-side prepared statement on the
            # underlying psycopg connection, so PostgreSQL parses and plans it once per
            # connection instead of once per step (Django's default client-side binding
            # cannot prepare).
            connection.ensure_connection()
            raw = connection.connection
            prepare = weft_settings.PREPARE_STATEMENTS
            if prepare and raw.prepare_threshold is None:
                # Django opens connections with prepared statements off, and psycopg then
                # ignores prepare=True. Re-enable them with a threshold nothing reaches, so
                # only statements asked for explicitly (this one) are prepared.
                raw.prepare_threshold = 2**31 - 1
            with psycopg.Cursor(raw) as cursor:
                row = cursor.execute(
                    self._step_sql(), self._step_params(run_id, owner, epoch, step), prepare=prepare or None
                ).fetchone()
            self._check_step_written(row, run_id, owner, epoch, step)
            return
        with connection.cursor() as cursor:
            self._write_step(cursor, run_id, owner, epoch, step)

    def commit_step_atomic(
        self, run_id: str, owner: str, epoch: int, body: Callable[[], StepWrite]
    ) -> StepWrite:
        """Lock and check the run row, run ``body`` (an atomic activity), record its step;
        all in one transaction on the workflow database. Raises ``Deposed`` before
        running ``body`` if the run is not ours; an exception from ``body`` rolls back."""
        with transaction.atomic(using=self.alias):
            locked = (
                self._runs()
                .select_for_update()
                .filter(pk=run_id, owner_id=owner, owner_epoch=epoch)
                .values_list("pk", flat=True)
            )
            if not list(locked):
                raise _deposed(run_id, owner, epoch, "atomic activity")
            step = body()
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
        return step

    def _write_timers(self, cursor: Any, run_id: str, timers: Iterable[TimerWrite], now: datetime) -> None:
        sql = (
            f"INSERT INTO {TIMER_TABLE} (run_id, seq, kind, fire_at, fired_at, created_at) "
            "VALUES (%(id)s, %(seq)s, %(kind)s, %(fire_at)s, NULL, %(now)s) "
            "ON CONFLICT (run_id, seq, kind) DO UPDATE SET fire_at = excluded.fire_at, fired_at = NULL"
        )
        for timer in timers:
            cursor.execute(
                sql,
                {
                    "id": self._run_key(run_id),
                    "seq": timer.seq,
                    "kind": timer.kind,
                    "fire_at": self._dt(timer.fire_at),
                    "now": self._dt(now),
                },
            )

    def _owned(self, run_id: str, owner: str, epoch: int) -> Any:
        return self._runs().filter(pk=run_id, owner_id=owner, owner_epoch=epoch)

    def park(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        waiting_on: dict[str, object],
        steps: Iterable[StepWrite],
        timers: Iterable[TimerWrite],
    ) -> bool:
        """Record the wait's steps and timers, set ``waiting`` and release, atomically.

        If the run waits for queued activities and what it waits for has already
        happened (an activity finished while the turn ran: its wake-up found the run
        owned), the run is released runnable instead and ``True`` returned. The park and
        the activity's completion both lock the run row, so one of them sees the other."""
        with transaction.atomic(using=self.alias):
            # Lock the run row first (fenced), then write timers: the run-then-timer lock
            # order every writer follows.
            if not list(self._owned(run_id, owner, epoch).select_for_update().values_list("pk", flat=True)):
                raise _deposed(run_id, owner, epoch, "park")
            now = timezone.now()
            with self.connection.cursor() as cursor:
                for step in steps:
                    self._write_step(cursor, run_id, owner, epoch, step)
                self._write_timers(cursor, run_id, timers, now)
            if self._wait_satisfied(run_id, waiting_on):
                if not self.release(run_id, owner, epoch):
                    raise _deposed(run_id, owner, epoch, "park")
                return True
            parked = self._owned(run_id, owner, epoch).update(
                status=RunStatus.WAITING,
                waiting_on=waiting_on,
                owner_id=None,
                lease_expires_at=None,
                ready_at=None,
                dispatched_at=None,
                updated_at=Now(),
            )
            if not parked:
                raise _deposed(run_id, owner, epoch, "park")
        return False

    def _wait_satisfied(self, run_id: str, waiting_on: dict[str, Any] | None) -> bool:
        """Whether a parked run needs a turn now because of its queued activities: for a
        wait on ``any`` of them, one finished; for ``all``, none is pending, or an attempt
        failed or was lost (the workflow decides on the retry). An attempt that failed or
        was lost among the activities started but not waited for (``background``) counts
        too, whatever the run waits for."""
        if not waiting_on:
            return False
        if self._messages_waiting(run_id, waiting_on):
            return True
        waiting_for_activities = waiting_on.get("kind") == "activities"
        seqs = list(waiting_on.get("seqs") or []) if waiting_for_activities else []
        background = list(waiting_on.get("background") or [])
        if not seqs and not background:
            return False
        key = uuid.UUID(str(run_id))
        rows = list(
            Step.objects.using(self.alias)
            .filter(run_id=key, seq__in=seqs + background)
            .values_list("seq", "status", "kind")
        )
        status_of = {seq: status for seq, status, _ in rows}
        children = [
            seq for seq, status, kind in rows if kind == StepKind.CHILD and status == StepStatus.WAITING
        ]
        if children:
            # A child step stays "waiting" until the parent records the outcome; what
            # counts is whether the child run (or its continued-as-new successor) is live.
            live = set(
                self._runs()
                .filter(parent_id=key, parent_seq__in=children, status__in=list(ACTIVE_STATUSES))
                .values_list("parent_seq", flat=True)
            )
            for seq in children:
                status_of[seq] = StepStatus.SCHEDULED if seq in live else StepStatus.COMPLETED
        needs_decision = (StepStatus.ATTEMPT_FAILED, StepStatus.LOST)
        if any(status_of.get(seq) in needs_decision for seq in background):
            return True
        if not waiting_for_activities:
            return False
        pending = [status_of.get(seq) in PENDING_STEP_STATUSES for seq in seqs]
        if waiting_on.get("mode") == "any":
            return not all(pending)
        return not any(pending) or any(status_of.get(seq) in needs_decision for seq in seqs)

    def _messages_waiting(self, run_id: str, waiting_on: dict[str, Any]) -> bool:
        """Whether a signal or an update that wakes the run (``waiting_on["signals"]``,
        ``["updates"]``: the names it waits for or handles) is pending."""
        key = uuid.UUID(str(run_id))
        signals: list[str] = waiting_on.get("signals") or []
        updates: list[str] = waiting_on.get("updates") or []
        if signals and (
            Signal.objects.using(self.alias)
            .filter(run_id=key, name__in=signals, consumed_seq__isnull=True)
            .exists()
        ):
            return True
        return bool(updates) and (
            Update.objects.using(self.alias)
            .filter(run_id=key, name__in=updates, status=UpdateStatus.ACCEPTED, applied_seq__isnull=True)
            .exists()
        )

    # -- messages ----------------------------------------------------------------------

    def _lock_for_message(self, run_pk: Any) -> dict[str, Any]:
        """Lock the run row for a message insert and check the run takes messages.

        Taking the row lock serialises the insert with the run's park (which reads the
        pending messages under the same lock): either the park sees the message and the
        run stays runnable, or the insert sees the parked run and wakes it. It also
        numbers a run's messages in commit order."""
        run = (
            self._runs()
            .select_for_update()
            .filter(pk=run_pk)
            .values("status", "waiting_on", "workflow_id", "workflow_name")
            .first()
        )
        if run is None:
            raise WorkflowNotFound(f"run {run_pk} no longer exists", ref=str(run_pk))
        return run

    def _check_not_terminal(self, run_pk: Any, run: dict[str, Any], what: str) -> None:
        if run["status"] in TERMINAL_STATUSES:
            raise WorkflowTerminalError(
                f"run {run_pk} ({run['workflow_name']} {run['workflow_id']}) is {run['status']}: a "
                f"finished run takes no {what}; start a new run",
                run_id=str(run_pk),
                workflow_id=run["workflow_id"],
                status=run["status"],
            )

    def _wake_for_message(
        self, run_pk: Any, run: dict[str, Any], names_key: str, name: str, dispatched: bool
    ) -> bool:
        """Make a parked run runnable if ``name`` is among what it waits for or handles."""
        waiting_on = run["waiting_on"] or {}
        if run["status"] != RunStatus.WAITING or name not in (waiting_on.get(names_key) or []):
            return False
        now = self.db_now()
        self._runs().filter(pk=run_pk).update(
            status=RunStatus.RUNNING,
            ready_at=now,
            waiting_on=None,
            dispatched_at=now if dispatched else None,
            updated_at=now,
        )
        return True

    def deliver_signal(
        self, run_pk: Any, name: str, payload: Any, signal_id: str | None, *, dispatched: bool
    ) -> tuple[Signal, bool, bool]:
        """Store a signal for the run, in the caller's transaction; returns ``(signal,
        duplicate, woken)``. A repeated ``signal_id`` returns the stored signal. Raises
        ``WorkflowTerminalError`` for a finished run (storing nothing)."""
        run = self._lock_for_message(run_pk)
        signals = Signal.objects.using(self.alias)
        if signal_id is not None:
            # Repeats serialise on the run row lock, so this look-up sees a concurrent one.
            existing = signals.filter(run_id=run_pk, name=name, signal_id=signal_id).first()
            if existing is not None:
                return existing, True, False
        self._check_not_terminal(run_pk, run, "signals")
        stored = signals.create(run_id=run_pk, name=name, payload=payload, signal_id=signal_id)
        return stored, False, self._wake_for_message(run_pk, run, "signals", name, dispatched)

    def accept_update(
        self, run_pk: Any, update_id: str, name: str, payload: Any, *, dispatched: bool
    ) -> tuple[Update, bool, bool]:
        """Store an accepted update, in the caller's transaction; returns ``(update,
        created, woken)``. An ``update_id`` stored meanwhile returns that update."""
        run = self._lock_for_message(run_pk)
        updates = Update.objects.using(self.alias)
        existing = updates.filter(run_id=run_pk, update_id=update_id).first()
        if existing is not None:
            return existing, False, False
        self._check_not_terminal(run_pk, run, "updates")
        stored = updates.create(run_id=run_pk, update_id=update_id, name=name, payload=payload)
        return stored, True, self._wake_for_message(run_pk, run, "updates", name, dispatched)

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        """Unconsumed signals and accepted, unapplied updates of the run, oldest first.

        Signals and updates to one run are inserted under the run's row lock, so the ids
        of each grow in commit order, and each kind keeps that order here; the two are
        interleaved by their arrival times."""
        key = uuid.UUID(str(run_id))
        signals = [
            (received, 0, PendingMessage(MessageKind.SIGNAL, pk, name, payload))
            for pk, name, payload, received in Signal.objects.using(self.alias)
            .filter(run_id=key, consumed_seq__isnull=True)
            .order_by("id")
            .values_list("pk", "name", "payload", "received_at")
        ]
        updates = [
            (created, 1, PendingMessage(MessageKind.UPDATE, pk, name, payload, update_id))
            for pk, name, payload, update_id, created in Update.objects.using(self.alias)
            .filter(run_id=key, status=UpdateStatus.ACCEPTED, applied_seq__isnull=True)
            .order_by("id")
            .values_list("pk", "name", "payload", "update_id", "created_at")
        ]
        # A merge, not a sort: arrival times come from the senders' clocks, and a skewed
        # clock may interleave the kinds oddly but must not reorder signals (or updates).
        merged: list[PendingMessage] = []
        i = j = 0
        while i < len(signals) or j < len(updates):
            if j == len(updates) or (i < len(signals) and signals[i][0] <= updates[j][0]):
                merged.append(signals[i][2])
                i += 1
            else:
                merged.append(updates[j][2])
                j += 1
        return merged

    def finish_wait(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, *, signal_pk: int | None = None
    ) -> None:
        """Record the step of a message wait or a signal handler's application, consume
        the signal it took and drop the wait's timeout timer, in one fenced transaction.
        The step write locks the run row first (the order every writer follows)."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
            if signal_pk is not None:
                consumed = (
                    Signal.objects.using(self.alias)
                    .filter(pk=signal_pk, run_id=key, consumed_seq__isnull=True)
                    .update(consumed_seq=step.seq)
                )
                if not consumed:
                    raise AssertionError(f"signal {signal_pk} of run {run_id} was consumed twice")
            Timer.objects.using(self.alias).filter(run_id=key, seq=step.seq).unfired().delete()

    def apply_update(self, run_id: str, owner: str, epoch: int, step: StepWrite, update_pk: int) -> None:
        """Record that the update's handler starts at ``step.seq`` (fenced); from then on
        the update is not pending, and a crash re-runs the handler from its step."""
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
            Update.objects.using(self.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), applied_seq__isnull=True
            ).update(applied_seq=step.seq, updated_at=Now())

    def answer_update(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        step: StepWrite,
        update_pk: int,
        *,
        ok: bool,
        result_json: str | None,
        error_json: str | None,
    ) -> None:
        """Record the update's outcome on its step and on its row, fenced: the caller
        waiting for the update reads the row."""
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
            Update.objects.using(self.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), status=UpdateStatus.ACCEPTED
            ).update(
                status=UpdateStatus.COMPLETED if ok else UpdateStatus.FAILED,
                result=codec.loads(result_json) if result_json is not None else None,
                error=codec.loads(error_json) if error_json is not None else None,
                updated_at=Now(),
            )

    def fail_update(self, run_id: str, owner: str, epoch: int, update_pk: int, error: dict[str, Any]) -> None:
        """Answer a pending update with ``error`` without applying it, fenced."""
        with transaction.atomic(using=self.alias):
            if not list(self._owned(run_id, owner, epoch).select_for_update().values_list("pk", flat=True)):
                raise _deposed(run_id, owner, epoch, f"failing update {update_pk}")
            Update.objects.using(self.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), status=UpdateStatus.ACCEPTED
            ).update(status=UpdateStatus.FAILED, error=error, updated_at=Now())

    # -- queued activities -------------------------------------------------------------

    def schedule_activity(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, timer: TimerWrite
    ) -> None:
        """Record a queued attempt as scheduled with its dispatch deadline, fenced."""
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            self._write_step(cursor, run_id, owner, epoch, step)
            self._write_timers(cursor, run_id, [timer], step.started_at)

    def _lock_active_run(
        self, key: uuid.UUID, *fields: str, suspended: bool = False
    ) -> dict[str, Any] | None:
        """Lock a running or waiting (or, with ``suspended``, suspended) run's row, first as
        every writer does, and read ``fields``; ``None`` if the run is not in those states."""
        statuses = [RunStatus.RUNNING, RunStatus.WAITING] + ([RunStatus.SUSPENDED] if suspended else [])
        return self._runs().select_for_update().filter(pk=key, status__in=statuses).values(*fields).first()

    def start_activity(self, run_id: str, seq: int, attempt: int, ttl: float) -> dict[str, Any] | None:
        """Take attempt ``attempt`` of the queued activity at ``seq`` for execution.

        Exactly one caller wins per attempt: the step moves from ``scheduled`` to
        ``started`` and its activity timer becomes the attempt's lease (``ttl`` from
        now, renewed by the heartbeat). ``None`` for a duplicate delivery, a stale
        attempt or a run that is no longer active."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.alias):
            run = self._lock_active_run(key, "workflow_id", "workflow_name")
            if run is None:
                return None
            now = self.db_now()
            steps = Step.objects.using(self.alias).filter(run_id=key, seq=seq, attempt=attempt)
            if not steps.filter(status=StepStatus.SCHEDULED).update(
                status=StepStatus.STARTED, started_at=now, updated_at=now
            ):
                return None
            row = steps.values("name", "args").get()
            Timer.objects.using(self.alias).update_or_create(
                run_id=key,
                seq=seq,
                kind=TimerKind.ACTIVITY,
                defaults={"fire_at": now + timedelta(seconds=ttl), "fired_at": None},
            )
        return {**run, "name": row["name"], "args": row["args"] or {}}

    def finish_activity(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        *,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        body: Callable[[], tuple[str, str | None, str | None]] | None = None,
    ) -> tuple[bool, bool]:
        """Record the outcome of a started attempt and wake its run if that is what it
        waits for. Returns ``(recorded, woken)``; ``recorded`` is ``False`` for a stale
        attempt (lost and retried meanwhile) or a run that is no longer active.

        ``body`` (an atomic activity) runs inside this transaction after the attempt is
        confirmed and returns ``(status, result_json, error_json)``."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.alias):
            # A suspended run keeps what its activities finish; it only is not woken.
            run = self._lock_active_run(key, "status", "waiting_on", suspended=True)
            if run is None:
                return False, False
            steps = Step.objects.using(self.alias).filter(
                run_id=key, seq=seq, attempt=attempt, status=StepStatus.STARTED
            )
            if not list(steps.select_for_update().values_list("pk", flat=True)):
                return False, False
            if body is not None:
                status, result_json, error_json = body()
            now = self.db_now()
            steps.update(
                status=status,
                result=codec.loads(result_json) if result_json is not None else None,
                error=codec.loads(error_json) if error_json is not None else None,
                finished_at=now,
                updated_at=now,
            )
            Timer.objects.using(self.alias).filter(run_id=key, seq=seq, kind=TimerKind.ACTIVITY).delete()
            woken = run["status"] == RunStatus.WAITING and self._wait_satisfied(run_id, run["waiting_on"])
            if woken:
                # dispatched_at: the caller rings the doorbell itself, so the sweep holds off.
                self._runs().filter(pk=key).update(
                    status=RunStatus.RUNNING, ready_at=now, dispatched_at=now, waiting_on=None, updated_at=now
                )
        return True, woken

    def renew_activities(self, attempts: Iterable[tuple[str, int, int]], ttl: float) -> None:
        """Extend the leases (activity timers) of attempts this process is running.

        Only an attempt that is still current and started is renewed: a worker that comes
        back from a stall after its attempt was lost and retried must not keep the new
        attempt's deadline away. Rows locked right now are skipped (renewed next time)."""
        condition = Q()
        for run_id, seq, attempt in attempts:
            if seq == FINALIZER_SEQ:
                condition |= Q(
                    run_id=uuid.UUID(str(run_id)),
                    seq=seq,
                    kind=TimerKind.FINALIZER,
                    run__finalizer__attempt=attempt,
                    run__finalizer__status="running",
                )
                continue
            condition |= Q(
                run_id=uuid.UUID(str(run_id)),
                seq=seq,
                kind=TimerKind.ACTIVITY,
                run__steps__seq=seq,
                run__steps__attempt=attempt,
                run__steps__status=StepStatus.STARTED,
            )
        if not condition:
            return
        timers = Timer.objects.using(self.alias)
        with transaction.atomic(using=self.alias):
            until = self.db_now() + timedelta(seconds=ttl)
            ids = list(
                timers.filter(condition, fired_at__isnull=True)
                .select_for_update(skip_locked=True, of=("self",))
                .values_list("pk", flat=True)
            )
            if ids:
                timers.filter(pk__in=ids).update(fire_at=until)

    def _lose_attempts(self, fired: Iterable[tuple[Any, int]], now: datetime) -> None:
        """Mark the queued attempts whose activity timer fired as lost: never started
        (the message went missing) or started by a worker that stopped heartbeating.
        The caller holds the run rows."""
        condition = Q()
        for run, seq in fired:
            condition |= Q(run_id=run, seq=seq)
        if not condition:
            return
        never_started = {
            "type": "django_weft.DispatchLost",
            "message": "the attempt was not picked up from its queue in time; it is sent again",
            "started": False,
        }
        worker_lost = {
            "type": "django_weft.WorkerLost",
            "message": "the worker running this attempt stopped renewing its lease (crashed or killed)",
            "started": True,
            "retryable": True,
        }
        Step.objects.using(self.alias).filter(
            condition, status__in=[StepStatus.SCHEDULED, StepStatus.STARTED]
        ).update(
            status=StepStatus.LOST,
            error=Case(
                When(status=StepStatus.STARTED, then=Value(worker_lost, output_field=JSONField())),
                default=Value(never_started, output_field=JSONField()),
            ),
            result=Case(When(status=StepStatus.SCHEDULED, then=F("result")), default=None),
            updated_at=now,
        )

    def _finish(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        what: str,
        *,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        category: str = "",
        parent: str | None = None,
    ) -> str | None:
        """The owner's terminal commit: status, outcome, release and unfired timers removed,
        fenced on (owner, epoch). A child run's commit also wakes its parent if the parent
        waits for it, in the same transaction (the child's row is locked before the
        parent's: descendants before ancestors, the order every writer follows); the
        woken parent's id is returned for its doorbell."""
        if parent is not None and status != RunStatus.CONTINUED:
            with transaction.atomic(using=self.alias):
                self._finish(
                    run_id, owner, epoch, what, status=status, result_json=result_json,
                    error_json=error_json, category=category,
                )  # fmt: skip
                return self._wake_parent(parent)
        if self.is_postgres:
            # One statement (one round trip): the conditional UPDATE is the fence, and the
            # timer DELETE only sees a row if the UPDATE matched.
            sql = (
                f"WITH done AS (UPDATE {RUN_TABLE} SET status = %(status)s, result = %(result)s::jsonb, "
                "error = %(error)s::jsonb, failure_category = %(category)s, owner_id = NULL, "
                "lease_expires_at = NULL, ready_at = NULL, dispatched_at = NULL, waiting_on = NULL, "
                "finished_at = now(), updated_at = now() "
                "WHERE id = %(id)s AND owner_id = %(owner)s AND owner_epoch = %(epoch)s "
                "RETURNING id, workflow_id, workflow_name), "
                f"gone AS (DELETE FROM {TIMER_TABLE} WHERE run_id IN (SELECT id FROM done) "
                "AND fired_at IS NULL), "
                f"unanswered AS (UPDATE {UPDATE_TABLE} SET status = 'failed', error = %(unanswered)s::jsonb, "
                "updated_at = now() WHERE run_id IN (SELECT id FROM done) AND status = 'accepted') "
                "SELECT workflow_id, workflow_name FROM done"
            )
            params = {
                "status": status, "result": result_json, "error": error_json, "category": category,
                "id": self._run_key(run_id), "owner": owner, "epoch": epoch,
                "unanswered": codec.dumps(_unanswered_error(status)),
            }  # fmt: skip
            with self.connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            if row is None:
                raise _deposed(run_id, owner, epoch, what)
            self._announce_finish(run_id, row[0], row[1], status, error_json)
            return None
        with transaction.atomic(using=self.alias):
            names = self._owned(run_id, owner, epoch).values_list("workflow_id", "workflow_name").first()
            finished = names is not None and self._owned(run_id, owner, epoch).update(
                status=status,
                result=codec.loads(result_json),
                error=codec.loads(error_json),
                failure_category=category,
                owner_id=None,
                lease_expires_at=None,
                ready_at=None,
                dispatched_at=None,
                waiting_on=None,
                finished_at=Now(),
                updated_at=Now(),
            )
            if not finished:
                raise _deposed(run_id, owner, epoch, what)
            key = uuid.UUID(str(run_id))
            Timer.objects.using(self.alias).filter(run_id=key).unfired().delete()
            Update.objects.using(self.alias).filter(run_id=key, status=UpdateStatus.ACCEPTED).update(
                status=UpdateStatus.FAILED, error=_unanswered_error(status), updated_at=Now()
            )
            assert names is not None
            self._announce_finish(run_id, names[0], names[1], status, error_json)
        return None

    def _announce_finish(
        self, run_id: str, workflow_id: str, workflow_name: str, status: str, error_json: str | None
    ) -> None:
        if status == RunStatus.COMPLETED:
            self._announce(signals.run_completed, run_id, workflow_id, workflow_name)
        elif status == RunStatus.FAILED:
            error = codec.loads(error_json) if error_json else None
            self._announce(signals.run_failed, run_id, workflow_id, workflow_name, error=error)

    def _announce(self, signal: Any, run_id: Any, workflow_id: str, workflow_name: str, **extra: Any) -> None:
        """Send a Django signal once the current transaction commits (at once in autocommit)."""
        if not signal.has_listeners(WorkflowRun):
            return

        def send() -> None:
            for receiver, response in signal.send_robust(
                sender=WorkflowRun,
                run_id=str(run_id),
                workflow_id=workflow_id,
                workflow_name=workflow_name,
                **extra,
            ):
                if isinstance(response, Exception):
                    logger.error(
                        "run %s: receiver %r of a django_weft signal raised",
                        run_id,
                        receiver,
                        exc_info=response,
                    )

        transaction.on_commit(send, using=self.alias)

    def complete(
        self, run_id: str, owner: str, epoch: int, result_json: str, *, parent: str | None = None
    ) -> str | None:
        return self._finish(
            run_id,
            owner,
            epoch,
            "completion",
            status=RunStatus.COMPLETED,
            result_json=result_json,
            parent=parent,
        )

    def fail(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        error_json: str,
        category: str,
        *,
        parent: str | None = None,
    ) -> str | None:
        return self._finish(
            run_id, owner, epoch, "failure", status=RunStatus.FAILED, error_json=error_json,
            category=category, parent=parent,
        )  # fmt: skip

    def continue_as_new(self, run_id: str, owner: str, epoch: int, args_json: str, kwargs_json: str) -> str:
        with transaction.atomic(using=self.alias):
            run = self._owned(run_id, owner, epoch).select_for_update().first()
            if run is None:
                raise _deposed(run_id, owner, epoch, "continue_as_new")
            successor_id = uuid.uuid4()
            self._finish(
                run_id,
                owner,
                epoch,
                "continue_as_new",
                status=RunStatus.CONTINUED,
                result_json=codec.dumps({"continued_as": str(successor_id)}),
            )
            now = self.db_now()
            self._runs().create(
                id=successor_id,
                workflow_id=run.workflow_id,
                workflow_name=run.workflow_name,
                workflow_version=run.workflow_version,
                status=RunStatus.RUNNING,
                args=codec.loads(args_json),
                kwargs=codec.loads(kwargs_json),
                parent_id=run.parent_id,
                parent_seq=run.parent_seq,
                parent_close_policy=run.parent_close_policy,
                search_attributes=run.search_attributes,
                execution_deadline=run.execution_deadline,
                ready_at=now,
            )
            if run.execution_deadline is not None:
                # The deadline covers the whole chain of runs: the successor keeps it.
                Timer.objects.using(self.alias).create(
                    run_id=successor_id,
                    seq=RUN_LEVEL_SEQ,
                    kind=TimerKind.DEADLINE,
                    fire_at=run.execution_deadline,
                )
        return str(successor_id)

    def release(self, run_id: str, owner: str, epoch: int, *, redispatch: bool = True) -> bool:
        """Drop ownership, keep status: the run stays runnable for another worker.

        With ``redispatch=False`` the sweep waits ``WEFT_REDISPATCH_AFTER`` before sending it
        out again (for a run this worker could not execute)."""
        return bool(
            self._owned(run_id, owner, epoch).update(
                owner_id=None,
                lease_expires_at=None,
                dispatched_at=None if redispatch else Now(),
                ready_at=Now(),
                updated_at=Now(),
            )
        )

    def renew(self, owner: str, held: dict[str, int], ttl: float) -> set[str]:
        """Extend the lease of every held run; return those no longer ours.

        On PostgreSQL one statement renews them all and skips rows locked right now (an
        atomic activity of this engine holds its run row): those are not renewed this
        round but are not lost either. Ownership is then read without locks."""
        if not held:
            return set()
        keys = {self._run_key(run_id): run_id for run_id in held}
        if self.is_postgres:
            sql = (
                f"UPDATE {RUN_TABLE} SET lease_expires_at = now() + %(ttl)s * interval '1 second' "
                f"WHERE id IN (SELECT id FROM {RUN_TABLE} WHERE id = ANY(%(ids)s) AND owner_id = %(owner)s "
                "FOR UPDATE SKIP LOCKED)"
            )
            with self.connection.cursor() as cursor:
                cursor.execute(sql, {"ttl": ttl, "ids": list(keys), "owner": owner})
        else:
            until = timezone.now() + timedelta(seconds=ttl)
            self._runs().filter(pk__in=list(held), owner_id=owner).update(lease_expires_at=until)
        current = {
            str(pk): (owner_id, epoch)
            for pk, owner_id, epoch in self._runs()
            .filter(pk__in=list(held))
            .values_list("pk", "owner_id", "owner_epoch")
        }
        return {run_id for run_id, epoch in held.items() if current.get(run_id) != (owner, epoch)}

    # -- the sweep ---------------------------------------------------------------------

    def fire_due_timers(self, batch: int) -> list[str]:
        """Fire up to ``batch`` due timers and make their runs runnable; return the run ids
        to dispatch. ``skip_locked`` lets several sweepers share the work: each timer is
        fired by exactly one of them."""
        timers = Timer.objects.using(self.alias)
        with transaction.atomic(using=self.alias):
            now = self.db_now()
            # Find candidates without locks, then lock run rows before timer rows: the
            # same order as park and claim, so the sweep never deadlocks with a turn.
            # Finalizer timers are the finalizers' (claim_due_finalizers): their runs are finished.
            due_timers = timers.due(now).exclude(kind=TimerKind.FINALIZER)
            candidates = set(due_timers.order_by("fire_at").values_list("run_id", flat=True)[:batch])
            if not candidates:
                return []
            locked_runs = list(
                self._runs()
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
            self._lose_attempts([(run, seq) for _, run, seq, kind in due if kind == TimerKind.ACTIVITY], now)
            timed_out = self._time_out_due({run for _, run, _, kind in due if kind == TimerKind.DEADLINE})
            delayed = {run for _, run, _, kind in due if kind == Timer.Kind.DELAYED_START} - timed_out
            waking = {run for _, run, _, kind in due if kind != Timer.Kind.DELAYED_START} - timed_out
            woken = list(
                self._runs()
                .filter(
                    Q(pk__in=waking, status=RunStatus.WAITING) | Q(pk__in=delayed, status=RunStatus.PENDING)
                )
                .values_list("pk", flat=True)
            )
            if woken:
                self._runs().filter(pk__in=woken).update(
                    status=RunStatus.RUNNING, ready_at=now, waiting_on=None, updated_at=now
                )
            parents = set(
                self._runs()
                .filter(pk__in=timed_out, parent__isnull=False)
                .values_list("parent_id", flat=True)
            )
        for parent in parents:
            with transaction.atomic(using=self.alias):
                if self._wake_parent(parent):
                    woken.append(parent)
        return [str(run) for run in woken]

    def wake_waiting_parents(self, batch: int) -> list[str]:
        """The sweep's backstop for child completions whose parent was not woken in the
        same transaction (a timed-out child's parent is woken after the sweep's batch):
        a parent still waiting while a child it has not recorded yet has finished."""
        finished = sorted(TERMINAL_STATUSES - {RunStatus.CONTINUED})
        candidates = list(
            self._runs()
            .filter(
                status=RunStatus.WAITING,
                children__status__in=finished,
                steps__kind=StepKind.CHILD,
                steps__status=StepStatus.WAITING,
                steps__seq=F("children__parent_seq"),
            )
            .values_list("pk", flat=True)
            .distinct()[:batch]
        )
        woken = []
        for parent in candidates:
            with transaction.atomic(using=self.alias):
                if self._wake_parent(parent):
                    woken.append(str(parent))
        return woken

    def _time_out_due(self, runs: set[Any]) -> set[Any]:
        """Time out the active runs among ``runs`` (locked by the caller, their deadline
        timers due): an external transition, so a worker still driving one is deposed."""
        timed_out = set()
        for run_pk in runs:
            run = self._runs().filter(pk=run_pk).values(*self._LOCKED_FIELDS, "execution_deadline").first()
            if run is None or run["status"] not in ACTIVE_STATUSES:
                continue
            self._time_out_locked(run_pk, run, run["execution_deadline"] or self.db_now())
            timed_out.add(run_pk)
            logger.info("run %s (%s %s): timed out", run_pk, run["workflow_name"], run["workflow_id"])
        return timed_out

    def claim_dispatch_batch(
        self, batch: int, redispatch_after: float, grace: float
    ) -> tuple[list[str], list[str]]:
        """Runnable runs and expired leases that nobody dispatched recently; marks them
        dispatched (so concurrent sweepers do not both send them) and returns the ids of
        both, runnable first.

        A run whose dispatch has not led to a claim is sent again after
        ``redispatch_after``, and then at growing intervals: a run is re-sent only once
        the time since its last dispatch is at least the time it had been waiting when
        it was dispatched. On a cluster that is behind, queues are not flooded with
        copies of the same work."""
        with transaction.atomic(using=self.alias):
            now = self.db_now()
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
                self._runs()
                .runnable()
                .alias(waited=waited("ready_at"))
                .filter(due("ready_at"))
                .select_for_update(skip_locked=True)
                .order_by("ready_at")
                .values_list("pk", flat=True)[:batch]
            )
            expired = list(
                self._runs()
                .expired_leases(now, grace)
                .alias(waited=waited("lease_expires_at"))
                .filter(due("lease_expires_at"))
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[: max(batch - len(runnable), 0)]
            )
            ids = runnable + expired
            if ids:
                self._runs().filter(pk__in=ids).update(dispatched_at=now)
        return [str(run) for run in runnable], [str(run) for run in expired]

    # -- finalizers --------------------------------------------------------------------
    #
    # A run that ends cancelled or timed out runs its workflow's finalizer activity at
    # least once. Its progress is the run's ``finalizer`` column, and its timer row
    # (seq FINALIZER_SEQ) is the durable backstop: due while an attempt is waiting to be
    # sent or retried, and the lease of a started attempt (a worker killed mid-attempt
    # lets it come due, and the sweep sends the next attempt).

    def set_finalizer_state(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, state_json: str
    ) -> None:
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
            self._runs().filter(pk=run_id).update(finalizer_state=codec.loads(state_json))

    def _schedule_finalizer(self, run_pk: Any, workflow_name: str, now: datetime) -> dict[str, Any] | None:
        definition = registry.workflows.get(workflow_name)
        if definition is not None and definition.finalizer is None:
            return None
        # A workflow this process does not know may have a finalizer: the worker that
        # takes the attempt looks it up (and drops the finalizer if there is none).
        name = definition.finalizer.name if definition is not None and definition.finalizer else None
        finalizer = {"activity": name, "status": "pending", "attempt": 0}
        self._runs().filter(pk=run_pk).update(finalizer=finalizer)
        Timer.objects.using(self.alias).update_or_create(
            run_id=run_pk,
            seq=FINALIZER_SEQ,
            kind=TimerKind.FINALIZER,
            defaults={"fire_at": now, "fired_at": None},
        )
        return finalizer

    def claim_due_finalizers(self, batch: int, resend_after: float) -> list[tuple[str, int]]:
        """Finalizer attempts to send: ``(run_id, attempt)`` for each due finalizer timer.
        An attempt that had started is lost (its lease ran out) and counts as made. The
        timer is pushed ``resend_after`` ahead, so a busy cluster is not sent it again
        every sweep; starting the attempt replaces that with the attempt's lease."""
        timers = Timer.objects.using(self.alias).filter(kind=TimerKind.FINALIZER)
        due: list[tuple[str, int]] = []
        with transaction.atomic(using=self.alias):
            now = self.db_now()
            # Run rows first, then their timers (the order start/finish_finalizer take).
            candidates = list(timers.due(now).order_by("fire_at").values_list("run_id", flat=True)[:batch])
            locked = dict(
                self._runs()
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
                if finalizer.get("status") not in ("pending", "retrying", "running"):
                    timers.filter(pk=pk).delete()
                    continue
                if finalizer["status"] == "running":
                    lost = {
                        "type": "django_weft.WorkerLost",
                        "message": "the worker running the finalizer stopped before recording it",
                    }
                    act = registry.activities.get(str(finalizer.get("activity")))
                    policy = (act.retry if act else None) or weft_settings.DEFAULT_RETRY_POLICY
                    if int(finalizer.get("attempt", 0)) >= policy.max_attempts:
                        # Lost attempts count: one that kills its worker every time ends.
                        self._runs().filter(pk=run_pk).update(
                            finalizer={**finalizer, "status": "failed", "error": lost}
                        )
                        timers.filter(pk=pk).delete()
                        continue
                    finalizer = {**finalizer, "status": "retrying", "error": lost}
                    self._runs().filter(pk=run_pk).update(finalizer=finalizer)
                timers.filter(pk=pk).update(fire_at=now + timedelta(seconds=resend_after))
                due.append((str(run_pk), int(finalizer.get("attempt", 0)) + 1))
        return due

    def start_finalizer(self, run_id: str, attempt: int, lease: float) -> tuple[str | None, Any] | None:
        """Take attempt ``attempt`` of the run's finalizer: ``(activity name, state)``, or
        ``None`` for a duplicate or stale delivery (exactly one caller takes an attempt)."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.alias):
            run = (
                self._runs().select_for_update().filter(pk=key).values("finalizer", "finalizer_state").first()
            )
            finalizer = (run or {}).get("finalizer") or {}
            if (
                finalizer.get("status") not in ("pending", "retrying")
                or finalizer.get("attempt", 0) != attempt - 1
            ):
                return None
            now = self.db_now()
            self._runs().filter(pk=key).update(
                finalizer={
                    **finalizer,
                    "status": "running",
                    "attempt": attempt,
                    "started_at": now.isoformat(),
                }
            )
            Timer.objects.using(self.alias).update_or_create(
                run_id=key,
                seq=FINALIZER_SEQ,
                kind=TimerKind.FINALIZER,
                defaults={"fire_at": now + timedelta(seconds=lease), "fired_at": None},
            )
        assert run is not None
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
        with transaction.atomic(using=self.alias):
            finalizer = (
                self._runs().select_for_update().filter(pk=key).values_list("finalizer", flat=True).first()
                or {}
            )
            if finalizer.get("status") != "running" or finalizer.get("attempt") != attempt:
                return False
            now = self.db_now()
            timers = Timer.objects.using(self.alias).filter(
                run_id=key, seq=FINALIZER_SEQ, kind=TimerKind.FINALIZER
            )
            outcome: dict[str, Any] | None = {**finalizer, "finished_at": now.isoformat()}
            assert outcome is not None
            if drop:
                outcome = None  # the workflow has no finalizer after all
                timers.delete()
            elif error is None:
                outcome.update(status="completed", result=result, error=None)
                timers.delete()
            elif retry_in is not None:
                outcome.update(status="retrying", error=error)
                timers.update(fire_at=now + timedelta(seconds=retry_in), fired_at=None)
            else:
                outcome.update(status="failed", error=error)
                timers.delete()
            self._runs().filter(pk=key).update(finalizer=outcome)
        return True

    # -- child workflows ---------------------------------------------------------------

    def start_child(self, run_id: str, owner: str, epoch: int, step: StepWrite, child: ChildStart) -> None:
        """Record the parent's child step and create the child run, in one fenced
        transaction. Raises ``WorkflowAlreadyExists`` (writing nothing) if a live run has
        the child's workflow id."""
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                self._write_step(cursor, run_id, owner, epoch, step)
            now = self.db_now()
            try:
                with transaction.atomic(using=self.alias):
                    self._runs().create(
                        id=uuid.UUID(child.run_id),
                        workflow_id=child.workflow_id,
                        workflow_name=child.workflow_name,
                        workflow_version=child.workflow_version,
                        status=RunStatus.RUNNING,
                        args=codec.loads(child.args_json),
                        kwargs=codec.loads(child.kwargs_json),
                        parent_id=uuid.UUID(str(run_id)),
                        parent_seq=step.seq,
                        parent_close_policy=child.parent_close_policy,
                        ready_at=now,
                    )
            except IntegrityError:
                raise WorkflowAlreadyExists(
                    f"a live run with workflow id {child.workflow_id!r} exists; a child workflow needs an "
                    "id of its own (pass id=... to ctx.start_child)",
                    workflow_id=child.workflow_id,
                ) from None
            self._announce(signals.run_started, child.run_id, child.workflow_id, child.workflow_name)

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        """How the child started at ``seq`` ended, or ``None`` while it (or the run it
        continued as) is live."""
        # A continue-as-new chain has one run that is not ``continued``: its last.
        latest = (
            self._runs()
            .filter(parent_id=uuid.UUID(str(run_id)), parent_seq=seq)
            .exclude(status=RunStatus.CONTINUED)
            .order_by("-created_at")
            .values("pk", "workflow_id", "status", "result", "error")
            .first()
        )
        if latest is None:
            if self._runs().filter(parent_id=uuid.UUID(str(run_id)), parent_seq=seq).exists():
                return None  # only continued runs: the successor's row is not visible yet
            return ChildOutcome("", "", RunStatus.FAILED, error={"type": "django_weft.ChildGone",
                                "message": "the child run no longer exists (purged)"})  # fmt: skip
        if latest["status"] in ACTIVE_STATUSES:
            return None
        return ChildOutcome(
            str(latest["pk"]), latest["workflow_id"], latest["status"], latest["result"], latest["error"]
        )

    def _wake_parent(self, parent_pk: Any) -> str | None:
        """After a child's terminal write (in its transaction): make the parent runnable if
        it is parked waiting for what just happened. Returns the parent's id if woken."""
        parent = self._runs().select_for_update().filter(pk=parent_pk).values("status", "waiting_on").first()
        if parent is None or parent["status"] != RunStatus.WAITING:
            return None
        if not self._wait_satisfied(str(parent_pk), parent["waiting_on"]):
            return None
        now = self.db_now()
        self._runs().filter(pk=parent_pk).update(
            status=RunStatus.RUNNING, ready_at=now, waiting_on=None, dispatched_at=None, updated_at=now
        )
        return str(parent_pk)

    def close_children(self, run_id: str, reason: str) -> list[str]:
        """Apply the parent-close policy to the live children of a closed run: cancel those
        with "terminate" or "request_cancel" (each in a transaction of its own, after the
        parent's), and theirs in turn. Returns the ids cancelled."""
        cancelled: list[str] = []
        children = list(
            self._runs()
            .filter(parent_id=uuid.UUID(str(run_id)), status__in=list(ACTIVE_STATUSES))
            .exclude(parent_close_policy="abandon")
            .values_list("pk", flat=True)
        )
        for child in children:
            try:
                with transaction.atomic(using=self.alias):
                    self.cancel(child, reason)
            except (WorkflowTerminalError, WorkflowNotFound):
                continue  # finished meanwhile
            cancelled.append(str(child))
            cancelled += self.close_children(str(child), f"its parent run {child} was cancelled")
        return cancelled

    def close_orphaned_children(self, batch: int) -> list[str]:
        """The sweep's backstop for :meth:`close_children` (a process that closed a parent
        and died before its children were handled): live children of finished parents
        whose policy is not "abandon"."""
        orphans = list(
            self._runs()
            .filter(parent__isnull=False, status__in=list(ACTIVE_STATUSES))
            .filter(parent__status__in=sorted(TERMINAL_STATUSES))
            .exclude(parent_close_policy="abandon")
            .values_list("parent_id", flat=True)
            .distinct()[:batch]
        )
        cancelled: list[str] = []
        for parent in orphans:
            cancelled += self.close_children(str(parent), f"its parent run {parent} closed")
        return cancelled

    # -- external transitions (DESIGN §4) ----------------------------------------------
    #
    # Cancel, time-out and suspend may be committed by any process, owner or not. Each
    # locks the run row, writes the new status and rotates the epoch (owner cleared) in
    # one transaction, so a still-running owner's next fenced write fails (Deposed)
    # instead of overwriting the new state. Resume and retry make the run runnable for a
    # worker to claim; they take no lease themselves.

    _LOCKED_FIELDS = ("status", "workflow_id", "workflow_name", "waiting_on", "error", "parent_id")

    def _lock_run(self, run_pk: Any) -> dict[str, Any]:
        run = self._runs().select_for_update().filter(pk=run_pk).values(*self._LOCKED_FIELDS).first()
        if run is None:
            raise WorkflowNotFound(f"run {run_pk} does not exist", ref=str(run_pk))
        return run

    @staticmethod
    def _refuse(
        run_pk: Any, run: dict[str, Any], action: str, needs: str, *, terminal: bool = True
    ) -> Exception:
        label = f"run {run_pk} ({run['workflow_name']} {run['workflow_id']}) is {run['status']}"
        if terminal and run["status"] in TERMINAL_STATUSES:
            return WorkflowTerminalError(
                f"{label}: a finished run cannot be {action}",
                run_id=str(run_pk),
                workflow_id=run["workflow_id"],
                status=run["status"],
            )
        return InvalidTransition(
            f"{label}; only {needs} run can be {action}",
            run_id=str(run_pk),
            status=run["status"],
        )

    def _transition_now(self) -> datetime:
        """The database clock *after* the row lock was taken (``clock_timestamp()``, not the
        transaction's start): later than every commit the lock waited for."""
        if not self.is_postgres:
            return timezone.now()
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return _aware(cursor.fetchone()[0])

    def _close(
        self,
        run_pk: Any,
        run: dict[str, Any],
        status: str,
        error: dict[str, Any],
        category: str,
        *,
        wake_parent: bool = True,
    ) -> None:
        """Close a locked run externally: terminal status, epoch rotated, owner cleared,
        unfired timers removed, pending updates failed."""
        now = self._transition_now()
        self._runs().filter(pk=run_pk).update(
            status=status,
            error=error,
            failure_category=category,
            owner_id=None,
            owner_epoch=F("owner_epoch") + 1,
            lease_expires_at=None,
            ready_at=None,
            dispatched_at=None,
            waiting_on=None,
            finished_at=now,
            updated_at=now,
        )
        Timer.objects.using(self.alias).filter(run_id=run_pk).unfired().delete()
        Update.objects.using(self.alias).filter(run_id=run_pk, status=UpdateStatus.ACCEPTED).update(
            status=UpdateStatus.FAILED,
            error={"type": f"django_weft.Run{status.title().replace('_', '')}", "message": error["message"]},
            updated_at=now,
        )
        run["finalizer"] = self._schedule_finalizer(run_pk, run["workflow_name"], now)
        signal = signals.run_cancelled if status == RunStatus.CANCELLED else signals.run_timed_out
        self._announce(signal, run_pk, run["workflow_id"], run["workflow_name"], error=error)
        if run["parent_id"] is not None and wake_parent:
            run["woken_parent"] = self._wake_parent(run["parent_id"])

    def cancel(self, run_pk: Any, reason: str | None) -> dict[str, Any]:
        """Cancel an active (pending, running, waiting or suspended) run, in the caller's
        transaction. Raises ``WorkflowTerminalError`` for a finished run."""
        run = self._lock_run(run_pk)
        if run["status"] not in ACTIVE_STATUSES:
            raise self._refuse(run_pk, run, "cancelled", "an active")
        message = f"cancelled: {reason}" if reason else "cancelled"
        error = {"type": "django_weft.Cancelled", "message": message, "reason": reason}
        self._close(run_pk, run, RunStatus.CANCELLED, error, FailureCategory.CANCELLATION)
        return {**run, "status": RunStatus.CANCELLED}

    def _time_out_locked(self, run_pk: Any, run: dict[str, Any], deadline: datetime) -> None:
        error = {
            "type": "django_weft.ExecutionTimeout",
            "message": f"the run passed its execution deadline ({deadline.isoformat()})",
        }
        # The sweep holds a batch of run rows, ancestors among them possibly: the parent
        # is woken after the batch commits, in a transaction of its own.
        self._close(run_pk, run, RunStatus.TIMED_OUT, error, FailureCategory.TIMEOUT, wake_parent=False)

    def suspend(self, run_pk: Any) -> dict[str, Any]:
        """Suspend a running or waiting run, in the caller's transaction: it keeps its
        history, timers and messages, and no worker drives it until it is resumed."""
        run = self._lock_run(run_pk)
        if run["status"] not in (RunStatus.RUNNING, RunStatus.WAITING):
            raise self._refuse(run_pk, run, "suspended", "a running or waiting")
        now = self._transition_now()
        self._runs().filter(pk=run_pk).update(
            status=RunStatus.SUSPENDED,
            owner_id=None,
            owner_epoch=F("owner_epoch") + 1,
            lease_expires_at=None,
            ready_at=None,
            dispatched_at=None,
            updated_at=now,
        )
        self._announce(signals.run_suspended, run_pk, run["workflow_id"], run["workflow_name"])
        return {**run, "status": RunStatus.SUSPENDED}

    def resume(self, run_pk: Any, *, dispatched: bool) -> dict[str, Any]:
        """Make a suspended run runnable again, in the caller's transaction. Its next turn
        replays to where it waits and re-arms that wait's timer with its original fire
        time (a time that passed while suspended fires at once)."""
        run = self._lock_run(run_pk)
        if run["status"] != RunStatus.SUSPENDED:
            raise self._refuse(run_pk, run, "resumed", "a suspended")
        self._make_runnable(run_pk, dispatched)
        self._announce(signals.run_resumed, run_pk, run["workflow_id"], run["workflow_name"])
        return {**run, "status": RunStatus.RUNNING}

    def _make_runnable(self, run_pk: Any, dispatched: bool, **fields: Any) -> None:
        now = self._transition_now()
        self._runs().filter(pk=run_pk).update(
            status=RunStatus.RUNNING,
            ready_at=now,
            dispatched_at=now if dispatched else None,
            waiting_on=None,
            updated_at=now,
            **fields,
        )

    def reactivate(self, run_pk: Any, *, dispatched: bool) -> dict[str, Any]:
        """Make a failed run runnable again, in the caller's transaction. The step whose
        failure failed the run (and anything recorded after it) is removed, so it is
        attempted afresh; every step before it replays. After a non-determinism failure
        nothing is removed: the fixed code replays the history as it is."""
        run = self._lock_run(run_pk)
        if run["status"] != RunStatus.FAILED:
            raise self._refuse(run_pk, run, "retried", "a failed", terminal=False)
        error = run["error"] or {}
        failed_seq = error.get("seq") if isinstance(error.get("seq"), int) else None
        try:
            with transaction.atomic(using=self.alias):
                self._make_runnable(
                    run_pk,
                    dispatched,
                    error=None,
                    result=None,
                    failure_category="",
                    finished_at=None,
                    attempt=F("attempt") + 1,
                    owner_epoch=F("owner_epoch") + 1,
                )
        except IntegrityError:
            raise InvalidTransition(
                f"run {run_pk} cannot be retried: another run with workflow id {run['workflow_id']!r} "
                "is active now",
                run_id=str(run_pk),
                status=run["status"],
            ) from None
        if failed_seq is not None:
            Step.objects.using(self.alias).filter(run_id=run_pk, seq__gte=failed_seq).delete()
            # Signals those steps consumed go back to the buffer, to be consumed again.
            Signal.objects.using(self.alias).filter(run_id=run_pk, consumed_seq__gte=failed_seq).update(
                consumed_seq=None
            )
        Timer.objects.using(self.alias).filter(run_id=run_pk).delete()
        deadline = self._runs().filter(pk=run_pk).values_list("execution_deadline", flat=True).first()
        if deadline is not None:
            # The deadline still holds (one already passed times the run out at the next sweep).
            Timer.objects.using(self.alias).create(
                run_id=run_pk, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=deadline
            )
        return {**run, "status": RunStatus.RUNNING, "removed_from": failed_seq}

    def _discard_wake(self, run_id: str, status: str | None) -> str:
        """A wake-up (a turn's doorbell, say a timer's) reached an engine that cannot claim
        the run: it is discarded. The run's timers are kept while it is running or waiting
        (its owner, or the sweep, needs them) and collected when it is gone, finished or
        suspended (resume re-arms the wait's timer; a suspended run keeps its deadline and
        its queued attempts' leases)."""
        if status in (RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PENDING):
            return "kept"
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.alias):
            # Read again under the row lock: a resume and a new park in between would
            # have re-armed the very timer rows this would delete.
            status = self._runs().select_for_update().filter(pk=key).values_list("status", flat=True).first()
            if status in (RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PENDING):
                return "kept"
            return self._collect_timers(run_id, key, status)

    def _collect_timers(self, run_id: str, key: uuid.UUID, status: str | None) -> str:
        timers = Timer.objects.using(self.alias).filter(run_id=key).unfired()
        if status == RunStatus.SUSPENDED:
            timers = timers.exclude(kind__in=[TimerKind.DEADLINE, TimerKind.ACTIVITY, TimerKind.FINALIZER])
        elif status is not None:
            timers = timers.exclude(kind=TimerKind.FINALIZER)
        collected, _ = timers.delete()
        if collected:
            timer_log.info("run %s (%s): collected %d orphaned timer(s)", run_id, status or "gone", collected)
        return "collected"

    def purge_terminal_before(self, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` terminal runs last updated before ``cutoff``."""
        with transaction.atomic(using=self.alias):
            # Not a run whose finalizer has yet to run, nor a parent of live children: a
            # child finishing locks its row, then its parent's; purging it here would lock
            # the parent, then the child (the wrong order).
            ids = list(
                self._runs()
                .terminal()
                .filter(updated_at__lt=cutoff)
                .exclude(finalizer__status__in=["pending", "running", "retrying"])
                .exclude(children__status__in=list(ACTIVE_STATUSES))
                .select_for_update(skip_locked=True, of=("self",))
                .values_list("pk", flat=True)[:batch]
            )
            if not ids:
                return 0
            WorkflowRun.objects.using(self.alias).filter(parent_id__in=ids).update(parent=None)
            self._runs().filter(pk__in=ids).delete()
        return len(ids)
