"""An in-memory implementation of the engine's store port (:class:`~..ports.TurnStore`).

Faithful to the port's contract where the engine can tell: claims mint a new epoch,
every owner write is fenced on ``(owner, epoch)`` and raises ``Deposed`` having written
nothing, parking releases the run (or leaves it runnable when what it waits for has
already happened), terminal commits release it and wake a waiting parent. It is not a
production store: one lock serialises everything, time is a manual clock
(:meth:`MemoryStore.advance`), and there is no sweep (a test claims runs itself).
Its rows (:class:`MemoryRun`, :class:`MemoryMessage`) are in ``memory_rows``.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import codec
from ..attempt import cancellation_seen
from ..errors import Deposed, WorkflowAlreadyExists, WorkflowNotFound, WorkflowTerminalError
from ..executor import Engine, EngineConfig
from ..flow import HoldKind, hold_is_due
from ..parking import DUE_HOLD
from ..records import (
    ACTIVE_STATUSES,
    PENDING_STEP_STATUSES,
    CancelRequest,
    ChildOutcome,
    ChildStart,
    ClaimedRun,
    MessageKind,
    PendingMessage,
    Renewal,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
)
from ..registry import Registry
from .memory_flow import MemoryFlowControl
from .memory_rows import MemoryMessage, MemoryRun, step_record


class MemoryStore(MemoryFlowControl):
    """The engine's store port in memory; see the module docstring for what it leaves out."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2030, 1, 1, tzinfo=UTC)
        self.runs: dict[str, MemoryRun] = {}
        self.messages: list[MemoryMessage] = []
        self.buckets: dict[tuple[str, str], int] = {}
        self.slots: dict[tuple[str, str], tuple[dict[tuple[str, int], str], list[tuple[str, int]]]] = {}
        self._pks = itertools.count(1)
        self._lock = threading.RLock()

    # -- what a client or a test does ----------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the store's clock (the "database clock") forward."""
        self.now += timedelta(seconds=seconds)

    def start(self, workflow_name: str, *args: Any, workflow_id: str | None = None, **kwargs: Any) -> str:
        """Create a runnable, unowned run; return its id."""
        with self._lock:
            run_id = str(uuid.uuid4())
            self.runs[run_id] = MemoryRun(
                run_id, workflow_id or run_id, workflow_name, list(args), kwargs, created_at=self.now
            )
            return run_id

    def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a signal; wakes the run if it waits for or handles ``name``."""
        self._deliver(MemoryMessage(MessageKind.SIGNAL, next(self._pks), run_id, name, payload), "signals")

    def update(self, run_id: str, name: str, payload: Any = None) -> str:
        """Accept an update (already validated); return its update id."""
        update_id = str(uuid.uuid4())
        message = MemoryMessage(MessageKind.UPDATE, next(self._pks), run_id, name, payload, update_id)
        self._deliver(message, "updates")
        return update_id

    def request_cancel(self, run_id: str, reason: str | None = None, *, from_parent: bool = False) -> bool:
        """Store a cancellation request (the Django store's rule: refused for a finished
        run, nothing new while one is pending) and wake the run if it is parked. Returns
        whether a request was stored."""
        with self._lock:
            run = self.runs[run_id]
            if run.status not in ACTIVE_STATUSES:
                raise WorkflowTerminalError(f"run {run_id} is {run.status}", run_id=run_id, status=run.status)
            if run.cancel_request is not None and run.cancel_request.pending:
                if from_parent:
                    run.cancel_request = replace(run.cancel_request, from_parent=True)
                return False
            run.cancel_request = CancelRequest(
                self.now.isoformat(),
                reason,
                from_parent=from_parent or bool(run.cancel_request and run.cancel_request.from_parent),
            )
            if run.status == RunStatus.WAITING:
                run.status, run.waiting_on = RunStatus.RUNNING, None
            return True

    def finish_activity(
        self, run_id: str, seq: int, *, result: Any = None, error: Exception | None = None
    ) -> bool:
        """Play a worker: record the outcome of the queued attempt at ``seq`` and wake the
        run if that is what it waits for. Returns whether the run was woken."""
        with self._lock:
            run = self.runs[run_id]
            step = run.steps[seq]
            assert step.status in (StepStatus.SCHEDULED, StepStatus.STARTED), step
            failure = None if error is None else {"type": type(error).__name__, "message": str(error)}
            run.steps[seq] = replace(
                step,
                status=StepStatus.COMPLETED if error is None else StepStatus.ATTEMPT_FAILED,
                result_json=codec.dumps(result) if error is None else None,
                error_json=codec.dumps({**failure, "retryable": True}) if failure else None,
                finished_at=self.now,
            )
            run.timers.pop((seq, TimerKind.ACTIVITY), None)
            return self._wake_if_satisfied(run)

    def history(self, run_id: str) -> list[StepRecord]:
        """The run's recorded steps in order, as a claim would load them."""
        with self._lock:
            return [step_record(step) for _, step in sorted(self.runs[run_id].steps.items())]

    def update_outcome(self, update_id: str) -> tuple[str, Any, dict[str, Any] | None]:
        """``(status, result, error)`` of the update ``update_id``."""
        message = next(m for m in self.messages if m.update_id == update_id)
        return message.status, message.result, message.error

    def _deliver(self, message: MemoryMessage, names_key: str) -> None:
        with self._lock:
            run = self.runs.get(message.run_id)
            if run is None:
                raise WorkflowNotFound(f"run {message.run_id} does not exist", ref=message.run_id)
            self.messages.append(message)
            if run.status == RunStatus.WAITING and message.name in (
                (run.waiting_on or {}).get(names_key) or []
            ):
                run.status, run.waiting_on = RunStatus.RUNNING, None

    # -- the port: claim and fenced writes ------------------------------------------------

    def db_now(self) -> datetime:
        return self.now

    def claim(
        self, run_id: str, owner: str, ttl: float, grace: float, workflows: Collection[str] | None = None
    ) -> ClaimedRun | None:
        with self._lock:
            run = self.runs.get(run_id)
            if run is None or (workflows is not None and run.workflow_name not in workflows):
                return None
            if run.status in (RunStatus.WAITING, RunStatus.PENDING):
                if not self._fire_due_timers(run):
                    return None
            elif run.status != RunStatus.RUNNING or (
                run.owner is not None
                and not (
                    run.lease_expires_at is not None
                    and run.lease_expires_at < self.now - timedelta(seconds=grace)
                )
            ):
                return None
            takeover = run.owner is not None
            due_at = run.lease_expires_at if takeover else None
            run.status, run.waiting_on = RunStatus.RUNNING, None
            run.owner, run.epoch = owner, run.epoch + 1
            run.lease_expires_at = self.now + timedelta(seconds=ttl)
            return ClaimedRun(
                run_id=run.run_id,
                workflow_id=run.workflow_id,
                workflow_name=run.workflow_name,
                args=list(run.args),
                kwargs=dict(run.kwargs),
                epoch=run.epoch,
                attempt=run.attempt,
                created_at=run.created_at,
                db_now=self.now,
                steps={seq: step_record(step) for seq, step in run.steps.items()},
                parent_run_id=run.parent_run_id,
                search_attributes=dict(run.search_attributes),
                cancel_request=run.cancel_request
                if run.cancel_request and run.cancel_request.pending
                else None,
                takeover=takeover,
                due_at=due_at,
            )

    def _fire_due_timers(self, run: MemoryRun) -> bool:
        """Fire a waiting run's due timers (a due deadline is the sweep's); whether any fired."""
        due = [key for key, t in run.timers.items() if t.fire_at <= self.now and t.kind != TimerKind.DEADLINE]
        for key in due:
            del run.timers[key]
            seq, kind = key
            step = run.steps.get(seq)
            if kind == TimerKind.ACTIVITY and step is not None and step.status in PENDING_STEP_STATUSES:
                started = step.status == StepStatus.STARTED
                error = {"type": "django_weft.WorkerLost" if started else "django_weft.DispatchLost",
                         "message": "the attempt was lost", "started": started}  # fmt: skip
                run.steps[seq] = replace(step, status=StepStatus.LOST, error_json=codec.dumps(error))
        return bool(due)

    def _owned(self, run_id: str, owner: str, epoch: int, what: str) -> MemoryRun:
        """The fence: the run if ``owner`` holds it at ``epoch``, else ``Deposed``."""
        run = self.runs.get(run_id)
        if run is None or run.owner != owner or run.epoch != epoch:
            raise Deposed(
                f"run {run_id}: {what} refused, epoch {epoch} of {owner} is no longer the owner "
                f"(now epoch {run.epoch if run else '?'})",
                run_id=run_id,
                owner=owner,
                epoch=epoch,
            )
        return run

    def commit_step(self, run_id: str, owner: str, epoch: int, step: StepWrite) -> None:
        with self._lock:
            self._owned(run_id, owner, epoch, f"step {step.seq}").steps[step.seq] = step

    def commit_step_atomic(
        self, run_id: str, owner: str, epoch: int, body: Callable[[], StepWrite]
    ) -> StepWrite:
        with self._lock:
            run = self._owned(run_id, owner, epoch, "atomic activity")
            step = body()  # an exception leaves nothing written
            run.steps[step.seq] = step
            return step

    def park(
        self,
        run_id: str,
        owner: str,
        epoch: int,
        waiting_on: dict[str, object],
        steps: Iterable[StepWrite],
        timers: Iterable[TimerWrite],
    ) -> bool:
        with self._lock:
            run = self._owned(run_id, owner, epoch, "park")
            for step in steps:
                run.steps[step.seq] = step
            for timer in timers:
                run.timers[(timer.seq, timer.kind)] = timer
            run.owner, run.lease_expires_at = None, None
            pending_request = run.cancel_request is not None and run.cancel_request.pending
            if pending_request or self._wait_satisfied(run, dict(waiting_on)):
                return True
            run.status, run.waiting_on = RunStatus.WAITING, dict(waiting_on)
            return False

    def schedule_activity(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, timer: TimerWrite
    ) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            run.steps[step.seq] = step
            run.timers[(timer.seq, timer.kind)] = timer

    def pending_messages(self, run_id: str) -> list[PendingMessage]:
        with self._lock:
            return [
                PendingMessage(m.kind, m.pk, m.name, m.payload, m.update_id)
                for m in self.messages
                if m.run_id == run_id and self._is_pending(m)
            ]

    def finish_wait(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, *, signal_pk: int | None = None
    ) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            if signal_pk is not None:
                signal = self._message(run_id, signal_pk)
                if signal.consumed_seq is not None:
                    raise AssertionError(f"signal {signal_pk} of run {run_id} was consumed twice")
                signal.consumed_seq = step.seq
            run.steps[step.seq] = step
            for key in [key for key in run.timers if key[0] == step.seq]:
                del run.timers[key]

    def apply_update(self, run_id: str, owner: str, epoch: int, step: StepWrite, update_pk: int) -> None:
        with self._lock:
            self._owned(run_id, owner, epoch, f"step {step.seq}").steps[step.seq] = step
            update = self._message(run_id, update_pk)
            if update.applied_seq is None:
                update.applied_seq = step.seq

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
        with self._lock:
            self._owned(run_id, owner, epoch, f"step {step.seq}").steps[step.seq] = step
            update = self._message(run_id, update_pk)
            if update.status == "accepted":
                update.status = "completed" if ok else "failed"
                update.result = codec.loads(result_json) if result_json is not None else None
                update.error = codec.loads(error_json) if error_json is not None else None

    def fail_update(self, run_id: str, owner: str, epoch: int, update_pk: int, error: dict[str, Any]) -> None:
        with self._lock:
            self._owned(run_id, owner, epoch, f"failing update {update_pk}")
            update = self._message(run_id, update_pk)
            if update.status == "accepted":
                update.status, update.error = "failed", error

    def deliver_cancel_request(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, delivered: CancelRequest, at: int | None
    ) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            run.steps[step.seq] = step
            run.cancel_request = delivered
            if at is not None:
                for key in [key for key in run.timers if key[0] == at and key[1] != TimerKind.ACTIVITY]:
                    del run.timers[key]

    def cancellation_requested(self, run_id: str, seq: int) -> str | None:
        with self._lock:
            run = self.runs.get(run_id)
            return cancellation_seen(run.status if run else None, run.cancel_request if run else None, seq)

    def set_finalizer_state(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, state_json: str
    ) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            run.steps[step.seq] = step
            run.finalizer_state = codec.loads(state_json)

    def set_search_attributes(
        self, run_id: str, owner: str, epoch: int, step: StepWrite, attributes: dict[str, Any]
    ) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            run.steps[step.seq] = step
            removed = {key for key, value in attributes.items() if value is None}
            merged = {**run.search_attributes, **attributes}
            run.search_attributes = {key: value for key, value in merged.items() if key not in removed}

    # -- terminal commits ----------------------------------------------------------------

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
        with self._lock:
            run = self._owned(run_id, owner, epoch, "completion")
            for step in steps:
                run.steps[step.seq] = step
            self._finish(run, RunStatus.COMPLETED)
            self.runs[run_id].result = codec.loads(result_json)
            return self._wake_parent(parent)

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
        with self._lock:
            run = self._owned(run_id, owner, epoch, "failure")
            self._finish(run, RunStatus.FAILED)
            run.error, run.failure_category = codec.loads(error_json), category
            return self._wake_parent(parent)

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
        with self._lock:
            run = self._owned(run_id, owner, epoch, "cancellation")
            self._finish(run, RunStatus.CANCELLED)
            run.error, run.failure_category = codec.loads(error_json), "cancellation"
            return self._wake_parent(parent)

    def continue_as_new(self, run_id: str, owner: str, epoch: int, args_json: str, kwargs_json: str) -> str:
        with self._lock:
            run = self._owned(run_id, owner, epoch, "continue_as_new")
            successor = str(uuid.uuid4())
            self._finish(run, RunStatus.CONTINUED)
            run.result = {"continued_as": successor}
            self.runs[successor] = MemoryRun(
                successor,
                run.workflow_id,
                run.workflow_name,
                codec.loads(args_json),
                codec.loads(kwargs_json),
                created_at=self.now,
                parent_run_id=run.parent_run_id,
                parent_seq=run.parent_seq,
                parent_close_policy=run.parent_close_policy,
                search_attributes=dict(run.search_attributes),
                # A request the run did not receive before it continued is its successor's.
                cancel_request=run.cancel_request
                if run.cancel_request and run.cancel_request.pending
                else None,
            )
            return successor

    def _finish(self, run: MemoryRun, status: str) -> None:
        run.status, run.owner, run.lease_expires_at, run.waiting_on = status, None, None, None
        run.timers.clear()
        for message in self.messages:
            if (
                message.run_id == run.run_id
                and message.kind == MessageKind.UPDATE
                and message.status == "accepted"
            ):
                message.status = "failed"
                message.error = {"type": "django_weft.RunFinished", "message": f"the run finished ({status})"}

    def release(
        self, run_id: str, owner: str, epoch: int, *, redispatch: bool = True, keep_place: bool = False
    ) -> bool:
        with self._lock:
            run = self.runs.get(run_id)
            if run is None or run.owner != owner or run.epoch != epoch:
                return False
            run.owner, run.lease_expires_at = None, None
            return True

    def renew(self, owner: str, held: dict[str, int], ttl: float) -> Renewal:
        with self._lock:
            lost = set()
            for run_id, epoch in held.items():
                run = self.runs.get(run_id)
                if run is None or run.owner != owner or run.epoch != epoch:
                    lost.add(run_id)
                else:
                    run.lease_expires_at = self.now + timedelta(seconds=ttl)
            return Renewal(lost)

    # -- children ------------------------------------------------------------------------

    def start_child(self, run_id: str, owner: str, epoch: int, step: StepWrite, child: ChildStart) -> None:
        with self._lock:
            run = self._owned(run_id, owner, epoch, f"step {step.seq}")
            if any(
                r.workflow_id == child.workflow_id and r.status in ACTIVE_STATUSES for r in self.runs.values()
            ):
                raise WorkflowAlreadyExists(
                    f"a live run with workflow id {child.workflow_id!r} exists", workflow_id=child.workflow_id
                )
            run.steps[step.seq] = step
            self.runs[child.run_id] = MemoryRun(
                child.run_id,
                child.workflow_id,
                child.workflow_name,
                codec.loads(child.args_json),
                codec.loads(child.kwargs_json),
                created_at=self.now,
                parent_run_id=run_id,
                parent_seq=step.seq,
                parent_close_policy=child.parent_close_policy,
            )

    def child_outcome(self, run_id: str, seq: int) -> ChildOutcome | None:
        with self._lock:
            chain = [r for r in self.runs.values() if r.parent_run_id == run_id and r.parent_seq == seq]
            last = [r for r in chain if r.status != RunStatus.CONTINUED]
            if not last or last[-1].status in ACTIVE_STATUSES:
                return None
            child = last[-1]
            return ChildOutcome(child.run_id, child.workflow_id, child.status, child.result, child.error)

    def close_children(self, run_id: str, reason: str) -> list[str]:
        with self._lock:
            cancelled: list[str] = []
            for child in list(self.runs.values()):
                live = child.status in ACTIVE_STATUSES and child.parent_close_policy != "abandon"
                if child.parent_run_id == run_id and live and child.parent_close_policy == "request_cancel":
                    self.request_cancel(child.run_id, reason, from_parent=True)
                    cancelled.append(child.run_id)
                elif child.parent_run_id == run_id and live:
                    child.epoch += 1  # an external transition rotates the epoch
                    self._finish(child, RunStatus.CANCELLED)
                    child.error = {"type": "django_weft.Cancelled", "message": reason}
                    cancelled += [child.run_id, *self.close_children(child.run_id, reason)]
            return cancelled

    # -- waking --------------------------------------------------------------------------

    def _wake_parent(self, parent: str | None) -> str | None:
        run = self.runs.get(parent) if parent is not None else None
        if run is None or not self._wake_if_satisfied(run):
            return None
        return run.run_id

    def _wake_if_satisfied(self, run: MemoryRun) -> bool:
        if run.status != RunStatus.WAITING or not self._wait_satisfied(run, run.waiting_on or {}):
            return False
        run.status, run.waiting_on = RunStatus.RUNNING, None
        return True

    def _wait_satisfied(self, run: MemoryRun, waiting_on: dict[str, Any]) -> bool:
        """Whether what a parked run waits for has happened (the Django store's rule):
        a message it waits for or handles is pending, or its queued work is done."""
        signals, updates = waiting_on.get("signals") or [], waiting_on.get("updates") or []
        for m in self.messages:
            if (
                m.run_id == run.run_id
                and self._is_pending(m)
                and m.name in (signals if m.kind == MessageKind.SIGNAL else updates)
            ):
                return True
        if waiting_on.get("kind") == HoldKind.CONCURRENCY:
            holder = (run.run_id, int(waiting_on["seq"]))
            return any(held.get(holder) == "" for held, _ in self.slots.values())
        seqs = list(waiting_on.get("seqs") or []) if waiting_on.get("kind") == "activities" else []
        background = list(waiting_on.get("background") or [])
        status_of = {seq: self._work_status(run, seq) for seq in seqs + background}
        needs_decision = (StepStatus.ATTEMPT_FAILED, StepStatus.LOST, DUE_HOLD)
        if any(status_of[seq] in needs_decision for seq in background):
            return True
        if not seqs:
            return False
        pending = [status_of[seq] in PENDING_STEP_STATUSES for seq in seqs]
        if waiting_on.get("mode") == "any":
            return not all(pending)
        return not any(pending) or any(status_of[seq] in needs_decision for seq in seqs)

    def _work_status(self, run: MemoryRun, seq: int) -> str | None:
        step = run.steps.get(seq)
        if step is not None and step.status == StepStatus.DELAYED:
            return DUE_HOLD if hold_is_due(codec.loads(step.result_json or "{}"), self.now) else step.status
        if step is None or step.kind != StepKind.CHILD or step.status != StepStatus.WAITING:
            return step.status if step is not None else None
        live = self.child_outcome(run.run_id, seq) is None
        return StepStatus.SCHEDULED if live else StepStatus.COMPLETED

    def _is_pending(self, message: MemoryMessage) -> bool:
        if message.kind == MessageKind.SIGNAL:
            return message.consumed_seq is None
        return message.status == "accepted" and message.applied_seq is None

    def _message(self, run_id: str, pk: int) -> MemoryMessage:
        return next(m for m in self.messages if m.run_id == run_id and m.pk == pk)


@dataclass
class RecordingDispatcher:
    """The engine's dispatcher port that only remembers the doorbells it was asked to ring."""

    turns: list[tuple[str, datetime | None]] = field(default_factory=list)
    activities: list[tuple[str, int, int, str]] = field(default_factory=list)

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None) -> None:
        self.turns.append((run_id, eta))

    def dispatch_activity(
        self, run_id: str, seq: int, attempt: int, *, queue: str, timeout: float | None = None
    ) -> None:
        self.activities.append((run_id, seq, attempt, queue))


def memory_engine(
    workflows: Registry, config: EngineConfig | None = None, *, engine_id: str = "engine-1"
) -> tuple[Engine, MemoryStore, RecordingDispatcher]:
    """A real :class:`Engine` running ``workflows`` on a fresh :class:`MemoryStore`."""
    store, dispatcher = MemoryStore(), RecordingDispatcher()
    settings = config or EngineConfig()
    engine = Engine(store, dispatcher, lambda: settings, engine_id=engine_id, workflows=workflows)
    return engine, store, dispatcher
