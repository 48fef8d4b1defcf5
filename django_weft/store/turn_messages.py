"""The engine's port for messages during a turn: pending signals and updates, consuming
a signal, applying and answering an update, receiving a cancellation request; all
fenced; and what a running activity reads to learn its run asked for cancellation."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.db.models import BooleanField, CharField, IntegerField, Value

from ..engine import codec
from ..engine.attempt import cancellation_seen
from ..engine.records import (
    CancelRequest,
    MessageKind,
    PendingMessage,
    StepWrite,
    TimerKind,
)
from ..models import Signal, Timer, Update
from ..models.messages import UpdateStatus
from .base import deposed
from .sql import StoreSql
from .statement_parts import (
    OWNED_BY_KEY,
    RUN_TABLE,
    SIGNAL_TABLE,
    STEP_COLUMNS,
    STEP_ON_CONFLICT,
    STEP_TABLE,
    TIMER_TABLE,
    UNFIRED,
    UPDATE_TABLE,
)

_FINISH_WAIT_SQL: str | None = None
""":meth:`TurnMessages.finish_wait` on PostgreSQL, built once (:func:`_finish_wait_sql`)."""


def _finish_wait_sql(sql: StoreSql) -> str:
    """A wait's step, the signal it consumed and its timeout timer's removal, fenced, in one
    statement. The fence locks the run row first, as every writer does. The signal is
    consumed, the step written and the timer dropped only if the fence holds, and the step
    only if the signal was still unconsumed, so a refused write leaves everything as it was.
    Returns whether the fence held and whether the step was written."""
    global _FINISH_WAIT_SQL
    if _FINISH_WAIT_SQL is None:
        _FINISH_WAIT_SQL = (
            f"WITH fence AS (SELECT id FROM {RUN_TABLE} WHERE {OWNED_BY_KEY}FOR UPDATE), "
            f"consumed AS (UPDATE {SIGNAL_TABLE} SET consumed_seq = %(seq)s WHERE id = %(signal)s "
            "AND run_id = %(id)s AND consumed_seq IS NULL AND EXISTS (SELECT 1 FROM fence) RETURNING id), "
            f"written AS (INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT fence.id, {sql.step_values()} "
            "FROM fence WHERE %(signal)s::bigint IS NULL OR EXISTS (SELECT 1 FROM consumed) "
            f"{STEP_ON_CONFLICT} RETURNING id), "
            f"dropped AS (DELETE FROM {TIMER_TABLE} WHERE run_id = %(id)s AND seq = %(seq)s "
            f"AND {UNFIRED}AND EXISTS (SELECT 1 FROM written)) "
            "SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM written)"
        )
    return _FINISH_WAIT_SQL


_UPDATE_STEP_SQL: dict[tuple[str, str, str], str] = {}
"""The statements of :meth:`TurnMessages.apply_update` and :meth:`TurnMessages.answer_update`
on PostgreSQL, by what they set and the time expression (:func:`_update_step_sql`)."""


def _update_step_sql(sql: StoreSql, assignments: str, condition: str, now: str) -> str:
    """A step and a change to the update it is for (``assignments``, then ``updated_at``,
    where ``condition`` holds), fenced, in one statement: the update row changes only if
    the step was written, which it is only if the fence holds. Returns whether the fence
    held."""
    key = (assignments, condition, now)
    statement = _UPDATE_STEP_SQL.get(key)
    if statement is None:
        statement = _UPDATE_STEP_SQL[key] = (
            f"WITH fence AS (SELECT id FROM {RUN_TABLE} WHERE {OWNED_BY_KEY}FOR UPDATE), "
            f"written AS (INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT fence.id, {sql.step_values()} "
            f"FROM fence {STEP_ON_CONFLICT} RETURNING id), "
            f"changed AS (UPDATE {UPDATE_TABLE} SET {assignments}, updated_at = {now} "
            f"WHERE id = %(update)s AND run_id = %(id)s AND {condition} AND EXISTS (SELECT 1 FROM written)) "
            "SELECT EXISTS (SELECT 1 FROM fence)"
        )
    return statement


class TurnMessages:
    """The owner's side of signals and updates during a turn, fenced on (owner, epoch):
    the message half of the engine's port, which
    :class:`~django_weft.store.RunTurns` hands on to it."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        """Unconsumed signals and accepted, unapplied updates of the run, oldest first.

        Signals and updates to one run are inserted under the run's row lock, so the ids
        of each grow in commit order, and each kind keeps that order here; the two are
        interleaved by their arrival times."""
        key = uuid.UUID(str(run_id))
        # Both kinds in one query (UNION ALL): one round trip.
        pending_signals = (
            Signal.objects.using(self.sql.alias)
            .filter(run_id=key, consumed_seq__isnull=True)
            .order_by()  # no ordering inside a UNION (SQLite refuses it); sorted below
            .values_list(
                Value(0, output_field=IntegerField()),
                "pk",
                "name",
                "payload",
                Value(None, output_field=CharField()),
                Value(None, output_field=BooleanField()),
                "received_at",
                "trace_context",
            )
        )
        pending_updates = (
            Update.objects.using(self.sql.alias)
            .filter(run_id=key, status=UpdateStatus.ACCEPTED, applied_seq__isnull=True)
            .order_by()
            .values_list(
                Value(1, output_field=IntegerField()),
                "pk",
                "name",
                "payload",
                "update_id",
                "validated",
                "created_at",
                "trace_context",
            )
        )
        # No ORDER BY on the union either (Django 6 would add the model's default ordering,
        # a column the union does not select): sorted here, by kind and then id.
        both = pending_signals.union(pending_updates, all=True).order_by()
        rows = sorted(both, key=lambda row: (row[0], row[1]))
        signals = [
            (arrived, 0, PendingMessage(MessageKind.SIGNAL, pk, name, payload, trace_context=carrier))
            for kind, pk, name, payload, _, _, arrived, carrier in rows
            if kind == 0
        ]
        updates = [
            (arrived, 1, PendingMessage(MessageKind.UPDATE, pk, name, payload, update_id, validated, carrier))
            for kind, pk, name, payload, update_id, validated, arrived, carrier in rows
            if kind == 1
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
        the signal it took and drop the wait's timeout timer, in one fenced transaction
        (one statement on PostgreSQL). The step write locks the run row first (the order
        every writer follows)."""
        if self.sql.is_postgres:
            params = self.sql.step_params(run_id, owner, epoch, step)
            params["signal"] = signal_pk
            row = self.sql.fetch_prepared(_finish_wait_sql(self.sql), params)
            fenced, written = row if row is not None else (False, False)
            if not fenced:
                raise deposed(run_id, owner, epoch, f"step {step.seq} ({step.kind} {step.name})")
            if not written:
                raise AssertionError(f"signal {signal_pk} of run {run_id} was consumed twice")
            return
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            if signal_pk is not None:
                consumed = (
                    Signal.objects.using(self.sql.alias)
                    .filter(pk=signal_pk, run_id=key, consumed_seq__isnull=True)
                    .update(consumed_seq=step.seq)
                )
                if not consumed:
                    raise AssertionError(f"signal {signal_pk} of run {run_id} was consumed twice")
            Timer.objects.using(self.sql.alias).filter(run_id=key, seq=step.seq).unfired().delete()

    def apply_update(self, run_id: str, owner: str, epoch: int, step: StepWrite, update_pk: int) -> None:
        """Record that the update's handler starts at ``step.seq`` (fenced); from then on
        the update is not pending, and a crash re-runs the handler from its step."""
        if self.sql.is_postgres:
            self._write_update_step(run_id, owner, epoch, step, update_pk, "applied_seq = %(seq)s",
                                    "applied_seq IS NULL", {})  # fmt: skip
            return
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            Update.objects.using(self.sql.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), applied_seq__isnull=True
            ).update(applied_seq=step.seq, updated_at=self.sql.now_value())

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
        status = UpdateStatus.COMPLETED if ok else UpdateStatus.FAILED
        result = codec.loads(result_json) if result_json is not None else None
        error = codec.loads(error_json) if error_json is not None else None
        if self.sql.is_postgres:
            fields, connection = (
                {field.name: field for field in Update._meta.concrete_fields},
                self.sql.connection,
            )
            outcome = {
                "update_status": status,
                "accepted": UpdateStatus.ACCEPTED,
                # As the ORM writes them: a JSON null is stored as SQL NULL.
                "update_result": fields["result"].get_db_prep_save(result, connection),
                "update_error": fields["error"].get_db_prep_save(error, connection),
            }
            assignments = "status = %(update_status)s, result = %(update_result)s, error = %(update_error)s"
            self._write_update_step(run_id, owner, epoch, step, update_pk, assignments,
                                    "status = %(accepted)s", outcome)  # fmt: skip
            return
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            Update.objects.using(self.sql.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), status=UpdateStatus.ACCEPTED
            ).update(status=status, result=result, error=error, updated_at=self.sql.now_value())

    def _write_update_step(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        step: StepWrite,
        update_pk: int,
        assignments: str,
        condition: str,
        extra: dict[str, Any],
    ) -> None:
        """:func:`_update_step_sql` run (PostgreSQL). Raises ``Deposed``, having written
        nothing, when the fence does not hold."""
        params = {**self.sql.step_params(run_id, owner, epoch, step), **extra, "update": update_pk}
        statement = _update_step_sql(self.sql, assignments, condition, self.sql.sql_now(params))
        row = self.sql.fetch_prepared(statement, params)
        if row is None or not row[0]:
            raise deposed(run_id, owner, epoch, f"step {step.seq} ({step.kind} {step.name})")

    def fail_update(self, run_id: str, owner: str, epoch: int, update_pk: int, error: dict[str, Any]) -> None:
        """Answer a pending update with ``error`` without applying it, fenced."""
        with transaction.atomic(using=self.sql.alias):
            if not list(
                self.sql.owned(run_id, owner, epoch).select_for_update().values_list("pk", flat=True)
            ):
                raise deposed(run_id, owner, epoch, f"failing update {update_pk}")
            Update.objects.using(self.sql.alias).filter(
                pk=update_pk, run_id=uuid.UUID(str(run_id)), status=UpdateStatus.ACCEPTED
            ).update(status=UpdateStatus.FAILED, error=error, updated_at=self.sql.now_value())

    def deliver_cancel_request(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, delivered: CancelRequest, at: int | None
    ) -> None:
        """Record the request's history entry (fenced: the step write locks the run row
        first), mark the run's request received at ``step.seq``, and remove the unfired
        sleep, timeout and retry timers of the blocking operation at ``at`` (a queued
        activity's lease stays: the activity may still be running), in one transaction."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            self.sql.runs().filter(pk=key).update(cancel_request=delivered.as_json())
            if at is not None:
                Timer.objects.using(self.sql.alias).filter(run_id=key, seq=at).unfired().exclude(
                    kind=TimerKind.ACTIVITY
                ).delete()

    def cancellation_requested(self, run_id: str, seq: int) -> str | None:
        """Why the activity at ``seq`` of the run should stop, or ``None`` (one read)."""
        row = (
            self.sql.runs().filter(pk=uuid.UUID(str(run_id))).values_list("status", "cancel_request").first()
        )
        if row is None:
            return cancellation_seen(None, None, seq)
        return cancellation_seen(row[0], CancelRequest.of(row[1]), seq)
