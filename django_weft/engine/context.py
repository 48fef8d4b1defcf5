"""The workflow context: the replay executor's face towards workflow code.

Every durable operation takes the next sequence number of the run. If a step is
recorded at that number, the operation must match it (kind and name) and returns the
recorded outcome; otherwise the operation executes now and its outcome is recorded
with a fenced write before the workflow continues.
"""

from __future__ import annotations

import contextvars
import logging
import random as _random
import time
import traceback
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from . import codec, faults
from .durations import Duration, parse_duration
from .errors import ActivityFailed, Deposed, NonDeterminismError, PayloadError
from .records import (
    ClaimedRun,
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


class WorkflowContext:
    """Passed as the first argument of every workflow function."""

    def __init__(
        self, engine: Engine, claimed: ClaimedRun, config: EngineConfig, workflow: Workflow[..., Any]
    ) -> None:
        self._engine = engine
        self._claimed = claimed
        self._config = config
        self._workflow = workflow
        self._steps = claimed.steps
        self._history_length = (max(claimed.steps) + 1) if claimed.steps else 0
        self._seq = 0
        self._clock_origin = time.monotonic()
        self._patches: dict[str, bool] = {}
        self._unwinding: _Unwind | None = None
        self._fatal: NonDeterminismError | None = None
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
        """True while the function re-executes operations that are already recorded."""
        return self._seq < self._history_length

    def _db_now(self) -> datetime:
        # The database's clock at claim time plus the time elapsed since, so timer
        # fire times and due checks agree with the sweep, which uses the database clock.
        return self._claimed.db_now + timedelta(seconds=time.monotonic() - self._clock_origin)

    def _enter(self) -> None:
        if self._unwinding is not None:
            raise self._unwinding
        if self._fatal is not None:
            raise self._fatal
        if self._engine.is_lost(self._claimed.run_id):
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

    def _park(self, waiting_on: dict[str, Any], steps: list[StepWrite], timers: list[TimerWrite]) -> Any:
        self._unwinding = Park(waiting_on, steps, timers)
        raise self._unwinding

    def _commit(self, step: StepWrite) -> None:
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
        seq, recorded = self._next(StepKind.SLEEP, "sleep")
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
        steps = []
        if recorded is None:
            steps.append(
                self._step(
                    seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, result_json=result_json, finished=False
                )
            )
        self._park(
            {"kind": "sleep", "seq": seq, "fire_at": _iso(fire_at)},
            steps,
            [TimerWrite(seq, TimerKind.SLEEP, fire_at)],
        )

    # -- recorded values ---------------------------------------------------------------

    def side_effect(self, fn: Callable[[], T], *, name: str | None = None) -> T:
        """Call ``fn`` once and record its (JSON) result; replay returns the recorded value."""
        label = name or f"{fn.__module__}.{getattr(fn, '__qualname__', repr(fn))}"
        seq, recorded = self._next(StepKind.SIDE_EFFECT, label)
        if recorded is not None:
            return recorded.result
        value, result_json = codec.roundtrip(fn(), what=f"the result of side effect {label}")
        self._commit(
            self._step(seq, StepKind.SIDE_EFFECT, label, StepStatus.COMPLETED, result_json=result_json)
        )
        return value

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
        self._enter()
        self._unwinding = ContinueAsNew(args, kwargs)
        raise self._unwinding
