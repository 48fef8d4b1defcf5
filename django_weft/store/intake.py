"""Intake: what clients send in (new runs, signals, updates). Nothing here takes a lease:
the run is left unowned and runnable for a worker to claim."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache, partial
from typing import Any

from django.db import models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .. import signals
from ..engine.errors import (
    UnknownHandler,
    WorkflowNotFound,
    WorkflowTerminalError,
)
from ..engine.observe import Carrier
from ..engine.parking import handled_updates, unknown_update_error
from ..engine.records import RUN_LEVEL_SEQ, TERMINAL_STATUSES, RunStatus, TimerKind
from ..models import Signal, Timer, Update, WorkflowRun
from ..models.messages import UpdateStatus
from .base import unanswered_error
from .notices import NOTICE_HORIZON, NOTIFY_CHANNEL, work_notice
from .sql import StoreSql
from .statement_parts import RUN_TABLE, SIGNAL_TABLE

_DELIVER_SIGNAL_SQL = (
    # The run's row lock first, as every writer takes it: it orders the run's signals
    # and serialises the insert with the run's park (see Intake._lock_for_message).
    f"WITH locked AS (SELECT id, status, waiting_on, workflow_id, workflow_name, priority FROM {RUN_TABLE} "
    "WHERE id = %(id)s FOR UPDATE), "
    f"stored AS (INSERT INTO {SIGNAL_TABLE} (run_id, name, payload, signal_id, received_at, consumed_seq, "
    "trace_context) SELECT locked.id, %(name)s, %(payload)s, %(signal_id)s, %(received)s, NULL, %(trace)s "
    "FROM locked WHERE NOT locked.status = ANY(%(terminal)s) "
    "ON CONFLICT (run_id, name, signal_id) WHERE signal_id IS NOT NULL DO NOTHING RETURNING id), "
    # A parked run that waits for this signal (or handles it) is runnable again.
    f"woken AS (UPDATE {RUN_TABLE} AS run SET status = %(running)s, ready_at = {{now}}, waiting_on = NULL, "
    "dispatched_at = CASE WHEN %(dispatched)s THEN {now} END, updated_at = {now} FROM locked "
    "WHERE run.id = locked.id AND locked.status = %(waiting)s "
    "AND COALESCE(locked.waiting_on -> 'signals', '[]'::jsonb) ? %(name)s "
    "AND EXISTS (SELECT 1 FROM stored) RETURNING run.id), "
    # The notice's payload as notices.work_notice writes it: "<run id> <priority>".
    "notice AS (SELECT pg_notify(%(channel)s, locked.id::text || ' ' || locked.priority::text) "
    "FROM woken, locked WHERE %(notify)s) "
    "SELECT locked.status, locked.workflow_id, locked.workflow_name, (SELECT id FROM stored), "
    "EXISTS (SELECT 1 FROM woken), (SELECT count(*) FROM notice) FROM locked"
)
"""Intake.deliver_signal on PostgreSQL, in one statement; ``{now}`` is the time it writes
(:meth:`StoreSql.sql_now`)."""


class _RunInsert:
    """A new run's ``INSERT`` on PostgreSQL, written once per process from the model's
    fields and prepared on each connection (:meth:`StoreSql.fetch_prepared`): Django's
    insert compiler and its client-side quoting of some forty values cost a start about
    a third of its CPU, and the server parsed and planned the statement every time
    (docs/benchmarks.md, "Starts prepared"). Every column is written as ``save()``
    writes it: the instance's value (a field's default where the start gave none),
    ``auto_now`` times from :meth:`~django.db.models.Field.pre_save`; ``ready_at`` and
    ``dispatched_at`` are the statement's time (or the virtual clock's, ``now``). The
    notice to the listening workers is in the same statement when ``notify`` is true."""

    def __init__(self) -> None:
        moment = "COALESCE(%(now)s::timestamptz, statement_timestamp())"
        columns = ["ready_at", "dispatched_at"]
        values = [moment, f"CASE WHEN %(dispatched)s THEN {moment} END"]
        self.fields: list[tuple[str, str, Any]] = []
        for field in WorkflowRun._meta.local_concrete_fields:
            if field.generated or field.attname in ("ready_at", "dispatched_at"):
                continue
            if isinstance(field, models.JSONField):
                kind = "json"
            elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
                kind = "stamp"
            else:
                kind = "native" if isinstance(field, _NATIVE_FIELDS) else "prepared"
            columns.append(f'"{field.column}"')
            values.append(f"%({field.attname})s::jsonb" if kind == "json" else f"%({field.attname})s")
            self.fields.append((field.attname, kind, field))
        self.statement = (
            f"WITH inserted AS (INSERT INTO {RUN_TABLE} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
            "RETURNING 1) SELECT pg_notify(%(channel)s, %(notice)s) FROM inserted WHERE %(notify)s"
        )

    def params(self, run: WorkflowRun, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        """The values of ``run``'s columns, as the database takes them (psycopg adapts
        UUIDs, strings, numbers and aware times itself; JSON is sent as text)."""
        params: dict[str, Any] = {}
        for attname, kind, field in self.fields:
            if kind == "native":
                params[attname] = getattr(run, attname)
            elif kind == "json":  # None is SQL NULL, as Django writes it
                value = getattr(run, attname)
                params[attname] = None if value is None else json.dumps(value, cls=field.encoder)
            elif kind == "stamp":
                params[attname] = field.pre_save(run, True)
            else:
                params[attname] = field.get_db_prep_save(getattr(run, attname), connection)
        return params


_NATIVE_FIELDS = (
    models.UUIDField,
    models.CharField,
    models.IntegerField,
    models.BooleanField,
    models.DateTimeField,
    models.ForeignKey,
)
"""Fields whose Python value psycopg adapts as Django would (no conversion on the way)."""


@cache
def _run_insert() -> _RunInsert:
    """The process's one :class:`_RunInsert` (the model's fields do not change)."""
    return _RunInsert()


@dataclass(frozen=True)
class SignalDelivery:
    """What :meth:`Intake.deliver_signal` did."""

    signal: Signal
    """The signal stored, or for a repeated ``signal_id`` the one stored first."""
    duplicate: bool
    woken: bool
    """Whether the signal made its parked run runnable."""
    workflow_id: str
    workflow_name: str


class Intake:
    """New runs, signals and updates from clients; none of it takes a lease."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def insert_runnable_run(
        self, run_id: uuid.UUID, fields: dict[str, Any], *, dispatched: bool, notify: bool = False
    ) -> WorkflowRun:
        """Insert a runnable run whose workflow id is its run id, in one INSERT (autocommit
        is fine: a new id cannot conflict). ``dispatched``: the caller rings its doorbell.
        ``notify``: tell the listening workers (:meth:`notify_workers`) in the same
        statement on PostgreSQL, so a start outside a transaction is one round trip and
        one commit. Returns the instance as inserted: ``ready_at`` and ``dispatched_at``
        hold the database's ``now()`` expression, not their values."""
        values = {
            "id": run_id,
            "workflow_id": str(run_id),
            "status": RunStatus.RUNNING,
            "ready_at": self.sql.now_value(),
            "dispatched_at": self.sql.now_value() if dispatched else None,
            **fields,
        }
        if not self.sql.is_postgres:
            return self.sql.runs().create(**values)
        run = WorkflowRun(**values)
        insert = _run_insert()
        params = insert.params(run, self.sql.connection)
        params.update(
            now=None if self.sql.clock_in_sql else self.sql.local_now(),
            dispatched=dispatched,
            notify=notify,
            channel=NOTIFY_CHANNEL,
            notice=work_notice(str(run_id), run.priority),
        )
        self.sql.fetch_prepared(insert.statement, params)
        run._state.adding = False
        run._state.db = self.sql.alias
        return run

    def create_run(
        self,
        run_id: uuid.UUID,
        workflow_id: str | None,
        fields: dict[str, Any],
        *,
        timeout: float | None,
        delay: float | None,
        dispatched: bool,
        now: datetime | None = None,
    ) -> tuple[WorkflowRun, datetime | None]:
        """Insert the run with its deadline and delayed-start timers, in the caller's
        transaction; returns the run and, for a delayed start, when it starts. A delayed
        run is ``pending``, any other runnable unless ``fields`` say otherwise (a run
        queued for a concurrency slot). ``dispatched``: the caller rings the doorbell of a
        runnable run on commit. ``now``: the time the start counts from (the database
        clock's by default)."""
        if now is None:
            now = self.sql.db_now()
        # A run whose doorbell is rung on commit counts as dispatched, so the sweep does not
        # send a second message before a worker had the chance to claim it.
        dispatched_at = now if dispatched and not delay else None
        values: dict[str, Any] = {
            "id": run_id,
            "workflow_id": workflow_id or str(run_id),
            "status": RunStatus.PENDING if delay else RunStatus.RUNNING,
            "ready_at": None if delay else now,
            "dispatched_at": dispatched_at,
            "execution_deadline": now + timedelta(seconds=timeout) if timeout is not None else None,
        }
        # ``fields`` may set the status: a run queued for a concurrency slot is pending.
        run = self.sql.runs().create(**{**values, **fields})
        if run.execution_deadline is not None:
            # The deadline is a timer: the sweep times the run out when it fires.
            Timer.objects.using(self.sql.alias).create(
                run=run, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=run.execution_deadline
            )
        if not delay:
            return run, None
        fire_at = now + timedelta(seconds=delay)
        Timer.objects.using(self.sql.alias).create(
            run=run, seq=RUN_LEVEL_SEQ, kind=TimerKind.DELAYED_START, fire_at=fire_at
        )
        return run, fire_at

    def latest_run_locked(self, workflow_id: str) -> WorkflowRun | None:
        """The live run with ``workflow_id`` if there is one (at most one exists), else the
        newest finished one; in the caller's transaction, which on PostgreSQL then holds
        the advisory lock of starts by that id (so "look, then create" cannot interleave)."""
        if self.sql.is_postgres:
            self.sql.lock_workflow_id(workflow_id)
        runs = self.sql.runs().for_workflow_id(workflow_id)
        return runs.active().first() or runs.first()

    def notify_workers(self, run_id: str, *, priority: int = 0, eta: datetime | None = None) -> bool:
        """On PostgreSQL, tell the workers that listen (``weft_worker``) that run
        ``run_id`` has work, with a ``NOTIFY`` on :data:`NOTIFY_CHANNEL`: it is delivered
        when the current transaction commits and dropped if it rolls back (at once
        outside one). Whether it was sent: not on other databases, nor for work due
        later than :data:`~.notices.NOTICE_HORIZON` (its timer wakes it). Every listener
        tries to claim the run; one wins, the others' claims find it owned."""
        if not self.sql.is_postgres:
            return False
        if eta is not None and (eta - self.sql.local_now()).total_seconds() > NOTICE_HORIZON:
            return False
        with self.sql.connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, work_notice(run_id, priority, eta)])
        return True

    def announce_run_started(self, run_id: str | uuid.UUID, workflow_id: str, workflow_name: str) -> None:
        """Send ``run_started`` once the current transaction commits."""
        self.sql.announce(signals.run_started, run_id, workflow_id, workflow_name)

    def _lock_for_message(self, run_pk: uuid.UUID) -> Mapping[str, Any]:
        """Lock the run row for a message insert and check the run takes messages.

        Taking the row lock serialises the insert with the run's park (which reads the
        pending messages under the same lock): either the park sees the message and the
        run stays runnable, or the insert sees the parked run and wakes it. It also
        numbers a run's messages in commit order."""
        run = (
            self.sql.runs()
            .select_for_update()
            .filter(pk=run_pk)
            .values("status", "waiting_on", "workflow_id", "workflow_name", "priority")
            .first()
        )
        if run is None:
            raise WorkflowNotFound(f"run {run_pk} no longer exists", ref=str(run_pk))
        return run

    def _check_not_terminal(self, run_pk: uuid.UUID, run: Mapping[str, Any], what: str) -> None:
        if run["status"] in TERMINAL_STATUSES:
            raise WorkflowTerminalError(
                f"run {run_pk} ({run['workflow_name']} {run['workflow_id']}) is {run['status']}: a "
                f"finished run takes no {what}; start a new run",
                run_id=str(run_pk),
                workflow_id=run["workflow_id"],
                workflow_name=run["workflow_name"],
                status=run["status"],
            )

    def _wake_for_message(
        self, run_pk: uuid.UUID, run: Mapping[str, Any], names_key: str, name: str, dispatched: bool
    ) -> bool:
        """Make a parked run runnable if ``name`` is among what it waits for or handles."""
        waiting_on = run["waiting_on"] or {}
        if run["status"] != RunStatus.WAITING or name not in (waiting_on.get(names_key) or []):
            return False
        now = self.sql.db_now()
        self.sql.runs().filter(pk=run_pk).update(
            status=RunStatus.RUNNING,
            ready_at=now,
            waiting_on=None,
            dispatched_at=now if dispatched else None,
            updated_at=now,
        )
        return True

    def deliver_signal(
        self,
        run_pk: uuid.UUID,
        name: str,
        payload: Any,
        signal_id: str | None,
        *,
        dispatched: bool,
        trace_context: Carrier | None = None,
        notify: bool = False,
    ) -> SignalDelivery:
        """Store a signal for the run, in the caller's transaction if there is one (else in
        one of its own). A repeated ``signal_id`` returns the stored signal.
        ``trace_context`` is the sender's (:func:`..engine.observe.start_carrier`).
        ``notify``: a run it wakes is told to the listening workers
        (:meth:`notify_workers`). Raises ``WorkflowNotFound`` for a run that does not exist
        and ``WorkflowTerminalError`` for a finished one (storing nothing).

        On PostgreSQL one statement locks the run, stores the signal, wakes the run if it
        waits for the signal, and sends the notice: one round trip, and outside a
        transaction one commit."""
        if self.sql.is_postgres:
            at_once = self._deliver_signal_at_once
            deliver = partial(at_once, run_pk, name, payload, signal_id, dispatched, trace_context, notify)
            if not self.sql.connection.in_atomic_block:
                return deliver()
            # In the caller's transaction, a savepoint: a refusal or an error leaves it usable.
            with transaction.atomic(using=self.sql.alias):
                return deliver()
        with transaction.atomic(using=self.sql.alias):
            run = self._lock_for_message(run_pk)
            delivery = self._deliver_signal(run_pk, run, name, payload, signal_id, dispatched, trace_context)
            if delivery.woken and notify:
                self.notify_workers(str(run_pk), priority=run["priority"])
            return delivery

    def _deliver_signal_at_once(
        self,
        run_pk: uuid.UUID,
        name: str,
        payload: Any,
        signal_id: str | None,
        dispatched: bool,
        trace_context: Carrier | None,
        notify: bool,
    ) -> SignalDelivery:
        connection = self.sql.connection
        fields = {field.name: field for field in Signal._meta.concrete_fields}
        received = timezone.now()
        params = {
            "id": self.sql.run_key(run_pk),
            "name": name,
            "payload": fields["payload"].get_db_prep_save(payload, connection),
            "signal_id": signal_id,
            "received": self.sql.dt(received),
            "trace": fields["trace_context"].get_db_prep_save(trace_context, connection),
            "terminal": sorted(TERMINAL_STATUSES),
            "waiting": RunStatus.WAITING,
            "running": RunStatus.RUNNING,
            "dispatched": dispatched,
            "notify": notify,
            "channel": NOTIFY_CHANNEL,
        }
        # Prepared: the server plans this statement once per connection, not per signal.
        row = self.sql.fetch_prepared(_DELIVER_SIGNAL_SQL.format(now=self.sql.sql_now(params)), params)
        if row is None:
            raise WorkflowNotFound(f"run {run_pk} no longer exists", ref=str(run_pk))
        status, workflow_id, workflow_name, signal_pk, woken, _ = row
        if signal_pk is None:
            if signal_id is not None:
                # Stored before (ON CONFLICT): that acceptance is the answer, as for a repeat
                # that arrives after the run finished.
                existing = (
                    Signal.objects.using(self.sql.alias)
                    .filter(run_id=run_pk, name=name, signal_id=signal_id)
                    .first()
                )
                if existing is not None:
                    return SignalDelivery(existing, True, False, workflow_id, workflow_name)
            run = {"status": status, "workflow_id": workflow_id, "workflow_name": workflow_name}
            self._check_not_terminal(run_pk, run, "signals")
            raise AssertionError(f"run {run_pk}: signal {name} was neither stored nor found stored")
        stored = Signal(
            id=signal_pk,
            run_id=run_pk,
            name=name,
            payload=payload,
            signal_id=signal_id,
            received_at=received,
            trace_context=trace_context,
        )
        stored._state.adding = False
        stored._state.db = self.sql.alias
        return SignalDelivery(stored, False, bool(woken), workflow_id, workflow_name)

    def _deliver_signal(
        self,
        run_pk: uuid.UUID,
        run: Mapping[str, Any],
        name: str,
        payload: Any,
        signal_id: str | None,
        dispatched: bool,
        trace_context: Carrier | None,
    ) -> SignalDelivery:
        """:meth:`deliver_signal` for the ``run`` locked by :meth:`_lock_for_message`."""
        names = run["workflow_id"], run["workflow_name"]
        signals = Signal.objects.using(self.sql.alias)
        if signal_id is not None:
            # Repeats serialise on the run row lock, so this look-up sees a concurrent one.
            existing = signals.filter(run_id=run_pk, name=name, signal_id=signal_id).first()
            if existing is not None:
                return SignalDelivery(existing, True, False, *names)
        self._check_not_terminal(run_pk, run, "signals")
        stored = signals.create(
            run_id=run_pk, name=name, payload=payload, signal_id=signal_id, trace_context=trace_context
        )
        woken = self._wake_for_message(run_pk, run, "signals", name, dispatched)
        return SignalDelivery(stored, False, woken, *names)

    def accept_update(
        self,
        run_pk: uuid.UUID,
        update_id: str,
        name: str,
        payload: Any,
        *,
        dispatched: bool,
        validated: bool = True,
        trace_context: Carrier | None = None,
    ) -> tuple[Update, bool, bool]:
        """Store an accepted update, in the caller's transaction; returns ``(update,
        created, woken)``. An ``update_id`` stored meanwhile returns that update.
        ``validated=False``: the run checks it against its handler when it applies it."""
        run = self._lock_for_message(run_pk)
        updates = Update.objects.using(self.sql.alias)
        existing = updates.filter(run_id=run_pk, update_id=update_id).first()
        if existing is not None:
            return existing, False, False
        self._check_not_terminal(run_pk, run, "updates")
        if not validated:
            # The caller saw the run before it blocked; it may have parked since. Parked
            # without this handler, it will not apply the update: refuse it, store nothing.
            handled = handled_updates(run["waiting_on"], run["status"])
            if handled is not None and name not in handled:
                error = unknown_update_error(name, handled)
                raise UnknownHandler(
                    f"run {run_pk}: {error['message']}",
                    kind="update",
                    name=name,
                    registered=error["registered"],
                )
        stored = updates.create(
            run_id=run_pk,
            update_id=update_id,
            name=name,
            payload=payload,
            validated=validated,
            trace_context=trace_context,
        )
        return stored, True, self._wake_for_message(run_pk, run, "updates", name, dispatched)

    def fail_abandoned_update(self, pk: int) -> bool:
        """Fail the update ``pk`` if it is still ``accepted`` although its run has
        finished, as the finish fails the updates it leaves unanswered; ``True`` if it
        did. On PostgreSQL the finish is one statement, whose snapshot may be older than
        an update whose sender held the run's row lock while the finish waited for it:
        that update is left ``accepted``, and is answered here when its caller looks."""
        updates = Update.objects.using(self.sql.alias)
        with transaction.atomic(using=self.sql.alias):
            status = (
                updates.filter(pk=pk, status=UpdateStatus.ACCEPTED)
                .values_list("run__status", flat=True)
                .first()
            )
            if status not in TERMINAL_STATUSES:
                return False
            return bool(
                updates.filter(pk=pk, status=UpdateStatus.ACCEPTED).update(
                    status=UpdateStatus.FAILED,
                    error=unanswered_error(status),
                    updated_at=self.sql.now_value(),
                )
            )
