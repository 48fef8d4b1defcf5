"""The engine: claims a run, replays its workflow function, commits the outcome."""

from __future__ import annotations

import enum
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import clock, codec, faults, observe, run_logging
from .attempt import describe_exception
from .context import WorkflowContext
from .error_types import ErrorType
from .errors import (
    ActivityFailed,
    CancellationRequested,
    ChildWorkflowFailed,
    Deposed,
    NonDeterminismError,
    PayloadError,
    WorkflowCancelled,
    WorkflowNotRegistered,
)
from .flow import Rate
from .ports import Dispatcher, TurnStore, ring_activity, ring_turn
from .records import FINALIZER_SEQ, ClaimedRun, FailureCategory, RunStatus, StepKind, StepWrite
from .registry import Registry, registry
from .retry import RetryPolicy
from .run_logging import get_logger
from .unwind import ContinueAsNew, DeposedUnwind, Park, QueryFrontier, Unwind

logger = get_logger("django_weft.engine")


@dataclass(frozen=True)
class EngineConfig:
    lease_ttl: float = 30.0
    takeover_grace: float = 10.0
    default_retry: RetryPolicy = field(default_factory=RetryPolicy)
    inline_retry_max_delay: float = 2.0
    # How long a queued activity attempt may sit in its queue before it is sent again.
    redispatch_after: float = 15.0
    # WEFT_RATE_LIMITS: the rates that override rate limits' own, by name.
    rate_limits: Mapping[str, Rate] = field(default_factory=dict)


class TurnOutcome(enum.StrEnum):
    NOT_CLAIMED = "not_claimed"
    PARKED = "parked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # the workflow let a cancellation (request) propagate
    CONTINUED = "continued"
    DEPOSED = "deposed"
    RELEASED = "released"


def new_engine_id() -> str:
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Engine:
    """Runs turns of workflow runs for one engine identity (one per worker process).

    Thread-safe: several threads may run turns of different runs at once. The set of
    runs this engine currently drives (``held``) is what the lease heartbeat renews.
    """

    def __init__(
        self,
        store: TurnStore,
        dispatcher: Dispatcher,
        config: Callable[[], EngineConfig],
        *,
        engine_id: str | None = None,
        workflows: Registry = registry,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.config = config
        self.engine_id = engine_id or new_engine_id()
        self.workflows = workflows
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._lost: set[str] = set()
        # Since when each held run's lease is known to be current (the engine clock): its
        # claim, then each renewal that extended it. A claim made before its turn is
        # trusted only while its lease is known to be current (_still_held).
        self._held_at: dict[str, float] = {}
        # Executions of activity attempts (run id, seq, holder) holding a concurrency slot
        # in this process.
        self._slots: set[tuple[str, int, str]] = set()

    # -- ownership bookkeeping ---------------------------------------------------------

    def held(self) -> dict[str, int]:
        """Run id -> epoch of the runs this engine is driving right now."""
        with self._lock:
            return dict(self._held)

    def is_lost(self, run_id: str, epoch: int | None = None) -> bool:
        """Whether the heartbeat found ``run_id`` under another epoch; given ``epoch``,
        also whether this engine holds the run under another one now (a turn of an
        older claim, still running here)."""
        with self._lock:
            return run_id in self._lost or (epoch is not None and self._held.get(run_id) != epoch)

    @contextmanager
    def holding_slot(self, run_id: str, seq: int, holder: str) -> Iterator[None]:
        """While the block runs, the execution ``holder`` of the activity attempt at
        ``(run_id, seq)`` holds a concurrency slot: :meth:`renew_leases` renews it with
        the run leases, whether or not this engine still holds the run."""
        execution = (str(run_id), seq, holder)
        with self._lock:
            self._slots.add(execution)
        try:
            yield
        finally:
            with self._lock:
                self._slots.discard(execution)

    def renew_leases(self) -> set[str]:
        """Extend the leases of every held run and the concurrency slots of the activity
        attempts running here; runs found under another epoch are deposed locally (their
        turns stop at the next durable operation)."""
        with self._lock:
            slots = list(self._slots)
        if slots:
            self.store.renew_activity_slots(slots, self.config().lease_ttl)
        began = clock.monotonic()  # before the runs are read: a run held later is not renewed here
        held = self.held()
        if not held:
            return set()
        renewal = self.store.renew(self.engine_id, held, self.config().lease_ttl)
        lost = renewal.lost
        with self._lock:
            for run_id, epoch in held.items():
                # Renewed (not lost, nor skipped: its row locked elsewhere right then),
                # and still held under the same claim: its lease is current from `began`.
                if run_id not in lost and run_id not in renewal.skipped and self._held.get(run_id) == epoch:
                    self._held_at[run_id] = max(self._held_at.get(run_id, began), began)
            if lost:
                # A turn that finished meanwhile released its run: that is not a loss.
                lost = {run for run in lost if self._held.get(run) == held[run]}
                self._lost.update(lost)
        for run_id in lost:
            logger.warning("run %s: lease lost (deposed), stopping", run_id)
        return lost

    def release_all(self) -> list[str]:
        """Give up every held run (used at shutdown for turns that did not finish, and
        claims no turn took): none is held any longer (the heartbeat renews nothing), and
        a turn still running sees its run lost."""
        released = []
        for run_id, epoch in self.held().items():
            with self._lock:
                self._lost.add(run_id)
                if self._held.get(run_id) == epoch:
                    del self._held[run_id]
                    self._held_at.pop(run_id, None)
            if self.store.release(run_id, self.engine_id, epoch):
                released.append(run_id)
                logger.info("run %s: released at shutdown (epoch %s)", run_id, epoch)
        return released

    # -- doorbells ----------------------------------------------------------------------

    def dispatch_turn(self, run_id: str, *, eta: datetime | None = None, priority: int = 0) -> None:
        """Ring the doorbell for a run; a failure (broker down) is logged, not raised: the
        database already holds the work and the sweep sends it again. ``priority`` goes
        to a dispatcher that orders by it (``takes_priority``)."""
        try:
            ring_turn(self.dispatcher, run_id, eta=eta, priority=priority)
        except Exception:
            logger.warning("run %s: could not dispatch a turn; the sweep will", run_id, exc_info=True)

    def dispatch_activity(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        *,
        queue: str,
        timeout: float | None = None,
        priority: int = 0,
    ) -> None:
        """Send an attempt of a queued activity to a worker (a latency hint: its timer sends
        it again if this is lost), with its run's ``priority`` to a dispatcher that orders
        by it (``takes_priority``)."""
        try:
            ring_activity(
                self.dispatcher, run_id, seq, attempt, queue=queue, timeout=timeout, priority=priority
            )
        except Exception:
            logger.warning(
                "run %s: could not dispatch activity %s attempt %s; its timer will resend it",
                run_id,
                seq,
                attempt,
                exc_info=True,
            )

    # -- a turn ------------------------------------------------------------------------

    def hold(self, claimed: ClaimedRun, *, since: float | None = None) -> None:
        """Hold a run claimed for this engine elsewhere (a worker's sweep claims the runs
        it hands its own threads): its lease is renewed from now on, and a thread drives
        it with :meth:`run_turn` given ``claimed``. ``since``: the engine clock's reading
        before the claim was written (its lease counts from then), else now."""
        with self._lock:
            self._held[claimed.run_id] = claimed.epoch
            self._held_at[claimed.run_id] = clock.monotonic() if since is None else since
            self._lost.discard(claimed.run_id)

    def let_go(self, claimed: ClaimedRun) -> bool:
        """Release a run held by :meth:`hold` that no turn will drive (a stopping worker's,
        or one its threads left waiting): it is runnable again for any worker, in its
        place among the runnable runs. ``False`` if it was no longer ours."""
        self._forget(claimed.run_id, claimed.epoch)
        try:
            released = self.store.release(claimed.run_id, self.engine_id, claimed.epoch, keep_place=True)
        except Exception:
            logger.warning("run %s: could not release it (epoch %s); it is taken over once its lease "
                           "expires", claimed.run_id, claimed.epoch, exc_info=True)  # fmt: skip
            return False
        if released:
            logger.info("run %s: released, not driven (epoch %s)", claimed.run_id, claimed.epoch)
        return released

    def _forget(self, run_id: str, epoch: int) -> None:
        """Stop holding ``run_id`` at ``epoch`` (a newer hold of it stays)."""
        with self._lock:
            if self._held.get(run_id) == epoch:
                del self._held[run_id]
                self._held_at.pop(run_id, None)
                self._lost.discard(run_id)

    def run_turn(self, run_id: str, *, claimed: ClaimedRun | None = None) -> TurnOutcome:
        """Claim ``run_id`` and drive it until it parks or finishes.

        Safe to call for any id at any time: a run that is not claimable (owned by a live
        engine, waiting, finished, unknown) returns ``NOT_CLAIMED`` without side effects.

        ``claimed``: the run was claimed for this engine already and is held
        (:meth:`hold`); it is driven as it is, unless its lease was lost meanwhile
        (``DEPOSED``, nothing written).
        """
        config = self.config()
        if claimed is None:
            claimed = self._claim(run_id, config)
            if claimed is None:
                return TurnOutcome.NOT_CLAIMED
        elif not self._still_held(claimed):
            logger.warning("run %s: lost (epoch %s is no longer current) before its turn began; "
                           "not driven", run_id, claimed.epoch, extra={"run_id": run_id})  # fmt: skip
            return TurnOutcome.DEPOSED
        observe.run_claimed(claimed, self.engine_id)
        with (
            run_logging.bound(run_id=run_id, workflow_id=claimed.workflow_id, workflow=claimed.workflow_name),
            observe.turn(claimed, self.engine_id, takeover=claimed.takeover) as seen,
        ):
            seen.outcome = outcome = self._turn(claimed, config)
        if outcome in _FINISHED:
            observe.run_finished(
                run_id=run_id,
                workflow_id=claimed.workflow_id,
                workflow=claimed.workflow_name,
                status=_FINISHED[outcome],
            )
        return outcome

    def _claim(self, run_id: str, config: EngineConfig) -> ClaimedRun | None:
        # Only runs of the workflows registered here: a worker without a workflow's code
        # leaves its runs alone instead of claiming and releasing them (which would move
        # their epoch for nothing); docs/explanation/decisions.md.
        names = self.workflows.workflow_names()
        claimed = self.store.claim(run_id, self.engine_id, config.lease_ttl, config.takeover_grace, names)
        if claimed is None:
            logger.debug("run %s: not claimable (owned, waiting, finished, unknown, or its workflow is "
                         "not registered here)", run_id, extra={"run_id": run_id})  # fmt: skip
            return None
        self.hold(claimed)
        return claimed

    def _still_held(self, claimed: ClaimedRun) -> bool:
        """Whether a run claimed for this engine before its turn (:meth:`hold`) is still
        surely ours: the heartbeat found no other epoch, and its lease is known to be
        current (set or renewed less than ``lease_ttl`` ago; another engine may take it
        over only a takeover grace after that). Otherwise it is let go: released if it
        still is ours, never driven on a claim that may have been taken over."""
        run_id = claimed.run_id
        with self._lock:
            held = self._held.get(run_id) == claimed.epoch
            lost = run_id in self._lost
            since = self._held_at.get(run_id, float("-inf"))
        if not held:
            return False
        if lost:
            self._forget(run_id, claimed.epoch)
            return False
        if clock.monotonic() - since < self.config().lease_ttl:
            return True
        age = clock.monotonic() - since
        logger.warning("run %s: its lease was last known current %.1f s ago (epoch %s); released, "
                       "not driven", run_id, age, claimed.epoch, extra={"run_id": run_id})  # fmt: skip
        self.let_go(claimed)
        return False

    def _turn(self, claimed: ClaimedRun, config: EngineConfig) -> TurnOutcome:
        run_id = claimed.run_id
        label = f"run {run_id} ({claimed.workflow_name} {claimed.workflow_id})"
        logger.info("%s: claimed, epoch %s, %d recorded steps", label, claimed.epoch, len(claimed.steps))
        try:
            faults.hit("after_claim", run_id=run_id, engine=self)
            try:
                workflow = self.workflows.get_workflow(claimed.workflow_name)
            except WorkflowNotRegistered:
                # Unregistered between the claim and here (tests unregister workflows):
                # another worker may know this workflow.
                self.store.release(run_id, self.engine_id, claimed.epoch, redispatch=False)
                logger.error("%s: workflow not registered in this worker; released", label)
                return TurnOutcome.RELEASED
            return self._drive(claimed, workflow, config, label)
        except Deposed:
            logger.warning("%s: deposed (epoch %s is no longer current), stopped", label, claimed.epoch)
            if not self.is_lost(run_id):
                # A fenced write was refused (not the heartbeat finding the lease lost,
                # which stops the turn before it writes).
                observe.deposed_write(run_id=run_id, engine_id=self.engine_id, epoch=claimed.epoch)
            return TurnOutcome.DEPOSED
        finally:
            self._forget(run_id, claimed.epoch)

    def replay_read_only(self, claimed: ClaimedRun) -> WorkflowContext:
        """Re-execute the workflow function over ``claimed``'s recorded history without
        executing or writing anything, and return the context at the point reached: the
        end of the history (where the run is blocked or will continue) or the function's
        return. What the handlers registered there see is the workflow's current state.

        Used for queries and update validation; takes no lease. Raises
        ``NonDeterminismError`` when the code no longer matches the history."""
        workflow = self.workflows.get_workflow(claimed.workflow_name)
        ctx = WorkflowContext(self, claimed, self.config(), workflow, read_only=True, due_sleeps_over=True)
        try:
            workflow(ctx, *claimed.args, **claimed.kwargs)
        except Unwind:
            pass
        except Exception:
            pass
        if ctx._fatal is not None:
            raise ctx._fatal
        if ctx._unwinding is not None and not isinstance(ctx._unwinding, QueryFrontier | ContinueAsNew):
            raise AssertionError(f"unexpected unwinding {ctx._unwinding!r} in a read-only replay")
        return ctx

    def _drive(self, claimed: Any, workflow: Any, config: EngineConfig, label: str) -> TurnOutcome:
        run_id, epoch, me = claimed.run_id, claimed.epoch, self.engine_id
        ctx = WorkflowContext(self, claimed, config, workflow)
        error: Exception | None = None
        value: Any = None
        propagated = False
        try:
            value = workflow(ctx, *claimed.args, **claimed.kwargs)
        except Unwind:
            propagated = True
        except Exception as exc:
            error = exc
        # What the engine decided wins over what the workflow code did with it: a lost
        # run, then non-determinism, then a park or continue-as-new that the code caught
        # (or turned into another exception while unwinding), then the code's own outcome.
        unwinding = ctx._unwinding
        if isinstance(unwinding, DeposedUnwind):
            raise unwinding.cause
        # Steps not written yet (an inline activity's result, a sleep's end): the completion
        # writes them in its own statement; any other end writes them first.
        held = ctx._fence.take_held()
        if not (unwinding is None and error is None and ctx._fatal is None):
            self._write_held(ctx, held)
            held = []
        if ctx._fatal is not None:
            return self._fail(ctx, ctx._fatal, FailureCategory.NONDETERMINISM, label)
        if unwinding is not None and not isinstance(unwinding, ContinueAsNew | Park):
            raise AssertionError(f"unexpected unwinding {unwinding!r}")
        if unwinding is None and error is not None:
            if _is_cancellation(error):
                return self._cancel(ctx, error, label)
            category = (
                FailureCategory.ACTIVITY if isinstance(error, ActivityFailed) else FailureCategory.APPLICATION
            )
            return self._fail(ctx, error, category, label)
        if unwinding is None or isinstance(unwinding, ContinueAsNew):
            leftover = ctx.unconsumed_history()
            if leftover is not None:
                self._write_held(ctx, held)
                return self._fail(ctx, leftover, FailureCategory.NONDETERMINISM, label)
        if unwinding is None:
            try:
                result_json = codec.dumps(value, what=f"the result of workflow {workflow.name}")
            except PayloadError as exc:
                self._write_held(ctx, held)
                return self._fail(ctx, exc, FailureCategory.APPLICATION, label)
            faults.hit("before_complete", run_id=run_id, engine=self)
            # The last steps, if held back, are written by the completion's own statement.
            woken_parent = self.store.complete(
                run_id, me, epoch, result_json, parent=claimed.parent_run_id, steps=held
            )
            for step in held:
                ctx._step_written(step)
            logger.info("%s: completed", label)
            self._after_close(ctx, woken_parent, "completed")
            return TurnOutcome.COMPLETED
        if not propagated:
            logger.warning("%s: workflow code caught the engine's unwinding; honouring it", label)
        if isinstance(unwinding, ContinueAsNew):
            new_run = self.store.continue_as_new(
                run_id, me, epoch, unwinding.args_json, unwinding.kwargs_json
            )
            logger.info("%s: continued as new run %s", label, new_run)
            self.dispatch_turn(new_run, priority=claimed.priority)  # the new run keeps the priority
            self._after_close(ctx, None, "continued as new")
            return TurnOutcome.CONTINUED
        assert isinstance(unwinding, Park)
        faults.hit("before_park", run_id=run_id, engine=self)
        woken = self.store.park(run_id, me, epoch, unwinding.waiting_on, unwinding.steps, unwinding.timers)
        if woken:
            # What it waits for happened while this turn ran: another turn picks it up.
            logger.info("%s: released, what it waits for has already happened", label)
            self.dispatch_turn(run_id, priority=claimed.priority)
            return TurnOutcome.PARKED
        logger.info("%s: parked, waiting on %s", label, _describe_wait(unwinding.waiting_on))
        for timer in unwinding.timers:
            # A latency hint only: the sweep fires the timer even if this is lost.
            self.dispatch_turn(run_id, eta=timer.fire_at, priority=claimed.priority)
        return TurnOutcome.PARKED

    def _write_held(self, ctx: WorkflowContext, held: list[StepWrite]) -> None:
        claimed = ctx._claimed
        for step in held:
            self.store.commit_step(claimed.run_id, self.engine_id, claimed.epoch, step)
            ctx._step_written(step)

    def _fail(self, ctx: WorkflowContext, exc: BaseException, category: str, label: str) -> TurnOutcome:
        error: dict[str, Any]
        if isinstance(exc, ActivityFailed):
            error = {
                "type": exc.cause_type,
                "message": exc.cause_message,
                "traceback": exc.cause_traceback,
                "activity": exc.activity,
                "seq": exc.seq,
                "attempt": exc.attempt,
            }
        else:
            error = describe_exception(exc)
            if isinstance(exc, ChildWorkflowFailed):
                error["seq"] = exc.seq  # a retry starts that child afresh
            if isinstance(exc, NonDeterminismError):
                error.update(position=exc.position, recorded=exc.recorded, requested=exc.requested)
        claimed = ctx._claimed
        woken = self.store.fail(
            claimed.run_id,
            self.engine_id,
            claimed.epoch,
            codec.dumps(error),
            category,
            parent=claimed.parent_run_id,
        )
        logger.info("%s: failed (%s): %s: %s", label, category, error["type"], error["message"])
        self._after_close(ctx, woken, "failed")
        return TurnOutcome.FAILED

    def _cancel(self, ctx: WorkflowContext, exc: Exception, label: str) -> TurnOutcome:
        """The workflow let a cancellation propagate (the :class:`CancellationRequested` it
        received, a ``WorkflowCancelled`` of its own, or an activity's failure caused by
        one): commit the run ``cancelled``, as an external cancel would leave it."""
        if isinstance(exc, CancellationRequested):
            reason = exc.reason
            message = f"cancelled on request: {reason}" if reason else "cancelled on request"
        elif isinstance(exc, ActivityFailed):
            reason = exc.cause_message
            message = f"cancelled: activity {exc.activity} stopped: {reason}"
        else:
            reason = getattr(exc, "reason", None) or str(exc) or None
            message = f"cancelled by the workflow: {reason}" if reason else "cancelled by the workflow"
        error = {
            "type": ErrorType.CANCELLED,
            "message": message,
            "reason": reason,
            "traceback": describe_exception(exc)["traceback"],
        }
        claimed = ctx._claimed
        woken = self.store.finish_cancelled(
            claimed.run_id,
            self.engine_id,
            claimed.epoch,
            codec.dumps(error),
            workflow_name=claimed.workflow_name,
            parent=claimed.parent_run_id,
        )
        logger.info("%s: %s", label, message)
        finalizer = ctx._workflow.finalizer
        if finalizer is not None:
            # A doorbell only: the finalizer's timer is due now, and the sweep sends it too.
            self.dispatch_activity(
                claimed.run_id, FINALIZER_SEQ, 1, queue=finalizer.queue or "", timeout=finalizer.timeout,
                priority=claimed.priority,
            )  # fmt: skip
        self._after_close(ctx, woken, "cancelled")
        return TurnOutcome.CANCELLED

    def _after_close(self, ctx: WorkflowContext, woken_parent: str | None, status: str) -> None:
        """After a run's terminal commit: ring its waiting parent's doorbell, hand its
        concurrency slot on, and apply the parent-close policy to children it left
        running."""
        # A child took its parent's priority when it started, so the parent's doorbell and
        # its children's ring with this run's.
        own = ctx._claimed.priority
        if woken_parent is not None:
            self.dispatch_turn(woken_parent, priority=own)
        if ctx._workflow.concurrency is not None:
            # Its concurrency slot is free: the queued runs it lets in are runnable now.
            for admitted, priority in self.store.hand_on_slot(ctx._claimed.run_id, ctx._workflow.name):
                self.dispatch_turn(admitted, priority=priority)
        if any(step.kind == StepKind.CHILD for step in ctx._steps.values()):
            run_id = ctx._claimed.run_id
            for child in self.store.close_children(run_id, f"its parent run {run_id} {status}"):
                logger.info(
                    "run %s: parent-close policy applied, its parent run %s %s", child, run_id, status
                )
                # A child sent a cancellation request may have been parked.
                self.dispatch_turn(child, priority=own)


_FINISHED = {
    TurnOutcome.COMPLETED: RunStatus.COMPLETED,
    TurnOutcome.FAILED: RunStatus.FAILED,
    TurnOutcome.CANCELLED: RunStatus.CANCELLED,
    TurnOutcome.CONTINUED: RunStatus.CONTINUED,
}
"""The turns' outcomes that finish their run, and the status they leave it in."""

_CANCELLATION_TYPE = f"{CancellationRequested.__module__}.{CancellationRequested.__qualname__}"


def _is_cancellation(error: Exception) -> bool:
    """A ``WorkflowCancelled`` (a received cancellation request among them), or the failure
    of an activity that stopped because its run asked for cancellation."""
    if isinstance(error, WorkflowCancelled):
        return True
    return isinstance(error, ActivityFailed) and error.cause_type == _CANCELLATION_TYPE


def _describe_wait(waiting_on: dict[str, Any]) -> str:
    kind = waiting_on.get("kind", "?")
    if "fire_at" in waiting_on:
        return f"{kind} until {waiting_on['fire_at']}"
    if kind == "activities":
        return f"{waiting_on.get('mode')} of the activities at {waiting_on.get('seqs')}"
    return str(kind)
