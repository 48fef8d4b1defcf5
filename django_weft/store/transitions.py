"""External transitions (docs/explanation/guarantees.md): cancel, time out, suspend,
resume, retry; and the cancellation request, which is not a transition.

Cancel, time-out and suspend may be committed by any process, owner or not. Each
locks the run row, writes the new status and rotates the epoch (owner cleared) in
one transaction, so a still-running owner's next fenced write fails (Deposed)
instead of overwriting the new state. Resume and retry make the run runnable for a
worker to claim; they take no lease themselves. A cancellation request is a message
to the workflow: stored under the row lock and waking a parked run, like a signal; it
does not rotate the epoch (the owner's work stays valid).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from .. import signals
from ..engine import observe
from ..engine.error_types import UPDATE_ERROR_ON_CLOSE, ErrorType
from ..engine.errors import (
    InvalidTransition,
    WorkflowNotFound,
    WorkflowTerminalError,
)
from ..engine.records import (
    ACTIVE_STATUSES,
    RUN_LEVEL_SEQ,
    TERMINAL_STATUSES,
    CancelRequest,
    FailureCategory,
    RunStatus,
    TimerKind,
)
from ..models import Signal, Step, Timer, Update
from ..models.messages import UpdateStatus
from .finalizers import Finalizers
from .sql import StoreSql
from .waking import Waking


@dataclass(frozen=True)
class Transition:
    """What an external transition did to a run, for the caller's doorbells and logs."""

    run_id: str
    workflow_id: str
    workflow_name: str
    status: RunStatus
    """The run's status after the transition."""
    woken_parent: str | None = None
    """Cancel: the parent run it woke (ring its doorbell on commit)."""
    woken: bool = False
    """Cancellation request: the run was parked and is runnable now (ring its doorbell)."""
    duplicate: bool = False
    """Cancellation request: one was pending already; nothing new was stored."""
    finalizer: dict[str, Any] | None = None
    """Cancel: the finalizer it scheduled (send its first attempt on commit)."""
    removed_from: int | None = None
    """Retry: the position from which the history was removed."""

    @classmethod
    def of(cls, run_pk: uuid.UUID, run: dict[str, Any], status: RunStatus, **changes: Any) -> Transition:
        return cls(
            run_id=str(run_pk),
            workflow_id=run["workflow_id"],
            workflow_name=run["workflow_name"],
            status=status,
            woken_parent=run.get("woken_parent"),
            finalizer=run.get("finalizer"),
            **changes,
        )


LOCKED_FIELDS = (
    "status", "workflow_id", "workflow_name", "waiting_on", "error", "parent_id", "cancel_request",
    "reset_to",
)  # fmt: skip
"""What a transition reads of the run row it locks (the sweep reads them to time a run out)."""


class RunTransitions:
    """Transitions any process may commit; the closing ones rotate the epoch."""

    def __init__(self, sql: StoreSql, waking: Waking, finalizers: Finalizers) -> None:
        self.sql = sql
        self.waking = waking
        self.finalizers = finalizers

    def _lock_run(self, run_pk: uuid.UUID) -> dict[str, Any]:
        run = self.sql.runs().select_for_update().filter(pk=run_pk).values(*LOCKED_FIELDS).first()
        if run is None:
            raise WorkflowNotFound(f"run {run_pk} does not exist", ref=str(run_pk))
        return run

    @staticmethod
    def _refuse(
        run_pk: uuid.UUID, run: dict[str, Any], action: str, needs: str, *, terminal: bool = True
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

    def _close(
        self,
        run_pk: uuid.UUID,
        run: dict[str, Any],
        status: str,
        error: dict[str, Any],
        category: str,
        *,
        wake_parent: bool = True,
    ) -> None:
        """Close a locked run externally: terminal status, epoch rotated, owner cleared,
        unfired timers removed, pending updates failed."""
        now = self.sql.transition_now()
        self.sql.runs().filter(pk=run_pk).update(
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
        Timer.objects.using(self.sql.alias).filter(run_id=run_pk).unfired().delete()
        Update.objects.using(self.sql.alias).filter(run_id=run_pk, status=UpdateStatus.ACCEPTED).update(
            status=UpdateStatus.FAILED,
            error={"type": UPDATE_ERROR_ON_CLOSE[status], "message": error["message"]},
            updated_at=now,
        )
        run["finalizer"] = self.finalizers.schedule_finalizer(run_pk, run["workflow_name"], now)
        signal = signals.run_cancelled if status == RunStatus.CANCELLED else signals.run_timed_out
        wid, name = run["workflow_id"], run["workflow_name"]
        self.sql.announce(signal, run_pk, wid, name, error=error, finished_at=now)
        observe.run_finished(
            run_id=str(run_pk), workflow_id=run["workflow_id"], workflow=run["workflow_name"], status=status
        )
        if run["parent_id"] is not None and wake_parent:
            run["woken_parent"] = self.waking.wake_parent(run["parent_id"])

    def cancel(self, run_pk: uuid.UUID, reason: str | None) -> Transition:
        """Cancel an active (pending, running, waiting or suspended) run, in the caller's
        transaction. Raises ``WorkflowTerminalError`` for a finished run."""
        run = self._lock_run(run_pk)
        if run["status"] not in ACTIVE_STATUSES:
            raise self._refuse(run_pk, run, "cancelled", "an active")
        message = f"cancelled: {reason}" if reason else "cancelled"
        error = {"type": ErrorType.CANCELLED, "message": message, "reason": reason}
        self._close(run_pk, run, RunStatus.CANCELLED, error, FailureCategory.CANCELLATION)
        return Transition.of(run_pk, run, RunStatus.CANCELLED)

    def request_cancel(
        self, run_pk: uuid.UUID, reason: str | None, *, dispatched: bool, from_parent: bool = False
    ) -> Transition:
        """Store a cancellation request for an active run, in the caller's transaction; the
        workflow receives it as ``CancellationRequested`` at its current or next blocking
        point. A parked run is made runnable (``woken``; the caller rings its doorbell). A
        request pending already stores nothing (``duplicate``). Raises
        ``WorkflowTerminalError`` for a finished run. ``from_parent``: sent by a parent's
        ``request_cancel`` close policy (the sweep then does not send it again)."""
        run = self._lock_run(run_pk)
        if run["status"] not in ACTIVE_STATUSES:
            raise self._refuse(run_pk, run, "asked to cancel", "an active")
        current = CancelRequest.of(run["cancel_request"])
        if current is not None and current.pending:
            if from_parent and not current.from_parent:
                # The parent's request is the pending one too: the sweep need not send it.
                marked = replace(current, from_parent=True).as_json()
                self.sql.runs().filter(pk=run_pk).update(cancel_request=marked)
            return Transition.of(run_pk, run, RunStatus(run["status"]), duplicate=True)
        now = self.sql.transition_now()
        request = CancelRequest(
            now.isoformat(), reason, from_parent=from_parent or bool(current and current.from_parent)
        )
        # Every park is a blocking point that receives a request: wake whatever it waits on.
        woken = run["status"] == RunStatus.WAITING
        if woken:
            self._make_runnable(run_pk, dispatched, cancel_request=request.as_json())
        else:
            self.sql.runs().filter(pk=run_pk).update(cancel_request=request.as_json(), updated_at=now)
        status = RunStatus.RUNNING if woken else RunStatus(run["status"])
        return Transition.of(run_pk, run, status, woken=woken)

    def time_out_locked(self, run_pk: uuid.UUID, run: dict[str, Any], deadline: datetime) -> None:
        error = {
            "type": ErrorType.EXECUTION_TIMEOUT,
            "message": f"the run passed its execution deadline ({deadline.isoformat()})",
        }
        # The sweep holds a batch of run rows, ancestors among them possibly: the parent
        # is woken after the batch commits, in a transaction of its own.
        self._close(run_pk, run, RunStatus.TIMED_OUT, error, FailureCategory.TIMEOUT, wake_parent=False)

    def suspend(self, run_pk: uuid.UUID) -> Transition:
        """Suspend a running or waiting run, in the caller's transaction: it keeps its
        history, timers and messages, and no worker drives it until it is resumed."""
        run = self._lock_run(run_pk)
        if run["status"] not in (RunStatus.RUNNING, RunStatus.WAITING):
            raise self._refuse(run_pk, run, "suspended", "a running or waiting")
        now = self.sql.transition_now()
        self.sql.runs().filter(pk=run_pk).update(
            status=RunStatus.SUSPENDED,
            owner_id=None,
            owner_epoch=F("owner_epoch") + 1,
            lease_expires_at=None,
            ready_at=None,
            dispatched_at=None,
            updated_at=now,
        )
        self.sql.announce(signals.run_suspended, run_pk, run["workflow_id"], run["workflow_name"])
        return Transition.of(run_pk, run, RunStatus.SUSPENDED)

    def resume(self, run_pk: uuid.UUID, *, dispatched: bool) -> Transition:
        """Make a suspended run runnable again, in the caller's transaction. Its next turn
        replays to where it waits and re-arms that wait's timer with its original fire
        time (a time that passed while suspended fires at once)."""
        run = self._lock_run(run_pk)
        if run["status"] != RunStatus.SUSPENDED:
            raise self._refuse(run_pk, run, "resumed", "a suspended")
        self._make_runnable(run_pk, dispatched)
        self.sql.announce(signals.run_resumed, run_pk, run["workflow_id"], run["workflow_name"])
        return Transition.of(run_pk, run, RunStatus.RUNNING)

    def _make_runnable(self, run_pk: uuid.UUID, dispatched: bool, **fields: Any) -> None:
        now = self.sql.transition_now()
        self.sql.runs().filter(pk=run_pk).update(
            status=RunStatus.RUNNING,
            ready_at=now,
            dispatched_at=now if dispatched else None,
            waiting_on=None,
            updated_at=now,
            **fields,
        )

    def reactivate(self, run_pk: uuid.UUID, *, dispatched: bool) -> Transition:
        """Make a failed run runnable again, in the caller's transaction. The step whose
        failure failed the run (and anything recorded after it) is removed, so it is
        attempted afresh; every step before it replays. Signals the removed steps consumed
        are buffered again, and updates they applied are accepted again. After a non-determinism failure
        nothing is removed: the fixed code replays the history as it is."""
        run = self._lock_run(run_pk)
        if run["status"] != RunStatus.FAILED:
            raise self._refuse(run_pk, run, "retried", "a failed", terminal=False)
        replaced_by = (run["reset_to"] or {}).get("run_id")
        if replaced_by:
            raise InvalidTransition(
                f"run {run_pk} cannot be retried: it was reset, and run {replaced_by} replaced it. "
                "Retry or reset that run instead",
                run_id=str(run_pk),
                status=run["status"],
            )
        error = run["error"] or {}
        failed_seq = error.get("seq") if isinstance(error.get("seq"), int) else None
        try:
            with transaction.atomic(using=self.sql.alias):
                self._make_runnable(
                    run_pk,
                    dispatched,
                    error=None,
                    result=None,
                    failure_category="",
                    finished_at=None,
                    attempt=F("attempt") + 1,
                    owner_epoch=F("owner_epoch") + 1,
                    # A retried run counted by a concurrency limit takes a slot afresh
                    # (its old one went free when it failed).
                    slot="",
                    queue_rank=None,
                )
        except IntegrityError:
            raise InvalidTransition(
                f"run {run_pk} cannot be retried: another run with workflow id {run['workflow_id']!r} "
                "is active now",
                run_id=str(run_pk),
                status=run["status"],
            ) from None
        if failed_seq is not None:
            Step.objects.using(self.sql.alias).filter(run_id=run_pk, seq__gte=failed_seq).delete()
            # Signals those steps consumed go back to the buffer, to be consumed again; so
            # does a cancellation request received among them.
            Signal.objects.using(self.sql.alias).filter(run_id=run_pk, consumed_seq__gte=failed_seq).update(
                consumed_seq=None
            )
            # Updates those steps applied are accepted again, to be applied where the run
            # goes this time (as a reset does); their earlier outcome is gone with the steps.
            Update.objects.using(self.sql.alias).filter(run_id=run_pk, applied_seq__gte=failed_seq).update(
                status=UpdateStatus.ACCEPTED,
                applied_seq=None,
                result=None,
                error=None,
                updated_at=self.sql.now_value(),
            )
            request = CancelRequest.of(run["cancel_request"])
            if request is not None and request.seq is not None and request.seq >= failed_seq:
                self.sql.runs().filter(pk=run_pk).update(cancel_request=replace(request, seq=None).as_json())
        Timer.objects.using(self.sql.alias).filter(run_id=run_pk).delete()
        deadline = self.sql.runs().filter(pk=run_pk).values_list("execution_deadline", flat=True).first()
        if deadline is not None:
            # The deadline still holds (one already passed times the run out at the next sweep).
            Timer.objects.using(self.sql.alias).create(
                run_id=run_pk, seq=RUN_LEVEL_SEQ, kind=TimerKind.DEADLINE, fire_at=deadline
            )
        return Transition.of(run_pk, run, RunStatus.RUNNING, removed_from=failed_seq)
