"""Queued activity attempts: scheduled by the owner, taken and recorded by whichever
worker gets the message, fenced by (run, seq, attempt); their timers are their leases."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, JSONField, Q, Value, When

from ..engine import codec
from ..engine.attempt import cancellation_seen
from ..engine.error_types import ErrorType
from ..engine.finalizers import FinalizerStatus
from ..engine.flow import Hold, HoldKind, reserved_moment
from ..engine.records import (
    FINALIZER_SEQ,
    PENDING_STEP_STATUSES,
    CancelRequest,
    RunStatus,
    StepStatus,
    TimerKind,
)
from ..models import ActivitySlot, Step, Timer
from .sql import StoreSql
from .waking import Waking


class Held(enum.Enum):
    """What became of a started queued attempt that flow control holds
    (:meth:`ActivityAttempts.hold_activity`)."""

    HELD = "held"
    """Its step is ``delayed``: its run sends it again when the hold is over."""
    RUN = "run"
    """A concurrency slot was handed on to it meanwhile, now its execution's own: run it."""
    STALE = "stale"
    """A newer attempt at its position is under way: drop it, and leave its place in the
    queue to that attempt."""
    GONE = "gone"
    """Its run ended, or its position is done with: drop it, and give its place up."""


@dataclass(frozen=True)
class StartedAttempt:
    """A queued activity attempt this caller took: what it needs to run it."""

    workflow_id: str
    workflow_name: str
    name: str
    """The activity's name."""
    args: dict[str, Any]
    """The recorded call: ``{"args": [...], "kwargs": {...}}``."""
    priority: int = 0
    """The run's priority: the doorbell of the turn the attempt's outcome wakes rings with it."""
    reserved: datetime | None = None
    """The rate limit moment the attempt was given when flow control held it before, which
    it starts on without taking another."""
    scheduled_at: datetime | None = None
    """When the owner's turn scheduled the attempt (the step's ``started_at`` while it was
    ``scheduled``)."""
    taken_at: datetime | None = None
    """When this caller took it (the database's clock)."""
    trace_context: dict[str, str] | None = None
    """The run's stored trace context (:func:`..engine.observe.start_carrier`): tracing
    makes the attempt's span its child, as the run's turns are."""


class ActivityAttempts:
    """Queued activity attempts, for the workers that run them (the owner schedules them
    through :class:`~django_weft.store.RunTurns`)."""

    def __init__(self, sql: StoreSql, waking: Waking) -> None:
        self.sql = sql
        self.waking = waking

    def _lock_active_run(
        self, key: uuid.UUID, *fields: str, suspended: bool = False
    ) -> dict[str, Any] | None:
        """Lock a running or waiting (or, with ``suspended``, suspended) run's row, first as
        every writer does, and read ``fields``; ``None`` if the run is not in those states."""
        statuses = [RunStatus.RUNNING, RunStatus.WAITING] + ([RunStatus.SUSPENDED] if suspended else [])
        return self.sql.runs().select_for_update().filter(pk=key, status__in=statuses).values(*fields).first()

    def start_activity(
        self, run_id: str, seq: int, attempt: int, ttl: float, *, worker: str = ""
    ) -> StartedAttempt | None:
        """Take attempt ``attempt`` of the queued activity at ``seq`` for execution.

        Exactly one caller wins per attempt: the step moves from ``scheduled`` to
        ``started`` and its activity timer becomes the attempt's lease (``ttl`` from
        now, renewed by the heartbeat). ``worker`` (the taker's id) is kept in the
        step's result while it runs, and after it if its worker is lost. ``None`` for a
        duplicate delivery, a stale attempt or a run that is no longer active."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            run = self._lock_active_run(key, "workflow_id", "workflow_name", "priority", "trace_context")
            if run is None:
                return None
            now = self.sql.db_now()
            steps = Step.objects.using(self.sql.alias).filter(run_id=key, seq=seq, attempt=attempt)
            # The run's lock is held, so the step read here is the one updated.
            row = (
                steps.filter(status=StepStatus.SCHEDULED)
                .values("name", "args", "result", "started_at")
                .first()
            )
            if row is None:
                return None
            result = {**(row["result"] or {}), "worker": worker} if worker else row["result"]
            if not steps.filter(status=StepStatus.SCHEDULED).update(
                status=StepStatus.STARTED, started_at=now, updated_at=now, result=result
            ):
                return None
            Timer.objects.using(self.sql.alias).update_or_create(
                run_id=key,
                seq=seq,
                kind=TimerKind.ACTIVITY,
                defaults={"fire_at": now + timedelta(seconds=ttl), "fired_at": None},
            )
        return StartedAttempt(
            run["workflow_id"],
            run["workflow_name"],
            row["name"],
            row["args"] or {},
            run["priority"],
            reserved_moment(row["result"]),
            scheduled_at=row["started_at"],
            taken_at=now,
            trace_context=run["trace_context"],
        )

    def hold_activity(self, run_id: str, seq: int, attempt: int, hold: Hold, *, holder: str) -> Held:
        """Flow control holds attempt ``attempt`` this worker started (before it ran): its
        step becomes ``delayed`` with the hold as its result, its lease timer gives way
        to a retry timer at ``hold.until`` (which wakes its run to send it again), and a
        waiting run's ``waiting_on`` says why under ``held``. Nothing counts it as failed.

        A slot handed on to it is taken up by the execution ``holder`` only while its
        lease runs: one whose lease ran out may be another attempt's by now."""
        key = uuid.UUID(str(run_id))
        with transaction.atomic(using=self.sql.alias):
            run = self._lock_active_run(key, "status", "waiting_on", suspended=True)
            if run is None:
                return Held.GONE
            position = Step.objects.using(self.sql.alias).filter(run_id=key, seq=seq)
            steps = position.filter(attempt=attempt, status=StepStatus.STARTED)
            if not steps.exists():
                pending = position.filter(status__in=list(PENDING_STEP_STATUSES)).exists()
                return Held.STALE if pending else Held.GONE
            now = self.sql.db_now()
            if hold.kind == HoldKind.CONCURRENCY and (
                ActivitySlot.objects.using(self.sql.alias)
                .filter(run_id=key, seq=seq, state=ActivitySlot.State.HELD, holder="")
                # The time after the run row's lock, not the transaction's start: a lease
                # that ran out while this waited for the lock was counted free by then.
                .filter(lease_expires_at__gt=self.sql.transition_now())
                .update(holder=holder)
            ):
                return Held.RUN
            steps.update(status=StepStatus.DELAYED, result=hold.as_result(), error=None, updated_at=now)
            timers = Timer.objects.using(self.sql.alias)
            timers.filter(run_id=key, seq=seq, kind=TimerKind.ACTIVITY).delete()
            timers.update_or_create(
                run_id=key, seq=seq, kind=TimerKind.RETRY, defaults={"fire_at": hold.until, "fired_at": None}
            )
            waiting_on = run["waiting_on"]
            if run["status"] == RunStatus.WAITING and isinstance(waiting_on, dict):
                held = {**(waiting_on.get("held") or {}), str(seq): hold.text}
                self.sql.runs().filter(pk=key).update(waiting_on={**waiting_on, "held": held})
        return Held.HELD

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
        with transaction.atomic(using=self.sql.alias):
            # A suspended run keeps what its activities finish; it only is not woken.
            run = self._lock_active_run(key, "status", "waiting_on", suspended=True)
            if run is None:
                return False, False
            steps = Step.objects.using(self.sql.alias).filter(
                run_id=key, seq=seq, attempt=attempt, status=StepStatus.STARTED
            )
            if not list(steps.select_for_update().values_list("pk", flat=True)):
                return False, False
            if body is not None:
                status, result_json, error_json = body()
            now = self.sql.db_now()
            steps.update(
                status=status,
                result=codec.loads(result_json) if result_json is not None else None,
                error=codec.loads(error_json) if error_json is not None else None,
                finished_at=now,
                updated_at=now,
            )
            Timer.objects.using(self.sql.alias).filter(run_id=key, seq=seq, kind=TimerKind.ACTIVITY).delete()
            woken = run["status"] == RunStatus.WAITING and self.waking.wait_satisfied(
                run_id, run["waiting_on"]
            )
            if woken:
                # dispatched_at: the caller rings the doorbell itself, so the sweep holds off.
                self.sql.runs().filter(pk=key).update(
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
                    run__finalizer__status=FinalizerStatus.RUNNING,
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
        timers = Timer.objects.using(self.sql.alias)
        with transaction.atomic(using=self.sql.alias):
            until = self.sql.db_now() + timedelta(seconds=ttl)
            ids = list(
                timers.filter(condition, fired_at__isnull=True)
                .select_for_update(skip_locked=True, of=("self",))
                .values_list("pk", flat=True)
            )
            if ids:
                timers.filter(pk__in=ids).update(fire_at=until)

    def lose_attempts(self, fired: Iterable[tuple[uuid.UUID, int]], now: datetime) -> None:
        """Mark the queued attempts whose activity timer fired as lost: never started
        (the message went missing) or started by a worker that stopped heartbeating.
        The caller holds the run rows."""
        condition = Q()
        for run, seq in fired:
            condition |= Q(run_id=run, seq=seq)
        if not condition:
            return
        never_started = {
            "type": ErrorType.DISPATCH_LOST,
            "message": "the attempt was not picked up from its queue in time; it is sent again",
            "started": False,
        }
        worker_lost = {
            "type": ErrorType.WORKER_LOST,
            "message": "the worker running this attempt stopped renewing its lease (crashed or killed)",
            "started": True,
            "retryable": True,
        }
        Step.objects.using(self.sql.alias).filter(
            condition, status__in=[StepStatus.SCHEDULED, StepStatus.STARTED]
        ).update(
            status=StepStatus.LOST,
            error=Case(
                When(status=StepStatus.STARTED, then=Value(worker_lost, output_field=JSONField())),
                default=Value(never_started, output_field=JSONField()),
            ),
            updated_at=now,
        )

    def cancellations_requested(self, attempts: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """For the worker's heartbeat: which of the running activities ``(run_id, seq)``
        should stop, and why, in one read."""
        keys = {uuid.UUID(str(run_id)) for run_id, _ in attempts}
        rows = {
            str(pk): (status, CancelRequest.of(request))
            for pk, status, request in self.sql.runs()
            .filter(pk__in=list(keys))
            .values_list("pk", "status", "cancel_request")
        }
        seen: dict[tuple[str, int], str] = {}
        for run_id, seq in attempts:
            status, request = rows.get(str(uuid.UUID(str(run_id))), (None, None))
            why = cancellation_seen(status, request, seq)
            if why is not None:
                seen[(run_id, seq)] = why
        return seen
