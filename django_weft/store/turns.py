"""The engine's port for a turn: claim, fenced step commits, park, the terminal commits,
release and lease renewal; the messages and children of a turn are handed on
to :mod:`.turn_messages` and :mod:`.children` (docs/explanation/guarantees.md)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ..engine import codec
from ..engine.flow import Rate, SlotTaken
from ..engine.parking import (
    handled_updates,
    unknown_update_error,
)
from ..engine.records import (
    RUN_LEVEL_SEQ,
    CancelRequest,
    ChildOutcome,
    ChildStart,
    ClaimedRun,
    FailureCategory,
    PendingMessage,
    Renewal,
    RunStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
)
from ..engine.registry import registry
from ..engine.run_logging import get_logger
from ..models import Timer, Update
from ..models.messages import UpdateStatus
from .activity_flow import ActivityFlow
from .attempts import ActivityAttempts
from .base import deposed, unanswered_error
from .children import Children
from .claims import RunClaims
from .finalizers import Finalizers
from .flow import FlowControl
from .sql import StoreSql
from .statement_parts import RUN_TABLE
from .turn_messages import TurnMessages
from .waking import Waking

logger = get_logger("django_weft.store")
timer_log = get_logger("django_weft.timers")


class _RecentRuns:
    """A set of run ids that forgets its oldest entries past a bound (entries of runs
    whose hand-on never comes, a workflow whose limit was removed, cannot pile up)."""

    BOUND = 10_000

    def __init__(self) -> None:
        self._runs: dict[str, None] = {}
        self._lock = threading.Lock()

    def add(self, run_id: str) -> None:
        with self._lock:
            self._runs[run_id] = None
            if len(self._runs) > self.BOUND:
                del self._runs[next(iter(self._runs))]

    def discard(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs


class RunTurns:
    """The owner's turn: claim, fenced writes, park, finish, release, renew. The engine's
    port (:class:`~django_weft.engine.ports.TurnStore`) on a Django database, and its only
    implementation here; it hands a turn's messages on to :class:`TurnMessages` and its
    children to :class:`Children`."""

    def __init__(
        self,
        sql: StoreSql,
        waking: Waking,
        attempts: ActivityAttempts,
        finalizers: Finalizers,
        children: Children,
        messages: TurnMessages,
        flow: FlowControl,
        activity_flow: ActivityFlow,
    ) -> None:
        self.sql = sql
        self.flow = flow
        self.claims = RunClaims(sql, attempts, flow)
        # Runs this store ended (PostgreSQL's one-statement terminal commit) whose
        # workflow had no run queued for a slot; read once by :meth:`hand_on_slot`.
        self._nobody_queued = _RecentRuns()
        self.activity_flow = activity_flow
        self.waking = waking
        self.attempts = attempts
        self.finalizers = finalizers
        self.children = children
        self.messages = messages

    def db_now(self) -> datetime:
        """The database clock, or a test's virtual clock (:meth:`StoreSql.db_now`)."""
        return self.sql.db_now()

    def claim(
        self, run_id: str, owner: str, ttl: float, grace: float, workflows: Collection[str] | None = None
    ) -> ClaimedRun | None:
        """See :meth:`RunClaims.claim <django_weft.store.claims.RunClaims.claim>`."""
        return self.claims.claim(run_id, owner, ttl, grace, workflows)

    def commit_step_atomic(
        self, run_id: str, owner: str, epoch: int, body: Callable[[], StepWrite]
    ) -> StepWrite:
        """Lock and check the run row, run ``body`` (an atomic activity), record its step;
        all in one transaction on the workflow database. Raises ``Deposed`` before
        running ``body`` if the run is not ours; an exception from ``body`` rolls back."""
        with transaction.atomic(using=self.sql.alias):
            locked = (
                self.sql.runs()
                .select_for_update()
                .filter(pk=run_id, owner_id=owner, owner_epoch=epoch)
                .values_list("pk", flat=True)
            )
            if not list(locked):
                raise deposed(run_id, owner, epoch, "atomic activity")
            step = body()
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
        return step

    def commit_step(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        """Record one step in one statement, fenced on (owner, epoch). Raises ``Deposed``."""
        self.sql.commit_step(run_id, owner, epoch, step)

    def schedule_activity(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, timer: TimerWrite
    ) -> None:
        """Record a queued attempt as scheduled with its dispatch deadline, fenced."""
        with transaction.atomic(using=self.sql.alias), self.sql.connection.cursor() as cursor:
            self.sql.write_step(cursor, run_id, owner, epoch, step)
            self.sql.write_timers(cursor, run_id, [timer], step.started_at)

    def set_finalizer_state(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, state_json: str
    ) -> None:
        """Record the step and store ``state_json`` as the run's finalizer state, fenced."""
        with transaction.atomic(using=self.sql.alias):
            with self.sql.connection.cursor() as cursor:
                self.sql.write_step(cursor, run_id, owner, epoch, step)
            self.sql.runs().filter(pk=run_id).update(finalizer_state=codec.loads(state_json))

    def set_search_attributes(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, attributes: dict[str, Any]
    ) -> None:
        """Record ``step`` and merge ``attributes`` into the run's search attributes, fenced:
        both or neither (:meth:`StoreSql.set_search_attributes`)."""
        self.sql.set_search_attributes(run_id, owner, epoch, step, attributes)

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
        the activity's completion both lock the run row, so one of them sees the other.
        So it is for a cancellation request stored during the turn (every park is a
        blocking point that receives one): it is read with the row lock, at no extra cost."""
        with transaction.atomic(using=self.sql.alias):
            # Lock the run row first (fenced), then write timers: the run-then-timer lock
            # order every writer follows.
            locked = list(
                self.sql.owned(run_id, owner, epoch)
                .select_for_update()
                .values_list("cancel_request", flat=True)
            )
            if not locked:
                raise deposed(run_id, owner, epoch, "park")
            request = CancelRequest.of(locked[0])
            now = self.sql.local_now()
            with self.sql.connection.cursor() as cursor:
                for step in steps:
                    self.sql.write_step(cursor, run_id, owner, epoch, step)
                self.sql.write_timers(cursor, run_id, timers, now)
            handled = handled_updates(waiting_on, RunStatus.WAITING)
            if handled is not None:
                self._refuse_unhandled_updates(run_id, handled)
            if (request is not None and request.pending) or self.waking.wait_satisfied(run_id, waiting_on):
                if not self.release(run_id, owner, epoch):
                    raise deposed(run_id, owner, epoch, "park")
                return True
            parked = self.sql.owned(run_id, owner, epoch).update(
                status=RunStatus.WAITING,
                waiting_on=waiting_on,
                owner_id=None,
                lease_expires_at=None,
                ready_at=None,
                dispatched_at=None,
                updated_at=self.sql.now_value(),
            )
            if not parked:
                raise deposed(run_id, owner, epoch, "park")
        return False

    def _refuse_unhandled_updates(self, run_id: str, handled: frozenset[str]) -> None:
        """Answer the updates accepted before the run registered its handlers (so not yet
        checked) that it blocks without a handler for, under the park's row lock: an
        update sent during the turn cannot slip past both this and the turn's reads."""
        refused = (
            Update.objects.using(self.sql.alias)
            .filter(run_id=uuid.UUID(str(run_id)), status=UpdateStatus.ACCEPTED, validated=False)
            .exclude(name__in=handled)
            .values_list("pk", "name")
        )
        for pk, name in list(refused):
            Update.objects.using(self.sql.alias).filter(pk=pk).update(
                status=UpdateStatus.FAILED,
                error=unknown_update_error(name, handled),
                updated_at=self.sql.now_value(),
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
        steps: Sequence[StepWrite] = (),
    ) -> str | None:
        """The owner's terminal commit: status, outcome, release and unfired timers removed,
        and ``steps`` (the run's last, held back by its turn) recorded, fenced on (owner,
        epoch). A child run's commit also wakes its parent if the parent waits for it, in
        the same transaction (the child's row is locked before the parent's: descendants
        before ancestors, the order every writer follows); the woken parent's id is
        returned for its doorbell."""
        if parent is not None and status != RunStatus.CONTINUED:
            with transaction.atomic(using=self.sql.alias):
                self._finish(
                    run_id, owner, epoch, what, status=status, result_json=result_json,
                    error_json=error_json, category=category, steps=steps,
                )  # fmt: skip
                return self.waking.wake_parent(parent)
        if self.sql.is_postgres:
            finished_row = self.sql.finish_in_one_statement(
                run_id, owner, epoch, status=status, result_json=result_json, error_json=error_json,
                category=category, steps=steps,
            )  # fmt: skip
            if finished_row is None:
                raise deposed(run_id, owner, epoch, what)
            workflow_id, workflow_name, queued, finished_at = finished_row
            self.sql.announce_finish(run_id, workflow_id, workflow_name, status, error_json, finished_at)
            if queued is False:
                self._nobody_queued.add(str(run_id))
            return None
        # The clock of the database is this process's where it is not SQL's (SQLite): the
        # end is written as a value, so the signals can say it without reading it back.
        ended = self.sql.local_now()
        with transaction.atomic(using=self.sql.alias):
            for step in steps:
                self.sql.commit_step(run_id, owner, epoch, step)  # raises Deposed if not ours
            names = self.sql.owned(run_id, owner, epoch).values_list("workflow_id", "workflow_name").first()
            finished = names is not None and self.sql.owned(run_id, owner, epoch).update(
                status=status,
                result=codec.loads(result_json),
                error=codec.loads(error_json),
                failure_category=category,
                owner_id=None,
                lease_expires_at=None,
                ready_at=None,
                dispatched_at=None,
                waiting_on=None,
                finished_at=ended,
                updated_at=ended,
            )
            if not finished:
                raise deposed(run_id, owner, epoch, what)
            key = uuid.UUID(str(run_id))
            Timer.objects.using(self.sql.alias).filter(run_id=key).unfired().delete()
            Update.objects.using(self.sql.alias).filter(run_id=key, status=UpdateStatus.ACCEPTED).update(
                status=UpdateStatus.FAILED, error=unanswered_error(status), updated_at=self.sql.now_value()
            )
            assert names is not None
            self.sql.announce_finish(run_id, names[0], names[1], status, error_json, ended)
        return None

    def complete(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        result_json: str,
        *,
        parent: str | None = None,
        steps: Sequence[StepWrite] = (),
    ) -> str | None:
        return self._finish(
            run_id,
            owner,
            epoch,
            "completion",
            status=RunStatus.COMPLETED,
            result_json=result_json,
            parent=parent,
            steps=steps,
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

    def finish_cancelled(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        error_json: str,
        *,
        workflow_name: str,
        parent: str | None = None,
    ) -> str | None:
        """The owner's commit of ``cancelled`` (its workflow let a cancellation propagate),
        fenced: the terminal commit (unfired timers removed, pending updates failed, a
        waiting parent woken) and the finalizer scheduled, in one transaction."""
        with transaction.atomic(using=self.sql.alias):
            woken = self._finish(
                run_id, owner, epoch, "cancellation", status=RunStatus.CANCELLED, error_json=error_json,
                category=FailureCategory.CANCELLATION, parent=parent,
            )  # fmt: skip
            self.finalizers.schedule_finalizer(uuid.UUID(str(run_id)), workflow_name, self.sql.db_now())
        return woken

    def continue_as_new(self, run_id: str, owner: str, epoch: int, args_json: str, kwargs_json: str) -> str:
        with transaction.atomic(using=self.sql.alias):
            run = self.sql.owned(run_id, owner, epoch).select_for_update().first()
            if run is None:
                raise deposed(run_id, owner, epoch, "continue_as_new")
            successor_id = uuid.uuid4()
            pending_request = CancelRequest.of(run.cancel_request)
            if pending_request is not None and not pending_request.pending:
                pending_request = None
            self._finish(
                run_id,
                owner,
                epoch,
                "continue_as_new",
                status=RunStatus.CONTINUED,
                result_json=codec.dumps({"continued_as": str(successor_id)}),
            )
            now = self.sql.db_now()
            self.sql.runs().create(
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
                # A cancellation request the run did not receive before it continued is
                # its successor's to receive.
                cancel_request=run.cancel_request if pending_request is not None else None,
                # It keeps its place in flow control's order and its key, and queues again
                # for a slot (it holds none: the run it continues gave its slot back).
                priority=run.priority,
                concurrency_key=run.concurrency_key,
            )
            if run.execution_deadline is not None:
                # The deadline covers the whole chain of runs: the successor keeps it.
                Timer.objects.using(self.sql.alias).create(
                    run_id=successor_id,
                    seq=RUN_LEVEL_SEQ,
                    kind=TimerKind.DEADLINE,
                    fire_at=run.execution_deadline,
                )
        return str(successor_id)

    def release(
        self, run_id: str, owner: str, epoch: int, *, redispatch: bool = True, keep_place: bool = False
    ) -> bool:
        """Drop ownership, keep status: the run stays runnable for another worker.

        With ``redispatch=False`` the sweep waits ``WEFT_REDISPATCH_AFTER`` before sending it
        out again (for a run this worker could not execute). With ``keep_place=True`` its
        ``ready_at`` stays as it was: a run claimed for a worker's threads and let go
        undriven goes back to its place among the runnable runs (higher priority first,
        then the longest waiting), not behind the others."""
        changes: dict[str, Any] = {
            "owner_id": None,
            "lease_expires_at": None,
            "dispatched_at": None if redispatch else self.sql.now_value(),
            "updated_at": self.sql.now_value(),
        }
        if not keep_place:
            changes["ready_at"] = self.sql.now_value()
        return bool(self.sql.owned(run_id, owner, epoch).update(**changes))

    def renew(self, owner: str, held: dict[str, int], ttl: float) -> Renewal:
        """Extend the lease of every held run; return those another took or changed (a
        run this owner has just ended or released is not among them), and those still
        held that were not renewed.

        On PostgreSQL one statement renews them all and skips rows locked right now (an
        atomic activity of this engine holds its run row, or another process's
        transaction): those are not renewed this round but are not lost either
        (``skipped``). Ownership is then read without locks."""
        if not held:
            return Renewal(set())
        keys = {self.sql.run_key(run_id): run_id for run_id in held}
        renewed: set[str] | None = None  # None: every row this owner owns
        if self.sql.is_postgres:
            params: dict[str, Any] = {"ttl": ttl, "ids": list(keys), "owner": owner}
            now = self.sql.sql_now(params)
            with self.sql.connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {RUN_TABLE} SET lease_expires_at = {now} + %(ttl)s * interval '1 second' "
                    f"WHERE id IN (SELECT id FROM {RUN_TABLE} WHERE id = ANY(%(ids)s) "
                    "AND owner_id = %(owner)s FOR UPDATE SKIP LOCKED) RETURNING id",
                    params,
                )
                renewed = {keys[key] for (key,) in cursor.fetchall() if key in keys}
        else:
            until = self.sql.local_now() + timedelta(seconds=ttl)
            self.sql.runs().filter(pk__in=list(held), owner_id=owner).update(lease_expires_at=until)
        current = {
            str(pk): (owner_id, epoch)
            for pk, owner_id, epoch in self.sql.runs()
            .filter(pk__in=list(held))
            .values_list("pk", "owner_id", "owner_epoch")
        }
        # Unowned at the same epoch: this owner ended or released it (every transition by
        # someone else moves the epoch), in the moment between its commit and the engine
        # forgetting it. That is not a loss.
        lost = {
            run_id
            for run_id, epoch in held.items()
            if current.get(run_id) not in ((owner, epoch), (None, epoch))
        }
        if renewed is None:
            return Renewal(lost)
        kept = {run_id for run_id, epoch in held.items() if current.get(run_id) == (owner, epoch)}
        return Renewal(lost, frozenset(kept - renewed))

    # Messages during a turn (:class:`TurnMessages`).

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        return self.messages.pending_messages(run_id)

    def finish_wait(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, *, signal_pk: int | None = None
    ) -> None:
        self.messages.finish_wait(run_id, owner, epoch, step, signal_pk=signal_pk)

    def apply_update(self, run_id: str, owner: str, epoch: int, step: StepWrite, update_pk: int) -> None:
        self.messages.apply_update(run_id, owner, epoch, step, update_pk)

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
        self.messages.answer_update(
            run_id, owner, epoch, step, update_pk, ok=ok, result_json=result_json, error_json=error_json
        )

    def fail_update(self, run_id: str, owner: str, epoch: int, update_pk: int, error: dict[str, Any]) -> None:
        self.messages.fail_update(run_id, owner, epoch, update_pk, error)

    def deliver_cancel_request(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, delivered: CancelRequest, at: int | None
    ) -> None:
        self.messages.deliver_cancel_request(run_id, owner, epoch, step, delivered, at)

    def cancellation_requested(self, run_id: str, seq: int) -> str | None:
        return self.messages.cancellation_requested(run_id, seq)

    # Children (:class:`Children`).

    def start_child(self, run_id: str, owner: str, epoch: int, step: StepWrite, child: ChildStart) -> None:
        self.children.start_child(run_id, owner, epoch, step, child)

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        return self.children.child_outcome(run_id, seq)

    def close_children(self, run_id: str, reason: str) -> list[str]:
        return self.children.close_children(run_id, reason)

    # Flow control of activity attempts (:class:`ActivityFlow`).

    def take_rate_limit(self, name: str, key: str, rate: Rate) -> datetime | None:
        return self.activity_flow.take_moment(name, key, rate)

    def take_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str
    ) -> SlotTaken:
        return self.activity_flow.take_slot(activity, key, limit, run_id, seq, ttl, holder)

    def release_activity_slot(
        self, activity: str, key: str, limit: int, run_id: str, seq: int, ttl: float, holder: str | None
    ) -> list[str]:
        return self.activity_flow.release_slot(activity, key, limit, run_id, seq, ttl, holder)

    def renew_activity_slots(self, holders: list[tuple[str, int, str]], ttl: float) -> None:
        self.activity_flow.renew_slots(holders, ttl)

    def hand_on_slot(self, run_id: str, workflow_name: str) -> list[tuple[str, int]]:
        if str(run_id) in self._nobody_queued:
            # Its terminal commit saw no run of its workflow queued: nothing to hand on (a
            # run queued in that very instant is let in by the next sweep).
            self._nobody_queued.discard(str(run_id))
            return []
        limit = registry.concurrency_limits().get(workflow_name)
        if limit is None:
            return []
        return [(item.run_id, item.priority) for item in self.flow.released(run_id, workflow_name, limit)]
