"""Reset: a new run of a run's workflow id whose history is the old run's entries before
a position, committed with the old run's close in one transaction.

The old run's row is locked first (after the workflow id's advisory lock on PostgreSQL,
the order starts take) and its epoch rotated, as every external transition does
(docs/explanation/guarantees.md, "External transitions"): a worker still driving it
fails its next fenced write and stops. The history is read again under that lock and
must be what the caller replayed; the new run is inserted after the old one is closed,
so the one-active-run-per-workflow-id constraint holds at every statement and refuses
the reset if another run of the id became active meanwhile.
No child row is locked here (children lock before parents, decision 17): the runtime
applies the old run's parent-close policy after the commit, as a cancel does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from .. import signals
from ..engine import faults, observe
from ..engine.error_types import ErrorType
from ..engine.errors import InvalidTransition, WorkflowNotFound
from ..engine.records import (
    ACTIVE_STATUSES,
    RUN_LEVEL_SEQ,
    TERMINAL_STATUSES,
    CancelRequest,
    FailureCategory,
    RunStatus,
    StepKind,
    StepRecord,
    TimerKind,
)
from ..engine.reset import ResetLink, ResetOutcome, check_cut
from ..models import Timer, Update
from ..models.messages import UpdateStatus
from .sql import StoreSql
from .statement_parts import SIGNAL_TABLE, STEP_COLUMNS, STEP_TABLE, UPDATE_TABLE

_RESET_FIELDS = (
    "workflow_id", "workflow_name", "status", "created_at", "parent_id", "parent_seq", "parent_close_policy",
    "search_attributes", "execution_deadline", "cancel_request", "priority", "concurrency_key",
)  # fmt: skip


class Resets:
    """Resetting a run to a position of its history."""

    def __init__(self, sql: StoreSql) -> None:
        self.sql = sql

    def reset(
        self,
        run_pk: uuid.UUID,
        to_seq: int,
        *,
        kept: Mapping[int, StepRecord],
        args: list[Any],
        kwargs: dict[str, Any],
        version: str,
        reason: str,
        dispatched: bool,
    ) -> ResetOutcome:
        """Close run ``run_pk`` if it is active and start its replacement, in the caller's
        transaction: the new run (runnable; ``dispatched``: the caller rings its doorbell)
        has the entries before ``to_seq``, the signals and updates the old one had (see
        :meth:`_copy_for_reset`), its search attributes, parent, deadline, finalizer state
        and a cancellation request it had received before ``to_seq``, and links both ways.

        ``kept`` is the history the caller replayed; if the run's differs now (it moved on,
        or was retried), raises ``InvalidTransition`` and writes nothing. Also raises
        ``InvalidTransition`` if the run is not the latest of its workflow id, if another
        run of the id is active, or if its execution deadline has passed; ``InvalidInput``
        for a position the history cannot be cut at."""
        found = self.sql.runs().filter(pk=run_pk).values_list("workflow_id", flat=True).first()
        if found is None:
            raise WorkflowNotFound(f"run {run_pk} does not exist", ref=str(run_pk))
        if self.sql.is_postgres:
            self.sql.lock_workflow_id(found)
        run = self.sql.runs().select_for_update().filter(pk=run_pk).values(*_RESET_FIELDS).first()
        if run is None:
            raise WorkflowNotFound(f"run {run_pk} does not exist", ref=str(run_pk))
        label = f"run {run_pk} ({run['workflow_name']} {run['workflow_id']})"
        newer = (
            self.sql.runs()
            .filter(workflow_id=run["workflow_id"], created_at__gt=run["created_at"])
            .order_by("-created_at")
            .values_list("pk", "status")
            .first()
        )
        if newer is not None:
            raise InvalidTransition(
                f"{label} is not the latest run of its workflow id: run {newer[0]} ({newer[1]}) was "
                "started after it. Reset the latest run instead",
                run_id=str(run_pk),
                status=run["status"],
            )
        history = self.sql.load_steps(str(run_pk))
        check_cut(history, to_seq, label=label, now=self.sql.db_now())
        if {seq: history[seq] for seq in range(to_seq)} != dict(kept):
            raise InvalidTransition(
                f"{label} changed while the reset was being checked (its history before position "
                f"{to_seq} is no longer the one replayed); try again",
                run_id=str(run_pk),
                status=run["status"],
            )
        now = self.sql.transition_now()
        deadline = run["execution_deadline"]
        if deadline is not None and deadline <= now:
            raise InvalidTransition(
                f"{label} passed its execution deadline ({deadline.isoformat()}), which a reset run "
                "keeps: it would time out at once. Start a new run instead",
                run_id=str(run_pk),
                status=run["status"],
            )
        new_pk = uuid.uuid4()
        stamp = now.isoformat()
        closed = run["status"] in ACTIVE_STATUSES
        changes: dict[str, Any] = {
            # Rotated even for a finished run: nothing written under an older epoch counts.
            "owner_id": None,
            "owner_epoch": F("owner_epoch") + 1,
            "lease_expires_at": None,
            "reset_to": ResetLink(str(new_pk), to_seq, reason, stamp).as_json(),
        }
        if closed:
            message = f"reset to position {to_seq} as run {new_pk}: {reason}"
            error = {"type": ErrorType.RESET, "message": message, "reason": reason, "reset_to": str(new_pk)}
            changes.update(
                status=RunStatus.CANCELLED,
                error=error,
                failure_category=FailureCategory.CANCELLATION,
                ready_at=None,
                dispatched_at=None,
                waiting_on=None,
                finished_at=now,
                updated_at=now,
            )
        self.sql.runs().filter(pk=run_pk).update(**changes)
        try:
            with transaction.atomic(using=self.sql.alias):
                self.sql.runs().create(
                    id=new_pk,
                    workflow_id=run["workflow_id"],
                    workflow_name=run["workflow_name"],
                    workflow_version=version,
                    status=RunStatus.RUNNING,
                    args=args,
                    kwargs=kwargs,
                    parent_id=run["parent_id"],
                    parent_seq=run["parent_seq"],
                    parent_close_policy=self._close_policy_for_reset(run),
                    search_attributes=run["search_attributes"],
                    execution_deadline=deadline,
                    finalizer_state=_finalizer_state(kept),
                    cancel_request=_received_request(run["cancel_request"], to_seq),
                    reset_from=ResetLink(str(run_pk), to_seq, reason, stamp).as_json(),
                    # Above 0: the first claim reads the history (a run claimed at epoch 1
                    # is taken to have none) and makes epoch 2.
                    owner_epoch=1,
                    ready_at=now,
                    dispatched_at=now if dispatched else None,
                    # Flow control: the same priority and key; it takes a slot of its own.
                    priority=run["priority"],
                    concurrency_key=run["concurrency_key"],
                )
        except IntegrityError:
            raise InvalidTransition(
                f"{label} cannot be reset: another run with workflow id {run['workflow_id']!r} is "
                "active now. Reset that run instead",
                run_id=str(run_pk),
                status=run["status"],
            ) from None
        self._copy_for_reset(run_pk, new_pk, to_seq, now)
        if closed:
            Timer.objects.using(self.sql.alias).filter(run_id=run_pk).unfired().delete()
            # Pending updates were copied to the new run, which applies them; a caller
            # waiting on the old row follows this error to the copy.
            Update.objects.using(self.sql.alias).filter(run_id=run_pk, status=UpdateStatus.ACCEPTED).update(
                status=UpdateStatus.FAILED,
                error={
                    "type": ErrorType.RESET,
                    "message": f"the run was reset before it applied this update; run {new_pk} applies it",
                    "run_id": str(new_pk),
                },
                updated_at=now,
            )
            wid, name = run["workflow_id"], run["workflow_name"]
            self.sql.announce(signals.run_cancelled, run_pk, wid, name, error=error, finished_at=now)
            observe.run_finished(
                run_id=str(run_pk), workflow_id=wid, workflow=name, status=RunStatus.CANCELLED
            )
        if deadline is not None:
            Timer.objects.using(self.sql.alias).create(
                run_id=new_pk, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=deadline
            )
        self.sql.announce(signals.run_started, new_pk, run["workflow_id"], run["workflow_name"])
        faults.hit("before_reset_commit", run_id=str(run_pk), new_run_id=str(new_pk))
        return ResetOutcome(
            run_id=str(new_pk),
            workflow_id=run["workflow_id"],
            workflow_name=run["workflow_name"],
            reset_from=str(run_pk),
            to_seq=to_seq,
            previous_status=RunStatus(run["status"]),
            closed=closed,
        )

    def _close_policy_for_reset(self, run: Mapping[str, Any]) -> str:
        """A child's replacement stays its parent's child; once the parent has finished it
        is left running when the parent's close policy would otherwise be applied to it."""
        policy = str(run["parent_close_policy"] or "")
        if run["parent_id"] is None or policy == "abandon":
            return policy
        parent = self.sql.runs().filter(pk=run["parent_id"]).values_list("status", flat=True).first()
        return "abandon" if parent is None or parent in TERMINAL_STATUSES else policy

    def _copy_for_reset(self, old: uuid.UUID, new: uuid.UUID, cut: int, now: datetime) -> None:
        """A reset's copies, from run ``old`` to run ``new``, each one ``INSERT ... SELECT``
        (payloads never leave the database; times are kept as recorded):

        - the steps before position ``cut``, as recorded;
        - every signal in arrival order, consumed where a kept step consumed it, else
          buffered again (those consumed at or after the cut are received again);
        - every update in arrival order: with its outcome if it was applied before the cut
          (or answered without being applied), else accepted again, to be applied by the
          new run (those pending, and those applied at or after the cut)."""
        sql = self.sql
        params = {
            "old": sql.run_key(old),
            "new": sql.run_key(new),
            "cut": cut,
            "now": sql.dt(now),
        }
        again = "(status = 'accepted' OR applied_seq >= %(cut)s)"
        statements = (
            f"INSERT INTO {STEP_TABLE} ({STEP_COLUMNS}) SELECT %(new)s, seq, kind, name, status, args, "
            "result, error, attempt, started_at, finished_at, created_at, updated_at, 0, failed_attempts "
            f"FROM {STEP_TABLE} WHERE run_id = %(old)s AND seq < %(cut)s",
            f"INSERT INTO {SIGNAL_TABLE} (run_id, name, payload, signal_id, received_at, consumed_seq) "
            "SELECT %(new)s, name, payload, signal_id, received_at, "
            "CASE WHEN consumed_seq < %(cut)s THEN consumed_seq END "
            f"FROM {SIGNAL_TABLE} WHERE run_id = %(old)s ORDER BY id",
            f"INSERT INTO {UPDATE_TABLE} (update_id, run_id, name, payload, status, result, error, "
            "applied_seq, validated, created_at, updated_at) "
            f"SELECT update_id, %(new)s, name, payload, CASE WHEN {again} THEN 'accepted' ELSE status END, "
            f"CASE WHEN {again} THEN NULL ELSE result END, CASE WHEN {again} THEN NULL ELSE error END, "
            f"CASE WHEN {again} THEN NULL ELSE applied_seq END, validated, created_at, %(now)s "
            f"FROM {UPDATE_TABLE} WHERE run_id = %(old)s ORDER BY id",
        )
        with sql.connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement, params)


def _finalizer_state(kept: Mapping[int, StepRecord]) -> Any:
    """The finalizer state the kept history recorded last (``None`` if it recorded none)."""
    for seq in sorted(kept, reverse=True):
        entry = kept[seq]
        if entry.kind == StepKind.SIDE_EFFECT and entry.name == "finalizer_state":
            return entry.result
    return None


def _received_request(stored: Any, to_seq: int) -> dict[str, Any] | None:
    """The old run's cancellation request if the kept history received it; one pending, or
    received at or after the cut, is not carried over (the reset supersedes it)."""
    request = CancelRequest.of(stored)
    if request is None or request.seq is None or request.seq >= to_seq:
        return None
    return request.as_json()
