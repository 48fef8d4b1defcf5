"""The workflow context: the replay executor's face towards workflow code.

Every durable operation takes the next sequence number of the run. If a step is
recorded at that number, the operation must match it (kind and name) and returns the
recorded outcome; otherwise the operation executes now and its outcome is recorded
with a fenced write before the workflow continues.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import random as _random
import time
import traceback
import uuid
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import codec, faults
from .durations import Duration, parse_duration
from .errors import (
    ActivityFailed,
    ChildWorkflowFailed,
    ConfigurationError,
    Deposed,
    NonDeterminismError,
    PayloadError,
    SignalTimeout,
)
from .records import (
    PARENT_CLOSE_POLICIES,
    ChildStart,
    ClaimedRun,
    MessageKind,
    PendingMessage,
    StepKind,
    StepRecord,
    StepStatus,
    StepWrite,
    TimerKind,
    TimerWrite,
)
from .registry import Activity, Workflow, as_activity

if TYPE_CHECKING:
    from .executor import Engine, EngineConfig

T = TypeVar("T")

MAX_REDISPATCH_DELAY = 600.0
"""The longest a queued attempt waits in its queue before it is sent again (seconds)."""


class _Unwind(BaseException):
    """Unwinds the workflow function. Derives from BaseException so ``except Exception``
    in workflow code cannot swallow it."""


class Park(_Unwind):
    """The run cannot continue now: record what it waits for and release it."""

    def __init__(self, waiting_on: dict[str, Any], steps: list[StepWrite], timers: list[TimerWrite]) -> None:
        super().__init__(waiting_on.get("kind", "wait"))
        self.waiting_on = waiting_on
        self.steps = steps
        self.timers = timers


class DeposedUnwind(_Unwind):
    """This engine lost the run mid-turn: stop executing workflow code at once.

    A BaseException, so ``except Exception`` in workflow code (a saga's compensation
    branch, say) cannot keep a deposed engine running activities."""

    def __init__(self, cause: Deposed) -> None:
        super().__init__(str(cause))
        self.cause = cause


class QueryFrontier(_Unwind):
    """A read-only replay (a query, an update's validation) reached the end of the
    recorded history: the workflow's state is what the query sees."""


class ContinueAsNew(_Unwind):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("continue_as_new")
        self.args_json = codec.dumps(list(args), what="continue_as_new arguments")
        self.kwargs_json = codec.dumps(kwargs, what="continue_as_new keyword arguments")


@dataclass(frozen=True)
class WorkflowInfo:
    run_id: str
    workflow_id: str
    workflow_name: str
    attempt: int
    started_at: datetime


@dataclass(frozen=True)
class ActivityInfo:
    """What an activity can learn about the call it is serving (see :func:`activity_info`)."""

    run_id: str
    workflow_id: str
    workflow_name: str
    activity_name: str
    seq: int
    attempt: int

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts and re-executions: ``"<run_id>:<seq>"``."""
        return f"{self.run_id}:{self.seq}"


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


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _from_iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


class _ReplayAwareLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that says nothing while the workflow replays recorded history."""

    def __init__(self, logger: logging.Logger, ctx: WorkflowContext) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:
        return not self._ctx.is_replaying and self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        info = self._ctx.info
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("weft_run_id", info.run_id)
        extra.setdefault("weft_workflow_id", info.workflow_id)
        kwargs["extra"] = extra
        return f"[{info.workflow_name} {info.workflow_id}] {msg}", kwargs


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


class ChildHandle(Generic[T]):
    """A child workflow started with :meth:`WorkflowContext.start_child`; wait for it with
    :meth:`result`, :meth:`WorkflowContext.wait_all` or :meth:`WorkflowContext.wait_any`."""

    def __init__(
        self, ctx: WorkflowContext, workflow_name: str, seq: int, run_id: str, workflow_id: str
    ) -> None:
        self._ctx = ctx
        self.workflow_name = workflow_name
        self.seq = seq
        self.run_id = run_id
        self.workflow_id = workflow_id
        self._outcome: tuple[bool, Any] | None = None

    def result(self) -> T:
        """The child's result; waits durably (the parent parks) until the child has
        finished. Raises :class:`ChildWorkflowFailed` if it did not complete."""
        values: list[T] = self._ctx.wait_all([self])
        return values[0]

    def __repr__(self) -> str:
        return f"<ChildHandle {self.workflow_name} {self.workflow_id} at position {self.seq}>"


Handle = ActivityHandle[Any] | ChildHandle[Any]


def _child_workflow_id(parent_workflow_id: str, seq: int) -> str:
    """``"<parent workflow id>:<position>"``, shortened (with a digest of the whole parent
    id, so it stays unique) when that would pass the 255-character limit."""
    candidate = f"{parent_workflow_id}:{seq}"
    if len(candidate) <= 255:
        return candidate
    digest = hashlib.sha256(parent_workflow_id.encode()).hexdigest()[:16]
    return f"{parent_workflow_id[:200]}~{digest}:{seq}"


_PENDING = object()

MAX_MESSAGE_NAME_LENGTH = 200
"""The longest signal, update or query name (the ``name`` columns hold 200 characters)."""


def check_message_name(name: Any, what: str) -> str:
    """A signal, update or query name: a non-empty string of at most 200 characters."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"{what} name must be a non-empty string; got {name!r}")
    if len(name) > MAX_MESSAGE_NAME_LENGTH:
        raise ConfigurationError(
            f"{what} name is {len(name)} characters long; the limit is {MAX_MESSAGE_NAME_LENGTH}"
        )
    return name


@dataclass(frozen=True)
class UpdateHandler:
    """An update handler registered with :meth:`WorkflowContext.on_update`."""

    handler: Callable[[Any], Any]
    validator: Any = None


class _BlockingStart:
    """The start record of a blocking operation not yet written: written before the
    first handler application recorded after it, or else with the park."""

    def __init__(self, ctx: WorkflowContext, step: StepWrite | None) -> None:
        self._ctx = ctx
        self._step = step

    def record(self) -> None:
        if self._step is not None:
            self._ctx._commit(self._step)
            self._step = None

    def unrecorded(self) -> list[StepWrite]:
        return [self._step] if self._step is not None else []


class WorkflowContext:
    """Passed as the first argument of every workflow function."""

    def __init__(
        self,
        engine: Engine,
        claimed: ClaimedRun,
        config: EngineConfig,
        workflow: Workflow[..., Any],
        *,
        read_only: bool = False,
    ) -> None:
        self._engine = engine
        # Read-only replay (queries, update validation): recorded outcomes are returned,
        # and the first operation that would execute or write anything ends the replay.
        self._read_only = read_only
        self._claimed = claimed
        self._config = config
        self._workflow = workflow
        self._steps = dict(claimed.steps)
        self._history_length = (max(claimed.steps) + 1) if claimed.steps else 0
        self._seq = 0
        self._clock_origin = time.monotonic()
        self._patches: dict[str, bool] = {}
        self._unwinding: _Unwind | None = None
        # Retry timers of started activities nobody waits for yet; every park writes them.
        self._background_timers: list[TimerWrite] = []
        self._queued_handles: list[ActivityHandle[Any]] = []
        self._fatal: NonDeterminismError | None = None
        # Message handlers, registered by the workflow as it runs (not recorded: every
        # replay registers them again at the same points).
        self._signal_handlers: dict[str, Callable[[Any], Any]] = {}
        self._update_handlers: dict[str, UpdateHandler] = {}
        self._query_handlers: dict[str, Callable[..., Any]] = {}
        # Signals and updates waiting for this run, loaded once per turn when first needed.
        self._pending: list[PendingMessage] | None = None
        self._pending_fresh = False
        # Set while a signal or update handler runs: it may not block.
        self._in_handler: str | None = None
        self.info = WorkflowInfo(
            run_id=claimed.run_id,
            workflow_id=claimed.workflow_id,
            workflow_name=claimed.workflow_name,
            attempt=claimed.attempt,
            started_at=claimed.created_at,
        )
        self.logger: logging.LoggerAdapter[logging.Logger] = _ReplayAwareLogger(
            logging.getLogger(f"django_weft.workflow.{workflow.name}"), self
        )

    # -- state -------------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """True while the function re-executes operations that are already recorded
        (and always in a read-only replay)."""
        return self._read_only or self._seq < self._history_length

    def _db_now(self) -> datetime:
        # The database's clock at claim time plus the time elapsed since, so timer
        # fire times and due checks agree with the sweep, which uses the database clock.
        return self._claimed.db_now + timedelta(seconds=time.monotonic() - self._clock_origin)

    def _enter(self) -> None:
        if self._unwinding is not None:
            raise self._unwinding
        if self._fatal is not None:
            raise self._fatal
        if not self._read_only and self._engine.is_lost(self._claimed.run_id):
            self._depose(
                Deposed(
                    f"run {self._claimed.run_id} was taken over by another engine; stopped driving it",
                    run_id=self._claimed.run_id,
                )
            )

    def _depose(self, cause: Deposed) -> Any:
        """Stop driving the run for good: every later operation re-raises the unwinding."""
        self._unwinding = DeposedUnwind(cause)
        raise self._unwinding

    def _frontier(self) -> None:
        """In a read-only replay, end it here: the operation would execute or write."""
        if self._read_only:
            self._unwinding = QueryFrontier("end of the recorded history")
            raise self._unwinding

    def _forbid_in_handler(self, what: str) -> None:
        if self._in_handler is not None:
            raise ConfigurationError(
                f"the {self._in_handler} may not {what}: handlers run while the workflow is "
                "blocked, so they may run inline activities (ctx.run) and record values, but "
                "not sleep, wait or start queued work; move the wait into the workflow body"
            )

    def _next(self, kind: str, name: str) -> tuple[int, StepRecord | None]:
        self._enter()
        seq = self._seq
        self._seq += 1
        recorded = self._steps.get(seq)
        if recorded is not None and (recorded.kind != kind or recorded.name != name):
            self._fatal = NonDeterminismError(
                f"run {self._claimed.run_id} ({self._claimed.workflow_name}) is not deterministic: "
                f"at position {seq} the history records {recorded.kind} {recorded.name!r}, "
                f"but the code now asks for {kind} {name!r}. Restore the previous order for "
                "running workflows, or guard the change with ctx.patched(...); then retry the run",
                run_id=self._claimed.run_id,
                position=seq,
                recorded={"kind": recorded.kind, "name": recorded.name},
                requested={"kind": kind, "name": name},
            )
            raise self._fatal
        return seq, recorded

    def unconsumed_history(self) -> NonDeterminismError | None:
        """The error to fail with if the function finished before replaying all of its
        recorded history (a deploy removed operations that this run already recorded)."""
        if self._seq >= self._history_length:
            return None
        recorded = self._steps.get(self._seq)
        what = f"{recorded.kind} {recorded.name!r}" if recorded else "an operation"
        return NonDeterminismError(
            f"run {self._claimed.run_id} ({self._claimed.workflow_name}) is not deterministic: the "
            f"workflow finished at position {self._seq}, but the history records {what} there "
            f"({self._history_length} operations in all). Restore the removed code for running "
            "workflows or guard the change with ctx.patched(...); then retry the run",
            run_id=self._claimed.run_id,
            position=self._seq,
            recorded={"kind": recorded.kind, "name": recorded.name} if recorded else {},
            requested={"kind": "finish", "name": ""},
        )

    def _park(
        self,
        waiting_on: dict[str, Any],
        steps: list[StepWrite],
        timers: list[TimerWrite],
        *,
        wakes_on_messages: bool = True,
    ) -> Any:
        self._frontier()
        if wakes_on_messages:
            # The signals and updates that must wake the parked run: the one it waits for
            # and those it has handlers for (the handlers run while it is blocked here).
            signals = set(self._signal_handlers)
            if waiting_on.get("kind") == "signal":
                signals.add(waiting_on["name"])
            if signals:
                waiting_on = {**waiting_on, "signals": sorted(signals)}
            if self._update_handlers:
                waiting_on = {**waiting_on, "updates": sorted(self._update_handlers)}
        # Queued activities started but not waited for here: a failed or lost attempt of
        # one of them must still wake the run, so the workflow can retry it in time.
        waited = set(waiting_on.get("seqs") or []) if waiting_on.get("kind") == "activities" else set()
        background = sorted(
            handle.seq
            for handle in self._queued_handles
            if handle._outcome is None and handle.seq not in waited
        )
        if background:
            waiting_on = {**waiting_on, "background": background}
        keys = {(timer.seq, timer.kind) for timer in timers}
        timers = timers + [t for t in self._background_timers if (t.seq, t.kind) not in keys]
        self._unwinding = Park(waiting_on, steps, timers)
        raise self._unwinding

    def _commit(self, step: StepWrite) -> None:
        self._frontier()
        faults.hit("before_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)
        try:
            self._engine.store.commit_step(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step
            )
        except Deposed as exc:
            self._depose(exc)
        faults.hit("after_step_commit", run_id=self._claimed.run_id, seq=step.seq, engine=self._engine)

    def _step(
        self,
        seq: int,
        kind: str,
        name: str,
        status: str,
        *,
        args_json: str | None = None,
        result_json: str | None = None,
        error: dict[str, Any] | None = None,
        attempt: int = 1,
        started_at: datetime | None = None,
        finished: bool = True,
    ) -> StepWrite:
        now = self._db_now()
        return StepWrite(
            seq=seq,
            kind=kind,
            name=name,
            status=status,
            args_json=args_json,
            result_json=result_json,
            error_json=codec.dumps(error) if error is not None else None,
            attempt=attempt,
            started_at=started_at or now,
            finished_at=now if finished else None,
        )

    # -- activities --------------------------------------------------------------------

    def run(self, target: Activity[..., T] | Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run an activity (or a plain callable) once; its result is recorded and replayed.

        Retries follow the activity's policy. Raises :class:`ActivityFailed` when it fails
        for good; the workflow may catch that.
        """
        act = as_activity(target)
        if act.queue is not None:
            self._forbid_in_handler(f"run the queued activity {act.name}")
            return self.start(act, *args, **kwargs).result()
        seq, recorded = self._next(StepKind.ACTIVITY, act.name)
        attempt = 1
        if recorded is not None:
            if recorded.status == StepStatus.COMPLETED:
                return recorded.result
            if recorded.status == StepStatus.FAILED:
                raise self._activity_failed(act.name, seq, recorded.error or {}, recorded.attempt)
            # RETRYING: the previous attempt failed and the next one waits for its timer.
            retry_at = _from_iso(recorded.result["retry_at"])
            if retry_at > self._db_now():
                return self._park(
                    {"kind": "retry", "seq": seq, "activity": act.name, "fire_at": _iso(retry_at)},
                    [],
                    [TimerWrite(seq, TimerKind.RETRY, retry_at)],
                    wakes_on_messages=False,
                )
            attempt = recorded.attempt + 1
        args_json = codec.dumps({"args": list(args), "kwargs": kwargs}, what=f"arguments of {act.name}")
        return self._execute(act, seq, attempt, args, kwargs, args_json)

    def _execute(
        self,
        act: Activity[..., Any],
        seq: int,
        attempt: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        args_json: str,
    ) -> Any:
        self._frontier()
        policy = act.retry or self._config.default_retry
        run_id, engine = self._claimed.run_id, self._engine

        def activity_step(status: str, **fields: Any) -> StepWrite:
            return self._step(seq, StepKind.ACTIVITY, act.name, status, args_json=args_json, **fields)

        while True:
            info = ActivityInfo(
                run_id, self._claimed.workflow_id, self._claimed.workflow_name, act.name, seq, attempt
            )
            started_at = self._db_now()
            token = _current_activity.set(info)
            try:
                if act.atomic:
                    holder: list[Any] = []

                    def body(
                        attempt: int = attempt, started_at: datetime = started_at, holder: list[Any] = holder
                    ) -> StepWrite:
                        value, result_json = self._encode_result(act, act.fn(*args, **kwargs))
                        holder.append(value)
                        faults.hit("atomic_before_commit", run_id=run_id, seq=seq, engine=engine)
                        return activity_step(
                            StepStatus.COMPLETED,
                            result_json=result_json,
                            attempt=attempt,
                            started_at=started_at,
                        )

                    try:
                        engine.store.commit_step_atomic(run_id, engine.engine_id, self._claimed.epoch, body)
                    except Deposed as exc:
                        self._depose(exc)
                    return holder[0]
                value, result_json = self._encode_result(act, act.fn(*args, **kwargs))
            except _Unwind:
                raise
            except Exception as exc:
                error = describe_exception(exc)
                retryable = policy.is_retryable(exc) and not isinstance(exc, PayloadError)
                if not retryable or attempt >= policy.max_attempts:
                    self._commit(
                        activity_step(
                            StepStatus.FAILED,
                            error=error,
                            attempt=attempt,
                            started_at=started_at,
                        )
                    )
                    raise self._activity_failed(act.name, seq, error, attempt) from None
                delay = policy.delay_after(attempt)
                if delay <= self._config.inline_retry_max_delay:
                    time.sleep(delay)
                    self._enter()  # the lease may have been lost while waiting
                    attempt += 1
                    continue
                retry_at = self._db_now() + timedelta(seconds=delay)
                self._park(
                    {"kind": "retry", "seq": seq, "activity": act.name, "fire_at": _iso(retry_at)},
                    [
                        activity_step(
                            StepStatus.RETRYING,
                            result_json=codec.dumps({"retry_at": _iso(retry_at)}),
                            error=error,
                            attempt=attempt,
                            started_at=started_at,
                            finished=False,
                        )
                    ],
                    [TimerWrite(seq, TimerKind.RETRY, retry_at)],
                    wakes_on_messages=False,
                )
            finally:
                _current_activity.reset(token)
            faults.hit("after_activity", run_id=run_id, seq=seq, engine=engine)
            self._enter()
            self._commit(
                activity_step(
                    StepStatus.COMPLETED,
                    result_json=result_json,
                    attempt=attempt,
                    started_at=started_at,
                )
            )
            return value

    @staticmethod
    def _encode_result(act: Activity[..., Any], value: Any) -> tuple[Any, str]:
        return codec.roundtrip(value, what=f"the result of activity {act.name}")

    def _activity_failed(self, name: str, seq: int, error: dict[str, Any], attempt: int) -> ActivityFailed:
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

    @staticmethod
    def activity_info() -> ActivityInfo:
        """Inside an activity: the running attempt's :class:`ActivityInfo`."""
        return activity_info()

    # -- queued activities and fan-out -------------------------------------------------

    def start(
        self, target: Activity[..., T] | Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> ActivityHandle[T]:
        """Start an activity and return a handle without waiting for it.

        A queued activity (``@activity(queue=...)``) is sent to its queue at once, so
        several started activities run in parallel on the workers. An inline activity
        runs here and now, before ``start`` returns. Wait with ``handle.result()``,
        :meth:`wait_all` or :meth:`wait_any`.
        """
        act = as_activity(target)
        if act.queue is not None:
            self._forbid_in_handler(f"start the queued activity {act.name}")
        args_json = codec.dumps({"args": list(args), "kwargs": kwargs}, what=f"arguments of {act.name}")
        handle: ActivityHandle[T]
        if act.queue is None:
            handle = ActivityHandle(self, act, self._seq, args_json)
            try:
                handle._outcome = (True, self.run(act, *args, **kwargs))
            except ActivityFailed as exc:
                handle._outcome = (False, exc)
            return handle
        seq, recorded = self._next(StepKind.ACTIVITY, act.name)
        handle = ActivityHandle(self, act, seq, args_json)
        self._queued_handles.append(handle)
        if recorded is None:
            self._schedule(act, seq, 1, args_json, dispatches=1)
        else:
            # Act on a lost or failed attempt now, even if nothing waits for it yet.
            self._poll(handle, self._background_timers)
        return handle

    def wait_all(self, handles: Sequence[Handle]) -> list[Any]:
        """Wait until every handle has finished; return their results in order.

        If any failed, raises the :class:`ActivityFailed` of the first failed handle in
        the list (after all have finished, so replay always sees the same outcome)."""
        self._forbid_in_handler("wait for activities")
        self._enter()
        handles = self._own_handles(handles, "wait_all")
        seqs = [handle.seq for handle in handles]
        # wait_all takes a position only when handlers run while it blocks: a marker
        # naming the handles it waited for, so that a replay re-applies those handlers
        # at this wait and at no other wait_all that reaches the same position.
        recorded = self._steps.get(self._seq)
        marked = (
            recorded is not None
            and recorded.kind == StepKind.WAIT
            and recorded.name == "wait_all"
            and (recorded.result or {}).get("seqs") == seqs
        )
        if marked:
            self._seq += 1
            self._replay_handlers()
        states, pending, timers = self._poll_all(handles)
        if pending:
            marker = None
            if not marked:
                marker = self._step(
                    self._handler_position(),
                    StepKind.WAIT,
                    "wait_all",
                    StepStatus.COMPLETED,
                    result_json=codec.dumps({"seqs": seqs}),
                )
            self._deliver(before=_BlockingStart(self, marker).record)
            self._park({"kind": "activities", "mode": "all", "seqs": pending}, [], timers)
        for ok, value in states:
            if not ok:
                raise value
        return [value for _, value in states]

    def wait_any(self, handles: Sequence[Handle]) -> Handle:
        """Wait until at least one handle has finished and return the first finished one
        (in list order). Which one it was is recorded, so replay returns the same."""
        self._forbid_in_handler("wait for activities")
        handles = self._own_handles(handles, "wait_any")
        if not handles:
            raise ConfigurationError("ctx.wait_any needs at least one handle")
        seq, recorded = self._next(StepKind.WAIT, "wait_any")
        self._replay_handlers()
        if recorded is not None and recorded.status == StepStatus.COMPLETED:
            index = recorded.result["index"]
            if index >= len(handles) or handles[index].seq != recorded.result["seq"]:
                self._fatal = NonDeterminismError(
                    f"run {self._claimed.run_id} ({self._claimed.workflow_name}) is not deterministic: "
                    f"ctx.wait_any at position {seq} returned the activity at position "
                    f"{recorded.result['seq']} before, which is not handle {index} of the handles "
                    "it is given now",
                    run_id=self._claimed.run_id,
                    position=seq,
                    recorded=recorded.result,
                    requested={"seqs": [h.seq for h in handles]},
                )
                raise self._fatal
            return handles[index]
        states, pending, timers = self._poll_all(handles)
        for index, (handle, state) in enumerate(zip(handles, states, strict=True)):
            if state is not _PENDING:
                self._commit(
                    self._step(
                        seq,
                        StepKind.WAIT,
                        "wait_any",
                        StepStatus.COMPLETED,
                        result_json=codec.dumps({"index": index, "seq": handle.seq}),
                    )
                )
                return handle
        start = _BlockingStart(
            self,
            None
            if recorded is not None
            else self._step(seq, StepKind.WAIT, "wait_any", StepStatus.WAITING, finished=False),
        )
        self._deliver(before=start.record)
        return self._park({"kind": "activities", "mode": "any", "seqs": pending}, start.unrecorded(), timers)

    def _own_handles(self, handles: Sequence[Handle], what: str) -> list[Handle]:
        handles = list(handles)
        for handle in handles:
            if not isinstance(handle, ActivityHandle | ChildHandle) or handle._ctx is not self:
                raise ConfigurationError(
                    f"ctx.{what} takes handles returned by ctx.start or ctx.start_child in this "
                    f"workflow run; got {handle!r}"
                )
        return handles

    def _poll_all(self, handles: list[Handle]) -> tuple[list[Any], list[int], list[TimerWrite]]:
        """Each handle's state: ``(True, value)``, ``(False, error)`` or ``_PENDING``; plus
        the positions still pending and the timers that must wake the run for them."""
        states: list[Any] = []
        pending: list[int] = []
        timers: list[TimerWrite] = []
        for handle in handles:
            state = self._poll(handle, timers)
            states.append(state)
            if state is _PENDING:
                pending.append(handle.seq)
        return states, pending, timers

    def _poll(self, handle: Handle, timers: list[TimerWrite]) -> Any:
        """Where a started activity stands, acting on it when the workflow must decide
        (retry a failed attempt, resend a lost one); or a child workflow."""
        if handle._outcome is not None:
            return handle._outcome
        if isinstance(handle, ChildHandle):
            return self._poll_child(handle)
        act, seq = handle.activity, handle.seq
        recorded = self._steps.get(seq)
        assert recorded is not None, f"queued activity at {seq} has no step"
        status = recorded.status
        if status == StepStatus.COMPLETED:
            handle._outcome = (True, recorded.result)
        elif status == StepStatus.FAILED:
            handle._outcome = (
                False,
                self._activity_failed(act.name, seq, recorded.error or {}, recorded.attempt),
            )
        elif status == StepStatus.RETRYING:
            retry_at = _from_iso(recorded.result["retry_at"])
            if retry_at > self._db_now():
                timers.append(TimerWrite(seq, TimerKind.RETRY, retry_at))
            else:
                self._schedule(act, seq, recorded.attempt + 1, handle._args_json, dispatches=1)
            return _PENDING
        elif status == StepStatus.LOST and not (recorded.error or {}).get("started"):
            # The message never reached a worker: send the same attempt again.
            dispatches = int((recorded.result or {}).get("dispatches", 1)) + 1
            self._schedule(act, seq, recorded.attempt, handle._args_json, dispatches=dispatches)
            return _PENDING
        elif status in (StepStatus.ATTEMPT_FAILED, StepStatus.LOST):
            return self._after_failed_attempt(handle, recorded, timers)
        else:  # scheduled or started: a worker has it
            return _PENDING
        return handle._outcome

    def _after_failed_attempt(
        self, handle: ActivityHandle[Any], recorded: StepRecord, timers: list[TimerWrite]
    ) -> Any:
        act, seq = handle.activity, handle.seq
        policy = act.retry or self._config.default_retry
        error = dict(recorded.error or {})
        retryable = bool(error.pop("retryable", True))
        error.pop("started", None)
        if retryable and recorded.attempt < policy.max_attempts:
            retry_at = self._db_now() + timedelta(seconds=policy.delay_after(recorded.attempt))
            self._rewrite(handle, recorded, StepStatus.RETRYING, {"retry_at": _iso(retry_at)}, error)
            timers.append(TimerWrite(seq, TimerKind.RETRY, retry_at))
            return _PENDING
        self._rewrite(handle, recorded, StepStatus.FAILED, None, error)
        handle._outcome = (False, self._activity_failed(act.name, seq, error, recorded.attempt))
        return handle._outcome

    def _rewrite(
        self,
        handle: ActivityHandle[Any],
        recorded: StepRecord,
        status: str,
        result: Any,
        error: dict[str, Any],
    ) -> None:
        """Record the workflow's decision on a queued attempt (same attempt, new status)."""
        step = self._step(
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
        )
        self._commit(step)
        self._remember(step, result, error)

    def _schedule(
        self, act: Activity[..., Any], seq: int, attempt: int, args_json: str, *, dispatches: int
    ) -> None:
        """Record attempt ``attempt`` as scheduled (with the deadline by which it must have
        started) and send it to the activity's queue."""
        assert act.queue is not None
        self._frontier()
        result = {"dispatches": dispatches}
        step = self._step(
            seq,
            StepKind.ACTIVITY,
            act.name,
            StepStatus.SCHEDULED,
            args_json=args_json,
            result_json=codec.dumps(result),
            attempt=attempt,
            finished=False,
        )
        wait = min(self._config.redispatch_after * 2 ** (dispatches - 1), MAX_REDISPATCH_DELAY)
        timer = TimerWrite(seq, TimerKind.ACTIVITY, step.started_at + timedelta(seconds=wait))
        try:
            self._engine.store.schedule_activity(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step, timer
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, result, None)
        # Only a latency hint: if this message is lost, the timer sends the attempt again.
        self._engine.dispatch_activity(
            self._claimed.run_id, seq, attempt, queue=act.queue, timeout=act.timeout
        )

    def _remember(self, step: StepWrite, result: Any, error: dict[str, Any] | None) -> None:
        """Keep this turn's view of a step it rewrote (queued steps change under it)."""
        self._steps[step.seq] = StepRecord(
            seq=step.seq,
            kind=step.kind,
            name=step.name,
            status=step.status,
            result=result,
            error=error,
            attempt=step.attempt,
            started_at=step.started_at,
            finished_at=step.finished_at,
        )

    # -- timers ------------------------------------------------------------------------

    def sleep(self, duration: Duration) -> None:
        """Sleep durably: the run parks and a timer wakes it, across restarts."""
        seconds = parse_duration(duration, what="ctx.sleep duration")
        self._sleep(lambda now: now + timedelta(seconds=seconds))

    def sleep_until(self, moment: datetime) -> None:
        """Sleep durably until ``moment`` (an aware datetime)."""
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise TypeError("ctx.sleep_until takes a timezone-aware datetime")
        self._sleep(lambda _now: moment)

    def _sleep(self, fire_at_from: Callable[[datetime], datetime]) -> None:
        self._forbid_in_handler("sleep")
        seq, recorded = self._next(StepKind.SLEEP, "sleep")
        self._replay_handlers()
        now = self._db_now()
        if recorded is not None:
            if recorded.status == StepStatus.COMPLETED:
                return
            fire_at = _from_iso(recorded.result["fire_at"])
            started_at = recorded.started_at
        else:
            fire_at = fire_at_from(now)
            started_at = now
        result_json = codec.dumps({"fire_at": _iso(fire_at)})
        if fire_at <= now:
            self._commit(
                self._step(
                    seq,
                    StepKind.SLEEP,
                    "sleep",
                    StepStatus.COMPLETED,
                    result_json=result_json,
                    started_at=started_at,
                )
            )
            return
        start = _BlockingStart(
            self,
            None
            if recorded is not None
            else self._step(
                seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, result_json=result_json, finished=False
            ),
        )
        self._deliver(before=start.record)
        self._park(
            {"kind": "sleep", "seq": seq, "fire_at": _iso(fire_at)},
            start.unrecorded(),
            [TimerWrite(seq, TimerKind.SLEEP, fire_at)],
        )

    # -- child workflows ---------------------------------------------------------------

    def start_child(
        self,
        workflow: Any,
        /,
        *args: Any,
        id: str | None = None,
        parent_close_policy: str = "terminate",
        **kwargs: Any,
    ) -> ChildHandle[Any]:
        """Start a child workflow (a registered name or a ``@workflow`` object) and return
        its handle at once; ``handle.result()`` waits durably for it. Its workflow id is
        ``id``, or ``"<this workflow id>:<position>"``.

        ``parent_close_policy`` says what happens to the child if it is still running
        when this run closes (completes, fails, is cancelled or times out):
        ``"terminate"`` (default) and ``"request_cancel"`` cancel it, ``"abandon"`` leaves
        it running. ``id`` and ``parent_close_policy`` are keywords of this call, not of
        the child workflow."""
        self._forbid_in_handler("start a child workflow")
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        if not isinstance(name, str):
            raise ConfigurationError(f"ctx.start_child takes a workflow name or @workflow; got {workflow!r}")
        if parent_close_policy not in PARENT_CLOSE_POLICIES:
            raise ConfigurationError(
                f"parent_close_policy must be one of {', '.join(PARENT_CLOSE_POLICIES)}; "
                f"got {parent_close_policy!r}"
            )
        if id is not None and (
            not isinstance(id, str) or not id.strip() or len(id) > 255 or any(ord(ch) < 32 for ch in id)
        ):
            raise ConfigurationError(
                f"a child workflow id must be a non-empty string of at most 255 characters without "
                f"control characters; got {id!r}"
            )
        seq, recorded = self._next(StepKind.CHILD, name)
        if recorded is not None:
            info = recorded.result or {}
            return ChildHandle(self, name, seq, str(info.get("run_id")), str(info.get("workflow_id")))
        self._frontier()
        definition = self._engine.workflows.get_workflow(name)
        child_run_id = str(uuid.uuid4())
        child = ChildStart(
            run_id=child_run_id,
            workflow_id=id if id is not None else _child_workflow_id(self._claimed.workflow_id, seq),
            workflow_name=definition.name,
            workflow_version=definition.version,
            args_json=codec.dumps(list(args), what=f"arguments of child workflow {name}"),
            kwargs_json=codec.dumps(kwargs, what=f"keyword arguments of child workflow {name}"),
            parent_close_policy=parent_close_policy,
        )
        info = {"run_id": child.run_id, "workflow_id": child.workflow_id}
        step = self._step(
            seq, StepKind.CHILD, name, StepStatus.WAITING, result_json=codec.dumps(info), finished=False
        )
        try:
            self._engine.store.start_child(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step, child
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, info, None)
        self._engine.dispatch_turn(child.run_id)
        return ChildHandle(self, name, seq, child.run_id, child.workflow_id)

    def run_child(
        self,
        workflow: Any,
        /,
        *args: Any,
        id: str | None = None,
        parent_close_policy: str = "terminate",
        **kwargs: Any,
    ) -> Any:
        """Start a child workflow and wait for its result (see :meth:`start_child`)."""
        handle = self.start_child(workflow, *args, id=id, parent_close_policy=parent_close_policy, **kwargs)
        return handle.result()

    def _poll_child(self, handle: ChildHandle[Any]) -> Any:
        recorded = self._steps[handle.seq]
        if recorded.status == StepStatus.WAITING:
            outcome = self._engine.store.child_outcome(self._claimed.run_id, handle.seq)
            if outcome is None:
                return _PENDING
            # The child has finished: record its outcome in this run's history.
            done = outcome.status == "completed"
            info = {**(recorded.result or {}), "run_id": outcome.run_id}
            if done:
                info["result"] = outcome.result
            error = None if done else {**(outcome.error or {}), "status": outcome.status}
            step = self._step(
                handle.seq,
                StepKind.CHILD,
                handle.workflow_name,
                StepStatus.COMPLETED if done else StepStatus.FAILED,
                result_json=codec.dumps(info),
                error=error,
                started_at=recorded.started_at,
            )
            self._commit(step)
            self._remember(step, info, error)
            recorded = self._steps[handle.seq]
        if recorded.status == StepStatus.COMPLETED:
            handle._outcome = (True, (recorded.result or {}).get("result"))
        else:
            error = recorded.error or {}
            status = str(error.get("status", "failed"))
            handle._outcome = (
                False,
                ChildWorkflowFailed(
                    f"child workflow {handle.workflow_name} {handle.workflow_id} (run "
                    f"{(recorded.result or {}).get('run_id')}) {status}: {error.get('type')}: "
                    f"{error.get('message')}",
                    child_run_id=str((recorded.result or {}).get("run_id")),
                    child_workflow_id=handle.workflow_id,
                    seq=handle.seq,
                    status=status,
                    error_type=error.get("type"),
                    error_message=error.get("message"),
                ),
            )
        return handle._outcome

    # -- messages: signals, updates, queries -------------------------------------------

    def on_signal(self, name: str, handler: Callable[[Any], Any]) -> None:
        """Call ``handler(payload)`` for each signal ``name`` the run receives, in arrival
        order, while the workflow is blocked (sleeping or waiting). Each application is
        recorded at a position of the history and repeated on replay, so the handler's
        changes to workflow state are deterministic. It may run inline activities; an
        exception it raises propagates into the workflow at the blocking operation."""
        check_message_name(name, "signal")
        if not callable(handler):
            raise ConfigurationError(f"the handler of signal {name!r} must be callable; got {handler!r}")
        self._signal_handlers[name] = handler

    def on_update(self, name: str, handler: Callable[[Any], Any], validator: Any = None) -> None:
        """Answer update ``name`` with ``handler(payload)``; its return value (JSON) is the
        update's result. ``validator`` checks the payload before anything is stored: a
        callable that raises, a DRF ``Serializer`` class or a pydantic model. The handler
        runs while the workflow is blocked, at a recorded position; it may run inline
        activities but may not sleep or wait. An exception fails the update, not the run."""
        check_message_name(name, "update")
        if not callable(handler):
            raise ConfigurationError(f"the handler of update {name!r} must be callable; got {handler!r}")
        if validator is not None and not callable(validator):
            raise ConfigurationError(
                f"the validator of update {name!r} must be a callable, a DRF Serializer class or a "
                f"pydantic model; got {validator!r}"
            )
        self._update_handlers[name] = UpdateHandler(handler, validator)

    def on_query(self, name: str, handler: Callable[..., Any]) -> None:
        """Answer query ``name`` with ``handler(*args)`` (JSON). Queries replay the recorded
        history read-only and call the handler; they never run activities or write."""
        check_message_name(name, "query")
        if not callable(handler):
            raise ConfigurationError(f"the handler of query {name!r} must be callable; got {handler!r}")
        self._query_handlers[name] = handler

    def registered(self, kind: str) -> list[str]:
        """The names of the ``"signal"``, ``"update"`` or ``"query"`` handlers registered so far."""
        table: dict[str, dict[str, Any]] = {
            "signal": self._signal_handlers,
            "update": self._update_handlers,
            "query": self._query_handlers,
        }
        return sorted(table[kind])

    def wait_signal(self, name: str, timeout: Duration | None = None) -> Any:
        """Wait durably for signal ``name`` and return its payload. Signals are buffered:
        one sent before the workflow gets here is returned at once, and each signal is
        consumed by one wait, oldest first. With ``timeout`` (seconds or a duration
        string), raises :class:`SignalTimeout` once it has passed, across restarts."""
        self._forbid_in_handler("wait for a signal")
        check_message_name(name, "signal")
        if name in self._signal_handlers:
            raise ConfigurationError(
                f"signal {name!r} has a handler (ctx.on_signal), which consumes every such signal; "
                "wait for it with ctx.wait_condition on state the handler sets, or use another name"
            )
        seconds = parse_duration(timeout, what="ctx.wait_signal timeout") if timeout is not None else None
        seq, recorded = self._next(StepKind.SIGNAL, name)
        self._replay_handlers()
        if recorded is not None and recorded.status == StepStatus.COMPLETED:
            return self._signal_outcome(name, seq, recorded.result or {})
        started_at, fire_at, waiting, start = self._message_wait_start(
            seq, StepKind.SIGNAL, name, recorded, seconds
        )
        taken, _ = self._deliver(
            take=lambda message: message.kind == MessageKind.SIGNAL and message.name == name,
            before=start.record,
        )
        if taken is not None:
            result = {"signal": taken.pk, "payload": taken.payload}
            self._finish_wait(
                self._step(
                    seq,
                    StepKind.SIGNAL,
                    name,
                    StepStatus.COMPLETED,
                    result_json=codec.dumps(result),
                    started_at=started_at,
                ),
                signal_pk=taken.pk,
            )
            return taken.payload
        if fire_at is not None and fire_at <= self._db_now():
            result = {**waiting, "timed_out": True}
            self._finish_wait(
                self._step(
                    seq,
                    StepKind.SIGNAL,
                    name,
                    StepStatus.COMPLETED,
                    result_json=codec.dumps(result),
                    started_at=started_at,
                )
            )
            return self._signal_outcome(name, seq, result)
        wait = {"kind": "signal", "seq": seq, "name": name}
        if fire_at is not None:
            wait["fire_at"] = _iso(fire_at)
        timers = [TimerWrite(seq, TimerKind.SIGNAL_TIMEOUT, fire_at)] if fire_at is not None else []
        return self._park(wait, start.unrecorded(), timers)

    def _signal_outcome(self, name: str, seq: int, result: dict[str, Any]) -> Any:
        if result.get("timed_out"):
            raise SignalTimeout(
                f"no signal {name!r} arrived before {result.get('fire_at')} "
                f"(ctx.wait_signal at position {seq})",
                name=name,
                seq=seq,
            )
        return result.get("payload")

    def wait_condition(self, predicate: Callable[[], Any], timeout: Duration | None = None) -> bool:
        """Wait durably until ``predicate()`` is true; it is evaluated now and again after
        each signal or update handler applied while waiting. Returns ``True`` once it
        holds, or ``False`` when ``timeout`` (seconds or a duration string) passed first."""
        self._forbid_in_handler("wait for a condition")
        if not callable(predicate):
            raise ConfigurationError(f"ctx.wait_condition takes a callable predicate; got {predicate!r}")
        seconds = parse_duration(timeout, what="ctx.wait_condition timeout") if timeout is not None else None
        seq, recorded = self._next(StepKind.CONDITION, "wait_condition")
        self._replay_handlers()
        if recorded is not None and recorded.status == StepStatus.COMPLETED:
            return bool((recorded.result or {}).get("satisfied"))
        started_at, fire_at, waiting, start = self._message_wait_start(
            seq, StepKind.CONDITION, "wait_condition", recorded, seconds
        )
        satisfied = bool(predicate())
        if not satisfied:
            _, satisfied = self._deliver(done=lambda: bool(predicate()), before=start.record)
        timed_out = not satisfied and fire_at is not None and fire_at <= self._db_now()
        if satisfied or timed_out:
            self._finish_wait(
                self._step(
                    seq,
                    StepKind.CONDITION,
                    "wait_condition",
                    StepStatus.COMPLETED,
                    result_json=codec.dumps({**waiting, "satisfied": satisfied}),
                    started_at=started_at,
                )
            )
            return satisfied
        wait: dict[str, Any] = {"kind": "condition", "seq": seq}
        if fire_at is not None:
            wait["fire_at"] = _iso(fire_at)
        timers = [TimerWrite(seq, TimerKind.SIGNAL_TIMEOUT, fire_at)] if fire_at is not None else []
        return bool(self._park(wait, start.unrecorded(), timers))

    def _message_wait_start(
        self, seq: int, kind: str, name: str, recorded: StepRecord | None, seconds: float | None
    ) -> tuple[datetime, datetime | None, dict[str, Any], _BlockingStart]:
        """When a signal or condition wait started and when it times out (from its record,
        or now), and its start record, written once before any handler step after it."""
        now = self._db_now()
        if recorded is not None:
            fire_at_text = (recorded.result or {}).get("fire_at")
            started_at = recorded.started_at or now
            fire_at = _from_iso(fire_at_text) if fire_at_text else None
        else:
            started_at = now
            fire_at = now + timedelta(seconds=seconds) if seconds is not None else None
        waiting = {"fire_at": _iso(fire_at) if fire_at else None}
        step = None
        if recorded is None:
            step = self._step(
                seq, kind, name, StepStatus.WAITING, result_json=codec.dumps(waiting), finished=False
            )
        return started_at, fire_at, waiting, _BlockingStart(self, step)

    def _finish_wait(self, step: StepWrite, *, signal_pk: int | None = None) -> None:
        """Record a message wait's (or a signal handler's) step, consuming ``signal_pk``
        and removing the wait's timeout timer in the same fenced transaction."""
        self._frontier()
        try:
            self._engine.store.finish_wait(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step, signal_pk=signal_pk
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, codec.loads(step.result_json) if step.result_json else None, None)

    def _replay_handlers(self) -> None:
        """Re-apply the handler applications recorded at the current position: they ran
        while the body was blocked at the operation it has just reached, so they change
        the workflow's state before that operation returns, as they did the first time."""
        while True:
            recorded = self._steps.get(self._seq)
            if recorded is None or recorded.kind != StepKind.HANDLER:
                return
            self._apply_recorded(recorded)

    def _pending_messages(self, refresh: bool) -> list[PendingMessage]:
        if self._pending is None or refresh:
            self._pending = list(self._engine.store.pending_messages(self._claimed.run_id))
            self._pending_fresh = True
        return self._pending

    def _deliver(
        self,
        *,
        take: Callable[[PendingMessage], bool] | None = None,
        done: Callable[[], bool] | None = None,
        before: Callable[[], None] | None = None,
    ) -> tuple[PendingMessage | None, bool]:
        """While blocked: apply pending signals and updates to their handlers, in arrival
        order. Stops at the first message ``take`` accepts (returned, for the caller to
        consume) or once ``done()`` holds after a handler (then ``(None, True)``).
        ``before`` runs once, before the first handler application is recorded.

        The messages are read once per turn; before giving up they are read again, so a
        message that arrived during the turn is seen. One that arrives after that wakes
        the run when it parks (the park and the message's insert lock the same row)."""
        if self._read_only or (take is None and not self._signal_handlers and not self._update_handlers):
            return None, False
        fresh_read = False
        while True:
            messages = self._pending_messages(refresh=fresh_read)
            fresh_read = fresh_read or self._pending_fresh
            self._pending_fresh = False
            for message in list(messages):
                if take is not None and take(message):
                    messages.remove(message)
                    return message, False
                if message.kind == MessageKind.SIGNAL and message.name not in self._signal_handlers:
                    continue  # buffered for a later wait_signal or handler
                if before is not None:
                    before()
                    before = None
                messages.remove(message)
                self._apply_live(message)
                if done is not None and done():
                    return None, True
            if fresh_read:
                return None, False
            fresh_read = True

    def _handler_position(self) -> int:
        """The next position, for a record the body's code does not ask for (a handler
        application, a wait's marker): it must be past the recorded history."""
        seq = self._seq
        recorded = self._steps.get(seq)
        if recorded is not None:
            self._fatal = NonDeterminismError(
                f"run {self._claimed.run_id} ({self._claimed.workflow_name}) is not deterministic: "
                f"the workflow blocks at position {seq}, where the history records {recorded.kind} "
                f"{recorded.name!r}. Restore the previous code for running workflows, or guard the "
                "change with ctx.patched(...); then retry the run",
                run_id=self._claimed.run_id,
                position=seq,
                recorded={"kind": recorded.kind, "name": recorded.name},
                requested={"kind": StepKind.HANDLER, "name": ""},
            )
            raise self._fatal
        self._seq += 1
        return seq

    def _apply_live(self, message: PendingMessage) -> None:
        """Apply one pending message at the next position, recording it first."""
        if message.kind == MessageKind.SIGNAL:
            seq = self._handler_position()
            info = {"signal": message.pk, "payload": message.payload}
            self._finish_wait(
                self._step(
                    seq,
                    StepKind.HANDLER,
                    f"signal:{message.name}",
                    StepStatus.COMPLETED,
                    result_json=codec.dumps(info),
                ),
                signal_pk=message.pk,
            )
            self._call_signal_handler(message.name, message.payload)
            return
        entry = self._update_handlers.get(message.name)
        if entry is None:
            # Accepted against a replay that registered the handler, yet this code has
            # none: the workflow changed under the run. Answer instead of leaving the
            # caller waiting.
            error = {
                "type": "django_weft.UnknownHandler",
                "message": f"the workflow has no handler for update {message.name!r} at this point "
                f"(handlers: {', '.join(self.registered('update')) or 'none'})",
            }
            try:
                self._engine.store.fail_update(
                    self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, message.pk, error
                )
            except Deposed as exc:
                self._depose(exc)
            return
        seq = self._handler_position()
        info = {"update": message.pk, "update_id": message.update_id, "payload": message.payload}
        step = self._step(
            seq,
            StepKind.HANDLER,
            f"update:{message.name}",
            StepStatus.WAITING,
            result_json=codec.dumps(info),
            finished=False,
        )
        faults.hit("before_update_apply", run_id=self._claimed.run_id, seq=seq, engine=self._engine)
        try:
            self._engine.store.apply_update(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step, message.pk
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, info, None)
        self._finish_update(seq, message.name, entry, info, step.started_at)

    def _apply_recorded(self, recorded: StepRecord) -> None:
        """Replay one recorded handler application (its inner steps replay as usual)."""
        seq = self._seq
        self._seq += 1
        kind, _, name = recorded.name.partition(":")
        info = dict(recorded.result or {})
        table: dict[str, Any] = self._signal_handlers if kind == MessageKind.SIGNAL else self._update_handlers
        if name not in table:
            self._fatal = NonDeterminismError(
                f"run {self._claimed.run_id} ({self._claimed.workflow_name}) is not deterministic: "
                f"at position {seq} the history records the {kind} handler {name!r}, but the code "
                f"has no such handler registered there (it has: {', '.join(sorted(table)) or 'none'}). "
                "Register the handler before the point where the workflow blocks, as the code that "
                "recorded it did; then retry the run",
                run_id=self._claimed.run_id,
                position=seq,
                recorded={"kind": recorded.kind, "name": recorded.name},
                requested={"kind": StepKind.HANDLER, "name": ""},
            )
            raise self._fatal
        if kind == MessageKind.SIGNAL:
            self._call_signal_handler(name, info.get("payload"))
        elif recorded.status == StepStatus.COMPLETED:
            self._call_update_handler(name, table[name], info.get("payload"))  # for its effects
        else:
            # Applied, but the turn ended before the outcome was recorded: finish it now.
            info.pop("outcome", None)
            self._finish_update(seq, name, table[name], info, recorded.started_at)

    def _call_signal_handler(self, name: str, payload: Any) -> None:
        previous, self._in_handler = self._in_handler, f"handler of signal {name!r}"
        try:
            self._signal_handlers[name](payload)
        finally:
            self._in_handler = previous

    def _call_update_handler(self, name: str, entry: UpdateHandler, payload: Any) -> tuple[bool, Any]:
        """Run an update handler: ``(True, JSON value)`` or ``(False, error description)``."""
        previous, self._in_handler = self._in_handler, f"handler of update {name!r}"
        try:
            value = entry.handler(payload)
            return True, codec.roundtrip(value, what=f"the result of update {name}")[0]
        except NonDeterminismError:
            raise  # the run is held for a fix; the update stays applied and unanswered
        except Exception as exc:
            if self._fatal is not None:
                raise self._fatal from None
            return False, describe_exception(exc)
        finally:
            self._in_handler = previous

    def _finish_update(
        self, seq: int, name: str, entry: UpdateHandler, info: dict[str, Any], started_at: datetime | None
    ) -> None:
        ok, value = self._call_update_handler(name, entry, info.get("payload"))
        self._frontier()
        faults.hit("before_update_answer", run_id=self._claimed.run_id, seq=seq, engine=self._engine)
        outcome = {"ok": True, "result": value} if ok else {"ok": False, "error": value}
        step = self._step(
            seq,
            StepKind.HANDLER,
            f"update:{name}",
            StepStatus.COMPLETED,
            result_json=codec.dumps({**info, "outcome": outcome}),
            started_at=started_at,
        )
        try:
            self._engine.store.answer_update(
                self._claimed.run_id,
                self._engine.engine_id,
                self._claimed.epoch,
                step,
                int(info["update"]),
                ok=ok,
                result_json=codec.dumps(value) if ok else None,
                error_json=None if ok else codec.dumps(value),
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, {**info, "outcome": outcome}, None)

    # -- recorded values ---------------------------------------------------------------

    def side_effect(self, fn: Callable[[], T], *, name: str | None = None) -> T:
        """Call ``fn`` once and record its (JSON) result; replay returns the recorded value."""
        label = name or f"{fn.__module__}.{getattr(fn, '__qualname__', repr(fn))}"
        seq, recorded = self._next(StepKind.SIDE_EFFECT, label)
        if recorded is not None:
            return recorded.result
        self._frontier()
        value, result_json = codec.roundtrip(fn(), what=f"the result of side effect {label}")
        self._commit(
            self._step(seq, StepKind.SIDE_EFFECT, label, StepStatus.COMPLETED, result_json=result_json)
        )
        return value

    def set_finalizer_state(self, value: Any) -> None:
        """Record ``value`` (JSON) for the workflow's finalizer (``@workflow(finalizer=...)``),
        which receives the last value set if the run ends cancelled or timed out."""
        seq, recorded = self._next(StepKind.SIDE_EFFECT, "finalizer_state")
        if recorded is not None:
            return
        self._frontier()
        state_json = codec.dumps(value, what="the finalizer state")
        step = self._step(
            seq, StepKind.SIDE_EFFECT, "finalizer_state", StepStatus.COMPLETED, result_json=state_json
        )
        try:
            self._engine.store.set_finalizer_state(
                self._claimed.run_id, self._engine.engine_id, self._claimed.epoch, step, state_json
            )
        except Deposed as exc:
            self._depose(exc)
        self._remember(step, codec.loads(state_json), None)

    def now(self) -> datetime:
        """The current time (UTC, by the database clock), recorded once."""
        return _from_iso(self.side_effect(lambda: _iso(self._db_now().astimezone(UTC)), name="now"))

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded once."""
        return uuid.UUID(self.side_effect(lambda: str(uuid.uuid4()), name="uuid4"))

    def random(self) -> float:
        """A random float in [0, 1), recorded once."""
        return float(self.side_effect(_random.random, name="random"))

    def patched(self, change_id: str) -> bool:
        """``True`` where the new code path may run: new runs, and old runs that reach this
        point after the change shipped. Records a marker so later replays agree."""
        if change_id in self._patches:
            return self._patches[change_id]
        self._enter()
        recorded = self._steps.get(self._seq)
        if recorded is None:
            self._seq += 1
            self._commit(self._step(self._seq - 1, StepKind.PATCH, change_id, StepStatus.COMPLETED))
            answer = True
        elif recorded.kind == StepKind.PATCH and recorded.name == change_id:
            self._seq += 1
            answer = True
        else:
            # This run passed this point under the old code: keep the old path.
            answer = False
        self._patches[change_id] = answer
        return answer

    def continue_as_new(self, *args: Any, **kwargs: Any) -> None:
        """Finish this run as ``continued`` and start a fresh run of the same workflow id."""
        self._forbid_in_handler("continue as new")
        self._enter()
        self._unwinding = ContinueAsNew(args, kwargs)
        raise self._unwinding
