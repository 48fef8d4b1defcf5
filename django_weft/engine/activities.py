"""The workflow's side of activities: :class:`ActivityCalls` is what ``ctx.run`` and
``ctx.start`` do with attempts (replay them, run them inline, retry them, queue them),
and :class:`ActivityHandle` what ``ctx.start`` returns. One attempt itself is
:mod:`.attempt`'s :func:`~.attempt.call_activity`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import clock, codec, faults, observe
from .attempt import (
    MAX_LOST_ATTEMPTS,
    MAX_REDISPATCH_DELAY,
    ActivityInfo,
    Attempt,
    AttemptFlow,
    CancelProbe,
    activity_failed,
    call_activity,
    cancellation_seen,
    lost_attempt,
    lost_attempts,
)
from .errors import ActivityFailed, CancellationRequested
from .flow import Hold, HoldKind
from .holds import AttemptParking
from .records import (
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
    failed_attempt,
)
from .registry import Activity
from .retry import RetryPolicy
from .run_logging import get_logger

if TYPE_CHECKING:
    from .context import WorkflowContext

T = TypeVar("T")

logger = get_logger("django_weft.engine")


class ActivityHandle(Generic[T]):
    """An activity started with :meth:`WorkflowContext.start`; wait for it with
    :meth:`result`, :meth:`WorkflowContext.wait_all` or :meth:`WorkflowContext.wait_any`."""

    def __init__(self, ctx: WorkflowContext, act: Activity[..., T], seq: int, args_json: str) -> None:
        self._ctx = ctx
        self.activity = act
        self.seq = seq
        self._args_json = args_json
        # Inline activities run when started; their outcome is kept here.
        self._outcome: tuple[bool, Any] | None = None

    def result(self) -> T:
        """The activity's result; waits durably (the run parks) until it has finished.
        Raises :class:`ActivityFailed` when the activity failed for good."""
        values: list[T] = self._ctx.wait_all([self])
        return values[0]

    def __repr__(self) -> str:
        return f"<ActivityHandle {self.activity.name} at position {self.seq}>"


class _RolledBack(Exception):
    """Leaves an atomic activity's transaction after a failed attempt, rolling back its writes."""


class ActivityCalls:
    """``ctx.run`` and ``ctx.start`` for one turn: replay recorded attempts, run inline
    ones, retry failures (inline after a short delay, else after a durable timer), and
    record and dispatch queued ones."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx
        # Retry timers of started activities nobody waits for yet; every park writes them.
        self.background_timers: list[TimerWrite] = []
        self._queued: list[ActivityHandle[Any]] = []
        # What holds the queued activities flow control delayed, by position (in words).
        self._held: dict[int, str] = {}
        self._parking = AttemptParking(ctx)

    def held(self, seqs: Collection[int]) -> dict[str, str]:
        """Why the queued activities at ``seqs`` that flow control holds wait, by position
        (``waiting_on["held"]`` of a run parked on them)."""
        return {str(seq): self._held[seq] for seq in sorted(seqs) if seq in self._held}

    def background(self, waited: set[int]) -> list[int]:
        """Queued activities started but not waited for: a failed or lost attempt of one of
        them must still wake the run, so the workflow can retry it in time."""
        return sorted(h.seq for h in self._queued if h._outcome is None and h.seq not in waited)

    def run(self, act: Activity[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ctx = self._ctx
        if act.queue is not None:
            ctx._forbid_in_handler(f"run the queued activity {act.name}")
            return self.start(act, args, kwargs).result()
        seq, recorded = ctx._next(StepKind.ACTIVITY, act.name)
        attempt = 1
        failed: list[dict[str, Any]] = []
        reserved: datetime | None = None
        if recorded is not None:
            if recorded.status == StepStatus.COMPLETED:
                return recorded.result
            if recorded.status == StepStatus.FAILED:
                raise activity_failed(act.name, seq, recorded.error or {}, recorded.attempt)
            # RETRYING: the previous attempt failed and the next one waits for its timer;
            # DELAYED: flow control holds this attempt. Either way the run may have
            # received a cancellation request while it waited (raised here).
            ctx._messages.replay_handlers()
            hold = Hold.of(recorded.result or {}, act.name) if recorded.status == StepStatus.DELAYED else None
            try:
                ctx._messages.deliver_cancellation(None, seq)  # a pending one: received here
            except CancellationRequested:
                if hold is not None and hold.kind == HoldKind.CONCURRENCY:
                    self._parking.release_slot(act, seq, hold.key)  # it gives its place in the queue up
                raise
            failed = list(recorded.failed_attempts)
            if recorded.status == StepStatus.STARTED:
                # An attempt that marked its start and never ended: its worker stopped (or
                # lost the run) while it ran. It is counted, and the next one runs now.
                failed.append(lost_attempt(recorded))
                attempt = recorded.attempt + 1
            elif hold is not None:
                if hold.kind == HoldKind.RATE_LIMIT and hold.until > ctx._db_now():
                    self._parking.park_held(act, seq, hold, [])
                # Its rate limit moment has come (it took it when it was held), or it looks
                # for a concurrency slot again: the same attempt goes on.
                attempt, reserved = recorded.attempt, hold.reserved
            else:
                retry_at = datetime.fromisoformat(recorded.result["retry_at"])
                if retry_at > ctx._db_now():
                    self._parking.park_for_retry(act, seq, retry_at, [])
                attempt = recorded.attempt + 1
        args_json = _encode_arguments(act, args, kwargs)
        return self._execute(act, seq, attempt, args, kwargs, args_json, failed, reserved=reserved)

    def start(
        self, act: Activity[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ActivityHandle[T]:
        ctx = self._ctx
        if act.queue is not None:
            ctx._forbid_in_handler(f"start the queued activity {act.name}")
        args_json = _encode_arguments(act, args, kwargs)
        handle: ActivityHandle[T]
        if act.queue is None:
            handle = ActivityHandle(ctx, act, ctx._seq, args_json)
            try:
                handle._outcome = (True, self.run(act, args, kwargs))
            except ActivityFailed as exc:
                handle._outcome = (False, exc)
            return handle
        seq, recorded = ctx._next(StepKind.ACTIVITY, act.name)
        handle = ActivityHandle(ctx, act, seq, args_json)
        self._queued.append(handle)
        if recorded is None:
            self._schedule(act, seq, 1, args_json, dispatches=1)
        else:
            # Act on a lost or failed attempt now, even if nothing waits for it yet.
            self.poll(handle, self.background_timers)
        return handle

    # -- inline attempts ---------------------------------------------------------------

    def _execute(
        self,
        act: Activity[..., Any],
        seq: int,
        attempt: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        args_json: str,
        failed: list[dict[str, Any]],
        *,
        reserved: datetime | None = None,
    ) -> Any:
        """Run attempts of an inline activity until one succeeds or it fails for good.
        ``failed`` holds the attempts that failed and were retried (from a recorded
        ``retrying`` step): every write of the step carries them and the ones failing
        here, so an earlier attempt's error stays on the step after a later one succeeds.

        Flow control lets each attempt go first (:meth:`.AttemptParking.admitted`): an attempt it holds
        parks the run without using up an attempt. ``reserved``: the rate limit moment
        the first attempt was given when it was held."""
        ctx = self._ctx
        ctx._frontier()
        policy = act.retry or ctx._config.default_retry
        claimed, engine = ctx._claimed, ctx._engine
        flow = AttemptFlow.of(act, args, kwargs, ctx._config.rate_limits)
        lost = lost_attempts(failed)

        def activity_step(status: str, **fields: Any) -> StepWrite:
            return ctx._step(
                seq,
                StepKind.ACTIVITY,
                act.name,
                status,
                args_json=args_json,
                failed_attempts=failed,
                **fields,
            )

        pending = ctx._cancel_request
        probe = CancelProbe(
            lambda: engine.store.cancellation_requested(claimed.run_id, seq),
            cancellation_seen(RunStatus.RUNNING, pending, seq),
        )
        if lost >= MAX_LOST_ATTEMPTS:
            # The last lost attempt is the step's own: it fails with it.
            last = failed.pop()
            started = last["started_at"]
            ctx._commit(
                activity_step(
                    StepStatus.FAILED,
                    error=last["error"],
                    attempt=attempt - 1,
                    started_at=datetime.fromisoformat(started) if started else None,
                )
            )
            raise activity_failed(act.name, seq, last["error"], attempt - 1)
        while True:
            info = ActivityInfo(
                claimed.run_id,
                claimed.workflow_id,
                claimed.workflow_name,
                act.name,
                seq,
                attempt,
                probe,
                worker=engine.engine_id,
            )

            def held(hold: Hold, attempt: int = attempt) -> StepWrite:
                return activity_step(
                    StepStatus.DELAYED,
                    result_json=codec.dumps(hold.as_result()),
                    attempt=attempt,
                    finished=False,
                )

            with observe.activity_attempt(info, queue=None, inline=True, epoch=claimed.epoch) as seen:
                seen.outcome = observe.AttemptOutcome.HELD  # until flow control lets it go
                with self._parking.admitted(act, seq, flow, reserved, held) as refusal:
                    seen.outcome = ""
                    reserved = None
                    started_at = ctx._db_now()
                    info = dataclasses.replace(info, started_at=started_at)
                    if act.marks_attempts and refusal is None:
                        ctx._commit(
                            activity_step(
                                StepStatus.STARTED,
                                result_json=codec.dumps({"worker": engine.engine_id}),
                                attempt=attempt,
                                started_at=started_at,
                                finished=False,
                            )
                        )
                    if refusal is not None:
                        outcome = refusal
                    elif act.atomic:

                        def completed(
                            result_json: str, attempt: int = attempt, started_at: datetime = started_at
                        ) -> StepWrite:
                            return activity_step(
                                StepStatus.COMPLETED,
                                result_json=result_json,
                                attempt=attempt,
                                started_at=started_at,
                            )

                        outcome = self._attempt_atomic(act, info, args, kwargs, policy, completed)
                        if outcome.error is None:
                            seen.outcome = observe.AttemptOutcome.COMPLETED
                            return outcome.value
                    else:
                        outcome = call_activity(act, info, args, kwargs, policy=policy)
                if outcome.error is None:
                    faults.hit("after_activity", run_id=claimed.run_id, seq=seq, engine=engine)
                    ctx._enter()
                    ctx._commit_later(
                        activity_step(
                            StepStatus.COMPLETED,
                            result_json=outcome.result_json,
                            attempt=attempt,
                            started_at=started_at,
                        )
                    )
                    seen.outcome = observe.AttemptOutcome.COMPLETED
                    return outcome.value
                error = seen.error = outcome.error
                if not outcome.retryable or attempt - lost >= policy.max_attempts:
                    ctx._commit(
                        activity_step(StepStatus.FAILED, error=error, attempt=attempt, started_at=started_at)
                    )
                    seen.outcome = observe.AttemptOutcome.FAILED
                    raise activity_failed(act.name, seq, error, attempt)
                seen.outcome = observe.AttemptOutcome.RETRIED
                failed.append(failed_attempt(attempt, error, started_at, ctx._db_now()))
                delay = policy.delay_after(attempt - lost)
                if delay > ctx._config.inline_retry_max_delay:
                    retry_at = ctx._db_now() + timedelta(seconds=delay)
                    retrying = activity_step(
                        StepStatus.RETRYING,
                        result_json=codec.dumps({"retry_at": retry_at.isoformat()}),
                        error=error,
                        attempt=attempt,
                        started_at=started_at,
                        finished=False,
                    )
                    self._parking.park_for_retry(act, seq, retry_at, [retrying])
                if act.marks_attempts:
                    # Its start is recorded: record its failure too before the wait, or a
                    # crash while waiting would leave it looking lost, not failed.
                    retry_at = ctx._db_now() + timedelta(seconds=delay)
                    ctx._commit(
                        activity_step(
                            StepStatus.RETRYING,
                            result_json=codec.dumps({"retry_at": retry_at.isoformat()}),
                            error=error,
                            attempt=attempt,
                            started_at=started_at,
                            finished=False,
                        )
                    )
            clock.sleep(delay)
            ctx._enter()  # the lease may have been lost while waiting
            attempt += 1

    def _attempt_atomic(
        self,
        act: Activity[..., Any],
        info: ActivityInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: RetryPolicy,
        completed: Callable[[str], StepWrite],
    ) -> Attempt:
        """One attempt inside the fenced transaction that records its step, so the
        activity's writes commit exactly once with the step, or not at all."""
        ctx = self._ctx
        attempts: list[Attempt] = []

        def body() -> StepWrite:
            attempt = call_activity(act, info, args, kwargs, policy=policy)
            attempts.append(attempt)
            if attempt.error is not None or attempt.result_json is None:
                raise _RolledBack
            faults.hit("atomic_before_commit", run_id=info.run_id, seq=info.seq, engine=ctx._engine)
            return completed(attempt.result_json)

        try:
            ctx._fence.write(ctx._engine.store.commit_step_atomic, body)
        except _RolledBack:
            pass
        except Exception as exc:  # after the body: a fault injected before the commit, the database
            return Attempt.failed(exc, policy)
        return attempts[-1]

    # -- queued attempts ---------------------------------------------------------------

    def poll(self, handle: ActivityHandle[Any], timers: list[TimerWrite]) -> tuple[bool, Any] | None:
        """Where a started activity stands: ``(True, value)``, ``(False, error)`` or
        ``None`` while pending; acts on it when the workflow must decide (retry a failed
        attempt, resend a lost one), adding the timers that must wake the run to ``timers``."""
        if handle._outcome is not None:
            return handle._outcome
        ctx = self._ctx
        act, seq = handle.activity, handle.seq
        recorded = ctx._steps.get(seq)
        assert recorded is not None, f"queued activity at {seq} has no step"
        status = recorded.status
        if status == StepStatus.COMPLETED:
            handle._outcome = (True, recorded.result)
        elif status == StepStatus.FAILED:
            handle._outcome = (False, activity_failed(act.name, seq, recorded.error or {}, recorded.attempt))
        elif status == StepStatus.RETRYING:
            retry_at = datetime.fromisoformat(recorded.result["retry_at"])
            if retry_at > ctx._db_now():
                timers.append(TimerWrite(seq, TimerKind.RETRY, retry_at))
            else:
                self._schedule(
                    act,
                    seq,
                    recorded.attempt + 1,
                    handle._args_json,
                    dispatches=1,
                    failed=recorded.failed_attempts,
                )
            return None
        elif status == StepStatus.DELAYED:
            # Flow control held the attempt on its worker: it is sent again once the hold
            # is over (its rate limit moment, or a slot handed on to it, or a look again).
            hold = Hold.of(recorded.result or {}, act.name)
            if hold.until > ctx._db_now():
                timers.append(TimerWrite(seq, TimerKind.RETRY, hold.until))
                self._held[seq] = hold.text
            else:
                self._held.pop(seq, None)
                self._schedule(
                    act,
                    seq,
                    recorded.attempt,
                    handle._args_json,
                    dispatches=1,
                    failed=recorded.failed_attempts,
                    reserved=hold.reserved,
                )
            return None
        elif status == StepStatus.LOST and not (recorded.error or {}).get("started"):
            # The message never reached a worker: send the same attempt again.
            dispatches = int((recorded.result or {}).get("dispatches", 1)) + 1
            self._schedule(
                act,
                seq,
                recorded.attempt,
                handle._args_json,
                dispatches=dispatches,
                failed=recorded.failed_attempts,
            )
            return None
        elif status in (StepStatus.ATTEMPT_FAILED, StepStatus.LOST):
            return self._after_failed_attempt(handle, recorded, timers)
        else:  # scheduled or started: a worker has it
            return None
        return handle._outcome

    def _after_failed_attempt(
        self, handle: ActivityHandle[Any], recorded: StepRecord, timers: list[TimerWrite]
    ) -> tuple[bool, Any] | None:
        act, seq = handle.activity, handle.seq
        policy = act.retry or self._ctx._config.default_retry
        error = dict(recorded.error or {})
        retryable = bool(error.pop("retryable", True))
        # An activity that marks its attempts: a started attempt lost with its worker is
        # run again without using up an attempt (up to MAX_LOST_ATTEMPTS of them).
        lost = act.marks_attempts and bool(error.pop("started", None)) and recorded.status == StepStatus.LOST
        error.pop("started", None)
        now = self._ctx._db_now()
        this = failed_attempt(recorded.attempt, error, recorded.started_at, recorded.finished_at or now)
        if act.marks_attempts:
            error.setdefault("worker", str((recorded.result or {}).get("worker", "")))
            this = {**this, "error": error, **({"lost": True} if lost else {})}
        failed = (*recorded.failed_attempts, this)
        counted = recorded.attempt - lost_attempts(failed)
        if lost and lost_attempts(failed) >= MAX_LOST_ATTEMPTS:
            retryable = False
        if retryable and counted < policy.max_attempts:
            retry_at = now + timedelta(seconds=0 if lost else policy.delay_after(counted))
            self._rewrite(
                handle,
                recorded,
                StepStatus.RETRYING,
                {"retry_at": retry_at.isoformat()},
                error,
                failed=failed,
            )
            timers.append(TimerWrite(seq, TimerKind.RETRY, retry_at))
            return None
        self._rewrite(handle, recorded, StepStatus.FAILED, None, error)
        handle._outcome = (False, activity_failed(act.name, seq, error, recorded.attempt))
        return handle._outcome

    def _rewrite(
        self,
        handle: ActivityHandle[Any],
        recorded: StepRecord,
        status: str,
        result: Any,
        error: dict[str, Any],
        *,
        failed: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Record the workflow's decision on a queued attempt (same attempt, new status);
        ``failed``: the step's failed attempts, if not the recorded ones."""
        ctx = self._ctx
        step = ctx._step(
            handle.seq,
            StepKind.ACTIVITY,
            handle.activity.name,
            status,
            args_json=handle._args_json,
            result_json=codec.dumps(result) if result is not None else None,
            error=error,
            attempt=recorded.attempt,
            started_at=recorded.started_at,
            finished=status != StepStatus.RETRYING,
            failed_attempts=recorded.failed_attempts if failed is None else failed,
        )
        ctx._commit(step)
        ctx._remember(step, result, error)

    def _schedule(
        self,
        act: Activity[..., Any],
        seq: int,
        attempt: int,
        args_json: str,
        *,
        dispatches: int,
        failed: Sequence[dict[str, Any]] = (),
        reserved: datetime | None = None,
    ) -> None:
        """Record attempt ``attempt`` as scheduled (with the deadline by which it must have
        started) and send it to the activity's queue. ``reserved``: the rate limit moment
        it was given when its worker held it, which its worker lets it start on."""
        assert act.queue is not None
        ctx = self._ctx
        ctx._frontier()
        result: dict[str, Any] = {"dispatches": dispatches}
        if reserved is not None:
            result["reserved"] = reserved.isoformat()
        step = ctx._step(
            seq,
            StepKind.ACTIVITY,
            act.name,
            StepStatus.SCHEDULED,
            args_json=args_json,
            result_json=codec.dumps(result),
            attempt=attempt,
            finished=False,
            failed_attempts=failed,
        )
        wait = min(ctx._config.redispatch_after * 2 ** (dispatches - 1), MAX_REDISPATCH_DELAY)
        timer = TimerWrite(seq, TimerKind.ACTIVITY, step.started_at + timedelta(seconds=wait))
        ctx._fence.write(ctx._engine.store.schedule_activity, step, timer)
        ctx._remember(step, result, None)
        # Only a latency hint: if this message is lost, the timer sends the attempt again.
        ctx._engine.dispatch_activity(
            ctx._claimed.run_id,
            seq,
            attempt,
            queue=act.queue,
            timeout=act.timeout,
            priority=ctx._claimed.priority,
        )


def _encode_arguments(act: Activity[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return codec.dumps({"args": list(args), "kwargs": kwargs}, what=f"arguments of {act.name}")
