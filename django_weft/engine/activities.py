"""Activity calling: one attempt of an activity, and the workflow's side of activities.

:func:`call_activity` is the one path an attempt takes, inline (in a workflow turn) or
queued (on a worker): it sets :func:`activity_info`, calls the function, encodes its
result and, on failure, decides with :func:`is_retryable` whether another attempt may
follow. :class:`ActivityCalls` is what ``ctx.run`` and ``ctx.start`` do with attempts:
replay them, retry them, queue them.
"""

from __future__ import annotations

import contextvars
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from . import activity_overrides, clock, codec, faults
from .errors import ActivityFailed, CancellationRequested, PayloadError
from .records import (
    TERMINAL_STATUSES,
    CancelRequest,
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

if TYPE_CHECKING:
    from .context import WorkflowContext

T = TypeVar("T")

MAX_REDISPATCH_DELAY = 600.0
"""The longest a queued attempt waits in its queue before it is sent again (seconds)."""


def cancellation_seen(status: str | None, request: CancelRequest | None, seq: int) -> str | None:
    """Why the activity at position ``seq`` of a run in ``status`` should stop, or ``None``:
    its run has a pending cancellation request, or received one at a later position (so
    after the activity started: a compensation step the workflow runs after receiving a
    request is not told to stop), or has finished (nothing will record the result)."""
    if status is None:
        return "the run no longer exists"
    if status in TERMINAL_STATUSES:
        return f"the run has finished ({status})"
    if request is None or not (request.pending or (request.seq is not None and request.seq > seq)):
        return None
    return f"cancellation requested: {request.reason}" if request.reason else "cancellation requested"


class CancelProbe:
    """How a running activity attempt learns that its run asked for cancellation: ``check``
    reads it now (returning why, or ``None``); the worker's lease heartbeat may also set
    ``why`` meanwhile. Once set it stays set."""

    def __init__(self, check: Callable[[], str | None] | None = None, why: str | None = None) -> None:
        self.check = check
        self.why = why

    def refresh(self) -> str | None:
        if self.why is None and self.check is not None:
            self.why = self.check()
        return self.why


@dataclass(frozen=True)
class ActivityInfo:
    """What an activity can learn about the call it is serving (see :func:`activity_info`)."""

    run_id: str
    workflow_id: str
    workflow_name: str
    activity_name: str
    seq: int
    attempt: int
    _probe: CancelProbe = field(default_factory=CancelProbe, compare=False, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts and re-executions: ``"<run_id>:<seq>"``."""
        return f"{self.run_id}:{self.seq}"

    @property
    def cancel_requested(self) -> bool:
        """Whether this activity's run asked for cancellation while it runs (a pending
        cancellation request, one the workflow received after this activity started) or
        has finished (cancelled, timed out...: nothing will record this attempt's result),
        as last seen by :meth:`heartbeat` or, for a queued activity, by its worker's lease
        heartbeat (every ``WEFT_LEASE_RENEW_INTERVAL``). Cheap: it reads no database."""
        return self._probe.why is not None

    def heartbeat(self) -> None:
        """Check now (one database read) whether this activity should stop, and raise
        :class:`CancellationRequested` if so (see :attr:`cancel_requested`); return
        otherwise. Call it between chunks of a long activity. Let the exception propagate
        to stop: the attempt fails and is not retried."""
        why = self._probe.refresh()
        if why is not None:
            raise CancellationRequested(
                f"activity {self.activity_name} (run {self.run_id}, position {self.seq}) should stop: {why}",
                reason=why,
                requested_at=None,
            )


_current_activity: contextvars.ContextVar[ActivityInfo | None] = contextvars.ContextVar(
    "weft_current_activity", default=None
)


def activity_info() -> ActivityInfo:
    """Inside an activity: the :class:`ActivityInfo` of the running attempt."""
    info = _current_activity.get()
    if info is None:
        raise RuntimeError("activity_info() is only available while an activity runs")
    return info


def describe_exception(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    module = cls.__module__
    return {
        "type": cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def is_retryable(policy: RetryPolicy, exc: BaseException) -> bool:
    """Whether another attempt may follow a failed one (attempts left permitting): not for
    the policy's ``non_retryable`` types, nor for a result that is not JSON (retrying
    would produce the same result), nor for an activity that stopped because its run
    asked for cancellation (``CancellationRequested`` from ``heartbeat()``)."""
    return policy.is_retryable(exc) and not isinstance(exc, PayloadError | CancellationRequested)


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: its value (as the history will return it) and its encoding,
    or its error (:func:`describe_exception`) and whether it may be retried."""

    value: Any = None
    result_json: str | None = None
    error: dict[str, Any] | None = None
    retryable: bool = False

    @classmethod
    def failed(cls, exc: BaseException, policy: RetryPolicy) -> Attempt:
        return cls(error=describe_exception(exc), retryable=is_retryable(policy, exc))


def call_activity(
    act: Activity[..., Any],
    info: ActivityInfo,
    args: Any,
    kwargs: dict[str, Any],
    *,
    policy: RetryPolicy,
    within: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Attempt:
    """Run one attempt of ``act`` with :func:`activity_info` returning ``info``.

    An exception of the activity (or a result that is not JSON) does not propagate: it is
    the returned attempt's error. ``within`` wraps the call and the encoding of its result
    (a savepoint for an atomic activity's writes): a failure leaves it by the exception,
    so what it wrote rolls back while the failure is still reported."""
    token = _current_activity.set(info)
    try:
        with within() if within is not None else nullcontext():
            body = activity_overrides.body_of(act)
            value, result_json = codec.roundtrip(
                body(*args, **kwargs), what=f"the result of activity {act.name}"
            )
        return Attempt(value=value, result_json=result_json)
    except Exception as exc:
        return Attempt.failed(exc, policy)
    finally:
        _current_activity.reset(token)


def activity_failed(name: str, seq: int, error: dict[str, Any], attempt: int) -> ActivityFailed:
    return ActivityFailed(
        f"activity {name} failed after {attempt} attempt(s): "
        f"{error.get('type', 'Exception')}: {error.get('message', '')}",
        activity=name,
        seq=seq,
        attempt=attempt,
        cause_type=error.get("type"),
        cause_message=error.get("message"),
        cause_traceback=error.get("traceback"),
    )


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
        if recorded is not None:
            if recorded.status == StepStatus.COMPLETED:
                return recorded.result
            if recorded.status == StepStatus.FAILED:
                raise activity_failed(act.name, seq, recorded.error or {}, recorded.attempt)
            # RETRYING: the previous attempt failed and the next one waits for its timer,
            # unless the run received a cancellation request while it waited (raised here).
            ctx._messages.replay_handlers()
            ctx._messages.deliver_cancellation(None, seq)  # a pending one: received here
            retry_at = datetime.fromisoformat(recorded.result["retry_at"])
            if retry_at > ctx._db_now():
                self._park_for_retry(act, seq, retry_at, [])
            attempt = recorded.attempt + 1
            failed = list(recorded.failed_attempts)
        args_json = _encode_arguments(act, args, kwargs)
        return self._execute(act, seq, attempt, args, kwargs, args_json, failed)

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
    ) -> Any:
        """Run attempts of an inline activity until one succeeds or it fails for good.
        ``failed`` holds the attempts that failed and were retried (from a recorded
        ``retrying`` step): every write of the step carries them and the ones failing
        here, so an earlier attempt's error stays on the step after a later one succeeds."""
        ctx = self._ctx
        ctx._frontier()
        policy = act.retry or ctx._config.default_retry
        claimed, engine = ctx._claimed, ctx._engine

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
        while True:
            info = ActivityInfo(
                claimed.run_id, claimed.workflow_id, claimed.workflow_name, act.name, seq, attempt, probe
            )
            started_at = ctx._db_now()
            if act.atomic:

                def completed(
                    result_json: str, attempt: int = attempt, started_at: datetime = started_at
                ) -> StepWrite:
                    return activity_step(
                        StepStatus.COMPLETED, result_json=result_json, attempt=attempt, started_at=started_at
                    )

                outcome = self._attempt_atomic(act, info, args, kwargs, policy, completed)
                if outcome.error is None:
                    return outcome.value
            else:
                outcome = call_activity(act, info, args, kwargs, policy=policy)
            if outcome.error is None:
                faults.hit("after_activity", run_id=claimed.run_id, seq=seq, engine=engine)
                ctx._enter()
                ctx._commit(
                    activity_step(
                        StepStatus.COMPLETED,
                        result_json=outcome.result_json,
                        attempt=attempt,
                        started_at=started_at,
                    )
                )
                return outcome.value
            error = outcome.error
            if not outcome.retryable or attempt >= policy.max_attempts:
                ctx._commit(
                    activity_step(StepStatus.FAILED, error=error, attempt=attempt, started_at=started_at)
                )
                raise activity_failed(act.name, seq, error, attempt)
            failed.append(failed_attempt(attempt, error, started_at, ctx._db_now()))
            delay = policy.delay_after(attempt)
            if delay <= ctx._config.inline_retry_max_delay:
                clock.sleep(delay)
                ctx._enter()  # the lease may have been lost while waiting
                attempt += 1
                continue
            retry_at = ctx._db_now() + timedelta(seconds=delay)
            retrying = activity_step(
                StepStatus.RETRYING,
                result_json=codec.dumps({"retry_at": retry_at.isoformat()}),
                error=error,
                attempt=attempt,
                started_at=started_at,
                finished=False,
            )
            self._park_for_retry(act, seq, retry_at, [retrying])

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

    def _park_for_retry(
        self, act: Activity[..., Any], seq: int, retry_at: datetime, steps: list[StepWrite]
    ) -> NoReturn:
        ctx = self._ctx

        def record_retrying() -> None:
            for step in steps:
                ctx._commit(step)

        # Waiting for a durable retry is a blocking point: a pending cancellation request
        # is received here (after the retrying step), and its timer removed.
        ctx._messages.deliver_cancellation(record_retrying, seq)
        self._ctx._park(
            {"kind": "retry", "seq": seq, "activity": act.name, "fire_at": retry_at.isoformat()},
            steps,
            [TimerWrite(seq, TimerKind.RETRY, retry_at)],
            wakes_on_messages=False,
        )

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
        error.pop("started", None)
        if retryable and recorded.attempt < policy.max_attempts:
            now = self._ctx._db_now()
            retry_at = now + timedelta(seconds=policy.delay_after(recorded.attempt))
            this = failed_attempt(recorded.attempt, error, recorded.started_at, recorded.finished_at or now)
            self._rewrite(
                handle,
                recorded,
                StepStatus.RETRYING,
                {"retry_at": retry_at.isoformat()},
                error,
                failed=(*recorded.failed_attempts, this),
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
    ) -> None:
        """Record attempt ``attempt`` as scheduled (with the deadline by which it must have
        started) and send it to the activity's queue."""
        assert act.queue is not None
        ctx = self._ctx
        ctx._frontier()
        result = {"dispatches": dispatches}
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
        ctx._engine.dispatch_activity(ctx._claimed.run_id, seq, attempt, queue=act.queue, timeout=act.timeout)


def _encode_arguments(act: Activity[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return codec.dumps({"args": list(args), "kwargs": kwargs}, what=f"arguments of {act.name}")
